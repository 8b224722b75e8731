/*
 * ops_attention.c — the standard op set, attention: scaled_dot_product_attention and its
 * backward: schemas, shape/dtype inference, the derivative and the typed public functions of
 * ember/ops.h (the rules a caller sees are documented there).
 *
 * Both ops are composites over their own kernel (as the nn ops of ops_nn.c, whose argument
 * preparation they share: em__nn_call): the composite checks dtypes, fills the defaults
 * (scale 1/sqrt(E)), aligns a mask's dims with the query's (prepending 1s) and makes every
 * input contiguous in the kernel dtype (a bool mask stays bool); f16/bf16 run in f32 unless
 * the device registers a kernel for them.
 *
 * Kernel contracts (every input contiguous; q, k, v, a floating mask, out and the grads of
 * one dtype T; the statistics dtype S is f64 for f64 and f32 otherwise; "..." the same
 * batch dims, B their product; every attribute present):
 *   scaled_dot_product_attention(q (..., L, E), k (..., S, E), v (..., S, Ev),
 *                                mask (..., L, S)-broadcastable | (0))
 *       -> out (..., L, Ev) T, logsumexp (..., L) S
 *       attrs: dropout_p (float in [0, 1]), is_causal (bool), scale (float), seed, offset
 *       (ints; the seed absent with dropout: the call is recorded in a graph capture, the
 *       stream starts at base + offset with (seed, base) read when the work runs from
 *       em_kernel_generator_state, ember/dispatch.h). The mask has q's ndim; each of its dims is 1 or the matching size (batch
 *       dims, L, S). bool: false masks the score out; T: added to the scaled score. Causal:
 *       j > i masked. logsumexp_i = log sum_j exp(s_ij) over unmasked j (-inf: none; such a
 *       row's out is 0). Dropout: keep (b, i, j) when em_philox_uniform_f32(seed, offset,
 *       (b L + i) S + j) < 1 - dropout_p (the bernoulli stream), kept probabilities scaled
 *       by 1 / (1 - dropout_p); dropout_p == 1 drops everything.
 *   scaled_dot_product_attention_backward(gy (..., L, Ev), q, k, v, mask,
 *                                         logsumexp (..., L) S) -> gq, gk, gv
 *       attrs as the forward's; the same dropout mask is recomputed from (seed, offset), and
 *       the probabilities from logsumexp. (The forward's output is not an input: the
 *       D_i = gy_i . out_i of the softmax derivative is sum_j p_ij dp_ij, which the kernel
 *       has at hand; it also keeps the op within the op-case table's 6 inputs.)
 */
#include <math.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/random.h"
#include "ember/tensor.h"
#include "internal.h"

static const em_op *op_sdpa, *op_sdpa_bwd;

#define SHAPE(t, buf) em__shape_str((t)->ndim, (t)->shape, buf, sizeof buf)

enum { A_DROPOUT, A_CAUSAL, A_SCALE, A_SEED, A_OFFSET, N_ATTRS };

/* ---- inference ------------------------------------------------------------------------------- */

/* q (..., L, E), k (..., S, E), v (..., S, Ev) with equal batch dims; the mask (when given)
 * has q's ndim and dims of 1 or (..., L, S). */
static em_status check_qkv(const em_op *op, const em_tensor *q, const em_tensor *k,
                           const em_tensor *v, const em_tensor *mask) {
    char b1[160], b2[160], b3[160];
    const char *who = em_op_name(op);
    int nd = q->ndim;
    if (nd < 2 || k->ndim != nd || v->ndim != nd ||
        memcmp(q->shape, k->shape, sizeof(int64_t) * (size_t)(nd - 2)) != 0 ||
        memcmp(q->shape, v->shape, sizeof(int64_t) * (size_t)(nd - 2)) != 0 ||
        k->shape[nd - 1] != q->shape[nd - 1] || v->shape[nd - 2] != k->shape[nd - 2])
        return em_set_error(EM_ERR_SHAPE, "%s: query %s, key %s and value %s must be (..., L, E), "
                            "(..., S, E) and (..., S, Ev) with the same leading dims",
                            who, nd >= 0 ? SHAPE(q, b1) : "?", SHAPE(k, b2), SHAPE(v, b3));
    if (mask->numel == 0 && mask->ndim == 1) return EM_OK; /* none */
    bool ok = mask->ndim == nd;
    for (int d = 0; d < nd && ok; d++) {
        int64_t want = d < nd - 2 ? q->shape[d] : d == nd - 2 ? q->shape[nd - 2] : k->shape[nd - 2];
        ok = mask->shape[d] == 1 || mask->shape[d] == want;
    }
    if (!ok) {
        int64_t full[EM_MAX_DIMS];
        memcpy(full, q->shape, sizeof(int64_t) * (size_t)nd);
        full[nd - 1] = k->shape[nd - 2];
        return em_set_error(EM_ERR_SHAPE, "%s: attn_mask %s does not broadcast to the scores' "
                            "shape %s (..., L, S)", who, SHAPE(mask, b1),
                            em__shape_str(nd, full, b2, sizeof b2));
    }
    return EM_OK;
}

/* The dtypes of the kernel's operands: floating q, k, v (and out, gy) of one dtype, a bool
 * or same-dtype mask, statistics in S. */
static em_status check_dtypes(const em_op *op, const em_tensor *const *t,
                              const char *const *names, int n, const em_tensor *mask,
                              const em_tensor *lse) {
    em_dtype dt = t[0]->dtype;
    for (int i = 0; i < n; i++)
        if (!em_dtype_is_floating(t[i]->dtype) || t[i]->dtype != dt)
            return em_set_error(EM_ERR_DTYPE, "%s: %s has dtype %s; expected %s like %s (a "
                                "floating dtype)", em_op_name(op), names[i],
                                em_dtype_name(t[i]->dtype), em_dtype_name(dt), names[0]);
    if (mask->dtype != EM_BOOL && mask->dtype != dt)
        return em_set_error(EM_ERR_DTYPE, "%s: attn_mask has dtype %s; expected bool or %s",
                            em_op_name(op), em_dtype_name(mask->dtype), em_dtype_name(dt));
    em_dtype sd = dt == EM_F64 ? EM_F64 : EM_F32;
    if (lse && lse->dtype != sd)
        return em_set_error(EM_ERR_DTYPE, "%s: logsumexp has dtype %s; expected %s",
                            em_op_name(op), em_dtype_name(lse->dtype), em_dtype_name(sd));
    return EM_OK;
}

static em_status check_attrs(const em_op *op, const em_attr *a) {
    static const em_attr_type types[N_ATTRS] = {EM_ATTR_FLOAT, EM_ATTR_BOOL, EM_ATTR_FLOAT,
                                                EM_ATTR_INT, EM_ATTR_INT};
    for (int i = 0; i < N_ATTRS; i++) /* the seed absent: a graph capture's (see above) */
        if (!a || (a[i].type != types[i] && !(i == A_SEED && a[i].type == EM_ATTR_NONE)))
            return em_set_error(EM_ERR_INVALID, "%s: attribute '%s' is required",
                                em_op_name(op), em_op_schema_of(op)->attr_names[i]);
    if (!(a[A_DROPOUT].v.f >= 0 && a[A_DROPOUT].v.f <= 1))
        return em_set_error(EM_ERR_INVALID, "%s: dropout_p must be in [0, 1], got %g",
                            em_op_name(op), a[A_DROPOUT].v.f);
    return EM_OK;
}

static void meta_of(em_tensor_meta *m, em_dtype dt, int ndim, const int64_t *shape) {
    m->dtype = dt;
    m->ndim = ndim;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

static em_status infer_sdpa(const em_op *op, const em_tensor *const *in, const em_attr *a,
                            em_tensor_meta *out) {
    const em_tensor *q = in[0], *k = in[1], *v = in[2];
    em_status st = check_attrs(op, a);
    static const char *const names[] = {"query", "key", "value"};
    if (st == EM_OK) st = check_dtypes(op, in, names, 3, in[3], NULL);
    if (st == EM_OK) st = check_qkv(op, q, k, v, in[3]);
    if (st != EM_OK) return st;
    meta_of(&out[0], q->dtype, q->ndim, q->shape);
    out[0].shape[q->ndim - 1] = v->shape[q->ndim - 1];
    meta_of(&out[1], q->dtype == EM_F64 ? EM_F64 : EM_F32, q->ndim - 1, q->shape);
    return EM_OK;
}

static em_status infer_sdpa_bwd(const em_op *op, const em_tensor *const *in, const em_attr *a,
                                em_tensor_meta *out) {
    const em_tensor *gy = in[0], *q = in[1], *k = in[2], *v = in[3], *lse = in[5];
    char b1[160], b2[160], b3[160], b4[160];
    em_status st = check_attrs(op, a);
    static const char *const names[] = {"grad_output", "query", "key", "value"};
    if (st == EM_OK) st = check_dtypes(op, in, names, 4, in[4], lse);
    if (st == EM_OK) st = check_qkv(op, q, k, v, in[4]);
    if (st != EM_OK) return st;
    int nd = q->ndim;
    int64_t want[EM_MAX_DIMS];
    memcpy(want, q->shape, sizeof(int64_t) * (size_t)nd);
    want[nd - 1] = v->shape[nd - 1];
    if (gy->ndim != nd || lse->ndim != nd - 1 ||
        memcmp(gy->shape, want, sizeof(int64_t) * (size_t)nd) != 0 ||
        memcmp(lse->shape, q->shape, sizeof(int64_t) * (size_t)(nd - 1)) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: grad_output %s and logsumexp %s do not match the "
                            "forward's output %s and query %s", em_op_name(op), SHAPE(gy, b1),
                            SHAPE(lse, b2), em__shape_str(nd, want, b3, sizeof b3),
                            SHAPE(q, b4));
    meta_of(&out[0], q->dtype, nd, q->shape);
    meta_of(&out[1], q->dtype, nd, k->shape);
    meta_of(&out[2], q->dtype, nd, v->shape);
    return EM_OK;
}

/* ---- composites ------------------------------------------------------------------------------ */

static em_attr afloat(double v) { return (em_attr){.type = EM_ATTR_FLOAT, .v.f = v}; }
static em_attr abool(bool v) { return (em_attr){.type = EM_ATTR_BOOL, .v.b = v}; }
static em_attr aint(int64_t v) { return (em_attr){.type = EM_ATTR_INT, .v.i = v}; }

/* The kernel's attributes from a call's: defaults filled, the dropout stream required when
 * dropout_p > 0. E is the query's last dim. */
static em_status kernel_attrs(const char *who, const em_attr *attrs, int64_t E, em_attr *a) {
    double p = em__attr_float_or(attrs, A_DROPOUT, 0);
    if (!(p >= 0 && p <= 1))
        return em_set_error(EM_ERR_INVALID, "%s: dropout_p must be in [0, 1], got %g", who, p);
    bool random = p > 0 && p < 1;
    if (random && (!attrs || attrs[A_OFFSET].type != EM_ATTR_INT ||
                   (attrs[A_SEED].type != EM_ATTR_INT && attrs[A_SEED].type != EM_ATTR_NONE)))
        return em_set_error(EM_ERR_INVALID, "%s: attributes 'seed' and 'offset' are required "
                            "when dropout_p > 0 (em_scaled_dot_product_attention draws them from "
                            "a generator)", who);
    a[A_DROPOUT] = afloat(p);
    a[A_CAUSAL] = abool(em__attr_bool_or(attrs, A_CAUSAL, false));
    a[A_SCALE] = afloat(em__attr_float_or(attrs, A_SCALE, E > 0 ? 1.0 / sqrt((double)E) : 1.0));
    a[A_SEED] = aint(random ? attrs[A_SEED].v.i : 0);
    a[A_OFFSET] = aint(random ? attrs[A_OFFSET].v.i : 0);
    if (random && attrs[A_SEED].type == EM_ATTR_NONE) a[A_SEED] = attrs[A_SEED];
    return EM_OK;
}

/* t[0..n) floating and of one dtype (q, k, v at t[n - 3 ..]); the mask bool or floating and
 * broadcastable to the scores (..., L, S). *aligned receives the mask with q's ndim (1s
 * prepended; a new reference) or NULL. */
static em_status prepare(const char *who, const em_tensor *const *t, const char *const *names,
                         int n, const em_tensor *mask, int ndim, em_tensor **aligned) {
    const em_tensor *q = t[n - 3], *k = t[n - 2];
    *aligned = NULL;
    for (int i = 0; i < n; i++)
        if (!em_dtype_is_floating(t[i]->dtype) || t[i]->dtype != t[0]->dtype)
            return em_set_error(EM_ERR_DTYPE, "%s: %s has dtype %s; expected a floating dtype "
                                "(%s, like %s)", who, names[i], em_dtype_name(t[i]->dtype),
                                em_dtype_name(t[0]->dtype), names[0]);
    if (!mask) return EM_OK;
    char b1[160];
    if (mask->dtype != EM_BOOL && !em_dtype_is_floating(mask->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: attn_mask has dtype %s; expected bool (true = "
                            "attend) or a floating dtype (added to the scores)", who,
                            em_dtype_name(mask->dtype));
    if (mask->ndim > ndim)
        return em_set_error(EM_ERR_SHAPE, "%s: attn_mask %s has more dims than the scores "
                            "(%d)", who, SHAPE(mask, b1), ndim);
    int pre = ndim - mask->ndim;
    if (ndim >= 2 && k->ndim == ndim) {
        int64_t full[EM_MAX_DIMS];
        memcpy(full, q->shape, sizeof(int64_t) * (size_t)ndim);
        full[ndim - 1] = k->shape[ndim - 2];
        for (int d = pre; d < ndim; d++)
            if (mask->shape[d - pre] != 1 && mask->shape[d - pre] != full[d]) {
                char b2[160], b3[160], b4[160];
                return em_set_error(EM_ERR_SHAPE, "%s: attn_mask %s does not broadcast to the "
                                    "scores' shape %s (..., L, S) of query %s and key %s", who,
                                    SHAPE(mask, b1), em__shape_str(ndim, full, b2, sizeof b2),
                                    SHAPE(q, b3), SHAPE(k, b4));
            }
    }
    int64_t shape[EM_MAX_DIMS];
    for (int d = 0; d < ndim; d++) shape[d] = d < pre ? 1 : mask->shape[d - pre];
    *aligned = pre ? em__reshape(mask, ndim, shape) : em_tensor_retain((em_tensor *)mask);
    return *aligned ? EM_OK : em_last_status();
}

/* scaled_dot_product_attention(query, key, value, attn_mask?; dropout_p, is_causal, scale,
 * seed, offset) -> (out, logsumexp). */
EM__COMPOSITE(c_sdpa) {
    (void)op, (void)n_in, (void)cap;
    static const char *const who = "scaled_dot_product_attention",
                             *const names[] = {"query", "key", "value"};
    const em_tensor *q = in[0];
    em_tensor *mask = NULL;
    em_attr a[N_ATTRS];
    if (prepare(who, in, names, 3, in[3], q->ndim, &mask) != EM_OK ||
        kernel_attrs(who, attrs, q->ndim ? q->shape[q->ndim - 1] : 0, a) != EM_OK) {
        em_tensor_release(mask);
        return em_last_status();
    }
    em_tensor *res[2] = {NULL, NULL};
    const em_tensor *args[4] = {in[0], in[1], in[2], mask};
    em_status st = em__nn_call(op_sdpa, q->dtype, args,
                               mask && mask->dtype == EM_BOOL ? "xxxi" : "xxxx", 4, a, res);
    em_tensor_release(mask);
    if (st == EM_OK && !(res[0] = em__nn_finish(res[0], q->dtype))) st = em_last_status();
    return em__nn_outputs(st, res, 2, out, n_out);
}

/* scaled_dot_product_attention_backward(grad_output, query, key, value, attn_mask?,
 * logsumexp; the forward's attributes) -> (grad_query, grad_key, grad_value). */
EM__COMPOSITE(c_sdpa_bwd) {
    (void)op, (void)n_in, (void)cap;
    static const char *const who = "scaled_dot_product_attention_backward",
                             *const names[] = {"grad_output", "query", "key", "value"};
    const em_tensor *q = in[1];
    em_tensor *mask = NULL;
    em_attr a[N_ATTRS];
    if (!em_dtype_is_floating(in[5]->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: logsumexp has dtype %s; expected a floating dtype",
                            who, em_dtype_name(in[5]->dtype));
    if (prepare(who, in, names, 4, in[4], q->ndim, &mask) != EM_OK ||
        kernel_attrs(who, attrs, q->ndim ? q->shape[q->ndim - 1] : 0, a) != EM_OK) {
        em_tensor_release(mask);
        return em_last_status();
    }
    em_tensor *res[3] = {NULL, NULL, NULL};
    const em_tensor *args[6] = {in[0], in[1], in[2], in[3], mask, in[5]};
    em_status st = em__nn_call(op_sdpa_bwd, q->dtype, args,
                               mask && mask->dtype == EM_BOOL ? "xxxxis" : "xxxxxs", 6, a, res);
    em_tensor_release(mask);
    for (int i = 0; i < 3 && st == EM_OK; i++)
        if (!(res[i] = em__nn_finish(res[i], q->dtype))) st = em_last_status();
    return em__nn_outputs(st, res, 3, out, n_out);
}

/* ---- derivative ------------------------------------------------------------------------------ */

/* Through the backward op, from the saved inputs and logsumexp (the kernel's prepared
 * operands). The logsumexp carries no gradient and neither does the mask. */
static em_status d_sdpa(const em_backward_ctx *c, em_tensor **gi) {
    if (c->grad_out[1])
        return em_set_error(EM_ERR_STATE, "backward: scaled_dot_product_attention: gradients "
                            "through its logsumexp output are not supported");
    const em_tensor *mask = c->in[3];
    bool has_mask = em__numel(c->in_meta[3].ndim, c->in_meta[3].shape) > 0 ||
                    c->in_meta[3].ndim != 1;
    if (c->needs_grad[3] && has_mask)
        return em_set_error(EM_ERR_STATE, "backward: scaled_dot_product_attention: attn_mask "
                            "requires grad, but the mask gets no gradient; detach it");
    if (!c->grad_out[0]) return EM_OK;
    const em_attr *a = c->attrs;
    double scale = a[A_SCALE].v.f;
    /* the forward's attributes (a captured forward's, without a seed: its mask is recomputed
     * from the capture's generator state) */
    em_tensor *gq = NULL, *gk = NULL, *gv = NULL;
    em_status st = em__callv(op_sdpa_bwd, 6, EM__IN(c->grad_out[0], c->in[0], c->in[1],
                                                    c->in[2], has_mask ? mask : NULL, c->out[1]),
                             EM__ATTRS(a[A_DROPOUT], a[A_CAUSAL], afloat(scale), a[A_SEED],
                                       a[A_OFFSET]),
                             (em_tensor **const[]){&gq, &gk, &gv}, 3);
    if (st != EM_OK) return st;
    if (c->needs_grad[0]) gi[0] = gq;
    if (c->needs_grad[1]) gi[1] = gk;
    if (c->needs_grad[2]) gi[2] = gv;
    return EM_OK;
}

/* ---- declarations ---------------------------------------------------------------------------- */

em_status em__ops_declare_attention(em_registry *core) {
    static const char *const fwd_i[] = {"query", "key", "value", "attn_mask"},
                             *const bwd_i[] = {"grad_output", "query", "key", "value",
                                               "attn_mask", "logsumexp"},
                             *const attr_n[] = {"dropout_p", "is_causal", "scale", "seed",
                                                "offset"};
    static const em_attr_type attr_t[] = {EM_ATTR_FLOAT, EM_ATTR_BOOL, EM_ATTR_FLOAT,
                                          EM_ATTR_INT, EM_ATTR_INT};
    em_status st = em__declare(core, &op_sdpa, (em_op_schema){
        .name = "scaled_dot_product_attention", .n_inputs = 4, .input_names = fwd_i,
        .n_outputs = 2, .n_attrs = N_ATTRS, .attr_names = attr_n, .attr_types = attr_t,
        .infer = infer_sdpa, .backward = d_sdpa,
        .saves = EM_SAVE_INPUT(0) | EM_SAVE_INPUT(1) | EM_SAVE_INPUT(2) | EM_SAVE_INPUT(3) |
                 EM_SAVE_OUTPUT(1),
        .composite = c_sdpa, .optional_inputs = 1u << 3, .category = "nn",
        .autocast = EM_AUTOCAST_LOWER});
    if (st == EM_OK)
        st = em__declare(core, &op_sdpa_bwd, (em_op_schema){
            .name = "scaled_dot_product_attention_backward", .n_inputs = 6, .input_names = bwd_i,
            .n_outputs = 3, .n_attrs = N_ATTRS, .attr_names = attr_n, .attr_types = attr_t,
            .flags = EM_OP_NONDIFF, .infer = infer_sdpa_bwd, .composite = c_sdpa_bwd,
            .optional_inputs = 1u << 4, .category = "nn"});
    return st;
}

/* ---- public functions: one line each --------------------------------------------------------- */

#define SCALE(p) ((p) ? afloat(*(p)) : (em_attr){.type = EM_ATTR_NONE})

/* The generator's blocks for the (B, L, S) dropout mask (4 draws a block, as em_dropout)
 * become the op's seed and offset (in a graph capture on the query's device: no seed, the
 * offset relative to the capture's generator state); nothing is drawn without dropout. */
em_tensor *em_scaled_dot_product_attention(const em_tensor *query, const em_tensor *key,
                                           const em_tensor *value, const em_tensor *attn_mask,
                                           double dropout_p, bool is_causal,
                                           const double *scale, em_generator *gen,
                                           em_tensor **logsumexp) {
    int64_t n = query && key && query->ndim >= 2 && key->ndim >= 2
                    ? em__numel(query->ndim - 1, query->shape) * key->shape[key->ndim - 2]
                    : 0;
    em_rng_state s = {0};
    bool graph = false;
    if (dropout_p > 0 && dropout_p < 1 && n > 0 &&
        em__rng_draw(gen, ((uint64_t)n + 3) / 4, query->storage->device,
                     "scaled_dot_product_attention", true, &s, &graph) != EM_OK)
        return NULL;
    em_tensor *y = NULL;
    em_status st = em__callv(op_sdpa, 4, EM__IN(query, key, value, attn_mask),
                             EM__ATTRS(afloat(dropout_p), abool(is_causal), SCALE(scale),
                                       em__rng_seed_attr(s, graph),
                                       aint((int64_t)s.offset)),
                             (em_tensor **const[]){&y, logsumexp}, 2);
    return st == EM_OK ? y : NULL;
}

em_status em_scaled_dot_product_attention_backward(
    const em_tensor *grad_output, const em_tensor *query, const em_tensor *key,
    const em_tensor *value, const em_tensor *attn_mask, const em_tensor *logsumexp,
    double dropout_p, bool is_causal, const double *scale,
    em_rng_state dropout_state, em_tensor **grad_query, em_tensor **grad_key,
    em_tensor **grad_value) {
    return em__callv(op_sdpa_bwd, 6, EM__IN(grad_output, query, key, value, attn_mask, logsumexp),
                     EM__ATTRS(afloat(dropout_p), abool(is_causal), SCALE(scale),
                               aint((int64_t)dropout_state.seed),
                               aint((int64_t)dropout_state.offset)),
                     (em_tensor **const[]){grad_query, grad_key, grad_value}, 3);
}
#undef SCALE

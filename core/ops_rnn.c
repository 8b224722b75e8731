/*
 * ops_rnn.c — the standard op set, recurrent: the fused lstm and gru ops (one layer, one
 * direction, the whole sequence in one call) and their backward ops: schemas, shape/dtype
 * inference, the derivatives and the typed public functions of ember/ops.h (the rules a
 * caller sees are documented there).
 *
 * The gate definitions are PyTorch's (nn.LSTM: i, f, g, o; nn.GRU: r, z, n with the reset
 * gate applied after the hidden product, oneDNN's "linear-before-reset" GRU). The ops take
 * one weight, the input and hidden weights side by side, W = [W_ih | W_hh] ((G H, I + H),
 * PyTorch's weight_ih_l0 and weight_hh_l0 catenated along dim 1; the layers catenate them)
 * so that both ops, their backwards and the op-case rows stay within 6 inputs with the
 * optional per-sequence lengths.
 *
 * The backward ops run the recurrence only: they return the gradients of the gates'
 * pre-activations, from which the derivative composes the parameter and input gradients
 * with matmul, cat and sum (one GEMM each over the whole sequence):
 *     grad_input  = dG W_ih            grad_weight = dG^T [x | h_prev]      grad_bias = sum dG
 * (the GRU's hidden weight and bias take dGh, its n part multiplied by r).
 *
 * Kernel contracts (every input contiguous in one floating dtype T; "none" is a 0-element
 * (0) tensor; lengths is int64; attrs: reverse (bool, present)):
 *   lstm(x (T, N, I), hx (N, H) | none, cx (N, H) | none, w (4H, I + H), b (4H) | none,
 *        lengths (N) | none) -> y (T, N, H), h_n (N, H), c_n (N, H), ws (T, N, 6H)
 *       ws[t, b] = [i, f, g, o (activated), c_prev, h_prev] of step t (zeros where the step
 *       is not taken).
 *   lstm_backward(gy (T, N, H) | none, gh_n | none, gc_n | none, w, ws, lengths | none)
 *       -> dG (T, N, 4H) (pre-activation gradients, zero on untaken steps), ghx, gcx (N, H)
 *   gru(x, hx | none, w (3H, I + H), b_ih (3H) | none, b_hh (3H) | none, lengths | none)
 *       -> y (T, N, H), h_n (N, H), ws (T, N, 5H) = [r, z, n, W_hn h_prev + b_hn, h_prev]
 *   gru_backward(gy | none, gh_n | none, w, ws, lengths | none)
 *       -> dGi (T, N, 3H) (input side: r, z, n), dGh (T, N, 3H) (hidden side), ghx (N, H)
 * Step t of sequence b is taken when t < lengths[b] (all steps without lengths); the
 * forward direction walks t = 0 .. T - 1, reverse from T - 1 down, so an untaken step leaves
 * the state as it is and outputs zeros: PyTorch's packed sequences, in either direction.
 * lengths outside [0, T] is an error of the kernel (EM_ERR_INVALID naming the entry).
 */
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/tensor.h"
#include "internal.h"

static const em_op *op_lstm, *op_lstm_bwd, *op_gru, *op_gru_bwd;

#define SHAPE(t, buf) em__shape_str((t)->ndim, (t)->shape, buf, sizeof buf)

static bool is_none(const em_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }
static bool meta_none(const em_tensor_meta *m) { return m->ndim == 1 && m->shape[0] == 0; }

static void meta_of(em_tensor_meta *m, em_dtype dt, int ndim, const int64_t *shape) {
    m->dtype = dt;
    m->ndim = ndim;
    memcpy(m->shape, shape, sizeof(int64_t) * (size_t)ndim);
}

/* ---- inference ------------------------------------------------------------------------------- */

/* t is none or has the given 1-D/2-D shape. */
static em_status want_shape(const em_op *op, const char *name, const em_tensor *t, int ndim,
                            int64_t d0, int64_t d1, bool optional) {
    char b1[160];
    if (optional && is_none(t)) return EM_OK;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        if (ndim == 1)
            return em_set_error(EM_ERR_SHAPE, "%s: %s has shape %s; expected [%lld]",
                                em_op_name(op), name, SHAPE(t, b1), (long long)d0);
        return em_set_error(EM_ERR_SHAPE, "%s: %s has shape %s; expected [%lld, %lld]",
                            em_op_name(op), name, SHAPE(t, b1), (long long)d0, (long long)d1);
    }
    return EM_OK;
}

/* Floating inputs of one dtype (the none ones aside), int64 lengths. */
static em_status check_dtypes(const em_op *op, const em_tensor *const *in, int n, int ilen) {
    em_dtype dt = EM_F32;
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (i == ilen) {
            if (!is_none(in[i]) && in[i]->dtype != EM_I64)
                return em_set_error(EM_ERR_DTYPE, "%s: lengths has dtype %s; expected int64",
                                    em_op_name(op), em_dtype_name(in[i]->dtype));
            continue;
        }
        if (is_none(in[i])) continue;
        if (!em_dtype_is_floating(in[i]->dtype) || (!first && in[i]->dtype != dt))
            return em_set_error(EM_ERR_DTYPE, "%s: %s has dtype %s; expected %s like the other "
                                "operands (a floating dtype)", em_op_name(op),
                                em_op_schema_of(op)->input_names[i],
                                em_dtype_name(in[i]->dtype), first ? "floating" : em_dtype_name(dt));
        if (first) dt = in[i]->dtype, first = false;
    }
    return EM_OK;
}

/* The hidden size from w (G H, I + H) and the input size I. */
static em_status hidden_of(const em_op *op, const em_tensor *w, int64_t G, int64_t I,
                           int64_t *H) {
    char b1[160];
    if (w->ndim != 2 || w->shape[0] % G != 0 || w->shape[0] / G < 1 ||
        w->shape[1] != I + w->shape[0] / G)
        return em_set_error(EM_ERR_SHAPE, "%s: weight %s must be [%lld H, %lld + H] (the input "
                            "and hidden weights catenated along dim 1) for input size %lld",
                            em_op_name(op), SHAPE(w, b1), (long long)G, (long long)I,
                            (long long)I);
    *H = w->shape[0] / G;
    return EM_OK;
}

static em_status check_input(const em_op *op, const em_tensor *x) {
    char b1[160];
    if (x->ndim != 3)
        return em_set_error(EM_ERR_SHAPE, "%s: input %s must be (T, N, I) (time first)",
                            em_op_name(op), SHAPE(x, b1));
    return EM_OK;
}

static em_status infer_lstm(const em_op *op, const em_tensor *const *in, const em_attr *a,
                            em_tensor_meta *out) {
    (void)a;
    const em_tensor *x = in[0];
    int64_t H = 0;
    em_status st = check_dtypes(op, in, 6, 5);
    if (st == EM_OK) st = check_input(op, x);
    if (st == EM_OK) st = hidden_of(op, in[3], 4, x->shape[2], &H);
    int64_t N = st == EM_OK ? x->shape[1] : 0;
    if (st == EM_OK) st = want_shape(op, "hx", in[1], 2, N, H, true);
    if (st == EM_OK) st = want_shape(op, "cx", in[2], 2, N, H, true);
    if (st == EM_OK) st = want_shape(op, "bias", in[4], 1, 4 * H, 0, true);
    if (st == EM_OK) st = want_shape(op, "lengths", in[5], 1, N, 0, true);
    if (st != EM_OK) return st;
    em_dtype dt = x->dtype;
    meta_of(&out[0], dt, 3, (const int64_t[]){x->shape[0], N, H});
    meta_of(&out[1], dt, 2, (const int64_t[]){N, H});
    meta_of(&out[2], dt, 2, (const int64_t[]){N, H});
    meta_of(&out[3], dt, 3, (const int64_t[]){x->shape[0], N, 6 * H});
    return EM_OK;
}

static em_status infer_gru(const em_op *op, const em_tensor *const *in, const em_attr *a,
                           em_tensor_meta *out) {
    (void)a;
    const em_tensor *x = in[0];
    int64_t H = 0;
    em_status st = check_dtypes(op, in, 6, 5);
    if (st == EM_OK) st = check_input(op, x);
    if (st == EM_OK) st = hidden_of(op, in[2], 3, x->shape[2], &H);
    int64_t N = st == EM_OK ? x->shape[1] : 0;
    if (st == EM_OK) st = want_shape(op, "hx", in[1], 2, N, H, true);
    if (st == EM_OK) st = want_shape(op, "bias_ih", in[3], 1, 3 * H, 0, true);
    if (st == EM_OK) st = want_shape(op, "bias_hh", in[4], 1, 3 * H, 0, true);
    if (st == EM_OK) st = want_shape(op, "lengths", in[5], 1, N, 0, true);
    if (st != EM_OK) return st;
    em_dtype dt = x->dtype;
    meta_of(&out[0], dt, 3, (const int64_t[]){x->shape[0], N, H});
    meta_of(&out[1], dt, 2, (const int64_t[]){N, H});
    meta_of(&out[2], dt, 3, (const int64_t[]){x->shape[0], N, 5 * H});
    return EM_OK;
}

/* The backwards: the geometry from the workspace (T, N, per H) and w (G H, I + H). */
static em_status infer_bwd(const em_op *op, const em_tensor *const *in, int n, int iw, int ng,
                           int64_t G, int64_t per, int64_t *T, int64_t *N, int64_t *H) {
    char b1[160], b2[160];
    const em_tensor *w = in[iw], *ws = in[iw + 1];
    em_status st = check_dtypes(op, in, n, n - 1);
    if (st != EM_OK) return st;
    if (ws->ndim != 3 || w->ndim != 2 || ws->shape[2] % per != 0 ||
        w->shape[0] != G * (ws->shape[2] / per) || w->shape[1] < ws->shape[2] / per)
        return em_set_error(EM_ERR_SHAPE, "%s: workspace %s must be (T, N, %lld H) and weight %s "
                            "[%lld H, I + H]", em_op_name(op), SHAPE(ws, b1), (long long)per,
                            SHAPE(w, b2), (long long)G);
    *T = ws->shape[0], *N = ws->shape[1], *H = ws->shape[2] / per;
    const em_tensor *gy = in[0];
    if (!is_none(gy) && (gy->ndim != 3 || gy->shape[0] != *T || gy->shape[1] != *N ||
                         gy->shape[2] != *H))
        return em_set_error(EM_ERR_SHAPE, "%s: grad_output %s does not match the output "
                            "[%lld, %lld, %lld]", em_op_name(op), SHAPE(gy, b1), (long long)*T,
                            (long long)*N, (long long)*H);
    for (int i = 1; i < 1 + ng; i++) {
        st = want_shape(op, em_op_schema_of(op)->input_names[i], in[i], 2, *N, *H, true);
        if (st != EM_OK) return st;
    }
    return want_shape(op, "lengths", in[n - 1], 1, *N, 0, true);
}

static em_status infer_lstm_bwd(const em_op *op, const em_tensor *const *in, const em_attr *a,
                                em_tensor_meta *out) {
    (void)a;
    int64_t T, N, H;
    em_status st = infer_bwd(op, in, 6, 3, 2, 4, 6, &T, &N, &H);
    if (st != EM_OK) return st;
    em_dtype dt = in[4]->dtype;
    meta_of(&out[0], dt, 3, (const int64_t[]){T, N, 4 * H});
    meta_of(&out[1], dt, 2, (const int64_t[]){N, H});
    meta_of(&out[2], dt, 2, (const int64_t[]){N, H});
    return EM_OK;
}

static em_status infer_gru_bwd(const em_op *op, const em_tensor *const *in, const em_attr *a,
                               em_tensor_meta *out) {
    (void)a;
    int64_t T, N, H;
    em_status st = infer_bwd(op, in, 5, 2, 1, 3, 5, &T, &N, &H);
    if (st != EM_OK) return st;
    em_dtype dt = in[3]->dtype;
    meta_of(&out[0], dt, 3, (const int64_t[]){T, N, 3 * H});
    meta_of(&out[1], dt, 3, (const int64_t[]){T, N, 3 * H});
    meta_of(&out[2], dt, 2, (const int64_t[]){N, H});
    return EM_OK;
}

/* ---- composites ------------------------------------------------------------------------------ */

static em_attr abool(bool v) { return (em_attr){.type = EM_ATTR_BOOL, .v.b = v}; }

/* The dtype of a call: its first floating operand's; every floating operand must share it
 * (lengths int64). */
static em_status call_dtype(const char *who, const em_tensor *const *in, int n, int ilen,
                            const char *const *names, em_dtype *dt) {
    const em_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        if (i == ilen) {
            if (in[i]->dtype != EM_I64)
                return em_set_error(EM_ERR_DTYPE, "%s: lengths has dtype %s; expected int64",
                                    who, em_dtype_name(in[i]->dtype));
            continue;
        }
        if (!em_dtype_is_floating(in[i]->dtype) || (first && in[i]->dtype != first->dtype))
            return em_set_error(EM_ERR_DTYPE, "%s: %s has dtype %s; expected %s", who, names[i],
                                em_dtype_name(in[i]->dtype),
                                first ? em_dtype_name(first->dtype) : "a floating dtype");
        if (!first) first = in[i];
    }
    *dt = first ? first->dtype : EM_F32;
    return EM_OK;
}

/* Runs the kernel of op on in[0..n) ('x' roles, lengths 'i'); the first n_fin results are
 * rounded back to dt (the rest stay in the kernel dtype: workspaces). */
static em_status run_rnn(const char *who, const em_op *op, const em_tensor *const *in, int n,
                         int ilen, const char *const *names, const em_attr *attrs, int n_res,
                         int n_fin, em_tensor **out, int *n_out) {
    em_dtype dt = EM_F32;
    if (call_dtype(who, in, n, ilen, names, &dt) != EM_OK) return em_last_status();
    char roles[8] = "xxxxxxx";
    roles[ilen] = 'i';
    em_attr a[1] = {abool(em__attr_bool_or(attrs, 0, false))};
    em_tensor *res[4] = {NULL, NULL, NULL, NULL};
    /* The first present operand carries the device (em__nn_call reads t[0]'s). */
    em_status st = em__nn_call(op, dt, in, roles, n, a, res);
    for (int i = 0; i < n_fin && st == EM_OK; i++)
        if (!(res[i] = em__nn_finish(res[i], dt))) st = em_last_status();
    return em__nn_outputs(st, res, n_res, out, n_out);
}

#define UNUSED (void)op, (void)n_in, (void)cap

static const char *const lstm_i[] = {"input", "hx", "cx", "weight", "bias", "lengths"},
                         *const lstm_bwd_i[] = {"grad_output", "grad_hn", "grad_cn", "weight",
                                                "workspace", "lengths"},
                         *const gru_i[] = {"input", "hx", "weight", "bias_ih", "bias_hh",
                                           "lengths"},
                         *const gru_bwd_i[] = {"grad_output", "grad_hn", "weight", "workspace",
                                               "lengths"};

EM__COMPOSITE(c_lstm) {
    UNUSED;
    return run_rnn("lstm", op_lstm, in, 6, 5, lstm_i, attrs, 4, 3, out, n_out);
}
EM__COMPOSITE(c_gru) {
    UNUSED;
    return run_rnn("gru", op_gru, in, 6, 5, gru_i, attrs, 3, 2, out, n_out);
}

/* The backwards: input 0 (grad_output) may be absent; em__nn_call takes the device from its
 * first operand, so an absent one becomes zeros on the workspace's device first. */
static em_status run_bwd(const char *who, const em_op *op, const em_tensor *const *in, int n,
                         const char *const *names, const em_attr *attrs, int iws, int n_res,
                         em_tensor **out, int *n_out) {
    const em_tensor *args[6];
    memcpy(args, in, sizeof(*in) * (size_t)n);
    em_tensor *zeros = NULL;
    const em_tensor *ws = in[iws];
    if (!args[0]) {
        if (ws->ndim != 3)
            return em_set_error(EM_ERR_SHAPE, "%s: workspace must be (T, N, k H)", who);
        int64_t per = op == op_lstm_bwd ? 6 : 5;
        int64_t shape[3] = {ws->shape[0], ws->shape[1], ws->shape[2] / per};
        if (!(zeros = em__empty(3, shape, ws->dtype, ws->storage->device)) ||
            em_fill_(zeros, 0) != EM_OK) {
            em_tensor_release(zeros);
            return em_last_status();
        }
        args[0] = zeros;
    }
    em_status st = run_rnn(who, op, args, n, n - 1, names, attrs, n_res, n_res, out, n_out);
    em_tensor_release(zeros);
    return st;
}

EM__COMPOSITE(c_lstm_bwd) {
    UNUSED;
    return run_bwd("lstm_backward", op_lstm_bwd, in, 6, lstm_bwd_i, attrs, 4, 3, out, n_out);
}
EM__COMPOSITE(c_gru_bwd) {
    UNUSED;
    return run_bwd("gru_backward", op_gru_bwd, in, 5, gru_bwd_i, attrs, 3, 3, out, n_out);
}

/* ---- derivatives ----------------------------------------------------------------------------- */

/* The parameter and input gradients from the pre-activation gradients over the whole
 * sequence: x (T, N, I), hprev (T, N, H) (a view of the workspace), dGi/dGh (T, N, G H).
 * grad_input = dGi W_ih, grad_weight = [dGi^T x | dGh^T hprev] (the LSTM's, dGi = dGh:
 * dG^T [x | hprev]), grad_bias_* = sum dG*. */
static em_status param_grads(const em_backward_ctx *c, em_tensor **gi, const em_tensor *dGi,
                             const em_tensor *dGh, const em_tensor *hprev, int ix, int iw,
                             int ib_i, int ib_h) {
    const em_tensor *x = c->in[ix], *w = c->in[iw];
    int64_t T = x->shape[0], N = x->shape[1], I = x->shape[2], GH = dGi->shape[2];
    int64_t H = w->shape[1] - I;
    em_tensor *di = em_reshape(dGi, 2, (const int64_t[]){T * N, GH});
    em_tensor *dh = dGh == dGi ? di : em_reshape(dGh, 2, (const int64_t[]){T * N, GH});
    if (!di || !dh) return em_last_status();
    if (c->needs_grad[ix]) {
        em_tensor *wih = em_narrow(w, 1, 0, I);
        em_tensor *g = wih ? em_matmul(di, wih) : NULL;
        if (!g || !(gi[ix] = em_reshape(g, 3, (const int64_t[]){T, N, I})))
            return em_last_status();
    }
    if (c->needs_grad[iw] && dGh == dGi) {
        /* The LSTM: [x | hprev] made dense once (a cat, which also makes the strided hprev
         * dense), then one product of I + H columns instead of two of I and H and a cat of
         * their results: oneDNN 2.6.3's gemm:jit (AVX2) on the transposed dG took 38.8 ms of
         * CPU for each 1024 x 256 x 2048 half and 62.3 for the whole 1024 x 512 x 2048 (one
         * thread, train_lstm_h256's shapes). */
        em_tensor *xh = em_cat(2, (const em_tensor *const[]){x, hprev}, 2);
        em_tensor *xhr = xh ? em_reshape(xh, 2, (const int64_t[]){T * N, I + H}) : NULL;
        if (!xhr || !(gi[iw] = em_matmul(em_transpose(di, 0, 1), xhr))) return em_last_status();
    } else if (c->needs_grad[iw]) {
        em_tensor *xr = em_reshape(x, 2, (const int64_t[]){T * N, I});
        /* hprev is a strided view of the workspace (row stride 6H or 5H): made dense first,
         * for oneDNN's brgemm (its gemm on the strided operand took three times as long). */
        em_tensor *hd = em_contiguous(hprev);
        em_tensor *hr = hd ? em_reshape(hd, 2, (const int64_t[]){T * N, H}) : NULL;
        em_tensor *gih = xr ? em_matmul(em_transpose(di, 0, 1), xr) : NULL;
        em_tensor *ghh = hr ? em_matmul(em_transpose(dh, 0, 1), hr) : NULL;
        if (!gih || !ghh ||
            !(gi[iw] = em_cat(2, (const em_tensor *const[]){gih, ghh}, 1)))
            return em_last_status();
    }
    if (ib_i >= 0 && c->needs_grad[ib_i] && !meta_none(&c->in_meta[ib_i]) &&
        !(gi[ib_i] = em_sum(di, 1, (const int[]){0}, false)))
        return em_last_status();
    if (ib_h >= 0 && c->needs_grad[ib_h] && !meta_none(&c->in_meta[ib_h]) &&
        !(gi[ib_h] = em_sum(dh, 1, (const int[]){0}, false)))
        return em_last_status();
    return EM_OK;
}

static const em_tensor *opt_in(const em_backward_ctx *c, int i) {
    return c->in[i] && !is_none(c->in[i]) ? c->in[i] : NULL;
}

static em_status d_lstm(const em_backward_ctx *c, em_tensor **gi) {
    if (c->grad_out[3])
        return em_set_error(EM_ERR_STATE, "backward: lstm: gradients through its workspace "
                            "output are not supported");
    if (!c->grad_out[0] && !c->grad_out[1] && !c->grad_out[2]) return EM_OK;
    const em_tensor *ws = c->out[3];
    em_tensor *dG = NULL, *ghx = NULL, *gcx = NULL;
    em_status st = em_lstm_backward(c->grad_out[0], c->grad_out[1], c->grad_out[2], c->in[3],
                                    ws, opt_in(c, 5), c->attrs[0].v.b, &dG, &ghx, &gcx);
    if (st != EM_OK) return st;
    if (c->needs_grad[1] && !meta_none(&c->in_meta[1])) gi[1] = ghx;
    if (c->needs_grad[2] && !meta_none(&c->in_meta[2])) gi[2] = gcx;
    int64_t H = ws->shape[2] / 6;
    em_tensor *hprev = em_narrow(ws, 2, 5 * H, H);
    if (!hprev) return em_last_status();
    return param_grads(c, gi, dG, dG, hprev, 0, 3, 4, -1);
}

static em_status d_gru(const em_backward_ctx *c, em_tensor **gi) {
    if (c->grad_out[2])
        return em_set_error(EM_ERR_STATE, "backward: gru: gradients through its workspace "
                            "output are not supported");
    if (!c->grad_out[0] && !c->grad_out[1]) return EM_OK;
    const em_tensor *ws = c->out[2];
    em_tensor *dGi = NULL, *dGh = NULL, *ghx = NULL;
    em_status st = em_gru_backward(c->grad_out[0], c->grad_out[1], c->in[2], ws, opt_in(c, 5),
                                   c->attrs[0].v.b, &dGi, &dGh, &ghx);
    if (st != EM_OK) return st;
    if (c->needs_grad[1] && !meta_none(&c->in_meta[1])) gi[1] = ghx;
    int64_t H = ws->shape[2] / 5;
    em_tensor *hprev = em_narrow(ws, 2, 4 * H, H);
    if (!hprev) return em_last_status();
    return param_grads(c, gi, dGi, dGh, hprev, 0, 2, 3, 4);
}

/* ---- declarations ---------------------------------------------------------------------------- */

em_status em__ops_declare_rnn(em_registry *core) {
    static const char *const attr_n[] = {"reverse"};
    static const em_attr_type attr_t[] = {EM_ATTR_BOOL};
    em_status st = em__declare(core, &op_lstm, (em_op_schema){
        .name = "lstm", .n_inputs = 6, .input_names = lstm_i, .n_outputs = 4, .n_attrs = 1,
        .attr_names = attr_n, .attr_types = attr_t, .infer = infer_lstm, .backward = d_lstm,
        .saves = EM_SAVE_INPUT(0) | EM_SAVE_INPUT(3) | EM_SAVE_INPUT(5) | EM_SAVE_OUTPUT(3),
        .composite = c_lstm, .optional_inputs = (1u << 1) | (1u << 2) | (1u << 4) | (1u << 5),
        .category = "nn"});
    if (st == EM_OK)
        st = em__declare(core, &op_lstm_bwd, (em_op_schema){
            .name = "lstm_backward", .n_inputs = 6, .input_names = lstm_bwd_i, .n_outputs = 3,
            .n_attrs = 1, .attr_names = attr_n, .attr_types = attr_t, .flags = EM_OP_NONDIFF,
            .infer = infer_lstm_bwd, .composite = c_lstm_bwd,
            .optional_inputs = (1u << 0) | (1u << 1) | (1u << 2) | (1u << 5), .category = "nn"});
    if (st == EM_OK)
        st = em__declare(core, &op_gru, (em_op_schema){
            .name = "gru", .n_inputs = 6, .input_names = gru_i, .n_outputs = 3, .n_attrs = 1,
            .attr_names = attr_n, .attr_types = attr_t, .infer = infer_gru, .backward = d_gru,
            .saves = EM_SAVE_INPUT(0) | EM_SAVE_INPUT(2) | EM_SAVE_INPUT(5) | EM_SAVE_OUTPUT(2),
            .composite = c_gru, .optional_inputs = (1u << 1) | (1u << 3) | (1u << 4) | (1u << 5),
            .category = "nn"});
    if (st == EM_OK)
        st = em__declare(core, &op_gru_bwd, (em_op_schema){
            .name = "gru_backward", .n_inputs = 5, .input_names = gru_bwd_i, .n_outputs = 3,
            .n_attrs = 1, .attr_names = attr_n, .attr_types = attr_t, .flags = EM_OP_NONDIFF,
            .infer = infer_gru_bwd, .composite = c_gru_bwd,
            .optional_inputs = (1u << 0) | (1u << 1) | (1u << 4), .category = "nn"});
    return st;
}

/* ---- public functions: one line each --------------------------------------------------------- */

em_tensor *em_lstm(const em_tensor *input, const em_tensor *hx, const em_tensor *cx,
                   const em_tensor *weight, const em_tensor *bias, const em_tensor *lengths,
                   bool reverse, em_tensor **h_n, em_tensor **c_n, em_tensor **workspace) {
    em_tensor *y = NULL;
    em_status st = em__callv(op_lstm, 6, EM__IN(input, hx, cx, weight, bias, lengths),
                             EM__ATTRS(abool(reverse)),
                             (em_tensor **const[]){&y, h_n, c_n, workspace}, 4);
    return st == EM_OK ? y : NULL;
}

em_status em_lstm_backward(const em_tensor *grad_output, const em_tensor *grad_hn,
                           const em_tensor *grad_cn, const em_tensor *weight,
                           const em_tensor *workspace, const em_tensor *lengths, bool reverse,
                           em_tensor **grad_gates, em_tensor **grad_hx, em_tensor **grad_cx) {
    return em__callv(op_lstm_bwd, 6,
                     EM__IN(grad_output, grad_hn, grad_cn, weight, workspace, lengths),
                     EM__ATTRS(abool(reverse)),
                     (em_tensor **const[]){grad_gates, grad_hx, grad_cx}, 3);
}

em_tensor *em_gru(const em_tensor *input, const em_tensor *hx, const em_tensor *weight,
                  const em_tensor *bias_ih, const em_tensor *bias_hh, const em_tensor *lengths,
                  bool reverse, em_tensor **h_n, em_tensor **workspace) {
    em_tensor *y = NULL;
    em_status st = em__callv(op_gru, 6, EM__IN(input, hx, weight, bias_ih, bias_hh, lengths),
                             EM__ATTRS(abool(reverse)), (em_tensor **const[]){&y, h_n, workspace},
                             3);
    return st == EM_OK ? y : NULL;
}

em_status em_gru_backward(const em_tensor *grad_output, const em_tensor *grad_hn,
                          const em_tensor *weight, const em_tensor *workspace,
                          const em_tensor *lengths, bool reverse, em_tensor **grad_gates_input,
                          em_tensor **grad_gates_hidden, em_tensor **grad_hx) {
    return em__callv(op_gru_bwd, 5, EM__IN(grad_output, grad_hn, weight, workspace, lengths),
                     EM__ATTRS(abool(reverse)),
                     (em_tensor **const[]){grad_gates_input, grad_gates_hidden, grad_hx}, 3);
}

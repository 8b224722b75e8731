/*
 * core/op_cases.c — the case rows of the standard op set (ember/opcase.h), registered by
 * em_init() with the core's registry: the rows and their typed-function adapters. Adding an
 * op: one row (or a few: a layout, an invalid attribute) and, when it has a typed function,
 * its adapter here. tests/test_op_schema's coverage check fails while a declared standard op
 * has no row.
 */
#include "ember/autograd.h"
#include "ember/ops.h"
#include "ember/opcase.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- typed adapters ---------------------------------------------------------------------- */

#define X0 in[0]
#define X1 in[1]
#define X2 in[2]
#define X3 in[3]
#define X4 in[4]
#define AF(k) (a[k].v.f)
#define AI(k) (a[k].v.i)
#define AB(k) (a[k].type == EM_ATTR_BOOL && a[k].v.b)
#define OPTF(k) (a[k].type == EM_ATTR_FLOAT ? &a[k].v.f : NULL)
#define STR(k) (a[k].type == EM_ATTR_STRING ? a[k].v.s : NULL)
/* An INTS attribute as the int array and count the typed functions take. */
#define DIMS(k) (a[k].type == EM_ATTR_INTS ? a[k].n : 0), dims_of(&a[k], dbuf)
#define PAIR(k) pair_of(&a[k], pbuf[k])

static const int *dims_of(const em_attr *x, int *buf) {
    if (x->type != EM_ATTR_INTS) return NULL;
    for (int i = 0; i < x->n && i < EM_MAX_DIMS; i++) buf[i] = (int)x->ints[i];
    return buf;
}
static const int64_t *pair_of(const em_attr *x, int64_t *buf) {
    if (x->type != EM_ATTR_INTS) return NULL;
    buf[0] = x->ints[0], buf[1] = x->ints[1];
    return buf;
}

/* One output. */
#define T1(name, expr)                                                                          \
    static em_status t_##name(const em_tensor *const *in, const em_attr *a, em_tensor **out,   \
                              int *n) {                                                         \
        int dbuf[EM_MAX_DIMS];                                                                  \
        int64_t pbuf[EM_CASE_MAX_ATTRS][2];                                                     \
        (void)in, (void)a, (void)dbuf, (void)pbuf;                                              \
        *n = 0;                                                                                 \
        if (!(out[0] = (expr))) return em_last_status();                                        \
        *n = 1;                                                                                 \
        return EM_OK;                                                                           \
    }
/* A status and outputs into o0, o1, o2. */
#define TS(name, k, expr)                                                                       \
    static em_status t_##name(const em_tensor *const *in, const em_attr *a, em_tensor **out,   \
                              int *n) {                                                         \
        int64_t pbuf[EM_CASE_MAX_ATTRS][2];                                                     \
        em_tensor *o0 = NULL, *o1 = NULL, *o2 = NULL;                                           \
        (void)in, (void)a, (void)pbuf, (void)o2;                                                \
        *n = 0;                                                                                 \
        em_status st = (expr);                                                                  \
        if (st != EM_OK) return st;                                                             \
        out[0] = o0, out[1] = o1, out[2] = o2, *n = k;                                          \
        return EM_OK;                                                                           \
    }

T1(add, em_add(X0, X1))
T1(sub, em_sub(X0, X1))
T1(mul, em_mul(X0, X1))
T1(div, em_div(X0, X1))
T1(neg, em_neg(X0))
T1(exp, em_exp(X0))
T1(log, em_log(X0))
T1(relu, em_relu(X0))
T1(copy, em_clone(X0))
T1(sum, em_sum(X0, DIMS(0), AB(1)))
T1(mean, em_mean(X0, DIMS(0), AB(1)))
T1(index_select, em_index_select(X0, (int)AI(0), X1))
T1(abs, em_abs(X0))
T1(sqrt, em_sqrt(X0))
T1(rsqrt, em_rsqrt(X0))
T1(reciprocal, em_reciprocal(X0))
T1(sigmoid, em_sigmoid(X0))
T1(tanh, em_tanh(X0))
T1(log1p, em_log1p(X0))
T1(expm1, em_expm1(X0))
T1(sign, em_sign(X0))
T1(erf, em_erf(X0))
T1(erfinv, em_erfinv(X0))
T1(div_mode, em_div_mode(X0, X1, STR(0)))
T1(gelu, em_gelu(X0, STR(0)))
T1(silu, em_silu(X0))
T1(leaky_relu, em_leaky_relu(X0, AF(0)))
T1(clamp, em_clamp(X0, OPTF(0), OPTF(1)))
T1(add_scalar, em_add_scalar(X0, AF(0)))
T1(sub_scalar, em_sub_scalar(X0, AF(0)))
T1(mul_scalar, em_mul_scalar(X0, AF(0)))
T1(div_scalar, em_div_scalar(X0, AF(0)))
T1(pow_scalar, em_pow_scalar(X0, AF(0)))
T1(pow, em_pow(X0, X1))
T1(maximum, em_maximum(X0, X1))
T1(minimum, em_minimum(X0, X1))
T1(eq, em_eq(X0, X1))
T1(ne, em_ne(X0, X1))
T1(lt, em_lt(X0, X1))
T1(le, em_le(X0, X1))
T1(gt, em_gt(X0, X1))
T1(ge, em_ge(X0, X1))
T1(logical_and, em_logical_and(X0, X1))
T1(logical_or, em_logical_or(X0, X1))
T1(logical_xor, em_logical_xor(X0, X1))
T1(logical_not, em_logical_not(X0))
T1(where, em_where(X0, X1, X2))
T1(threshold_backward, em_threshold_backward(X0, X1, AF(0)))
T1(sigmoid_backward, em_sigmoid_backward(X0, X1))
T1(tanh_backward, em_tanh_backward(X0, X1))
T1(gelu_backward, em_gelu_backward(X0, X1, STR(0)))
T1(silu_backward, em_silu_backward(X0, X1))
T1(leaky_relu_backward, em_leaky_relu_backward(X0, X1, AF(0)))
T1(amax, em_amax(X0, DIMS(0), AB(1)))
T1(amin, em_amin(X0, DIMS(0), AB(1)))
T1(max, em_max(X0))
T1(min, em_min(X0))
TS(max_dim, 2, em_max_dim(X0, (int)AI(0), AB(1), &o0, &o1))
TS(min_dim, 2, em_min_dim(X0, (int)AI(0), AB(1), &o0, &o1))
T1(argmax, em_argmax(X0, a[0].type == EM_ATTR_INTS && a[0].n ? dims_of(&a[0], dbuf) : NULL, AB(1)))
T1(argmin, em_argmin(X0, a[0].type == EM_ATTR_INTS && a[0].n ? dims_of(&a[0], dbuf) : NULL, AB(1)))
T1(var, em_var(X0, DIMS(0), AF(1), AB(2)))
T1(std, em_std(X0, DIMS(0), AF(1), AB(2)))
T1(logsumexp, em_logsumexp(X0, DIMS(0), AB(1)))
T1(norm, em_norm(X0, AF(1), DIMS(0), AB(2)))
T1(prod, em_prod(X0, DIMS(0), AB(1)))
T1(all, em_all(X0, DIMS(0), AB(1)))
T1(any, em_any(X0, DIMS(0), AB(1)))
T1(conv2d, em_conv2d(X0, X1, X2, PAIR(0), PAIR(1), PAIR(2), AI(3)))
T1(conv2d_relu, em_conv2d_relu(X0, X1, X2, PAIR(0), PAIR(1), PAIR(2), AI(3)))
T1(conv2d_bwd_data, em_conv2d_backward_data(X0, X1, PAIR(4), PAIR(0), PAIR(1), PAIR(2), AI(3)))
TS(conv2d_bwd_weight, 2, em_conv2d_backward_weight(X0, X1, PAIR(4), PAIR(0), PAIR(1), PAIR(2),
                                                   AI(3), &o0, &o1))
TS(max_pool2d, 2, em_max_pool2d(X0, PAIR(0), PAIR(1), PAIR(2), PAIR(3), AB(4), &o0, &o1))
T1(max_pool2d_bwd, em_max_pool2d_backward(X0, X1, PAIR(0)))
TS(max_pool2d_relu, 2, em_max_pool2d_relu(X0, PAIR(0), PAIR(1), PAIR(2), PAIR(3), AB(4), &o0,
                                          &o1))
T1(avg_pool2d, em_avg_pool2d(X0, PAIR(0), PAIR(1), PAIR(2), AB(3), AB(4)))
T1(avg_pool2d_bwd, em_avg_pool2d_backward(X0, PAIR(5), PAIR(0), PAIR(1), PAIR(2), AB(3), AB(4)))
T1(adaptive, em_adaptive_avg_pool2d(X0, PAIR(0)))
T1(adaptive_bwd, em_adaptive_avg_pool2d_backward(X0, PAIR(0)))
TS(batch_norm, 3, em_batch_norm(X0, X1, X2, (em_tensor *)X3, (em_tensor *)X4, AB(0), AF(1),
                                AF(2), &o0, &o1, &o2))
TS(batch_norm_bwd, 3, em_batch_norm_backward(X0, X1, X2, X3, X4, AB(0), &o0, &o1, &o2))
TS(layer_norm, 3, em_layer_norm(X0, (int)AI(0), a[2].ints, X1, X2, AF(1), &o0, &o1, &o2))
TS(layer_norm_bwd, 3, em_layer_norm_backward(X0, X1, X2, X3, X4, (int)AI(0), &o0, &o1, &o2))
/* dropout draws its mask from a generator set to the row's (seed, offset). */
static em_status t_dropout(const em_tensor *const *in, const em_attr *a, em_tensor **out,
                           int *n) {
    *n = 0;
    em_generator *g = em_generator_new(0);
    if (!g) return em_last_status();
    em_generator_set_state(g, (em_rng_state){.seed = (uint64_t)AI(2), .offset = (uint64_t)AI(3)});
    em_tensor *mask = NULL;
    out[0] = em_dropout(X0, AF(0), AB(1), g, &mask);
    em_generator_free(g);
    if (!out[0]) return em_last_status();
    out[1] = mask, *n = 2;
    return EM_OK;
}
T1(softmax, em_softmax(X0, (int)AI(0)))
T1(log_softmax, em_log_softmax(X0, (int)AI(0)))
T1(softmax_bwd, em_softmax_backward(X0, X1, (int)AI(0)))
T1(log_softmax_bwd, em_log_softmax_backward(X0, X1, (int)AI(0)))
T1(conv1d, em_conv1d(X0, X1, X2, AI(0), AI(1), AI(2), AI(3)))
T1(conv_transpose2d, em_conv_transpose2d(X0, X1, X2, PAIR(0), PAIR(1), PAIR(2), AI(3), PAIR(4)))
T1(group_norm, em_group_norm(X0, AI(0), X1, X2, AF(1)))
/* scaled_dot_product_attention draws its dropout mask from a generator set to the row's
 * (seed, offset), and returns its logsumexp too. */
static em_status t_sdpa(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    em_generator *g = em_generator_new(0);
    if (!g) return em_last_status();
    em_generator_set_state(g, (em_rng_state){.seed = (uint64_t)AI(3), .offset = (uint64_t)AI(4)});
    em_tensor *lse = NULL;
    out[0] = em_scaled_dot_product_attention(X0, X1, X2, X3, AF(0), AB(1), OPTF(2), g, &lse);
    em_generator_free(g);
    if (!out[0]) return em_last_status();
    out[1] = lse, *n = 2;
    return EM_OK;
}
TS(sdpa_bwd, 3, em_scaled_dot_product_attention_backward(
                    X0, X1, X2, X3, X4, in[5], AF(0), AB(1), OPTF(2),
                    (em_rng_state){.seed = (uint64_t)AI(3), .offset = (uint64_t)AI(4)}, &o0, &o1,
                    &o2))
/* lstm and gru return their final states and workspace too. */
static em_status t_lstm(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    if (!(out[0] = em_lstm(X0, X1, X2, X3, X4, in[5], AB(0), &out[1], &out[2], &out[3])))
        return em_last_status();
    *n = 4;
    return EM_OK;
}
static em_status t_gru(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    if (!(out[0] = em_gru(X0, X1, X2, X3, X4, in[5], AB(0), &out[1], &out[2])))
        return em_last_status();
    *n = 3;
    return EM_OK;
}
TS(lstm_bwd, 3, em_lstm_backward(X0, X1, X2, X3, X4, in[5], AB(0), &o0, &o1, &o2))
TS(gru_bwd, 3, em_gru_backward(X0, X1, X2, X3, X4, AB(0), &o0, &o1, &o2))
T1(cross_entropy, em_cross_entropy(X0, X1, X2, (em_reduction)AI(0), AI(1), AF(2)))
T1(cross_entropy_bwd, em_cross_entropy_backward(X0, X1, X2, X3, (em_reduction)AI(0), AI(1), AF(2)))
T1(nll_loss, em_nll_loss(X0, X1, X2, (em_reduction)AI(0), AI(1)))
T1(nll_loss_bwd, em_nll_loss_backward(X0, X1, X2, X3, (em_reduction)AI(0), AI(1)))
T1(mse_loss, em_mse_loss(X0, X1, (em_reduction)AI(0)))
T1(mse_loss_bwd, em_mse_loss_backward(X0, X1, X2, (em_reduction)AI(0)))
T1(l1_loss, em_l1_loss(X0, X1, (em_reduction)AI(0)))
T1(l1_loss_bwd, em_l1_loss_backward(X0, X1, X2, (em_reduction)AI(0)))
T1(smooth_l1_loss, em_smooth_l1_loss(X0, X1, (em_reduction)AI(0), AF(1)))
T1(smooth_l1_loss_bwd, em_smooth_l1_loss_backward(X0, X1, X2, (em_reduction)AI(0), AF(1)))
T1(bce, em_binary_cross_entropy_with_logits(X0, X1, X2, X3, (em_reduction)AI(0)))
T1(bce_bwd, em_binary_cross_entropy_with_logits_backward(X0, X1, X2, X3, X4, (em_reduction)AI(0)))
T1(gather, em_gather(X0, (int)AI(0), X1))
T1(scatter, em_scatter(X0, (int)AI(0), X1, X2))
T1(scatter_add, em_scatter_add(X0, (int)AI(0), X1, X2))
T1(index_add, em_index_add(X0, (int)AI(0), X1, X2, AF(1)))
T1(embedding, em_embedding(X0, X1, AI(0)))
T1(embedding_bwd, em_embedding_backward(X0, X1, AI(0), AI(1)))
T1(masked_fill, em_masked_fill(X0, X1, AF(0)))
T1(one_hot, em_one_hot(X0, AI(0)))
T1(tril, em_tril(X0, AI(0)))
T1(triu, em_triu(X0, AI(0)))
T1(flip, em_flip(X0, DIMS(0)))
T1(bmm, em_bmm(X0, X1))
T1(addmm, em_addmm(X0, X1, X2, AF(0), AF(1)))
T1(matmul, em_matmul(X0, X1))
T1(linear, em_linear(X0, X1, X2))
T1(pad, em_pad(X0, a[0].n, a[0].v.list, AF(1)))
/* cat and stack take every input of the row. */
static em_status t_cat(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    int k = 0;
    while (k < EM_CASE_MAX_IN && in[k]) k++;
    if (!(out[0] = em_cat(k, in, (int)AI(0)))) return em_last_status();
    *n = 1;
    return EM_OK;
}
static em_status t_stack(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    int k = 0;
    while (k < EM_CASE_MAX_IN && in[k]) k++;
    if (!(out[0] = em_stack(k, in, (int)AI(0)))) return em_last_status();
    *n = 1;
    return EM_OK;
}
static em_status t_split(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    return em_split(X0, AI(0), (int)AI(1), 16, out, n);
}
static em_status t_chunk(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    return em_chunk(X0, (int)AI(0), (int)AI(1), 16, out, n);
}
static em_status t_split_sizes(const em_tensor *const *in, const em_attr *a, em_tensor **out,
                               int *n) {
    *n = 0;
    em_status st = em_split_sizes(X0, a[0].n, a[0].v.list, (int)AI(1), out);
    if (st == EM_OK) *n = a[0].n;
    return st;
}

/* The fills write into a tensor built from the row's one input entry. */
static em_status t_fill(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    em_tensor *t = em_clone(X0);
    em_status st = t ? em_fill_(t, AF(0)) : em_last_status();
    if (st == EM_OK) out[0] = t, *n = 1;
    return st;
}
static em_status t_random(em_status (*fill)(em_tensor *, double, double, em_generator *),
                          const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    em_generator *g = em_generator_new(0);
    em_tensor *t = g ? em_clone(X0) : NULL;
    em_status st = t ? EM_OK : em_last_status();
    if (st == EM_OK) {
        em_generator_set_state(g, (em_rng_state){.seed = (uint64_t)AI(0), .offset = (uint64_t)AI(1)});
        st = fill(t, AF(2), AF(3), g);
    }
    em_generator_free(g);
    if (st == EM_OK) out[0] = t, *n = 1;
    return st;
}
static em_status bernoulli3(em_tensor *t, double p, double unused, em_generator *g) {
    (void)unused;
    return em_bernoulli_(t, p, g);
}
static em_status t_uniform(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    return t_random(em_uniform_, in, a, out, n);
}
static em_status t_normal(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    return t_random(em_normal_, in, a, out, n);
}
static em_status t_bernoulli(const em_tensor *const *in, const em_attr *a, em_tensor **out,
                             int *n) {
    return t_random(bernoulli3, in, a, out, n);
}
static em_status t_randperm(const em_tensor *const *in, const em_attr *a, em_tensor **out,
                            int *n) {
    *n = 0;
    em_generator *g = em_generator_new(0);
    if (!g) return em_last_status();
    em_generator_set_state(g, (em_rng_state){.seed = (uint64_t)AI(0), .offset = (uint64_t)AI(1)});
    out[0] = em_randperm(em_tensor_numel(X0), em_tensor_dtype(X0), em_cpu(), g);
    em_generator_free(g);
    if (!out[0]) return em_last_status();
    *n = 1;
    return EM_OK;
}
static em_status t_arange(const em_tensor *const *in, const em_attr *a, em_tensor **out, int *n) {
    *n = 0;
    if (!(out[0] = em_arange(AF(0), AF(2), AF(1), em_tensor_dtype(X0), em_cpu())))
        return em_last_status();
    *n = 1;
    return EM_OK;
}
static em_status t_linspace(const em_tensor *const *in, const em_attr *a, em_tensor **out,
                            int *n) {
    *n = 0;
    if (!(out[0] = em_linspace(AF(0), AF(1), em_tensor_numel(X0), em_tensor_dtype(X0),
                               em_cpu())))
        return em_last_status();
    *n = 1;
    return EM_OK;
}

/* ---- the table -------------------------------------------------------------------------- */

/* Inputs: I(ndim, layout, values, shape...); IX: an int64 index tensor with values below b;
 * IB: a bool tensor; IT: a tensor of a fixed dtype; NONE_IN: an absent optional input. */
#define I(nd, lay, val, ...)                                                                    \
    {.ndim = nd, .layout = EM_CASE_##lay, .values = EM_CASE_##val, .dtype = -1,                 \
     .shape = {__VA_ARGS__}}
#define IX(nd, b, ...)                                                                          \
    {.ndim = nd, .values = EM_CASE_INDEX, .dtype = EM_I64, .bound = b, .shape = {__VA_ARGS__}}
#define IB(nd, ...) {.ndim = nd, .values = EM_CASE_BOOLS, .dtype = EM_BOOL, .shape = {__VA_ARGS__}}
#define IT(dt, nd, val, ...)                                                                    \
    {.ndim = nd, .values = EM_CASE_##val, .dtype = dt, .shape = {__VA_ARGS__}}
#define NONE_IN {.absent = true}
/* Attributes. */
#define F(x) {.type = EM_ATTR_FLOAT, .v.f = (x)}
#define N(x) {.type = EM_ATTR_INT, .v.i = (x)}
#define B(x) {.type = EM_ATTR_BOOL, .v.b = (x)}
#define S(x) {.type = EM_ATTR_STRING, .v.s = (x)}
#define INTS(k, ...) {.type = EM_ATTR_INTS, .n = (k), .ints = {__VA_ARGS__}}
#define LIST(k, arr) {.type = EM_ATTR_INT_LIST, .n = (k), .v.list = (arr)}
#define NA {.type = EM_ATTR_NONE}
/* dtype sets */
#define D_F (EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64) | EM_CASE_DT(EM_F16) | EM_CASE_DT(EM_BF16))
#define D_F32_64 (EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64))
#define D_INT (EM_CASE_DT(EM_I32) | EM_CASE_DT(EM_I64) | EM_CASE_DT(EM_U8))
#define D_NUM (D_F | D_INT)
#define D_ALL (D_NUM | EM_CASE_DT(EM_BOOL))
#define D_I64 EM_CASE_DT(EM_I64)
#define D_BOOL EM_CASE_DT(EM_BOOL)

/* A row: op, variant, adapter, dtypes, expected status, differentiable, inputs, attributes. */
#define ROW(name, var, fn, dts, st, diff, nin, INS, ...)                                        \
    {.struct_size = sizeof(em_op_case), .op = name, .variant = var, .typed = fn,                \
     .dtypes = dts, .expect = st,                                                               \
     .differentiable = diff, .n_in = nin, .in = INS, .attrs = {__VA_ARGS__}}
/* A row whose strided layout runs another kernel (EM_CASE_LAYOUT_TOL). */
#define LROW(name, var, fn, dts, st, diff, nin, INS, ...)                                       \
    {.struct_size = sizeof(em_op_case), .op = name, .variant = var, .typed = fn,                \
     .dtypes = dts, .expect = st, .differentiable = diff, .n_in = nin, .in = INS,               \
     .attrs = {__VA_ARGS__}, .flags = EM_CASE_LAYOUT_TOL}
/* A row with inputs that get no gradient by definition (bit i: input i). */
#define ROWNG(mask, name, var, fn, dts, st, diff, nin, INS, ...)                                \
    {.struct_size = sizeof(em_op_case), .op = name, .variant = var, .typed = fn,                \
     .dtypes = dts, .expect = st,                                                               \
     .differentiable = diff, .n_in = nin, .in = INS, .attrs = {__VA_ARGS__}, .no_grad = mask}
/* A row of an op that draws from a generator (ember/opcase.h: EM_CASE_DRAWS). */
#define ROWD(name, var, fn, dts, st, diff, nin, INS, ...)                                       \
    {.struct_size = sizeof(em_op_case), .op = name, .variant = var, .typed = fn,                \
     .dtypes = dts, .expect = st, .flags = EM_CASE_DRAWS,                                       \
     .differentiable = diff, .n_in = nin, .in = INS, .attrs = {__VA_ARGS__}}
#define INS(...) {__VA_ARGS__}
#define OK EM_OK
#define EDT EM_ERR_DTYPE
#define EINV EM_ERR_INVALID
#define ESH EM_ERR_SHAPE
#define ERNG EM_ERR_RANGE
/* An offset without a seed marks a graph capture's relative draw (ember/random.h, "Graph
 * capture"); outside a capture every kernel refuses it (em_kernel_generator_state). By name
 * only: the typed functions draw from generators. */
#define ESTATE EM_ERR_STATE
#define NOSEED "offset without a seed, outside a graph capture"

static const int64_t pad_2d[4] = {1, 2, 0, 1}, pad_odd[3] = {1, 1, 1},
                     sizes_ok[3] = {1, 2, 1}, sizes_bad[2] = {1, 1},
                     sizes_many[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

/* Unary elementwise rows: contiguous, transposed, sliced, expanded, 0-dim, empty (contiguous
 * and transposed). The attributes, if any, follow the value kind. */
#define UNARY(name, fn, dts, diff, val, ...)                                                    \
    ROW(name, "contiguous", fn, dts, OK, diff, 1, INS(I(2, CONTIG, val, 3, 4)), __VA_ARGS__),   \
    ROW(name, "transposed", fn, dts, OK, diff, 1, INS(I(2, TRANSPOSED, val, 3, 4)), __VA_ARGS__), \
    ROW(name, "sliced", fn, dts, OK, diff, 1, INS(I(2, SLICED, val, 3, 4)), __VA_ARGS__),       \
    ROW(name, "expanded", fn, dts, OK, diff, 1, INS(I(2, EXPANDED, val, 3, 4)), __VA_ARGS__),   \
    ROW(name, "0-dim", fn, dts, OK, diff, 1, INS(I(0, CONTIG, val, 0)), __VA_ARGS__),           \
    ROW(name, "empty", fn, dts, OK, diff, 1, INS(I(2, CONTIG, val, 0, 4)), __VA_ARGS__),        \
    ROW(name, "empty, transposed", fn, dts, OK, diff, 1, INS(I(2, TRANSPOSED, val, 0, 4)),      \
        __VA_ARGS__)
/* Binary elementwise rows: same shape, broadcast, transposed, mixed dtypes, bad shapes, and
 * empty operands (with a broadcast operand, both empty, and a (0, 1) broadcast). */
#define BINARY(name, fn, dts, diff, val, ...)                                                   \
    ROW(name, "same shape", fn, dts, OK, diff, 2, INS(I(2, CONTIG, val, 3, 4), I(2, CONTIG, val, 3, 4)), \
        __VA_ARGS__),                                                                           \
    ROW(name, "broadcast", fn, dts, OK, diff, 2, INS(I(2, CONTIG, val, 3, 1), I(1, CONTIG, val, 4)), \
        __VA_ARGS__),                                                                           \
    ROW(name, "transposed and expanded", fn, dts, OK, diff, 2,                                  \
        INS(I(2, TRANSPOSED, val, 3, 4), I(2, EXPANDED, val, 3, 4)), __VA_ARGS__),              \
    ROW(name, "with a 0-dim", fn, dts, OK, diff, 2, INS(I(2, SLICED, val, 3, 4), I(0, CONTIG, val, 0)), \
        __VA_ARGS__),                                                                           \
    ROW(name, "empty", fn, dts, OK, diff, 2, INS(I(2, CONTIG, val, 0, 4), I(1, CONTIG, val, 4)), \
        __VA_ARGS__),                                                                           \
    ROW(name, "empty, both, one transposed", fn, dts, OK, diff, 2,                              \
        INS(I(2, CONTIG, val, 0, 4), I(2, TRANSPOSED, val, 0, 4)), __VA_ARGS__),                \
    ROW(name, "empty (0, 1) against (4)", fn, dts, OK, diff, 2,                                 \
        INS(I(1, CONTIG, val, 4), I(2, CONTIG, val, 0, 1)), __VA_ARGS__),                       \
    ROW(name, "mixed dtypes", fn, EM_CASE_DT(EM_F32), OK, diff, 2,                              \
        INS(I(2, CONTIG, val, 3, 4), IT(EM_I64, 2, POS, 3, 4)), __VA_ARGS__),                   \
    ROW(name, "shapes that do not broadcast", fn, dts, ESH, diff, 2,                            \
        INS(I(2, CONTIG, val, 3, 4), I(2, CONTIG, val, 2, 4)), __VA_ARGS__)
#define REDUCE(name, fn, dts, diff, val)                                                        \
    ROW(name, "dim 1", fn, dts, OK, diff, 1, INS(I(2, CONTIG, val, 3, 4)), INTS(1, 1), B(false)), \
    ROW(name, "dims -1 and 0, keepdim", fn, dts, OK, diff, 1, INS(I(3, TRANSPOSED, val, 2, 3, 4)), \
        INTS(2, -1, 0), B(true)),                                                               \
    ROW(name, "all dims", fn, dts, OK, diff, 1, INS(I(2, SLICED, val, 3, 4)), INTS(0), B(false)), \
    ROW(name, "0-dim", fn, dts, OK, diff, 1, INS(I(0, CONTIG, val, 0)), NA, B(false)),          \
    ROW(name, "dim out of range", fn, dts, ERNG, diff, 1, INS(I(2, CONTIG, val, 3, 4)),         \
        INTS(1, 2), B(false)),                                                                  \
    ROW(name, "a dim twice", fn, dts, EINV, diff, 1, INS(I(2, CONTIG, val, 3, 4)),              \
        INTS(2, 1, -1), B(false))

static const em_op_case std_cases[] = {
    /* ---- core elementwise (ops.c) ---- */
    ROW("copy", "transposed", t_copy, D_ALL, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4))),
    ROW("fill", "value", t_fill, D_ALL, OK, false, 0, INS(I(2, CONTIG, RANDN, 2, 3)), F(1.5)),
    BINARY("add", t_add, D_NUM, true, RANDN),
    BINARY("sub", t_sub, D_NUM, true, RANDN),
    BINARY("mul", t_mul, D_ALL, true, RANDN),
    BINARY("div", t_div, D_F, true, POS),
    ROW("div", "integers divide truly", t_div, D_INT, OK, true, 2,
        INS(I(2, CONTIG, POS, 3, 4), I(2, CONTIG, POS, 3, 4))),
    UNARY("neg", t_neg, D_F | EM_CASE_DT(EM_I32) | EM_CASE_DT(EM_I64), true, RANDN),
    ROW("neg", "bool", t_neg, D_BOOL, EDT, true, 1, INS(I(1, CONTIG, RANDN, 3))),
    UNARY("exp", t_exp, D_ALL, true, RANDN),
    UNARY("log", t_log, D_F | D_INT, true, POS),
    UNARY("relu", t_relu, D_F | EM_CASE_DT(EM_I32) | EM_CASE_DT(EM_I64), true, RANDN),
    ROW("relu_backward", "grad and output", NULL, D_F32_64, OK, false, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, POS, 3, 4))),
    REDUCE("sum", t_sum, D_ALL, true, RANDN),
    REDUCE("mean", t_mean, D_F, true, RANDN),
    ROW("mean", "integers", t_mean, D_INT, EDT, true, 1, INS(I(1, CONTIG, POS, 3)), NA, B(false)),
    ROW("index_select", "dim 1", t_index_select, D_ALL, OK, true, 2,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), IX(1, 4, 5)), N(1)),
    ROW("index_select", "dim -2, int32 index", t_index_select, D_F32_64, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), IT(EM_I32, 1, INDEX, 2)), N(-2)),
    ROW("index_select", "float index", t_index_select, D_F32_64, EDT, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(1, CONTIG, RANDN, 2)), N(0)),
    ROW("index_select", "0-dim input", t_index_select, D_F32_64, ESH, true, 2,
        INS(I(0, CONTIG, RANDN, 0), IX(1, 1, 1)), N(0)),
    ROW("arange", "0 to 5 by 0.5", t_arange, D_F32_64 | D_I64, OK, false, 0,
        INS(I(1, CONTIG, RANDN, 10)), F(0), F(0.5), F(5)),
    ROW("arange", "step 0", t_arange, D_F32_64, EINV, false, 0, INS(I(1, CONTIG, RANDN, 1)),
        F(0), F(0), F(5)),
    ROWD("uniform", "[-1, 2)", t_uniform, D_F, OK, false, 0, INS(I(2, CONTIG, RANDN, 3, 5)),
        N(7), N(3), F(-1), F(2)),
    ROW("uniform", NOSEED, NULL, D_F32_64, ESTATE, false, 0, INS(I(1, CONTIG, RANDN, 3)),
        NA, N(0), F(0), F(1)),
    ROW("uniform", "lo > hi", t_uniform, D_F32_64, EINV, false, 0, INS(I(1, CONTIG, RANDN, 3)),
        N(7), N(0), F(2), F(1)),
    ROW("uniform", "integer tensor", t_uniform, D_I64, EDT, false, 0,
        INS(I(1, CONTIG, RANDN, 3)), N(7), N(0), F(0), F(1)),
    ROWD("normal", "mean 1, std 2", t_normal, D_F, OK, false, 0, INS(I(2, CONTIG, RANDN, 3, 5)),
        N(9), N(1), F(1), F(2)),
    ROW("normal", NOSEED, NULL, D_F32_64, ESTATE, false, 0, INS(I(1, CONTIG, RANDN, 3)),
        NA, N(0), F(0), F(1)),
    ROW("normal", "negative std", t_normal, D_F32_64, EINV, false, 0,
        INS(I(1, CONTIG, RANDN, 3)), N(9), N(0), F(0), F(-1)),
    ROWD("bernoulli", "p 0.3", t_bernoulli, D_ALL, OK, false, 0, INS(I(1, CONTIG, RANDN, 17)),
        N(5), N(2), F(0.3), NA),
    ROW("bernoulli", NOSEED, NULL, D_F32_64, ESTATE, false, 0, INS(I(1, CONTIG, RANDN, 3)),
        NA, N(0), F(0.5), NA),
    ROW("bernoulli", "p 1.5", t_bernoulli, D_F32_64, EINV, false, 0,
        INS(I(1, CONTIG, RANDN, 3)), N(5), N(0), F(1.5), NA),
    ROW("randperm", "n 11", t_randperm, D_I64 | EM_CASE_DT(EM_I32), OK, false, 0,
        INS(I(1, CONTIG, RANDN, 11)), N(3), N(0)),
    ROW("randperm", "float dtype", t_randperm, D_F32_64, EDT, false, 0,
        INS(I(1, CONTIG, RANDN, 4)), N(3), N(0)),

    /* ---- elementwise math (ops_math.c) ---- */
    UNARY("abs", t_abs, D_NUM, true, RANDN),
    ROW("abs", "bool", t_abs, D_BOOL, EDT, true, 1, INS(I(1, CONTIG, RANDN, 3))),
    UNARY("sqrt", t_sqrt, D_ALL, true, POS),
    UNARY("rsqrt", t_rsqrt, D_F | D_INT, true, POS),
    UNARY("reciprocal", t_reciprocal, D_F | D_INT, true, POS),
    UNARY("sigmoid", t_sigmoid, D_ALL, true, RANDN),
    UNARY("tanh", t_tanh, D_ALL, true, RANDN),
    UNARY("log1p", t_log1p, D_ALL, true, POS),
    UNARY("expm1", t_expm1, D_ALL, true, RANDN),
    UNARY("sign", t_sign, D_ALL, true, RANDN),
    UNARY("erf", t_erf, D_ALL, true, RANDN),
    UNARY("erfinv", t_erfinv, D_F, true, PROB),
    ROW("erfinv", "integers (0 and 1)", t_erfinv, D_INT, OK, true, 1,
        INS(IT(EM_I64, 1, BOOLS, 6))),
    BINARY("div_mode", t_div_mode, D_F, true, POS),
    ROW("div_mode", "floor, negative operands", t_div_mode, D_NUM, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(1, CONTIG, POS, 4)), S("floor")),
    ROW("div_mode", "trunc, transposed and broadcast", t_div_mode, D_NUM, OK, true, 2,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), I(2, EXPANDED, POS, 3, 4)), S("trunc")),
    ROW("div_mode", "floor by zero (floats: inf and NaN)", t_div_mode, D_F, OK, true, 2,
        INS(I(1, CONTIG, RANDN, 4), IT(EM_F32, 0, RANDN, 0)), S("floor")),
    ROW("div_mode", "integer division by zero", t_div_mode, EM_CASE_DT(EM_I32) | D_I64, EINV,
        true, 2, INS(I(1, CONTIG, RANDN, 4), IT(EM_I64, 1, INDEX, 4)), S("trunc")),
    ROW("div_mode", "true division of integers", t_div_mode, D_INT, OK, true, 2,
        INS(I(1, CONTIG, RANDN, 4), I(1, CONTIG, POS, 4)), NA),
    ROW("div_mode", "bad rounding mode", t_div_mode, D_F32_64, EINV, true, 2,
        INS(I(1, CONTIG, RANDN, 4), I(1, CONTIG, POS, 4)), S("round")),
    ROW("div_mode", "two bools", t_div_mode, D_BOOL, EDT, true, 2,
        INS(I(1, CONTIG, RANDN, 4), I(1, CONTIG, RANDN, 4)), S("floor")),
    UNARY("silu", t_silu, D_F, true, RANDN),
    ROW("silu", "integers", t_silu, D_INT, EDT, true, 1, INS(I(1, CONTIG, RANDN, 3))),
    UNARY("gelu", t_gelu, D_F, true, RANDN, NA),
    UNARY("gelu", t_gelu, D_F, true, RANDN, S("tanh")),
    ROW("gelu", "bad approximate", t_gelu, D_F32_64, EINV, true, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), S("erf")),
    ROW("gelu", "integers", t_gelu, D_INT, EDT, true, 1, INS(I(1, CONTIG, RANDN, 3)), NA),
    UNARY("leaky_relu", t_leaky_relu, D_F, true, RANDN, F(0.1)),
    UNARY("clamp", t_clamp, D_NUM, true, RANDN, F(-1), F(1)),
    ROW("clamp", "min only, fractional (int64 becomes float32)", t_clamp, D_ALL, OK, true, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), F(1.5), NA),
    ROW("clamp", "max only, fractional, empty", t_clamp, D_ALL, OK, true, 1,
        INS(I(2, TRANSPOSED, RANDN, 0, 4)), NA, F(1.5)),
    ROW("clamp", "max only", t_clamp, D_NUM, OK, true, 1, INS(I(0, CONTIG, RANDN, 0)), NA, F(0)),
    ROW("clamp", "min > max", t_clamp, D_F32_64, OK, true, 1, INS(I(1, CONTIG, RANDN, 5)),
        F(2), F(1)),
    ROW("clamp", "NaN bound", t_clamp, D_F32_64, OK, true, 1, INS(I(1, CONTIG, RANDN, 5)),
        F(NAN), F(1)),
    ROW("clamp", "no bound", t_clamp, D_F32_64, EINV, true, 1, INS(I(1, CONTIG, RANDN, 5)), NA,
        NA),
    UNARY("add_scalar", t_add_scalar, D_ALL, true, RANDN, F(2.5)),
    UNARY("add_scalar", t_add_scalar, D_ALL, true, RANDN, F(3)),
    UNARY("sub_scalar", t_sub_scalar, D_NUM, true, RANDN, F(0.5)),
    UNARY("sub_scalar", t_sub_scalar, D_NUM, true, RANDN, F(3)),
    UNARY("mul_scalar", t_mul_scalar, D_ALL, true, RANDN, F(-2)),
    UNARY("div_scalar", t_div_scalar, D_ALL, true, RANDN, F(4)),
    ROW("div_scalar", "0", t_div_scalar, D_F32_64, OK, true, 1, INS(I(1, CONTIG, RANDN, 3)),
        F(0)),
    UNARY("pow_scalar", t_pow_scalar, D_NUM, true, RANDN, F(2)),
    UNARY("pow_scalar", t_pow_scalar, D_NUM, true, RANDN, F(3)),
    UNARY("pow_scalar", t_pow_scalar, D_F, true, POS, F(0.5)),
    UNARY("pow_scalar", t_pow_scalar, D_F, true, POS, F(2.5)),
    ROW("pow_scalar", "0", t_pow_scalar, D_NUM, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        F(0)),
    ROW("pow_scalar", "integer to -1", t_pow_scalar, D_INT, EINV, true, 1,
        INS(I(1, CONTIG, POS, 3)), F(-1)),
    BINARY("pow", t_pow, D_F32_64, true, POS),
    ROW("pow", "two bools", t_pow, D_BOOL, EDT, true, 2,
        INS(I(1, CONTIG, RANDN, 3), I(1, CONTIG, RANDN, 3))),
    BINARY("maximum", t_maximum, D_NUM, true, RANDN),
    BINARY("minimum", t_minimum, D_NUM, true, RANDN),
    BINARY("eq", t_eq, D_ALL, false, RANDN),
    BINARY("ne", t_ne, D_ALL, false, RANDN),
    BINARY("lt", t_lt, D_NUM, false, RANDN),
    BINARY("le", t_le, D_NUM, false, RANDN),
    BINARY("gt", t_gt, D_NUM, false, RANDN),
    BINARY("ge", t_ge, D_NUM, false, RANDN),
    BINARY("logical_and", t_logical_and, D_ALL, false, RANDN),
    BINARY("logical_or", t_logical_or, D_ALL, false, RANDN),
    BINARY("logical_xor", t_logical_xor, D_ALL, false, RANDN),
    UNARY("logical_not", t_logical_not, D_ALL, false, RANDN),
    ROW("where", "broadcast", t_where, D_ALL, OK, true, 3,
        INS(IB(2, 3, 4), I(2, TRANSPOSED, RANDN, 3, 4), I(1, CONTIG, RANDN, 4))),
    ROW("where", "mixed value dtypes", t_where, EM_CASE_DT(EM_F32), OK, true, 3,
        INS(IB(1, 4), I(1, CONTIG, RANDN, 4), IT(EM_F64, 0, RANDN, 0))),
    ROW("where", "float condition", t_where, D_F32_64, EDT, true, 3,
        INS(I(1, CONTIG, RANDN, 4), I(1, CONTIG, RANDN, 4), I(1, CONTIG, RANDN, 4))),
    BINARY("threshold_backward", t_threshold_backward, D_F, false, RANDN, F(0)),
    BINARY("sigmoid_backward", t_sigmoid_backward, D_F, false, PROB),
    BINARY("tanh_backward", t_tanh_backward, D_F, false, PROB),
    BINARY("gelu_backward", t_gelu_backward, D_F, false, RANDN, NA),
    BINARY("gelu_backward", t_gelu_backward, D_F, false, RANDN, S("tanh")),
    ROW("gelu_backward", "bad approximate", t_gelu_backward, D_F32_64, EINV, false, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)), S("x")),
    BINARY("silu_backward", t_silu_backward, D_F, false, RANDN),
    BINARY("leaky_relu_backward", t_leaky_relu_backward, D_F, false, RANDN, F(0.2)),

    /* ---- reductions (ops_reduce.c) ---- */
    REDUCE("amax", t_amax, D_ALL, true, RANDN),
    REDUCE("amin", t_amin, D_ALL, true, RANDN),
    ROW("amax", "empty dim", t_amax, D_F32_64, ESH, true, 1, INS(I(2, CONTIG, RANDN, 0, 4)),
        INTS(1, 0), B(false)),
    ROW("max", "all", t_max, D_ALL, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4))),
    ROW("max", "empty", t_max, D_F32_64, ESH, true, 1, INS(I(1, CONTIG, RANDN, 0))),
    ROW("min", "all", t_min, D_ALL, OK, true, 1, INS(I(2, SLICED, RANDN, 3, 4))),
    ROW("max_dim", "dim 1", t_max_dim, D_ALL, OK, true, 1, INS(I(2, CONTIG, RANDN, 3, 4)), N(1),
        B(false)),
    ROW("max_dim", "dim -2, keepdim", t_max_dim, D_F, OK, true, 1,
        INS(I(2, TRANSPOSED, RANDN, 3, 4)), N(-2), B(true)),
    ROW("max_dim", "dim out of range", t_max_dim, D_F32_64, ERNG, true, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), N(2), B(false)),
    ROW("min_dim", "dim 0", t_min_dim, D_NUM, OK, true, 1, INS(I(2, SLICED, RANDN, 3, 4)), N(0),
        B(true)),
    ROW("argmax", "flattened", t_argmax, D_NUM, OK, false, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        NA, B(false)),
    ROW("argmax", "dim 1, keepdim", t_argmax, D_NUM, OK, false, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), INTS(1, 1), B(true)),
    ROW("argmax", "bool", t_argmax, D_BOOL, EDT, false, 1, INS(I(1, CONTIG, RANDN, 3)), NA,
        B(false)),
    ROW("argmin", "dim 0", t_argmin, D_NUM, OK, false, 1, INS(I(2, CONTIG, RANDN, 3, 4)),
        INTS(1, 0), B(false)),
    ROW("var", "dim 1, correction 1", t_var, D_F, OK, true, 1, INS(I(2, CONTIG, RANDN, 3, 4)),
        INTS(1, 1), F(1), B(false)),
    ROW("var", "all, correction 0", t_var, D_F, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        INTS(0), F(0), B(true)),
    ROW("var", "negative correction", t_var, D_F32_64, EINV, true, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), INTS(0), F(-1), B(false)),
    ROW("var", "integers", t_var, D_INT, EDT, true, 1, INS(I(1, CONTIG, RANDN, 3)), INTS(0),
        F(1), B(false)),
    ROW("std", "dim 0", t_std, D_F, OK, true, 1, INS(I(2, SLICED, RANDN, 3, 4)), INTS(1, 0),
        F(1), B(false)),
    REDUCE("logsumexp", t_logsumexp, D_ALL, true, RANDN),
    ROW("norm", "p 2, dim 1", t_norm, D_F, OK, true, 1, INS(I(2, CONTIG, RANDN, 3, 4)),
        INTS(1, 1), F(2), B(false)),
    ROW("norm", "p inf, all", t_norm, D_F, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        INTS(0), F(INFINITY), B(true)),
    ROW("norm", "p NaN", t_norm, D_F32_64, EINV, true, 1, INS(I(1, CONTIG, RANDN, 3)), INTS(0),
        F(NAN), B(false)),
    REDUCE("prod", t_prod, D_ALL, true, RANDN),
    REDUCE("all", t_all, D_ALL, false, RANDN),
    REDUCE("any", t_any, D_ALL, false, RANDN),

    /* ---- nn (ops_nn.c) ---- */
    ROW("conv2d", "bias, stride 2, padding 1", t_conv2d, D_F, OK, true, 3,
        INS(I(4, CONTIG, RANDN, 2, 3, 7, 6), I(4, CONTIG, RANDN, 4, 3, 3, 3), I(1, CONTIG, RANDN, 4)),
        INTS(2, 2, 2), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    ROW("conv2d", "no bias, defaults, groups 2", t_conv2d, D_F32_64, OK, true, 3,
        INS(I(4, CONTIG, RANDN, 1, 4, 5, 5), I(4, CONTIG, RANDN, 2, 2, 3, 3), NONE_IN), NA, NA, NA,
        N(2)),
    ROW("conv2d", "channels mismatch", t_conv2d, D_F32_64, ESH, true, 3,
        INS(I(4, CONTIG, RANDN, 1, 3, 5, 5), I(4, CONTIG, RANDN, 2, 2, 3, 3), NONE_IN), NA, NA, NA,
        N(1)),
    ROW("conv2d_backward_data", "stride 1", t_conv2d_bwd_data, D_F32_64, OK, true, 2,
        INS(I(4, CONTIG, RANDN, 2, 4, 3, 3), I(4, CONTIG, RANDN, 4, 3, 3, 3)), INTS(2, 1, 1),
        INTS(2, 0, 0), INTS(2, 1, 1), N(1), INTS(2, 5, 5)),
    ROW("conv2d_backward_data", "stride 2, padding 1, groups 2", t_conv2d_bwd_data, D_F32_64, OK,
        true, 2, INS(I(4, CONTIG, RANDN, 1, 4, 3, 2), I(4, CONTIG, RANDN, 4, 1, 3, 3)),
        INTS(2, 2, 2), INTS(2, 1, 1), INTS(2, 1, 1), N(2), INTS(2, 6, 4)),
    ROW("conv2d_backward_data", "no input_size", t_conv2d_bwd_data, D_F32_64, EINV, true, 2,
        INS(I(4, CONTIG, RANDN, 2, 4, 3, 3), I(4, CONTIG, RANDN, 4, 3, 3, 3)), NA, NA, NA, N(1),
        NA),
    ROW("conv2d_backward_weight", "stride 1", t_conv2d_bwd_weight, D_F32_64, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 2, 3, 5, 5), I(4, CONTIG, RANDN, 2, 4, 3, 3)), INTS(2, 1, 1),
        INTS(2, 0, 0), INTS(2, 1, 1), N(1), INTS(2, 3, 3)),
    ROW("max_pool2d", "2x2", t_max_pool2d, D_F, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 2, 3, 6, 5)), INTS(2, 2, 2), NA, NA, NA, B(false)),
    ROW("max_pool2d", "3x3 stride 2 padding 1 ceil", t_max_pool2d, D_F32_64, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 7, 7)), INTS(2, 3, 3), INTS(2, 2, 2), INTS(2, 1, 1), NA,
        B(true)),
    ROW("max_pool2d", "no kernel_size", t_max_pool2d, D_F32_64, EINV, true, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 4, 4)), NA, NA, NA, NA, B(false)),
    ROW("max_pool2d_backward", "2x2", t_max_pool2d_bwd, D_F32_64, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 1, 2, 2, 2), IX(4, 16, 1, 2, 2, 2)), INTS(2, 4, 4)),
    ROW("avg_pool2d", "2x2", t_avg_pool2d, D_F, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 2, 3, 6, 6)), INTS(2, 2, 2), NA, NA, B(false), B(true)),
    ROW("avg_pool2d", "3x3 padding 1, excluding pad", t_avg_pool2d, D_F32_64, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 5, 5)), INTS(2, 3, 3), INTS(2, 1, 1), INTS(2, 1, 1),
        B(false), B(false)),
    ROW("avg_pool2d_backward", "2x2", t_avg_pool2d_bwd, D_F32_64, OK, false, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 2, 2)), INTS(2, 2, 2), NA, NA, B(false), B(true),
        INTS(2, 4, 4)),
    ROW("adaptive_avg_pool2d", "to 2x3", t_adaptive, D_F, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 5, 7)), INTS(2, 2, 3)),
    ROW("adaptive_avg_pool2d", "no size", t_adaptive, D_F32_64, EINV, true, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 5, 7)), NA),
    ROW("adaptive_avg_pool2d_backward", "from 2x3", t_adaptive_bwd, D_F32_64, OK, false, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 2, 3)), INTS(2, 5, 7)),
    ROW("batch_norm", "training, affine, running stats", t_batch_norm, D_F32_64, OK, true, 5,
        INS(I(4, CONTIG, RANDN, 2, 3, 4, 4), I(1, CONTIG, POS, 3), I(1, CONTIG, RANDN, 3),
            I(1, CONTIG, RANDN, 3), I(1, CONTIG, POS, 3)),
        B(true), F(0.1), F(1e-5)),
    ROW("batch_norm", "eval without affine", t_batch_norm, D_F, OK, true, 5,
        INS(I(2, CONTIG, RANDN, 4, 3), NONE_IN, NONE_IN, IT(EM_F32, 1, RANDN, 3),
            IT(EM_F32, 1, POS, 3)),
        B(false), F(0.1), F(1e-5)),
    ROW("batch_norm", "eval without running stats", t_batch_norm, D_F32_64, EINV, true, 5,
        INS(I(2, CONTIG, RANDN, 4, 3), NONE_IN, NONE_IN, NONE_IN, NONE_IN), B(false), F(0.1),
        F(1e-5)),
    ROW("batch_norm_backward", "training", t_batch_norm_bwd, D_F32_64, OK, false, 5,
        INS(I(2, CONTIG, RANDN, 4, 3), I(2, CONTIG, RANDN, 4, 3), I(1, CONTIG, POS, 3),
            I(1, CONTIG, RANDN, 3), I(1, CONTIG, POS, 3)),
        B(true)),
    ROW("layer_norm", "last dim, affine", t_layer_norm, D_F, OK, true, 3,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), I(1, CONTIG, POS, 4), I(1, CONTIG, RANDN, 4)), N(1),
        F(1e-5), INTS(1, 4)),
    ROW("layer_norm", "two dims, no affine", t_layer_norm, D_F32_64, OK, true, 3,
        INS(I(3, CONTIG, RANDN, 2, 3, 4), NONE_IN, NONE_IN), N(2), F(1e-5), INTS(2, 3, 4)),
    ROW("layer_norm", "shape not the last dims", t_layer_norm, D_F32_64, ESH, true, 3,
        INS(I(2, CONTIG, RANDN, 3, 4), NONE_IN, NONE_IN), N(1), F(1e-5), INTS(1, 3)),
    ROW("layer_norm_backward", "affine", t_layer_norm_bwd, D_F32_64, OK, false, 5,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 1),
            I(2, CONTIG, POS, 3, 1), I(1, CONTIG, POS, 4)),
        N(1)),
    ROW("layer_norm_backward", "two dims, no weight", t_layer_norm_bwd, D_F32_64, OK, false, 5,
        INS(I(3, CONTIG, RANDN, 2, 3, 4), I(3, CONTIG, RANDN, 2, 3, 4), I(3, CONTIG, RANDN, 2, 1, 1),
            I(3, CONTIG, POS, 2, 1, 1), NONE_IN),
        N(2)),
    ROWD("dropout", "p 0.3, training", t_dropout, D_F, OK, true, 1,
        INS(I(2, TRANSPOSED, RANDN, 5, 7)), F(0.3), B(true), N(11), N(4)),
    ROW("dropout", "eval", t_dropout, D_F32_64, OK, true, 1, INS(I(2, CONTIG, RANDN, 3, 4)),
        F(0.5), B(false), N(0), N(0)),
    ROW("dropout", "p 1", t_dropout, D_F32_64, OK, true, 1, INS(I(1, CONTIG, RANDN, 6)), F(1),
        B(true), N(0), N(0)),
    ROW("dropout", NOSEED, NULL, D_F32_64, ESTATE, true, 1, INS(I(1, CONTIG, RANDN, 6)),
        F(0.3), B(true), NA, N(0)),
    ROW("dropout", "p 1.5", t_dropout, D_F32_64, EINV, true, 1, INS(I(1, CONTIG, RANDN, 6)),
        F(1.5), B(true), N(0), N(0)),
    ROW("dropout", "integers", t_dropout, D_INT, EDT, true, 1, INS(I(1, CONTIG, RANDN, 6)),
        F(0.5), B(true), N(0), N(0)),
    ROW("softmax", "dim -1", t_softmax, D_F, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        N(-1)),
    ROW("softmax", "dim 0 of a 0-dim", t_softmax, D_F32_64, OK, true, 1,
        INS(I(0, CONTIG, RANDN, 0)), N(0)),
    ROW("softmax", "dim out of range", t_softmax, D_F32_64, ERNG, true, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), N(2)),
    ROW("softmax", "integers", t_softmax, D_INT, EDT, true, 1, INS(I(2, CONTIG, RANDN, 3, 4)),
        N(1)),
    ROW("log_softmax", "dim 1", t_log_softmax, D_F, OK, true, 1, INS(I(2, SLICED, RANDN, 3, 4)),
        N(1)),
    ROW("softmax_backward", "dim 1", t_softmax_bwd, D_F32_64, OK, false, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, PROB, 3, 4)), N(1)),
    ROW("log_softmax_backward", "dim 1", t_log_softmax_bwd, D_F32_64, OK, false, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)), N(1)),

    ROW("conv1d", "bias, stride 2, padding 1, dilation 2", t_conv1d, D_F, OK, true, 3,
        INS(I(3, CONTIG, RANDN, 2, 3, 9), I(3, CONTIG, RANDN, 4, 3, 3), I(1, CONTIG, RANDN, 4)),
        N(2), N(1), N(2), N(1)),
    /* the transposed (N, C, L) input is channels-last once unsqueezed: conv2d's nhwc kernel */
    LROW("conv1d", "no bias, groups 2, transposed input", t_conv1d, D_F32_64, OK, true, 3,
        INS(I(3, TRANSPOSED, RANDN, 1, 4, 6), I(3, CONTIG, RANDN, 2, 2, 3), NONE_IN), N(1), N(0),
        N(1), N(2)),
    ROW("conv1d", "channels mismatch", t_conv1d, D_F32_64, ESH, true, 3,
        INS(I(3, CONTIG, RANDN, 1, 3, 6), I(3, CONTIG, RANDN, 2, 2, 3), NONE_IN), N(1), N(0),
        N(1), N(1)),
    ROW("conv1d", "stride 0", t_conv1d, D_F32_64, EINV, true, 3,
        INS(I(3, CONTIG, RANDN, 1, 2, 6), I(3, CONTIG, RANDN, 2, 2, 3), NONE_IN), N(0), N(0),
        N(1), N(1)),
    ROW("conv_transpose2d", "bias, stride 2, padding 1, output_padding 1", t_conv_transpose2d,
        D_F, OK, true, 3,
        INS(I(4, CONTIG, RANDN, 2, 3, 4, 3), I(4, CONTIG, RANDN, 3, 2, 3, 3), I(1, CONTIG, RANDN, 2)),
        INTS(2, 2, 2), INTS(2, 1, 1), INTS(2, 1, 1), N(1), INTS(2, 1, 1)),
    ROW("conv_transpose2d", "no bias, groups 2, dilation 2", t_conv_transpose2d, D_F32_64, OK,
        true, 3, INS(I(4, CONTIG, RANDN, 1, 4, 3, 3), I(4, CONTIG, RANDN, 4, 1, 2, 2), NONE_IN),
        NA, NA, NA, N(2), INTS(2, 2, 2)),
    ROW("conv_transpose2d", "output_padding not below stride", t_conv_transpose2d, D_F32_64,
        EINV, true, 3, INS(I(4, CONTIG, RANDN, 1, 2, 3, 3), I(4, CONTIG, RANDN, 2, 2, 2, 2), NONE_IN),
        NA, NA, INTS(2, 1, 1), N(1), NA),
    ROW("conv_transpose2d", "channels mismatch", t_conv_transpose2d, D_F32_64, ESH, true, 3,
        INS(I(4, CONTIG, RANDN, 1, 3, 3, 3), I(4, CONTIG, RANDN, 2, 2, 2, 2), NONE_IN), NA, NA,
        NA, N(1), NA),
    ROW("group_norm", "affine, 2 groups", t_group_norm, D_F, OK, true, 3,
        INS(I(4, CONTIG, RANDN, 2, 4, 3, 2), I(1, CONTIG, POS, 4), I(1, CONTIG, RANDN, 4)), N(2),
        F(1e-5)),
    ROW("group_norm", "no affine, 3-D transposed, one group", t_group_norm, D_F32_64, OK, true, 3,
        INS(I(3, TRANSPOSED, RANDN, 2, 3, 5), NONE_IN, NONE_IN), N(1), F(1e-5)),
    ROW("group_norm", "groups do not divide channels", t_group_norm, D_F32_64, EINV, true, 3,
        INS(I(3, CONTIG, RANDN, 2, 4, 5), NONE_IN, NONE_IN), N(3), F(1e-5)),
    ROW("scaled_dot_product_attention", "4-D, no mask", t_sdpa, D_F, OK, true, 4,
        INS(I(4, CONTIG, RANDN, 2, 2, 5, 4), I(4, CONTIG, RANDN, 2, 2, 6, 4),
            I(4, CONTIG, RANDN, 2, 2, 6, 3), NONE_IN),
        F(0), B(false), NA, N(0), N(0)),
    ROW("scaled_dot_product_attention", "bool mask (L, S), causal, scale 0.7", t_sdpa, D_F32_64,
        OK, true, 4,
        INS(I(3, TRANSPOSED, RANDN, 2, 5, 4), I(3, CONTIG, RANDN, 2, 6, 4),
            I(3, CONTIG, RANDN, 2, 6, 3), IB(2, 5, 6)),
        F(0), B(true), F(0.7), N(0), N(0)),
    ROWNG(1u << 3, "scaled_dot_product_attention", "float mask broadcast over batch and heads",
        t_sdpa, D_F32_64, OK, true, 4,
        INS(I(4, CONTIG, RANDN, 1, 2, 3, 4), I(4, CONTIG, RANDN, 1, 2, 5, 4),
            I(4, SLICED, RANDN, 1, 2, 5, 2), I(3, CONTIG, RANDN, 1, 3, 5)),
        F(0), B(false), NA, N(0), N(0)),
    ROWD("scaled_dot_product_attention", "dropout 0.3", t_sdpa, D_F, OK, true, 4,
        INS(I(3, CONTIG, RANDN, 2, 4, 3), I(3, CONTIG, RANDN, 2, 5, 3),
            I(3, CONTIG, RANDN, 2, 5, 2), NONE_IN),
        F(0.3), B(false), NA, N(7), N(2)),
    ROW("scaled_dot_product_attention", "batch dims differ", t_sdpa, D_F32_64, ESH, true, 4,
        INS(I(3, CONTIG, RANDN, 2, 4, 3), I(3, CONTIG, RANDN, 1, 5, 3),
            I(3, CONTIG, RANDN, 1, 5, 2), NONE_IN),
        F(0), B(false), NA, N(0), N(0)),
    ROW("scaled_dot_product_attention", "mask does not broadcast", t_sdpa, D_F32_64, ESH, true, 4,
        INS(I(3, CONTIG, RANDN, 2, 4, 3), I(3, CONTIG, RANDN, 2, 5, 3),
            I(3, CONTIG, RANDN, 2, 5, 2), IB(2, 4, 4)),
        F(0), B(false), NA, N(0), N(0)),
    ROW("scaled_dot_product_attention", NOSEED, NULL, D_F32_64, ESTATE, true, 4,
        INS(I(3, CONTIG, RANDN, 2, 4, 3), I(3, CONTIG, RANDN, 2, 5, 3),
            I(3, CONTIG, RANDN, 2, 5, 2), NONE_IN),
        F(0.3), B(false), NA, NA, N(2)),
    ROW("scaled_dot_product_attention", "dropout_p 1.5", t_sdpa, D_F32_64, EINV, true, 4,
        INS(I(3, CONTIG, RANDN, 2, 4, 3), I(3, CONTIG, RANDN, 2, 5, 3),
            I(3, CONTIG, RANDN, 2, 5, 2), NONE_IN),
        F(1.5), B(false), NA, N(0), N(0)),
    ROW("scaled_dot_product_attention", "integers", t_sdpa, D_INT, EDT, true, 4,
        INS(I(3, CONTIG, RANDN, 2, 4, 3), I(3, CONTIG, RANDN, 2, 5, 3),
            I(3, CONTIG, RANDN, 2, 5, 2), NONE_IN),
        F(0), B(false), NA, N(0), N(0)),
    ROW("scaled_dot_product_attention_backward", "causal", t_sdpa_bwd, D_F32_64, OK, false, 6,
        INS(I(3, CONTIG, RANDN, 2, 5, 3), I(3, CONTIG, RANDN, 2, 5, 4), I(3, CONTIG, RANDN, 2, 6, 4),
            I(3, CONTIG, RANDN, 2, 6, 3), NONE_IN, I(2, CONTIG, POS, 2, 5)),
        F(0), B(true), NA, N(0), N(0)),
    ROW("scaled_dot_product_attention_backward", "dropout 0.3, float mask, scale 0.5",
        t_sdpa_bwd, D_F32_64, OK, false, 6,
        INS(I(3, CONTIG, RANDN, 2, 4, 2), I(3, CONTIG, RANDN, 2, 4, 3), I(3, CONTIG, RANDN, 2, 5, 3),
            I(3, CONTIG, RANDN, 2, 5, 2), I(3, CONTIG, RANDN, 1, 4, 5), I(2, CONTIG, POS, 2, 4)),
        F(0.3), B(false), F(0.5), N(7), N(2)),
    ROW("scaled_dot_product_attention_backward", "bool mask", t_sdpa_bwd, D_F32_64, OK, false, 6,
        INS(I(3, CONTIG, RANDN, 2, 5, 3), I(3, CONTIG, RANDN, 2, 5, 4), I(3, CONTIG, RANDN, 2, 6, 4),
            I(3, CONTIG, RANDN, 2, 6, 3), IB(3, 2, 5, 6), I(2, CONTIG, POS, 2, 5)),
        F(0), B(false), NA, N(0), N(0)),

    /* lstm/gru: T 4, N 3, I 2, H 3; weight (G H, I + H); lengths in [0, T]. */
    ROW("lstm", "states, bias, lengths", t_lstm, D_F, OK, true, 6,
        INS(I(3, CONTIG, RANDN, 4, 3, 2), I(2, CONTIG, RANDN, 3, 3), I(2, CONTIG, RANDN, 3, 3),
            I(2, CONTIG, RANDN, 12, 5), I(1, CONTIG, RANDN, 12), IX(1, 5, 3)),
        B(false)),
    ROW("lstm", "reverse, no states or bias, transposed weight", t_lstm, D_F32_64, OK, true, 6,
        INS(I(3, SLICED, RANDN, 4, 3, 2), NONE_IN, NONE_IN, I(2, TRANSPOSED, RANDN, 12, 5),
            NONE_IN, NONE_IN),
        B(true)),
    ROW("lstm", "weight does not fit the input", t_lstm, D_F32_64, ESH, true, 6,
        INS(I(3, CONTIG, RANDN, 4, 3, 2), NONE_IN, NONE_IN, I(2, CONTIG, RANDN, 12, 6), NONE_IN,
            NONE_IN),
        B(false)),
    ROW("lstm_backward", "reverse, lengths", t_lstm_bwd, D_F32_64, OK, false, 6,
        INS(I(3, CONTIG, RANDN, 4, 3, 3), I(2, CONTIG, RANDN, 3, 3), NONE_IN,
            I(2, CONTIG, RANDN, 12, 5), I(3, CONTIG, PROB, 4, 3, 18), IX(1, 5, 3)),
        B(true)),
    ROW("lstm_backward", "grad of the cell state only", t_lstm_bwd, D_F32_64, OK, false, 6,
        INS(NONE_IN, NONE_IN, I(2, CONTIG, RANDN, 3, 3), I(2, CONTIG, RANDN, 12, 5),
            I(3, CONTIG, PROB, 4, 3, 18), NONE_IN),
        B(false)),
    ROW("gru", "states, biases, lengths", t_gru, D_F, OK, true, 6,
        INS(I(3, CONTIG, RANDN, 4, 3, 2), I(2, CONTIG, RANDN, 3, 3), I(2, CONTIG, RANDN, 9, 5),
            I(1, CONTIG, RANDN, 9), I(1, CONTIG, RANDN, 9), IX(1, 5, 3)),
        B(false)),
    ROW("gru", "reverse, no state or biases, transposed weight", t_gru, D_F32_64, OK, true, 6,
        INS(I(3, TRANSPOSED, RANDN, 4, 3, 2), NONE_IN, I(2, TRANSPOSED, RANDN, 9, 5), NONE_IN,
            NONE_IN, NONE_IN),
        B(true)),
    ROW("gru", "lengths of floats", t_gru, D_F32_64, EDT, true, 6,
        INS(I(3, CONTIG, RANDN, 4, 3, 2), NONE_IN, I(2, CONTIG, RANDN, 9, 5), NONE_IN, NONE_IN,
            I(1, CONTIG, POS, 3)),
        B(false)),
    ROW("gru_backward", "no grad_hn", t_gru_bwd, D_F32_64, OK, false, 5,
        INS(I(3, CONTIG, RANDN, 4, 3, 3), NONE_IN, I(2, CONTIG, RANDN, 9, 5),
            I(3, CONTIG, PROB, 4, 3, 15), NONE_IN),
        B(false)),
    ROW("gru_backward", "reverse, grad_hn, lengths", t_gru_bwd, D_F32_64, OK, false, 5,
        INS(I(3, CONTIG, RANDN, 4, 3, 3), I(2, CONTIG, RANDN, 3, 3), I(2, CONTIG, RANDN, 9, 5),
            I(3, CONTIG, PROB, 4, 3, 15), IX(1, 5, 3)),
        B(true)),

    /* ---- losses (ops_loss.c) ---- */
    ROW("cross_entropy", "class indices, mean", t_cross_entropy, D_F, OK, true, 3,
        INS(I(2, CONTIG, RANDN, 4, 5), IX(1, 5, 4), NONE_IN), N(1), N(-100), F(0)),
    ROWNG(6, "cross_entropy", "weight, ignore_index, smoothing, none", t_cross_entropy, D_F32_64, OK,
        true, 3, INS(I(2, TRANSPOSED, RANDN, 4, 5), IX(1, 5, 4), I(1, CONTIG, POS, 5)), N(0),
        N(2), F(0.1)),
    ROWNG(6, "cross_entropy", "probabilities", t_cross_entropy, D_F32_64, OK, true, 3,
        INS(I(2, CONTIG, RANDN, 4, 5), I(2, CONTIG, PROB, 4, 5), NONE_IN), N(2), N(-100), F(0)),
    ROW("cross_entropy", "bad reduction", t_cross_entropy, D_F32_64, EINV, true, 3,
        INS(I(2, CONTIG, RANDN, 4, 5), IX(1, 5, 4), NONE_IN), N(7), N(-100), F(0)),
    ROW("cross_entropy", "batch mismatch", t_cross_entropy, D_F32_64, ESH, true, 3,
        INS(I(2, CONTIG, RANDN, 4, 5), IX(1, 5, 3), NONE_IN), N(1), N(-100), F(0)),
    ROW("cross_entropy_backward", "mean", t_cross_entropy_bwd, D_F32_64, OK, false, 4,
        INS(I(0, CONTIG, RANDN, 0), I(2, CONTIG, RANDN, 4, 5), IX(1, 5, 4), NONE_IN), N(1),
        N(-100), F(0)),
    ROWNG(4, "nll_loss", "sum, weight", t_nll_loss, D_F, OK, true, 3,
        INS(I(2, CONTIG, RANDN, 4, 5), IX(1, 5, 4), I(1, CONTIG, POS, 5)), N(2), N(-100)),
    ROW("nll_loss_backward", "none", t_nll_loss_bwd, D_F32_64, OK, false, 4,
        INS(I(1, CONTIG, RANDN, 4), I(2, CONTIG, RANDN, 4, 5), IX(1, 5, 4), NONE_IN), N(0),
        N(-100)),
    ROW("mse_loss", "broadcast target, mean", t_mse_loss, D_F, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(1, CONTIG, RANDN, 4)), N(1)),
    ROW("mse_loss", "none, transposed", t_mse_loss, D_F32_64, OK, true, 2,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)), N(0)),
    ROW("mse_loss", "integers", t_mse_loss, D_INT, EDT, true, 2,
        INS(I(1, CONTIG, RANDN, 4), I(1, CONTIG, RANDN, 4)), N(1)),
    ROW("mse_loss", "shapes that do not broadcast", t_mse_loss, D_F32_64, ESH, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 2), I(2, CONTIG, RANDN, 4, 3)), N(1)),
    ROW("mse_loss_backward", "mean", t_mse_loss_bwd, D_F32_64, OK, false, 3,
        INS(I(0, CONTIG, RANDN, 0), I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)), N(1)),
    ROW("l1_loss", "sum", t_l1_loss, D_F, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, SLICED, RANDN, 3, 4)), N(2)),
    ROW("l1_loss", "shapes that do not broadcast", t_l1_loss, D_F32_64, ESH, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 2), I(2, CONTIG, RANDN, 4, 3)), N(2)),
    ROW("l1_loss_backward", "sum", t_l1_loss_bwd, D_F32_64, OK, false, 3,
        INS(I(0, CONTIG, RANDN, 0), I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)), N(2)),
    ROW("smooth_l1_loss", "beta 0.5", t_smooth_l1_loss, D_F, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)), N(1), F(0.5)),
    ROW("smooth_l1_loss", "negative beta", t_smooth_l1_loss, D_F32_64, EINV, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)), N(1), F(-1)),
    ROW("smooth_l1_loss", "shapes that do not broadcast", t_smooth_l1_loss, D_F32_64, ESH, true,
        2, INS(I(2, CONTIG, RANDN, 3, 2), I(2, CONTIG, RANDN, 4, 3)), N(0), F(1)),
    ROW("smooth_l1_loss_backward", "beta 1", t_smooth_l1_loss_bwd, D_F32_64, OK, false, 3,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 3, 4)),
        N(0), F(1)),
    ROWNG(14, "binary_cross_entropy_with_logits", "weights, mean", t_bce, D_F, OK, true, 4,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, PROB, 3, 4), I(1, CONTIG, POS, 4),
            I(1, CONTIG, POS, 4)),
        N(1)),
    ROWNG(14, "binary_cross_entropy_with_logits", "no weights, none", t_bce, D_F32_64, OK, true, 4,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), I(2, CONTIG, PROB, 3, 4), NONE_IN, NONE_IN), N(0)),
    ROW("binary_cross_entropy_with_logits", "target shape", t_bce, D_F32_64, ESH, true, 4,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, PROB, 4, 3), NONE_IN, NONE_IN), N(1)),
    ROW("binary_cross_entropy_with_logits_backward", "mean", t_bce_bwd, D_F32_64, OK, false, 5,
        INS(I(0, CONTIG, RANDN, 0), I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, PROB, 3, 4),
            NONE_IN, I(1, CONTIG, POS, 4)),
        N(1)),

    /* ---- data movement (ops_data.c) ---- */
    ROW("gather", "dim 1", t_gather, D_ALL, OK, true, 2,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), IX(2, 4, 3, 2)), N(1)),
    ROW("gather", "dim -2, empty index", t_gather, D_F32_64, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), IX(2, 3, 0, 4)), N(-2)),
    ROW("gather", "index out of range", t_gather, D_F32_64, ERNG, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), IT(EM_I64, 2, ONES, 3, 2)), N(3)),
    ROW("scatter", "dim 0", t_scatter, D_ALL, OK, true, 3,
        INS(I(2, CONTIG, RANDN, 3, 4), IX(2, 3, 1, 4), I(2, CONTIG, RANDN, 1, 4)), N(0)),
    ROW("scatter_add", "dim 1", t_scatter_add, D_NUM, OK, true, 3,
        INS(I(2, CONTIG, RANDN, 3, 4), IX(2, 4, 3, 2), I(2, SLICED, RANDN, 3, 2)), N(1)),
    ROW("index_add", "dim 0, alpha 2", t_index_add, D_NUM, OK, true, 3,
        INS(I(2, CONTIG, RANDN, 3, 4), IX(1, 3, 2), I(2, CONTIG, RANDN, 2, 4)), N(0), F(2)),
    ROW("index_add", "source shape", t_index_add, D_F32_64, ESH, true, 3,
        INS(I(2, CONTIG, RANDN, 3, 4), IX(1, 3, 2), I(2, CONTIG, RANDN, 2, 3)), N(0), F(1)),
    ROW("embedding", "2-D indices", t_embedding, D_ALL, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 5, 3), IX(2, 5, 2, 3)), N(INT64_MIN)),
    ROWNG(1, "embedding", "padding_idx -1", t_embedding, D_F32_64, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 5, 3), IX(1, 5, 4)), N(-1)),
    ROW("embedding", "padding_idx out of range", t_embedding, D_F32_64, ERNG, true, 2,
        INS(I(2, CONTIG, RANDN, 5, 3), IX(1, 5, 4)), N(5)),
    ROW("embedding_backward", "padding 0", t_embedding_bwd, D_F32_64, OK, false, 2,
        INS(I(3, CONTIG, RANDN, 2, 3, 4), IX(2, 6, 2, 3)), N(6), N(0)),
    ROW("masked_fill", "broadcast mask", t_masked_fill, D_ALL, OK, true, 2,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), IB(1, 4)), F(-1)),
    ROW("masked_fill", "float mask", t_masked_fill, D_F32_64, EDT, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), I(1, CONTIG, RANDN, 4)), F(0)),
    ROW("masked_fill", "mask does not broadcast", t_masked_fill, D_F32_64, ESH, true, 2,
        INS(I(2, CONTIG, RANDN, 3, 2), IB(2, 4, 3)), F(0)),
    ROW("one_hot", "4 classes", t_one_hot, D_I64, OK, false, 1, INS(IX(2, 4, 2, 3)), N(4)),
    ROW("one_hot", "inferred", t_one_hot, D_I64, OK, false, 1, INS(IX(1, 6, 5)), N(-1)),
    ROW("one_hot", "float input", t_one_hot, D_F32_64, EDT, false, 1,
        INS(I(1, CONTIG, POS, 3)), N(3)),
    ROW("tril", "diagonal 0", t_tril, D_ALL, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        N(0)),
    ROW("tril", "1-D", t_tril, D_F32_64, ESH, true, 1, INS(I(1, CONTIG, RANDN, 3)), N(0)),
    ROW("triu", "diagonal -1, batched", t_triu, D_ALL, OK, true, 1,
        INS(I(3, SLICED, RANDN, 2, 3, 4)), N(-1)),
    ROW("flip", "dims 0 and -1", t_flip, D_ALL, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        INTS(2, 0, -1)),
    ROW("flip", "a dim twice", t_flip, D_F32_64, EINV, true, 1, INS(I(2, CONTIG, RANDN, 3, 4)),
        INTS(2, 1, 1)),
    ROW("linspace", "-1 to 1 in 7", t_linspace, D_F | D_I64, OK, false, 0,
        INS(I(1, CONTIG, RANDN, 7)), F(-1), F(1)),
    ROW("linspace", "bool", t_linspace, D_BOOL, EDT, false, 0, INS(I(1, CONTIG, RANDN, 3)),
        F(0), F(1)),
    ROW("cat", "three along dim 1", t_cat, D_ALL, OK, true, 3,
        INS(I(2, CONTIG, RANDN, 2, 3), I(2, TRANSPOSED, RANDN, 2, 1), I(2, SLICED, RANDN, 2, 2)),
        N(1)),
    ROW("cat", "empty 1-D skipped, dim -1", t_cat, D_F32_64, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 2, 3), I(1, CONTIG, RANDN, 0)), N(-1)),
    ROW("cat", "shapes differ", t_cat, D_F32_64, ESH, true, 2,
        INS(I(2, CONTIG, RANDN, 2, 3), I(2, CONTIG, RANDN, 3, 3)), N(1)),
    ROW("cat", "0-dim", t_cat, D_F32_64, ESH, true, 1, INS(I(0, CONTIG, RANDN, 0)), N(0)),
    ROW("stack", "two along dim 0", t_stack, D_ALL, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 2, 3), I(2, EXPANDED, RANDN, 2, 3)), N(0)),
    ROW("stack", "0-dims along -1", t_stack, D_F32_64, OK, true, 2,
        INS(I(0, CONTIG, RANDN, 0), I(0, CONTIG, RANDN, 0)), N(-1)),
    ROW("stack", "shapes differ", t_stack, D_F32_64, ESH, true, 2,
        INS(I(1, CONTIG, RANDN, 2), I(1, CONTIG, RANDN, 3)), N(0)),
    ROW("split", "size 2 of 5", t_split, D_ALL, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 5, 3)),
        N(2), N(0)),
    ROW("split", "size 0", t_split, D_F32_64, EINV, true, 1, INS(I(1, CONTIG, RANDN, 4)), N(0),
        N(0)),
    ROW("split", "more pieces than the 16 the caller has room for", t_split, D_F32_64, ERNG,
        true, 1, INS(I(1, CONTIG, RANDN, 20)), N(1), N(0)),
    ROW("split_sizes", "1, 2, 1", t_split_sizes, D_ALL, OK, true, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), LIST(3, sizes_ok), N(-1)),
    ROW("split_sizes", "ten pieces (more than EM_MAX_DIMS)", t_split_sizes, D_F32_64, OK, true,
        1, INS(I(1, CONTIG, RANDN, 10)), LIST(10, sizes_many), N(0)),
    ROW("split_sizes", "sizes do not sum", t_split_sizes, D_F32_64, ESH, true, 1,
        INS(I(2, CONTIG, RANDN, 3, 4)), LIST(2, sizes_bad), N(1)),
    ROW("chunk", "3 chunks of 7", t_chunk, D_ALL, OK, true, 1, INS(I(1, SLICED, RANDN, 7)),
        N(3), N(0)),
    ROW("chunk", "0 chunks", t_chunk, D_F32_64, EINV, true, 1, INS(I(1, CONTIG, RANDN, 7)),
        N(0), N(0)),
    ROW("pad", "last two dims", t_pad, D_ALL, OK, true, 1, INS(I(2, TRANSPOSED, RANDN, 3, 4)),
        LIST(4, pad_2d), F(0.5)),
    ROW("pad", "odd list", t_pad, D_F32_64, EINV, true, 1, INS(I(2, CONTIG, RANDN, 3, 4)),
        LIST(3, pad_odd), F(0)),

    /* ---- linear algebra (ops_linalg.c) ---- */
    ROW("bmm", "transposed", t_bmm, D_F, OK, true, 2,
        INS(I(3, TRANSPOSED, RANDN, 2, 3, 4), I(3, CONTIG, RANDN, 2, 4, 5))),
    ROW("bmm", "K differs", t_bmm, D_F32_64, ESH, true, 2,
        INS(I(3, CONTIG, RANDN, 2, 3, 4), I(3, CONTIG, RANDN, 2, 3, 5))),
    ROW("bmm", "integers", t_bmm, D_INT, EDT, true, 2,
        INS(I(3, CONTIG, RANDN, 2, 3, 4), I(3, CONTIG, RANDN, 2, 4, 5))),
    ROW("addmm", "broadcast bias, beta 0.5, alpha 2", t_addmm, D_F, OK, true, 3,
        INS(I(1, CONTIG, RANDN, 5), I(2, CONTIG, RANDN, 3, 4), I(2, TRANSPOSED, RANDN, 4, 5)),
        F(0.5), F(2)),
    ROW("addmm", "bias does not broadcast", t_addmm, D_F32_64, ESH, true, 3,
        INS(I(1, CONTIG, RANDN, 4), I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 4, 5)), F(1),
        F(1)),
    ROW("matmul", "2x2", t_matmul, D_F, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 2, 2), I(2, CONTIG, RANDN, 2, 2))),
    ROW("matmul", "batch broadcast", t_matmul, D_F32_64, OK, true, 2,
        INS(I(3, TRANSPOSED, RANDN, 2, 3, 4), I(2, CONTIG, RANDN, 4, 5))),
    ROW("matmul", "1-D times 2-D", t_matmul, D_F32_64, OK, true, 2,
        INS(I(1, SLICED, RANDN, 4), I(2, CONTIG, RANDN, 4, 3))),
    ROW("matmul", "dot product", t_matmul, D_F32_64, OK, true, 2,
        INS(I(1, CONTIG, RANDN, 4), I(1, CONTIG, RANDN, 4))),
    ROW("matmul", "empty K", t_matmul, D_F32_64, OK, true, 2,
        INS(I(2, CONTIG, RANDN, 2, 0), I(2, CONTIG, RANDN, 0, 3))),
    ROW("matmul", "K differs", t_matmul, D_F32_64, ESH, true, 2,
        INS(I(2, CONTIG, RANDN, 2, 3), I(2, CONTIG, RANDN, 2, 3))),
    ROW("matmul", "0-dim", t_matmul, D_F32_64, ESH, true, 2,
        INS(I(0, CONTIG, RANDN, 0), I(1, CONTIG, RANDN, 3))),
    ROW("matmul", "integers", t_matmul, D_INT, EDT, true, 2,
        INS(I(2, CONTIG, RANDN, 2, 2), I(2, CONTIG, RANDN, 2, 2))),
    ROW("linear", "bias, 3-D input", t_linear, D_F, OK, true, 3,
        INS(I(3, CONTIG, RANDN, 2, 3, 4), I(2, CONTIG, RANDN, 5, 4), I(1, CONTIG, RANDN, 5))),
    ROW("linear", "no bias", t_linear, D_F32_64, OK, true, 3,
        INS(I(2, TRANSPOSED, RANDN, 3, 4), I(2, CONTIG, RANDN, 5, 4), NONE_IN)),
    ROW("linear", "in_features differ", t_linear, D_F32_64, ESH, true, 3,
        INS(I(2, CONTIG, RANDN, 3, 4), I(2, CONTIG, RANDN, 5, 3), NONE_IN)),

    /* ---- list ops (ops_optim.c): by name only, one tensor per list ---- */
    ROW("fused_sgd", "momentum", NULL, D_F32_64, OK, false, 4,
        INS(I(1, CONTIG, RANDN, 5), I(1, CONTIG, RANDN, 5), I(1, CONTIG, RANDN, 5), NONE_IN),
        F(0.1), F(0.9), F(0), F(0), B(false), B(false), B(false)),
    ROW("fused_adam", "plain", NULL, D_F32_64, OK, false, 6,
        INS(I(1, CONTIG, RANDN, 5), I(1, CONTIG, RANDN, 5), I(1, CONTIG, RANDN, 5),
            I(1, CONTIG, POS, 5), NONE_IN, NONE_IN),
        F(1e-3), F(0.9), F(0.999), F(1e-8), F(0), F(1), B(false), B(false)),
    ROW("fused_adamw", "weight decay", NULL, D_F32_64, OK, false, 6,
        INS(I(1, CONTIG, RANDN, 5), I(1, CONTIG, RANDN, 5), I(1, CONTIG, RANDN, 5),
            I(1, CONTIG, POS, 5), NONE_IN, NONE_IN),
        F(1e-3), F(0.9), F(0.999), F(1e-8), F(0.01), F(1), B(false), B(false)),
    /* the capturable forms: the lr (and Adam's step count) are 0-dim float64 tensors */
    ROW("fused_sgd_capturable", "momentum", NULL, D_F32_64, OK, false, 5,
        INS(I(1, CONTIG, RANDN, 5), IT(EM_F64, 0, POS, 0), I(1, CONTIG, RANDN, 5),
            I(1, CONTIG, RANDN, 5), NONE_IN),
        F(0.9), F(0), F(0), B(false), B(false), B(false)),
    ROW("fused_adam_capturable", "plain", NULL, D_F32_64, OK, false, 6,
        INS(I(1, CONTIG, RANDN, 5), IT(EM_F64, 0, POS, 0), I(1, CONTIG, RANDN, 5),
            I(1, CONTIG, RANDN, 5), I(1, CONTIG, POS, 5), IT(EM_F64, 0, POS, 0)),
        F(0.9), F(0.999), F(1e-8), F(0), B(false)),
    ROW("fused_adamw_capturable", "weight decay", NULL, D_F32_64, OK, false, 6,
        INS(I(1, CONTIG, RANDN, 5), IT(EM_F64, 0, POS, 0), I(1, CONTIG, RANDN, 5),
            I(1, CONTIG, RANDN, 5), I(1, CONTIG, POS, 5), IT(EM_F64, 0, POS, 0)),
        F(0.9), F(0.999), F(1e-8), F(0.01), B(false)),
    ROW("fused_adam_capturable", "lr not 0-dim", NULL, D_F32_64, ESH, false, 6,
        INS(I(1, CONTIG, RANDN, 5), IT(EM_F64, 1, POS, 5), I(1, CONTIG, RANDN, 5),
            I(1, CONTIG, RANDN, 5), I(1, CONTIG, POS, 5), IT(EM_F64, 0, POS, 0)),
        F(0.9), F(0.999), F(1e-8), F(0), B(false)),
    /* the gradient scaler's check-and-unscale: the grads, then one 0-dim flag per grad */
    ROW("amp_unscale_", "scaled grads", NULL, D_F, OK, false, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), IT(EM_F32, 0, RANDN, 0)), F(1.0 / 1024)),
    ROW("amp_unscale_", "flags not 0-dim", NULL, D_F32_64, ESH, false, 2,
        INS(I(2, CONTIG, RANDN, 3, 4), IT(EM_F32, 2, RANDN, 3, 4)), F(0.5)),

    /* ---- nn: geometry rows (last, so that the rows above keep their index-derived seeds) ---- */
    /* Every geometry attribute away from its default at once (the CUDA backend's cuDNN plans
     * and direct kernels are checked against the CPU on these in eval and grad). */
    ROW("conv2d", "stride (2, 1), padding (1, 2), dilation 2, groups 2, bias", t_conv2d, D_F, OK,
        true, 3,
        INS(I(4, CONTIG, RANDN, 2, 4, 9, 8), I(4, CONTIG, RANDN, 6, 2, 3, 2), I(1, CONTIG, RANDN, 6)),
        INTS(2, 2, 1), INTS(2, 1, 2), INTS(2, 2, 2), N(2)),
    ROW("conv2d_backward_data", "stride 2, padding (0, 1), dilation 2, groups 3, floored size",
        t_conv2d_bwd_data, D_F, OK, true, 2,
        INS(I(4, CONTIG, RANDN, 2, 3, 2, 2), I(4, CONTIG, RANDN, 3, 1, 3, 3)), INTS(2, 2, 2),
        INTS(2, 0, 1), INTS(2, 2, 2), N(3), INTS(2, 8, 6)),
    ROW("conv2d_backward_weight", "stride 2, padding 1, dilation (1, 2), groups 2",
        t_conv2d_bwd_weight, D_F, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 2, 4, 6, 7), I(4, CONTIG, RANDN, 2, 4, 3, 3)), INTS(2, 2, 2),
        INTS(2, 1, 1), INTS(2, 1, 2), N(2), INTS(2, 3, 3)),
    ROW("max_pool2d", "3x2 stride (2, 1) padding 1 dilation 2 ceil", t_max_pool2d, D_F, OK, true,
        1, INS(I(4, CONTIG, RANDN, 2, 2, 10, 7)), INTS(2, 3, 2), INTS(2, 2, 1), INTS(2, 1, 1),
        INTS(2, 2, 2), B(true)),
    ROW("max_pool2d_backward", "repeated indices", t_max_pool2d_bwd, D_F, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 2, 3, 4, 4), IX(4, 36, 2, 3, 4, 4)), INTS(2, 6, 6)),
    ROW("avg_pool2d", "3x2 stride 2 padding 1 ceil, counting pad", t_avg_pool2d, D_F, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 2, 2, 8, 7)), INTS(2, 3, 2), INTS(2, 2, 2), INTS(2, 1, 1),
        B(true), B(true)),
    ROW("avg_pool2d_backward", "3x2 stride 2 padding 1 ceil, excluding pad", t_avg_pool2d_bwd,
        D_F, OK, false, 1, INS(I(4, CONTIG, RANDN, 2, 2, 5, 4)), INTS(2, 3, 2), INTS(2, 2, 2),
        INTS(2, 1, 1), B(true), B(false), INTS(2, 8, 7)),
    ROW("adaptive_avg_pool2d", "3x5 up to 4x7", t_adaptive, D_F, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 2, 2, 3, 5)), INTS(2, 4, 7)),
    ROW("adaptive_avg_pool2d_backward", "from 4x7 to 3x5", t_adaptive_bwd, D_F, OK, false, 1,
        INS(I(4, CONTIG, RANDN, 2, 2, 4, 7)), INTS(2, 3, 5)),
    ROW("batch_norm", "training NCHW, affine, running stats", t_batch_norm, D_F, OK, true, 5,
        INS(I(4, CONTIG, RANDN, 4, 3, 3, 5), I(1, CONTIG, POS, 3), I(1, CONTIG, RANDN, 3),
            IT(EM_F32, 1, RANDN, 3), IT(EM_F32, 1, POS, 3)),
        B(true), F(0.1), F(1e-5)),
    ROW("batch_norm_backward", "eval NCHW", t_batch_norm_bwd, D_F, OK, false, 5,
        INS(I(4, CONTIG, RANDN, 2, 3, 4, 4), I(4, CONTIG, RANDN, 2, 3, 4, 4), I(1, CONTIG, POS, 3),
            I(1, CONTIG, RANDN, 3), I(1, CONTIG, POS, 3)),
        B(false)),
    /* Channels-last activations (docs/performance.md): the convolutions run oneDNN's nhwc
     * kernels on them (another summation order: compared within the tolerance); ReLU and
     * the poolings give the bits of the contiguous call. At the end of the table, so the rows
     * above keep their indices (ember-opcheck seeds each row's inputs by it). */
    LROW("conv2d", "channels-last input, bias, padding 1", t_conv2d, D_F, OK, true, 3,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 3, 7, 6), I(4, CONTIG, RANDN, 4, 3, 3, 3),
            I(1, CONTIG, RANDN, 4)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    LROW("conv2d", "channels-last input, one channel", t_conv2d, D_F, OK, true, 3,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 1, 6, 6), I(4, CONTIG, RANDN, 8, 1, 3, 3), NONE_IN),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    LROW("conv2d_backward_data", "channels-last grad, padding 1", t_conv2d_bwd_data, D_F32_64,
        OK, true, 2, INS(I(4, CHANNELS_LAST, RANDN, 2, 16, 5, 5), I(4, CONTIG, RANDN, 16, 16, 3, 3)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1), INTS(2, 5, 5)),
    LROW("conv2d_backward_weight", "channels-last input and grad", t_conv2d_bwd_weight,
        D_F32_64, OK, false, 2,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 3, 5, 5), I(4, CHANNELS_LAST, RANDN, 2, 8, 5, 5)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1), INTS(2, 3, 3)),
    ROW("max_pool2d", "2x2, channels-last", t_max_pool2d, D_F, OK, true, 1,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 3, 6, 5)), INTS(2, 2, 2), NA, NA, NA, B(false)),
    ROW("max_pool2d", "3x3 stride 2 padding 1 ceil, channels-last", t_max_pool2d, D_F32_64, OK,
        true, 1, INS(I(4, CHANNELS_LAST, RANDN, 1, 2, 7, 7)), INTS(2, 3, 3), INTS(2, 2, 2),
        INTS(2, 1, 1), NA, B(true)),
    ROW("max_pool2d_backward", "2x2, channels-last", t_max_pool2d_bwd, D_F32_64, OK, false, 2,
        INS(I(4, CHANNELS_LAST, RANDN, 1, 2, 2, 2),
            {.ndim = 4, .layout = EM_CASE_CHANNELS_LAST, .values = EM_CASE_INDEX, .dtype = EM_I64,
             .bound = 16, .shape = {1, 2, 2, 2}}),
        INTS(2, 4, 4)),
    ROW("relu", "channels-last", t_relu, D_F, OK, true, 1, INS(I(4, CHANNELS_LAST, RANDN, 2, 3, 4, 5))),
    ROW("relu_backward", "channels-last grad and output", NULL, D_F32_64, OK, false, 2,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 3, 4, 5), I(4, CHANNELS_LAST, RANDN, 2, 3, 4, 5))),
    /* gx takes the indices' layout (the schema's layout_arg); the grad, row-major as a
     * flatten's backward gives it, is read in place */
    ROW("max_pool2d_backward", "2x2, row-major grad, channels-last indices", t_max_pool2d_bwd,
        D_F32_64, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 2, 3, 2, 2),
            {.ndim = 4, .layout = EM_CASE_CHANNELS_LAST, .values = EM_CASE_INDEX, .dtype = EM_I64,
             .bound = 16, .shape = {2, 3, 2, 2}}),
        INTS(2, 4, 4)),
    /* conv2d_relu (the fused op, docs/performance.md "Design: fused ops"): conv2d's layouts
     * and geometries; its CPU kernel (conv2d's oneDNN primitive, then relu in place) is checked against the
     * composite path below it, conv2d then relu. Random normal inputs keep the outputs away
     * from the kink at 0 for the finite differences. */
    ROW("conv2d_relu", "bias, stride 2, padding 1", t_conv2d_relu, D_F, OK, true, 3,
        INS(I(4, CONTIG, RANDN, 2, 3, 7, 6), I(4, CONTIG, RANDN, 4, 3, 3, 3), I(1, CONTIG, RANDN, 4)),
        INTS(2, 2, 2), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    ROW("conv2d_relu", "no bias, defaults, groups 2", t_conv2d_relu, D_F, OK, true, 3,
        INS(I(4, CONTIG, RANDN, 1, 4, 5, 5), I(4, CONTIG, RANDN, 2, 2, 3, 3), NONE_IN), NA, NA, NA,
        N(2)),
    ROW("conv2d_relu", "stride (2, 1), padding (1, 2), dilation 2, groups 2, bias",
        t_conv2d_relu, D_F, OK, true, 3,
        INS(I(4, CONTIG, RANDN, 2, 4, 9, 8), I(4, CONTIG, RANDN, 6, 2, 3, 2), I(1, CONTIG, RANDN, 6)),
        INTS(2, 2, 1), INTS(2, 1, 2), INTS(2, 2, 2), N(2)),
    ROW("conv2d_relu", "channels mismatch", t_conv2d_relu, D_F32_64, ESH, true, 3,
        INS(I(4, CONTIG, RANDN, 1, 3, 5, 5), I(4, CONTIG, RANDN, 2, 2, 3, 3), NONE_IN), NA, NA, NA,
        N(1)),
    LROW("conv2d_relu", "channels-last input, bias, padding 1", t_conv2d_relu, D_F, OK, true, 3,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 3, 7, 6), I(4, CONTIG, RANDN, 4, 3, 3, 3),
            I(1, CONTIG, RANDN, 4)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    LROW("conv2d_relu", "channels-last input, one channel", t_conv2d_relu, D_F, OK, true, 3,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 1, 6, 6), I(4, CONTIG, RANDN, 8, 1, 3, 3), NONE_IN),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    /* Activations in the nChw16c storage layout (ember/tensor.h, em_layout; docs/
     * performance.md, "Design (a)"): on the CPU the f32 convolutions read and write it through
     * oneDNN (another kernel: within the tolerance), ReLU and the max poolings give the bits of
     * the plain call; every other kernel gets the inputs converted to plain. */
    ROW("relu", "nchw16c", t_relu, D_F, OK, true, 1, INS(I(4, BLOCKED, RANDN, 2, 16, 3, 5))),
    ROW("relu_backward", "nchw16c grad and output", NULL, D_F32_64, OK, false, 2,
        INS(I(4, BLOCKED, RANDN, 2, 32, 3, 2), I(4, BLOCKED, RANDN, 2, 32, 3, 2))),
    ROW("relu_backward", "row-major grad, nchw16c output", NULL, D_F32_64, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 1, 16, 3, 3), I(4, BLOCKED, RANDN, 1, 16, 3, 3))),
    ROW("max_pool2d", "2x2, nchw16c", t_max_pool2d, D_F, OK, true, 1,
        INS(I(4, BLOCKED, RANDN, 2, 16, 6, 5)), INTS(2, 2, 2), NA, NA, NA, B(false)),
    ROW("max_pool2d", "3x3 stride 2 padding 1 ceil, nchw16c", t_max_pool2d, D_F32_64, OK, true,
        1, INS(I(4, BLOCKED, RANDN, 1, 32, 7, 7)), INTS(2, 3, 3), INTS(2, 2, 2), INTS(2, 1, 1),
        NA, B(true)),
    ROW("max_pool2d_backward", "2x2, nchw16c grad and indices", t_max_pool2d_bwd, D_F32_64, OK,
        false, 2,
        INS(I(4, BLOCKED, RANDN, 1, 16, 2, 2),
            {.ndim = 4, .layout = EM_CASE_BLOCKED, .values = EM_CASE_INDEX, .dtype = EM_I64,
             .bound = 16, .shape = {1, 16, 2, 2}}),
        INTS(2, 4, 4)),
    ROW("max_pool2d_backward", "2x2, row-major grad, nchw16c indices", t_max_pool2d_bwd,
        D_F32_64, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 2, 16, 2, 2),
            {.ndim = 4, .layout = EM_CASE_BLOCKED, .values = EM_CASE_INDEX, .dtype = EM_I64,
             .bound = 16, .shape = {2, 16, 2, 2}}),
        INTS(2, 4, 4)),
    LROW("conv2d", "nchw16c input, bias, padding 1", t_conv2d, D_F, OK, true, 3,
        INS(I(4, BLOCKED, RANDN, 2, 16, 7, 6), I(4, CONTIG, RANDN, 16, 16, 3, 3),
            I(1, CONTIG, RANDN, 16)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    LROW("conv2d", "nchw16c input, stride 2, to 32 channels", t_conv2d, D_F, OK, true, 3,
        INS(I(4, BLOCKED, RANDN, 1, 16, 8, 8), I(4, CONTIG, RANDN, 32, 16, 3, 3), NONE_IN),
        INTS(2, 2, 2), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    LROW("conv2d_relu", "nchw16c input, bias, padding 1", t_conv2d_relu, D_F, OK, true, 3,
        INS(I(4, BLOCKED, RANDN, 2, 16, 7, 6), I(4, CONTIG, RANDN, 16, 16, 3, 3),
            I(1, CONTIG, RANDN, 16)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1)),
    LROW("conv2d_backward_data", "nchw16c grad, padding 1", t_conv2d_bwd_data, D_F32_64, OK,
        true, 2, INS(I(4, BLOCKED, RANDN, 2, 16, 5, 5), I(4, CONTIG, RANDN, 16, 16, 3, 3)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1), INTS(2, 5, 5)),
    LROW("conv2d_backward_weight", "nchw16c input and grad", t_conv2d_bwd_weight, D_F32_64, OK,
        false, 2, INS(I(4, BLOCKED, RANDN, 2, 16, 5, 5), I(4, BLOCKED, RANDN, 2, 16, 5, 5)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1), INTS(2, 3, 3)),
    LROW("conv2d_backward_weight", "one-channel input, nchw16c grad", t_conv2d_bwd_weight,
        D_F32_64, OK, false, 2,
        INS(I(4, CONTIG, RANDN, 2, 1, 6, 6), I(4, BLOCKED, RANDN, 2, 16, 6, 6)),
        INTS(2, 1, 1), INTS(2, 1, 1), INTS(2, 1, 1), N(1), INTS(2, 3, 3)),
    /* max_pool2d_relu (the second fused op, max_pool2d of relu): max_pool2d's geometries and
     * layouts. Random normal inputs leave about one 2x2 window in 16 all negative (+0 at its
     * first position, grad 0; finite differences agree while no input lies within a step of
     * the kink at 0); the CPU kernel (max_pool2d's loops with relu on the fly) is checked
     * against the composite below it, relu then max_pool2d, bit for bit. */
    ROW("max_pool2d_relu", "2x2", t_max_pool2d_relu, D_F, OK, true, 1,
        INS(I(4, CONTIG, RANDN, 2, 3, 6, 5)), INTS(2, 2, 2), NA, NA, NA, B(false)),
    ROW("max_pool2d_relu", "3x3 stride 2 padding 1 ceil", t_max_pool2d_relu, D_F32_64, OK, true,
        1, INS(I(4, CONTIG, RANDN, 1, 2, 7, 7)), INTS(2, 3, 3), INTS(2, 2, 2), INTS(2, 1, 1), NA,
        B(true)),
    ROW("max_pool2d_relu", "no kernel_size", t_max_pool2d_relu, D_F32_64, EINV, true, 1,
        INS(I(4, CONTIG, RANDN, 1, 2, 4, 4)), NA, NA, NA, NA, B(false)),
    ROW("max_pool2d_relu", "2x2, channels-last", t_max_pool2d_relu, D_F, OK, true, 1,
        INS(I(4, CHANNELS_LAST, RANDN, 2, 3, 6, 5)), INTS(2, 2, 2), NA, NA, NA, B(false)),
    ROW("max_pool2d_relu", "3x3 stride 2 padding 1 ceil, channels-last", t_max_pool2d_relu,
        D_F32_64, OK, true, 1, INS(I(4, CHANNELS_LAST, RANDN, 1, 2, 7, 7)), INTS(2, 3, 3),
        INTS(2, 2, 2), INTS(2, 1, 1), NA, B(true)),
    ROW("max_pool2d_relu", "2x2, nchw16c", t_max_pool2d_relu, D_F, OK, true, 1,
        INS(I(4, BLOCKED, RANDN, 2, 16, 6, 5)), INTS(2, 2, 2), NA, NA, NA, B(false)),
    ROW("max_pool2d_relu", "3x3 stride 2 padding 1 ceil, nchw16c", t_max_pool2d_relu, D_F32_64,
        OK, true, 1, INS(I(4, BLOCKED, RANDN, 1, 32, 7, 7)), INTS(2, 3, 3), INTS(2, 2, 2),
        INTS(2, 1, 1), NA, B(true)),
};

const em_op_case *em__op_cases_standard(size_t *n) {
    *n = sizeof std_cases / sizeof std_cases[0];
    return std_cases;
}

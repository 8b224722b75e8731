/* Derivatives of the op families (math, nn, data): every differentiable op against central
 * finite differences in f64 (em_gradcheck), on non-contiguous and broadcast inputs where the op
 * allows and away from kinks; for ops whose f32 kernel differs from the f64 one (the
 * vectorised math loops, the oneDNN nn primitives), the f32 backward against the f64 backward
 * on the same inputs (allclose, rtol 1e-4, atol 1e-5); the non-differentiable ops record no
 * history. */
#include "common.h"
#include "op_cases.h"

TestSuite(derivs, .init = em_test_setup, .fini = em_test_teardown);

/* ---- helpers --------------------------------------------------------------------------------- */

/* A leaf of f64 values in [lo, hi) (a fixed LCG stream per seed), negated at every third
 * element when `alternate` (so |x| stays in [lo, hi): away from a kink at 0). */
static em_tensor *leaf(int ndim, const int64_t *shape, uint64_t seed, double lo, double hi,
                       bool alternate) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(s >> 11) / 9007199254740992.0;
        v[i] = (lo + (hi - lo) * u) * (alternate && i % 3 == 1 ? -1 : 1);
    }
    em_tensor *t = em_test_tensor(EM_F64, ndim, shape, v);
    free(v);
    cr_assert_eq(em_requires_grad_(t, true), EM_OK, "%s", em_last_error());
    return t;
}

/* A leaf of the given literal values (f64), requiring grad. */
static em_tensor *leaf_of(int ndim, const int64_t *shape, const double *v) {
    em_tensor *t = em_test_tensor(EM_F64, ndim, shape, v);
    cr_assert_eq(em_requires_grad_(t, true), EM_OK, "%s", em_last_error());
    return t;
}

static void release_all(int n, em_tensor *const *ts) {
    for (int i = 0; i < n; i++) em_tensor_release(ts[i]);
}

/* em_gradcheck with the default tolerances, failing the test with its message. */
#define GRADCHECK(fn, n, in, user)                                                                \
    cr_assert_eq(em_gradcheck(fn, n, in, user, 0, 0, 0), EM_OK, "%s: %s", #fn, em_last_error())

/* The gradients of sum(v * fn(inputs)) for the inputs that require grad, with every floating
 * input converted to dt (the others pass as they are) and v a fixed direction; grads[i] gets
 * the grad of input i as a new f64 tensor (NULL for inputs that do not require grad). */
static void grads_at(em_dtype dt, em_gradcheck_fn fn, int n, em_tensor *const *in64, void *user,
                     em_tensor **grads) {
    em_tensor *in[8], *wrt[8], *g[8] = {0};
    int idx[8], nw = 0;
    cr_assert_eq(em_scope_begin(), EM_OK);
    for (int i = 0; i < n; i++) {
        grads[i] = NULL;
        in[i] = in64[i];
        if (!em_dtype_is_floating(em_tensor_dtype(in64[i]))) continue;
        in[i] = em_detach(em_to_dtype(in64[i], dt));
        if (em_tensor_requires_grad(in64[i])) {
            cr_assert_eq(em_requires_grad_(in[i], true), EM_OK, "%s", em_last_error());
            idx[nw] = i;
            wrt[nw++] = in[i];
        }
    }
    em_tensor *y = fn(in, n, user);
    cr_assert_not_null(y, "%s", em_last_error());
    em_tensor *v = em_empty(em_tensor_ndim(y), em_tensor_shape(y), EM_F64, em_cpu());
    em_generator *gen = em_generator_new(99);
    cr_assert_eq(em_uniform_(v, -1, 1, gen), EM_OK);
    em_generator_free(gen);
    em_tensor *p = em_sum(em_mul(y, em_to_dtype(v, em_tensor_dtype(y))), 0, NULL, false);
    cr_assert_eq(em_grad(1, &p, NULL, nw, wrt, g, NULL), EM_OK, "%s", em_last_error());
    for (int k = 0; k < nw; k++) { /* NULL: the output does not depend on the input */
        if (!g[k]) continue;
        cr_assert_eq(em_tensor_dtype(g[k]), dt);
        grads[idx[k]] = em_keep(em_to_dtype(g[k], EM_F64));
    }
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* The f32 backward agrees with the f64 backward on the same inputs. */
static void f32_matches_f64(const char *name, em_gradcheck_fn fn, int n, em_tensor *const *in,
                            void *user) {
    em_tensor *g32[8], *g64[8];
    grads_at(EM_F32, fn, n, in, user, g32);
    grads_at(EM_F64, fn, n, in, user, g64);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(!g32[i], !g64[i], "%s: input %d has a grad in one dtype only", name, i);
        if (!g64[i]) continue;
        for (int64_t e = 0; e < em_tensor_numel(g64[i]); e++) {
            double x = em_test_at(g32[i], e), r = em_test_at(g64[i], e);
            cr_assert(fabs(x - r) <= 1e-5 + 1e-4 * fabs(r),
                      "%s: input %d, element %lld: f32 %.8g vs f64 %.8g", name, i, (long long)e,
                      x, r);
        }
        em_tensor_release(g32[i]);
        em_tensor_release(g64[i]);
    }
}

#define BOTH(fn, n, in, user)                                                                     \
    do {                                                                                          \
        GRADCHECK(fn, n, in, user);                                                               \
        f32_matches_f64(#fn, fn, n, in, user);                                                    \
    } while (0)

/* ---- math: unary ----------------------------------------------------------------------------- */

/* Every valid differentiable row of the op-case table (tests/op_cases.h) that lists float32
 * and float64 and has no expanded input: the f32 backward against the f64 backward on the
 * same inputs (test_op_schema gradchecks the f64 one against finite differences). The rows
 * bring the layouts (transposed, sliced, 0-dim, broadcast) and the attribute variants. */
static void table_grads(const em_op_case *c, int r, em_dtype dt, em_tensor **grads, int *n) {
    em_case_grad g = {.struct_size = sizeof g};
    em_tensor *vary[EM_CASE_MAX_IN], *gr[EM_CASE_MAX_IN] = {0};
    *n = em_case_grad_setup(c, dt, (uint64_t)r, &g, vary);
    em_tensor *y = *n ? em_case_grad_fn(vary, *n, &g) : NULL;
    if (!y || em_tensor_numel(y) == 0 || !isfinite(em_item(y))) {
        *n = 0;
        em_clear_error();
        return;
    }
    cr_assert_eq(em_grad(1, &y, NULL, *n, vary, gr, NULL), EM_OK, "%s (%s): %s", c->op,
                 c->variant, em_last_error());
    for (int k = 0; k < *n; k++) grads[k] = gr[k] ? em_to_dtype(gr[k], EM_F64) : NULL;
}

Test(derivs, f32_backward_matches_f64_over_the_op_case_table) {
    int checked = 0;
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
        const em_op_case *c = em_op_case_get(r);
        unsigned both = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64);
        if (!c->typed || !c->differentiable || c->expect != EM_OK || (c->dtypes & both) != both)
            continue;
        bool expanded = false;
        for (int i = 0; i < c->n_in; i++) expanded |= c->in[i].layout == EM_CASE_EXPANDED;
        if (expanded) continue;
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *g32[EM_CASE_MAX_IN], *g64[EM_CASE_MAX_IN];
        int n32, n64;
        table_grads(c, r, EM_F32, g32, &n32);
        table_grads(c, r, EM_F64, g64, &n64);
        cr_assert_eq(n32, n64, "row %d, %s (%s): %d inputs vary in f32, %d in f64", r, c->op,
                     c->variant, n32, n64);
        double scale = c->tol_scale > 0 ? c->tol_scale : 1;
        for (int i = 0; i < n64; i++) {
            cr_assert_eq(!g32[i], !g64[i], "row %d, %s (%s): input %d has a grad in one dtype "
                         "only", r, c->op, c->variant, i);
            for (int64_t e = 0; g64[i] && e < em_tensor_numel(g64[i]); e++) {
                double x = em_test_at(g32[i], e), w = em_test_at(g64[i], e);
                cr_assert(fabs(x - w) <= scale * (1e-5 + 1e-4 * fabs(w)),
                          "row %d, %s (%s): grad of input %d, element %lld: f32 %.8g vs f64 "
                          "%.8g", r, c->op, c->variant, i, (long long)e, x, w);
            }
        }
        checked += n64 > 0;
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    cr_expect_gt(checked, 100, "only %d rows", checked);
}

Test(derivs, sign_gives_a_zero_gradient) {
    em_tensor *x = leaf(1, (int64_t[]){4}, 1, 0.5, 1, true);
    em_scope_begin();
    cr_assert_eq(em_backward(em_sum(em_sign(x), 0, NULL, false)), EM_OK, "%s", em_last_error());
    for (int i = 0; i < 4; i++) cr_assert_eq(em_test_at(em_tensor_grad(x), i), 0.0);
    em_scope_end();
    em_tensor_release(x);
}

/* ---- math: binary, clamp, where -------------------------------------------------------------- */

static em_tensor *f_pow(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* (3, 1) ^ (4): broadcast */
    return em_pow(in[0], in[1]);
}
static em_tensor *f_maximum(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_maximum(in[0], em_transpose(in[1], 0, 1));
}
static em_tensor *f_minimum(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_minimum(in[0], em_transpose(in[1], 0, 1));
}
static em_tensor *f_maximum_bc(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_maximum(in[0], in[1]);
}
static em_tensor *f_minimum_bc(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_minimum(in[0], in[1]);
}

Test(derivs, pow_of_both_inputs_with_broadcasting) {
    em_tensor *a = leaf(2, (int64_t[]){3, 1}, 1, 0.5, 2, false);
    em_tensor *b = leaf(1, (int64_t[]){4}, 2, -1.5, 1.5, false);
    em_tensor *in[2] = {a, b};
    BOTH(f_pow, 2, in, NULL);
    release_all(2, in);
}

Test(derivs, pow_at_a_zero_base_gives_zero_exponent_grad) {
    /* PyTorch: d(0^b)/db = 0 for b >= 0 (not 0 * log 0 = NaN); d(a^0)/da = 0. */
    em_tensor *a = leaf_of(1, (int64_t[]){3}, (double[]){0, 0, 2});
    em_tensor *b = leaf_of(1, (int64_t[]){3}, (double[]){2, 0, 0});
    em_scope_begin();
    cr_assert_eq(em_backward(em_sum(em_pow(a, b), 0, NULL, false)), EM_OK, "%s", em_last_error());
    double ga[3] = {0, 0, 0}, gb[3] = {0, 0, log(2)};
    for (int i = 0; i < 3; i++) {
        cr_assert_float_eq(em_test_at(em_tensor_grad(a), i), ga[i], 1e-12, "da[%d]", i);
        cr_assert_float_eq(em_test_at(em_tensor_grad(b), i), gb[i], 1e-12, "db[%d]", i);
    }
    em_scope_end();
    em_tensor_release(a);
    em_tensor_release(b);
}

Test(derivs, maximum_and_minimum_strided_broadcast_and_ties) {
    em_tensor *a = leaf(2, (int64_t[]){3, 4}, 3, -2, 2, false);
    em_tensor *b = leaf(2, (int64_t[]){4, 3}, 4, -2, 2, false);
    em_tensor *in[2] = {a, b};
    BOTH(f_maximum, 2, in, NULL);
    BOTH(f_minimum, 2, in, NULL);
    em_tensor *c = leaf(2, (int64_t[]){3, 1}, 5, -2, 2, false);
    em_tensor *d = leaf(1, (int64_t[]){4}, 6, -2, 2, false);
    em_tensor *bc[2] = {c, d};
    BOTH(f_maximum_bc, 2, bc, NULL);
    BOTH(f_minimum_bc, 2, bc, NULL);
    /* Ties: the grad is split equally (the central difference sees the same 1/2). */
    em_tensor *e = leaf_of(1, (int64_t[]){3}, (double[]){1, -2, 3});
    em_tensor *f = leaf_of(1, (int64_t[]){3}, (double[]){1, -2, 3});
    em_tensor *tie[2] = {e, f};
    GRADCHECK(f_maximum_bc, 2, tie, NULL);
    GRADCHECK(f_minimum_bc, 2, tie, NULL);
    em_scope_begin();
    cr_assert_eq(em_backward(em_sum(em_maximum(e, f), 0, NULL, false)), EM_OK);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(em_test_at(em_tensor_grad(e), i), 0.5);
        cr_assert_eq(em_test_at(em_tensor_grad(f), i), 0.5);
    }
    em_scope_end();
    release_all(2, in);
    release_all(2, bc);
    release_all(2, tie);
}

/* clamp bounds at +-0.5; the inputs are k/10 + 0.05, never within 0.05 of a bound. */
static em_tensor *f_clamp(em_tensor *const *in, int n, void *user) {
    (void)n;
    int which = *(const int *)user;
    double lo = -0.5, hi = 0.5;
    em_tensor *x = em_transpose(in[0], 0, 1);
    return em_clamp(x, which != 2 ? &lo : NULL, which != 1 ? &hi : NULL);
}

static em_tensor *grid_leaf(void) {
    double v[12];
    for (int i = 0; i < 12; i++) v[i] = -1.15 + 0.2 * ((i * 5) % 12); /* -1.15 .. 1.05 */
    return leaf_of(2, (int64_t[]){3, 4}, v);
}

Test(derivs, clamp_passes_the_grad_inside_the_bounds) {
    em_tensor *x = grid_leaf();
    for (int which = 0; which < 3; which++) { /* both bounds, min only, max only */
        GRADCHECK(f_clamp, 1, &x, &which);
        f32_matches_f64("clamp", f_clamp, 1, &x, &which);
    }
    em_tensor_release(x);
}

static em_tensor *f_where(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* cond (3, 4), a (3, 1), b (4) */
    return em_where(in[2], in[0], in[1]);
}

Test(derivs, where_routes_the_grad_by_the_condition) {
    em_tensor *a = leaf(2, (int64_t[]){3, 1}, 7, -2, 2, false);
    em_tensor *b = leaf(1, (int64_t[]){4}, 8, -2, 2, false);
    double cv[12];
    for (int i = 0; i < 12; i++) cv[i] = (i * 7) % 3 == 0;
    em_tensor *cd = em_test_tensor(EM_F64, 2, (int64_t[]){3, 4}, cv);
    em_scope_begin();
    em_tensor *cond = em_keep(em_to_dtype(cd, EM_BOOL));
    em_scope_end();
    em_tensor *in[3] = {a, b, cond};
    BOTH(f_where, 3, in, NULL);
    release_all(3, in);
    em_tensor_release(cd);
}

/* In place variants record the same ops: clamp_, leaky_relu_ (they save their input, copied
 * before it is overwritten) and then tanh_ (it saves its output) on a non-leaf. */
static em_tensor *f_inplace(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    double lo = -0.5;
    em_tensor *h = em_mul_scalar(in[0], 1);
    cr_assert_eq(em_clamp_(h, &lo, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_leaky_relu_(h, 0.1), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tanh_(h), EM_OK, "%s", em_last_error());
    return h;
}

Test(derivs, in_place_math_is_differentiable) {
    em_tensor *x = grid_leaf();
    GRADCHECK(f_inplace, 1, &x, NULL);
    em_tensor_release(x);
}

Test(derivs, comparisons_and_logical_ops_record_no_history) {
    em_tensor *a = leaf(1, (int64_t[]){3}, 10, -1, 1, false);
    em_tensor *b = leaf(1, (int64_t[]){3}, 11, -1, 1, false);
    em_scope_begin();
    em_tensor *r[] = {em_eq(a, b), em_ne(a, b), em_lt(a, b), em_le(a, b), em_gt(a, b),
                      em_ge(a, b), em_logical_and(a, b), em_logical_or(a, b),
                      em_logical_xor(a, b), em_logical_not(a),
                      em_sigmoid_backward(a, b), em_tanh_backward(a, b),
                      em_gelu_backward(a, b, NULL), em_silu_backward(a, b),
                      em_leaky_relu_backward(a, b, 0.1), em_threshold_backward(a, b, 0)};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        cr_assert_not_null(r[i], "%zu: %s", i, em_last_error());
        cr_assert(!em_tensor_requires_grad(r[i]), "op %zu recorded history", i);
    }
    em_scope_end();
    em_tensor_release(a);
    em_tensor_release(b);
}

/* ---- nn -------------------------------------------------------------------------------------- */

/* A (N, C, H, W) strided input: the leaf is (N, H, W, C), permuted. */
static em_tensor *nchw(em_tensor *leaf_nhwc) {
    return em_permute(leaf_nhwc, 4, (int[]){0, 3, 1, 2});
}

typedef struct conv_case {
    int64_t stride[2], padding[2], dilation[2], groups;
    bool bias;
} conv_case;

static em_tensor *f_conv2d(em_tensor *const *in, int n, void *user) {
    (void)n;
    const conv_case *cc = user;
    return em_conv2d(nchw(in[0]), in[1], cc->bias ? in[2] : NULL, cc->stride, cc->padding,
                     cc->dilation, cc->groups);
}

Test(derivs, conv2d_input_weight_and_bias) {
    em_tensor *x = leaf(4, (int64_t[]){2, 5, 6, 4}, 20, -1, 1, false);  /* (2, 4, 5, 6) */
    em_tensor *w = leaf(4, (int64_t[]){6, 2, 3, 3}, 21, -1, 1, false);
    em_tensor *w1 = leaf(4, (int64_t[]){3, 4, 3, 3}, 22, -1, 1, false);
    em_tensor *b = leaf(1, (int64_t[]){6}, 23, -1, 1, false);
    em_tensor *b1 = leaf(1, (int64_t[]){3}, 24, -1, 1, false);
    /* Grouped, strided, padded, dilated, with bias; plain (oneDNN's f32 path) with and
     * without bias. */
    conv_case grouped = {{2, 1}, {1, 2}, {1, 2}, 2, true},
              plain = {{1, 1}, {1, 1}, {1, 1}, 1, true},
              nobias = {{1, 1}, {0, 0}, {1, 1}, 1, false};
    em_tensor *in_g[3] = {x, w, b}, *in_p[3] = {x, w1, b1};
    BOTH(f_conv2d, 3, in_g, &grouped);
    BOTH(f_conv2d, 3, in_p, &plain);
    BOTH(f_conv2d, 3, in_p, &nobias);
    em_tensor *all[] = {x, w, w1, b, b1};
    release_all(5, all);
}

typedef struct pool_case {
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    bool ceil_mode, count_include_pad;
} pool_case;

static em_tensor *f_max_pool2d(em_tensor *const *in, int n, void *user) {
    (void)n;
    const pool_case *p = user;
    em_tensor *y = NULL, *idx = NULL;
    cr_assert_eq(em_max_pool2d(nchw(in[0]), p->kernel, p->stride, p->padding, p->dilation,
                               p->ceil_mode, &y, &idx), EM_OK, "%s", em_last_error());
    return y;
}
static em_tensor *f_avg_pool2d(em_tensor *const *in, int n, void *user) {
    (void)n;
    const pool_case *p = user;
    return em_avg_pool2d(nchw(in[0]), p->kernel, p->stride, p->padding, p->ceil_mode,
                         p->count_include_pad);
}
static em_tensor *f_adaptive_avg_pool2d(em_tensor *const *in, int n, void *user) {
    (void)n;
    return em_adaptive_avg_pool2d(nchw(in[0]), user);
}

Test(derivs, pooling) {
    em_tensor *x = leaf(4, (int64_t[]){2, 7, 6, 3}, 25, -1, 1, false); /* (2, 3, 7, 6) */
    pool_case a = {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, true},
              b = {{2, 3}, {2, 1}, {1, 0}, {2, 1}, true, false},
              c = {{3, 2}, {3, 2}, {1, 1}, {1, 1}, true, false};
    BOTH(f_max_pool2d, 1, &x, &a);
    BOTH(f_max_pool2d, 1, &x, &b);
    BOTH(f_avg_pool2d, 1, &x, &a);
    BOTH(f_avg_pool2d, 1, &x, &c);
    int64_t o1[2] = {3, 4}, o2[2] = {4, 3};
    BOTH(f_adaptive_avg_pool2d, 1, &x, o1);
    BOTH(f_adaptive_avg_pool2d, 1, &x, o2);
    em_tensor_release(x);
}

typedef struct bn_case {
    bool training, weight, bias, running;
    bool four_d;
} bn_case;

/* in: x (4, 2, 2, 3) or (5, 3), weight (3), bias (3), running_mean (3), running_var (3). */
static em_tensor *f_batch_norm(em_tensor *const *in, int n, void *user) {
    (void)n;
    const bn_case *b = user;
    /* The running stats are updated in training: start each call from the same values. */
    em_tensor *rm = b->running ? em_clone(in[3]) : NULL, *rv = b->running ? em_clone(in[4]) : NULL;
    em_tensor *x = b->four_d ? nchw(in[0]) : in[0], *y = NULL;
    cr_assert_eq(em_batch_norm(x, b->weight ? in[1] : NULL, b->bias ? in[2] : NULL, rm, rv,
                               b->training, 0.1, 1e-5, &y, NULL, NULL), EM_OK, "%s",
                 em_last_error());
    return y;
}

Test(derivs, batch_norm_training_and_evaluation) {
    em_tensor *x4 = leaf(4, (int64_t[]){4, 2, 2, 3}, 26, -1, 1, false);
    em_tensor *x2 = leaf(2, (int64_t[]){5, 3}, 27, -1, 1, false);
    em_tensor *w = leaf(1, (int64_t[]){3}, 28, 0.5, 1.5, false);
    em_tensor *b = leaf(1, (int64_t[]){3}, 29, -1, 1, false);
    em_tensor *rm = leaf(1, (int64_t[]){3}, 30, -0.5, 0.5, false);
    em_tensor *rv = leaf(1, (int64_t[]){3}, 31, 0.5, 2, false);
    em_requires_grad_(rm, false);
    em_requires_grad_(rv, false);
    bn_case cases[] = {
        {true, true, true, true, true},    {true, false, false, false, true},
        {true, true, false, false, false}, {false, true, true, true, true},
        {false, false, true, true, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        em_tensor *in[5] = {cases[k].four_d ? x4 : x2, w, b, rm, rv};
        cr_assert_eq(em_gradcheck(f_batch_norm, 5, in, &cases[k], 0, 0, 0), EM_OK, "case %zu: %s",
                     k, em_last_error());
        f32_matches_f64("batch_norm", f_batch_norm, 5, in, &cases[k]);
    }
    em_tensor *all[] = {x4, x2, w, b, rm, rv};
    release_all(6, all);
}

/* in: x (2, 4, 3) transposed to (2, 3, 4), weight (3, 4), bias (3, 4); normalized over the
 * last two dims. user: whether weight and bias are passed. */
static em_tensor *f_layer_norm(em_tensor *const *in, int n, void *user) {
    (void)n;
    bool affine = *(const bool *)user;
    em_tensor *y = NULL;
    cr_assert_eq(em_layer_norm(em_transpose(in[0], 1, 2), 2, (int64_t[]){3, 4},
                               affine ? in[1] : NULL, affine ? in[2] : NULL, 1e-5, &y, NULL,
                               NULL), EM_OK, "%s", em_last_error());
    return y;
}

Test(derivs, layer_norm_with_and_without_affine_params) {
    em_tensor *x = leaf(3, (int64_t[]){2, 4, 3}, 32, -1, 1, false);
    em_tensor *w = leaf(2, (int64_t[]){3, 4}, 33, 0.5, 1.5, false);
    em_tensor *b = leaf(2, (int64_t[]){3, 4}, 34, -1, 1, false);
    em_tensor *in[3] = {x, w, b};
    bool affine = true, plain = false;
    BOTH(f_layer_norm, 3, in, &affine);
    BOTH(f_layer_norm, 3, in, &plain);
    release_all(3, in);
}

static em_tensor *f_softmax(em_tensor *const *in, int n, void *user) {
    (void)n;
    return em_softmax(em_transpose(in[0], 0, 2), *(const int *)user);
}
static em_tensor *f_log_softmax(em_tensor *const *in, int n, void *user) {
    (void)n;
    return em_log_softmax(em_transpose(in[0], 0, 2), *(const int *)user);
}

Test(derivs, softmax_and_log_softmax) {
    em_tensor *x = leaf(3, (int64_t[]){5, 4, 3}, 35, -2, 2, false);
    for (int dim = -1; dim < 3; dim++) {
        BOTH(f_softmax, 1, &x, &dim);
        BOTH(f_log_softmax, 1, &x, &dim);
    }
    em_tensor_release(x);
}

Test(derivs, nn_auxiliary_outputs_carry_no_gradient) {
    em_tensor *x = leaf(4, (int64_t[]){1, 2, 4, 4}, 36, -1, 1, false);
    em_scope_begin();
    em_tensor *y, *idx, *mean, *rstd;
    cr_assert_eq(em_max_pool2d(x, (int64_t[]){2, 2}, NULL, NULL, NULL, false, &y, &idx), EM_OK);
    /* The helpers are not differentiable. */
    em_tensor *gx = em_max_pool2d_backward(y, idx, (int64_t[]){4, 4});
    cr_assert_not_null(gx, "%s", em_last_error());
    cr_assert(!em_tensor_requires_grad(gx), "max_pool2d_backward recorded history");
    /* A statistic of layer_norm used downstream: refused, not silently zero. */
    cr_assert_eq(em_layer_norm(x, 2, (int64_t[]){4, 4}, NULL, NULL, 1e-5, &y, &mean, &rstd),
                 EM_OK);
    cr_assert_eq(em_backward(em_sum(em_mul(y, rstd), 0, NULL, false)), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "layer_norm: gradients through its output 2");
    em_scope_end();
    em_tensor_release(x);
}

/* ---- data movement --------------------------------------------------------------------------- */

/* An int64 tensor of literal values. */
static em_tensor *ints(int ndim, const int64_t *shape, const double *v) {
    return em_test_tensor(EM_I64, ndim, shape, v);
}

/* cat of a transposed (2, 3) view, an expanded (stride 0) (2, 3) view and a plain (1, 3)
 * input (not requiring grad) along dim 0; and along dim 1. */
static em_tensor *f_cat(em_tensor *const *in, int n, void *user) {
    (void)n;
    int dim = *(const int *)user;
    em_tensor *a = em_transpose(in[0], 0, 1), *b = em_expand(in[1], 2, (int64_t[]){2, 3});
    if (dim == 0) return em_cat(3, (const em_tensor *[]){a, b, in[2]}, 0);
    return em_cat(2, (const em_tensor *[]){em_mul(a, a), b}, 1);
}
static em_tensor *f_stack(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    em_tensor *a = em_transpose(in[0], 0, 1), *b = em_expand(in[1], 2, (int64_t[]){2, 3});
    return em_stack(2, (const em_tensor *[]){em_mul(a, b), a}, 1);
}

Test(derivs, cat_and_stack) {
    em_tensor *x = leaf(2, (int64_t[]){3, 2}, 40, -1, 1, false);
    em_tensor *y = leaf(2, (int64_t[]){1, 3}, 41, -1, 1, false);
    em_tensor *z = leaf(2, (int64_t[]){1, 3}, 42, -1, 1, false);
    em_requires_grad_(z, false);
    em_tensor *in[3] = {x, y, z};
    int d0 = 0, d1 = 1;
    GRADCHECK(f_cat, 3, in, &d0);
    GRADCHECK(f_cat, 3, in, &d1);
    GRADCHECK(f_stack, 2, in, NULL);
    /* The recorded path gives the same values as the plain one, signed zeros included. */
    em_tensor *s = leaf_of(1, (int64_t[]){2}, (double[]){-0.0, 1});
    em_scope_begin();
    em_tensor *c = em_cat(2, (const em_tensor *[]){s, s}, 0);
    cr_assert(em_tensor_requires_grad(c));
    cr_assert(signbit(em_test_at(c, 0)) && signbit(em_test_at(c, 2)), "-0.0 kept");
    em_scope_end();
    em_tensor_release(s);
    release_all(3, in);
}

static em_tensor *f_pad(em_tensor *const *in, int n, void *user) {
    (void)n;
    const int64_t *pad = user; /* 4 entries: last dim (left, right), then dim 0 */
    return em_pad(em_transpose(in[0], 0, 1), 4, pad, 0.5);
}

Test(derivs, pad_grows_and_crops) {
    em_tensor *x = leaf(2, (int64_t[]){4, 3}, 43, -1, 1, false); /* transposed: (3, 4) */
    int64_t grow[4] = {1, 2, 2, 0}, mixed[4] = {-1, 2, 1, -1}, crop[4] = {0, -1, -1, 0};
    GRADCHECK(f_pad, 1, &x, grow);
    GRADCHECK(f_pad, 1, &x, mixed);
    GRADCHECK(f_pad, 1, &x, crop);
    em_tensor_release(x);
}

static em_tensor *f_split(em_tensor *const *in, int n, void *user) {
    (void)n;
    bool use_chunk = *(const bool *)user;
    em_tensor *p[4];
    int np = 0;
    em_tensor *x = em_transpose(in[0], 0, 1); /* (5, 3) */
    if (use_chunk) cr_assert_eq(em_chunk(x, 3, 0, 4, p, &np), EM_OK, "%s", em_last_error());
    else cr_assert_eq(em_split(x, 2, 0, 4, p, &np), EM_OK, "%s", em_last_error());
    cr_assert_eq(np, 3);
    /* Each piece transformed differently, so a mixed-up grad shows. */
    return em_cat(3, (const em_tensor *[]){em_mul_scalar(p[0], 2), em_mul(p[1], p[1]), p[2]}, 0);
}

Test(derivs, split_and_chunk) {
    em_tensor *x = leaf(2, (int64_t[]){3, 5}, 44, -1, 1, false);
    bool chunk = true, split = false;
    GRADCHECK(f_split, 1, &x, &split);
    GRADCHECK(f_split, 1, &x, &chunk);
    em_tensor_release(x);
}

static em_tensor *f_gather(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* x^T (4, 3), index (4, 2) along dim 1 with repeats */
    return em_gather(em_transpose(in[0], 0, 1), 1, in[1]);
}
static em_tensor *f_scatter(em_tensor *const *in, int n, void *user) {
    (void)n; /* self^T (3, 5), index (2, 3) along dim 1, src (3, 4) */
    bool add = *(const bool *)user;
    em_tensor *self = em_transpose(in[0], 0, 1);
    em_tensor *r = add ? em_scatter_add(self, 1, in[1], in[2]) : em_scatter(self, 1, in[1], in[2]);
    return em_mul(r, r);
}
static em_tensor *f_index_add(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* self (5, 3), index (4) along dim 0, source^T (4, 3) */
    return em_index_add(in[0], 0, in[1], em_transpose(in[2], 0, 1), 0.5);
}
static em_tensor *f_index_select(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* x^T (3, 5), index (4) along dim 1 with repeats */
    return em_index_select(em_transpose(in[0], 0, 1), 1, in[1]);
}

Test(derivs, gather_scatter_index_add_index_select) {
    em_tensor *x = leaf(2, (int64_t[]){3, 4}, 45, -1, 1, false);
    em_tensor *gi = ints(2, (int64_t[]){4, 2}, (double[]){0, 2, 1, 1, 2, 0, 0, 0});
    em_tensor *in_g[2] = {x, gi};
    GRADCHECK(f_gather, 2, in_g, NULL);
    em_tensor *self = leaf(2, (int64_t[]){5, 3}, 46, -1, 1, false);
    em_tensor *src = leaf(2, (int64_t[]){3, 4}, 47, -1, 1, false);
    /* Unique positions per row for scatter (its src grad is exact only then). */
    em_tensor *si = ints(2, (int64_t[]){2, 3}, (double[]){4, 0, 2, 1, 3, 0});
    em_tensor *in_s[3] = {self, si, src};
    bool set = false, add = true;
    GRADCHECK(f_scatter, 3, in_s, &set);
    GRADCHECK(f_scatter, 3, in_s, &add);
    em_tensor *ai = ints(1, (int64_t[]){4}, (double[]){0, 2, 2, 4});
    em_tensor *source = leaf(2, (int64_t[]){3, 4}, 48, -1, 1, false);
    em_tensor *in_a[3] = {self, ai, source};
    GRADCHECK(f_index_add, 3, in_a, NULL);
    em_tensor *xi = ints(1, (int64_t[]){4}, (double[]){4, 0, 4, 1});
    em_tensor *in_i[2] = {self, xi};
    GRADCHECK(f_index_select, 2, in_i, NULL);
    em_tensor *all[] = {x, gi, self, src, si, ai, source, xi};
    release_all(8, all);
}

static em_tensor *f_embedding(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_embedding(in[0], in[1], EM_PADDING_IDX_NONE);
}

Test(derivs, embedding_with_repeats_and_padding_idx) {
    em_tensor *w = leaf(2, (int64_t[]){6, 3}, 49, -1, 1, false);
    em_tensor *idx = ints(2, (int64_t[]){2, 3}, (double[]){1, 5, 1, 2, 0, 2});
    em_tensor *in[2] = {w, idx};
    GRADCHECK(f_embedding, 2, in, NULL);
    /* padding_idx rows get no gradient (so gradcheck does not apply: they are used). */
    em_scope_begin();
    cr_assert_eq(em_backward(em_sum(em_embedding(w, idx, -4), 0, NULL, false)), EM_OK, "%s",
                 em_last_error());
    double count[6] = {1, 2, 0, 0, 0, 1}; /* row 2 (-4 + 6) is padding */
    for (int r = 0; r < 6; r++)
        for (int k = 0; k < 3; k++)
            cr_assert_eq(em_test_at(em_tensor_grad(w), r * 3 + k), count[r], "row %d", r);
    em_scope_end();
    release_all(2, in);
}

static em_tensor *f_masked_fill(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* x^T (3, 4) with a (4) mask; a (3, 1) input broadcast by a mask */
    em_tensor *a = em_masked_fill(em_transpose(in[0], 0, 1), in[2], 7);
    em_tensor *b = em_masked_fill(in[1], in[3], -1);
    return em_mul(a, b);
}

Test(derivs, masked_fill_broadcast_both_ways) {
    em_tensor *x = leaf(2, (int64_t[]){4, 3}, 50, -1, 1, false);
    em_tensor *y = leaf(2, (int64_t[]){3, 1}, 51, -1, 1, false);
    em_scope_begin();
    em_tensor *m1 = em_keep(em_to_dtype(em_test_tensor(EM_F64, 1, (int64_t[]){4},
                                                       (double[]){1, 0, 0, 1}), EM_BOOL));
    double mv[12] = {0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0};
    em_tensor *m2 = em_keep(em_to_dtype(em_test_tensor(EM_F64, 2, (int64_t[]){3, 4}, mv),
                                        EM_BOOL));
    em_scope_end();
    em_tensor *in[4] = {x, y, m1, m2};
    GRADCHECK(f_masked_fill, 4, in, NULL);
    release_all(4, in);
}

static em_tensor *f_tri(em_tensor *const *in, int n, void *user) {
    (void)n;
    int64_t k = *(const int64_t *)user;
    em_tensor *x = em_transpose(in[0], 1, 2); /* (2, 4, 3) */
    return em_add(em_tril(x, k), em_mul(em_triu(x, k + 1), x));
}
static em_tensor *f_flip(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    em_tensor *x = em_permute(in[0], 3, (int[]){2, 0, 1});
    return em_mul(em_flip(x, 2, (int[]){0, -1}), x);
}

Test(derivs, tril_triu_flip) {
    em_tensor *x = leaf(3, (int64_t[]){2, 3, 4}, 52, -1, 1, false);
    for (int64_t k = -1; k <= 1; k++) GRADCHECK(f_tri, 1, &x, &k);
    GRADCHECK(f_flip, 1, &x, NULL);
    em_tensor_release(x);
}

Test(derivs, data_ops_without_a_derivative_record_no_history) {
    em_tensor *w = leaf(2, (int64_t[]){4, 3}, 53, -1, 1, false);
    em_tensor *idx = ints(1, (int64_t[]){4}, (double[]){0, 3, 3, 1});
    em_scope_begin();
    em_tensor *oh = em_one_hot(idx, 4);
    em_tensor *eb = em_embedding_backward(w, idx, 5, EM_PADDING_IDX_NONE);
    cr_assert(oh && eb, "%s", em_last_error());
    cr_assert(!em_tensor_requires_grad(eb), "embedding_backward recorded history");
    cr_assert(!em_tensor_requires_grad(oh));
    em_scope_end();
    em_tensor_release(w);
    em_tensor_release(idx);
}

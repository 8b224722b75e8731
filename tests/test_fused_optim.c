/*
 * test_fused_optim.c — the fused optimizer list ops (fused_sgd, fused_adam, fused_adamw:
 * core/ops_optim.c, CPU kernels in plugins/backend-cpu/cpu_optim.c), em_op_call_lists, and the
 * optimizer classes' use of them (plugins/optim).
 *
 * References:
 *   - The kernels against a plain loop written here in the compute type (float, or double
 *     for f64 params), one operation per statement in the contract's order, so the tolerance
 *     is 0 (bitwise) for every dtype: f32 and f64 params; f16 and bf16 params with f32 master
 *     weights and f32 state; bf16 params and bf16 state without master weights. Five tensors
 *     of different sizes per call (1, 7, a transposed 20 x 15 view, 40000 and an empty one),
 *     three steps, every flag, on 1 and 2 threads.
 *   - The SGD, Adam and AdamW classes (which take the fused path on the CPU) against the
 *     same update written with Ember's public elementwise ops one at a time: bitwise equal.
 *   - bf16 parameters through Adam: f32 state and master weights, the state dict keeps them
 *     f32, and a parameter changed outside the optimizer is taken as it is.
 *   - Errors of em_op_call_lists: shapes, dtypes, devices of the lists, missing lists, list
 *     ops through em_op_call and the reverse, each naming the op, list and tensor.
 *   - The capturable forms (option capturable: fused_*_capturable read the lr and Adam's step
 *     count from device memory) against the plain ones, on the CPU and captured and replayed
 *     on the test device with host kernels (the section at the end says how).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"

TestSuite(fused, .init = em_test_setup, .fini = em_test_teardown, .timeout = 120);
TestSuite(fused_errors, .init = em_test_setup, .fini = em_test_teardown);

/* ---- the plain-loop reference ------------------------------------------------------------------ */

enum { SGD, ADAM, ADAMW };

typedef struct cfg {
    int kind;
    double lr, momentum, dampening, wd, b1, b2, eps;
    bool nesterov, maximize, amsgrad;
} cfg;

/* One element in compute type T, each operation on its own line so that it rounds to T: w
 * the weight (master or param), g the grad, s[0..2] the states. The scalars are formed in
 * double and rounded to T, as the contract says. */
#define DEF_REF(T, SFX)                                                                          \
    static void ref_sgd_##SFX(const cfg *c, double *w, double g, double *s, bool fresh) {      \
        T x = (T)*w, d = c->maximize ? -(T)g : (T)g;                                           \
        if (c->wd != 0) {                                                                      \
            T dw = x * (T)c->wd;                                                               \
            d = d + dw;                                                                        \
        }                                                                                      \
        if (c->momentum != 0) {                                                                \
            T m = (T)c->momentum, b = d;                                                       \
            if (!fresh) {                                                                      \
                T b1 = (T)s[0] * m, b2 = d * (T)(1 - c->dampening);                            \
                b = b1 + b2;                                                                   \
            }                                                                                  \
            s[0] = b;                                                                          \
            if (c->nesterov) {                                                                 \
                T bn = b * m;                                                                  \
                d = d + bn;                                                                    \
            } else {                                                                           \
                d = b;                                                                         \
            }                                                                                  \
        }                                                                                      \
        T step = d * (T)(-c->lr);                                                              \
        *w = x + step;                                                                         \
    }                                                                                          \
    static void ref_adam_##SFX(const cfg *c, double *w, double g, double *s, double stepn) {   \
        T x = (T)*w, d = c->maximize ? -(T)g : (T)g;                                           \
        if (c->kind == ADAMW) {                                                                \
            x = x * (T)(1 - c->lr * c->wd);                                                    \
        } else if (c->wd != 0) {                                                               \
            T dw = x * (T)c->wd;                                                               \
            d = d + dw;                                                                        \
        }                                                                                      \
        T m1 = (T)s[0] * (T)c->b1, m2 = d * (T)(1 - c->b1);                                    \
        T m = m1 + m2;                                                                         \
        T v1 = (T)s[1] * (T)c->b2, dd = d * d;                                                 \
        T v2 = dd * (T)(1 - c->b2);                                                            \
        T v = v1 + v2;                                                                         \
        s[0] = m;                                                                              \
        s[1] = v;                                                                              \
        T sq = v;                                                                              \
        if (c->amsgrad) sq = (T)s[2] > v ? (T)s[2] : v;                                        \
        s[2] = sq;                                                                             \
        double bc1 = 1 - pow(c->b1, stepn), bc2 = sqrt(1 - pow(c->b2, stepn));                 \
        T r = (T)sqrt((double)sq); /* correctly rounded in T either way */                     \
        T den = r / (T)bc2;                                                                    \
        den = den + (T)c->eps;                                                                 \
        T q = m / den;                                                                         \
        T step = q * (T)(-(c->lr / bc1));                                                      \
        *w = x + step;                                                                         \
    }
DEF_REF(float, f32)
DEF_REF(double, f64)

/* ---- one call of the fused op against the reference ----------------------------------------------- */

#define NT 5
static const int64_t sizes[NT] = {1, 7, 300, 40000, 0};

/* Deterministic values in [-1, 1). */
static double val(int64_t i, int seed) {
    uint64_t x = (uint64_t)i * 6364136223846793005ull + (uint64_t)seed * 1442695040888963407ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (double)(x >> 11) / 9007199254740992.0 * 2 - 1;
}

/* A tensor of n elements of dt, from v (rounded to dt); tensor 2 (300 elements) is the
 * transpose of a contiguous (15, 20) tensor, so a strided view. */
static em_tensor *make(em_dtype dt, int j, const double *v) {
    int64_t n = sizes[j];
    em_tensor *t;
    if (j == 2) {
        em_tensor *base = em_empty(2, (int64_t[]){15, 20}, dt, em_cpu());
        t = em_transpose(base, 0, 1);
    } else {
        t = em_empty(1, &n, dt, em_cpu());
    }
    cr_assert(t, "%s", em_last_error());
    if (n == 0) return t;
    em_tensor *src = em_from_data(v, 1, &n, EM_F64, em_cpu());
    if (j == 2) src = em_view(src, 2, (int64_t[]){20, 15});
    cr_assert(src && em_copy_(t, src) == EM_OK, "%s", em_last_error());
    return t;
}

typedef struct arrays {
    double *w[NT], *p[NT], *g[NT], *s[3][NT];
} arrays;

static int n_states(const cfg *c) { return c->kind == SGD ? 1 : 3; }
static bool has_state(const cfg *c, int k) {
    return c->kind == SGD ? c->momentum != 0 && k == 0 : k < 2 || c->amsgrad;
}

static void check_equal(const char *what, const em_tensor *t, const double *want, int j,
                        const char *label) {
    double *got = em_test_values(t);
    for (int64_t i = 0; i < sizes[j]; i++)
        cr_assert(got[i] == want[i] || (isnan(got[i]) && isnan(want[i])),
                  "%s: %s of tensor %d, element %lld: got %.9g, want %.9g", label, what, j,
                  (long long)i, got[i], want[i]);
    free(got);
}

/* Three steps of the op over NT tensors with params of pdt, state of sdt, master weights
 * (f32) when master; compared bitwise with the reference after each step. */
static void run_case(const cfg *c, em_dtype pdt, em_dtype sdt, bool master, const char *label) {
    bool f32 = pdt != EM_F64;
    const char *opname = c->kind == SGD ? "fused_sgd" : c->kind == ADAM ? "fused_adam"
                                                                        : "fused_adamw";
    const em_op *op = em_op_find(opname);
    cr_assert(op, "%s", em_last_error());
    int n_out = c->kind == SGD ? 3 : 5, ns = n_states(c);
    arrays a;
    em_tensor *params[NT], *grads[NT], *states[3][NT] = {{0}}, *masters[NT] = {0};
    em_scope_begin();
    for (int j = 0; j < NT; j++) {
        int64_t n = sizes[j];
        a.w[j] = calloc((size_t)n + 1, sizeof(double));
        a.p[j] = calloc((size_t)n + 1, sizeof(double));
        a.g[j] = calloc((size_t)n + 1, sizeof(double));
        for (int64_t i = 0; i < n; i++) a.p[j][i] = a.w[j][i] = em_test_round_to(pdt, val(i, j));
        params[j] = make(pdt, j, a.p[j]);
        if (master) masters[j] = make(EM_F32, j, a.w[j]);
        for (int k = 0; k < ns; k++) {
            a.s[k][j] = calloc((size_t)n + 1, sizeof(double));
            if (has_state(c, k)) states[k][j] = make(sdt, j, a.s[k][j]);
        }
    }
    for (int step = 1; step <= 3; step++) {
        for (int j = 0; j < NT; j++) {
            for (int64_t i = 0; i < sizes[j]; i++)
                a.g[j][i] = em_test_round_to(pdt, val(i, 100 * step + j));
            grads[j] = make(pdt, j, a.g[j]);
        }
        em_attr attrs[8];
#define F(x) ((em_attr){.type = EM_ATTR_FLOAT, .v.f = (x)})
#define B(x) ((em_attr){.type = EM_ATTR_BOOL, .v.b = (x)})
        if (c->kind == SGD) {
            attrs[0] = F(c->lr), attrs[1] = F(c->momentum), attrs[2] = F(c->dampening);
            attrs[3] = F(c->wd), attrs[4] = B(c->nesterov), attrs[5] = B(c->maximize);
            attrs[6] = B(step == 1);
        } else {
            attrs[0] = F(c->lr), attrs[1] = F(c->b1), attrs[2] = F(c->b2), attrs[3] = F(c->eps);
            attrs[4] = F(c->wd), attrs[5] = F(step), attrs[6] = B(c->amsgrad);
            attrs[7] = B(c->maximize);
        }
#undef F
#undef B
        em_tensor *out[5 * NT] = {0};
        for (int j = 0; j < NT; j++) {
            out[j] = params[j];
            for (int k = 0; k < ns; k++) out[(1 + k) * NT + j] = states[k][j];
            out[(n_out - 1) * NT + j] = masters[j];
        }
        cr_assert_eq(em_op_call_lists(op, NT, (const em_tensor *const *)grads, attrs, out), EM_OK,
                     "%s: %s", label, em_last_error());
        for (int j = 0; j < NT; j++)
            for (int64_t i = 0; i < sizes[j]; i++) {
                double s[3];
                for (int k = 0; k < ns; k++) s[k] = a.s[k][j][i];
                if (c->kind == SGD && f32) ref_sgd_f32(c, &a.w[j][i], a.g[j][i], s, step == 1);
                else if (c->kind == SGD) ref_sgd_f64(c, &a.w[j][i], a.g[j][i], s, step == 1);
                else if (f32) ref_adam_f32(c, &a.w[j][i], a.g[j][i], s, step);
                else ref_adam_f64(c, &a.w[j][i], a.g[j][i], s, step);
                for (int k = 0; k < ns; k++) a.s[k][j][i] = em_test_round_to(sdt, s[k]);
                a.p[j][i] = em_test_round_to(pdt, a.w[j][i]);
                if (!master) a.w[j][i] = a.p[j][i];
            }
        char at[200];
        snprintf(at, sizeof at, "%s, step %d", label, step);
        for (int j = 0; j < NT; j++) {
            check_equal("param", params[j], a.p[j], j, at);
            if (master) check_equal("master", masters[j], a.w[j], j, at);
            for (int k = 0; k < ns; k++) {
                char what[32];
                snprintf(what, sizeof what, "state %d", k);
                if (states[k][j]) check_equal(what, states[k][j], a.s[k][j], j, at);
            }
        }
    }
    em_scope_end();
    for (int j = 0; j < NT; j++) {
        free(a.w[j]), free(a.p[j]), free(a.g[j]);
        for (int k = 0; k < ns; k++) free(a.s[k][j]);
    }
}

/* Every dtype arrangement for one configuration. */
static void run_dtypes(const cfg *c, const char *name) {
    static const struct {
        em_dtype p, s;
        bool master;
        const char *what;
    } dts[] = {{EM_F32, EM_F32, false, "f32"},
               {EM_F64, EM_F64, false, "f64"},
               {EM_F16, EM_F32, true, "f16 + f32 master/state"},
               {EM_BF16, EM_F32, true, "bf16 + f32 master/state"},
               {EM_BF16, EM_BF16, false, "bf16 params and state"}};
    for (int threads = 1; threads <= 2; threads++) {
        em_set_num_threads(threads);
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            char label[160];
            snprintf(label, sizeof label, "%s, %s, %d thread(s)", name, dts[d].what, threads);
            run_case(c, dts[d].p, dts[d].s, dts[d].master, label);
        }
    }
}

Test(fused, sgd_every_flag_against_a_plain_loop) {
    for (int mask = 0; mask < 32; mask++) {
        cfg c = {.kind = SGD, .lr = 0.05, .momentum = (mask & 1) ? 0.9 : 0,
                 .dampening = (mask & 2) ? 0.25 : 0, .wd = (mask & 4) ? 0.01 : 0,
                 .nesterov = (mask & 8) != 0, .maximize = (mask & 16) != 0};
        if (c.nesterov && (c.momentum == 0 || c.dampening != 0)) continue;
        char name[96];
        snprintf(name, sizeof name, "SGD momentum %g dampening %g wd %g nesterov %d maximize %d",
                 c.momentum, c.dampening, c.wd, c.nesterov, c.maximize);
        run_dtypes(&c, name);
    }
}

Test(fused, adam_and_adamw_every_flag_against_a_plain_loop) {
    for (int kind = ADAM; kind <= ADAMW; kind++)
        for (int mask = 0; mask < 8; mask++) {
            cfg c = {.kind = kind, .lr = 0.01, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8,
                     .wd = (mask & 1) ? 0.05 : 0, .amsgrad = (mask & 2) != 0,
                     .maximize = (mask & 4) != 0};
            char name[96];
            snprintf(name, sizeof name, "%s wd %g amsgrad %d maximize %d",
                     kind == ADAM ? "Adam" : "AdamW", c.wd, c.amsgrad, c.maximize);
            run_dtypes(&c, name);
        }
}

/* ---- the optimizer classes against the same update done op by op ----------------------------------- */

/* p, grads: NP parameters of different shapes, the grads a fixed function of the step. */
#define NP 3
static const int64_t pshape[NP][2] = {{33, 17}, {17, 1}, {1, 1}};

static em_tensor *grad_for(int j, int step) {
    int64_t n = pshape[j][0] * pshape[j][1];
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = val(i, 7 * step + j);
    em_tensor *t = em_from_data(v, 2, pshape[j], EM_F64, em_cpu());
    free(v);
    return em_to_dtype(t, EM_F32);
}

static em_tensor *init_param(int j) {
    int64_t n = pshape[j][0] * pshape[j][1];
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = val(i, 50 + j);
    em_scope_begin();
    em_tensor *t = em_keep(em_to_dtype(em_from_data(v, 2, pshape[j], EM_F64, em_cpu()), EM_F32));
    em_scope_end();
    free(v);
    return t;
}

/* The op-by-op update of one parameter (the optimizer classes' arithmetic, written here with
 * the public ops). st[0..2]: momentum buffer, or exp_avg, exp_avg_sq, max_exp_avg_sq. */
static void manual_step(const cfg *c, em_tensor *p, const em_tensor *g, em_tensor **st,
                        int step) {
    em_scope_begin();
    em_clear_error();
    const em_tensor *d = c->maximize ? em_neg(g) : g;
    if (c->kind == SGD) {
        if (c->wd != 0) d = em_add(d, em_mul_scalar(p, c->wd));
        if (c->momentum != 0) {
            if (step == 1) {
                st[0] = em_tensor_retain(em_clone(d)); /* the test's own reference */
            } else {
                em_mul_scalar_(st[0], c->momentum);
                em_add_(st[0], em_mul_scalar(d, 1 - c->dampening));
            }
            d = c->nesterov ? em_add(d, em_mul_scalar(st[0], c->momentum)) : st[0];
        }
        em_add_(p, em_mul_scalar(d, -c->lr));
    } else {
        if (c->kind == ADAMW) em_mul_scalar_(p, 1 - c->lr * c->wd);
        else if (c->wd != 0) d = em_add(d, em_mul_scalar(p, c->wd));
        for (int k = 0; k < 3 && step == 1; k++) {
            st[k] = em_tensor_retain(em_zeros_like(p));
        }
        em_mul_scalar_(st[0], c->b1);
        em_add_(st[0], em_mul_scalar(d, 1 - c->b1));
        em_mul_scalar_(st[1], c->b2);
        em_add_(st[1], em_mul_scalar(em_mul(d, d), 1 - c->b2));
        const em_tensor *sq = st[1];
        if (c->amsgrad) {
            em_copy_(st[2], em_maximum(st[2], st[1]));
            sq = st[2];
        }
        double bc1 = 1 - pow(c->b1, step), bc2 = 1 - pow(c->b2, step);
        em_tensor *den = em_div_scalar(em_sqrt(sq), sqrt(bc2));
        em_add_scalar_(den, c->eps);
        em_add_(p, em_mul_scalar(em_div(st[0], den), -(c->lr / bc1)));
    }
    cr_assert_eq(em_last_status(), EM_OK, "manual step: %s", em_last_error());
    em_scope_end();
}

static void class_vs_manual(const cfg *c, const char *cls, const char *opts_text) {
    em_tensor *p[NP], *q[NP], *st[NP][3] = {{0}};
    em_dict *d = em_dict_new();
    for (int j = 0; j < NP; j++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", j);
        p[j] = init_param(j);
        q[j] = init_param(j);
        cr_assert_eq(em_requires_grad_(p[j], true), EM_OK);
        em_dict_set(d, name, p[j]);
    }
    em_options *o = em_options_new();
    char *copy = strdup(opts_text), *save = NULL;
    for (char *kv = strtok_r(copy, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        *eq = '\0';
        cr_assert_eq(em_options_set_text(o, kv, eq + 1, "test"), EM_OK, "%s", em_last_error());
    }
    free(copy);
    em_optimizer *opt = em_optimizer_new(cls, d, o);
    cr_assert(opt, "%s", em_last_error());
    for (int step = 1; step <= 4; step++) {
        em_scope_begin();
        for (int j = 0; j < NP; j++) {
            em_tensor *g = grad_for(j, step);
            em_tensor_set_grad(p[j], g);
            manual_step(c, q[j], g, st[j], step);
        }
        cr_assert_eq(em_optimizer_step(opt), EM_OK, "%s", em_last_error());
        em_scope_end();
        for (int j = 0; j < NP; j++) {
            double *a = em_test_values(p[j]), *b = em_test_values(q[j]);
            for (int64_t i = 0; i < pshape[j][0] * pshape[j][1]; i++)
                cr_assert(a[i] == b[i], "%s (%s), step %d, param %d, element %lld: fused %.9g, "
                          "op by op %.9g", cls, opts_text, step, j, (long long)i, a[i], b[i]);
            free(a), free(b);
        }
    }
    em_optimizer_free(opt);
    em_options_free(o);
    em_dict_free(d);
    for (int j = 0; j < NP; j++) {
        em_tensor_release(p[j]), em_tensor_release(q[j]);
        for (int k = 0; k < 3; k++) em_tensor_release(st[j][k]);
    }
}

Test(fused, optimizer_classes_equal_op_by_op_bitwise) {
    cfg sgd = {.kind = SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.1, .wd = 0.01,
               .maximize = true};
    class_vs_manual(&sgd, "SGD", "lr=0.1;momentum=0.9;dampening=0.1;weight_decay=0.01;"
                                 "maximize=true");
    cfg nest = {.kind = SGD, .lr = 0.1, .momentum = 0.5, .nesterov = true};
    class_vs_manual(&nest, "SGD", "lr=0.1;momentum=0.5;nesterov=true");
    cfg plain = {.kind = SGD, .lr = 0.1};
    class_vs_manual(&plain, "SGD", "lr=0.1");
    cfg adam = {.kind = ADAM, .lr = 0.01, .b1 = 0.8, .b2 = 0.99, .eps = 1e-6, .wd = 0.1,
                .amsgrad = true};
    class_vs_manual(&adam, "Adam", "lr=0.01;betas=[0.8,0.99];eps=1e-6;weight_decay=0.1;"
                                   "amsgrad=true");
    cfg adam0 = {.kind = ADAM, .lr = 1e-3, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8};
    class_vs_manual(&adam0, "Adam", "lr=1e-3");
    cfg adamw = {.kind = ADAMW, .lr = 0.01, .b1 = 0.9, .b2 = 0.999, .eps = 1e-8, .wd = 0.01,
                 .maximize = true};
    class_vs_manual(&adamw, "AdamW", "lr=0.01;maximize=true");
}

/* ---- bf16 parameters: f32 state and master weights -------------------------------------------------- */

Test(fused, bf16_params_keep_f32_master_weights_and_state) {
    int64_t shape[1] = {5};
    const double init[5] = {1.0, -2.0, 0.5, 3.0, -0.25};
    em_tensor *p = em_test_tensor(EM_BF16, 1, shape, init);
    cr_assert_eq(em_requires_grad_(p, true), EM_OK);
    em_dict *d = em_dict_new();
    em_dict_set(d, "w", p);
    em_options *o = em_options_new();
    em_options_set_float(o, "lr", 1e-4); /* steps far below bf16's resolution at 1.0 */
    em_optimizer *opt = em_optimizer_new("Adam", d, o);
    cr_assert(opt, "%s", em_last_error());
    const double gv[5] = {1, 1, -1, 1, -1};
    for (int step = 0; step < 3; step++) {
        em_scope_begin();
        em_tensor_set_grad(p, em_test_tensor(EM_BF16, 1, shape, gv));
        cr_assert_eq(em_optimizer_step(opt), EM_OK, "%s", em_last_error());
        em_scope_end();
    }
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "master_param"};
    for (int k = 0; k < 3; k++) {
        em_tensor *t = em_optimizer_state(opt, 0, names[k]);
        cr_assert(t, "state %s missing", names[k]);
        cr_assert_eq(em_tensor_dtype(t), EM_F32, "state %s is %s", names[k],
                     em_dtype_name(em_tensor_dtype(t)));
    }
    /* Adam's first steps move each weight by ~lr: the master holds 3 steps of 1e-4, which
     * bf16 alone would have rounded away. */
    em_tensor *m = em_optimizer_state(opt, 0, "master_param");
    for (int i = 0; i < 5; i++) {
        double want = init[i] - 3e-4 * gv[i];
        cr_assert(fabs(em_test_at(m, i) - want) < 1e-6, "master %d: %.9g, want %.9g", i,
                  em_test_at(m, i), want);
        cr_assert_eq(em_test_at(p, i), em_test_round_to(EM_BF16, em_test_at(m, i)));
    }
    /* The state dict keeps f32 state of a bf16 parameter f32 on loading. */
    em_dict *tensors;
    char *json;
    cr_assert_eq(em_optimizer_state_dict(opt, &tensors, &json), EM_OK, "%s", em_last_error());
    em_optimizer *opt2 = em_optimizer_new("Adam", d, o);
    cr_assert_eq(em_optimizer_load_state_dict(opt2, tensors, json), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_tensor_dtype(em_optimizer_state(opt2, 0, "master_param")), EM_F32);
    cr_assert_eq(em_tensor_dtype(em_optimizer_state(opt2, 0, "exp_avg")), EM_F32);
    /* A parameter changed outside the optimizer is taken as it is: after a step with a zero
     * grad and lr 0, the master equals the new value. */
    em_scope_begin();
    em_grad_mode_push(EM_GRAD_DISABLED);
    cr_assert_eq(em_fill_(p, 7.0), EM_OK, "%s", em_last_error());
    em_grad_mode_pop();
    em_tensor_set_grad(p, em_zeros(1, shape, EM_BF16, em_cpu()));
    cr_assert_eq(em_optimizer_set_lr(opt, 0, 0.0), EM_OK);
    cr_assert_eq(em_optimizer_step(opt), EM_OK, "%s", em_last_error());
    em_scope_end();
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(em_test_at(m, i), 7.0, "master %d: %g", i, em_test_at(m, i));
        cr_assert_eq(em_test_at(p, i), 7.0);
    }
    em_host_free(json);
    em_dict_free(tensors);
    em_optimizer_free(opt2);
    em_optimizer_free(opt);
    em_options_free(o);
    em_dict_free(d);
    em_tensor_release(p);
}

/* ---- errors ----------------------------------------------------------------------------------------- */

static em_attr sgd_attrs[7] = {{.type = EM_ATTR_FLOAT, .v.f = 0.1}, {.type = EM_ATTR_FLOAT},
                               {.type = EM_ATTR_FLOAT}, {.type = EM_ATTR_FLOAT},
                               {.type = EM_ATTR_BOOL}, {.type = EM_ATTR_BOOL},
                               {.type = EM_ATTR_BOOL}};

Test(fused_errors, list_calls_name_the_op_list_and_tensor) {
    em_scope_begin();
    const em_op *op = em_op_find("fused_sgd");
    cr_assert(op);
    em_tensor *p[2] = {em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu()),
                       em_zeros(1, (int64_t[]){4}, EM_F32, em_cpu())};
    const em_tensor *g[2] = {em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu()),
                             em_zeros(1, (int64_t[]){5}, EM_F32, em_cpu())};
    em_tensor *out[6] = {p[0], p[1], NULL, NULL, NULL, NULL};
    cr_assert_eq(em_op_call_lists(op, 2, g, sgd_attrs, out), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "tensor 1 of input list 'grads' has shape [5]");
    g[1] = em_zeros(1, (int64_t[]){4}, EM_F64, em_cpu());
    out[1] = em_zeros(1, (int64_t[]){4}, EM_F64, em_cpu());
    cr_assert_eq(em_op_call_lists(op, 2, g, sgd_attrs, out), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "output list 0 must share one dtype");
    out[1] = p[1];
    cr_assert_eq(em_op_call_lists(op, 2, g, sgd_attrs, out), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "grad 1 is float64 but its param is float32");
    g[1] = em_zeros(1, (int64_t[]){4}, EM_F32, em_cpu());
    /* A list given for one tensor and not the other. */
    out[2] = em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu());
    cr_assert_eq(em_op_call_lists(op, 2, g, sgd_attrs, out), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "tensor 1 of output list 1 is NULL");
    out[2] = NULL;
    /* momentum without buffers */
    sgd_attrs[1].v.f = 0.9;
    cr_assert_eq(em_op_call_lists(op, 2, g, sgd_attrs, out), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "fused_sgd: the momentum_buffer list is required");
    sgd_attrs[1].v.f = 0;
    /* master weights for f32 params */
    out[4] = em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu());
    out[5] = em_zeros(1, (int64_t[]){4}, EM_F32, em_cpu());
    cr_assert_eq(em_op_call_lists(op, 2, g, sgd_attrs, out), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "master weights are for f16 and bf16 params");
    out[4] = out[5] = NULL;
    cr_assert_eq(em_op_call_lists(op, 2, g, sgd_attrs, out), EM_OK, "%s", em_last_error());
    /* Wrong entry points. */
    em_tensor *res[3];
    cr_assert_neq(em_op_call(op, g, 1, sgd_attrs, res), EM_OK);
    em_assert_error(EM_ERR_INVALID, "fused_sgd: a list op");
    cr_assert_eq(em_op_call_lists(em_op_find("add"), 1, g, NULL, out), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "add: not a list op");
    /* Adam's step must count. */
    const em_op *adam = em_op_find("fused_adam");
    em_attr aa[8] = {{.type = EM_ATTR_FLOAT, .v.f = 0.1}};
    em_tensor *aout[5] = {p[0], em_zeros_like(p[0]), em_zeros_like(p[0]), NULL, NULL};
    cr_assert_eq(em_op_call_lists(adam, 1, g, aa, aout), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "fused_adam: step must be at least 1");
    cr_assert(em_op_has_kernel(adam, em_cpu(), EM_BF16));
    cr_assert(!em_op_has_kernel(adam, em_cpu(), EM_I32));
    em_scope_end();
}

/* ---- the capturable forms (option capturable; fused_*_capturable) ------------------------------ *
 *
 *   - on the CPU, SGD, Adam and AdamW with capturable equal the plain optimizers bit for bit
 *     (params, states, step counts), f32 and f64, with the lr changed before every step; with
 *     amsgrad too (capturable: op by op with the count and lr on the device; plain: the fused
 *     kernel), the maxima included;
 *   - on the test device with host kernels (tests/plugins/host/, which records and replays as
 *     CUDA graphs do), one captured step replayed with new gradients and a new lr each time
 *     equals the plain optimizer's steps on the CPU bit for bit, and its step count moves on
 *     the device; the plain optimizer captured the same way does not (it repeats the step
 *     count and lr of its capture: the comparison can fail);
 *   - the refusals: a dtype without the kernel (with amsgrad too), bad lr/steps lists. */

/* NP params like init_param / grad_for, in dtype dt on dev. */
static em_tensor *param_as(int j, em_dtype dt, em_device dev) {
    em_scope_begin();
    em_tensor *t = em_keep(em_to_device(em_to_dtype(init_param(j), dt), dev));
    em_scope_end();
    return t;
}

static em_optimizer *opt_for(const char *cls, const char *opts_text, em_tensor *const *p,
                             bool capturable) {
    em_dict *d = em_dict_new();
    for (int j = 0; j < NP; j++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", j);
        em_dict_set(d, name, p[j]);
    }
    em_options *o = em_options_new();
    char *copy = strdup(opts_text), *save = NULL;
    for (char *kv = strtok_r(copy, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        *eq = '\0';
        cr_assert_eq(em_options_set_text(o, kv, eq + 1, "test"), EM_OK, "%s", em_last_error());
    }
    free(copy);
    if (capturable) em_options_set_bool(o, "capturable", true);
    em_optimizer *opt = em_optimizer_new(cls, d, o);
    cr_assert(opt, "%s (%s): %s", cls, opts_text, em_last_error());
    em_options_free(o);
    em_dict_free(d);
    return opt;
}

/* a and b (any devices) hold the same values, bit for bit (compared as doubles: exact for
 * f32 and f64). */
static void expect_same(const char *what, const em_tensor *a, const em_tensor *b) {
    cr_assert(a && b, "%s: missing (%s)", what, a ? "second" : "first");
    cr_assert_eq(em_tensor_numel(a), em_tensor_numel(b), "%s: sizes", what);
    double *x = em_test_values(a), *y = em_test_values(b);
    for (int64_t i = 0; i < em_tensor_numel(a); i++)
        cr_assert(x[i] == y[i] || (isnan(x[i]) && isnan(y[i])),
                  "%s, element %lld: %.17g against %.17g", what, (long long)i, x[i], y[i]);
    free(x), free(y);
}

static const char *const state_names[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "step",
                                          "max_exp_avg_sq"};

/* Every state of ref's parameters is in got, equal; got's step counts are on dev. */
static void expect_states(const char *what, em_optimizer *ref, em_optimizer *got, em_device dev) {
    char w[256];
    for (int j = 0; j < NP; j++)
        for (int k = 0; k < 5; k++) {
            em_tensor *a = em_optimizer_state(ref, j, state_names[k]);
            if (!a) continue;
            em_tensor *b = em_optimizer_state(got, j, state_names[k]);
            snprintf(w, sizeof w, "%s: param %d's %s", what, j, state_names[k]);
            expect_same(w, a, b);
            if (k == 3)
                cr_assert(em_device_equal(em_tensor_device(b), dev) &&
                              em_tensor_dtype(b) == EM_F64 && em_tensor_ndim(b) == 0,
                          "%s: a 0-dim float64 count on the parameter's device", w);
        }
}

static const struct {
    const char *cls, *opts;
} cap_cases[] = {
    {"SGD", "lr=0.1;momentum=0.9;dampening=0.1;weight_decay=0.01;maximize=true"},
    {"SGD", "lr=0.1;momentum=0.5;nesterov=true"},
    {"SGD", "lr=0.1"},
    {"Adam", "lr=0.01;betas=[0.8,0.99];eps=1e-6;weight_decay=0.1"},
    {"Adam", "lr=1e-3;maximize=true"},
    {"AdamW", "lr=0.01;weight_decay=0.05"},
    {"Adam", "lr=0.01;betas=[0.8,0.99];eps=1e-6;weight_decay=0.1;amsgrad=true"},
    {"AdamW", "lr=0.01;weight_decay=0.05;amsgrad=true;maximize=true"},
};

Test(fused, capturable_steps_equal_the_plain_ones_with_a_new_lr_every_step) {
    for (size_t c = 0; c < sizeof cap_cases / sizeof *cap_cases; c++)
        for (int f64 = 0; f64 < 2; f64++) {
            em_dtype dt = f64 ? EM_F64 : EM_F32;
            em_tensor *p[NP], *q[NP];
            for (int j = 0; j < NP; j++) {
                p[j] = param_as(j, dt, em_cpu());
                q[j] = param_as(j, dt, em_cpu());
                cr_assert_eq(em_requires_grad_(p[j], true), EM_OK);
                cr_assert_eq(em_requires_grad_(q[j], true), EM_OK);
            }
            em_optimizer *ref = opt_for(cap_cases[c].cls, cap_cases[c].opts, p, false);
            em_optimizer *cap = opt_for(cap_cases[c].cls, cap_cases[c].opts, q, true);
            char what[256];
            for (int step = 1; step <= 5; step++) {
                em_scope_begin();
                double lr = em_optimizer_lr(ref, 0) * 0.8;
                cr_assert_eq(em_optimizer_set_lr(ref, 0, lr), EM_OK);
                cr_assert_eq(em_optimizer_set_lr(cap, 0, lr), EM_OK);
                for (int j = 0; j < NP; j++) {
                    em_tensor *g = em_to_dtype(grad_for(j, step), dt);
                    em_tensor_set_grad(p[j], g);
                    em_tensor_set_grad(q[j], em_clone(g));
                }
                cr_assert_eq(em_optimizer_step(ref), EM_OK, "%s", em_last_error());
                cr_assert_eq(em_optimizer_step(cap), EM_OK, "%s", em_last_error());
                snprintf(what, sizeof what, "%s (%s) %s, step %d", cap_cases[c].cls,
                         cap_cases[c].opts, em_dtype_name(dt), step);
                for (int j = 0; j < NP; j++) expect_same(what, p[j], q[j]);
                expect_states(what, ref, cap, em_cpu());
                double lv = NAN;
                cr_assert_eq(em_tensor_item(em_optimizer_lr_tensor(cap, 0, em_cpu()), &lv), EM_OK);
                cr_assert_eq(lv, lr, "%s: the lr tensor holds %.17g, not %.17g", what, lv, lr);
                em_scope_end();
            }
            em_optimizer_free(ref);
            em_optimizer_free(cap);
            for (int j = 0; j < NP; j++) em_tensor_release(p[j]), em_tensor_release(q[j]);
        }
}

/* cls with opts on testdev:0: step 1 eager, step 2 captured, steps 2..N replays with new
 * grads copied into the captured ones and a new lr each; against the plain class on the CPU.
 * Returns whether every step's params equalled the CPU's bit for bit (checks the states too
 * when `capturable`). */
static bool replayed_equal(const char *cls, const char *opts, bool capturable, em_device td) {
    enum { N = 6 };
    em_tensor *p[NP], *q[NP], *gq[NP] = {0};
    for (int j = 0; j < NP; j++) {
        p[j] = param_as(j, EM_F32, em_cpu());
        q[j] = param_as(j, EM_F32, td);
        cr_assert(q[j], "%s", em_last_error());
        cr_assert_eq(em_requires_grad_(p[j], true), EM_OK);
        cr_assert_eq(em_requires_grad_(q[j], true), EM_OK);
    }
    em_optimizer *ref = opt_for(cls, opts, p, false);
    em_optimizer *dev = opt_for(cls, opts, q, capturable);
    em_stream *s = NULL, *prev = em_stream_current(td);
    cr_assert_eq(em_stream_create(td, &s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(td, s), EM_OK, "%s", em_last_error());
    em_graph *g = NULL;
    bool equal = true;
    char what[256];
    for (int step = 1; step <= N; step++) {
        em_scope_begin();
        double lr = em_optimizer_lr(ref, 0) * 0.7;
        cr_assert_eq(em_optimizer_set_lr(ref, 0, lr), EM_OK);
        cr_assert_eq(em_optimizer_set_lr(dev, 0, lr), EM_OK, "%s", em_last_error());
        for (int j = 0; j < NP; j++) {
            em_tensor *gr = grad_for(j, step);
            em_tensor_set_grad(p[j], gr);
            if (!gq[j]) {
                gq[j] = em_tensor_retain(em_to_device(gr, td));
                cr_assert_eq(em_tensor_set_grad(q[j], gq[j]), EM_OK, "%s", em_last_error());
            } else {
                cr_assert_eq(em_copy_(gq[j], gr), EM_OK, "%s", em_last_error());
            }
        }
        cr_assert_eq(em_optimizer_step(ref), EM_OK, "%s", em_last_error());
        if (step == 1) {
            cr_assert_eq(em_optimizer_step(dev), EM_OK, "%s", em_last_error());
        } else {
            if (!g) {
                cr_assert_eq(em_graph_capture_begin(td, s), EM_OK, "%s", em_last_error());
                em_status st = em_optimizer_step(dev);
                cr_assert_eq(st, EM_OK, "the captured step: %s", em_last_error());
                cr_assert_eq(em_graph_capture_end(td, &g), EM_OK, "%s", em_last_error());
            }
            cr_assert_eq(em_graph_replay(g), EM_OK, "%s", em_last_error());
        }
        snprintf(what, sizeof what, "%s (%s) on testdev, step %d (%s)", cls, opts, step,
                 step == 1 ? "eager" : "replayed");
        for (int j = 0; j < NP; j++) {
            double *a = em_test_values(p[j]), *b = em_test_values(q[j]);
            for (int64_t i = 0; i < em_tensor_numel(p[j]); i++) equal &= a[i] == b[i];
            free(a), free(b);
        }
        if (capturable) {
            for (int j = 0; j < NP; j++) expect_same(what, p[j], q[j]);
            expect_states(what, ref, dev, td);
        }
        em_scope_end();
    }
    em_graph_free(g);
    em_stream_set_current(td, prev);
    em_stream_free(td, s);
    em_optimizer_free(ref);
    em_optimizer_free(dev);
    for (int j = 0; j < NP; j++)
        em_tensor_release(p[j]), em_tensor_release(q[j]), em_tensor_release(gq[j]);
    return equal;
}

Test(fused, capturable_step_captured_on_the_test_device_replays_every_lr_and_count) {
    em_device td = em_test_host_testdev();
    /* SGD x2, Adam, AdamW, Adam and AdamW with amsgrad (f32: testdev's kernels) */
    static const int pick[] = {0, 1, 3, 5, 6, 7};
    for (size_t c = 0; c < sizeof pick / sizeof *pick; c++)
        cr_assert(replayed_equal(cap_cases[pick[c]].cls, cap_cases[pick[c]].opts, true, td));
    /* the plain classes, captured the same way, repeat their capture's lr and step count */
    cr_assert(!replayed_equal("Adam", "lr=0.01;betas=[0.8,0.99];eps=1e-6;weight_decay=0.1",
                              false, td),
              "the plain Adam's replays equalled the CPU's steps: the comparison cannot fail");
}

Test(fused_errors, capturable_refusals_name_the_option_op_and_list) {
    em_scope_begin();
    em_tensor *p[NP];
    for (int j = 0; j < NP; j++) {
        p[j] = em_keep(param_as(j, EM_F32, em_cpu()));
        cr_assert_eq(em_requires_grad_(p[j], true), EM_OK);
    }
    em_dict *d = em_dict_new();
    em_dict_set(d, "p0", p[0]);
    em_dict_free(d);
    /* a bf16 parameter: no capturable Adam kernel (no master weights), nor AMSGrad form */
    em_tensor *b = em_keep(param_as(1, EM_BF16, em_cpu()));
    cr_assert_eq(em_requires_grad_(b, true), EM_OK);
    for (int ams = 0; ams < 2; ams++) {
        d = em_dict_new();
        em_dict_set(d, "b", b);
        em_options *o = em_options_new();
        em_options_set_bool(o, "capturable", true);
        em_options_set_bool(o, "amsgrad", ams);
        em_optimizer *opt = em_optimizer_new("Adam", d, o);
        cr_assert(opt, "%s", em_last_error());
        em_tensor_set_grad(b, em_zeros_like(b));
        if (ams) {
            cr_assert_eq(em_optimizer_step(opt), EM_ERR_DTYPE);
            em_assert_error(EM_ERR_DTYPE, "Adam: capturable with amsgrad: parameter 0 (bfloat16 "
                            "on cpu) is not float32 or float64");
        } else {
            cr_assert_eq(em_optimizer_step(opt), EM_ERR_NOKERNEL);
            em_assert_error(EM_ERR_NOKERNEL, "Adam: capturable: parameter 0 (bfloat16 on cpu) "
                            "cannot take fused_adam_capturable");
        }
        em_optimizer_free(opt);
        em_options_free(o);
        em_dict_free(d);
    }
    /* the lists */
    const em_op *op = em_op_find("fused_adam_capturable");
    cr_assert(op);
    em_attr at[5] = {{.type = EM_ATTR_FLOAT, .v.f = 0.9}, {.type = EM_ATTR_FLOAT, .v.f = 0.999},
                     {.type = EM_ATTR_FLOAT, .v.f = 1e-8}, {.type = EM_ATTR_FLOAT},
                     {.type = EM_ATTR_BOOL}};
    em_tensor *g = em_zeros_like(p[0]);
    em_tensor *lr32 = em_zeros(0, NULL, EM_F32, em_cpu()), *lr1 = em_zeros(1, (int64_t[]){1}, EM_F64, em_cpu());
    em_tensor *lr = em_zeros(0, NULL, EM_F64, em_cpu()), *steps = em_zeros(0, NULL, EM_F64, em_cpu());
    em_tensor *out[4] = {p[0], em_zeros_like(p[0]), em_zeros_like(p[0]), steps};
    const em_tensor *in_bad[2] = {g, lr32}, *in_1d[2] = {g, lr1}, *in_ok[2] = {g, lr};
    cr_assert_eq(em_op_call_lists(op, 1, in_bad, at, out), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "fused_adam_capturable: lr 0 is float32");
    cr_assert_eq(em_op_call_lists(op, 1, in_1d, at, out), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "fused_adam_capturable: tensor 0 of input list 'lr' has shape");
    em_tensor *out_nostep[4] = {p[0], out[1], out[2], NULL};
    cr_assert_eq(em_op_call_lists(op, 1, in_ok, at, out_nostep), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "fused_adam_capturable: the steps list is required");
    cr_assert_eq(em_fill_(steps, -1), EM_OK);
    cr_assert_eq(em_op_call_lists(op, 1, in_ok, at, out), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "fused_adam_capturable: steps 0 is -1");
    cr_assert_eq(em_fill_(steps, 4), EM_OK);
    cr_assert_eq(em_op_call_lists(op, 1, in_ok, at, out), EM_OK, "%s", em_last_error());
    double sv = 0;
    cr_assert_eq(em_tensor_item(steps, &sv), EM_OK);
    cr_assert_eq(sv, 5, "the kernel counts the step: %g", sv);
    for (int j = 0; j < NP; j++) em_tensor_release(p[j]);
    em_tensor_release(b);
    em_scope_end();
}

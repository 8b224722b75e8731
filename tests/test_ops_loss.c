/*
 * test_ops_loss.c — the losses (cross_entropy, nll_loss, mse_loss, l1_loss, smooth_l1_loss,
 * binary_cross_entropy_with_logits) and their backward ops.
 *
 * References:
 *   - PyTorch 1.13's values (losses and autograd gradients), committed as
 *     tests/fixtures/loss_fixtures.h by tests/fixtures/gen_loss.py, for f32 and f64, each
 *     case run with contiguous, sliced (every other element of the last dim) and permuted
 *     (storage in reversed dim order, so the class dim is strided) operands.
 *   - A plain-loop reference in double written here (ref_loss), itself checked against the
 *     PyTorch fixtures, for f16/bf16 (from the same inputs rounded to the dtype, in all three
 *     layouts), for large
 *     inputs that take the multi-threaded paths, and for broadcast (stride 0) operands.
 *
 * Tolerances (|got - want| <= atol + rtol |want|; NaN matches NaN):
 *   f32 against PyTorch: rtol 1e-5, atol 1e-6; f64: rtol 1e-10, atol 1e-10.
 *   f16: rtol 2^-10, bf16: rtol 2^-7 (one rounding of the result, computed in f32), with atol
 *   4 FLT_EPSILON max(1, max|x|) for the f32 arithmetic on inputs as large as x.
 *   The reference against PyTorch: f32 cases rtol 1e-5 / atol 1e-6, f64 1e-10.
 *   Large f32 inputs against the reference: rtol 1e-5, atol 1e-6.
 *   Reduced pointwise losses on strided operands against their contiguous copies: bitwise.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/loss_fixtures.h"
#include "tests/common.h"

TestSuite(loss, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(loss_errors, .init = em_test_setup, .fini = em_test_teardown);

/* ---- helpers --------------------------------------------------------------------------------- */

typedef enum layout { CONTIG, SLICED, PERMUTED, N_LAYOUTS } layout;
static const char *const layout_names[] = {"contiguous", "sliced", "permuted"};

static int64_t numel_of(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n;
}

/* A tensor of dtype dt holding v (C order) in the given memory layout; owned by the caller's
 * scope. Gaps in sliced storage hold NaN (or 0 for integers), so reading them shows. */
static em_tensor *make(em_dtype dt, int nd, const int64_t *shape, const double *v, layout lay) {
    em_tensor *src = em_test_tensor(EM_F64, nd, shape, v);
    double gap = em_dtype_is_floating(dt) ? NAN : 0;
    em_tensor *dst;
    if (lay == SLICED && nd >= 1) {
        int64_t big[EM_MAX_DIMS];
        memcpy(big, shape, sizeof(int64_t) * (size_t)nd);
        big[nd - 1] *= 2;
        dst = em_slice(em_full(nd, big, gap, dt, em_cpu()), nd - 1, 1, big[nd - 1], 2);
    } else if (lay == PERMUTED && nd >= 2) {
        int64_t rev[EM_MAX_DIMS];
        int perm[EM_MAX_DIMS];
        for (int d = 0; d < nd; d++) rev[d] = shape[nd - 1 - d], perm[d] = nd - 1 - d;
        dst = em_permute(em_full(nd, rev, gap, dt, em_cpu()), nd, perm);
    } else {
        dst = em_empty(nd, shape, dt, em_cpu());
    }
    cr_assert(dst, "make: %s", em_last_error());
    cr_assert_eq(em_copy_(dst, src), EM_OK, "copy_: %s", em_last_error());
    if (lay != CONTIG && nd >= 2 && numel_of(nd, shape) > 1 && shape[nd - 1] > 1)
        cr_assert(!em_tensor_is_contiguous(dst));
    return dst;
}

/* All elements of t (C order) as doubles; free() it. */
static double *values(const em_tensor *t) {
    int64_t n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_tensor *d = em_to_dtype(t, EM_F64);
    cr_assert(d, "to_dtype: %s", em_last_error());
    cr_assert_eq(em_tensor_to_host(d, v, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    return v;
}

static bool close_to(double got, double want, double rtol, double atol) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static void expect_close(const em_tensor *got, int nd, const int64_t *shape, const double *want,
                         double rtol, double atol, const char *what, const char *name) {
    cr_assert(got, "%s %s: %s", name, what, em_last_error());
    cr_assert_eq(em_tensor_ndim(got), nd, "%s %s: %d dims, want %d", name, what,
                 em_tensor_ndim(got), nd);
    for (int d = 0; d < nd; d++)
        cr_assert_eq(em_tensor_shape(got)[d], shape[d], "%s %s: dim %d is %lld, want %lld", name,
                     what, d, (long long)em_tensor_shape(got)[d], (long long)shape[d]);
    int64_t n = numel_of(nd, shape);
    double *g = values(got);
    for (int64_t i = 0; i < n; i++)
        cr_expect(close_to(g[i], want[i], rtol, atol), "%s %s: element %lld is %.10g, want %.10g",
                  name, what, (long long)i, g[i], want[i]);
    free(g);
}

/* ---- the plain-loop reference, in double ------------------------------------------------------ */

/* The index in an operand of shape os (broadcast to xs) of element i of xs. */
static int64_t bidx(int xnd, const int64_t *xs, int ond, const int64_t *os, int64_t i) {
    int64_t off = 0, stride = 1;
    for (int d = xnd - 1; d >= 0; d--) {
        int64_t k = i % xs[d];
        i /= xs[d];
        int od = ond - xnd + d;
        if (od < 0) continue;
        if (os[od] != 1) off += k * stride;
        stride *= os[od];
    }
    return off;
}

/* Loss y (its numel: positions for NONE, else 1) and gradient gx for x, given gy. t holds
 * class indices or probabilities as doubles; w and pw may be NULL. */
static void ref_loss(const loss_fixture *f, const double *x, const double *t, const double *w,
                     const double *pw, const double *gy, double *y, double *gx) {
    int64_t nx = numel_of(f->x_ndim, f->x_shape);
    int red = f->reduction;
    if (strcmp(f->op, "cross_entropy") == 0 || strcmp(f->op, "nll_loss") == 0) {
        bool nll = f->op[0] == 'n', probs = !f->t_int;
        int64_t N = f->x_ndim == 1 ? 1 : f->x_shape[0];
        int64_t C = f->x_shape[f->x_ndim == 1 ? 0 : 1];
        int64_t L = C && N ? nx / (N * C) : 1;
        int64_t npos = N * L;
        double ls = nll ? 0 : f->label_smoothing, S = 0, W = 0, wall = 0;
        for (int64_t c = 0; c < C; c++) wall += w ? w[c] : 1;
        double *lse = malloc(sizeof(double) * (size_t)(npos ? npos : 1));
        for (int64_t p = 0; p < npos; p++) {
            int64_t n = p / L, l = p % L;
#define X(c) x[(n * C + (c)) * L + l]
            double m = -INFINITY, s = 0;
            for (int64_t c = 0; c < C; c++) m = fmax(m, X(c));
            for (int64_t c = 0; c < C; c++) s += exp(X(c) - m);
            lse[p] = m + log(s);
            double loss = 0;
            if (probs) {
                for (int64_t c = 0; c < C; c++) {
                    double yc = t[(n * C + c) * L + l] * (1 - ls) + ls / (double)C;
                    loss -= (w ? w[c] : 1) * yc * (X(c) - lse[p]);
                }
            } else if ((int64_t)t[p] != f->ignore_index) {
                int64_t k = (int64_t)t[p];
                double wk = w ? w[k] : 1;
                W += wk;
                if (nll) {
                    loss = -wk * X(k);
                } else {
                    loss = -(1 - ls) * wk * (X(k) - lse[p]);
                    for (int64_t c = 0; c < C; c++)
                        loss -= ls / (double)C * (w ? w[c] : 1) * (X(c) - lse[p]);
                }
            }
            if (red == 0) y[p] = loss;
            S += loss;
        }
        double denom = probs ? (double)npos : W;
        if (red == 1) y[0] = nx == 0 ? NAN : S / denom;
        if (red == 2) y[0] = S;
        for (int64_t p = 0; p < npos; p++) {
            int64_t n = p / L, l = p % L;
            double g = red == 0 ? gy[p] : red == 1 ? gy[0] / denom : gy[0];
            double sw = 0;
            if (probs)
                for (int64_t c = 0; c < C; c++)
                    sw += (w ? w[c] : 1) * (t[(n * C + c) * L + l] * (1 - ls) + ls / (double)C);
            for (int64_t c = 0; c < C; c++) {
                double pc = exp(X(c) - lse[p]), wc = w ? w[c] : 1, v;
                if (probs) {
                    double yc = t[(n * C + c) * L + l] * (1 - ls) + ls / (double)C;
                    v = g * (pc * sw - wc * yc);
                } else if ((int64_t)t[p] == f->ignore_index) {
                    v = 0;
                } else {
                    int64_t k = (int64_t)t[p];
                    double wk = w ? w[k] : 1;
                    if (nll) v = c == k ? -wk * g : 0;
                    else v = g * ((1 - ls) * wk * (pc - (c == k)) + ls / (double)C * (wall * pc - wc));
                }
                gx[(n * C + c) * L + l] = v;
            }
#undef X
        }
        free(lse);
        return;
    }
    double S = 0;
    for (int64_t i = 0; i < nx; i++) {
        double xi = x[i], ti = t[bidx(f->x_ndim, f->x_shape, f->t_ndim, f->t_shape, i)];
        double wi = w ? w[bidx(f->x_ndim, f->x_shape, f->w_ndim, f->w_shape, i)] : 1;
        double pwi = pw ? pw[bidx(f->x_ndim, f->x_shape, f->pw_ndim, f->pw_shape, i)] : 1;
        double d = xi - ti, beta = f->beta, loss, dl;
        if (strcmp(f->op, "mse_loss") == 0) {
            loss = d * d, dl = 2 * d;
        } else if (strcmp(f->op, "l1_loss") == 0) {
            loss = fabs(d), dl = (d > 0) - (d < 0);
        } else if (strcmp(f->op, "smooth_l1_loss") == 0) {
            loss = fabs(d) < beta ? 0.5 * d * d / beta : fabs(d) - 0.5 * beta;
            dl = d <= -beta ? -1 : d >= beta ? 1 : d / beta;
        } else {
            double m = fmax(-xi, 0), lw = pw ? 1 + (pwi - 1) * ti : 1;
            double sig = 1 / (1 + exp(-xi));
            loss = wi * ((1 - ti) * xi + lw * (log(exp(-m) + exp(-xi - m)) + m));
            dl = wi * (pw ? (pwi * ti + 1 - ti) * sig - pwi * ti : sig - ti);
        }
        if (red == 0) y[i] = loss;
        S += loss;
        gx[i] = dl * (red == 0 ? gy[i] : red == 1 ? gy[0] / (double)nx : gy[0]);
    }
    if (red == 1) y[0] = nx ? S / (double)nx : NAN;
    if (red == 2) y[0] = S;
}

/* ---- running a fixture ------------------------------------------------------------------------- */

static em_tensor *run_forward(const loss_fixture *f, const em_tensor *x, const em_tensor *t,
                              const em_tensor *w, const em_tensor *pw) {
    em_reduction r = (em_reduction)f->reduction;
    if (strcmp(f->op, "cross_entropy") == 0)
        return em_cross_entropy(x, t, w, r, f->ignore_index, f->label_smoothing);
    if (strcmp(f->op, "nll_loss") == 0) return em_nll_loss(x, t, w, r, f->ignore_index);
    if (strcmp(f->op, "mse_loss") == 0) return em_mse_loss(x, t, r);
    if (strcmp(f->op, "l1_loss") == 0) return em_l1_loss(x, t, r);
    if (strcmp(f->op, "smooth_l1_loss") == 0) return em_smooth_l1_loss(x, t, r, f->beta);
    return em_binary_cross_entropy_with_logits(x, t, w, pw, r);
}

static em_tensor *run_backward(const loss_fixture *f, const em_tensor *gy, const em_tensor *x,
                               const em_tensor *t, const em_tensor *w, const em_tensor *pw) {
    em_reduction r = (em_reduction)f->reduction;
    if (strcmp(f->op, "cross_entropy") == 0)
        return em_cross_entropy_backward(gy, x, t, w, r, f->ignore_index, f->label_smoothing);
    if (strcmp(f->op, "nll_loss") == 0) return em_nll_loss_backward(gy, x, t, w, r, f->ignore_index);
    if (strcmp(f->op, "mse_loss") == 0) return em_mse_loss_backward(gy, x, t, r);
    if (strcmp(f->op, "l1_loss") == 0) return em_l1_loss_backward(gy, x, t, r);
    if (strcmp(f->op, "smooth_l1_loss") == 0)
        return em_smooth_l1_loss_backward(gy, x, t, r, f->beta);
    return em_binary_cross_entropy_with_logits_backward(gy, x, t, w, pw, r);
}

typedef struct operands {
    em_tensor *x, *t, *w, *pw, *gy;
} operands;

/* The fixture's operands in dtype dt and layout lay (targets of class indices are int64). */
static operands make_operands(const loss_fixture *f, em_dtype dt, layout lay) {
    operands o;
    o.x = make(dt, f->x_ndim, f->x_shape, f->x, lay);
    o.t = make(f->t_int ? EM_I64 : dt, f->t_ndim, f->t_shape, f->t, lay);
    o.w = f->w ? make(dt, f->w_ndim, f->w_shape, f->w, lay) : NULL;
    o.pw = f->pw ? make(dt, f->pw_ndim, f->pw_shape, f->pw, lay) : NULL;
    o.gy = make(dt, f->y_ndim, f->y_shape, f->gy, lay);
    return o;
}

Test(loss, pytorch_fixtures) {
    for (int i = 0; i < N_LOSS_FIXTURES; i++) {
        const loss_fixture *f = &loss_fixtures[i];
        double rtol = f->dtype == EM_F32 ? 1e-5 : 1e-10, atol = f->dtype == EM_F32 ? 1e-6 : 1e-10;
        for (int lay = 0; lay < N_LAYOUTS; lay++) {
            cr_assert_eq(em_scope_begin(), EM_OK);
            char what[160];
            snprintf(what, sizeof what, "%s (%s)", f->name, layout_names[lay]);
            operands o = make_operands(f, f->dtype, (layout)lay);
            em_tensor *y = run_forward(f, o.x, o.t, o.w, o.pw);
            expect_close(y, f->y_ndim, f->y_shape, f->y, rtol, atol, "loss", what);
            cr_assert_eq(em_tensor_dtype(y), f->dtype, "%s: loss dtype %s", what,
                         em_dtype_name(em_tensor_dtype(y)));
            em_tensor *gx = run_backward(f, o.gy, o.x, o.t, o.w, o.pw);
            expect_close(gx, f->x_ndim, f->x_shape, f->gx, rtol, atol, "grad", what);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
    }
}

/* The reference used below agrees with PyTorch on every fixture. */
Test(loss, reference_matches_pytorch) {
    for (int i = 0; i < N_LOSS_FIXTURES; i++) {
        const loss_fixture *f = &loss_fixtures[i];
        double tol = f->dtype == EM_F32 ? 1e-5 : 1e-10;
        int64_t nx = numel_of(f->x_ndim, f->x_shape), ny = numel_of(f->y_ndim, f->y_shape);
        double *y = malloc(sizeof(double) * (size_t)ny), *gx = malloc(sizeof(double) * (size_t)nx);
        ref_loss(f, f->x, f->t, f->w, f->pw, f->gy, y, gx);
        for (int64_t k = 0; k < ny; k++)
            cr_expect(close_to(y[k], f->y[k], tol, tol), "%s: reference loss %lld is %.10g, "
                      "PyTorch %.10g", f->name, (long long)k, y[k], f->y[k]);
        for (int64_t k = 0; k < nx; k++)
            cr_expect(close_to(gx[k], f->gx[k], tol, tol), "%s: reference grad %lld is %.10g, "
                      "PyTorch %.10g", f->name, (long long)k, gx[k], f->gx[k]);
        free(y);
        free(gx);
    }
}

/* Values of t read back (rounded to its dtype), or NULL for NULL. */
static double *rounded(const em_tensor *t) { return t ? values(t) : NULL; }

/* f16 and bf16 against the reference computed from the same rounded inputs, in every
 * layout. */
Test(loss, half_and_bfloat16) {
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    for (int i = 0; i < N_LOSS_FIXTURES; i++) {
        const loss_fixture *f = &loss_fixtures[i];
        if (f->dtype != EM_F32) continue;
        for (int kl = 0; kl < 2 * N_LAYOUTS; kl++) {
            em_dtype dt = dts[kl % 2];
            layout lay = (layout)(kl / 2);
            cr_assert_eq(em_scope_begin(), EM_OK);
            char what[160];
            snprintf(what, sizeof what, "%s (%s, %s)", f->name, em_dtype_name(dt),
                     layout_names[lay]);
            operands o = make_operands(f, dt, lay);
            double *x = rounded(o.x), *t = rounded(o.t), *w = rounded(o.w), *pw = rounded(o.pw),
                   *gy = rounded(o.gy);
            int64_t nx = numel_of(f->x_ndim, f->x_shape), ny = numel_of(f->y_ndim, f->y_shape);
            double *y = malloc(sizeof(double) * (size_t)ny), *gx = malloc(sizeof(double) * (size_t)nx);
            ref_loss(f, x, t, w, pw, gy, y, gx);
            double xmax = 1;
            for (int64_t j = 0; j < nx; j++) xmax = fmax(xmax, fabs(x[j]));
            double rtol = dt == EM_F16 ? 0x1p-10 : 0x1p-7, atol = 4 * FLT_EPSILON * xmax;
            em_tensor *ly = run_forward(f, o.x, o.t, o.w, o.pw);
            expect_close(ly, f->y_ndim, f->y_shape, y, rtol, atol, "loss", what);
            cr_assert_eq(em_tensor_dtype(ly), dt);
            em_tensor *lg = run_backward(f, o.gy, o.x, o.t, o.w, o.pw);
            expect_close(lg, f->x_ndim, f->x_shape, gx, rtol, atol, "grad", what);
            free(x), free(t), free(w), free(pw), free(gy), free(y), free(gx);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
    }
}

/* ---- large inputs (the multi-threaded paths), broadcast operands ---------------------------- */

static double *pattern(int64_t n, int seed, double scale) {
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v[i] = ((double)(s >> 11) / 9007199254740992.0 - 0.5) * scale;
    }
    return v;
}

/* Ember against the reference for a fixture-like case built here (f32 or f64). */
static void check_case(const loss_fixture *f, layout lay, double rtol, double atol) {
    int64_t nx = numel_of(f->x_ndim, f->x_shape), ny = numel_of(f->y_ndim, f->y_shape);
    double *y = malloc(sizeof(double) * (size_t)ny), *gx = malloc(sizeof(double) * (size_t)nx);
    ref_loss(f, f->x, f->t, f->w, f->pw, f->gy, y, gx);
    cr_assert_eq(em_scope_begin(), EM_OK);
    operands o = make_operands(f, f->dtype, lay);
    expect_close(run_forward(f, o.x, o.t, o.w, o.pw), f->y_ndim, f->y_shape, y, rtol, atol,
                 "loss", f->name);
    expect_close(run_backward(f, o.gy, o.x, o.t, o.w, o.pw), f->x_ndim, f->x_shape, gx, rtol,
                 atol, "grad", f->name);
    cr_assert_eq(em_scope_end(), EM_OK);
    free(y);
    free(gx);
}

Test(loss, large_inputs_threaded) {
    em_set_num_threads(2);
    const int64_t N = 1500, C = 40, L = 3;
    double *x = pattern(N * C * L, 1, 8), *probs = pattern(N * C * L, 2, 1), *w = pattern(C, 3, 1);
    double *t = malloc(sizeof(double) * (size_t)(N * L)), *gy = pattern(N * L, 4, 2);
    for (int64_t i = 0; i < N * L; i++) t[i] = i % 7 == 0 ? -100 : (double)((i * 13) % C);
    for (int64_t i = 0; i < N * C * L; i++) probs[i] = fabs(probs[i]);
    for (int64_t c = 0; c < C; c++) w[c] = fabs(w[c]) + 0.1;
    for (int red = 0; red < 3; red++) {
        loss_fixture ce = {.name = "large ce", .op = "cross_entropy", .dtype = EM_F32,
                           .reduction = red, .ignore_index = -100, .label_smoothing = 0.1,
                           .x_ndim = 3, .x_shape = {N, C, L}, .x = x,
                           .t_ndim = 2, .t_shape = {N, L}, .t_int = 1, .t = t,
                           .w_ndim = 1, .w_shape = {C}, .w = w, .pw_ndim = -1,
                           .y_ndim = red ? 0 : 2, .y_shape = {N, L}, .gy = gy};
        check_case(&ce, CONTIG, 1e-5, 1e-6);
        check_case(&ce, PERMUTED, 1e-5, 1e-6);
        loss_fixture pr = ce;
        pr.name = "large ce probs";
        pr.t_ndim = 3, pr.t_shape[1] = C, pr.t_shape[2] = L, pr.t_int = 0, pr.t = probs;
        check_case(&pr, CONTIG, 1e-5, 1e-6);
        loss_fixture nll = ce;
        nll.name = "large nll", nll.op = "nll_loss", nll.dtype = EM_F64;
        check_case(&nll, SLICED, 1e-10, 1e-10);
        const char *ops[4] = {"mse_loss", "l1_loss", "smooth_l1_loss", "bce_with_logits"};
        for (int k = 0; k < 4; k++) {
            loss_fixture pw = {.name = ops[k], .op = ops[k], .dtype = EM_F32, .reduction = red,
                               .beta = 0.5, .x_ndim = 2, .x_shape = {N * L, C}, .x = x,
                               .t_ndim = 2, .t_shape = {N * L, C}, .t = probs,
                               .w_ndim = k == 3 ? 2 : -1, .w_shape = {N * L, 1}, .w = k == 3 ? gy : NULL,
                               .pw_ndim = k == 3 ? 1 : -1, .pw_shape = {C}, .pw = k == 3 ? w : NULL,
                               .y_ndim = red ? 0 : 2, .y_shape = {N * L, C}, .gy = probs};
            check_case(&pw, CONTIG, 1e-5, 1e-6);
            check_case(&pw, SLICED, 1e-5, 1e-6);
        }
    }
    free(x), free(probs), free(w), free(t), free(gy);
}

/* float32 rows of contiguous classes (the vector exp path on AVX2 / AVX-512: whole vectors
 * and a tail, C = 37 and 16), with and without weights and label smoothing, ignored targets,
 * one row of logits that overflow expf unless shifted by the max, on one thread and two. */
Test(loss, ce_rows_f32_vector) {
    const int64_t Cs[2] = {37, 16};
    for (int nt = 1; nt <= 2; nt++) {
        em_set_num_threads(nt);
        for (int ci = 0; ci < 2; ci++) {
            const int64_t N = 300, C = Cs[ci];
            double *x = pattern(N * C, 5 + ci, 12), *w = pattern(C, 6, 1), *gy = pattern(N, 7, 2);
            double *t = malloc(sizeof(double) * (size_t)N);
            for (int64_t c = 0; c < C; c++) x[3 * C + c] = c % 3 == 0 ? 100 : -100;
            for (int64_t i = 0; i < N; i++) t[i] = i % 11 == 0 ? -100 : (double)((i * 7) % C);
            for (int64_t c = 0; c < C; c++) w[c] = fabs(w[c]) + 0.1;
            for (int red = 0; red < 3; red++)
                for (int k = 0; k < 4; k++) {
                    loss_fixture ce = {.name = "ce rows f32", .op = "cross_entropy",
                                       .dtype = EM_F32, .reduction = red, .ignore_index = -100,
                                       .label_smoothing = k & 1 ? 0.1 : 0.0,
                                       .x_ndim = 2, .x_shape = {N, C}, .x = x,
                                       .t_ndim = 1, .t_shape = {N}, .t_int = 1, .t = t,
                                       .w_ndim = k & 2 ? 1 : -1, .w_shape = {C},
                                       .w = k & 2 ? w : NULL, .pw_ndim = -1,
                                       .y_ndim = red ? 0 : 1, .y_shape = {N}, .gy = gy};
                    check_case(&ce, CONTIG, 1e-5, 1e-6);
                }
            free(x), free(w), free(t), free(gy);
        }
    }
}

/* Broadcast (stride-0) and strided views: an expanded input row, an expanded target, a
 * weight that is every other element of a longer tensor. */
Test(loss, broadcast_operands) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    double xr[6] = {0.5, -1.25, 2, 0.75, -3, 1}, wv[12] = {0.5, 9, 1, 9, 1.5, 9, 2, 9, 0.25, 9, 3, 9};
    int64_t s16[2] = {1, 6}, s12[1] = {12}, s4x6[2] = {4, 6}, s1[1] = {1}, s4[1] = {4};
    em_tensor *x = em_expand(em_test_tensor(EM_F64, 2, s16, xr), 2, s4x6); /* (4, 6), stride 0 */
    em_tensor *t = em_expand(em_test_tensor(EM_I64, 1, s1, (double[]){4}), 1, s4);
    em_tensor *w = em_slice(em_test_tensor(EM_F64, 1, s12, wv), 0, 0, 12, 2); /* 0.5 1 1.5 2 .25 3 */
    double xd[24], td[4] = {4, 4, 4, 4}, wd[6] = {0.5, 1, 1.5, 2, 0.25, 3}, gy = 1.5;
    for (int i = 0; i < 24; i++) xd[i] = xr[i % 6];
    loss_fixture f = {.name = "ce broadcast", .op = "cross_entropy", .dtype = EM_F64,
                      .reduction = 1, .ignore_index = -100, .label_smoothing = 0.25,
                      .x_ndim = 2, .x_shape = {4, 6}, .x = xd, .t_ndim = 1, .t_shape = {4},
                      .t_int = 1, .t = td, .w_ndim = 1, .w_shape = {6}, .w = wd, .pw_ndim = -1,
                      .y_ndim = 0, .gy = &gy};
    double y, gx[24];
    ref_loss(&f, xd, td, wd, NULL, &gy, &y, gx);
    em_tensor *g = em_scalar(gy, EM_F64);
    expect_close(em_cross_entropy(x, t, w, EM_REDUCTION_MEAN, -100, 0.25), 0, NULL, &y, 1e-12,
                 1e-12, "loss", f.name);
    expect_close(em_cross_entropy_backward(g, x, t, w, EM_REDUCTION_MEAN, -100, 0.25), 2, s4x6,
                 gx, 1e-12, 1e-12, "grad", f.name);
    /* mse with an expanded input and a target broadcast from (6): the grad has (4, 6). */
    em_tensor *y6 = em_test_tensor(EM_F32, 1, (int64_t[]){6}, wd);
    double want = 0, gwant[24];
    for (int i = 0; i < 24; i++) want += (xd[i] - wd[i % 6]) * (xd[i] - wd[i % 6]);
    for (int i = 0; i < 24; i++) gwant[i] = 2 * (xd[i] - wd[i % 6]) * gy;
    expect_close(em_mse_loss(x, y6, EM_REDUCTION_SUM), 0, NULL, &want, 1e-12, 1e-12, "mse",
                 "broadcast");
    cr_assert_eq(em_tensor_dtype(em_mse_loss(x, y6, EM_REDUCTION_SUM)), EM_F64); /* promoted */
    expect_close(em_mse_loss_backward(g, x, y6, EM_REDUCTION_SUM), 2, s4x6, gwant, 1e-12, 1e-12,
                 "mse grad", "broadcast");
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* Logits of +-1e4 give finite losses and gradients (checked against PyTorch in the fixtures;
 * here across every dtype and reduction). */
Test(loss, extreme_logits_finite) {
    const em_dtype dts[4] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    double xv[6] = {1e4, -1e4, 0, -1e4, 1e4, -1e4}, pv[6] = {0, 1, 0, 0.5, 0.25, 0.25};
    int64_t s23[2] = {2, 3}, s2[1] = {2};
    for (int k = 0; k < 4; k++)
        for (int red = 0; red < 3; red++) {
            cr_assert_eq(em_scope_begin(), EM_OK);
            em_tensor *x = em_test_tensor(dts[k], 2, s23, xv);
            em_tensor *t = em_test_tensor(EM_I64, 1, s2, (double[]){1, 2});
            em_tensor *p = em_test_tensor(dts[k], 2, s23, pv);
            em_tensor *g = red ? em_scalar(1, dts[k]) : em_test_tensor(dts[k], 1, s2, (double[]){1, 1});
            em_tensor *r[6] = {
                em_cross_entropy(x, t, NULL, (em_reduction)red, -100, 0.1),
                em_cross_entropy_backward(g, x, t, NULL, (em_reduction)red, -100, 0.1),
                em_cross_entropy(x, p, NULL, (em_reduction)red, -100, 0.1),
                em_cross_entropy_backward(g, x, p, NULL, (em_reduction)red, -100, 0.1),
                em_binary_cross_entropy_with_logits(x, p, NULL, p, (em_reduction)red),
                em_binary_cross_entropy_with_logits_backward(
                    red ? g : em_ones(2, s23, dts[k], em_cpu()), x, p, NULL, p, (em_reduction)red)};
            for (int j = 0; j < 6; j++) {
                cr_assert(r[j], "%s red %d result %d: %s", em_dtype_name(dts[k]), red, j,
                          em_last_error());
                double *v = values(r[j]);
                for (int64_t e = 0; e < em_tensor_numel(r[j]); e++)
                    cr_expect(isfinite(v[e]), "%s red %d result %d element %lld is %g",
                              em_dtype_name(dts[k]), red, j, (long long)e, v[e]);
                free(v);
            }
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* ---- empty tensors --------------------------------------------------------------------------- */

/* Every loss and its backward on empty operands in every floating dtype (the f32/f64 values
 * are checked above): the reduced losses are NaN (mean) or 0 (sum) of the input's dtype. */
Test(loss, empty_tensors_every_float_dtype) {
    const em_dtype dts[4] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    int64_t s04[2] = {0, 4}, s40[2] = {4, 0}, s0[1] = {0};
    double nan = NAN, zero = 0;
    for (int k = 0; k < 4; k++) {
        em_dtype dt = dts[k];
        const char *name = em_dtype_name(dt);
        cr_assert_eq(em_scope_begin(), EM_OK);
        /* a transposed empty input: non-contiguous too */
        em_tensor *x = em_transpose(em_zeros(2, s40, dt, em_cpu()), 0, 1);
        em_tensor *t = em_zeros(1, s0, EM_I64, em_cpu()), *g1 = em_scalar(1, dt);
        em_tensor *w = em_ones(1, (int64_t[]){4}, dt, em_cpu());
        em_tensor *ce = em_cross_entropy(x, t, w, EM_REDUCTION_MEAN, -100, 0.1);
        expect_close(ce, 0, NULL, &nan, 0, 0, "mean", name);
        cr_assert_eq(em_tensor_dtype(ce), dt);
        expect_close(em_cross_entropy(x, x, NULL, EM_REDUCTION_SUM, -100, 0), 0, NULL, &zero, 0, 0,
                     "ce probs sum", name);
        expect_close(em_cross_entropy_backward(g1, x, t, w, EM_REDUCTION_MEAN, -100, 0.1), 2, s04,
                     NULL, 0, 0, "ce grad", name);
        expect_close(em_nll_loss(x, t, w, EM_REDUCTION_NONE, -100), 1, s0, NULL, 0, 0, "nll none",
                     name);
        expect_close(em_nll_loss_backward(g1, x, t, NULL, EM_REDUCTION_MEAN, -100), 2, s04, NULL,
                     0, 0, "nll grad", name);
        em_tensor *(*pointwise[2])(const em_tensor *, const em_tensor *, em_reduction) = {
            em_mse_loss, em_l1_loss};
        for (int p = 0; p < 2; p++) {
            em_tensor *m = pointwise[p](x, x, EM_REDUCTION_MEAN);
            expect_close(m, 0, NULL, &nan, 0, 0, "pointwise mean", name);
            cr_assert_eq(em_tensor_dtype(m), dt);
            expect_close(pointwise[p](x, x, EM_REDUCTION_SUM), 0, NULL, &zero, 0, 0,
                         "pointwise sum", name);
        }
        expect_close(em_mse_loss_backward(g1, x, x, EM_REDUCTION_MEAN), 2, s04, NULL, 0, 0,
                     "mse grad", name);
        expect_close(em_l1_loss_backward(g1, x, x, EM_REDUCTION_SUM), 2, s04, NULL, 0, 0,
                     "l1 grad", name);
        expect_close(em_smooth_l1_loss(x, x, EM_REDUCTION_SUM, 0.5), 0, NULL, &zero, 0, 0,
                     "smooth_l1 sum", name);
        expect_close(em_smooth_l1_loss_backward(g1, x, x, EM_REDUCTION_MEAN, 0.5), 2, s04, NULL,
                     0, 0, "smooth_l1 grad", name);
        expect_close(em_binary_cross_entropy_with_logits(x, x, NULL, w, EM_REDUCTION_MEAN), 0,
                     NULL, &nan, 0, 0, "bce mean", name);
        expect_close(em_binary_cross_entropy_with_logits_backward(g1, x, x, NULL, w,
                                                                  EM_REDUCTION_SUM),
                     2, s04, NULL, 0, 0, "bce grad", name);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(loss, empty_tensors) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s04[2] = {0, 4}, s0[1] = {0};
    em_tensor *x = em_zeros(2, s04, EM_F32, em_cpu()), *t = em_zeros(1, s0, EM_I64, em_cpu());
    em_tensor *p = em_zeros(2, s04, EM_F32, em_cpu()), *g1 = em_scalar(1, EM_F32);
    double nan = NAN, zero = 0;
    expect_close(em_cross_entropy(x, t, NULL, EM_REDUCTION_MEAN, -100, 0), 0, NULL, &nan, 0, 0,
                 "mean", "ce empty");
    expect_close(em_cross_entropy(x, t, NULL, EM_REDUCTION_SUM, -100, 0.1), 0, NULL, &zero, 0, 0,
                 "sum", "ce empty");
    expect_close(em_cross_entropy(x, t, NULL, EM_REDUCTION_NONE, -100, 0), 1, s0, NULL, 0, 0,
                 "none", "ce empty");
    expect_close(em_cross_entropy(x, p, NULL, EM_REDUCTION_MEAN, -100, 0), 0, NULL, &nan, 0, 0,
                 "mean", "ce probs empty");
    expect_close(em_cross_entropy_backward(g1, x, t, NULL, EM_REDUCTION_MEAN, -100, 0), 2, s04,
                 NULL, 0, 0, "grad", "ce empty");
    expect_close(em_nll_loss(x, t, NULL, EM_REDUCTION_MEAN, -100), 0, NULL, &nan, 0, 0, "mean",
                 "nll empty");
    expect_close(em_nll_loss_backward(g1, x, t, NULL, EM_REDUCTION_SUM, -100), 2, s04, NULL, 0, 0,
                 "grad", "nll empty");
    em_tensor *e = em_zeros(1, s0, EM_F64, em_cpu()), *g64 = em_scalar(1, EM_F64);
    expect_close(em_mse_loss(e, e, EM_REDUCTION_MEAN), 0, NULL, &nan, 0, 0, "mean", "mse empty");
    expect_close(em_l1_loss(e, e, EM_REDUCTION_SUM), 0, NULL, &zero, 0, 0, "sum", "l1 empty");
    expect_close(em_smooth_l1_loss(e, e, EM_REDUCTION_NONE, 1), 1, s0, NULL, 0, 0, "none",
                 "smooth_l1 empty");
    expect_close(em_binary_cross_entropy_with_logits(e, e, NULL, NULL, EM_REDUCTION_MEAN), 0, NULL,
                 &nan, 0, 0, "mean", "bce empty");
    expect_close(em_mse_loss_backward(g64, e, e, EM_REDUCTION_MEAN), 1, s0, NULL, 0, 0, "grad",
                 "mse empty");
    expect_close(em_binary_cross_entropy_with_logits_backward(g64, e, e, NULL, NULL,
                                                              EM_REDUCTION_MEAN),
                 1, s0, NULL, 0, 0, "grad", "bce empty");
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* ---- determinism, defaults, parsing ------------------------------------------------------------ */

static double item_of(const em_tensor *t) {
    cr_assert(t, "%s", em_last_error());
    double v;
    cr_assert_eq(em_tensor_item(t, &v), EM_OK, "%s", em_last_error());
    return v;
}

Test(loss, deterministic_across_thread_counts) {
    em_set_deterministic(true);
    int64_t shape[2] = {4096, 16}, ts[1] = {4096};
    double *xv = pattern(4096 * 16, 5, 6), *yv = pattern(4096 * 16, 6, 6);
    double *tv = malloc(sizeof(double) * 4096);
    for (int i = 0; i < 4096; i++) tv[i] = i % 16;
    double got[2][3];
    for (int nt = 1; nt <= 2; nt++) {
        em_set_num_threads(nt);
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *x = em_test_tensor(EM_F32, 2, shape, xv), *t = em_test_tensor(EM_I64, 1, ts, tv);
        em_tensor *y = em_test_tensor(EM_F32, 2, shape, yv);
        got[nt - 1][0] = item_of(em_cross_entropy(x, t, NULL, EM_REDUCTION_MEAN, -100, 0.1));
        got[nt - 1][1] = item_of(em_mse_loss(x, y, EM_REDUCTION_SUM));
        got[nt - 1][2] = item_of(em_binary_cross_entropy_with_logits(x, x, NULL, NULL,
                                                                     EM_REDUCTION_MEAN));
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    for (int k = 0; k < 3; k++)
        cr_expect(memcmp(&got[0][k], &got[1][k], sizeof(double)) == 0,
                  "result %d differs: %.17g with 1 thread, %.17g with 2", k, got[0][k], got[1][k]);
    free(xv);
    free(yv);
    free(tv);
}

/* A reduced pointwise loss (mse, l1, smooth_l1, bce_with_logits with and without weights)
 * gives the same bits on strided operands — every other column of a wider tensor, a
 * transposed view — as on their contiguous copies: the CPU kernel sums in an order fixed by
 * the elements' indices, not by their strides. Small (one thread, a tail shorter than the
 * kernel's lanes) and large (two threads) inputs, f32 and f64, sum and mean. */
static double pw_reduced(int k, const em_tensor *x, const em_tensor *y, const em_tensor *w,
                         const em_tensor *pw, em_reduction red) {
    switch (k) {
    case 0: return item_of(em_mse_loss(x, y, red));
    case 1: return item_of(em_l1_loss(x, y, red));
    case 2: return item_of(em_smooth_l1_loss(x, y, red, 0.5));
    default: return item_of(em_binary_cross_entropy_with_logits(x, y, w, pw, red));
    }
}

Test(loss, pointwise_sum_layout_independent) {
    em_set_num_threads(2);
    const char *names[5] = {"mse_loss", "l1_loss", "smooth_l1_loss", "bce_with_logits",
                            "bce_with_logits (weight, pos_weight)"};
    const int64_t sizes[2][2] = {{5, 7}, {300, 131}}; /* 39300 >= CPU_GRAIN: two threads */
    const em_dtype dts[2] = {EM_F32, EM_F64};
    for (int sz = 0; sz < 2; sz++)
        for (int d = 0; d < 2; d++) {
            const int64_t R = sizes[sz][0], C = sizes[sz][1];
            cr_assert_eq(em_scope_begin(), EM_OK);
            double *xv = pattern(R * 2 * C, 7, 6), *yv = pattern(R * C, 8, 1);
            double *wv = pattern(R, 9, 1), *pv = pattern(C, 10, 1);
            for (int64_t i = 0; i < R; i++) wv[i] = fabs(wv[i]) + 0.25;
            for (int64_t i = 0; i < C; i++) pv[i] = fabs(pv[i]) + 0.5;
            int64_t wide[2] = {R, 2 * C}, rc[2] = {R, C}, cr[2] = {C, R}, r1[2] = {R, 1},
                    c1[1] = {C};
            /* x: every other column of (R, 2C); y: the transpose of a contiguous (C, R) */
            em_tensor *xs = em_slice(em_test_tensor(dts[d], 2, wide, xv), 1, 0, 2 * C, 2);
            em_tensor *ys = em_transpose(em_test_tensor(dts[d], 2, cr, yv), 0, 1);
            em_tensor *xc = em_contiguous(xs), *yc = em_contiguous(ys);
            em_tensor *w = em_test_tensor(dts[d], 2, r1, wv), *pw = em_test_tensor(dts[d], 1, c1, pv);
            cr_assert(xs && ys && xc && yc && w && pw, "%s", em_last_error());
            cr_assert(!em_tensor_is_contiguous(xs) && !em_tensor_is_contiguous(ys));
            cr_assert_eq(em_tensor_shape(ys)[0], rc[0]);
            for (int k = 0; k < 5; k++)
                for (int red = 1; red <= 2; red++) {
                    const em_tensor *kw = k == 4 ? w : NULL, *kp = k == 4 ? pw : NULL;
                    double strided = pw_reduced(k, xs, ys, kw, kp, (em_reduction)red);
                    double contig = pw_reduced(k, xc, yc, kw, kp, (em_reduction)red);
                    double mixed = pw_reduced(k, xs, yc, kw, kp, (em_reduction)red);
                    cr_expect(memcmp(&strided, &contig, sizeof strided) == 0 &&
                                  memcmp(&mixed, &contig, sizeof mixed) == 0,
                              "%s %s, reduction %s, (%lld, %lld): strided operands give "
                              "%.17g, contiguous copies %.17g, a strided input with a "
                              "contiguous target %.17g",
                              names[k], em_dtype_name(dts[d]), red == 1 ? "mean" : "sum",
                              (long long)R, (long long)C, strided, contig, mixed);
                }
            free(xv), free(yv), free(wv), free(pv);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* The ops called directly with absent attributes take PyTorch's defaults (mean, -100, 0, 1). */
Test(loss, op_defaults) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s23[2] = {2, 3}, s2[1] = {2}, s0[1] = {0};
    em_tensor *x = em_test_tensor(EM_F64, 2, s23, (double[]){1, 2, 3, -1, 0.5, 4});
    em_tensor *t = em_test_tensor(EM_I64, 1, s2, (double[]){2, -100});
    em_tensor *none = em_empty(1, s0, EM_F64, em_cpu());
    const em_tensor *in[3] = {x, t, none};
    em_tensor *out[1] = {NULL};
    cr_assert_eq(em_op_call(em_op_find("cross_entropy"), in, 3, NULL, out), EM_OK, "%s",
                 em_last_error());
    double want = em_item(em_cross_entropy(x, t, NULL, EM_REDUCTION_MEAN, -100, 0));
    cr_expect_eq(em_item(out[0]), want);
    cr_expect(fabs(want - (log(exp(1) + exp(2) + exp(3)) - 3)) < 1e-12, "mean of one sample: %g",
              want);
    em_tensor *y = em_test_tensor(EM_F64, 2, s23, (double[]){1, 1, 1, 1, 1, 1});
    const em_tensor *in2[2] = {x, y};
    cr_assert_eq(em_op_call(em_op_find("smooth_l1_loss"), in2, 2, NULL, out), EM_OK);
    cr_expect_eq(em_item(out[0]), em_item(em_smooth_l1_loss(x, y, EM_REDUCTION_MEAN, 1.0)));
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(loss, reduction_parse) {
    em_reduction r = EM_REDUCTION_NONE;
    cr_expect_eq(em_reduction_parse("mean", &r), EM_OK);
    cr_expect_eq(r, EM_REDUCTION_MEAN);
    cr_expect_eq(em_reduction_parse("sum", &r), EM_OK);
    cr_expect_eq(r, EM_REDUCTION_SUM);
    cr_expect_eq(em_reduction_parse("none", &r), EM_OK);
    cr_expect_eq(r, EM_REDUCTION_NONE);
    cr_expect_eq(em_reduction_parse("avg", &r), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "'avg' is not one of 'none', 'mean', 'sum'");
}

/* ---- errors ----------------------------------------------------------------------------------- */

#define EXPECT_FAIL(call, status, needle)                                                      \
    do {                                                                                       \
        em_clear_error();                                                                      \
        cr_expect_null(call, #call " succeeded");                                              \
        em_assert_error(status, needle);                                                       \
    } while (0)

Test(loss_errors, class_losses) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s32x10[2] = {32, 10}, s16[1] = {16}, s45[2] = {4, 5}, s4[1] = {4}, s3[1] = {3};
    em_tensor *x = em_zeros(2, s32x10, EM_F32, em_cpu()), *t16 = em_zeros(1, s16, EM_I64, em_cpu());
    EXPECT_FAIL(em_cross_entropy(x, t16, NULL, EM_REDUCTION_MEAN, -100, 0), EM_ERR_SHAPE,
                "cross_entropy: target batch size 16 does not match input batch size 32");
    EXPECT_FAIL(em_nll_loss(x, t16, NULL, EM_REDUCTION_MEAN, -100), EM_ERR_SHAPE,
                "nll_loss: target batch size 16 does not match input batch size 32");
    em_tensor *x45 = em_zeros(2, s45, EM_F32, em_cpu());
    em_tensor *bad = em_test_tensor(EM_I64, 1, s4, (double[]){0, 7, 1, 2});
    EXPECT_FAIL(em_cross_entropy(x45, bad, NULL, EM_REDUCTION_MEAN, -100, 0), EM_ERR_RANGE,
                "cross_entropy: target class index 7 is out of range [0, 5)");
    em_tensor *neg = em_test_tensor(EM_I64, 1, s4, (double[]){0, 1, -1, 2});
    EXPECT_FAIL(em_nll_loss(x45, neg, NULL, EM_REDUCTION_SUM, -100), EM_ERR_RANGE,
                "nll_loss: target class index -1 is out of range [0, 5)");
    EXPECT_FAIL(em_cross_entropy_backward(em_scalar(1, EM_F32), x45, bad, NULL,
                                          EM_REDUCTION_MEAN, -100, 0),
                EM_ERR_RANGE, "cross_entropy_backward: target class index 7");
    /* ignore_index inside [0, C) is simply ignored; outside, it may be anything */
    em_tensor *ign = em_test_tensor(EM_I64, 1, s4, (double[]){0, 7, 7, 2});
    cr_expect_not_null(em_cross_entropy(x45, ign, NULL, EM_REDUCTION_MEAN, 7, 0), "%s",
                       em_last_error());
    em_tensor *t32 = em_test_tensor(EM_I32, 1, s4, (double[]){0, 1, 2, 3});
    EXPECT_FAIL(em_cross_entropy(x45, t32, NULL, EM_REDUCTION_MEAN, -100, 0), EM_ERR_DTYPE,
                "cross_entropy: target has dtype int32; expected int64 class indices or floating "
                "class probabilities");
    em_tensor *tf = em_zeros(1, s4, EM_F32, em_cpu());
    EXPECT_FAIL(em_nll_loss(x45, tf, NULL, EM_REDUCTION_MEAN, -100), EM_ERR_DTYPE,
                "nll_loss: target has dtype float32; expected int64 class indices");
    em_tensor *t4 = em_test_tensor(EM_I64, 1, s4, (double[]){0, 1, 2, 3});
    EXPECT_FAIL(em_cross_entropy(x45, t4, em_ones(1, s3, EM_F32, em_cpu()), EM_REDUCTION_MEAN,
                                 -100, 0),
                EM_ERR_SHAPE, "cross_entropy: weight of shape [3] must have one entry per class (5)");
    EXPECT_FAIL(em_cross_entropy(x45, t4, em_ones(1, (int64_t[]){5}, EM_F64, em_cpu()),
                                 EM_REDUCTION_MEAN, -100, 0),
                EM_ERR_DTYPE, "cross_entropy: weight has dtype float64; expected the input's dtype "
                "float32");
    EXPECT_FAIL(em_cross_entropy(x45, t4, NULL, EM_REDUCTION_MEAN, -100, 1.5), EM_ERR_INVALID,
                "cross_entropy: label_smoothing must be in [0, 1], got 1.5");
    EXPECT_FAIL(em_cross_entropy(x45, t4, NULL, (em_reduction)7, -100, 0), EM_ERR_INVALID,
                "cross_entropy: reduction 7 is not one of");
    EXPECT_FAIL(em_cross_entropy(x45, em_zeros(2, (int64_t[]){4, 6}, EM_F32, em_cpu()), NULL,
                                 EM_REDUCTION_MEAN, -100, 0),
                EM_ERR_SHAPE, "cross_entropy: probability target of shape [4, 6] must have the "
                "input's shape [4, 5]");
    em_tensor *x3 = em_zeros(3, (int64_t[]){2, 4, 5}, EM_F32, em_cpu());
    EXPECT_FAIL(em_cross_entropy(x3, em_zeros(2, (int64_t[]){2, 6}, EM_I64, em_cpu()), NULL,
                                 EM_REDUCTION_MEAN, -100, 0),
                EM_ERR_SHAPE, "cross_entropy: target of shape [2, 6] does not fit input of shape "
                "[2, 4, 5]: expected target shape [2, 5]");
    EXPECT_FAIL(em_cross_entropy(em_scalar(1, EM_F32), em_scalar(0, EM_I64), NULL,
                                 EM_REDUCTION_MEAN, -100, 0),
                EM_ERR_SHAPE, "cross_entropy: input must have 1 or more dims");
    EXPECT_FAIL(em_cross_entropy(em_zeros(2, s45, EM_I64, em_cpu()), t4, NULL, EM_REDUCTION_MEAN,
                                 -100, 0),
                EM_ERR_DTYPE, "cross_entropy: input must be floating, got int64");
    /* backward: the grad must have the loss's shape */
    EXPECT_FAIL(em_cross_entropy_backward(em_zeros(1, s3, EM_F32, em_cpu()), x45, t4, NULL,
                                          EM_REDUCTION_NONE, -100, 0),
                EM_ERR_SHAPE, "cross_entropy_backward: grad of shape [3] does not match the "
                "loss's shape [4] (reduction none)");
    EXPECT_FAIL(em_nll_loss_backward(em_zeros(1, s4, EM_F32, em_cpu()), x45, t4, NULL,
                                     EM_REDUCTION_MEAN, -100),
                EM_ERR_SHAPE, "nll_loss_backward: grad of shape [4] does not match the loss's "
                "shape [] (reduction mean)");
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(loss_errors, pointwise_losses) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s35[2] = {3, 5}, s4[1] = {4}, s43[2] = {4, 3};
    em_tensor *x = em_zeros(2, s35, EM_F32, em_cpu()), *y4 = em_zeros(1, s4, EM_F32, em_cpu());
    EXPECT_FAIL(em_mse_loss(x, y4, EM_REDUCTION_MEAN), EM_ERR_SHAPE,
                "mse_loss: shapes [3, 5] and [4] cannot be broadcast");
    EXPECT_FAIL(em_l1_loss_backward(em_scalar(1, EM_F32), x, y4, EM_REDUCTION_MEAN), EM_ERR_SHAPE,
                "l1_loss_backward: shapes [3, 5] and [4] cannot be broadcast");
    em_tensor *xi = em_zeros(2, s35, EM_I64, em_cpu());
    EXPECT_FAIL(em_l1_loss(xi, xi, EM_REDUCTION_SUM), EM_ERR_DTYPE,
                "l1_loss: expected floating input or target, got int64 and int64");
    cr_expect_not_null(em_mse_loss(x, xi, EM_REDUCTION_SUM), "int target promotes: %s",
                       em_last_error());
    EXPECT_FAIL(em_smooth_l1_loss(x, x, EM_REDUCTION_MEAN, -1), EM_ERR_INVALID,
                "smooth_l1_loss: beta must be >= 0, got -1");
    EXPECT_FAIL(em_mse_loss(x, x, (em_reduction)-1), EM_ERR_INVALID,
                "mse_loss: reduction -1 is not one of");
    EXPECT_FAIL(em_mse_loss_backward(em_zeros(1, s4, EM_F32, em_cpu()), x, x, EM_REDUCTION_NONE),
                EM_ERR_SHAPE, "mse_loss_backward: grad of shape [4] does not match the loss's "
                "shape [3, 5]");
    em_tensor *b = em_zeros(2, s43, EM_F32, em_cpu());
    EXPECT_FAIL(em_binary_cross_entropy_with_logits(b, y4, NULL, NULL, EM_REDUCTION_MEAN),
                EM_ERR_SHAPE, "binary_cross_entropy_with_logits: target of shape [4] must have the "
                "input's shape [4, 3]");
    EXPECT_FAIL(em_binary_cross_entropy_with_logits(b, b, NULL, y4, EM_REDUCTION_MEAN),
                EM_ERR_SHAPE, "binary_cross_entropy_with_logits: pos_weight of shape [4] does not "
                "broadcast to the input's shape [4, 3]");
    EXPECT_FAIL(em_binary_cross_entropy_with_logits(b, em_zeros(2, s43, EM_I64, em_cpu()), NULL,
                                                    NULL, EM_REDUCTION_MEAN),
                EM_ERR_DTYPE, "expected floating input and target, got float32 and int64");
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* NULL inputs return NULL and keep the error already pending. */
Test(loss_errors, null_inputs_keep_pending_error) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *x = em_zeros(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    em_set_error(EM_ERR_IO, "an earlier failure");
    cr_expect_null(em_cross_entropy(NULL, x, NULL, EM_REDUCTION_MEAN, -100, 0));
    cr_expect_null(em_nll_loss(x, NULL, NULL, EM_REDUCTION_MEAN, -100));
    cr_expect_null(em_mse_loss(x, NULL, EM_REDUCTION_MEAN));
    cr_expect_null(em_smooth_l1_loss_backward(NULL, x, x, EM_REDUCTION_MEAN, 1));
    cr_expect_null(em_binary_cross_entropy_with_logits(NULL, x, NULL, NULL, EM_REDUCTION_MEAN));
    cr_expect_null(em_cross_entropy_backward(NULL, x, x, NULL, EM_REDUCTION_MEAN, -100, 0));
    em_assert_error(EM_ERR_IO, "an earlier failure");
    em_clear_error();
    cr_expect_null(em_l1_loss(NULL, x, EM_REDUCTION_MEAN));
    em_assert_error(EM_ERR_INVALID, "l1_loss: input 0 is NULL");
    cr_assert_eq(em_scope_end(), EM_OK);
}

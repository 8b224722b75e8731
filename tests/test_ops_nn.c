/*
 * test_ops_nn.c — the neural-network ops (conv2d, pooling, batch_norm, layer_norm, softmax,
 * log_softmax and their backward helpers) against PyTorch.
 *
 * Reference values come from tests/fixtures/nn.txt, written by tests/fixtures/gen_nn.py
 * (PyTorch 1.13 in float64; regenerate with /usr/bin/python3 tests/fixtures/gen_nn.py). Each
 * case runs in f64 and f32, with inputs contiguous, transposed (stored with H and W swapped,
 * then viewed back) and sliced (every other element of a wider tensor).
 *
 * Tolerances (allclose: |got - want| <= atol + rtol |want|): f64 rtol = atol = 1e-10; f32
 * rtol 1e-4, atol 1e-5 (the f32 results are compared with the f64 reference). bf16 results
 * are compared with the f32 op on the same bf16-rounded inputs: rtol 2^-7, atol 1e-2
 * (one rounding of the result, plus f32 accumulation-order differences).
 *
 * The oneDNN f32 convolution is compared with the im2col loops (EMBER_CPU_DISABLE_DNNL=1 and a
 * re-init) and with the f64 loops on random data: rtol 1e-4, atol 1e-4 (sums of 288 products
 * of N(0, 1) values); likewise oneDNN's pooling, norms and softmax (suite dnnl, rtol = atol =
 * 2e-4). max_pool2d's 2x2 path is checked exactly against a plain loop in this file.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"

TestSuite(conv, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(pool, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(norm, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(softmax, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(dnnl, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(layout, .init = em_test_setup, .fini = em_test_teardown);

/* ---- fixtures --------------------------------------------------------------------------------- */

typedef struct fx_tensor {
    char name[32];
    int ndim;
    int64_t shape[8];
    int64_t n;
    double *v;
} fx_tensor;

typedef struct fx_case {
    int nt;
    fx_tensor t[20];
} fx_case;

/* Loads case `name` from nn.txt (the test fails if absent); free with fx_free. */
static fx_case *fx_load(const char *name) {
    FILE *f = fopen(EM_TEST_FIXTURES "/nn.txt", "r");
    cr_assert(f, "cannot open %s/nn.txt", EM_TEST_FIXTURES);
    char word[64];
    fx_case *c = NULL;
    while (fscanf(f, "%63s", word) == 1) {
        if (strcmp(word, "end") == 0) break;
        if (strcmp(word, "case") == 0) {
            cr_assert_eq(fscanf(f, "%63s", word), 1);
            if (c) break; /* the next case: ours is complete */
            if (strcmp(word, name) == 0) c = calloc(1, sizeof *c);
            continue;
        }
        cr_assert_str_eq(word, "t", "malformed fixture file");
        fx_tensor tmp = {0}, *t = c ? &c->t[c->nt++] : &tmp;
        cr_assert(!c || c->nt <= 20);
        cr_assert_eq(fscanf(f, "%31s %d", t->name, &t->ndim), 2);
        t->n = 1;
        for (int i = 0; i < t->ndim; i++) {
            long long s;
            cr_assert_eq(fscanf(f, "%lld", &s), 1);
            t->shape[i] = s;
            t->n *= s;
        }
        double *v = malloc(sizeof(double) * (size_t)(t->n ? t->n : 1));
        for (int64_t i = 0; i < t->n; i++) cr_assert_eq(fscanf(f, "%lf", &v[i]), 1);
        if (c) t->v = v;
        else free(v);
    }
    fclose(f);
    cr_assert(c, "fixture case %s not found", name);
    return c;
}

static void fx_free(fx_case *c) {
    for (int i = 0; i < c->nt; i++) free(c->t[i].v);
    free(c);
}

static const fx_tensor *fx_get(const fx_case *c, const char *name) {
    for (int i = 0; i < c->nt; i++)
        if (strcmp(c->t[i].name, name) == 0) return &c->t[i];
    return NULL;
}

static const fx_tensor *fx_need(const fx_case *c, const char *name) {
    const fx_tensor *t = fx_get(c, name);
    cr_assert(t, "fixture lacks tensor %s", name);
    return t;
}

static int64_t fx_int(const fx_case *c, const char *name, int i) {
    return (int64_t)fx_need(c, name)->v[i];
}

/* ---- tensors in three layouts ------------------------------------------------------------------ */

enum { CONTIG, TRANSPOSED, SLICED, N_LAYOUTS };
static const char *const layout_name[] = {"contiguous", "transposed", "sliced"};

/* t (values in C order of `shape`) as dtype dt in the given layout (a tensor owned by the
 * caller's scope). */
static em_tensor *make(em_dtype dt, int ndim, const int64_t *shape, const double *v, int layout) {
    em_tensor *c = em_test_tensor(dt, ndim, shape, v);
    em_tensor *r = c;
    if (layout == TRANSPOSED && ndim >= 2) {
        em_tensor *s = em_contiguous(em_transpose(c, ndim - 2, ndim - 1));
        r = em_transpose(s, ndim - 2, ndim - 1);
        cr_assert(!em_tensor_is_contiguous(r) || shape[ndim - 1] == 1 || shape[ndim - 2] == 1);
    } else if (layout == SLICED && ndim >= 1) {
        int64_t wide[8];
        memcpy(wide, shape, sizeof(int64_t) * (size_t)ndim);
        wide[ndim - 1] *= 2;
        em_tensor *w = em_zeros(ndim, wide, dt, em_cpu());
        em_tensor *view = em_slice(w, ndim - 1, 0, wide[ndim - 1], 2);
        cr_assert_eq(em_copy_(view, c), EM_OK, "%s", em_last_error());
        r = view;
    }
    cr_assert(r, "%s", em_last_error());
    return r;
}

static em_tensor *fx_make(const fx_tensor *t, em_dtype dt, int layout) {
    return make(dt, t->ndim, t->shape, t->v, layout);
}

static double rtol_of(em_dtype dt) { return dt == EM_F64 ? 1e-10 : 1e-4; }
static double atol_of(em_dtype dt) { return dt == EM_F64 ? 1e-10 : 1e-5; }

/* got (any dtype) allclose to want (n values in C order of got's shape). */
static void check_close(const em_tensor *got, const double *want, int64_t n, double rtol,
                        double atol, const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(got), n, "%s: %lld elements, want %lld", what,
                 (long long)em_tensor_numel(got), (long long)n);
    double *g = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_tensor *d = em_to_dtype(got, EM_F64);
    cr_assert_eq(em_tensor_to_host(d, g, sizeof(double) * (size_t)n), EM_OK, "%s", em_last_error());
    for (int64_t i = 0; i < n; i++) {
        bool ok = fabs(g[i] - want[i]) <= atol + rtol * fabs(want[i]) ||
                  (isnan(g[i]) && isnan(want[i]));
        if (!ok) {
            double gi = g[i];
            free(g);
            cr_assert_fail("%s: element %lld is %.10g, want %.10g (rtol %g, atol %g)", what,
                           (long long)i, gi, want[i], rtol, atol);
        }
    }
    free(g);
}

static void check_fx(const em_tensor *got, const fx_tensor *want, em_dtype dt, const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_ndim(got), want->ndim, "%s: ndim", what);
    for (int i = 0; i < want->ndim; i++)
        cr_assert_eq(em_tensor_shape(got)[i], want->shape[i], "%s: dim %d is %lld, want %lld",
                     what, i, (long long)em_tensor_shape(got)[i], (long long)want->shape[i]);
    cr_assert_eq(em_tensor_dtype(got), dt, "%s: dtype %s", what,
                 em_dtype_name(em_tensor_dtype(got)));
    check_close(got, want->v, want->n, rtol_of(dt), atol_of(dt), what);
}

static const em_dtype float_dtypes[] = {EM_F64, EM_F32};

/* ---- conv2d ------------------------------------------------------------------------------------ */

static const char *const conv_cases[] = {"basic",    "strided",   "dilated", "groups",
                                         "depthwise", "pointwise", "stride3"};

static void conv_params(const fx_case *c, int64_t s[2], int64_t p[2], int64_t d[2], int64_t *g) {
    for (int i = 0; i < 2; i++) {
        s[i] = fx_int(c, "stride", i);
        p[i] = fx_int(c, "padding", i);
        d[i] = fx_int(c, "dilation", i);
    }
    *g = fx_int(c, "groups", 0);
}

static void conv_case(const char *name) {
    char full[64], what[160];
    snprintf(full, sizeof full, "conv2d_%s", name);
    fx_case *c = fx_load(full);
    int64_t s[2], p[2], d[2], g;
    conv_params(c, s, p, d, &g);
    const fx_tensor *x = fx_need(c, "x"), *w = fx_need(c, "w"), *b = fx_get(c, "b");
    for (int di = 0; di < 2; di++)
        for (int l = 0; l < N_LAYOUTS; l++) {
            em_dtype dt = float_dtypes[di];
            cr_assert_eq(em_scope_begin(), EM_OK);
            em_tensor *tx = fx_make(x, dt, l), *tw = fx_make(w, dt, l);
            em_tensor *tb = b ? fx_make(b, dt, l) : NULL, *tgy = fx_make(fx_need(c, "gy"), dt, l);
            snprintf(what, sizeof what, "%s %s %s forward", full, em_dtype_name(dt), layout_name[l]);
            check_fx(em_conv2d(tx, tw, tb, s, p, d, g), fx_need(c, "y"), dt, what);
            int64_t hw[2] = {x->shape[2], x->shape[3]}, k[2] = {w->shape[2], w->shape[3]};
            snprintf(what, sizeof what, "%s %s %s backward_data", full, em_dtype_name(dt),
                     layout_name[l]);
            check_fx(em_conv2d_backward_data(tgy, tw, hw, s, p, d, g), fx_need(c, "gx"), dt, what);
            em_tensor *gw = NULL, *gb = NULL;
            snprintf(what, sizeof what, "%s %s %s backward_weight", full, em_dtype_name(dt),
                     layout_name[l]);
            cr_assert_eq(em_conv2d_backward_weight(tx, tgy, k, s, p, d, g, &gw, &gb), EM_OK,
                         "%s: %s", what, em_last_error());
            check_fx(gw, fx_need(c, "gw"), dt, what);
            check_fx(gb, fx_need(c, "gb"), dt, what);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
    fx_free(c);
}

Test(conv, against_pytorch) {
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) conv_case(conv_cases[i]);
}


/* conv forward, backward data, backward weight of random data in dtype dt: 4 result arrays. */
typedef struct conv_run {
    double *y, *gx, *gw, *gb;
    int64_t ny, nx, nw, no;
} conv_run;

static double *host(const em_tensor *t, int64_t *n) {
    cr_assert(t, "%s", em_last_error());
    *n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
    cr_assert_eq(em_tensor_to_host(em_to_dtype(t, EM_F64), v, sizeof(double) * (size_t)*n), EM_OK);
    return v;
}

static conv_run run_conv(em_dtype dt, const int64_t xs[4], const int64_t ws[4], int64_t s,
                         int64_t p, int64_t g) {
    conv_run r;
    int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
    int64_t oh = (xs[2] + 2 * p - ws[2]) / s + 1, ow = (xs[3] + 2 * p - ws[3]) / s + 1;
    int64_t ys[4] = {xs[0], ws[0], oh, ow}, ny = ys[0] * ys[1] * ys[2] * ys[3];
    double *vx = malloc(sizeof(double) * (size_t)nx), *vw = malloc(sizeof(double) * (size_t)nw),
           *vb = malloc(sizeof(double) * (size_t)ws[0]), *vg = malloc(sizeof(double) * (size_t)ny);
    em_test_fill_random(vx, nx, 1), em_test_fill_random(vw, nw, 2), em_test_fill_random(vb, ws[0], 3);
    em_test_fill_random(vg, ny, 4);
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *x = make(dt, 4, xs, vx, CONTIG), *w = make(dt, 4, ws, vw, CONTIG),
              *b = make(dt, 1, ws, vb, CONTIG), *gy = make(dt, 4, ys, vg, CONTIG);
    int64_t st[2] = {s, s}, pd[2] = {p, p}, hw[2] = {xs[2], xs[3]}, k[2] = {ws[2], ws[3]};
    r.y = host(em_conv2d(x, w, b, st, pd, NULL, g), &r.ny);
    r.gx = host(em_conv2d_backward_data(gy, w, hw, st, pd, NULL, g), &r.nx);
    em_tensor *gw, *gb;
    cr_assert_eq(em_conv2d_backward_weight(x, gy, k, st, pd, NULL, g, &gw, &gb), EM_OK, "%s",
                 em_last_error());
    r.gw = host(gw, &r.nw);
    r.gb = host(gb, &r.no);
    cr_assert_eq(em_scope_end(), EM_OK);
    free(vx), free(vw), free(vb), free(vg);
    return r;
}

static void conv_run_free(conv_run *r) { free(r->y), free(r->gx), free(r->gw), free(r->gb); }

static void conv_run_close(const conv_run *a, const conv_run *b, double tol, const char *what) {
    const double *got[4] = {a->y, a->gx, a->gw, a->gb}, *want[4] = {b->y, b->gx, b->gw, b->gb};
    const int64_t n[4] = {a->ny, a->nx, a->nw, a->no};
    static const char *const part[4] = {"forward", "backward_data", "backward_weight", "bias"};
    for (int i = 0; i < 4; i++)
        for (int64_t j = 0; j < n[i]; j++)
            cr_assert(fabs(got[i][j] - want[i][j]) <= tol + tol * fabs(want[i][j]),
                      "%s %s: element %lld is %.9g, want %.9g", what, part[i], (long long)j,
                      got[i][j], want[i][j]);
}

/* The CNN's shapes (1 -> 32 on 28x28, 32 -> 64 on 14x14, 3x3, padding 1) at a small batch,
 * plus a strided grouped case: oneDNN f32 vs the im2col f32 loops vs the f64 loops. */
Test(conv, dnnl_matches_loops) {
    em_test_needs_onednn();
    static const struct {
        int64_t xs[4], ws[4], s, p, g;
    } cs[] = {
        {{2, 1, 28, 28}, {32, 1, 3, 3}, 1, 1, 1},
        {{2, 32, 14, 14}, {64, 32, 3, 3}, 1, 1, 1},
        {{2, 8, 11, 9}, {12, 4, 3, 3}, 2, 1, 2},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        cr_assert(kernel_registered("cpu_conv2d_dnnl_f32"), "the oneDNN kernel is not registered");
        conv_run dn = run_conv(EM_F32, cs[i].xs, cs[i].ws, cs[i].s, cs[i].p, cs[i].g);
        conv_run ref = run_conv(EM_F64, cs[i].xs, cs[i].ws, cs[i].s, cs[i].p, cs[i].g);
        em_test_assert_clean_shutdown();
        setenv("EMBER_CPU_DISABLE_DNNL", "1", 1);
        cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
        cr_assert(!kernel_registered("cpu_conv2d_dnnl_f32"),
                  "EMBER_CPU_DISABLE_DNNL=1 left the oneDNN kernel registered");
        conv_run loops = run_conv(EM_F32, cs[i].xs, cs[i].ws, cs[i].s, cs[i].p, cs[i].g);
        em_test_assert_clean_shutdown();
        unsetenv("EMBER_CPU_DISABLE_DNNL");
        cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
        conv_run_close(&dn, &ref, 1e-4, "oneDNN f32 vs f64 loops");
        conv_run_close(&loops, &ref, 1e-4, "im2col f32 vs f64 loops");
        conv_run_close(&dn, &loops, 1e-4, "oneDNN f32 vs im2col f32");
        conv_run_free(&dn), conv_run_free(&ref), conv_run_free(&loops);
    }
}

/* grad of a 3x3 convolution's weight, stride 1, padding 1, one group, as a plain loop:
 * gw[o][c][i][j] = sum over n, h, w of x[n][c][h + i - 1][w + j - 1] gy[n][o][h][w]. */
static void ref_gw_3x3(const double *x, const double *gy, int64_t N, int64_t C, int64_t H,
                       int64_t W, int64_t O, double *gw) {
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < 3; i++)
                for (int64_t j = 0; j < 3; j++) {
                    double acc = 0;
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t h = 0; h < H; h++)
                            for (int64_t w = 0; w < W; w++) {
                                int64_t ih = h + i - 1, iw = w + j - 1;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += x[((n * C + c) * H + ih) * W + iw] *
                                       gy[((n * O + o) * H + h) * W + w];
                            }
                    gw[((o * C + c) * 3 + i) * 3 + j] = acc;
                }
}

/* conv2d_backward_weight(x, gy) (3x3, padding 1) against ref_gw_3x3 on the values vx, vg. */
static void check_gw(em_tensor *x, em_tensor *gy, const double *vx, const double *vg,
                     const int64_t xs[4], int64_t O, const char *what) {
    em_tensor *gw, *gb;
    cr_assert_eq(em_conv2d_backward_weight(x, gy, (int64_t[]){3, 3}, NULL, (int64_t[]){1, 1},
                                           NULL, 1, &gw, &gb),
                 EM_OK, "%s: %s", what, em_last_error());
    int64_t n = O * xs[1] * 9;
    double *want = malloc(sizeof(double) * (size_t)n);
    ref_gw_3x3(vx, vg, xs[0], xs[1], xs[2], xs[3], O, want);
    check_close(gw, want, n, 1e-4, 1e-4, what);
    free(want);
}

/* The oneDNN kernels share the blocked copy of x between conv2d and conv2d_backward_weight,
 * and of gy between conv2d_backward_data and conv2d_backward_weight, named by the storage and
 * its version. A tensor written in between — by an op, or through its data pointer followed
 * by em_tensor_bump_version — and a new tensor in a freed one's memory must be reordered
 * afresh, never served the old copy (which gives a different grad). */
/* On more than one thread the oneDNN backward-weight runs one batch chunk per thread into f32
 * partial sums (cpu_nn_dnnl.c, conv_bwd_weight_split): 5 images on 1, 2 and 3 threads (one
 * chunk size, two, and chunks of 1 and 2), f32 and bf16, against the plain loop; the bias
 * grad against the sums of gy. */
Test(conv, backward_weight_batch_chunks_per_thread) {
    enum { N = 5, C = 3, H = 6, W = 7, O = 16 };
    int64_t xs[4] = {N, C, H, W}, ys[4] = {N, O, H, W};
    int64_t nx = N * C * H * W, ny = N * O * H * W, nw = O * C * 9;
    double *vx = malloc(sizeof(double) * nx), *vg = malloc(sizeof(double) * ny),
           *want = malloc(sizeof(double) * nw), wb[O];
    em_test_fill_random(vx, nx, 21), em_test_fill_random(vg, ny, 22);
    for (int64_t i = 0; i < nx; i++) vx[i] = em_bf16_to_f32(em_f32_to_bf16((float)vx[i]));
    for (int64_t i = 0; i < ny; i++) vg[i] = em_bf16_to_f32(em_f32_to_bf16((float)vg[i]));
    ref_gw_3x3(vx, vg, N, C, H, W, O, want);
    for (int o = 0; o < O; o++) {
        wb[o] = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < H * W; i++) wb[o] += vg[(n * O + o) * H * W + i];
    }
    int nt0 = em_num_threads();
    for (int t = 1; t <= 3; t++)
        for (int bf = 0; bf < 2; bf++) {
            em_set_num_threads(t);
            em_dtype dt = bf ? EM_BF16 : EM_F32;
            double tol = bf ? 1e-2 : 1e-4; /* bf16: the result rounded once (2^-9 relative) */
            char what[96];
            snprintf(what, sizeof what, "%s on %d thread(s)", em_dtype_name(dt), t);
            cr_assert_eq(em_scope_begin(), EM_OK);
            em_tensor *x = em_to_dtype(make(EM_F32, 4, xs, vx, CONTIG), dt),
                      *gy = em_to_dtype(make(EM_F32, 4, ys, vg, CONTIG), dt), *gw, *gb;
            cr_assert_eq(em_conv2d_backward_weight(x, gy, (int64_t[]){3, 3}, NULL,
                                                   (int64_t[]){1, 1}, NULL, 1, &gw, &gb),
                         EM_OK, "%s: %s", what, em_last_error());
            cr_assert_eq(em_tensor_dtype(gw), dt, "%s: dtype", what);
            check_close(gw, want, nw, tol, tol, what);
            check_close(gb, wb, O, tol, tol, what);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
    em_set_num_threads(nt0);
    free(vx), free(vg), free(want);
}

/* On one thread, and on 2 and 3, where backward-weight splits the 5 images into chunks (2 + 3;
 * 1 + 2 + 2) that read their slices of the shared copies in place. */
static void shared_reorder_case(int nt) {
    enum { N = 5, C = 32, H = 7, W = 6, O = 64 };
    int nt0 = em_num_threads();
    em_set_num_threads(nt);
    int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C, 3, 3}, ys[4] = {N, O, H, W}, pd[2] = {1, 1};
    int64_t nx = N * C * H * W, ny = N * O * H * W, nw = O * C * 9;
    double *vx = malloc(sizeof(double) * nx), *vg = malloc(sizeof(double) * ny),
           *vw = malloc(sizeof(double) * nw);
    em_test_fill_random(vx, nx, 11), em_test_fill_random(vg, ny, 12), em_test_fill_random(vw, nw, 13);
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *x = make(EM_F32, 4, xs, vx, CONTIG), *gy = make(EM_F32, 4, ys, vg, CONTIG),
              *w = make(EM_F32, 4, ws, vw, CONTIG), *two = em_scalar(2, EM_F32),
              *neg = em_scalar(-0.5, EM_F32);
    /* Unchanged: the shared copies serve backward-weight. */
    cr_assert(em_conv2d(x, w, NULL, NULL, pd, NULL, 1), "%s", em_last_error());
    cr_assert(em_conv2d_backward_data(gy, w, (int64_t[]){H, W}, NULL, pd, NULL, 1), "%s",
              em_last_error());
    check_gw(x, gy, vx, vg, xs, O, "x and gy unchanged");
    /* x written by an op between the forward and backward-weight. */
    cr_assert(em_conv2d(x, w, NULL, NULL, pd, NULL, 1), "%s", em_last_error());
    cr_assert_eq(em_mul_(x, two), EM_OK, "%s", em_last_error());
    for (int64_t i = 0; i < nx; i++) vx[i] *= 2;
    check_gw(x, gy, vx, vg, xs, O, "x doubled in place by mul_ after the forward");
    /* x written through its data pointer, the version bumped. */
    cr_assert(em_conv2d(x, w, NULL, NULL, pd, NULL, 1), "%s", em_last_error());
    float *px = em_tensor_data(x);
    em_test_fill_random(vx, nx, 14);
    for (int64_t i = 0; i < nx; i++) px[i] = (float)vx[i], vx[i] = px[i];
    em_tensor_bump_version(x);
    check_gw(x, gy, vx, vg, xs, O, "x rewritten through em_tensor_data after the forward");
    /* gy written by an op between backward-data and backward-weight (x's copy is current). */
    cr_assert(em_conv2d(x, w, NULL, NULL, pd, NULL, 1), "%s", em_last_error());
    cr_assert(em_conv2d_backward_data(gy, w, (int64_t[]){H, W}, NULL, pd, NULL, 1), "%s",
              em_last_error());
    cr_assert_eq(em_mul_(gy, neg), EM_OK, "%s", em_last_error());
    for (int64_t i = 0; i < ny; i++) vg[i] *= -0.5;
    check_gw(x, gy, vx, vg, xs, O, "gy scaled in place after backward-data");
    /* A new tensor in the memory of a freed one, both at version 0. */
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *old = em_empty(4, xs, EM_F32, em_cpu());
    void *where = em_tensor_data(old);
    float *po = where;
    for (int64_t i = 0; i < nx; i++) po[i] = (float)(i % 7);
    cr_assert(em_conv2d(old, w, NULL, NULL, pd, NULL, 1), "%s", em_last_error());
    cr_assert_eq(em_scope_end(), EM_OK);
    em_tensor *fresh = em_empty(4, xs, EM_F32, em_cpu());
    cr_assert_eq(em_tensor_data(fresh), where,
                 "the allocator did not reuse the freed memory: the case is not exercised");
    float *pf = em_tensor_data(fresh);
    em_test_fill_random(vx, nx, 15);
    for (int64_t i = 0; i < nx; i++) pf[i] = (float)vx[i], vx[i] = pf[i];
    cr_assert_eq(em_tensor_version(fresh), 0);
    check_gw(fresh, gy, vx, vg, xs, O, "a new tensor at a freed tensor's address");
    cr_assert_eq(em_scope_end(), EM_OK);
    em_set_num_threads(nt0);
    free(vx), free(vg), free(vw);
}

Test(conv, shared_reorder_not_stale) {
    for (int nt = 1; nt <= 3; nt++) shared_reorder_case(nt);
}

/* bf16 (the layouts of mixed precision's convolutions): backward-weight after the forward and
 * backward-data (reading their copies, in slices on 2 and 3 threads) gives the same bits as
 * on fresh copies of x and gy (no copy to read: reordered by its own chunks), and the plain
 * loop's grad to bf16's tolerance. */
Test(conv, shared_reorder_bf16_chunks) {
    enum { N = 5, C = 32, H = 7, W = 6, O = 64 };
    int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C, 3, 3}, ys[4] = {N, O, H, W}, pd[2] = {1, 1};
    int64_t nx = N * C * H * W, ny = N * O * H * W, nw = O * C * 9;
    double *vx = malloc(sizeof(double) * nx), *vg = malloc(sizeof(double) * ny),
           *vw = malloc(sizeof(double) * nw), *want = malloc(sizeof(double) * nw);
    em_test_fill_random(vx, nx, 31), em_test_fill_random(vg, ny, 32);
    em_test_fill_random(vw, nw, 33);
    for (int64_t i = 0; i < nx; i++) vx[i] = em_bf16_to_f32(em_f32_to_bf16((float)vx[i]));
    for (int64_t i = 0; i < ny; i++) vg[i] = em_bf16_to_f32(em_f32_to_bf16((float)vg[i]));
    ref_gw_3x3(vx, vg, N, C, H, W, O, want);
    int nt0 = em_num_threads();
    for (int nt = 1; nt <= 3; nt++) {
        em_set_num_threads(nt);
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *x = em_to_dtype(make(EM_F32, 4, xs, vx, CONTIG), EM_BF16),
                  *gy = em_to_dtype(make(EM_F32, 4, ys, vg, CONTIG), EM_BF16),
                  *w = em_to_dtype(make(EM_F32, 4, ws, vw, CONTIG), EM_BF16), *gw, *gb, *gw2,
                  *gb2;
        cr_assert(em_conv2d(x, w, NULL, NULL, pd, NULL, 1), "%s", em_last_error());
        cr_assert(em_conv2d_backward_data(gy, w, (int64_t[]){H, W}, NULL, pd, NULL, 1), "%s",
                  em_last_error());
        cr_assert_eq(em_conv2d_backward_weight(x, gy, (int64_t[]){3, 3}, NULL, pd, NULL, 1, &gw,
                                               &gb), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_conv2d_backward_weight(em_clone(x), em_clone(gy), (int64_t[]){3, 3}, NULL,
                                               pd, NULL, 1, &gw2, &gb2), EM_OK, "%s",
                     em_last_error());
        char what[64];
        snprintf(what, sizeof what, "bf16 backward-weight on %d thread(s)", nt);
        check_close(gw, want, nw, 1e-2, 1e-2, what);
        size_t nb = em_tensor_nbytes(gw);
        uint16_t *a = malloc(nb), *b = malloc(nb);
        cr_assert_eq(em_tensor_to_host(gw, a, nb), EM_OK);
        cr_assert_eq(em_tensor_to_host(gw2, b, nb), EM_OK);
        bool same = memcmp(a, b, nb) == 0;
        free(a), free(b);
        cr_assert(same, "%s: the shared copies' grad differs from the fresh reorders'", what);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    em_set_num_threads(nt0);
    free(vx), free(vg), free(vw), free(want);
}

/* A weight broadcast from (1, C, kH, kW) (stride 0 on dim 0) gives what its copy gives. */
Test(conv, broadcast_weight) {
    em_scope_begin();
    double vx[2 * 3 * 5 * 5], vw[3 * 3 * 3];
    em_test_fill_random(vx, 150, 7), em_test_fill_random(vw, 27, 8);
    int64_t xs[4] = {2, 3, 5, 5}, w1[4] = {1, 3, 3, 3}, ws[4] = {4, 3, 3, 3};
    em_tensor *x = make(EM_F64, 4, xs, vx, CONTIG), *w = make(EM_F64, 4, w1, vw, CONTIG);
    em_tensor *we = em_expand(w, 4, ws), *wc = em_contiguous(we);
    cr_assert_eq(em_tensor_stride(we, 0), 0);
    em_tensor *a = em_conv2d(x, we, NULL, NULL, (int64_t[]){1, 1}, NULL, 1);
    em_tensor *b = em_conv2d(x, wc, NULL, NULL, (int64_t[]){1, 1}, NULL, 1);
    int64_t n;
    double *vb = host(b, &n);
    check_close(a, vb, n, 0, 0, "conv2d with an expanded weight");
    free(vb);
    em_scope_end();
}

Test(conv, empty_batch_and_bf16) {
    em_scope_begin();
    int64_t xs[4] = {0, 3, 5, 5}, ws[4] = {4, 3, 3, 3};
    em_tensor *x = em_zeros(4, xs, EM_F32, em_cpu()), *w = em_ones(4, ws, EM_F32, em_cpu());
    em_tensor *y = em_conv2d(x, w, NULL, NULL, NULL, NULL, 1);
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(em_tensor_shape(y)[0], 0);
    cr_assert_eq(em_tensor_shape(y)[1], 4);
    cr_assert_eq(em_tensor_shape(y)[2], 3);
    em_tensor *gx = em_conv2d_backward_data(y, w, (int64_t[]){5, 5}, NULL, NULL, NULL, 1);
    cr_assert(gx && em_tensor_numel(gx) == 0, "%s", em_last_error());
    em_tensor *gw, *gb;
    cr_assert_eq(em_conv2d_backward_weight(x, y, (int64_t[]){3, 3}, NULL, NULL, NULL, 1, &gw,
                                           &gb), EM_OK, "%s", em_last_error());
    check_close(gw, (double[108]){0}, 108, 0, 0, "grad_weight of an empty batch");
    /* bf16 computes in f32 and rounds once: compare with the f32 op on the same values. */
    int64_t xs2[4] = {2, 3, 6, 6};
    double vx[216], vw[108];
    em_test_fill_random(vx, 216, 11), em_test_fill_random(vw, 108, 12);
    em_tensor *xb = make(EM_BF16, 4, xs2, vx, CONTIG), *wb = make(EM_BF16, 4, ws, vw, CONTIG);
    em_tensor *yb = em_conv2d(xb, wb, NULL, NULL, (int64_t[]){1, 1}, NULL, 1);
    cr_assert(yb && em_tensor_dtype(yb) == EM_BF16, "%s", em_last_error());
    em_tensor *yf = em_conv2d(em_to_dtype(xb, EM_F32), em_to_dtype(wb, EM_F32), NULL, NULL,
                              (int64_t[]){1, 1}, NULL, 1);
    int64_t n;
    double *vf = host(yf, &n);
    check_close(yb, vf, n, 0x1p-7, 1e-2, "bf16 conv2d vs f32");
    free(vf);
    em_scope_end();
}

Test(conv, errors_name_shapes) {
    em_scope_begin();
    em_tensor *x = em_zeros(4, (int64_t[]){1, 3, 5, 5}, EM_F32, em_cpu());
    em_tensor *w = em_zeros(4, (int64_t[]){4, 2, 3, 3}, EM_F32, em_cpu());
    cr_assert_null(em_conv2d(x, w, NULL, NULL, NULL, NULL, 1));
    em_assert_error(EM_ERR_SHAPE, "input [1, 3, 5, 5] has 3 channels but weight [4, 2, 3, 3]");
    em_tensor *w7 = em_zeros(4, (int64_t[]){4, 3, 7, 7}, EM_F32, em_cpu());
    cr_assert_null(em_conv2d(x, w7, NULL, NULL, (int64_t[]){0, 0}, NULL, 1));
    em_assert_error(EM_ERR_SHAPE, "is larger than the padded input (5 x 5) of input [1, 3, 5, 5]");
    em_tensor *w3 = em_zeros(4, (int64_t[]){4, 3, 3, 3}, EM_F32, em_cpu());
    em_tensor *b = em_zeros(1, (int64_t[]){5}, EM_F32, em_cpu());
    cr_assert_null(em_conv2d(x, w3, b, NULL, NULL, NULL, 1));
    em_assert_error(EM_ERR_SHAPE, "bias [5] does not match weight [4, 3, 3, 3]");
    em_tensor *xi = em_zeros(4, (int64_t[]){1, 3, 5, 5}, EM_I64, em_cpu());
    cr_assert_null(em_conv2d(xi, w3, NULL, NULL, NULL, NULL, 1));
    em_assert_error(EM_ERR_DTYPE, "conv2d: expected a floating input, got int64");
    em_tensor *x3 = em_zeros(3, (int64_t[]){3, 5, 5}, EM_F32, em_cpu());
    cr_assert_null(em_conv2d(x3, w3, NULL, NULL, NULL, NULL, 1));
    em_assert_error(EM_ERR_SHAPE, "expected a 4-D (N, C, H, W) input, got shape [3, 5, 5]");
    cr_assert_null(em_conv2d(x, w3, NULL, (int64_t[]){0, 1}, NULL, NULL, 1));
    em_assert_error(EM_ERR_INVALID, "must be positive");
    em_tensor *gy = em_zeros(4, (int64_t[]){1, 4, 2, 2}, EM_F32, em_cpu());
    cr_assert_null(em_conv2d_backward_data(gy, w3, (int64_t[]){5, 5}, NULL, NULL, NULL, 1));
    em_assert_error(EM_ERR_SHAPE, "grad_output [1, 4, 2, 2] does not match the convolution's "
                    "output [1, 4, 3, 3]");
    /* NULL inputs keep the pending error. */
    em_set_error(EM_ERR_IO, "earlier");
    cr_assert_null(em_conv2d(NULL, w3, NULL, NULL, NULL, NULL, 1));
    em_assert_error(EM_ERR_IO, "earlier");
    em_scope_end();
}

/* ---- pooling ----------------------------------------------------------------------------------- */

Test(pool, max_pool2d_against_pytorch) {
    static const char *const cases[] = {"k2", "k3s2p1", "ceil", "ceil_edge", "dilated", "rect"};
    char full[64], what[160];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(full, sizeof full, "max_pool2d_%s", cases[i]);
        fx_case *c = fx_load(full);
        int64_t k[2], s[2], p[2], d[2], hw[2];
        for (int j = 0; j < 2; j++) {
            k[j] = fx_int(c, "kernel", j), s[j] = fx_int(c, "stride", j);
            p[j] = fx_int(c, "padding", j), d[j] = fx_int(c, "dilation", j);
            hw[j] = fx_need(c, "x")->shape[2 + j];
        }
        bool ceil = fx_int(c, "ceil", 0);
        for (int di = 0; di < 2; di++)
            for (int l = 0; l < N_LAYOUTS; l++) {
                em_dtype dt = float_dtypes[di];
                em_scope_begin();
                snprintf(what, sizeof what, "%s %s %s", full, em_dtype_name(dt), layout_name[l]);
                em_tensor *y, *idx;
                cr_assert_eq(em_max_pool2d(fx_make(fx_need(c, "x"), dt, l), k, s, p, d, ceil, &y,
                                           &idx), EM_OK, "%s: %s", what, em_last_error());
                check_fx(y, fx_need(c, "y"), dt, what);
                check_fx(idx, fx_need(c, "idx"), EM_I64, what);
                em_tensor *gx = em_max_pool2d_backward(fx_make(fx_need(c, "gy"), dt, l), idx, hw);
                check_fx(gx, fx_need(c, "gx"), dt, what);
                em_scope_end();
            }
        fx_free(c);
    }
}

Test(pool, avg_pool2d_against_pytorch) {
    static const char *const cases[] = {"k2",        "pad_incl",  "pad_excl", "ceil_incl",
                                        "ceil_excl", "ceil_nopad", "rect"};
    char full[64], what[160];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(full, sizeof full, "avg_pool2d_%s", cases[i]);
        fx_case *c = fx_load(full);
        int64_t k[2], s[2], p[2], hw[2];
        for (int j = 0; j < 2; j++) {
            k[j] = fx_int(c, "kernel", j), s[j] = fx_int(c, "stride", j);
            p[j] = fx_int(c, "padding", j), hw[j] = fx_need(c, "x")->shape[2 + j];
        }
        bool ceil = fx_int(c, "ceil", 0), cip = fx_int(c, "cip", 0);
        for (int di = 0; di < 2; di++)
            for (int l = 0; l < N_LAYOUTS; l++) {
                em_dtype dt = float_dtypes[di];
                em_scope_begin();
                snprintf(what, sizeof what, "%s %s %s", full, em_dtype_name(dt), layout_name[l]);
                check_fx(em_avg_pool2d(fx_make(fx_need(c, "x"), dt, l), k, s, p, ceil, cip),
                         fx_need(c, "y"), dt, what);
                check_fx(em_avg_pool2d_backward(fx_make(fx_need(c, "gy"), dt, l), hw, k, s, p,
                                                ceil, cip),
                         fx_need(c, "gx"), dt, what);
                em_scope_end();
            }
        fx_free(c);
    }
}

Test(pool, adaptive_against_pytorch) {
    static const char *const cases[] = {"down", "global", "up"};
    char full[64], what[160];
    for (size_t i = 0; i < 3; i++) {
        snprintf(full, sizeof full, "adaptive_%s", cases[i]);
        fx_case *c = fx_load(full);
        int64_t os[2] = {fx_int(c, "size", 0), fx_int(c, "size", 1)};
        int64_t hw[2] = {fx_need(c, "x")->shape[2], fx_need(c, "x")->shape[3]};
        for (int di = 0; di < 2; di++)
            for (int l = 0; l < N_LAYOUTS; l++) {
                em_dtype dt = float_dtypes[di];
                em_scope_begin();
                snprintf(what, sizeof what, "%s %s %s", full, em_dtype_name(dt), layout_name[l]);
                check_fx(em_adaptive_avg_pool2d(fx_make(fx_need(c, "x"), dt, l), os),
                         fx_need(c, "y"), dt, what);
                check_fx(em_adaptive_avg_pool2d_backward(fx_make(fx_need(c, "gy"), dt, l), hw),
                         fx_need(c, "gx"), dt, what);
                em_scope_end();
            }
        fx_free(c);
    }
}

Test(pool, errors_and_empty) {
    em_scope_begin();
    em_tensor *x = em_zeros(4, (int64_t[]){1, 2, 3, 3}, EM_F32, em_cpu()), *y, *idx;
    cr_assert_neq(em_max_pool2d(x, (int64_t[]){4, 4}, NULL, NULL, NULL, false, &y, &idx), EM_OK);
    em_assert_error(EM_ERR_SHAPE, "max_pool2d: input [1, 2, 3, 3] is too small for kernel (4, 4)");
    cr_assert_neq(em_max_pool2d(x, (int64_t[]){2, 2}, NULL, (int64_t[]){2, 2}, NULL, false, &y,
                                &idx), EM_OK);
    em_assert_error(EM_ERR_INVALID, "padding 2 should be at most half of the kernel size 2");
    cr_assert_null(em_avg_pool2d(em_zeros(2, (int64_t[]){3, 3}, EM_F32, em_cpu()),
                                 (int64_t[]){2, 2}, NULL, NULL, false, true));
    em_assert_error(EM_ERR_SHAPE, "expected a 4-D (N, C, H, W) input, got shape [3, 3]");
    cr_assert_null(em_adaptive_avg_pool2d(em_zeros(4, (int64_t[]){1, 2, 0, 3}, EM_F32, em_cpu()),
                                          (int64_t[]){1, 1}));
    em_assert_error(EM_ERR_SHAPE, "input [1, 2, 0, 3]");
    /* An empty batch pools to an empty batch. */
    em_tensor *e = em_zeros(4, (int64_t[]){0, 2, 4, 4}, EM_F64, em_cpu());
    cr_assert_eq(em_max_pool2d(e, (int64_t[]){2, 2}, NULL, NULL, NULL, false, &y, &idx), EM_OK,
                 "%s", em_last_error());
    cr_assert_eq(em_tensor_numel(y), 0);
    cr_assert_eq(em_tensor_shape(y)[2], 2);
    em_tensor *a = em_avg_pool2d(e, (int64_t[]){2, 2}, NULL, NULL, false, true);
    cr_assert(a && em_tensor_numel(a) == 0, "%s", em_last_error());
    /* A bad index is an error, not a stray write. */
    em_tensor *gy = em_ones(4, (int64_t[]){1, 1, 1, 1}, EM_F32, em_cpu());
    em_tensor *bad = em_full(4, (int64_t[]){1, 1, 1, 1}, 9, EM_I64, em_cpu());
    cr_assert_null(em_max_pool2d_backward(gy, bad, (int64_t[]){3, 3}));
    em_assert_error(EM_ERR_RANGE, "outside the input plane of 3 x 3");
    em_scope_end();
}

/* ---- normalisation ----------------------------------------------------------------------------- */

Test(norm, batch_norm_against_pytorch) {
    static const char *const cases[] = {"train", "train2d", "eval"};
    char full[64], what[160];
    for (size_t i = 0; i < 3; i++) {
        snprintf(full, sizeof full, "batch_norm_%s", cases[i]);
        fx_case *c = fx_load(full);
        bool training = i < 2;
        for (int di = 0; di < 2; di++)
            for (int l = 0; l < N_LAYOUTS; l++) {
                em_dtype dt = float_dtypes[di];
                em_scope_begin();
                snprintf(what, sizeof what, "%s %s %s", full, em_dtype_name(dt), layout_name[l]);
                em_tensor *x = fx_make(fx_need(c, "x"), dt, l), *w = fx_make(fx_need(c, "w"), dt, l),
                          *b = fx_make(fx_need(c, "b"), dt, l);
                /* The running stats are updated in place, whatever their layout. */
                em_tensor *rm = fx_make(fx_need(c, "rm0"), dt, l),
                          *rv = fx_make(fx_need(c, "rv0"), dt, l);
                uint64_t v0 = em_tensor_version(rm);
                em_tensor *y, *sm, *si;
                cr_assert_eq(em_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5, &y, &sm, &si),
                             EM_OK, "%s: %s", what, em_last_error());
                check_fx(y, fx_need(c, "y"), dt, what);
                check_fx(sm, fx_need(c, "sm"), dt, what);
                check_fx(si, fx_need(c, "si"), dt, what);
                check_fx(rm, fx_need(c, "rm"), dt, what);
                check_fx(rv, fx_need(c, "rv"), dt, what);
                cr_assert(!training || em_tensor_version(rm) > v0, "%s: version not bumped", what);
                em_tensor *gx, *gw, *gb;
                cr_assert_eq(em_batch_norm_backward(fx_make(fx_need(c, "gy"), dt, l), x, w, sm, si,
                                                    training, &gx, &gw, &gb),
                             EM_OK, "%s: %s", what, em_last_error());
                check_fx(gx, fx_need(c, "gx"), dt, what);
                check_fx(gw, fx_need(c, "gw"), dt, what);
                check_fx(gb, fx_need(c, "gb"), dt, what);
                em_scope_end();
            }
        fx_free(c);
    }
}

Test(norm, batch_norm_options_and_errors) {
    em_scope_begin();
    fx_case *c = fx_load("batch_norm_train");
    /* No weight, bias or running stats: y is the plain normalisation (w = 1, b = 0). */
    const fx_tensor *fy = fx_need(c, "y"), *fw = fx_need(c, "w"), *fb = fx_need(c, "b");
    em_tensor *x = fx_make(fx_need(c, "x"), EM_F64, CONTIG), *y;
    cr_assert_eq(em_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, &y, NULL, NULL), EM_OK,
                 "%s", em_last_error());
    double *want = malloc(sizeof(double) * (size_t)fy->n);
    int64_t C = fy->shape[1], HW = fy->shape[2] * fy->shape[3];
    for (int64_t i = 0; i < fy->n; i++) {
        int64_t ch = i / HW % C;
        want[i] = (fy->v[i] - fb->v[ch]) / fw->v[ch];
    }
    check_close(y, want, fy->n, 1e-9, 1e-9, "batch_norm without affine parameters");
    free(want);
    fx_free(c);
    em_tensor *x1 = em_zeros(4, (int64_t[]){1, 3, 1, 1}, EM_F32, em_cpu());
    cr_assert_neq(em_batch_norm(x1, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, &y, NULL, NULL), EM_OK);
    em_assert_error(EM_ERR_INVALID, "expected more than 1 value per channel when training, got "
                    "input [1, 3, 1, 1]");
    em_tensor *x2 = em_zeros(4, (int64_t[]){2, 3, 2, 2}, EM_F32, em_cpu());
    cr_assert_neq(em_batch_norm(x2, NULL, NULL, NULL, NULL, false, 0.1, 1e-5, &y, NULL, NULL), EM_OK);
    em_assert_error(EM_ERR_INVALID, "needs running_mean and running_var");
    em_tensor *w4 = em_ones(1, (int64_t[]){4}, EM_F32, em_cpu());
    cr_assert_neq(em_batch_norm(x2, w4, NULL, NULL, NULL, true, 0.1, 1e-5, &y, NULL, NULL), EM_OK);
    em_assert_error(EM_ERR_SHAPE, "weight [4] does not match the 3 channels of input [2, 3, 2, 2]");
    em_scope_end();
}

Test(norm, layer_norm_against_pytorch) {
    static const char *const cases[] = {"last", "last2"};
    char full[64], what[160];
    for (size_t i = 0; i < 2; i++) {
        snprintf(full, sizeof full, "layer_norm_%s", cases[i]);
        fx_case *c = fx_load(full);
        int k = (int)fx_int(c, "k", 0);
        const fx_tensor *fx = fx_need(c, "x");
        for (int di = 0; di < 2; di++)
            for (int l = 0; l < N_LAYOUTS; l++) {
                em_dtype dt = float_dtypes[di];
                em_scope_begin();
                snprintf(what, sizeof what, "%s %s %s", full, em_dtype_name(dt), layout_name[l]);
                em_tensor *x = fx_make(fx, dt, l), *w = fx_make(fx_need(c, "w"), dt, l);
                em_tensor *y, *mean, *rstd, *gx, *gw, *gb;
                cr_assert_eq(em_layer_norm(x, k, fx->shape + fx->ndim - k, w,
                                           fx_make(fx_need(c, "b"), dt, l), 1e-5, &y, &mean, &rstd),
                             EM_OK, "%s: %s", what, em_last_error());
                check_fx(y, fx_need(c, "y"), dt, what);
                check_fx(mean, fx_need(c, "mean"), dt, what);
                check_fx(rstd, fx_need(c, "rstd"), dt, what);
                cr_assert_eq(em_layer_norm_backward(fx_make(fx_need(c, "gy"), dt, l), x, mean, rstd,
                                                    w, k, &gx, &gw, &gb),
                             EM_OK, "%s: %s", what, em_last_error());
                check_fx(gx, fx_need(c, "gx"), dt, what);
                check_fx(gw, fx_need(c, "gw"), dt, what);
                check_fx(gb, fx_need(c, "gb"), dt, what);
                em_scope_end();
            }
        fx_free(c);
    }
}

Test(norm, layer_norm_errors) {
    em_scope_begin();
    em_tensor *x = em_zeros(3, (int64_t[]){2, 3, 4}, EM_F32, em_cpu()), *y;
    cr_assert_neq(em_layer_norm(x, 1, (int64_t[]){3}, NULL, NULL, 1e-5, &y, NULL, NULL), EM_OK);
    em_assert_error(EM_ERR_SHAPE, "normalized_shape [3] is not the last dims of input [2, 3, 4]");
    em_tensor *w = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
    cr_assert_neq(em_layer_norm(x, 1, (int64_t[]){4}, w, NULL, 1e-5, &y, NULL, NULL), EM_OK);
    em_assert_error(EM_ERR_SHAPE, "weight [3] does not match the last 1 dims of input [2, 3, 4]");
    em_scope_end();
}

/* ---- softmax ----------------------------------------------------------------------------------- */

Test(softmax, against_pytorch) {
    static const char *const cases[] = {"d1", "dlast", "d0"};
    char full[64], what[160];
    for (size_t i = 0; i < 3; i++) {
        snprintf(full, sizeof full, "softmax_%s", cases[i]);
        fx_case *c = fx_load(full);
        int dim = (int)fx_int(c, "dim", 0);
        for (int di = 0; di < 2; di++)
            for (int l = 0; l < N_LAYOUTS; l++) {
                em_dtype dt = float_dtypes[di];
                em_scope_begin();
                snprintf(what, sizeof what, "%s %s %s", full, em_dtype_name(dt), layout_name[l]);
                em_tensor *x = fx_make(fx_need(c, "x"), dt, l), *gy = fx_make(fx_need(c, "gy"), dt, l);
                em_tensor *y = em_softmax(x, dim), *ly = em_log_softmax(x, dim);
                check_fx(y, fx_need(c, "y"), dt, what);
                check_fx(ly, fx_need(c, "ly"), dt, what);
                check_fx(em_softmax_backward(gy, y, dim), fx_need(c, "gx"), dt, what);
                check_fx(em_log_softmax_backward(gy, ly, dim), fx_need(c, "lgx"), dt, what);
                em_scope_end();
            }
        fx_free(c);
    }
}

/* Large logits do not overflow; an empty tensor gives an empty result; bf16 rounds the f32
 * result once; dims are checked. */
Test(softmax, stable_empty_bf16_errors) {
    em_scope_begin();
    double v[4] = {1000, 1001, -1000, 0};
    em_tensor *x = make(EM_F32, 2, (int64_t[]){2, 2}, v, CONTIG);
    double e = exp(-1.0), want[4] = {e / (1 + e), 1 / (1 + e), 0, 1};
    check_close(em_softmax(x, 1), want, 4, 1e-6, 1e-7, "softmax of large logits");
    double lwant[4] = {-1 - log1p(e), -log1p(e), -1000, 0};
    check_close(em_log_softmax(x, -1), lwant, 4, 1e-6, 1e-5, "log_softmax of large logits");
    em_tensor *z = em_zeros(2, (int64_t[]){0, 3}, EM_F64, em_cpu());
    em_tensor *zs = em_softmax(z, 1);
    cr_assert(zs && em_tensor_numel(zs) == 0, "%s", em_last_error());
    double vb[12];
    em_test_fill_random(vb, 12, 5);
    em_tensor *xb = make(EM_BF16, 2, (int64_t[]){3, 4}, vb, TRANSPOSED);
    em_tensor *yb = em_softmax(xb, 1);
    cr_assert(yb && em_tensor_dtype(yb) == EM_BF16, "%s", em_last_error());
    int64_t n;
    double *vf = host(em_softmax(em_to_dtype(xb, EM_F32), 1), &n);
    check_close(yb, vf, n, 0x1p-7, 1e-3, "bf16 softmax vs f32");
    free(vf);
    cr_assert_null(em_softmax(x, 2));
    em_assert_error(EM_ERR_RANGE, "softmax");
    em_tensor *xi = em_zeros(1, (int64_t[]){3}, EM_I32, em_cpu());
    cr_assert_null(em_log_softmax(xi, 0));
    em_assert_error(EM_ERR_DTYPE, "log_softmax: expected a floating input, got int32");
    em_scope_end();
}

/* ---- oneDNN pooling, normalisation and softmax vs the loops ---------------------------------- */

/*
 * Each case runs every forward and backward op of one family on random data and returns all
 * results concatenated: in f32 with the oneDNN kernels, in f32 with the loops
 * (EMBER_CPU_DISABLE_DNNL=1 and a re-init) and in f64 (the loops). The f32 runs must match f64
 * (rtol = atol = 2e-4: f32 sums of up to 600 values) and, as the oneDNN kernels accumulate in
 * f32 and the loops in double, the two f32 runs must differ somewhere: had oneDNN declined
 * the call, they would be the same numbers.
 */
typedef struct nn_out {
    double *v;
    int64_t n, cap;
} nn_out;

static void out_add(nn_out *o, const em_tensor *t) {
    int64_t n;
    double *v = host(t, &n);
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2;
        o->v = realloc(o->v, sizeof(double) * (size_t)o->cap);
    }
    memcpy(o->v + o->n, v, sizeof(double) * (size_t)n);
    o->n += n;
    free(v);
}

static em_tensor *rnd(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)n);
    em_test_fill_random(v, n, seed);
    em_tensor *t = make(dt, ndim, shape, v, CONTIG);
    free(v);
    return t;
}

static void case_avg_pool(em_dtype dt, nn_out *o) {
    int64_t xs[4] = {2, 3, 11, 13}, k[2] = {3, 3}, s[2] = {2, 2}, p[2] = {1, 1}, hw[2] = {11, 13};
    em_tensor *x = rnd(dt, 4, xs, 21);
    for (int cip = 0; cip < 2; cip++) {
        em_tensor *y = em_avg_pool2d(x, k, s, p, false, cip);
        out_add(o, y);
        out_add(o, em_avg_pool2d_backward(rnd(dt, 4, em_tensor_shape(y), 22), hw, k, s, p, false,
                                          cip));
    }
}

static void case_adaptive(em_dtype dt, nn_out *o) {
    int64_t xs[4] = {2, 3, 12, 9}, os[2] = {4, 3}, gs[4] = {2, 3, 4, 3}, hw[2] = {12, 9};
    out_add(o, em_adaptive_avg_pool2d(rnd(dt, 4, xs, 23), os));
    out_add(o, em_adaptive_avg_pool2d_backward(rnd(dt, 4, gs, 24), hw));
}

static void case_batch_norm(em_dtype dt, nn_out *o) {
    int64_t xs[4] = {4, 5, 6, 7}, cs[1] = {5};
    em_tensor *x = rnd(dt, 4, xs, 25), *w = rnd(dt, 1, cs, 26), *b = rnd(dt, 1, cs, 27);
    em_tensor *gy = rnd(dt, 4, xs, 28);
    for (int mode = 0; mode < 3; mode++) { /* training; training without affine; evaluation */
        bool training = mode < 2;
        em_tensor *rm = rnd(dt, 1, cs, 29), *rv = em_abs(rnd(dt, 1, cs, 30));
        const em_tensor *ww = mode == 1 ? NULL : w, *bb = mode == 1 ? NULL : b;
        em_tensor *y, *sm, *si, *gx, *gw, *gb;
        cr_assert_eq(em_batch_norm(x, ww, bb, rm, rv, training, 0.1, 1e-5, &y, &sm, &si), EM_OK,
                     "%s", em_last_error());
        out_add(o, y), out_add(o, sm), out_add(o, si), out_add(o, rm), out_add(o, rv);
        cr_assert_eq(em_batch_norm_backward(gy, x, ww, sm, si, training, &gx, &gw, &gb), EM_OK,
                     "%s", em_last_error());
        out_add(o, gx), out_add(o, gw), out_add(o, gb);
    }
}

static void case_layer_norm(em_dtype dt, nn_out *o) {
    int64_t xs[3] = {6, 10, 12};
    em_tensor *x = rnd(dt, 3, xs, 31), *gy = rnd(dt, 3, xs, 32);
    for (int k = 1; k <= 2; k++)
        for (int affine = 0; affine < 2; affine++) {
            const int64_t *ns = xs + 3 - k;
            em_tensor *w = affine ? rnd(dt, k, ns, 33) : NULL, *b = affine ? rnd(dt, k, ns, 34) : NULL;
            em_tensor *y, *mean, *rstd, *gx, *gw, *gb;
            cr_assert_eq(em_layer_norm(x, k, ns, w, b, 1e-5, &y, &mean, &rstd), EM_OK, "%s",
                         em_last_error());
            out_add(o, y), out_add(o, mean), out_add(o, rstd);
            cr_assert_eq(em_layer_norm_backward(gy, x, mean, rstd, w, k, &gx, &gw, &gb), EM_OK,
                         "%s", em_last_error());
            out_add(o, gx), out_add(o, gw), out_add(o, gb);
        }
}

static void case_softmax(em_dtype dt, nn_out *o) {
    int64_t xs[3] = {4, 50, 3};
    em_tensor *x = rnd(dt, 3, xs, 35), *gy = rnd(dt, 3, xs, 36);
    for (int dim = 1; dim <= 2; dim++) {
        em_tensor *y = em_softmax(x, dim), *ly = em_log_softmax(x, dim);
        out_add(o, y), out_add(o, ly);
        out_add(o, em_softmax_backward(gy, y, dim));
        out_add(o, em_log_softmax_backward(gy, ly, dim));
    }
}

static nn_out run_case(void (*fn)(em_dtype, nn_out *), em_dtype dt) {
    nn_out o = {0};
    cr_assert_eq(em_scope_begin(), EM_OK);
    fn(dt, &o);
    cr_assert_eq(em_scope_end(), EM_OK);
    return o;
}

Test(dnnl, pool_norm_softmax_match_loops) {
    em_test_needs_onednn();
    static const struct {
        const char *name, *kernel;
        void (*fn)(em_dtype, nn_out *);
    } cs[] = {
        {"avg_pool2d", "cpu_avg_pool2d_dnnl_f32", case_avg_pool},
        {"adaptive_avg_pool2d", "cpu_adaptive_avg_pool2d_dnnl_f32", case_adaptive},
        {"batch_norm", "cpu_batch_norm_dnnl_f32", case_batch_norm},
        {"layer_norm", "cpu_layer_norm_dnnl_f32", case_layer_norm},
        {"softmax", "cpu_softmax_dnnl_f32", case_softmax},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        cr_assert(kernel_registered(cs[i].kernel), "%s is not registered", cs[i].kernel);
        nn_out dn = run_case(cs[i].fn, EM_F32), ref = run_case(cs[i].fn, EM_F64);
        em_test_assert_clean_shutdown();
        setenv("EMBER_CPU_DISABLE_DNNL", "1", 1);
        cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
        cr_assert(!kernel_registered(cs[i].kernel));
        nn_out loops = run_case(cs[i].fn, EM_F32);
        em_test_assert_clean_shutdown();
        unsetenv("EMBER_CPU_DISABLE_DNNL");
        cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
        cr_assert_eq(dn.n, ref.n);
        cr_assert_eq(loops.n, ref.n);
        int64_t differ = 0;
        for (int64_t j = 0; j < ref.n; j++) {
            double tol = 2e-4 + 2e-4 * fabs(ref.v[j]);
            cr_assert(fabs(dn.v[j] - ref.v[j]) <= tol, "%s: oneDNN f32 result %lld is %.9g, "
                      "f64 loops %.9g", cs[i].name, (long long)j, dn.v[j], ref.v[j]);
            cr_assert(fabs(loops.v[j] - ref.v[j]) <= tol, "%s: f32 loops result %lld is %.9g, "
                      "f64 loops %.9g", cs[i].name, (long long)j, loops.v[j], ref.v[j]);
            differ += dn.v[j] != loops.v[j];
        }
        cr_assert(differ > 0, "%s: the oneDNN f32 results equal the loops' bit for bit: the "
                  "oneDNN kernel did not run", cs[i].name);
        free(dn.v), free(ref.v), free(loops.v);
    }
}

/* The same primitive from several threads at once: each call gets its own execution state
 * when the cached one is in use, so the results equal a single-threaded run's. */
typedef struct conc_arg {
    const em_tensor *x, *w;
    double *y;
    int64_t n;
    int rounds;
} conc_arg;

static void *conc_conv(void *p) {
    conc_arg *a = p;
    for (int r = 0; r < a->rounds; r++) {
        em_scope_begin();
        em_tensor *y = em_conv2d(a->x, a->w, NULL, NULL, (int64_t[]){1, 1}, NULL, 1);
        if (y && em_tensor_to_host(em_to_dtype(y, EM_F64), a->y + (int64_t)r * a->n,
                                   sizeof(double) * (size_t)a->n) != EM_OK)
            a->y[(int64_t)r * a->n] = NAN;
        if (!y) a->y[(int64_t)r * a->n] = NAN;
        em_scope_end();
    }
    return NULL;
}

Test(dnnl, concurrent_calls_on_one_primitive) {
    em_scope_begin();
    int64_t xs[4] = {2, 8, 10, 10}, ws[4] = {16, 8, 3, 3};
    em_tensor *x = rnd(EM_F32, 4, xs, 41), *w = rnd(EM_F32, 4, ws, 42);
    int64_t n;
    double *want = host(em_conv2d(x, w, NULL, NULL, (int64_t[]){1, 1}, NULL, 1), &n);
    enum { THREADS = 4, ROUNDS = 20 };
    pthread_t th[THREADS];
    conc_arg a[THREADS];
    for (int t = 0; t < THREADS; t++) {
        a[t] = (conc_arg){.x = x, .w = w, .n = n, .rounds = ROUNDS,
                          .y = malloc(sizeof(double) * (size_t)(n * ROUNDS))};
        cr_assert_eq(pthread_create(&th[t], NULL, conc_conv, &a[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++) {
        for (int64_t j = 0; j < n * ROUNDS; j++)
            cr_assert(a[t].y[j] == want[j % n], "thread %d, round %lld, element %lld: %.9g, "
                      "want %.9g", t, (long long)(j / n), (long long)(j % n), a[t].y[j],
                      want[j % n]);
        free(a[t].y);
    }
    free(want);
    em_scope_end();
}

/* ---- max_pool2d's 2x2 stride-2 path (AVX-512 or AVX2 where the CPU has it) ------------------- */

/* PyTorch's rule in a plain loop: window scanned row-major, a greater value or a NaN takes
 * over. x (planes, H, W) -> y, idx (planes, OH, OW), 2x2 window, stride 2, no padding. */
static void ref_pool2(const double *x, int64_t planes, int64_t H, int64_t W, int64_t OH,
                      int64_t OW, double *y, int64_t *idx) {
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                double m = -INFINITY;
                int64_t best = 2 * oh * W + 2 * ow;
                for (int64_t h = 2 * oh; h < 2 * oh + 2 && h < H; h++)
                    for (int64_t w = 2 * ow; w < 2 * ow + 2 && w < W; w++) {
                        double v = x[pl * H * W + h * W + w];
                        if (v > m || isnan(v)) m = v, best = h * W + w;
                    }
                y[pl * OH * OW + oh * OW + ow] = m;
                idx[pl * OH * OW + oh * OW + ow] = best;
            }
}

Test(pool, max_pool2x2_fast_path) {
    static const struct {
        int64_t n, c, h, w;
        bool ceil;
    } cs[] = {{3, 2, 28, 28, false}, {2, 3, 14, 14, false}, {1, 2, 9, 70, true},
              {1, 2, 9, 70, false},  {2, 1, 5, 33, true},   {1, 1, 1, 1, true}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        em_scope_begin();
        int64_t xs[4] = {cs[i].n, cs[i].c, cs[i].h, cs[i].w}, nx = xs[0] * xs[1] * xs[2] * xs[3];
        double *v = malloc(sizeof(double) * (size_t)nx);
        em_test_fill_random(v, nx, 50 + i);
        /* Ties (few distinct values), -inf, and NaNs (some windows with two). */
        for (int64_t j = 0; j < nx; j++) {
            v[j] = floor(v[j]);
            if (j % 37 == 5 || j % 41 == 6) v[j] = NAN;
            if (j % 43 == 7) v[j] = -INFINITY;
        }
        int64_t OH = cs[i].ceil ? (xs[2] + 1) / 2 : xs[2] / 2, OW = cs[i].ceil ? (xs[3] + 1) / 2 : xs[3] / 2;
        int64_t ny = xs[0] * xs[1] * OH * OW;
        double *wy = malloc(sizeof(double) * (size_t)ny), *wi = malloc(sizeof(double) * (size_t)ny);
        int64_t *ri = malloc(sizeof(int64_t) * (size_t)ny);
        ref_pool2(v, xs[0] * xs[1], xs[2], xs[3], OH, OW, wy, ri);
        for (int64_t j = 0; j < ny; j++) wi[j] = (double)ri[j];
        char what[96];
        snprintf(what, sizeof what, "max_pool2d 2x2 of [%lld, %lld, %lld, %lld]%s",
                 (long long)xs[0], (long long)xs[1], (long long)xs[2], (long long)xs[3],
                 cs[i].ceil ? " ceil_mode" : "");
        em_tensor *y, *idx;
        cr_assert_eq(em_max_pool2d(make(EM_F32, 4, xs, v, CONTIG), (int64_t[]){2, 2}, NULL, NULL,
                                   NULL, cs[i].ceil, &y, &idx), EM_OK, "%s: %s", what,
                     em_last_error());
        check_close(y, wy, ny, 0, 0, what);
        check_close(idx, wi, ny, 0, 0, what);
        /* The backward scatters to those indices: a plain-loop reference. */
        double *g = malloc(sizeof(double) * (size_t)ny), *wg = calloc((size_t)nx, sizeof(double));
        em_test_fill_random(g, ny, 70 + i);
        int64_t HW = xs[2] * xs[3];
        for (int64_t j = 0; j < ny; j++) wg[j / (OH * OW) * HW + ri[j]] += (double)(float)g[j];
        em_tensor *gx = em_max_pool2d_backward(make(EM_F32, 4, em_tensor_shape(y), g, CONTIG), idx,
                                               xs + 2);
        check_close(gx, wg, nx, 1e-6, 1e-6, what);
        free(v), free(wy), free(wi), free(ri), free(g), free(wg);
        em_scope_end();
    }
}

/* ---- channels-last activations (docs/performance.md, design (b)) -------------------------------- */

/* The layout does not depend on which kernel ran: f64 and f16 convolutions have no kernel that
 * reads channels-last (they run on contiguous copies, f16 through f32), yet a channels-last
 * input still gives a channels-last output, equal to the row-major call's. */
Test(layout, conv2d_fallback_keeps_channels_last) {
    const em_dtype dts[2] = {EM_F64, EM_F16};
    for (int k = 0; k < 2; k++) {
        em_scope_begin();
        int64_t xs[4] = {2, 3, 6, 5}, ws[4] = {4, 3, 3, 3}, nx = 2 * 3 * 6 * 5, nw = 4 * 3 * 3 * 3;
        double *v = malloc(sizeof(double) * (size_t)nx), *w = malloc(sizeof(double) * (size_t)nw);
        em_test_fill_random(v, nx, 95);
        em_test_fill_random(w, nw, 96);
        em_tensor *x = make(dts[k], 4, xs, v, CONTIG), *wt = make(dts[k], 4, ws, w, CONTIG);
        em_tensor *y = em_conv2d(x, wt, NULL, NULL, (int64_t[]){1, 1}, NULL, 1);
        em_tensor *yl = em_conv2d(em_channels_last(x), wt, NULL, NULL, (int64_t[]){1, 1}, NULL, 1);
        cr_assert(y && yl, "%s", em_last_error());
        cr_assert(em_tensor_is_channels_last(yl) && !em_tensor_is_channels_last(y), "%s",
                  em_dtype_name(dts[k]));
        int64_t ny, nyl;
        double *a = host(y, &ny), *b = host(em_contiguous(yl), &nyl);
        cr_assert_eq(ny, nyl);
        for (int64_t j = 0; j < ny; j++)
            cr_assert_eq(a[j], b[j], "%s element %lld: %g row-major, %g channels-last",
                         em_dtype_name(dts[k]), (long long)j, a[j], b[j]);
        free(v), free(w), free(a), free(b);
        em_scope_end();
    }
}

/* Max pooling on a channels-last input against the plain-loop reference: the same maxima,
 * the same plane indices (h*W + w) and the same backward sums, bit for bit, with the outputs
 * channels-last; generic windows too (3x3, stride 2, padding 1, ceil). */
Test(layout, max_pool2d_channels_last) {
    for (int dt = 0; dt < 2; dt++) {
        em_dtype d = dt ? EM_F64 : EM_F32;
        em_scope_begin();
        int64_t xs[4] = {2, 5, 9, 8}, nx = 2 * 5 * 9 * 8;
        double *v = malloc(sizeof(double) * (size_t)nx);
        em_test_fill_random(v, nx, 91);
        for (int64_t j = 0; j < nx; j++) {
            v[j] = floor(v[j] * 2); /* ties */
            if (j % 31 == 4) v[j] = NAN;
        }
        em_tensor *x = make(d, 4, xs, v, CONTIG), *xl = em_channels_last(x);
        cr_assert(em_tensor_is_channels_last(xl) && !em_tensor_is_channels_last(x));
        const int64_t ks[2][2] = {{2, 2}, {3, 3}}, ss[2][2] = {{2, 2}, {2, 2}}, ps[2][2] = {{0, 0}, {1, 1}};
        for (int c = 0; c < 2; c++) {
            em_tensor *y, *idx, *yl, *idxl;
            cr_assert_eq(em_max_pool2d(x, ks[c], ss[c], ps[c], NULL, c == 1, &y, &idx), EM_OK, "%s",
                         em_last_error());
            cr_assert_eq(em_max_pool2d(xl, ks[c], ss[c], ps[c], NULL, c == 1, &yl, &idxl), EM_OK,
                         "%s", em_last_error());
            cr_assert(em_tensor_is_channels_last(yl) && em_tensor_is_channels_last(idxl),
                      "max_pool2d keeps channels-last");
            int64_t ny = em_tensor_numel(y);
            double *wy = malloc(sizeof(double) * (size_t)ny), *wi = malloc(sizeof(double) * (size_t)ny);
            em_tensor *y64 = em_to_dtype(y, EM_F64), *i64 = em_to_dtype(idx, EM_F64);
            cr_assert_eq(em_tensor_to_host(y64, wy, sizeof(double) * (size_t)ny), EM_OK);
            cr_assert_eq(em_tensor_to_host(i64, wi, sizeof(double) * (size_t)ny), EM_OK);
            check_close(yl, wy, ny, 0, 0, "channels-last max_pool2d output");
            check_close(idxl, wi, ny, 0, 0, "channels-last max_pool2d indices");
            if (c == 0) { /* the 2x2 plain path against ref_pool2 as well */
                int64_t *ri = malloc(sizeof(int64_t) * (size_t)ny);
                double *ry = malloc(sizeof(double) * (size_t)ny), *rw = malloc(sizeof(double) * (size_t)ny);
                ref_pool2(v, 10, 9, 8, 4, 4, ry, ri);
                for (int64_t j = 0; j < ny; j++) rw[j] = (double)ri[j];
                if (d == EM_F64) check_close(yl, ry, ny, 0, 0, "channels-last 2x2 against the loop");
                check_close(idxl, rw, ny, 0, 0, "channels-last 2x2 indices against the loop");
                free(ri), free(ry), free(rw);
            }
            /* Backward: a row-major grad (what a flatten's backward gives) and a channels-last one. */
            double *g = malloc(sizeof(double) * (size_t)ny), *wg = malloc(sizeof(double) * (size_t)nx);
            em_test_fill_random(g, ny, 92);
            em_tensor *gy = make(d, 4, em_tensor_shape(y), g, CONTIG);
            em_tensor *gx = em_max_pool2d_backward(gy, idx, xs + 2);
            cr_assert(gx, "%s", em_last_error());
            cr_assert_eq(em_tensor_to_host(em_to_dtype(gx, EM_F64), wg, sizeof(double) * (size_t)nx), EM_OK);
            em_tensor *gxl = em_max_pool2d_backward(gy, idxl, xs + 2);
            em_tensor *gxl2 = em_max_pool2d_backward(em_channels_last(gy), idxl, xs + 2);
            cr_assert(gxl && gxl2, "%s", em_last_error());
            cr_assert(em_tensor_is_channels_last(gxl) && em_tensor_is_channels_last(gxl2));
            check_close(gxl, wg, nx, 0, 0, "channels-last max_pool2d_backward (row-major grad)");
            check_close(gxl2, wg, nx, 0, 0, "channels-last max_pool2d_backward");
            free(wy), free(wi), free(g), free(wg);
        }
        free(v);
        em_scope_end();
    }
}

/* The channels-last backward of a 2x2 tiling (gx is 2OH x 2OW, as in the bench CNN) writes each
 * gx element directly when every index lies in its own output's tile: the same values and
 * bits as the row-major scatter (a -0 grad gives +0 there, as 0 + -0 does), from a row-major
 * or a channels-last grad; indices that point into another tile (a caller's own, in range)
 * get the scatter's sums. */
Test(layout, max_pool2d_backward_tiles) {
    for (int dt = 0; dt < 2; dt++) {
        em_dtype d = dt ? EM_F64 : EM_F32;
        em_scope_begin();
        const int64_t xs[4] = {2, 5, 8, 6}, ys[4] = {2, 5, 4, 3}, HW = 8 * 6, P = 4 * 3;
        const int64_t nx = 2 * 5 * HW, ny = 2 * 5 * P;
        double *v = malloc(sizeof(double) * (size_t)nx), *g = malloc(sizeof(double) * (size_t)ny);
        em_test_fill_random(v, nx, 97);
        em_test_fill_random(g, ny, 98);
        for (int64_t j = 0; j < ny; j++)
            if (j % 7 == 3) g[j] = -0.0;
        em_tensor *y, *idx;
        cr_assert_eq(em_max_pool2d(em_channels_last(make(d, 4, xs, v, CONTIG)), (int64_t[]){2, 2},
                                   NULL, NULL, NULL, false, &y, &idx), EM_OK, "%s", em_last_error());
        int64_t n;
        double *iv = host(idx, &n);
        for (int other = 0; other < 2; other++) {
            if (other) { /* some indices in another tile of their plane, or on another's winner */
                iv[3 * P + 4] = 0;
                iv[7 * P + 11] = HW - 1;
                iv[8 * P + 5] = iv[8 * P + 6];
            }
            em_tensor *il = em_channels_last(make(EM_I64, 4, ys, iv, CONTIG));
            cr_assert(il && em_tensor_is_channels_last(il), "%s", em_last_error());
            double *want = calloc((size_t)nx, sizeof(double));
            for (int64_t j = 0; j < ny; j++)
                want[j / P * HW + (int64_t)iv[j]] += d == EM_F32 ? (double)(float)g[j] : g[j];
            em_tensor *gy = make(d, 4, ys, g, CONTIG);
            em_tensor *plain = em_max_pool2d_backward(gy, em_contiguous(il), xs + 2);
            em_tensor *gxs[2] = {em_max_pool2d_backward(gy, il, xs + 2),
                                 em_max_pool2d_backward(em_channels_last(gy), il, xs + 2)};
            int64_t np;
            double *pv = host(plain, &np);
            for (int k = 0; k < 2; k++) {
                cr_assert(gxs[k] && em_tensor_is_channels_last(gxs[k]), "%s", em_last_error());
                check_close(gxs[k], want, nx, 1e-6, 0, "channels-last 2x2 max_pool2d_backward");
                double *gv = host(gxs[k], &n);
                for (int64_t j = 0; j < nx; j++)
                    cr_assert(memcmp(&gv[j], &pv[j], sizeof(double)) == 0,
                              "%s, %s grad, indices %s: element %lld is %g, the row-major "
                              "scatter's %g", em_dtype_name(d), k ? "channels-last" : "row-major",
                              other ? "in other tiles" : "from the forward", (long long)j, gv[j],
                              pv[j]);
                free(gv);
            }
            free(pv), free(want);
        }
        free(v), free(g), free(iv);
        em_scope_end();
    }
}

/* The CNN of bench/train_step (conv, ReLU, pool twice, flatten, linear) on a one-channel
 * input made channels-last against the same network on row-major tensors: every activation
 * stays channels-last up to the flatten, the forward and every parameter's gradient agree
 * within f32 rounding (the convolutions run other oneDNN kernels), and the loss is finite. */
Test(layout, channels_last_cnn) {
    em_scope_begin();
    int64_t xs[4] = {4, 1, 12, 12}, w1s[4] = {8, 1, 3, 3}, w2s[4] = {16, 8, 3, 3}, fs[2] = {3, 16 * 3 * 3};
    int64_t n1 = 8 * 9, n2 = 16 * 8 * 9, nf = 3 * 144, nx = 4 * 144;
    double *v = malloc(sizeof(double) * (size_t)(nx + n1 + n2 + nf + 24));
    em_test_fill_random(v, nx + n1 + n2 + nf + 24, 93);
    em_tensor *grads[2][5];
    double loss[2];
    for (int cl = 0; cl < 2; cl++) {
        em_tensor *p[5] = {make(EM_F32, 4, w1s, v + nx, CONTIG), make(EM_F32, 1, w1s, v + nx + n1, CONTIG),
                           make(EM_F32, 4, w2s, v + nx + n1, CONTIG),
                           make(EM_F32, 1, w2s, v + nx + n1 + n2, CONTIG),
                           make(EM_F32, 2, fs, v + nx + n1 + n2, CONTIG)};
        for (int i = 0; i < 5; i++) em_requires_grad_(p[i], true);
        em_tensor *x = make(EM_F32, 4, xs, v, CONTIG);
        if (cl) x = em_channels_last(x);
        const int64_t pad[2] = {1, 1}, k2[2] = {2, 2};
        em_tensor *a = em_relu(em_conv2d(x, p[0], p[1], NULL, pad, NULL, 1));
        cr_assert(a && (!cl || em_tensor_is_channels_last(a)), "conv1 + relu: %s", em_last_error());
        cr_assert_eq(em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL), EM_OK);
        cr_assert(!cl || em_tensor_is_channels_last(a), "pool1");
        a = em_relu(em_conv2d(a, p[2], p[3], NULL, pad, NULL, 1));
        cr_assert(a && (!cl || em_tensor_is_channels_last(a)), "conv2 + relu: %s", em_last_error());
        cr_assert_eq(em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL), EM_OK);
        cr_assert(!cl || em_tensor_is_channels_last(a), "pool2");
        em_tensor *h = em_linear(em_flatten(a, 1, 3), p[4], NULL);
        em_tensor *l = em_sum(em_mul(h, h), 0, NULL, false);
        cr_assert(l, "%s", em_last_error());
        loss[cl] = em_item(l);
        cr_assert_eq(em_backward(l), EM_OK, "%s", em_last_error());
        for (int i = 0; i < 5; i++) {
            grads[cl][i] = em_tensor_grad(p[i]);
            cr_assert(grads[cl][i] && em_tensor_is_contiguous(grads[cl][i]), "grad %d plain", i);
        }
    }
    cr_assert(isfinite(loss[0]) && fabs(loss[1] - loss[0]) <= 1e-4 * fabs(loss[0]), "loss %g vs %g",
              loss[1], loss[0]);
    for (int i = 0; i < 5; i++) {
        int64_t n = em_tensor_numel(grads[0][i]);
        double *want = malloc(sizeof(double) * (size_t)n);
        cr_assert_eq(em_tensor_to_host(em_to_dtype(grads[0][i], EM_F64), want, sizeof(double) * (size_t)n), EM_OK);
        double scale = 0;
        for (int64_t j = 0; j < n; j++) scale = fmax(scale, fabs(want[j]));
        char what[64];
        snprintf(what, sizeof what, "channels-last CNN: parameter %d's gradient", i);
        check_close(grads[1][i], want, n, 1e-4, 1e-5 * scale, what);
        free(want);
    }
    free(v);
    em_scope_end();
}

/* ---- conv2d_relu, the fused op (docs/performance.md, "Design: fused ops") -------------------- */

TestSuite(fused, .init = em_test_setup, .fini = em_test_teardown);

/* a and b hold the same bits (same shape and dtype; any layout). */
static void same_bits(const em_tensor *a, const em_tensor *b, const char *what) {
    cr_assert(a && b, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_dtype(a), em_tensor_dtype(b), "%s", what);
    int64_t n = em_tensor_numel(a);
    cr_assert_eq(n, em_tensor_numel(b), "%s", what);
    size_t bytes = (size_t)n * em_dtype_size(em_tensor_dtype(a));
    unsigned char *u = malloc(bytes ? bytes : 1), *v = malloc(bytes ? bytes : 1);
    cr_assert_eq(em_tensor_to_host(em_contiguous(a), u, bytes), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_to_host(em_contiguous(b), v, bytes), EM_OK, "%s", em_last_error());
    size_t es = em_dtype_size(em_tensor_dtype(a));
    for (size_t i = 0; i < bytes; i += es)
        cr_assert(memcmp(u + i, v + i, es) == 0, "%s: element %zu differs (fused %g, conv2d "
                  "then relu %g)", what, i / es, em_test_at(a, (int64_t)(i / es)),
                  em_test_at(b, (int64_t)(i / es)));
    free(u), free(v);
}

typedef struct {
    int64_t xs[4], ws[4], s, p, g;
    bool bias;
} fused_geom;

/* The CNN's two convolutions (one input channel; 32 to 64 channels, fewer images), a
 * strided, grouped one with bias, on random normal inputs (and one NaN): the fused op's
 * output and its grads (x, weight, bias) have the bits of conv2d then relu, in every floating
 * dtype (f32 runs the oneDNN kernel, conv2d's primitive then relu in place, where it takes
 * the call; f64, f16 and bf16 the composite), row-major and channels-last, and the output keeps a
 * channels-last input's layout. */
Test(fused, conv2d_relu_bits_equal_conv2d_then_relu) {
    const fused_geom gs[] = {{{4, 1, 12, 12}, {32, 1, 3, 3}, 1, 1, 1, true},
                             {{2, 32, 7, 7}, {64, 32, 3, 3}, 1, 1, 1, true},
                             {{2, 4, 9, 8}, {6, 2, 3, 3}, 2, 1, 2, false}};
    const em_dtype dts[] = {EM_F32, EM_BF16, EM_F64, EM_F16};
    for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++)
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
            for (int cl = 0; cl < 2; cl++)
                for (int nan = 0; nan < 2; nan++) {
                    const fused_geom *g = &gs[gi];
                    em_dtype dt = dts[di];
                    char what[128];
                    snprintf(what, sizeof what, "geometry %zu, %s, %s%s", gi, em_dtype_name(dt),
                             cl ? "channels-last" : "row-major", nan ? ", a NaN input" : "");
                    em_scope_begin();
                    em_tensor *x = rnd(dt, 4, g->xs, 300 + gi), *w = rnd(dt, 4, g->ws, 310 + gi);
                    em_tensor *b = g->bias ? rnd(dt, 1, g->ws, 320 + gi) : NULL;
                    if (nan) {
                        em_tensor *x0 = em_slice(em_slice(x, 2, 3, 4, 1), 3, 2, 3, 1);
                        cr_assert_eq(em_fill_(x0, NAN), EM_OK, "%s", em_last_error());
                    }
                    if (cl) x = em_channels_last(x);
                    em_tensor *xd[2], *wd[2], *bd[2] = {NULL, NULL}, *y[2];
                    const int64_t st[2] = {g->s, g->s}, pd[2] = {g->p, g->p};
                    for (int k = 0; k < 2; k++) {
                        xd[k] = em_detach(x), wd[k] = em_detach(w);
                        cr_assert_eq(em_requires_grad_(xd[k], true), EM_OK);
                        cr_assert_eq(em_requires_grad_(wd[k], true), EM_OK);
                        if (b) {
                            bd[k] = em_detach(b);
                            cr_assert_eq(em_requires_grad_(bd[k], true), EM_OK);
                        }
                        y[k] = k ? em_relu(em_conv2d(xd[k], wd[k], bd[k], st, pd, NULL, g->g))
                                 : em_conv2d_relu(xd[k], wd[k], bd[k], st, pd, NULL, g->g);
                        cr_assert(y[k], "%s: %s", what, em_last_error());
                    }
                    same_bits(y[0], y[1], what);
                    cr_assert_eq(em_tensor_is_channels_last(y[0]), (bool)cl, "%s", what);
                    if (nan) {
                        cr_assert(isnan(em_test_at(em_contiguous(y[0]), 3 * g->xs[3] + 2)) ||
                                  g->s != 1, "%s: the NaN did not reach the output", what);
                    } else {
                        /* grads through a weighting of the outputs (sum(y * r)) */
                        em_tensor *r = rnd(dt, 4, em_tensor_shape(y[0]), 330 + gi);
                        for (int k = 0; k < 2; k++)
                            cr_assert_eq(em_backward(em_sum(em_mul(y[k], r), 0, NULL, false)), EM_OK, "%s: %s",
                                         what, em_last_error());
                        char gw[160];
                        snprintf(gw, sizeof gw, "%s, input grad", what);
                        same_bits(em_tensor_grad(xd[0]), em_tensor_grad(xd[1]), gw);
                        snprintf(gw, sizeof gw, "%s, weight grad", what);
                        same_bits(em_tensor_grad(wd[0]), em_tensor_grad(wd[1]), gw);
                        snprintf(gw, sizeof gw, "%s, bias grad", what);
                        if (b) same_bits(em_tensor_grad(bd[0]), em_tensor_grad(bd[1]), gw);
                    }
                    em_scope_end();
                }
}

/* Where the CPU plugin registers it, the fused kernel itself takes the CNN's f32 calls
 * (em_op_call_kernel: no composite around it), row-major and channels-last, and gives the
 * bits of conv2d's kernel then relu. */
Test(fused, conv2d_relu_kernel_is_conv2d_then_relu) {
    if (!kernel_registered("cpu_conv2d_relu_dnnl_f32")) em_test_needs_onednn();
    cr_assert(kernel_registered("cpu_conv2d_relu_dnnl_f32"));
    const em_op *op = em_op_find("conv2d_relu"), *conv = em_op_find("conv2d");
    cr_assert(op && conv);
    em_attr a[4] = {{.type = EM_ATTR_INTS, .n = 2, .ints = {1, 1}},
                    {.type = EM_ATTR_INTS, .n = 2, .ints = {1, 1}},
                    {.type = EM_ATTR_INTS, .n = 2, .ints = {1, 1}},
                    {.type = EM_ATTR_INT, .v.i = 1}};
    for (int cl = 0; cl < 2; cl++) {
        em_scope_begin();
        em_tensor *x = rnd(EM_F32, 4, (int64_t[]){3, 16, 8, 8}, 340), *w =
            rnd(EM_F32, 4, (int64_t[]){32, 16, 3, 3}, 341), *b = rnd(EM_F32, 1, (int64_t[]){32}, 342);
        if (cl) x = em_channels_last(x);
        em_tensor *yf, *yc;
        cr_assert_eq(em_op_call_kernel(op, (const em_tensor *[]){x, w, b}, 3, a, &yf), EM_OK, "%s",
                     em_last_error());
        cr_assert_eq(em_op_call_kernel(conv, (const em_tensor *[]){x, w, b}, 3, a, &yc), EM_OK, "%s",
                     em_last_error());
        same_bits(yf, em_relu(yc), cl ? "channels-last" : "row-major");
        cr_assert_eq(em_tensor_is_channels_last(yf), (bool)cl);
        em_scope_end();
    }
}

/* An output of -inf (an infinite input under positive weights) on row-major and on
 * channels-last f32 activations, for one and for many input channels (the CNN's two
 * convolutions): conv2d_relu gives relu's +0 there, the bits of conv2d then relu (oneDNN's
 * NaN-keeping ReLU post-ops, which the kernel once took on row-major calls, left -inf). */
Test(fused, conv2d_relu_minus_inf_is_zero) {
    const int64_t xs[2][4] = {{2, 1, 6, 6}, {2, 32, 6, 6}}, ws[2][4] = {{8, 1, 3, 3}, {64, 32, 3, 3}};
    const int64_t pd[2] = {1, 1};
    for (int c = 0; c < 4; c++) {
        int gi = c & 1, cl = c >> 1;
        em_scope_begin();
        em_tensor *x = rnd(EM_F32, 4, xs[gi], 350 + gi);
        em_tensor *w = em_add_scalar(em_abs(rnd(EM_F32, 4, ws[gi], 352 + gi)), 0.125);
        em_tensor *x0 = em_slice(em_slice(em_slice(x, 1, 0, 1, 1), 2, 2, 3, 1), 3, 3, 4, 1);
        cr_assert(w && x0, "%s", em_last_error());
        cr_assert_eq(em_fill_(x0, -INFINITY), EM_OK, "%s", em_last_error());
        if (cl) x = em_channels_last(x);
        em_tensor *yf = em_conv2d_relu(x, w, NULL, NULL, pd, NULL, 1);
        em_tensor *yc = em_conv2d(x, w, NULL, NULL, pd, NULL, 1);
        cr_assert(yf && yc, "%s", em_last_error());
        /* image 0, channel 0 at (2, 3): its window holds the -inf */
        int64_t at = 2 * em_tensor_shape(yc)[3] + 3;
        cr_assert(isinf(em_test_at(em_contiguous(yc), at)) && em_test_at(em_contiguous(yc), at) < 0,
                  "geometry %d, channels-last %d: conv2d gave %g, not -inf", gi, cl,
                  em_test_at(em_contiguous(yc), at));
        cr_assert_eq(em_test_at(em_contiguous(yf), at), 0.0, "geometry %d, channels-last %d", gi,
                     cl);
        same_bits(yf, em_relu(yc), gi ? "32 input channels" : "one input channel");
        em_scope_end();
    }
}

/* Errors as conv2d's, naming conv2d_relu, on the kernel's path (f32) and the composite's
 * (f64: no kernel). */
Test(fused, conv2d_relu_errors_name_the_op) {
    const em_dtype dts[] = {EM_F32, EM_F64};
    for (int i = 0; i < 2; i++) {
        em_scope_begin();
        em_tensor *x = rnd(dts[i], 4, (int64_t[]){1, 3, 5, 5}, 1),
                  *w = rnd(dts[i], 4, (int64_t[]){2, 2, 3, 3}, 2);
        cr_assert_null(em_conv2d_relu(x, w, NULL, NULL, NULL, NULL, 1));
        em_assert_error(EM_ERR_SHAPE, "conv2d_relu: input [1, 3, 5, 5] has 3 channels but weight "
                        "[2, 2, 3, 3]");
        em_tensor *w3 = rnd(dts[i], 4, (int64_t[]){2, 3, 7, 7}, 3);
        cr_assert_null(em_conv2d_relu(x, w3, NULL, NULL, NULL, NULL, 1));
        em_assert_error(EM_ERR_SHAPE, "conv2d_relu: the kernel");
        cr_assert_null(em_conv2d_relu(x, em_to_dtype(w, dts[1 - i]), NULL, NULL, NULL, NULL, 1));
        em_assert_error(EM_ERR_DTYPE, "conv2d_relu: input");
        em_scope_end();
    }
}

/* ---- nChw16c activations (docs/performance.md, "Design (a)") ------------------------------- */

/*
 * The oneDNN f32 convolutions read and write activations whose storage is nChw16c
 * (EM_LAYOUT_NCHW16C) as they are. Each call on blocked tensors is compared with the same call
 * on plain tensors holding the same values and with the f64 loops, at rtol = atol = 1e-4: the
 * tolerance of the oneDNN convolutions against the loops above. The blocked and the plain call
 * may run different oneDNN implementations (and the f64 loops another order again), which add
 * the same products in different orders; the sums here have up to 32 * 25 = 800 products of
 * N(0, 1) values (the f64 loops' inputs not rounded to f32), and differ from f64 by up to
 * 2.5e-5 on this machine. That the kernel read the blocked tensors, rather than declining the
 * call and the core converting every tensor to plain and running it again, shows in the
 * layouts after the call: a declined call leaves every tensor of it plain.
 */
TestSuite(nchw16c, .init = em_test_setup, .fini = em_test_teardown);

#define BLK_TOL 1e-4

/* t's values in nChw16c storage (a new tensor, in the caller's scope). */
static em_tensor *blk(const em_tensor *t) {
    em_tensor *b = em_to_layout(t, EM_LAYOUT_NCHW16C);
    cr_assert(b && em_tensor_layout(b) == EM_LAYOUT_NCHW16C, "%s", em_last_error());
    return b;
}

/* got (any layout) against the plain f32 call's result and the f64 loops'. Reading got's
 * values converts its storage to plain: check its layout before. */
static void blk_check(const em_tensor *got, const em_tensor *plain, const em_tensor *f64,
                      const char *what, const char *part) {
    char w[240];
    cr_assert(got && plain && f64, "%s %s: %s", what, part, em_last_error());
    cr_assert_eq(em_tensor_layout(plain), EM_LAYOUT_PLAIN, "%s %s", what, part);
    double *p = em_test_values(plain), *r = em_test_values(f64);
    int64_t n = em_tensor_numel(plain);
    snprintf(w, sizeof w, "%s %s: against the plain call", what, part);
    em_test_expect_close(got, p, n, BLK_TOL, BLK_TOL, w);
    snprintf(w, sizeof w, "%s %s: against the f64 loops", what, part);
    em_test_expect_close(got, r, n, BLK_TOL, BLK_TOL, w);
    free(p), free(r);
}

static void expect_layout(const em_tensor *t, em_layout l, const char *what, const char *part) {
    cr_assert(t, "%s %s: %s", what, part, em_last_error());
    cr_assert_eq(em_tensor_layout(t), l, "%s %s: layout %d, want %d", what, part,
                 (int)em_tensor_layout(t), (int)l);
}

/* One geometry (2 images of 9x8, C -> O channels, k x k, stride s, padding p), every direction:
 * the forward and conv2d_relu from x blocked (C a multiple of 16), and from x plain (row-major,
 * and channels-last where C > 1) under em_layout_prefer(nChw16c), giving y blocked; backward
 * data from gy blocked (gx blocked, or plain for one channel); backward weight from gy
 * blocked with x blocked or plain, and from x blocked with gy plain, on one thread and on two
 * (one batch chunk per thread: the chunks read their images of the blocked tensors in place). */
static void blk_conv_case(int64_t C, int64_t O, int64_t k, int64_t s, int64_t p, int64_t g,
                          int64_t d) {
    const int64_t N = 2, H = 9, W = 8, ek = d * (k - 1) + 1;
    const int64_t OH = (H + 2 * p - ek) / s + 1, OW = (W + 2 * p - ek) / s + 1;
    const int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C / g, k, k}, ys[4] = {N, O, OH, OW};
    const int64_t st[2] = {s, s}, pd[2] = {p, p}, dl[2] = {d, d}, hw[2] = {H, W}, ks[2] = {k, k};
    const bool one = C % 16 != 0;
    char what[160];
    snprintf(what, sizeof what, "C %lld -> %lld, %lldx%lld, stride %lld, padding %lld, groups "
             "%lld, dilation %lld", (long long)C, (long long)O, (long long)k, (long long)k,
             (long long)s, (long long)p, (long long)g, (long long)d);
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *x[2], *w[2], *b[2], *gy[2]; /* f32, f64 */
    for (int di = 0; di < 2; di++) {
        em_dtype dt = di ? EM_F64 : EM_F32;
        x[di] = rnd(dt, 4, xs, 400), w[di] = rnd(dt, 4, ws, 401), b[di] = rnd(dt, 1, ws, 402);
        gy[di] = rnd(dt, 4, ys, 403);
    }
    /* the references: plain f32 (oneDNN on nchw) and the f64 loops */
    em_tensor *yp = em_conv2d(x[0], w[0], b[0], st, pd, dl, g),
              *y64 = em_conv2d(x[1], w[1], b[1], st, pd, dl, g),
              *yrp = em_conv2d_relu(x[0], w[0], b[0], st, pd, dl, g), *yr64 = em_relu(y64),
              *gxp = em_conv2d_backward_data(gy[0], w[0], hw, st, pd, dl, g),
              *gx64 = em_conv2d_backward_data(gy[1], w[1], hw, st, pd, dl, g), *gwp, *gbp,
              *gw64, *gb64;
    cr_assert_eq(em_conv2d_backward_weight(x[0], gy[0], ks, st, pd, dl, g, &gwp, &gbp), EM_OK,
                 "%s: %s", what, em_last_error());
    cr_assert_eq(em_conv2d_backward_weight(x[1], gy[1], ks, st, pd, dl, g, &gw64, &gb64), EM_OK,
                 "%s: %s", what, em_last_error());
    expect_layout(yp, EM_LAYOUT_PLAIN, what, "the plain forward");
    /* forward: x blocked (C % 16 == 0), x row-major and x channels-last under the preference */
    for (int v = one ? 1 : 0; v < (one ? 2 : 3); v++) {
        static const char *const vn[3] = {"x blocked", "x row-major, y preferred blocked",
                                          "x channels-last, y preferred blocked"};
        em_tensor *xv = v == 0 ? blk(x[0]) : v == 1 ? x[0] : em_channels_last(x[0]);
        em_layout old = em_layout_prefer(v ? EM_LAYOUT_NCHW16C : EM_LAYOUT_PLAIN);
        em_tensor *y, *yr;
        if (v < 2) {
            y = em_conv2d(xv, w[0], b[0], st, pd, dl, g);
            yr = em_conv2d_relu(xv, w[0], b[0], st, pd, dl, g);
        } else {
            /* em_conv2d makes a channels-last input's results channels-last after the kernel
             * (core/ops_nn.c, keep_layout): the kernel's contract is called directly */
            em_attr a[4] = {{.type = EM_ATTR_INTS, .n = 2, .ints = {s, s}},
                            {.type = EM_ATTR_INTS, .n = 2, .ints = {p, p}},
                            {.type = EM_ATTR_INTS, .n = 2, .ints = {d, d}},
                            {.type = EM_ATTR_INT, .v.i = g}};
            const em_tensor *in[3] = {xv, w[0], b[0]};
            cr_assert_eq(em_op_call_kernel(em_op_find("conv2d"), in, 3, a, &y), EM_OK, "%s: %s",
                         what, em_last_error());
            cr_assert_eq(em_op_call_kernel(em_op_find("conv2d_relu"), in, 3, a, &yr), EM_OK,
                         "%s: %s", what, em_last_error());
        }
        cr_assert_eq(em_layout_prefer(old), v ? EM_LAYOUT_NCHW16C : EM_LAYOUT_PLAIN);
        char part[96];
        snprintf(part, sizeof part, "forward (%s)", vn[v]);
        expect_layout(y, EM_LAYOUT_NCHW16C, what, part);
        expect_layout(yr, EM_LAYOUT_NCHW16C, what, part);
        expect_layout(xv, v ? EM_LAYOUT_PLAIN : EM_LAYOUT_NCHW16C, what, part);
        /* conv2d_relu runs conv2d's primitive, then relu over y's bytes: the same bits */
        em_tensor *ry = em_relu(y);
        expect_layout(ry, EM_LAYOUT_NCHW16C, what, part);
        same_bits(yr, ry, what);
        blk_check(y, yp, y64, what, part);
        snprintf(part, sizeof part, "conv2d_relu (%s)", vn[v]);
        blk_check(yr, yrp, yr64, what, part);
    }
    /* backward data: gy blocked -> gx blocked (plain for one channel) */
    em_tensor *gyb = blk(gy[0]);
    em_tensor *gx = em_conv2d_backward_data(gyb, w[0], hw, st, pd, dl, g);
    expect_layout(gx, one ? EM_LAYOUT_PLAIN : EM_LAYOUT_NCHW16C, what, "backward_data");
    expect_layout(gyb, EM_LAYOUT_NCHW16C, what, "backward_data's gy");
    blk_check(gx, gxp, gx64, what, "backward_data");
    /* backward weight on 1 and 2 threads: (x, gy) blocked and blocked, plain and blocked,
     * blocked and plain; gw and gb plain */
    int nt0 = em_num_threads();
    for (int t = 1; t <= 2; t++)
        for (int v = one ? 1 : 0; v < (one ? 2 : 3); v++) {
            static const char *const vn[3] = {"x and gy blocked", "x plain, gy blocked",
                                              "x blocked, gy plain"};
            em_set_num_threads(t);
            em_tensor *xv = v == 1 ? x[0] : blk(x[0]), *gv = v == 2 ? gy[0] : blk(gy[0]), *gw, *gb;
            char part[96];
            snprintf(part, sizeof part, "backward_weight (%s, %d thread%s)", vn[v], t,
                     t > 1 ? "s" : "");
            cr_assert_eq(em_conv2d_backward_weight(xv, gv, ks, st, pd, dl, g, &gw, &gb), EM_OK,
                         "%s %s: %s", what, part, em_last_error());
            expect_layout(xv, v == 1 ? EM_LAYOUT_PLAIN : EM_LAYOUT_NCHW16C, what, part);
            expect_layout(gv, v == 2 ? EM_LAYOUT_PLAIN : EM_LAYOUT_NCHW16C, what, part);
            expect_layout(gw, EM_LAYOUT_PLAIN, what, part);
            expect_layout(gb, EM_LAYOUT_PLAIN, what, part);
            cr_assert(em_tensor_is_contiguous(gw), "%s %s", what, part);
            blk_check(gw, gwp, gw64, what, part);
            blk_check(gb, gbp, gb64, what, part);
        }
    em_set_num_threads(nt0);
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* Every geometry of the table for C input channels: 16 and 32 output channels, 3x3 and 5x5,
 * stride 1 and 2, padding 0, 1 and 2. */
static void blk_conv_cases(int64_t C) {
    em_test_needs_onednn();
    cr_assert(kernel_registered("cpu_conv2d_dnnl_f32"), "the oneDNN kernel is not registered");
    for (int64_t O = 16; O <= 32; O += 16)
        for (int64_t k = 3; k <= 5; k += 2)
            for (int64_t s = 1; s <= 2; s++)
                for (int64_t p = 0; p <= 2; p++) blk_conv_case(C, O, k, s, p, 1, 1);
}

/* The CNN's first convolution: a one-channel image read as it is, y written blocked. */
Test(nchw16c, conv2d_from_one_channel) { blk_conv_cases(1); }
Test(nchw16c, conv2d_16_channels) { blk_conv_cases(16); }
Test(nchw16c, conv2d_32_channels) { blk_conv_cases(32); }

/* Groups (16 and 8 channels a group, and depthwise) and dilation: the blocked activations
 * where the primitive may prefer other layouts (the cached reorders then convert them). */
Test(nchw16c, conv2d_groups_and_dilation) {
    em_test_needs_onednn();
    blk_conv_case(32, 32, 3, 1, 1, 2, 1);
    blk_conv_case(32, 32, 3, 2, 1, 4, 1);
    blk_conv_case(32, 32, 3, 1, 1, 32, 1);
    blk_conv_case(16, 32, 3, 1, 2, 1, 2);
}

/* conv2d_relu on blocked outputs keeps relu's rules: a NaN input stays NaN, an output of -inf
 * (an infinite input under positive weights) becomes +0, and the bits are conv2d's then
 * relu's; from one channel (under the preference) and from 32 (blocked). */
Test(nchw16c, conv2d_relu_nan_and_minus_inf) {
    em_test_needs_onednn();
    const int64_t pd[2] = {1, 1};
    for (int gi = 0; gi < 2; gi++) {
        const int64_t C = gi ? 32 : 1, xs[4] = {2, C, 10, 10}, ws[4] = {32, C, 3, 3};
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *x = rnd(EM_F32, 4, xs, 410 + gi);
        em_tensor *w = em_add_scalar(em_abs(rnd(EM_F32, 4, ws, 412 + gi)), 0.125);
        /* image 0, channel 0: NaN at (2, 2); image 1, channel 0: -inf at (6, 7) */
        em_tensor *x0 = em_slice(em_slice(em_slice(em_select(x, 0, 0), 0, 0, 1, 1), 1, 2, 3, 1), 2, 2, 3, 1);
        em_tensor *x1 = em_slice(em_slice(em_slice(em_select(x, 0, 1), 0, 0, 1, 1), 1, 6, 7, 1), 2, 7, 8, 1);
        cr_assert(w && x0 && x1, "%s", em_last_error());
        cr_assert_eq(em_fill_(x0, NAN), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_fill_(x1, -INFINITY), EM_OK, "%s", em_last_error());
        em_tensor *xv = gi ? blk(x) : x;
        em_layout old = em_layout_prefer(EM_LAYOUT_NCHW16C);
        em_tensor *yf = em_conv2d_relu(xv, w, NULL, NULL, pd, NULL, 1);
        em_tensor *yc = em_conv2d(xv, w, NULL, NULL, pd, NULL, 1);
        em_layout_prefer(old);
        const char *what = gi ? "32 channels, x blocked" : "one channel, y preferred blocked";
        expect_layout(yf, EM_LAYOUT_NCHW16C, what, "conv2d_relu");
        expect_layout(yc, EM_LAYOUT_NCHW16C, what, "conv2d");
        em_tensor *ry = em_relu(yc);
        expect_layout(ry, EM_LAYOUT_NCHW16C, what, "relu");
        same_bits(yf, ry, what);
        /* every output channel at those positions (all weights positive) */
        em_tensor *yfp = em_contiguous(yf), *ycp = em_contiguous(yc);
        for (int64_t o = 0; o < 32; o++) {
            int64_t nan_at = o * 100 + 2 * 10 + 2, inf_at = (32 + o) * 100 + 6 * 10 + 7;
            cr_assert(isnan(em_test_at(yfp, nan_at)) && isnan(em_test_at(ycp, nan_at)),
                      "%s, channel %lld: the NaN did not reach the output", what, (long long)o);
            cr_assert(isinf(em_test_at(ycp, inf_at)) && em_test_at(ycp, inf_at) < 0,
                      "%s, channel %lld: conv2d gave %g, not -inf", what, (long long)o,
                      em_test_at(ycp, inf_at));
            cr_assert_eq(em_test_at(yfp, inf_at), 0.0, "%s, channel %lld", what, (long long)o);
        }
        /* and the values of the plain call, NaN and 0 included */
        em_tensor *yp = em_conv2d_relu(x, w, NULL, NULL, pd, NULL, 1);
        double *want = em_test_values(yp);
        em_test_expect_close(yfp, want, em_tensor_numel(yp), BLK_TOL, BLK_TOL, what);
        free(want);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* Autograd through blocked activations: a plain one-channel image through conv2d_relu (1 ->
 * 16) and conv2d (16 -> 32), forward and backward under em_layout_prefer(nChw16c): the
 * activations are blocked (conv1 writes nChw16c from the plain image), and the gradients of
 * the image, weights and biases are those of the same network on plain tensors, within the
 * convolutions' tolerance (other oneDNN implementations and orders of addition run). */
Test(nchw16c, two_convolutions_backward_from_a_plain_image) {
    em_test_needs_onednn();
    const int64_t xs[4] = {2, 1, 12, 12}, w1s[4] = {16, 1, 3, 3}, w2s[4] = {32, 16, 3, 3},
                  rs[4] = {2, 32, 12, 12}, pd[2] = {1, 1};
    em_tensor *grads[2][5];
    double loss[2];
    cr_assert_eq(em_scope_begin(), EM_OK);
    for (int bl = 0; bl < 2; bl++) {
        em_tensor *p[5] = {rnd(EM_F32, 4, xs, 420), rnd(EM_F32, 4, w1s, 421),
                           rnd(EM_F32, 1, w1s, 422), rnd(EM_F32, 4, w2s, 423),
                           rnd(EM_F32, 1, w2s, 424)};
        for (int i = 0; i < 5; i++) cr_assert_eq(em_requires_grad_(p[i], true), EM_OK);
        em_tensor *r = rnd(EM_F32, 4, rs, 425);
        em_layout old = em_layout_prefer(bl ? EM_LAYOUT_NCHW16C : EM_LAYOUT_PLAIN);
        em_tensor *a1 = em_conv2d_relu(p[0], p[1], p[2], NULL, pd, NULL, 1);
        em_tensor *y2 = em_conv2d(a1, p[3], p[4], NULL, pd, NULL, 1);
        em_layout want = bl ? EM_LAYOUT_NCHW16C : EM_LAYOUT_PLAIN;
        expect_layout(a1, want, "conv1", "conv2d_relu");
        expect_layout(y2, want, "conv2", "conv2d");
        em_tensor *l = em_sum(em_mul(y2, r), 0, NULL, false);
        cr_assert(l, "%s", em_last_error());
        loss[bl] = em_item(l);
        cr_assert_eq(em_backward(l), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_layout_prefer(old), want);
        for (int i = 0; i < 5; i++) {
            grads[bl][i] = em_tensor_grad(p[i]);
            cr_assert(grads[bl][i], "grad %d", i);
            expect_layout(grads[bl][i], EM_LAYOUT_PLAIN, "parameter", "grad");
        }
    }
    cr_assert(isfinite(loss[0]) && fabs(loss[1] - loss[0]) <= BLK_TOL * fabs(loss[0]),
              "loss %g blocked, %g plain", loss[1], loss[0]);
    static const char *const names[5] = {"image", "conv1 weight", "conv1 bias", "conv2 weight",
                                         "conv2 bias"};
    for (int i = 0; i < 5; i++) {
        double *want = em_test_values(grads[0][i]);
        em_test_expect_close(grads[1][i], want, em_tensor_numel(grads[0][i]), BLK_TOL, BLK_TOL,
                             names[i]);
        free(want);
    }
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* ---- max_pool2d_relu, the second fused op (docs/performance.md, "Design: fused ops") ------- */

/* The op pools relu's values (x <= 0 ? +0 : x, NaN kept) with max_pool2d's rule, so its
 * values and indices are those of relu then max_pool2d bit for bit — a window whose inputs are
 * all <= 0 gives +0 at its first position, not where x is largest — and so is the input grad
 * its derivative composes (relu's mask on the pooled output, then max_pool2d's scatter). */

typedef struct {
    int64_t k[2], s[2], p[2], d[2];
    bool ceil;
} mpr_geom;

/* 2x2 / stride 2 (the vector paths; ceil_mode adds the windows an odd H and W cut), 3x3 stride
 * 2 padding 1 ceil (overlapping windows: the scatter sums), and a dilated rectangular one. */
static const mpr_geom mpr_geoms[] = {{{2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
                                     {{2, 2}, {2, 2}, {0, 0}, {1, 1}, true},
                                     {{3, 3}, {2, 2}, {1, 1}, {1, 1}, true},
                                     {{3, 2}, {2, 1}, {1, 1}, {2, 2}, true}};

/* x (N, C, H, W), H >= 4 and W >= 4, random normal in dtype dt (about one 2x2 window in 16 all
 * negative) and, in every third plane, a first 2x2 window of negatives whose largest is not
 * its first (-3, -1 / -2, -0.5: relu gives +0 at index 0, the maximum of x is at 1), one of
 * -0 and negatives (-0, -1 / -0, -2), one of +0, -0 and negatives, a NaN and a -inf. */
static em_tensor *mpr_input(em_dtype dt, const int64_t *xs, uint64_t seed) {
    const int64_t n = xs[0] * xs[1] * xs[2] * xs[3], HW = xs[2] * xs[3], W = xs[3];
    double *v = malloc(sizeof(double) * (size_t)n);
    em_test_fill_random(v, n, seed);
    for (int64_t pl = 0; pl < xs[0] * xs[1]; pl += 3) {
        double *q = v + pl * HW;
        q[0] = -3, q[1] = -1, q[W] = -2, q[W + 1] = -0.5;
        q[2] = -0.0, q[3] = -1, q[W + 2] = -0.0, q[W + 3] = -2;
        q[2 * W] = 0.0, q[2 * W + 1] = -1, q[3 * W] = -0.0, q[3 * W + 1] = -4;
        q[2 * W + 2] = NAN, q[3 * W + 3] = -INFINITY;
    }
    em_tensor *x = make(dt, 4, xs, v, CONTIG);
    free(v);
    return x;
}

static const char *const mpr_layouts[] = {"row-major", "channels-last", "nchw16c"};

/* x in layout lay (0 row-major, 1 channels-last, 2 nChw16c). */
static em_tensor *mpr_layout(em_tensor *x, int lay) {
    return lay == 0 ? x : lay == 1 ? em_channels_last(x) : blk(x);
}

/* Every geometry, dtype and layout (nChw16c where C is a multiple of 16): the fused op's
 * values, indices and input grad against relu then max_pool2d's, bit for bit, and the outputs
 * in the same layout (f32 keeps nChw16c: its kernel reads it; channels-last stays so). */
Test(fused, max_pool2d_relu_bits_equal_relu_then_max_pool2d) {
    const int64_t shapes[2][4] = {{2, 3, 7, 9}, {2, 32, 8, 10}};
    const em_dtype dts[] = {EM_F32, EM_F64, EM_BF16, EM_F16};
    for (size_t gi = 0; gi < sizeof mpr_geoms / sizeof mpr_geoms[0]; gi++)
        for (int si = 0; si < 2; si++)
            for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
                for (int lay = 0; lay < 3; lay++) {
                    if (lay == 2 && shapes[si][1] % 16) continue;
                    const mpr_geom *g = &mpr_geoms[gi];
                    em_dtype dt = dts[di];
                    char what[160];
                    snprintf(what, sizeof what, "geometry %zu, C %lld, %s, %s", gi,
                             (long long)shapes[si][1], em_dtype_name(dt), mpr_layouts[lay]);
                    cr_assert_eq(em_scope_begin(), EM_OK);
                    em_tensor *x = mpr_layout(mpr_input(dt, shapes[si], 500 + gi), lay);
                    em_tensor *xd[2], *y[2], *idx[2];
                    for (int k = 0; k < 2; k++) {
                        xd[k] = em_detach(x);
                        cr_assert_eq(em_requires_grad_(xd[k], true), EM_OK);
                        em_status st =
                            k ? em_max_pool2d(em_relu(xd[k]), g->k, g->s, g->p, g->d, g->ceil,
                                              &y[k], &idx[k])
                              : em_max_pool2d_relu(xd[k], g->k, g->s, g->p, g->d, g->ceil, &y[k],
                                                   &idx[k]);
                        cr_assert_eq(st, EM_OK, "%s: %s", what, em_last_error());
                    }
                    /* the layouts first: reading the values converts a blocked storage */
                    for (int o = 0; o < 2; o++) {
                        const em_tensor *f = o ? idx[0] : y[0], *u = o ? idx[1] : y[1];
                        cr_assert_eq(em_tensor_layout(f), em_tensor_layout(u), "%s, output %d",
                                     what, o);
                        cr_assert_eq(em_tensor_is_channels_last(f), em_tensor_is_channels_last(u),
                                     "%s, output %d", what, o);
                        if (lay == 1)
                            cr_assert(em_tensor_is_channels_last(f), "%s, output %d", what, o);
                        if (lay == 2 && dt == EM_F32)
                            expect_layout(f, EM_LAYOUT_NCHW16C, what, o ? "indices" : "values");
                    }
                    em_tensor *r = rnd(dt, 4, em_tensor_shape(y[0]), 510 + gi);
                    for (int k = 0; k < 2; k++)
                        cr_assert_eq(em_backward(em_sum(em_mul(y[k], r), 0, NULL, false)), EM_OK,
                                     "%s: %s", what, em_last_error());
                    char part[200];
                    snprintf(part, sizeof part, "%s, values", what);
                    same_bits(y[0], y[1], part);
                    snprintf(part, sizeof part, "%s, indices", what);
                    same_bits(idx[0], idx[1], part);
                    snprintf(part, sizeof part, "%s, input grad", what);
                    same_bits(em_tensor_grad(xd[0]), em_tensor_grad(xd[1]), part);
                    /* plane 0's first window (-3, -1 / -2, -0.5): +0 at its first position */
                    if (gi < 2) {
                        em_tensor *yc = em_contiguous(y[0]), *ic = em_contiguous(idx[0]);
                        double v0 = em_test_at(yc, 0);
                        cr_assert(v0 == 0 && !signbit(v0) && em_test_at(ic, 0) == 0,
                                  "%s: window 0 gave %g at %g, not +0 at 0", what, v0,
                                  em_test_at(ic, 0));
                        /* (-0, -1 / -0, -2): +0, never -0 */
                        v0 = em_test_at(yc, 1);
                        cr_assert(v0 == 0 && !signbit(v0) && em_test_at(ic, 1) == 2,
                                  "%s: window 1 gave %g at %g, not +0 at 2", what, v0,
                                  em_test_at(ic, 1));
                        /* the NaN at (2, 2) wins its window */
                        cr_assert(isnan(em_test_at(yc, em_tensor_shape(yc)[3] + 1)), "%s", what);
                    }
                    cr_assert_eq(em_scope_end(), EM_OK);
                }
}

/* The CPU kernel itself (em_op_call_kernel: no composite around it) on f32 row-major,
 * channels-last and nChw16c inputs and f64 row-major and channels-last ones: the bits of
 * relu's kernel then max_pool2d's, its outputs in the input's layout (a blocked output shows
 * the kernel read the blocked input rather than declining it). */
Test(fused, max_pool2d_relu_kernel_is_relu_then_max_pool2d) {
    cr_assert(kernel_registered("cpu_max_pool2d_relu_float32"));
    cr_assert(kernel_registered("cpu_max_pool2d_relu_float64"));
    const em_op *op = em_op_find("max_pool2d_relu"), *pool = em_op_find("max_pool2d");
    cr_assert(op && pool);
    for (size_t gi = 0; gi < sizeof mpr_geoms / sizeof mpr_geoms[0]; gi++)
        for (int c = 0; c < 5; c++) {
            const mpr_geom *g = &mpr_geoms[gi];
            em_dtype dt = c < 3 ? EM_F32 : EM_F64;
            int lay = c < 3 ? c : c - 3;
            char what[96];
            snprintf(what, sizeof what, "geometry %zu, %s, %s", gi, em_dtype_name(dt),
                     mpr_layouts[lay]);
            em_attr a[5] = {{.type = EM_ATTR_INTS, .n = 2, .ints = {g->k[0], g->k[1]}},
                            {.type = EM_ATTR_INTS, .n = 2, .ints = {g->s[0], g->s[1]}},
                            {.type = EM_ATTR_INTS, .n = 2, .ints = {g->p[0], g->p[1]}},
                            {.type = EM_ATTR_INTS, .n = 2, .ints = {g->d[0], g->d[1]}},
                            {.type = EM_ATTR_BOOL, .v.b = g->ceil}};
            cr_assert_eq(em_scope_begin(), EM_OK);
            em_tensor *x = mpr_layout(mpr_input(dt, (const int64_t[]){3, 16, 9, 8}, 520 + gi), lay);
            em_tensor *f[2], *u[2];
            cr_assert_eq(em_op_call_kernel(op, (const em_tensor *[]){x}, 1, a, f), EM_OK,
                         "%s: %s", what, em_last_error());
            em_tensor *rx = em_relu(x);
            cr_assert(rx, "%s", em_last_error());
            cr_assert_eq(em_op_call_kernel(pool, (const em_tensor *[]){rx}, 1, a, u), EM_OK,
                         "%s: %s", what, em_last_error());
            for (int o = 0; o < 2; o++) {
                cr_assert_eq(em_tensor_is_channels_last(f[o]), lay == 1, "%s, output %d", what, o);
                expect_layout(f[o], lay == 2 ? EM_LAYOUT_NCHW16C : EM_LAYOUT_PLAIN, what,
                              o ? "indices" : "values");
            }
            same_bits(f[0], u[0], what);
            same_bits(f[1], u[1], what);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* Errors as max_pool2d's, naming max_pool2d_relu, on the kernel's path (f32) and the
 * composite's (bf16: no kernel). */
Test(fused, max_pool2d_relu_errors_name_the_op) {
    const em_dtype dts[] = {EM_F32, EM_BF16};
    const int64_t k2[2] = {2, 2}, k9[2] = {9, 9}, p2[2] = {2, 2};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *x = rnd(dts[i], 4, (int64_t[]){1, 3, 5, 5}, 1), *o = NULL, *ix = NULL;
        em_tensor *x3 = rnd(dts[i], 3, (int64_t[]){3, 5, 5}, 2);
        cr_assert_neq(em_max_pool2d_relu(x, NULL, NULL, NULL, NULL, false, &o, &ix), EM_OK);
        em_assert_error(EM_ERR_INVALID, "max_pool2d_relu: kernel_size is required");
        cr_assert_neq(em_max_pool2d_relu(x3, k2, NULL, NULL, NULL, false, &o, &ix), EM_OK);
        em_assert_error(EM_ERR_SHAPE, "max_pool2d_relu: expected a 4-D (N, C, H, W) input");
        cr_assert_neq(em_max_pool2d_relu(x, k9, NULL, NULL, NULL, false, &o, &ix), EM_OK);
        em_assert_error(EM_ERR_SHAPE, "max_pool2d_relu: input [1, 3, 5, 5] is too small");
        cr_assert_neq(em_max_pool2d_relu(x, k2, NULL, p2, NULL, false, &o, &ix), EM_OK);
        em_assert_error(EM_ERR_INVALID, "max_pool2d_relu: padding 2 should be at most half");
        cr_assert_neq(em_max_pool2d_relu(em_to_dtype(x, EM_I32), k2, NULL, NULL, NULL, false, &o,
                                         &ix), EM_OK);
        em_assert_error(EM_ERR_DTYPE, "max_pool2d_relu: expected a floating input");
        cr_assert(!o && !ix);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

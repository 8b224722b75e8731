/*
 * test_ops_rnn.c — the fused lstm and gru ops (issue 25): outputs, final states and every
 * gradient against the op-composed recurrence written here with matmul, sigmoid, tanh, mul
 * and add one step at a time (a step not taken — t >= lengths[b] — keeps the state through a
 * 0/1 mask and outputs zeros), in f32 and f64, both directions, with and without initial
 * states, bias and lengths; f64 finite differences (em_gradcheck) through the fused ops;
 * the errors. The table rows (typed vs by name, ember-opcheck) are in core/op_cases.c.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

TestSuite(rnn_ops, .init = em_test_setup, .fini = em_test_teardown);

static em_tensor *rnd(em_dtype dt, int nd, const int64_t *shape, uint64_t seed, double scale) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_test_fill_random(v, n, seed);
    for (int64_t i = 0; i < n; i++) v[i] *= scale;
    em_tensor *t = em_test_tensor(dt, nd, shape, v);
    free(v);
    return t;
}

typedef struct rnn_case {
    const char *name;
    bool gru;
    int64_t T, N, I, H;
    bool reverse, states, bias;
    const int64_t *lengths; /* (N) or NULL */
} rnn_case;

/* The reference: PyTorch's equations step by step with ops (so autograd gives its
 * gradients). x (T, N, I), w (G H, I + H), b_ih/b_hh (G H) or NULL (LSTM: b the sum, in
 * b_ih); mask (T, N, 1) of 0/1 or NULL. Returns y (T, N, H); *hn, *cn the final states. */
static em_tensor *ref_rnn(const rnn_case *c, const em_tensor *x, const em_tensor *hx,
                          const em_tensor *cx, const em_tensor *w, const em_tensor *b_ih,
                          const em_tensor *b_hh, const em_tensor *mask, em_tensor **hn,
                          em_tensor **cn) {
    int64_t H = c->H, I = c->I;
    em_dtype dt = em_tensor_dtype(x);
    em_tensor *h = hx ? (em_tensor *)hx : em_zeros(2, (int64_t[]){c->N, H}, dt, em_cpu());
    em_tensor *cs = cx ? (em_tensor *)cx : em_zeros(2, (int64_t[]){c->N, H}, dt, em_cpu());
    em_tensor *wih_t = em_transpose(em_narrow(w, 1, 0, I), 0, 1);
    em_tensor *whh_t = em_transpose(em_narrow(w, 1, I, H), 0, 1);
    em_tensor **ys = calloc((size_t)c->T, sizeof *ys);
    for (int64_t s = 0; s < c->T; s++) {
        int64_t t = c->reverse ? c->T - 1 - s : s;
        em_tensor *xt = em_select(x, 0, t);
        em_tensor *gx = em_matmul(xt, wih_t), *gh = em_matmul(h, whh_t);
        if (b_ih) gx = em_add(gx, b_ih);
        if (b_hh) gh = em_add(gh, b_hh);
        em_tensor *hnew, *cnew = NULL;
        if (!c->gru) {
            em_tensor *g = em_add(gx, gh);
            em_tensor *ig = em_sigmoid(em_narrow(g, 1, 0, H)),
                      *fg = em_sigmoid(em_narrow(g, 1, H, H)),
                      *gg = em_tanh(em_narrow(g, 1, 2 * H, H)),
                      *og = em_sigmoid(em_narrow(g, 1, 3 * H, H));
            cnew = em_add(em_mul(fg, cs), em_mul(ig, gg));
            hnew = em_mul(og, em_tanh(cnew));
        } else {
            em_tensor *r = em_sigmoid(em_add(em_narrow(gx, 1, 0, H), em_narrow(gh, 1, 0, H)));
            em_tensor *z = em_sigmoid(em_add(em_narrow(gx, 1, H, H), em_narrow(gh, 1, H, H)));
            em_tensor *n = em_tanh(em_add(em_narrow(gx, 1, 2 * H, H),
                                          em_mul(r, em_narrow(gh, 1, 2 * H, H))));
            /* (1 - z) n + z h */
            hnew = em_add(em_sub(n, em_mul(z, n)), em_mul(z, h));
        }
        if (mask) {
            em_tensor *m = em_select(mask, 0, t), *keep = em_add_scalar(em_neg(m), 1);
            ys[t] = em_mul(hnew, m);
            h = em_add(ys[t], em_mul(h, keep));
            if (cnew) cs = em_add(em_mul(cnew, m), em_mul(cs, keep));
        } else {
            ys[t] = hnew;
            h = hnew;
            if (cnew) cs = cnew;
        }
        cr_assert(h, "reference step %lld: %s", (long long)t, em_last_error());
    }
    em_tensor *y = em_stack((int)c->T, (const em_tensor *const *)ys, 0);
    free(ys);
    *hn = h;
    if (cn) *cn = cs;
    return y;
}

/* The case's inputs in dt: x, hx, cx, w, b_ih, b_hh, lengths, mask (T, N, 1). */
typedef struct rnn_in {
    em_tensor *x, *hx, *cx, *w, *bih, *bhh, *len, *mask;
} rnn_in;

static rnn_in make_in(const rnn_case *c, em_dtype dt) {
    int64_t G = c->gru ? 3 : 4;
    rnn_in r = {0};
    r.x = rnd(dt, 3, (int64_t[]){c->T, c->N, c->I}, 1, 1);
    if (c->states) {
        r.hx = rnd(dt, 2, (int64_t[]){c->N, c->H}, 2, 0.5);
        if (!c->gru) r.cx = rnd(dt, 2, (int64_t[]){c->N, c->H}, 3, 0.5);
    }
    r.w = rnd(dt, 2, (int64_t[]){G * c->H, c->I + c->H}, 4, 0.5);
    if (c->bias) {
        r.bih = rnd(dt, 1, (int64_t[]){G * c->H}, 5, 0.5);
        if (c->gru) r.bhh = rnd(dt, 1, (int64_t[]){G * c->H}, 6, 0.5);
    }
    if (c->lengths) {
        double *lv = malloc(sizeof(double) * (size_t)c->N);
        double *mv = malloc(sizeof(double) * (size_t)(c->T * c->N));
        for (int64_t b = 0; b < c->N; b++) lv[b] = (double)c->lengths[b];
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t b = 0; b < c->N; b++) mv[t * c->N + b] = t < c->lengths[b];
        r.len = em_test_tensor(EM_I64, 1, (int64_t[]){c->N}, lv);
        r.mask = em_test_tensor(dt, 3, (int64_t[]){c->T, c->N, 1}, mv);
        free(lv);
        free(mv);
    }
    return r;
}

static em_tensor *fused(const rnn_case *c, const rnn_in *r, em_tensor **hn, em_tensor **cn) {
    if (c->gru) return em_gru(r->x, r->hx, r->w, r->bih, r->bhh, r->len, c->reverse, hn, NULL);
    return em_lstm(r->x, r->hx, r->cx, r->w, r->bih, r->len, c->reverse, hn, cn, NULL);
}

static em_tensor *loss_of(const rnn_case *c, const em_tensor *y, const em_tensor *hn,
                          const em_tensor *cn, em_dtype dt) {
    em_tensor *wy = rnd(dt, 3, (int64_t[]){c->T, c->N, c->H}, 7, 1);
    em_tensor *wh = rnd(dt, 2, (int64_t[]){c->N, c->H}, 8, 1);
    em_tensor *l = em_add(em_sum(em_mul(y, wy), 0, NULL, false),
                          em_sum(em_mul(hn, wh), 0, NULL, false));
    if (cn) {
        em_tensor *wc = rnd(dt, 2, (int64_t[]){c->N, c->H}, 9, 1);
        l = em_add(l, em_sum(em_mul(cn, wc), 0, NULL, false));
    }
    return l;
}

static const int64_t len4[4] = {5, 2, 0, 4}, len3[3] = {3, 1, 2};

static const rnn_case cases[] = {
    {"lstm, states, bias", false, 5, 3, 4, 6, false, true, true, NULL},
    {"lstm reverse, no states, no bias", false, 4, 2, 3, 5, true, false, false, NULL},
    {"lstm, lengths (one empty)", false, 5, 4, 3, 4, false, true, true, len4},
    {"lstm reverse, lengths", false, 5, 4, 3, 4, true, true, true, len4},
    {"gru, states, bias", true, 5, 3, 4, 6, false, true, true, NULL},
    {"gru reverse, no states, no bias", true, 4, 2, 3, 5, true, false, false, NULL},
    {"gru, lengths", true, 3, 3, 2, 3, false, true, true, len3},
    {"gru reverse, lengths (one empty)", true, 5, 4, 3, 4, true, true, true, len4},
};

static void compare(const em_tensor *got, const em_tensor *want, double tol, const char *what,
                    const char *name) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s: %s", name, what);
    cr_assert(want, "%s: reference: %s", buf, em_last_error());
    double *w = em_test_values(want);
    em_test_expect_close(got, w, em_tensor_numel(want), tol, tol, buf);
    free(w);
}

static void check_case(const rnn_case *c, em_dtype dt, double tol) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    rnn_in r = make_in(c, dt);
    em_tensor *leaves[6] = {r.x, r.hx, r.cx, r.w, r.bih, r.bhh};
    static const char *const names[6] = {"input", "hx", "cx", "weight", "bias_ih", "bias_hh"};
    em_tensor *ref_g[6] = {0}, *ref_y = NULL, *ref_h = NULL, *ref_c = NULL;
    for (int i = 0; i < 6; i++)
        if (leaves[i]) cr_assert_eq(em_requires_grad_(leaves[i], true), EM_OK);
    for (int pass = 0; pass < 2; pass++) {
        em_tensor *hn = NULL, *cn = NULL, *y;
        /* The LSTM's reference takes the bias as b_ih alone (the op's bias is the sum). */
        if (pass == 0)
            y = ref_rnn(c, r.x, r.hx, r.cx, r.w, r.bih, r.bhh, r.mask, &hn, c->gru ? NULL : &cn);
        else
            y = fused(c, &r, &hn, c->gru ? NULL : &cn);
        cr_assert(y && hn, "%s (%s): %s", c->name, pass ? "fused" : "reference", em_last_error());
        em_tensor *l = loss_of(c, y, hn, cn, dt);
        cr_assert_eq(em_backward(l), EM_OK, "%s: backward: %s", c->name, em_last_error());
        if (pass == 0) {
            ref_y = em_detach(y), ref_h = em_detach(hn), ref_c = cn ? em_detach(cn) : NULL;
            for (int i = 0; i < 6; i++)
                if (leaves[i]) {
                    ref_g[i] = em_clone(em_tensor_grad(leaves[i]));
                    cr_assert(ref_g[i], "%s: reference: no gradient for %s", c->name, names[i]);
                    cr_assert_eq(em_tensor_set_grad(leaves[i], NULL), EM_OK);
                }
            continue;
        }
        compare(y, ref_y, tol, "output", c->name);
        compare(hn, ref_h, tol, "h_n", c->name);
        if (cn) compare(cn, ref_c, tol, "c_n", c->name);
        for (int i = 0; i < 6; i++) {
            if (!leaves[i]) continue;
            em_tensor *g = em_tensor_grad(leaves[i]);
            cr_assert(g, "%s: no gradient for %s", c->name, names[i]);
            compare(g, ref_g[i], tol, names[i], c->name);
        }
    }
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(rnn_ops, fused_ops_match_the_composed_recurrence_f64) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], EM_F64, 1e-10);
}

Test(rnn_ops, fused_ops_match_the_composed_recurrence_f32) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], EM_F32, 1e-5);
}

/* Bigger than one thread's grain, so the batch rows split over threads (the vector cells
 * count one operation an element: 256 x 129 is over CPU_GRAIN), and a hidden size that is not
 * a multiple of a vector (the cells' masked last chunk). */
Test(rnn_ops, fused_ops_match_on_a_threaded_size) {
    static const rnn_case big[] = {
        {"lstm 256 x 129", false, 3, 256, 7, 129, false, true, true, NULL},
        {"gru 256 x 129 reverse", true, 3, 256, 7, 129, true, true, true, NULL},
    };
    for (size_t i = 0; i < 2; i++) check_case(&big[i], EM_F32, 1e-4);
}

/* A hidden size that is a multiple of the vector width (16 and 8 lanes), so the f32 vector
 * cells write the workspace with non-temporal stores (cpu_rnn_simd_loops.h), over enough
 * steps and batch rows to leave the caches; both directions, with lengths (some rows ending
 * early, one empty, one full), in f32 and f64. */
Test(rnn_ops, lstm_matches_on_a_vector_multiple_hidden_size) {
    static int64_t len64[64];
    for (int b = 0; b < 64; b++) len64[b] = (b * 7) % 12; /* 0 to 11 */
    static const rnn_case chunked[] = {
        {"lstm 11 steps x 64 x 64", false, 11, 64, 5, 64, false, true, true, NULL},
        {"lstm 11 steps x 64 x 64 reverse", false, 11, 64, 5, 64, true, false, true, NULL},
        {"lstm 11 steps x 64 x 64, lengths", false, 11, 64, 5, 64, false, true, true, len64},
        {"lstm 11 steps x 64 x 64 reverse, lengths", false, 11, 64, 5, 64, true, true, false,
         len64},
    };
    for (size_t i = 0; i < 4; i++) {
        check_case(&chunked[i], EM_F32, 1e-4);
        check_case(&chunked[i], EM_F64, 1e-10);
    }
}

typedef struct gc_user {
    const rnn_case *c;
    const em_tensor *len;
} gc_user;

/* inputs: x, hx, cx (LSTM only), w, b (b_ih, b_hh for the GRU). The sum of the outputs and
 * states through fixed weights. */
static em_tensor *gc_fn(em_tensor *const *in, int n, void *user) {
    (void)n;
    const gc_user *u = user;
    const rnn_case *c = u->c;
    em_tensor *hn = NULL, *cn = NULL, *y;
    if (c->gru) y = em_gru(in[0], in[1], in[2], in[3], in[4], u->len, c->reverse, &hn, NULL);
    else y = em_lstm(in[0], in[1], in[2], in[3], in[4], u->len, c->reverse, &hn, &cn, NULL);
    return y ? loss_of(c, y, hn, cn, EM_F64) : NULL;
}

Test(rnn_ops, gradients_match_finite_differences) {
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const rnn_case *c = &cases[ci];
        if (!c->states || !c->bias) continue;
        cr_assert_eq(em_scope_begin(), EM_OK);
        rnn_in r = make_in(c, EM_F64);
        em_tensor *t[5] = {r.x, r.hx, c->gru ? r.w : r.cx, c->gru ? r.bih : r.w,
                           c->gru ? r.bhh : r.bih};
        for (int i = 0; i < 5; i++) cr_assert_eq(em_requires_grad_(t[i], true), EM_OK);
        gc_user u = {.c = c, .len = r.len};
        cr_assert_eq(em_gradcheck(gc_fn, 5, t, &u, 0, 0, 0), EM_OK, "%s: %s", c->name,
                     em_last_error());
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(rnn_ops, errors_name_the_operand) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *x = rnd(EM_F32, 3, (int64_t[]){4, 2, 3}, 1, 1);
    em_tensor *w = rnd(EM_F32, 2, (int64_t[]){8, 5}, 2, 1); /* H 2, I 3 */
    em_tensor *hn = NULL;
    cr_assert(em_lstm(x, NULL, NULL, w, NULL, NULL, false, &hn, NULL, NULL));
    cr_assert_null(em_lstm(x, NULL, NULL, rnd(EM_F32, 2, (int64_t[]){8, 6}, 2, 1), NULL, NULL,
                           false, NULL, NULL, NULL));
    cr_assert_eq(em_last_status(), EM_ERR_SHAPE);
    cr_assert(strstr(em_last_error(), "lstm: weight [8, 6]"), "%s", em_last_error());
    cr_assert_null(em_lstm(x, rnd(EM_F32, 2, (int64_t[]){3, 2}, 3, 1), NULL, w, NULL, NULL,
                           false, NULL, NULL, NULL));
    cr_assert(strstr(em_last_error(), "hx has shape [3, 2]; expected [2, 2]"), "%s",
              em_last_error());
    cr_assert_null(em_gru(em_select(x, 0, 0), NULL, w, NULL, NULL, NULL, false, NULL, NULL));
    cr_assert_eq(em_last_status(), EM_ERR_SHAPE);
    cr_assert(strstr(em_last_error(), "(T, N, I)"), "%s", em_last_error());
    em_tensor *bad = em_test_tensor(EM_I64, 1, (int64_t[]){2}, (double[]){4, 5});
    cr_assert_null(em_lstm(x, NULL, NULL, w, NULL, bad, false, NULL, NULL, NULL));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "lengths[1] is 5"), "%s", em_last_error());
    em_tensor *fl = em_test_tensor(EM_F32, 1, (int64_t[]){2}, (double[]){4, 3});
    cr_assert_null(em_lstm(x, NULL, NULL, w, NULL, fl, false, NULL, NULL, NULL));
    cr_assert_eq(em_last_status(), EM_ERR_DTYPE);
    cr_assert_null(em_lstm(x, NULL, NULL, em_to_dtype(w, EM_F64), NULL, NULL, false, NULL, NULL,
                           NULL));
    cr_assert_eq(em_last_status(), EM_ERR_DTYPE);
    /* The workspace carries no gradient. */
    cr_assert_eq(em_requires_grad_(x, true), EM_OK);
    em_tensor *ws = NULL;
    cr_assert(em_lstm(x, NULL, NULL, w, NULL, NULL, false, NULL, NULL, &ws));
    cr_assert_neq(em_backward(em_sum(ws, 0, NULL, false)), EM_OK);
    cr_assert(strstr(em_last_error(), "workspace"), "%s", em_last_error());
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* What the two LSTM kernels compute, as doubles, on nt threads: the lstm op's output, final
 * states and workspace, then lstm_backward's gate, hx and cx gradients from random gradients
 * of the output and both final states (cnt: the numel of each of the 7). The input and weight
 * gradients are GEMMs of the core's derivative, not the kernels': a library's GEMM may split
 * its sums by the thread count (em_set_deterministic says so). */
static double *lstm_run(const rnn_case *c, int nt, int64_t *n_out, int64_t *cnt) {
    em_set_num_threads(nt);
    cr_assert_eq(em_scope_begin(), EM_OK);
    rnn_in r = make_in(c, EM_F32);
    em_tensor *hn = NULL, *cn = NULL, *ws = NULL;
    em_tensor *y = em_lstm(r.x, r.hx, r.cx, r.w, r.bih, r.len, c->reverse, &hn, &cn, &ws);
    cr_assert(y && hn && cn && ws, "%s: %s", c->name, em_last_error());
    em_tensor *gy = rnd(EM_F32, 3, (int64_t[]){c->T, c->N, c->H}, 7, 1),
              *ghn = rnd(EM_F32, 2, (int64_t[]){c->N, c->H}, 8, 1),
              *gcn = rnd(EM_F32, 2, (int64_t[]){c->N, c->H}, 9, 1);
    em_tensor *dg = NULL, *dhx = NULL, *dcx = NULL;
    cr_assert_eq(em_lstm_backward(gy, ghn, gcn, r.w, ws, r.len, c->reverse, &dg, &dhx, &dcx),
                 EM_OK, "%s: %s", c->name, em_last_error());
    const em_tensor *outs[7] = {y, hn, cn, ws, dg, dhx, dcx};
    int64_t n = 0;
    for (int i = 0; i < 7; i++) {
        cr_assert(outs[i], "%s: output %d missing", c->name, i);
        n += cnt[i] = em_tensor_numel(outs[i]);
    }
    double *all = malloc(sizeof(double) * (size_t)n), *at = all;
    for (int i = 0; i < 7; i++) {
        double *v = em_test_values(outs[i]);
        memcpy(at, v, sizeof(double) * (size_t)cnt[i]);
        at += cnt[i];
        free(v);
    }
    cr_assert_eq(em_scope_end(), EM_OK);
    *n_out = n;
    return all;
}

/* The f32 LSTM on AVX-512 runs its steps in one parallel region, each thread owning a fixed
 * share of the hidden units in chunks of 16 (cpu_rnn_loops.h, lstm_fwd_par): a step's product
 * big enough (N 4H H at least 2^20 multiply-adds) takes both threads. What the lstm and
 * lstm_backward kernels compute (lstm_run) is the same bits on 1, 2 and 3 threads, on any CPU
 * (without AVX-512 the per-step loop runs, whose products and cells split no sum either), and
 * the op's outputs and gradients match the composed recurrence within 1e-4 on 2 threads; for
 * hidden sizes that are not multiples of 16 (a share's last chunk masked), fewer chunks than
 * threads, both directions, initial states, lengths. */
Test(rnn_ops, lstm_bits_do_not_depend_on_the_thread_count) {
    static int64_t len40[40];
    for (int b = 0; b < 40; b++) len40[b] = (b * 5) % 7; /* 0 to 6 */
    static const rnn_case par[] = {
        {"lstm 6 steps x 40 x 100, lengths", false, 6, 40, 9, 100, false, true, true, len40},
        {"lstm 6 steps x 40 x 100 reverse, lengths", false, 6, 40, 9, 100, true, true, false,
         len40},
        {"lstm 4 steps x 16 x 129 reverse, no states", false, 4, 16, 5, 129, true, false, true,
         NULL},
        {"lstm 3 steps x 11000 x 5 (one chunk)", false, 3, 11000, 3, 5, false, true, true, NULL},
        {"lstm 5 steps x 32 x 160", false, 5, 32, 16, 160, false, true, true, NULL},
        {"lstm 2 steps x 8 x 600 reverse", false, 2, 8, 7, 600, true, true, true, NULL},
    };
    int nt0 = em_num_threads();
    for (size_t i = 0; i < sizeof par / sizeof par[0]; i++) {
        static const char *const what[7] = {"output", "h_n", "c_n", "workspace",
                                            "grad_gates", "grad_hx", "grad_cx"};
        int64_t n1, c1[7];
        double *a = lstm_run(&par[i], 1, &n1, c1);
        for (int nt = 2; nt <= 3; nt++) { /* 3: shares of unequal sizes (7 chunks at H 100) */
            int64_t n2, c2[7];
            double *b = lstm_run(&par[i], nt, &n2, c2);
            cr_assert_eq(n1, n2);
            for (int64_t o = 0, e = 0; o < 7; e += c1[o++]) {
                int64_t diff = 0;
                for (int64_t q = e; q < e + c1[o]; q++)
                    diff += memcmp(&a[q], &b[q], sizeof(double)) != 0;
                cr_expect_eq(diff, 0, "%s: %s: %lld of %lld values differ between 1 and %d "
                             "threads", par[i].name, what[o], (long long)diff,
                             (long long)c1[o], nt);
            }
            free(b);
        }
        free(a);
        em_set_num_threads(2);
        check_case(&par[i], EM_F32, 1e-4);
    }
    em_set_num_threads(nt0);
}

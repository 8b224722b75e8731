/*
 * bench/conv_chain.c — the CNN step's convolution chain (bench/train_step's train_cnn_b64:
 * conv1 1->32 3x3 pad 1 on 28x28, relu, 2x2 max pooling, conv2 32->64 3x3 pad 1 on 14x14,
 * relu, 2x2 max pooling; batch 64, f32), forward and backward, in three variants (five with
 * --conv2-nhwc) run round-robin in one process (issue 27, design (a) of docs/performance.md's
 * "Design: activation layouts for the convolutions"):
 *
 *   nhwc     Ember's own ops on channels-last tensors through the public API, the calls
 *            autograd makes in the step, in its order: channels_last(x), conv2d_relu,
 *            max_pool2d, conv2d_relu, max_pool2d, flatten; then max_pool2d_backward (on the
 *            row-major grad the flatten hands back), relu_backward, conv2d_backward_data,
 *            conv2d_backward_weight, max_pool2d_backward, relu_backward,
 *            conv2d_backward_weight. Ember's kernels make their own choices (conv1's jit
 *            forward, the blocked backwards with their reorders, the batch split of
 *            backward-weight, its loops for relu and pooling).
 *   blk      oneDNN directly, every activation and gradient in nChw16c from conv1's output to
 *            conv1's output grad: oneDNN's eltwise relu (relu_use_dst_for_bwd, alpha 0; in
 *            place forward) and max pooling with its workspace; conversions only at the ends
 *            (the 1-channel input is read as nchw, the same bytes as nhwc, so none there; the
 *            pooled output to nchw for the flatten, its grad back to nChw16c). Weights in
 *            oneDNN's layout, reordered from Ember's oihw at each use (the "weight reorders"
 *            row); backward-weight split over the batch as Ember's kernel does on more than
 *            one thread (one one-thread primitive per chunk on its slice of the blocked
 *            tensors, f32 partial sums added, then reordered to oihw).
 *   blk-loop blk with Ember's relu (in place) and relu_backward ops (y <= 0 ? 0 : y;
 *            y > 0 ? g : 0) run over the blocked buffers, each wrapped as a 1-d tensor,
 *            instead of oneDNN's eltwise: they are elementwise, so any layout gives the
 *            same bits.
 *
 *   nhwc-brg, nhwc-jit (--conv2-nhwc): the nhwc variant with conv2's forward run straight
 *            into oneDNN on the same nhwc tensors, brgconv (oneDNN's first choice there, the
 *            one Ember's kernel takes) or the first other non-reference implementation
 *            (jit:avx512_core), then Ember's relu in place (conv2d_relu's kernel does the
 *            same); the weights reordered from oihw at each call, inside the stage.
 *
 *   bench/conv_chain [--cold|--cold-each] [--conv2-nhwc] THREADS [ROUNDS]
 *
 * Each round runs the three variants in a rotating order; 3 untimed rounds first, ROUNDS
 * (default 30) timed. Each stage's process CPU time (all threads) and wall time is taken
 * around its call; the medians over the rounds are printed, then the chain's forward,
 * backward and whole-chain spans (measured, not summed). --cold writes 64 MiB (untimed)
 * before the forward and again before the backward (as the step's fc layers, loss and
 * optimizer stream between two chains); --cold-each before every stage (each primitive as
 * `bench/step_floor --cold` times it alone; the spans then exclude the writes). Before timing, the program checks that
 * the variants compute the same pooled output, conv2 data grad and weight and bias grads
 * (relative to the largest value; f32 rounding), and prints how oneDNN's eltwise relu treats
 * NaN, -inf and -0 against Ember's relu. Run it with OMP_WAIT_POLICY=passive like the other
 * bench programs on a shared machine.
 */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>
#include <ember/ember.h>

enum { MB = 64, C1 = 32, C2 = 64, H1 = 28, H2 = 14, H3 = 7, WARMUP = 3, COLD_BYTES = 64 << 20 };
enum { V_NHWC, V_BLK, V_BLK_LOOP, V_NHWC_BRG, V_NHWC_JIT, NV };
static const char *const vname[NV] = {"nhwc", "blk", "blk-loop", "nhwc-brg", "nhwc-jit"};
static int nv = 3; /* --conv2-nhwc: 5 */

enum {
    S_IN,
    S_W,
    S_C1,
    S_R1,
    S_P1,
    S_C2,
    S_R2,
    S_P2,
    S_FL,
    S_G,
    S_P2B,
    S_R2B,
    S_C2D,
    S_C2W,
    S_P1B,
    S_R1B,
    S_C1W,
    NS
};
static const char *const sname[NS] = {
    "input conversion",   "weight reorders",   "conv1 fwd",        "relu1",
    "pool1 fwd",          "conv2 fwd",         "relu2",            "pool2 fwd",
    "flatten conversion", "grad conversion",   "pool2 bwd",        "relu2 bwd",
    "conv2 bwd-data",     "conv2 bwd-weight",  "pool1 bwd",        "relu1 bwd",
    "conv1 bwd-weight"};

/* ---- timing ------------------------------------------------------------------------------- */

static volatile unsigned char *cold_buf;
static int cold_mode; /* 0 warm, 1 before forward and backward, 2 before every stage */

static double clock_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void evict(void) {
    for (size_t i = 0; i < COLD_BYTES; i += 64) cold_buf[i] = (unsigned char)(cold_buf[i] + 1);
}

/* The current round's figures of one variant: per stage (summed when a stage runs twice),
 * and the forward and backward spans. */
static double st_cpu[NS], st_wall[NS], span_cpu[2], span_wall[2];
static double t_cpu, t_wall, span0_cpu, span0_wall, evict_cpu, evict_wall;

static void stage_begin(void) {
    if (cold_mode == 2) {
        double c = clock_ms(CLOCK_PROCESS_CPUTIME_ID), w = clock_ms(CLOCK_MONOTONIC);
        evict();
        evict_cpu += clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c; /* excluded from the spans */
        evict_wall += clock_ms(CLOCK_MONOTONIC) - w;
    }
    t_cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
    t_wall = clock_ms(CLOCK_MONOTONIC);
}

static void stage_end(int s) {
    st_cpu[s] += clock_ms(CLOCK_PROCESS_CPUTIME_ID) - t_cpu;
    st_wall[s] += clock_ms(CLOCK_MONOTONIC) - t_wall;
}

static void span_begin(void) {
    if (cold_mode == 1) evict();
    evict_cpu = evict_wall = 0;
    span0_cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
    span0_wall = clock_ms(CLOCK_MONOTONIC);
}

static void span_end(int half) {
    span_cpu[half] = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - span0_cpu - evict_cpu;
    span_wall[half] = clock_ms(CLOCK_MONOTONIC) - span0_wall - evict_wall;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- oneDNN helpers ----------------------------------------------------------------------- */

static dnnl_engine_t engine;
static dnnl_stream_t stream;

#define CK(call) ck((call), #call, __LINE__)
static void ck(dnnl_status_t s, const char *what, int line) {
    if (s != dnnl_success) {
        fprintf(stderr, "conv_chain: line %d: %s: oneDNN status %d\n", line, what, (int)s);
        exit(1);
    }
}

static void die(const char *what) {
    fprintf(stderr, "conv_chain: %s: %s\n", what, em_last_error());
    exit(1);
}

static dnnl_memory_desc_t md4(int64_t n, int64_t c, int64_t h, int64_t w, dnnl_format_tag_t tag) {
    dnnl_memory_desc_t md;
    dnnl_dims_t d = {n, c, h, w};
    CK(dnnl_memory_desc_init_by_tag(&md, 4, d, dnnl_f32, tag));
    return md;
}

static dnnl_memory_desc_t md1(int64_t n) {
    dnnl_memory_desc_t md;
    dnnl_dims_t d = {n};
    CK(dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_f32, dnnl_x));
    return md;
}

/* A memory object on handle, or on its own zeroed buffer when handle is NULL. */
static dnnl_memory_t mem(const dnnl_memory_desc_t *md, void *handle) {
    dnnl_memory_t m;
    CK(dnnl_memory_create(&m, md, engine, handle ? handle : DNNL_MEMORY_ALLOCATE));
    if (!handle) {
        void *p;
        CK(dnnl_memory_get_data_handle(m, &p));
        memset(p, 0, dnnl_memory_desc_get_size(md));
    }
    return m;
}

static void *ptr(dnnl_memory_t m) {
    void *p;
    CK(dnnl_memory_get_data_handle(m, &p));
    return p;
}

static const dnnl_memory_desc_t *q(const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    return dnnl_primitive_desc_query_md(pd, what, 0);
}

static const char *impl_of(const_dnnl_primitive_desc_t pd) {
    const char *s = NULL;
    CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s));
    return s;
}

static dnnl_primitive_t prim(const_dnnl_primitive_desc_t pd) {
    dnnl_primitive_t p;
    CK(dnnl_primitive_create(&p, pd));
    return p;
}

static dnnl_primitive_desc_t pd_of(const void *desc, const_dnnl_primitive_desc_t hint) {
    dnnl_primitive_desc_t pd;
    CK(dnnl_primitive_desc_create(&pd, desc, NULL, engine, hint));
    return pd;
}

static dnnl_primitive_t reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to) {
    dnnl_primitive_desc_t pd;
    CK(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL));
    dnnl_primitive_t p = prim(pd);
    dnnl_primitive_desc_destroy(pd);
    return p;
}

static void run(dnnl_stream_t s, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args) {
    CK(dnnl_primitive_execute(p, s, n, args));
    CK(dnnl_stream_wait(s));
}

static void run_reorder(dnnl_primitive_t p, dnnl_memory_t from, dnnl_memory_t to) {
    run(stream, p, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
}

/* ---- the tensors both sides share (Ember's) ----------------------------------------------- */

static em_tensor *X, *W1, *B1, *W2, *B2, *G; /* x (64,1,28,28), weights, biases, pooled grad */
static const int64_t PAD[2] = {1, 1}, K2[2] = {2, 2}, K3[2] = {3, 3};
static const em_op *op_relu_backward;

/* What the validation compares: the chain's results as plain nchw / oihw arrays. */
typedef struct results {
    float *pool2, *gp1, *gw1, *gb1, *gw2, *gb2;
} results;
static const size_t n_pool2 = (size_t)MB * C2 * H3 * H3, n_gp1 = (size_t)MB * C1 * H2 * H2,
                    n_gw1 = C1 * 9, n_gw2 = (size_t)C2 * C1 * 9;

static void keep_plain(float **dst, const em_tensor *t, size_t n) {
    em_tensor *c = em_contiguous(t);
    if (!c) die("contiguous");
    *dst = malloc(n * sizeof(float));
    memcpy(*dst, em_tensor_data(c), n * sizeof(float));
}

/* ---- variant nhwc: Ember's ops ------------------------------------------------------------ */

/* --conv2-nhwc: conv2's forward straight into oneDNN on the nhwc tensors, brgconv (what
 * Ember's kernel gets, oneDNN's first choice there) or the first other non-reference
 * implementation, then Ember's relu in place; its output a channels-last tensor over a buffer
 * of ours. Everything else is the nhwc variant's. */
static struct nhwc_conv2 {
    dnnl_primitive_t conv[2], wr[2];
    dnnl_memory_t src, wu, w[2], b, dst;
    em_tensor *a2;
} N2;

static void nhwc_conv2_setup(void) {
    dnnl_memory_desc_t s = md4(MB, C1, H2, H2, dnnl_nhwc), d = md4(MB, C2, H2, H2, dnnl_nhwc),
                       wa = md4(C2, C1, 3, 3, dnnl_format_tag_any),
                       wu = md4(C2, C1, 3, 3, dnnl_oihw), b = md1(C2);
    dnnl_dims_t s1 = {1, 1}, p1 = {1, 1};
    dnnl_convolution_desc_t cd;
    CK(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &s,
                                          &wa, &b, &d, s1, p1, p1));
    dnnl_primitive_desc_iterator_t it;
    CK(dnnl_primitive_desc_iterator_create(&it, &cd, NULL, engine, NULL));
    int found = 0;
    do {
        dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
        const char *impl = impl_of(pd);
        bool brg = strncmp(impl, "brgconv", 7) == 0;
        int k = brg ? 0 : 1;
        if (strncmp(impl, "ref", 3) != 0 && !N2.conv[k] && (k == 1 || found == 0)) {
            printf("  %-8s %-18s %s\n", vname[V_NHWC_BRG + k], "conv2 fwd", impl);
            N2.conv[k] = prim(pd);
            N2.w[k] = mem(q(pd, dnnl_query_weights_md), NULL);
            N2.wr[k] = reorder(&wu, q(pd, dnnl_query_weights_md));
            found++;
        }
        dnnl_primitive_desc_destroy(pd);
    } while (found < 2 && dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    if (!N2.conv[0] || !N2.conv[1]) {
        fprintf(stderr, "conv_chain: --conv2-nhwc: oneDNN lists no brgconv or no other "
                        "non-reference implementation for conv2 on nhwc\n");
        exit(1);
    }
    N2.wu = mem(&wu, em_tensor_data(W2));
    N2.b = mem(&b, em_tensor_data(B2));
    N2.dst = mem(&d, NULL);
    N2.src = mem(&s, NULL); /* re-pointed at pool1's output each call */
    N2.a2 = em_tensor_wrap(ptr(N2.dst), 4, (const int64_t[]){MB, C2, H2, H2},
                           (const int64_t[]){C2 * H2 * H2, 1, H2 * C2, C2}, EM_F32, em_cpu(),
                           NULL, NULL);
    if (!N2.a2) die("wrap");
}

static em_tensor *nhwc_conv2(int k, const em_tensor *p1) {
    if (!em_tensor_is_channels_last(p1)) die("pool1's output is not channels-last");
    CK(dnnl_memory_set_data_handle(N2.src, em_tensor_data(p1)));
    run_reorder(N2.wr[k], N2.wu, N2.w[k]);
    run(stream, N2.conv[k], 4,
        (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, N2.src}, {DNNL_ARG_WEIGHTS, N2.w[k]},
                            {DNNL_ARG_BIAS, N2.b}, {DNNL_ARG_DST, N2.dst}});
    em_tensor_bump_version(N2.a2); /* oneDNN wrote it */
    if (em_relu_(N2.a2) != EM_OK) die("relu_");
    return N2.a2;
}

/* conv2: -1 Ember's conv2d_relu, 0 brgconv, 1 the other implementation (--conv2-nhwc) */
static void chain_nhwc(int conv2, results *r) {
    if (em_scope_begin() != EM_OK) die("scope");
    em_tensor *xcl, *a1, *p1, *i1, *a2, *p2, *i2, *fl, *ga2, *gz2, *gp1, *ga1, *gz1;
    em_tensor *gw2, *gb2, *gw1, *gb1;
    span_begin();
    stage_begin();
    xcl = em_channels_last(X);
    stage_end(S_IN);
    stage_begin();
    a1 = em_conv2d_relu(xcl, W1, B1, NULL, PAD, NULL, 1);
    stage_end(S_C1);
    stage_begin();
    if (!a1 || em_max_pool2d(a1, K2, NULL, NULL, NULL, false, &p1, &i1) != EM_OK) die("pool1");
    stage_end(S_P1);
    stage_begin();
    a2 = conv2 < 0 ? em_conv2d_relu(p1, W2, B2, NULL, PAD, NULL, 1) : nhwc_conv2(conv2, p1);
    stage_end(S_C2);
    stage_begin();
    if (!a2 || em_max_pool2d(a2, K2, NULL, NULL, NULL, false, &p2, &i2) != EM_OK) die("pool2");
    stage_end(S_P2);
    stage_begin();
    fl = em_contiguous(em_flatten(p2, 1, 3)); /* the step's flatten copies: no viewable reshape */
    stage_end(S_FL);
    if (!fl) die("flatten");
    span_end(0);
    span_begin();
    stage_begin();
    ga2 = em_max_pool2d_backward(G, i2, (const int64_t[]){H2, H2});
    stage_end(S_P2B);
    stage_begin();
    if (!ga2 || em_op_call(op_relu_backward, (const em_tensor *const[]){ga2, a2}, 2, NULL,
                           &gz2) != EM_OK)
        die("relu_backward 2");
    stage_end(S_R2B);
    stage_begin();
    gp1 = em_conv2d_backward_data(gz2, W2, (const int64_t[]){H2, H2}, NULL, PAD, NULL, 1);
    stage_end(S_C2D);
    stage_begin();
    if (em_conv2d_backward_weight(p1, gz2, K3, NULL, PAD, NULL, 1, &gw2, &gb2) != EM_OK)
        die("conv2 backward weight");
    stage_end(S_C2W);
    stage_begin();
    ga1 = gp1 ? em_max_pool2d_backward(gp1, i1, (const int64_t[]){H1, H1}) : NULL;
    stage_end(S_P1B);
    stage_begin();
    if (!ga1 || em_op_call(op_relu_backward, (const em_tensor *const[]){ga1, a1}, 2, NULL,
                           &gz1) != EM_OK)
        die("relu_backward 1");
    stage_end(S_R1B);
    stage_begin();
    if (em_conv2d_backward_weight(xcl, gz1, K3, NULL, PAD, NULL, 1, &gw1, &gb1) != EM_OK)
        die("conv1 backward weight");
    stage_end(S_C1W);
    span_end(1);
    if (r) {
        keep_plain(&r->pool2, fl, n_pool2);
        keep_plain(&r->gp1, gp1, n_gp1);
        keep_plain(&r->gw1, gw1, n_gw1);
        keep_plain(&r->gb1, gb1, C1);
        keep_plain(&r->gw2, gw2, n_gw2);
        keep_plain(&r->gb2, gb2, C2);
    }
    if (em_scope_end() != EM_OK) die("scope");
}

/* ---- variants blk and blk-loop: oneDNN in nChw16c ----------------------------------------- */

static int threads;

/* A backward-weight over the batch, whole (one thread) or split into `threads` chunks. */
typedef struct bwdw {
    int nch;
    dnnl_primitive_t whole, chunk;
    dnnl_stream_t cstream[8];
    dnnl_memory_t src, dd, dw, db;               /* whole */
    dnnl_memory_t csrc[8], cdd[8], cdw[8], cdb[8]; /* chunks: slices of src and dd, partials */
    dnnl_primitive_t to_oihw;                    /* diff weights (oneDNN's layout) to oihw */
    dnnl_memory_t dw_oihw;
    size_t nw;                                   /* floats of diff weights (oneDNN's layout) */
    int64_t oc;
} bwdw;

static void bwdw_make(bwdw *b, const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dd,
                      dnnl_memory_t src_m, dnnl_memory_t dd_m, int64_t ic, int64_t oc,
                      int64_t hw, dnnl_format_tag_t src_tag, const_dnnl_primitive_desc_t fpd,
                      const char *name) {
    memset(b, 0, sizeof *b);
    b->oc = oc;
    dnnl_memory_desc_t wany, wplain, bias = md1(oc);
    dnnl_dims_t wd = {oc, ic, 3, 3}, s1 = {1, 1}, p1 = {1, 1};
    CK(dnnl_memory_desc_init_by_tag(&wany, 4, wd, dnnl_f32, dnnl_format_tag_any));
    CK(dnnl_memory_desc_init_by_tag(&wplain, 4, wd, dnnl_f32, dnnl_oihw));
    b->dw_oihw = mem(&wplain, NULL);
    b->src = src_m, b->dd = dd_m;
    b->nch = threads > 1 ? threads : 1;
    int64_t n = MB / b->nch;
    dnnl_memory_desc_t s = b->nch > 1 ? md4(n, ic, hw, hw, src_tag) : *src,
                       d = b->nch > 1 ? md4(n, oc, hw, hw, dnnl_nChw16c) : *dd;
    dnnl_convolution_desc_t cd;
    CK(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &s, &wany, &bias,
                                                   &d, s1, p1, p1));
    if (b->nch > 1) omp_set_num_threads(1); /* oneDNN sizes its work for the threads it sees */
    dnnl_primitive_desc_t hint = NULL;
    if (b->nch > 1) {
        dnnl_convolution_desc_t fd;
        dnnl_memory_desc_t bb = md1(oc);
        CK(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                              &s, &wany, &bb, &d, s1, p1, p1));
        hint = pd_of(&fd, NULL);
    }
    dnnl_primitive_desc_t pd = pd_of(&cd, b->nch > 1 ? hint : fpd);
    const dnnl_memory_desc_t *dwmd = q(pd, dnnl_query_diff_weights_md);
    b->nw = dnnl_memory_desc_get_size(dwmd) / sizeof(float);
    b->to_oihw = reorder(dwmd, &wplain);
    printf("  %-8s %-18s %s%s\n", "blk", name, impl_of(pd),
           b->nch > 1 ? " (one per batch chunk, one thread each)" : "");
    if (b->nch == 1) {
        b->whole = prim(pd);
        b->dw = mem(dwmd, NULL);
        b->db = mem(&bias, NULL);
    } else {
        b->chunk = prim(pd);
        size_t sbytes = dnnl_memory_desc_get_size(&s), dbytes = dnnl_memory_desc_get_size(&d);
        for (int c = 0; c < b->nch; c++) {
            CK(dnnl_stream_create(&b->cstream[c], engine, dnnl_stream_default_flags));
            b->csrc[c] = mem(&s, (char *)ptr(src_m) + (size_t)c * sbytes);
            b->cdd[c] = mem(&d, (char *)ptr(dd_m) + (size_t)c * dbytes);
            b->cdw[c] = mem(dwmd, NULL);
            b->cdb[c] = mem(&bias, NULL);
        }
        b->dw = b->cdw[0], b->db = b->cdb[0]; /* the partials are added into chunk 0's */
        omp_set_num_threads(threads);
    }
    dnnl_primitive_desc_destroy(pd);
    if (hint) dnnl_primitive_desc_destroy(hint);
}

static void bwdw_run(bwdw *b) {
    if (b->nch == 1) {
        run(stream, b->whole, 4,
            (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, b->src}, {DNNL_ARG_DIFF_DST, b->dd},
                                {DNNL_ARG_DIFF_WEIGHTS, b->dw}, {DNNL_ARG_DIFF_BIAS, b->db}});
    } else {
#pragma omp parallel num_threads(b->nch)
        {
            int c = omp_get_thread_num();
            run(b->cstream[c], b->chunk, 4,
                (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, b->csrc[c]}, {DNNL_ARG_DIFF_DST, b->cdd[c]},
                                    {DNNL_ARG_DIFF_WEIGHTS, b->cdw[c]},
                                    {DNNL_ARG_DIFF_BIAS, b->cdb[c]}});
        }
        float *w0 = ptr(b->cdw[0]), *b0 = ptr(b->cdb[0]);
        for (int c = 1; c < b->nch; c++) {
            const float *wc = ptr(b->cdw[c]), *bc = ptr(b->cdb[c]);
            for (size_t i = 0; i < b->nw; i++) w0[i] += wc[i];
            for (int64_t i = 0; i < b->oc; i++) b0[i] += bc[i];
        }
    }
    run_reorder(b->to_oihw, b->dw, b->dw_oihw);
}

/* blk-loop: Ember's relu (in place) and relu_backward ops over the blocked buffers, each
 * wrapped as a 1-d tensor (em_tensor_wrap): elementwise kernels see no layout. */
static em_tensor *wrap(dnnl_memory_t m) {
    const dnnl_memory_desc_t *md;
    CK(dnnl_memory_get_memory_desc(m, &md));
    int64_t n = (int64_t)(dnnl_memory_desc_get_size(md) / sizeof(float));
    em_tensor *t = em_tensor_wrap(ptr(m), 1, &n, NULL, EM_F32, em_cpu(), NULL, NULL);
    if (!t) die("wrap");
    return t;
}

static struct blk {
    /* forward */
    dnnl_primitive_t c1, r1, p1, c2, r2, p2, fl, w1r, w2r, w2rb, g_in;
    dnnl_memory_t x, w1u, w1, b1, a1, p1o, ws1, w2u, w2, w2b, b2, a2, p2o, ws2, flat;
    /* backward */
    dnnl_primitive_t p2b, r2b, c2d, p1b, r1b;
    dnnl_memory_t gu, gp2, ga2, gz2, gp1, ga1, gz1;
    bwdw c2w, c1w;
    em_tensor *ta1, *ta2, *tb2[3], *tb1[3]; /* blk-loop: a1, a2; (g, y, gx) of the backwards */
} B;

/* A blocked forward convolution (3x3, padding 1) with its memories: the weights on Ember's
 * oihw tensor W and in the primitive's layout with the reorder between, the bias on Bt, the
 * output. Returns the primitive descriptor (the backward's hint). */
static dnnl_primitive_desc_t conv_fwd_make(const char *name, const dnnl_memory_desc_t *src,
                                           const dnnl_memory_desc_t *wa,
                                           const dnnl_memory_desc_t *wu,
                                           const dnnl_memory_desc_t *bias,
                                           const dnnl_memory_desc_t *dst, em_tensor *W,
                                           em_tensor *Bt, dnnl_primitive_t *conv,
                                           dnnl_memory_t *wum, dnnl_memory_t *w,
                                           dnnl_primitive_t *wr, dnnl_memory_t *bm,
                                           dnnl_memory_t *out) {
    dnnl_dims_t s1 = {1, 1}, p1 = {1, 1};
    dnnl_convolution_desc_t cd;
    CK(dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, src,
                                          wa, bias, dst, s1, p1, p1));
    dnnl_primitive_desc_t pd = pd_of(&cd, NULL);
    printf("  %-8s %-18s %s\n", "blk", name, impl_of(pd));
    *conv = prim(pd);
    *wum = mem(wu, em_tensor_data(W));
    *w = mem(q(pd, dnnl_query_weights_md), NULL);
    *wr = reorder(wu, q(pd, dnnl_query_weights_md));
    *bm = mem(bias, em_tensor_data(Bt));
    *out = mem(dst, NULL);
    return pd;
}

static void blk_setup(void) {
    dnnl_memory_desc_t x = md4(MB, 1, H1, H1, dnnl_nchw), a1 = md4(MB, C1, H1, H1, dnnl_nChw16c),
                       p1 = md4(MB, C1, H2, H2, dnnl_nChw16c),
                       a2 = md4(MB, C2, H2, H2, dnnl_nChw16c),
                       p2 = md4(MB, C2, H3, H3, dnnl_nChw16c),
                       p2n = md4(MB, C2, H3, H3, dnnl_nchw), w1u = md4(C1, 1, 3, 3, dnnl_oihw),
                       w2u = md4(C2, C1, 3, 3, dnnl_oihw), w1a = md4(C1, 1, 3, 3, dnnl_format_tag_any),
                       w2a = md4(C2, C1, 3, 3, dnnl_format_tag_any), b1 = md1(C1), b2 = md1(C2);
    dnnl_dims_t s1 = {1, 1}, pd1 = {1, 1}, s2 = {2, 2}, k2 = {2, 2}, z = {0, 0};
    dnnl_primitive_desc_t c1pd = conv_fwd_make("conv1 fwd", &x, &w1a, &w1u, &b1, &a1, W1, B1,
                                               &B.c1, &B.w1u, &B.w1, &B.w1r, &B.b1, &B.a1);
    B.x = mem(&x, em_tensor_data(X));
    /* relu (use_dst_for_bwd: the backward reads the output, as Ember's relu_backward) */
    dnnl_eltwise_desc_t ed;
    CK(dnnl_eltwise_forward_desc_init(&ed, dnnl_forward_training, dnnl_eltwise_relu_use_dst_for_bwd,
                                      &a1, 0.f, 0.f));
    dnnl_primitive_desc_t r1pd = pd_of(&ed, NULL);
    B.r1 = prim(r1pd);
    printf("  %-8s %-18s %s\n", "blk", "relu1", impl_of(r1pd));
    /* pool1 */
    dnnl_pooling_v2_desc_t pl;
    CK(dnnl_pooling_v2_forward_desc_init(&pl, dnnl_forward_training, dnnl_pooling_max, &a1, &p1,
                                         s2, k2, z, z, z));
    dnnl_primitive_desc_t p1pd = pd_of(&pl, NULL);
    printf("  %-8s %-18s %s\n", "blk", "pool1 fwd", impl_of(p1pd));
    B.p1 = prim(p1pd);
    B.p1o = mem(&p1, NULL);
    B.ws1 = mem(q(p1pd, dnnl_query_workspace_md), NULL);
    dnnl_primitive_desc_t c2pd = conv_fwd_make("conv2 fwd", &p1, &w2a, &w2u, &b2, &a2, W2, B2,
                                               &B.c2, &B.w2u, &B.w2, &B.w2r, &B.b2, &B.a2);
    dnnl_convolution_desc_t cd;
    CK(dnnl_eltwise_forward_desc_init(&ed, dnnl_forward_training, dnnl_eltwise_relu_use_dst_for_bwd,
                                      &a2, 0.f, 0.f));
    dnnl_primitive_desc_t r2pd = pd_of(&ed, NULL);
    B.r2 = prim(r2pd);
    CK(dnnl_pooling_v2_forward_desc_init(&pl, dnnl_forward_training, dnnl_pooling_max, &a2, &p2,
                                         s2, k2, z, z, z));
    dnnl_primitive_desc_t p2pd = pd_of(&pl, NULL);
    B.p2 = prim(p2pd);
    B.p2o = mem(&p2, NULL);
    B.ws2 = mem(q(p2pd, dnnl_query_workspace_md), NULL);
    B.flat = mem(&p2n, NULL);
    B.fl = reorder(&p2, &p2n);
    /* backward: the pooled grad arrives row-major (nchw) from the flatten */
    B.gu = mem(&p2n, em_tensor_data(G));
    B.gp2 = mem(&p2, NULL);
    B.g_in = reorder(&p2n, &p2);
    CK(dnnl_pooling_v2_backward_desc_init(&pl, dnnl_pooling_max, &a2, &p2, s2, k2, z, z, z));
    dnnl_primitive_desc_t pd = pd_of(&pl, p2pd);
    printf("  %-8s %-18s %s\n", "blk", "pool2 bwd", impl_of(pd));
    B.p2b = prim(pd);
    dnnl_primitive_desc_destroy(pd);
    B.ga2 = mem(&a2, NULL);
    CK(dnnl_eltwise_backward_desc_init(&ed, dnnl_eltwise_relu_use_dst_for_bwd, &a2, &a2, 0.f, 0.f));
    pd = pd_of(&ed, r2pd);
    printf("  %-8s %-18s %s\n", "blk", "relu2 bwd", impl_of(pd));
    B.r2b = prim(pd);
    dnnl_primitive_desc_destroy(pd);
    B.gz2 = mem(&a2, NULL);
    CK(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &p1, &w2a, &a2, s1,
                                                pd1, pd1));
    pd = pd_of(&cd, c2pd);
    printf("  %-8s %-18s %s\n", "blk", "conv2 bwd-data", impl_of(pd));
    B.c2d = prim(pd);
    B.w2b = mem(q(pd, dnnl_query_weights_md), NULL);
    B.w2rb = reorder(&w2u, q(pd, dnnl_query_weights_md));
    dnnl_primitive_desc_destroy(pd);
    B.gp1 = mem(&p1, NULL);
    bwdw_make(&B.c2w, &p1, &a2, B.p1o, B.gz2, C1, C2, H2, dnnl_nChw16c, c2pd, "conv2 bwd-weight");
    CK(dnnl_pooling_v2_backward_desc_init(&pl, dnnl_pooling_max, &a1, &p1, s2, k2, z, z, z));
    pd = pd_of(&pl, p1pd);
    B.p1b = prim(pd);
    dnnl_primitive_desc_destroy(pd);
    B.ga1 = mem(&a1, NULL);
    CK(dnnl_eltwise_backward_desc_init(&ed, dnnl_eltwise_relu_use_dst_for_bwd, &a1, &a1, 0.f, 0.f));
    pd = pd_of(&ed, r1pd);
    B.r1b = prim(pd);
    dnnl_primitive_desc_destroy(pd);
    B.gz1 = mem(&a1, NULL);
    bwdw_make(&B.c1w, &x, &a1, B.x, B.gz1, 1, C1, H1, dnnl_nchw, c1pd, "conv1 bwd-weight");
    B.ta1 = wrap(B.a1), B.ta2 = wrap(B.a2);
    B.tb2[0] = wrap(B.ga2), B.tb2[1] = B.ta2, B.tb2[2] = wrap(B.gz2);
    B.tb1[0] = wrap(B.ga1), B.tb1[1] = B.ta1, B.tb1[2] = wrap(B.gz1);
    dnnl_primitive_desc_t all[] = {c1pd, r1pd, p1pd, c2pd, r2pd, p2pd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dnnl_primitive_desc_destroy(all[i]);
}

static void conv_fwd(dnnl_primitive_t p, dnnl_memory_t src, dnnl_memory_t w, dnnl_memory_t b,
                     dnnl_memory_t dst) {
    run(stream, p, 4,
        (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b},
                            {DNNL_ARG_DST, dst}});
}

static void relu_fwd(bool loop, dnnl_primitive_t p, dnnl_memory_t a, em_tensor *ta) {
    if (loop) {
        if (em_relu_(ta) != EM_OK) die("relu_");
    } else run(stream, p, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, a}, {DNNL_ARG_DST, a}});
}

static void relu_bwd(bool loop, dnnl_primitive_t p, dnnl_memory_t g, dnnl_memory_t y,
                     dnnl_memory_t gx, em_tensor *const t[3]) {
    if (loop) {
        if (em_op_call_out(op_relu_backward, (const em_tensor *const[]){t[0], t[1]}, 2, NULL,
                           &t[2], 1) != EM_OK)
            die("relu_backward");
    } else
        run(stream, p, 3,
            (dnnl_exec_arg_t[]){{DNNL_ARG_DST, y}, {DNNL_ARG_DIFF_DST, g}, {DNNL_ARG_DIFF_SRC, gx}});
}

static void pool_fwd(dnnl_primitive_t p, dnnl_memory_t a, dnnl_memory_t o, dnnl_memory_t ws) {
    run(stream, p, 3,
        (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, a}, {DNNL_ARG_DST, o}, {DNNL_ARG_WORKSPACE, ws}});
}

static void pool_bwd(dnnl_primitive_t p, dnnl_memory_t g, dnnl_memory_t ws, dnnl_memory_t gx) {
    run(stream, p, 3,
        (dnnl_exec_arg_t[]){{DNNL_ARG_DIFF_DST, g}, {DNNL_ARG_WORKSPACE, ws},
                            {DNNL_ARG_DIFF_SRC, gx}});
}

/* A blocked tensor as a plain nchw array (validation only). */
static float *to_nchw(dnnl_memory_t m, int64_t n, int64_t c, int64_t h) {
    dnnl_memory_desc_t plain = md4(n, c, h, h, dnnl_nchw);
    const dnnl_memory_desc_t *md;
    CK(dnnl_memory_get_memory_desc(m, &md));
    dnnl_memory_t out = mem(&plain, NULL);
    dnnl_primitive_t r = reorder(md, &plain);
    run_reorder(r, m, out);
    size_t bytes = dnnl_memory_desc_get_size(&plain);
    float *f = malloc(bytes);
    memcpy(f, ptr(out), bytes);
    dnnl_primitive_destroy(r);
    dnnl_memory_destroy(out);
    return f;
}

static float *copy_of(dnnl_memory_t m, size_t n) {
    float *f = malloc(n * sizeof(float));
    memcpy(f, ptr(m), n * sizeof(float));
    return f;
}

/* One forward layer of the blocked chain: the weights' reorder, conv, relu, pooling; s_conv
 * is its conv's stage (relu's and the pooling's follow it). */
static void blk_layer(bool loop, int s_conv, dnnl_primitive_t wr, dnnl_memory_t wu,
                      dnnl_memory_t w, dnnl_primitive_t conv, dnnl_memory_t src, dnnl_memory_t b,
                      dnnl_memory_t a, dnnl_primitive_t relu, em_tensor *ta, dnnl_primitive_t pool,
                      dnnl_memory_t po, dnnl_memory_t ws) {
    stage_begin();
    run_reorder(wr, wu, w);
    stage_end(S_W);
    stage_begin();
    conv_fwd(conv, src, w, b, a);
    stage_end(s_conv);
    stage_begin();
    relu_fwd(loop, relu, a, ta);
    stage_end(s_conv + 1);
    stage_begin();
    pool_fwd(pool, a, po, ws);
    stage_end(s_conv + 2);
}

/* The pooling and relu backwards of one layer (stages s_pool and s_pool + 1). */
static void blk_unlayer(bool loop, int s_pool, dnnl_primitive_t pool, dnnl_memory_t g,
                        dnnl_memory_t ws, dnnl_memory_t ga, dnnl_primitive_t relu, dnnl_memory_t y,
                        dnnl_memory_t gz, em_tensor *const t[3]) {
    stage_begin();
    pool_bwd(pool, g, ws, ga);
    stage_end(s_pool);
    stage_begin();
    relu_bwd(loop, relu, ga, y, gz, t);
    stage_end(s_pool + 1);
}

static void chain_blk(bool loop, results *r) {
    span_begin();
    blk_layer(loop, S_C1, B.w1r, B.w1u, B.w1, B.c1, B.x, B.b1, B.a1, B.r1, B.ta1, B.p1, B.p1o,
              B.ws1);
    blk_layer(loop, S_C2, B.w2r, B.w2u, B.w2, B.c2, B.p1o, B.b2, B.a2, B.r2, B.ta2, B.p2, B.p2o,
              B.ws2);
    stage_begin();
    run_reorder(B.fl, B.p2o, B.flat);
    stage_end(S_FL);
    span_end(0);
    span_begin();
    stage_begin();
    run_reorder(B.g_in, B.gu, B.gp2);
    stage_end(S_G);
    blk_unlayer(loop, S_P2B, B.p2b, B.gp2, B.ws2, B.ga2, B.r2b, B.a2, B.gz2, B.tb2);
    stage_begin();
    run_reorder(B.w2rb, B.w2u, B.w2b);
    stage_end(S_W);
    stage_begin();
    run(stream, B.c2d, 3,
        (dnnl_exec_arg_t[]){{DNNL_ARG_DIFF_DST, B.gz2}, {DNNL_ARG_WEIGHTS, B.w2b},
                            {DNNL_ARG_DIFF_SRC, B.gp1}});
    stage_end(S_C2D);
    stage_begin();
    bwdw_run(&B.c2w);
    stage_end(S_C2W);
    blk_unlayer(loop, S_P1B, B.p1b, B.gp1, B.ws1, B.ga1, B.r1b, B.a1, B.gz1, B.tb1);
    stage_begin();
    bwdw_run(&B.c1w);
    stage_end(S_C1W);
    span_end(1);
    if (r) {
        r->pool2 = copy_of(B.flat, n_pool2);
        r->gp1 = to_nchw(B.gp1, MB, C1, H2);
        r->gw1 = copy_of(B.c1w.dw_oihw, n_gw1);
        r->gb1 = copy_of(B.c1w.db, C1);
        r->gw2 = copy_of(B.c2w.dw_oihw, n_gw2);
        r->gb2 = copy_of(B.c2w.db, C2);
    }
}

static void run_variant(int v, results *r) {
    if (v == V_NHWC) chain_nhwc(-1, r);
    else if (v >= V_NHWC_BRG) chain_nhwc(v - V_NHWC_BRG, r);
    else chain_blk(v == V_BLK_LOOP, r);
}

/* ---- checks ------------------------------------------------------------------------------- */

/* Largest |a - b| over the largest |a|; NaN if either holds a NaN. */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return NAN;
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)a[i]));
    }
    return m > 0 ? d / m : d;
}

static bool validate(void) {
    results r[NV];
    for (int v = 0; v < nv; v++) run_variant(v, &r[v]);
    struct {
        const char *name;
        size_t off, n;
        double tol;
    } t[] = {{"pool2 output (flattened)", offsetof(results, pool2), n_pool2, 1e-5},
             {"conv2 data grad", offsetof(results, gp1), n_gp1, 1e-5},
             {"conv2 weight grad", offsetof(results, gw2), n_gw2, 1e-4},
             {"conv2 bias grad", offsetof(results, gb2), C2, 1e-4},
             {"conv1 weight grad", offsetof(results, gw1), n_gw1, 1e-4},
             {"conv1 bias grad", offsetof(results, gb1), C1, 1e-4}};
    bool ok = true;
    printf("check: the variants against nhwc (largest |difference| / largest |value|):\n");
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const float *a = *(float **)((char *)&r[V_NHWC] + t[i].off);
        printf("  %-26s", t[i].name);
        for (int v = 1; v < nv; v++) {
            const float *b = *(float **)((char *)&r[v] + t[i].off);
            double d = rel_diff(a, b, t[i].n);
            bool good = d <= t[i].tol; /* false for NaN */
            ok = ok && good;
            printf("  %s %.2e%s", vname[v], d, good ? "" : " (over the tolerance)");
        }
        printf("  (tolerance %.0e)\n", t[i].tol);
    }
    for (int v = 0; v < nv; v++) {
        free(r[v].pool2), free(r[v].gp1), free(r[v].gw1), free(r[v].gb1), free(r[v].gw2),
            free(r[v].gb2);
    }
    return ok;
}

/* oneDNN's eltwise relu (alpha 0, the chain's primitive kind on a 4-d nChw16c tensor) and its
 * backward against Ember's relu on the special values. */
static void relu_semantics(void) {
    enum { N = 2, C = 16, HW = 4, E = N * C * HW * HW };
    dnnl_memory_desc_t md = md4(N, C, HW, HW, dnnl_nChw16c);
    const float sp[] = {NAN, -INFINITY, INFINITY, -0.f, 0.f, -1e-45f, 1e-45f, -1.f, 1.f};
    const char *spn[] = {"NaN", "-inf", "+inf", "-0", "+0", "-denormal", "+denormal", "-1", "1"};
    enum { NSP = sizeof sp / sizeof sp[0] };
    dnnl_memory_t x = mem(&md, NULL), y = mem(&md, NULL), g = mem(&md, NULL), gx = mem(&md, NULL);
    float *px = ptr(x), *pg = ptr(g);
    for (int i = 0; i < E; i++) px[i] = sp[i % NSP], pg[i] = 1.f;
    dnnl_eltwise_desc_t ed;
    CK(dnnl_eltwise_forward_desc_init(&ed, dnnl_forward_training, dnnl_eltwise_relu_use_dst_for_bwd,
                                      &md, 0.f, 0.f));
    dnnl_primitive_desc_t fpd = pd_of(&ed, NULL);
    dnnl_primitive_t fp = prim(fpd);
    run(stream, fp, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, y}});
    CK(dnnl_eltwise_backward_desc_init(&ed, dnnl_eltwise_relu_use_dst_for_bwd, &md, &md, 0.f, 0.f));
    dnnl_primitive_desc_t bpd = pd_of(&ed, fpd);
    dnnl_primitive_t bp = prim(bpd);
    /* the backward on y = the special values themselves (a NaN output, a -0 output ...) */
    run(stream, bp, 3, (dnnl_exec_arg_t[]){{DNNL_ARG_DST, x}, {DNNL_ARG_DIFF_DST, g},
                                           {DNNL_ARG_DIFF_SRC, gx}});
    const float *py = ptr(y), *pgx = ptr(gx);
    printf("relu semantics, oneDNN eltwise (%s / %s) against Ember's relu and relu_backward:\n",
           impl_of(fpd), impl_of(bpd));
    int diff = 0;
    for (int i = 0; i < NSP; i++) {
        float er = px[i] <= 0 ? 0 : px[i], eg = px[i] > 0 ? 1.f : 0;
        uint32_t a, b, c, d;
        memcpy(&a, &py[i], 4), memcpy(&b, &er, 4), memcpy(&c, &pgx[i], 4), memcpy(&d, &eg, 4);
        /* every element holding this special value, not just the first */
        for (int j = i; j < E; j += NSP) {
            uint32_t aj, cj;
            memcpy(&aj, &py[j], 4), memcpy(&cj, &pgx[j], 4);
            if (aj != a || cj != c) a = ~b; /* inconsistent across positions: a difference */
        }
        bool same = a == b && c == d;
        diff += !same;
        printf("  %-10s relu %-10g (Ember %-10g)  backward at y = %-10s %-3g (Ember %g)%s\n",
               spn[i], py[i], er, spn[i], pgx[i], eg, same ? "" : "   differs");
    }
    printf("  %s\n", diff ? "oneDNN's relu differs from Ember's on the values marked"
                          : "the same bits on every value");
    dnnl_primitive_destroy(fp), dnnl_primitive_destroy(bp);
    dnnl_primitive_desc_destroy(fpd), dnnl_primitive_desc_destroy(bpd);
    dnnl_memory_t all[] = {x, y, g, gx};
    for (int i = 0; i < 4; i++) dnnl_memory_destroy(all[i]);
}

/* ---- main --------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: bench/conv_chain [--cold|--cold-each] [--conv2-nhwc] THREADS "
                    "[ROUNDS]\n");
    exit(2);
}

static em_tensor *uniform(int nd, const int64_t *shape, double lo, double hi) {
    em_tensor *t = em_empty(nd, shape, EM_F32, em_cpu());
    if (!t || em_uniform_(t, lo, hi, NULL) != EM_OK) die("uniform");
    return t;
}

int main(int argc, char **argv) {
    int a = 1;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (strcmp(argv[a], "--cold") == 0) cold_mode = 1;
        else if (strcmp(argv[a], "--cold-each") == 0) cold_mode = 2;
        else if (strcmp(argv[a], "--conv2-nhwc") == 0) nv = NV;
        else usage();
    }
    if (argc - a < 1 || argc - a > 2) usage();
    threads = atoi(argv[a]);
    int rounds = argc - a > 1 ? atoi(argv[a + 1]) : 30;
    if (threads < 1 || threads > 8 || rounds < 1 || rounds > 100000) usage();
    if (cold_mode) {
        cold_buf = malloc(COLD_BYTES);
        if (!cold_buf) return 1;
        memset((void *)cold_buf, 0, COLD_BYTES);
    }
    if (em_init() != EM_OK) die("em_init");
    em_set_num_threads(threads);
    omp_set_num_threads(threads);
    CK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    CK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    op_relu_backward = em_op_find("relu_backward");
    if (!op_relu_backward) die("relu_backward");

    /* parameters as bench/train_step's (uniform on +-1/sqrt(fan_in)), input uniform [0, 1),
     * the pooled output's grad uniform on +-1/64 (about what the loss hands back) */
    X = uniform(4, (const int64_t[]){MB, 1, H1, H1}, 0, 1);
    W1 = uniform(4, (const int64_t[]){C1, 1, 3, 3}, -1. / 3, 1. / 3);
    B1 = uniform(1, (const int64_t[]){C1}, -1. / 3, 1. / 3);
    W2 = uniform(4, (const int64_t[]){C2, C1, 3, 3}, -1 / sqrt(288.), 1 / sqrt(288.));
    B2 = uniform(1, (const int64_t[]){C2}, -1 / sqrt(288.), 1 / sqrt(288.));
    G = uniform(4, (const int64_t[]){MB, C2, H3, H3}, -1. / 64, 1. / 64);

    printf("conv_chain: batch %d, %d thread(s), %s%s, %d rounds (+%d untimed), OMP_WAIT_POLICY=%s\n",
           MB, threads,
           cold_mode == 0 ? "warm (chain after chain)"
           : cold_mode == 1 ? "cold (64 MiB written before the forward and the backward)"
                            : "cold-each (64 MiB written before every stage)",
           nv == NV ? ", conv2's nhwc forward brgconv and not" : "", rounds, WARMUP,
           getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(unset)");
    relu_semantics();
    printf("oneDNN implementations (the nhwc variant's are Ember's choices):\n");
    blk_setup();
    if (nv == NV) nhwc_conv2_setup();
    bool ok = validate();

    double *cpu = malloc(sizeof(double) * (size_t)NV * (NS + 3) * (size_t)rounds);
    double *wall = malloc(sizeof(double) * (size_t)NV * (NS + 3) * (size_t)rounds);
    if (!cpu || !wall) return 1;
#define AT(arr, v, s, i) arr[(((size_t)(v) * (NS + 3)) + (size_t)(s)) * (size_t)rounds + (size_t)(i)]
    for (int i = -WARMUP; i < rounds; i++) {
        for (int k = 0; k < nv; k++) {
            int v = ((i + WARMUP) + k) % nv; /* rotate which variant goes first */
            memset(st_cpu, 0, sizeof st_cpu), memset(st_wall, 0, sizeof st_wall);
            run_variant(v, NULL);
            if (i < 0) continue;
            for (int s = 0; s < NS; s++) AT(cpu, v, s, i) = st_cpu[s], AT(wall, v, s, i) = st_wall[s];
            for (int h = 0; h < 2; h++)
                AT(cpu, v, NS + h, i) = span_cpu[h], AT(wall, v, NS + h, i) = span_wall[h];
            AT(cpu, v, NS + 2, i) = span_cpu[0] + span_cpu[1];
            AT(wall, v, NS + 2, i) = span_wall[0] + span_wall[1];
        }
    }
    printf("medians over %d rounds, ms per call (cpu: the process's, all threads):\n", rounds);
    printf("  %-22s", "stage");
    for (int v = 0; v < nv; v++) printf("  %9s cpu %9s wall", vname[v], vname[v]);
    printf("\n");
    static const char *const tot[3] = {"forward (span)", "backward (span)", "chain (span)"};
    for (int s = 0; s < NS + 3; s++) {
        printf("  %-22s", s < NS ? sname[s] : tot[s - NS]);
        for (int v = 0; v < nv; v++) {
            double c = median(&AT(cpu, v, s, 0), rounds), w = median(&AT(wall, v, s, 0), rounds);
            printf("  %13.4f %14.4f", c, w);
        }
        printf("\n");
    }
    printf("conv_chain: the variants %s\n", ok ? "agree" : "DISAGREE (see the check above)");
    free(cpu), free(wall);
    return ok ? 0 : 1;
}

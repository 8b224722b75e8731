/* Storage layouts (ember/tensor.h, em_layout; docs/performance.md, "Design (a)"): a tensor
 * whose storage holds oneDNN's nChw16c bytes, seen as such only by kernels that declare the
 * layout (em_kernel_def.accepts_layouts) and converted to plain by every other access. The
 * byte order is checked against a plain loop of the nChw16c definition through a test kernel
 * that copies its input's bytes verbatim; values against the same tensor kept plain. */
#include "common.h"

TestSuite(layout, .init = em_test_setup, .fini = em_test_teardown);

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* An f32 (N, C, H, W) tensor with distinct values: element i is i * 0.5 - 7. */
static em_tensor *ramp(em_dtype dt, int64_t n, int64_t c, int64_t h, int64_t w) {
    em_tensor *a = em_arange(0, (double)(n * c * h * w), 1, EM_F64, em_cpu());
    em_tensor *b = em_mul_scalar(a, 0.5), *s = em_add_scalar(b, -7.0);
    em_tensor *r = em_reshape(s, 4, SHAPE(n, c, h, w)), *t = em_to_dtype(r, dt);
    cr_assert(t, "%s", em_last_error());
    em_tensor *out = em_clone(t);
    RELEASE(a, b, s, r, t);
    return out;
}

/* ---- a kernel that sees the bytes: test.raw copies its input's storage verbatim ---------- */

static int raw_seen_layout = -1, plain_seen_layout = -1;

static em_status infer_flat(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    (void)op, (void)attrs;
    out->dtype = em_tensor_dtype(in[0]);
    out->ndim = 1;
    out->shape[0] = em_tensor_numel(in[0]);
    return EM_OK;
}
static em_status raw_kernel(const em_kernel_ctx *k) {
    raw_seen_layout = EM_KCTX_LAYOUT(k, 0);
    memcpy(k->out[0].data, k->in[0].data, (size_t)k->in[0].numel * em_dtype_size(k->in[0].dtype));
    return EM_OK;
}
/* The same copy from a kernel that declares no layout: it must see plain bytes. */
static em_status plain_kernel(const em_kernel_ctx *k) {
    plain_seen_layout = EM_KCTX_LAYOUT(k, 0);
    return raw_kernel(k);
}

static const em_op *declare_copy(const char *name, em_kernel_fn fn, unsigned accepts) {
    em_op_schema s = {.struct_size = sizeof s, .name = name, .n_inputs = 1, .n_outputs = 1,
                      .dispatch_arg = 0, .infer = infer_flat, .flags = EM_OP_NONDIFF};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    static const em_dtype dts[] = {EM_F32, EM_BF16, EM_I64};
    for (size_t i = 0; i < 3; i++) {
        em_kernel_def k = {.struct_size = sizeof k, .op = name, .device_type = "cpu",
                           .dtype = dts[i], .fn = fn, .name = name, .accepts_layouts = accepts};
        cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                     em_last_error());
    }
    return op;
}

static em_tensor *relu_bw(const em_tensor *g, const em_tensor *y) {
    em_tensor *dx = NULL;
    const em_tensor *in[2] = {g, y};
    cr_assert_eq(em_op_call(em_op_find("relu_backward"), in, 2, NULL, &dx), EM_OK, "%s",
                 em_last_error());
    return dx;
}

static em_tensor *call1(const em_op *op, const em_tensor *x) {
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(op, &x, 1, NULL, &y), EM_OK, "%s", em_last_error());
    return y;
}

/* The bytes test.raw read from a blocked t are nChw16c by its definition: element (n, c, h, w)
 * at ((n * C/16 + c/16) * H * W + h * W + w) * 16 + c % 16. */
static void expect_nchw16c(const em_tensor *raw, const em_tensor *plain) {
    const int64_t *sh = em_tensor_shape(plain);
    const int64_t N = sh[0], C = sh[1], H = sh[2], W = sh[3];
    double *r = em_test_values(raw), *p = em_test_values(plain);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t w = 0; w < W; w++) {
                    int64_t b = ((n * (C / 16) + c / 16) * H * W + h * W + w) * 16 + c % 16;
                    int64_t q = ((n * C + c) * H + h) * W + w;
                    cr_assert_eq(r[b], p[q], "(%lld, %lld, %lld, %lld): blocked byte slot %lld "
                                 "holds %g, want %g", (long long)n, (long long)c, (long long)h,
                                 (long long)w, (long long)b, r[b], p[q]);
                }
    free(r);
    free(p);
}

Test(layout, to_layout_writes_nchw16c_bytes_that_only_a_declaring_kernel_sees) {
    const em_op *raw = declare_copy("test.raw", raw_kernel, 1u << EM_LAYOUT_NCHW16C);
    const em_op *plain = declare_copy("test.plain", plain_kernel, 0);
    static const em_dtype dts[] = {EM_F32, EM_BF16, EM_I64};
    for (size_t i = 0; i < 3; i++) {
        em_tensor *x = ramp(dts[i], 2, 32, 3, 5);
        em_tensor *b = em_to_layout(x, EM_LAYOUT_NCHW16C);
        cr_assert(b, "%s", em_last_error());
        cr_assert_neq(b, x, "a plain tensor is copied");
        cr_assert_eq(em_tensor_layout(b), EM_LAYOUT_NCHW16C);
        cr_assert_eq(em_tensor_layout(x), EM_LAYOUT_PLAIN);
        em_test_expect_shape(b, 4, SHAPE(2, 32, 3, 5), "logical shape");
        em_tensor *bytes = call1(raw, b);
        cr_assert_eq(raw_seen_layout, EM_LAYOUT_NCHW16C);
        cr_assert_eq(em_tensor_layout(b), EM_LAYOUT_NCHW16C, "a declaring kernel converts nothing");
        expect_nchw16c(bytes, x);
        /* A kernel without the layout gets plain bytes: the storage converted in place. */
        uint64_t v = em_tensor_version(b);
        em_tensor *pb = call1(plain, b);
        cr_assert_eq(plain_seen_layout, EM_LAYOUT_PLAIN);
        cr_assert_eq(em_tensor_layout(b), EM_LAYOUT_PLAIN);
        cr_assert_eq(em_tensor_version(b), v, "the values did not change: nor does the version");
        em_tensor *px = em_flatten(x, 0, -1);
        double *got = em_test_values(pb), *want = em_test_values(px);
        for (int64_t j = 0; j < em_tensor_numel(x); j++) cr_assert_eq(got[j], want[j]);
        free(got);
        free(want);
        RELEASE(x, b, bytes, pb, px);
    }
}

Test(layout, to_layout_refuses_what_nchw16c_cannot_hold) {
    em_tensor *x3 = em_zeros(4, SHAPE(2, 3, 4, 4), EM_F32, em_cpu());
    cr_assert_null(em_to_layout(x3, EM_LAYOUT_NCHW16C));
    em_assert_error(EM_ERR_SHAPE, "C a positive multiple of 16; got [2, 3, 4, 4] on cpu");
    em_tensor *v = em_zeros(2, SHAPE(16, 16), EM_F32, em_cpu());
    cr_assert_null(em_to_layout(v, EM_LAYOUT_NCHW16C));
    em_assert_error(EM_ERR_SHAPE, "4 dims (N, C, H, W)");
    cr_assert_null(em_to_layout(v, (em_layout)7));
    em_assert_error(EM_ERR_INVALID, "to_layout: 7 is not a layout");
    /* Plain is always possible: t itself. */
    em_tensor *p = em_to_layout(v, EM_LAYOUT_PLAIN);
    cr_assert_eq(p, v);
    RELEASE(x3, v, p);
}

/* Every access outside the declaring kernels reads the logical values. */
Test(layout, every_other_access_sees_plain_values) {
    em_tensor *x = ramp(EM_F32, 2, 16, 3, 4);
    double *want = em_test_values(x);
    const int64_t n = em_tensor_numel(x);
    /* em_tensor_data */
    em_tensor *b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    const float *d = em_tensor_data(b);
    cr_assert(d, "%s", em_last_error());
    cr_assert_eq(em_tensor_layout(b), EM_LAYOUT_PLAIN);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(d[i], want[i]);
    em_tensor_release(b);
    /* views: reshape, flatten, permute, slice, select; and an alias that keeps the layout */
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    em_tensor *det = em_detach(b);
    cr_assert_eq(em_tensor_layout(det), EM_LAYOUT_NCHW16C, "the same geometry: the same tensor");
    em_tensor *f = em_flatten(b, 1, -1);
    cr_assert_eq(em_tensor_layout(b), EM_LAYOUT_PLAIN);
    em_test_expect_close(f, want, n, 0, 0, "flatten");
    em_test_expect_close(det, want, n, 0, 0, "the alias, after its storage went plain");
    RELEASE(b, det, f);
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    em_tensor *sl = em_slice(b, 1, 3, 5, 1), *xs = em_slice(x, 1, 3, 5, 1);
    double *ws = em_test_values(xs);
    em_test_expect_close(sl, ws, em_tensor_numel(xs), 0, 0, "slice");
    free(ws);
    RELEASE(b, sl, xs);
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    em_tensor *pm = em_permute(b, 4, (const int[]){0, 2, 3, 1}),
              *xp = em_permute(x, 4, (const int[]){0, 2, 3, 1});
    double *wp = em_test_values(xp);
    em_test_expect_close(pm, wp, n, 0, 0, "permute");
    free(wp);
    RELEASE(b, pm, xp);
    /* copies: to_host, to_dtype, clone, and an op whose kernel has no layout (add) */
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    em_test_expect_close(b, want, n, 0, 0, "to_host");
    em_tensor_release(b);
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    em_tensor *c = em_clone(b);
    cr_assert_eq(em_tensor_layout(c), EM_LAYOUT_PLAIN);
    em_test_expect_close(c, want, n, 0, 0, "clone");
    em_tensor_release(b);
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    em_tensor *s = em_add(b, c);
    double *w2 = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) w2[i] = 2 * want[i];
    em_test_expect_close(s, w2, n, 0, 0, "add of a blocked and a plain tensor");
    free(w2);
    RELEASE(b, c, s);
    /* reductions and printing */
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    em_tensor *sum = em_sum(b, 0, NULL, false), *xsum = em_sum(x, 0, NULL, false);
    cr_assert_eq(em_test_at(sum, 0), em_test_at(xsum, 0));
    RELEASE(b, sum, xsum);
    b = em_to_layout(x, EM_LAYOUT_NCHW16C);
    char pb[4096], px[4096];
    cr_assert(em_tensor_format(b, pb, sizeof pb) > 0);
    cr_assert(em_tensor_format(x, px, sizeof px) > 0);
    cr_assert_str_eq(pb, px);
    RELEASE(b, x);
    free(want);
}

/* relu declares the layout: a blocked input gives a blocked output with relu's bits, and
 * relu_backward of two blocked operands too; with mixed layouts (its supports() declines)
 * the call is made again on plain tensors. */
Test(layout, relu_keeps_the_layout_and_its_bits) {
    em_tensor *x = ramp(EM_F32, 2, 32, 3, 3);
    float *xd = em_tensor_data(x);
    xd[5] = NAN;
    xd[6] = -0.0f;
    em_tensor_bump_version(x);
    em_tensor *y = em_relu(x);
    em_tensor *b = em_to_layout(x, EM_LAYOUT_NCHW16C), *yb = em_relu(b);
    cr_assert_eq(em_tensor_layout(yb), EM_LAYOUT_NCHW16C);
    cr_assert_eq(em_tensor_layout(b), EM_LAYOUT_NCHW16C);
    em_tensor *g = ramp(EM_F32, 2, 32, 3, 3), *gb = em_to_layout(g, EM_LAYOUT_NCHW16C);
    em_tensor *dx = relu_bw(g, y), *dxb = relu_bw(gb, yb);
    cr_assert_eq(em_tensor_layout(dxb), EM_LAYOUT_NCHW16C);
    const int64_t n = em_tensor_numel(x);
    const float *a = em_tensor_data(y), *a2 = em_tensor_data(yb);
    cr_assert_eq(memcmp(a, a2, (size_t)n * 4), 0, "relu: the same bits");
    const float *c = em_tensor_data(dx), *c2 = em_tensor_data(dxb);
    cr_assert_eq(memcmp(c, c2, (size_t)n * 4), 0, "relu_backward: the same bits");
    /* mixed: gy plain, y blocked */
    em_tensor *b2 = em_to_layout(x, EM_LAYOUT_NCHW16C), *yb2 = em_relu(b2);
    em_tensor *dxm = relu_bw(g, yb2);
    cr_assert_eq(em_tensor_layout(dxm), EM_LAYOUT_PLAIN);
    cr_assert_eq(memcmp(c, em_tensor_data(dxm), (size_t)n * 4), 0, "mixed layouts");
    RELEASE(x, y, b, yb, g, gb, dx, dxb, b2, yb2, dxm);
}

/* test.keep: a layout-keeping op (EM_OP_CHANNELS_LAST) whose kernel copies x into y in
 * whatever layouts the two are in, by the nChw16c definition: what a convolution does when it
 * reads a plain image and writes a blocked activation. */
static int64_t nchw16c_index(const int64_t *sh, int64_t q) {
    const int64_t C = sh[1], H = sh[2], W = sh[3];
    int64_t w = q % W, h = q / W % H, c = q / (W * H) % C, n = q / (W * H * C);
    return ((n * (C / 16) + c / 16) * H * W + h * W + w) * 16 + c % 16;
}
static em_status keep_kernel(const em_kernel_ctx *k) {
    const float *x = k->in[0].data;
    float *y = k->out[0].data;
    bool bx = EM_KCTX_LAYOUT(k, 0) == EM_LAYOUT_NCHW16C, by = EM_KCTX_LAYOUT(k, 1) == EM_LAYOUT_NCHW16C;
    for (int64_t q = 0; q < k->in[0].numel; q++)
        y[by ? nchw16c_index(k->out[0].shape, q) : q] = x[bx ? nchw16c_index(k->in[0].shape, q) : q];
    return EM_OK;
}

/* The thread's preference makes a layout-keeping op's output blocked from a plain input, where
 * the shape allows it and the kernel takes it; relu's kernel reads and writes one layout, so it
 * declines a plain input with a blocked output and the call runs plain. */
Test(layout, a_preferred_layout_applies_where_it_fits) {
    em_op_schema sc = {.struct_size = sizeof sc, .name = "test.keep", .n_inputs = 1,
                       .n_outputs = 1, .dispatch_arg = 0, .infer = em_test_infer_same,
                       .flags = EM_OP_NONDIFF | EM_OP_CHANNELS_LAST};
    const em_op *keep = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &sc, &keep), EM_OK, "%s", em_last_error());
    em_kernel_def kd = {.struct_size = sizeof kd, .op = "test.keep", .device_type = "cpu",
                        .dtype = EM_F32, .fn = keep_kernel, .name = "test_keep",
                        .accepts_layouts = 1u << EM_LAYOUT_NCHW16C};
    cr_assert_eq(em_kernel_register(em_registry_program(), &kd, NULL), EM_OK, "%s",
                 em_last_error());
    em_tensor *x = ramp(EM_F32, 2, 32, 3, 2), *x3 = ramp(EM_F32, 1, 3, 2, 2);
    cr_assert_eq(em_layout_prefer(EM_LAYOUT_NCHW16C), EM_LAYOUT_PLAIN);
    em_tensor *y = call1(keep, x), *y3 = call1(keep, x3), *e = em_exp(x), *r = em_relu(x);
    cr_assert_eq(em_layout_prefer(EM_LAYOUT_PLAIN), EM_LAYOUT_NCHW16C);
    cr_assert_eq(em_tensor_layout(y), EM_LAYOUT_NCHW16C);
    cr_assert_eq(em_tensor_layout(y3), EM_LAYOUT_PLAIN, "C = 3 does not fit");
    cr_assert_eq(em_tensor_layout(e), EM_LAYOUT_PLAIN, "exp keeps no layout");
    cr_assert_eq(em_tensor_layout(r), EM_LAYOUT_PLAIN, "relu: one layout in and out");
    em_tensor *y2 = call1(keep, x);
    cr_assert_eq(em_tensor_layout(y2), EM_LAYOUT_PLAIN, "the preference is over");
    /* y's blocked bytes, as test.raw reads them, are x's by the definition */
    const em_op *raw = declare_copy("test.raw2", raw_kernel, 1u << EM_LAYOUT_NCHW16C);
    em_tensor *bytes = call1(raw, y);
    expect_nchw16c(bytes, x);
    /* and the blocked output follows into the next layout-keeping call: y -> keep -> blocked */
    em_tensor *z = call1(keep, y), *rz = em_relu(y);
    cr_assert_eq(em_tensor_layout(z), EM_LAYOUT_NCHW16C);
    cr_assert_eq(em_tensor_layout(rz), EM_LAYOUT_NCHW16C);
    double *want = em_test_values(x), *got = em_test_values(z), *rr = em_test_values(r),
           *rg = em_test_values(rz);
    for (int64_t i = 0; i < em_tensor_numel(x); i++) {
        cr_assert_eq(got[i], want[i]);
        cr_assert_eq(rg[i], rr[i]);
    }
    free(want);
    free(got);
    free(rr);
    free(rg);
    RELEASE(x, x3, y, y3, e, r, y2, bytes, z, rz);
}

/* Autograd through a blocked activation: the gradient is the plain one. */
Test(layout, gradients_flow_through_a_blocked_activation) {
    em_tensor *x = ramp(EM_F32, 2, 16, 2, 3);
    cr_assert_eq(em_requires_grad_(x, true), EM_OK);
    em_tensor *b = em_to_layout(x, EM_LAYOUT_NCHW16C), *y = em_relu(b), *w = ramp(EM_F32, 2, 16, 2, 3);
    em_tensor *p = em_mul(y, w), *l = em_sum(p, 0, NULL, false);
    cr_assert_eq(em_backward(l), EM_OK, "%s", em_last_error());
    em_tensor *g = em_tensor_grad(x);
    cr_assert(g);
    double *xv = em_test_values(x), *wv = em_test_values(w), *gv = em_test_values(g);
    for (int64_t i = 0; i < em_tensor_numel(x); i++)
        cr_assert_eq(gv[i], xv[i] > 0 ? wv[i] : 0, "element %lld", (long long)i);
    free(xv);
    free(wv);
    free(gv);
    RELEASE(x, b, y, w, p, l);
}

/* ---- max pooling in nChw16c ---------------------------------------------------------------- */

/* An f32 (N, C, H, W) tensor of random values made to tie (whole numbers, +0 beside -0) with
 * NaNs of distinct payloads (which one wins shows in the bits), seeded by seed. */
static em_tensor *pool_input(int64_t n, int64_t c, int64_t h, int64_t w, uint64_t seed) {
    const int64_t m = n * c * h * w;
    double *v = malloc(sizeof(double) * (size_t)m);
    em_test_fill_random(v, m, seed);
    em_tensor *x = em_empty(4, SHAPE(n, c, h, w), EM_F32, em_cpu());
    cr_assert(x, "%s", em_last_error());
    float *d = em_tensor_data(x);
    for (int64_t j = 0; j < m; j++) {
        d[j] = (float)floor(v[j] * 2);
        if (j % 37 == 5) d[j] = -0.0f;
        if (j % 29 == 3) {
            uint32_t bits = 0x7fc00000u | (uint32_t)(j & 0x3fffff);
            memcpy(&d[j], &bits, 4);
        }
    }
    em_tensor_bump_version(x);
    free(v);
    return x;
}

/* a and b hold the same bits (a plain, b any layout: em_tensor_data makes it plain). */
static void expect_same_bits(const em_tensor *a, const em_tensor *b, const char *what) {
    cr_assert_eq(em_tensor_numel(a), em_tensor_numel(b), "%s: sizes", what);
    cr_assert_eq(em_tensor_dtype(a), em_tensor_dtype(b), "%s: dtypes", what);
    const unsigned char *p = em_tensor_data(a), *q = em_tensor_data(b);
    const size_t es = em_dtype_size(em_tensor_dtype(a));
    for (int64_t i = 0; i < em_tensor_numel(a); i++) {
        double u = es == 4 ? ((const float *)p)[i] : es == 8 ? (double)((const int64_t *)p)[i] : 0,
               v = es == 4 ? ((const float *)q)[i] : es == 8 ? (double)((const int64_t *)q)[i] : 0;
        cr_assert_eq(memcmp(p + (size_t)i * es, q + (size_t)i * es, es), 0,
                     "%s: element %lld differs (%g, want %g)", what, (long long)i, v, u);
    }
}

typedef struct pool_case {
    int64_t n, c, h, w, k, s, p, d;
    bool ceil;
} pool_case;

static void blocked_pool_case(const pool_case *pc, uint64_t seed) {
    char what[160];
    snprintf(what, sizeof what, "[%lld, %lld, %lld, %lld] kernel %lld stride %lld pad %lld "
             "dilation %lld%s", (long long)pc->n, (long long)pc->c, (long long)pc->h,
             (long long)pc->w, (long long)pc->k, (long long)pc->s, (long long)pc->p,
             (long long)pc->d, pc->ceil ? " ceil" : "");
    const int64_t ks[2] = {pc->k, pc->k}, ss[2] = {pc->s, pc->s}, ps[2] = {pc->p, pc->p},
                  ds[2] = {pc->d, pc->d}, hw[2] = {pc->h, pc->w};
    em_tensor *x = pool_input(pc->n, pc->c, pc->h, pc->w, seed), *y, *idx, *yb, *ib;
    cr_assert_eq(em_max_pool2d(x, ks, ss, ps, ds, pc->ceil, &y, &idx), EM_OK, "%s: %s", what,
                 em_last_error());
    em_tensor *xb = em_to_layout(x, EM_LAYOUT_NCHW16C);
    cr_assert(xb, "%s", em_last_error());
    cr_assert_eq(em_max_pool2d(xb, ks, ss, ps, ds, pc->ceil, &yb, &ib), EM_OK, "%s: %s", what,
                 em_last_error());
    cr_assert_eq(em_tensor_layout(xb), EM_LAYOUT_NCHW16C, "%s: the input read as it is", what);
    cr_assert_eq(em_tensor_layout(yb), EM_LAYOUT_NCHW16C, "%s: values blocked", what);
    cr_assert_eq(em_tensor_layout(ib), EM_LAYOUT_NCHW16C, "%s: indices blocked", what);
    em_test_expect_shape(yb, 4, em_tensor_shape(y), what);
    /* the backward, from a blocked grad and from a row-major one (a flatten's backward) */
    const int64_t ny = em_tensor_numel(y);
    em_tensor *gy = pool_input(pc->n, pc->c, em_tensor_shape(y)[2], em_tensor_shape(y)[3],
                               seed + 1);
    float *g = em_tensor_data(gy);
    for (int64_t j = 0; j < ny; j++) g[j] = isnan(g[j]) ? g[j] : g[j] * 0.375f + 0.0625f * (float)(j % 7);
    g[ny / 2] = -0.0f;
    em_tensor_bump_version(gy);
    em_tensor *gx = em_max_pool2d_backward(gy, idx, hw);
    cr_assert(gx, "%s: %s", what, em_last_error());
    em_tensor *gyb = em_to_layout(gy, EM_LAYOUT_NCHW16C);
    em_tensor *gxb = em_max_pool2d_backward(gyb, ib, hw), *gxp = em_max_pool2d_backward(gy, ib, hw);
    cr_assert(gxb && gxp, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_layout(gyb), EM_LAYOUT_NCHW16C, "%s: the grad read as it is", what);
    cr_assert_eq(em_tensor_layout(ib), EM_LAYOUT_NCHW16C, "%s: the indices read as they are", what);
    cr_assert_eq(em_tensor_layout(gxb), EM_LAYOUT_NCHW16C, "%s: gx blocked (blocked grad)", what);
    cr_assert_eq(em_tensor_layout(gxp), EM_LAYOUT_NCHW16C, "%s: gx blocked (row-major grad)", what);
    char w2[200];
    snprintf(w2, sizeof w2, "%s: values", what);
    expect_same_bits(y, yb, w2);
    snprintf(w2, sizeof w2, "%s: indices", what);
    expect_same_bits(idx, ib, w2);
    snprintf(w2, sizeof w2, "%s: gx of a blocked grad", what);
    expect_same_bits(gx, gxb, w2);
    snprintf(w2, sizeof w2, "%s: gx of a row-major grad", what);
    expect_same_bits(gx, gxp, w2);
    RELEASE(x, y, idx, xb, yb, ib, gy, gx, gyb, gxb, gxp);
}

/* max_pool2d and its backward read and write nChw16c: a blocked input gives blocked values
 * and indices with the plain call's bits (NaN wins, ties keep the first), and the backward of
 * blocked indices a blocked gx with the plain scatter's bits, from a blocked or a row-major
 * grad; on 1 and 2 threads (the last case is large enough to be split). */
Test(layout, max_pool2d_keeps_nchw16c_and_its_bits) {
    static const pool_case cases[] = {
        {2, 16, 8, 8, 2, 2, 0, 1, false},   {2, 32, 7, 9, 2, 2, 0, 1, false},
        {2, 16, 7, 9, 2, 2, 0, 1, true},    {2, 32, 9, 8, 3, 2, 1, 1, false},
        {2, 16, 9, 10, 3, 2, 1, 1, true},   {2, 16, 9, 9, 3, 1, 0, 2, false},
        {2, 32, 10, 11, 3, 2, 1, 2, true},  {2, 16, 6, 6, 3, 3, 0, 1, false},
        {2, 32, 28, 28, 2, 2, 0, 1, false}, {2, 32, 28, 27, 3, 2, 1, 1, false},
    };
    const int nt0 = em_num_threads();
    for (int t = 1; t <= 2; t++) {
        em_set_num_threads(t);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            blocked_pool_case(&cases[i], 100 + i);
    }
    em_set_num_threads(nt0);
}

/* The backward of blocked indices that do not lie in their own 2x2 tile (a caller's own, in
 * range) sums as the plain scatter does; an index outside the plane is an error. Mixed
 * layouts the kernel declines (grad blocked, indices plain) run plain. */
Test(layout, max_pool2d_backward_blocked_scatters_any_index) {
    const int64_t hw[2] = {8, 8};
    em_tensor *gy = pool_input(2, 16, 4, 4, 7), *idx = em_empty(4, SHAPE(2, 16, 4, 4), EM_I64,
                                                                em_cpu());
    float *g = em_tensor_data(gy);
    int64_t *id = em_tensor_data(idx);
    for (int64_t j = 0; j < em_tensor_numel(idx); j++) {
        id[j] = (j * 7 + j / 16) % 64;
        if (isnan(g[j])) g[j] = 1.5f;
    }
    em_tensor_bump_version(gy);
    em_tensor_bump_version(idx);
    em_tensor *gx = em_max_pool2d_backward(gy, idx, hw);
    cr_assert(gx, "%s", em_last_error());
    em_tensor *ib = em_to_layout(idx, EM_LAYOUT_NCHW16C), *gyb = em_to_layout(gy, EM_LAYOUT_NCHW16C);
    em_tensor *gxb = em_max_pool2d_backward(gyb, ib, hw), *gxp = em_max_pool2d_backward(gy, ib, hw);
    cr_assert(gxb && gxp, "%s", em_last_error());
    cr_assert_eq(em_tensor_layout(gxb), EM_LAYOUT_NCHW16C);
    cr_assert_eq(em_tensor_layout(gxp), EM_LAYOUT_NCHW16C);
    expect_same_bits(gx, gxb, "blocked grad, indices outside their tiles");
    expect_same_bits(gx, gxp, "row-major grad, indices outside their tiles");
    /* grad blocked, indices plain: gx follows the indices, plain */
    em_tensor *gyb2 = em_to_layout(gy, EM_LAYOUT_NCHW16C);
    em_tensor *gxm = em_max_pool2d_backward(gyb2, idx, hw);
    cr_assert(gxm, "%s", em_last_error());
    cr_assert_eq(em_tensor_layout(gxm), EM_LAYOUT_PLAIN);
    expect_same_bits(gx, gxm, "blocked grad, plain indices");
    /* an index outside the plane */
    id = em_tensor_data(idx);
    id[37] = 64;
    em_tensor_bump_version(idx);
    em_tensor *ib2 = em_to_layout(idx, EM_LAYOUT_NCHW16C), *gyb3 = em_to_layout(gy, EM_LAYOUT_NCHW16C);
    cr_assert_null(em_max_pool2d_backward(gyb3, ib2, hw));
    em_assert_error(EM_ERR_RANGE, "outside the input plane of 8 x 8");
    RELEASE(gy, idx, gx, ib, gyb, gxb, gxp, gyb2, gxm, ib2, gyb3);
}

/* f64 and bf16 pooling keep no layout: a blocked input runs plain, with the plain call's
 * bits. */
Test(layout, max_pool2d_of_other_dtypes_runs_plain) {
    static const em_dtype dts[] = {EM_F64, EM_BF16};
    for (size_t i = 0; i < 2; i++) {
        em_tensor *x32 = pool_input(2, 16, 6, 6, 31), *x = em_to_dtype(x32, dts[i]), *y, *idx,
                  *yb, *ib;
        cr_assert_eq(em_max_pool2d(x, (int64_t[]){2, 2}, NULL, NULL, NULL, false, &y, &idx), EM_OK,
                     "%s", em_last_error());
        em_tensor *xb = em_to_layout(x, EM_LAYOUT_NCHW16C);
        cr_assert_eq(em_max_pool2d(xb, (int64_t[]){2, 2}, NULL, NULL, NULL, false, &yb, &ib),
                     EM_OK, "%s", em_last_error());
        cr_assert_eq(em_tensor_layout(yb), EM_LAYOUT_PLAIN, "%s", em_dtype_name(dts[i]));
        cr_assert_eq(em_tensor_layout(ib), EM_LAYOUT_PLAIN, "%s", em_dtype_name(dts[i]));
        expect_same_bits(y, yb, em_dtype_name(dts[i]));
        expect_same_bits(idx, ib, em_dtype_name(dts[i]));
        RELEASE(x32, x, y, idx, xb, yb, ib);
    }
}

/* Autograd through blocked pooling: x (plain) -> to_layout -> max_pool2d -> sum(y * w); the
 * grad (pooling's backward of a row-major grad beside blocked indices) is the plain run's,
 * bit for bit. */
Test(layout, gradients_flow_through_blocked_max_pooling) {
    const int64_t ks[2] = {3, 3}, ss[2] = {2, 2}, ps[2] = {1, 1};
    em_tensor *grads[2] = {NULL, NULL}, *xs[2], *keep[8] = {0};
    for (int b = 0; b < 2; b++) {
        em_tensor *x = pool_input(2, 32, 9, 8, 55);
        cr_assert_eq(em_requires_grad_(x, true), EM_OK);
        em_tensor *in = b ? em_to_layout(x, EM_LAYOUT_NCHW16C) : em_tensor_retain(x);
        em_tensor *y, *idx;
        cr_assert_eq(em_max_pool2d(in, ks, ss, ps, NULL, false, &y, &idx), EM_OK, "%s",
                     em_last_error());
        if (b) cr_assert_eq(em_tensor_layout(y), EM_LAYOUT_NCHW16C);
        em_tensor *w = pool_input(2, 32, 5, 4, 56), *p = em_mul(y, w), *l = em_sum(p, 0, NULL, false);
        cr_assert_eq(em_backward(l), EM_OK, "%s", em_last_error());
        grads[b] = em_tensor_grad(x);
        cr_assert(grads[b]);
        xs[b] = x;
        keep[4 * b] = in, keep[4 * b + 1] = y, keep[4 * b + 2] = idx, keep[4 * b + 3] = w;
        RELEASE(p, l);
    }
    expect_same_bits(grads[0], grads[1], "x.grad");
    RELEASE(xs[0], xs[1]);
    for (int i = 0; i < 8; i++) em_tensor_release(keep[i]);
}

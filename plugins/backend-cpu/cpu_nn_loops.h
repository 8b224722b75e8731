/*
 * cpu_nn_loops.h — the plain-loop kernels of the neural-network ops, written once and
 * included by cpu_nn.c for each floating type: T is the element type, S(name) the
 * type-suffixed name, GEMM the BLAS routine (cblas_sgemm / cblas_dgemm). They are the f64
 * kernels (oneDNN has no f64), the f32 fallbacks oneDNN declines, and the reference the f32
 * oneDNN kernels are tested against. Sums accumulate in double.
 *
 * Every kernel sees contiguous NCHW operands (the contract in core/ops_nn.c) and splits its
 * work over planes, rows or channels with nn_parallel (no OpenMP region for small work).
 */

/* ---- convolution: im2col + GEMM -------------------------------------------------------------- */

/* col (C*kh*kw, OH*OW) from one image x (C, H, W), zeros where the window reads padding. */
static void S(im2col)(const nn_conv *g, const T *x, T *col) {
    int64_t P = g->OH * g->OW;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                T *row = col + ((c * g->kh + i) * g->kw + j) * P;
                for (int64_t oh = 0; oh < g->OH; oh++) {
                    int64_t ih = oh * g->sh - g->ph + i * g->dh;
                    T *dst = row + oh * g->OW;
                    if (ih < 0 || ih >= g->H) {
                        for (int64_t ow = 0; ow < g->OW; ow++) dst[ow] = 0;
                        continue;
                    }
                    const T *src = x + (c * g->H + ih) * g->W;
                    for (int64_t ow = 0; ow < g->OW; ow++) {
                        int64_t iw = ow * g->sw - g->pw + j * g->dw;
                        dst[ow] = iw >= 0 && iw < g->W ? src[iw] : 0;
                    }
                }
            }
}

/* x (C, H, W) += col scattered back (the adjoint of im2col). */
static void S(col2im)(const nn_conv *g, const T *col, T *x) {
    int64_t P = g->OH * g->OW;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                const T *row = col + ((c * g->kh + i) * g->kw + j) * P;
                for (int64_t oh = 0; oh < g->OH; oh++) {
                    int64_t ih = oh * g->sh - g->ph + i * g->dh;
                    if (ih < 0 || ih >= g->H) continue;
                    T *dst = x + (c * g->H + ih) * g->W;
                    for (int64_t ow = 0; ow < g->OW; ow++) {
                        int64_t iw = ow * g->sw - g->pw + j * g->dw;
                        if (iw >= 0 && iw < g->W) dst[iw] += row[oh * g->OW + ow];
                    }
                }
            }
}

static em_status S(conv2d_gemm)(const em_kernel_ctx *k) {
    nn_conv g = nn_conv_geom(&k->in[0], &k->in[1], &k->out[0], k->attrs);
    const T *x = k->in[0].data, *w = k->in[1].data, *b = k->in[2].data;
    T *y = k->out[0].data;
    int64_t P = g.OH * g.OW, Og = g.O / g.g, Kc = g.C / g.g * g.kh * g.kw;
    if (k->out[0].numel == 0) return EM_OK;
    /* The im2col buffer (Kc * groups, P): kernel workspace, handed back when the call ends. */
    T *col = Kc > 0 && P > 0 ? cpu_scratch(k, sizeof(T) * (size_t)(Kc * g.g * P)) : NULL;
    if (Kc > 0 && P > 0 && !col) return em_last_status();
    for (int64_t n = 0; n < g.N; n++) {
        T *yn = y + n * g.O * P;
        if (Kc == 0) {
            for (int64_t i = 0; i < g.O * P; i++) yn[i] = 0;
        } else {
            S(im2col)(&g, x + n * g.C * g.H * g.W, col);
            for (int64_t q = 0; q < g.g; q++)
                GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Og, (int)P, (int)Kc, 1,
                     w + q * Og * Kc, (int)Kc, col + q * Kc * P, (int)P, 0, yn + q * Og * P,
                     (int)P);
        }
        if (k->in[2].numel)
            for (int64_t o = 0; o < g.O; o++)
                for (int64_t p = 0; p < P; p++) yn[o * P + p] += b[o];
    }
    return EM_OK; /* col: workspace */
}

static em_status S(conv2d_bwd_data_gemm)(const em_kernel_ctx *k) {
    nn_conv g = nn_conv_geom(&k->out[0], &k->in[1], &k->in[0], k->attrs);
    const T *gy = k->in[0].data, *w = k->in[1].data;
    T *gx = k->out[0].data;
    int64_t P = g.OH * g.OW, Og = g.O / g.g, Kc = g.C / g.g * g.kh * g.kw;
    for (int64_t i = 0; i < k->out[0].numel; i++) gx[i] = 0;
    if (k->out[0].numel == 0 || P == 0 || Og == 0) return EM_OK;
    T *col = cpu_scratch(k, sizeof(T) * (size_t)(Kc * g.g * P)); /* (Kc * groups, P) */
    if (!col) return em_last_status();
    for (int64_t n = 0; n < g.N; n++) {
        for (int64_t q = 0; q < g.g; q++)
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)Kc, (int)P, (int)Og, 1,
                 w + q * Og * Kc, (int)Kc, gy + (n * g.O + q * Og) * P, (int)P, 0,
                 col + q * Kc * P, (int)P);
        S(col2im)(&g, col, gx + n * g.C * g.H * g.W);
    }
    return EM_OK; /* col: workspace */
}

static em_status S(conv2d_bwd_weight_gemm)(const em_kernel_ctx *k) {
    nn_conv g = nn_conv_geom(&k->in[0], &k->out[0], &k->in[1], k->attrs);
    const T *x = k->in[0].data, *gy = k->in[1].data;
    T *gw = k->out[0].data, *gb = k->out[1].data;
    int64_t P = g.OH * g.OW, Og = g.O / g.g, Kc = g.C / g.g * g.kh * g.kw;
    for (int64_t i = 0; i < k->out[0].numel; i++) gw[i] = 0;
    for (int64_t o = 0; o < g.O; o++) {
        double s = 0;
        for (int64_t n = 0; n < g.N; n++)
            for (int64_t p = 0; p < P; p++) s += gy[(n * g.O + o) * P + p];
        gb[o] = (T)s;
    }
    if (k->out[0].numel == 0 || P == 0 || g.N == 0) return EM_OK;
    T *col = cpu_scratch(k, sizeof(T) * (size_t)(Kc * g.g * P)); /* (Kc * groups, P) */
    if (!col) return em_last_status();
    for (int64_t n = 0; n < g.N; n++) {
        S(im2col)(&g, x + n * g.C * g.H * g.W, col);
        for (int64_t q = 0; q < g.g; q++)
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Og, (int)Kc, (int)P, 1,
                 gy + (n * g.O + q * Og) * P, (int)P, col + q * Kc * P, (int)P, 1,
                 gw + q * Og * Kc, (int)Kc);
    }
    return EM_OK; /* col: workspace */
}

/* ---- pooling (parallel over the N*C planes) ----------------------------------------------------- */

/* One plane's rows [oh0, oh1) of max pooling (x (H, W) -> y, idx (OH, OW)). NaN wins, the
 * later of two NaNs too, as in PyTorch; the updates are selects, not branches (random data
 * would mispredict half of them). relu (max_pool2d_relu): each value is relu's (x <= 0 ? +0 :
 * x, NaN kept) before it is compared; the pooling loops below are written once and inlined
 * with relu constant into each instance. */
static inline __attribute__((always_inline)) void S(max_pool_rows_at)(const nn_pool *p,
                                                                    const T *x, T *y,
                                                                    int64_t *idx, int64_t oh0,
                                                                    int64_t oh1, bool relu) {
    for (int64_t oh = oh0; oh < oh1; oh++) {
        int64_t hs = oh * p->sh - p->ph, he = EM_CPU_MIN(hs + (p->kh - 1) * p->dh + 1, p->H);
        if (hs < 0) hs += (-hs + p->dh - 1) / p->dh * p->dh;
        for (int64_t ow = 0; ow < p->OW; ow++) {
            int64_t ws = ow * p->sw - p->pw, we = EM_CPU_MIN(ws + (p->kw - 1) * p->dw + 1, p->W);
            if (ws < 0) ws += (-ws + p->dw - 1) / p->dw * p->dw;
            int64_t best = hs * p->W + ws;
            T m = -INFINITY;
            for (int64_t h = hs; h < he; h += p->dh)
                for (int64_t w = ws; w < we; w += p->dw) {
                    T v = x[h * p->W + w];
                    v = relu && v <= 0 ? 0 : v;
                    bool take = (v > m) | (v != v);
                    m = take ? v : m;
                    best = take ? h * p->W + w : best;
                }
            y[oh * p->OW + ow] = m;
            idx[oh * p->OW + ow] = best;
        }
    }
}

static void S(max_pool_rows)(const nn_pool *p, const T *x, T *y, int64_t *idx, int64_t oh0,
                             int64_t oh1, bool relu) {
    if (relu) S(max_pool_rows_at)(p, x, y, idx, oh0, oh1, true);
    else S(max_pool_rows_at)(p, x, y, idx, oh0, oh1, false);
}

static void S(max_pool_planes)(void *ctx, int64_t lo, int64_t hi) {
    const nn_pool_call *c = ctx;
    const em_kernel_ctx *k = c->k;
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    for (int64_t pl = lo; pl < hi; pl++)
        S(max_pool_rows)(&p, (const T *)k->in[0].data + pl * p.H * p.W,
                         (T *)k->out[0].data + pl * p.OH * p.OW,
                         (int64_t *)k->out[1].data + pl * p.OH * p.OW, 0, p.OH, c->relu);
}

static em_status S(max_pool2d)(const em_kernel_ctx *k, bool relu) {
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    nn_pool_call c = {.k = k, .relu = relu};
    nn_parallel(k, p.N * p.C, p.OH * p.OW * p.kh * p.kw, S(max_pool_planes), &c);
    return EM_OK;
}

/* Channels-last max pooling (x, y, idx dense N, H, W, C): per output position the window's
 * C-vectors in the plane loop's order (h, then w), so each channel gets the same maximum and
 * index (the plane index h*W + w) as S(max_pool_rows); parallel over the N*OH output rows. */
static inline __attribute__((always_inline)) void S(max_pool_nhwc_rows_at)(
    const em_kernel_ctx *k, int64_t lo, int64_t hi, bool relu) {
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    const int64_t C = p.C;
    const T *x = (const T *)k->in[0].data;
    /* The 2x2 / stride 2 / dilation 1 windows of f32 in AVX2 (the same comparisons). */
    const bool fast = p.kh == 2 && p.kw == 2 && p.sh == 2 && p.sw == 2 && p.dh == 1 && p.dw == 1 &&
                      cpu_nn_has_avx2();
    for (int64_t r = lo; r < hi; r++) {
        int64_t n = r / p.OH, oh = r % p.OH;
        int64_t hs = oh * p.sh - p.ph, he = EM_CPU_MIN(hs + (p.kh - 1) * p.dh + 1, p.H);
        if (hs < 0) hs += (-hs + p.dh - 1) / p.dh * p.dh;
        for (int64_t ow = 0; ow < p.OW; ow++) {
            int64_t ws = ow * p.sw - p.pw, we = EM_CPU_MIN(ws + (p.kw - 1) * p.dw + 1, p.W);
            if (ws < 0) ws += (-ws + p.dw - 1) / p.dw * p.dw;
            int64_t o = (r * p.OW + ow) * C;
            T *y = (T *)k->out[0].data + o;
            int64_t *idx = (int64_t *)k->out[1].data + o;
            if (sizeof(T) == 4 && fast && we - ws == 2 && he - hs == 2) {
                cpu_nn_max_pool2x2_nhwc_f32_avx2((const float *)(x + ((n * p.H + hs) * p.W + ws) * C),
                                                 p.W * C, C, hs * p.W + ws, p.W, (float *)y, idx,
                                                 relu);
                continue;
            }
            for (int64_t c = 0; c < C; c++) y[c] = -INFINITY, idx[c] = hs * p.W + ws;
            for (int64_t h = hs; h < he; h += p.dh)
                for (int64_t w = ws; w < we; w += p.dw) {
                    const T *xv = x + ((n * p.H + h) * p.W + w) * C;
                    const int64_t at = h * p.W + w;
                    for (int64_t c = 0; c < C; c++) {
                        T v = xv[c], m = y[c];
                        v = relu && v <= 0 ? 0 : v;
                        bool take = (v > m) | (v != v);
                        y[c] = take ? v : m;
                        idx[c] = take ? at : idx[c];
                    }
                }
        }
    }
}

static void S(max_pool_nhwc_rows)(void *ctx, int64_t lo, int64_t hi) {
    const nn_pool_call *c = ctx;
    if (c->relu) S(max_pool_nhwc_rows_at)(c->k, lo, hi, true);
    else S(max_pool_nhwc_rows_at)(c->k, lo, hi, false);
}

static em_status S(max_pool2d_nhwc)(const em_kernel_ctx *k, bool relu) {
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    nn_pool_call c = {.k = k, .relu = relu};
    nn_parallel(k, p.N * p.OH, p.OW * p.C * p.kh * p.kw, S(max_pool_nhwc_rows), &c);
    return EM_OK;
}

/* The input plane size (H*W) is the bound of every index; a bad one fails the call. */
typedef struct S(scatter_ctx) {
    const em_kernel_ctx *k;
    int64_t HW, P;
    bool gy_rm; /* channels-last backward: gy row-major (NCHW) beside channels-last idx, gx */
    atomic_int bad;
} S(scatter_ctx);

static void S(max_pool_bwd_planes)(void *ctx, int64_t lo, int64_t hi) {
    S(scatter_ctx) *c = ctx;
    for (int64_t pl = lo; pl < hi; pl++) {
        const T *gy = (const T *)c->k->in[0].data + pl * c->P;
        const int64_t *idx = (const int64_t *)c->k->in[1].data + pl * c->P;
        T *gx = (T *)c->k->out[0].data + pl * c->HW;
        for (int64_t i = 0; i < c->HW; i++) gx[i] = 0;
        for (int64_t i = 0; i < c->P; i++) {
            if (idx[i] < 0 || idx[i] >= c->HW) {
                atomic_store(&c->bad, 1);
                continue;
            }
            gx[idx[i]] += gy[i];
        }
    }
}

/* One channels-last image of the backward of a 2x2 / stride 2 tiling (gx is 2OH x 2OW): when
 * every index lies in its own output's 2x2 tile (what that pooling's forward gives), each gx
 * element receives at most one gy, so it is written directly — 0 + gy at the winner (the
 * scatter's sum: -0 becomes +0 as there), 0 elsewhere — in one vectorised pass over the four
 * C-vectors of each tile, with no zeroing pass and no scatter. false (gx partly written) when
 * an index lies elsewhere: the caller then runs the scatter, which rewrites the whole image.
 * gy's element (c, i) (i = oh OW + ow) is at c gc + i gi: channels-last (gc 1, gi C) or the
 * row-major grad a flatten's backward gives (gc OH OW, gi 1), read in place. */
static inline __attribute__((always_inline)) bool
S(pool2x2_bwd_image)(const T *restrict gy, int64_t gc, int64_t gi, const int64_t *restrict idx,
                     int64_t OH, int64_t OW, int64_t C, T *restrict gx) {
    const int64_t W = 2 * OW;
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            const int64_t i = oh * OW + ow, a = 2 * oh * W + 2 * ow;
            const int64_t *id = idx + i * C;
            const T *g = gy + i * gi;
            T *x00 = gx + a * C, *x01 = x00 + C, *x10 = x00 + W * C, *x11 = x10 + C;
            int64_t bad = 0;
            _Pragma("omp simd reduction(|:bad)") for (int64_t ch = 0; ch < C; ch++) {
                const int64_t at = id[ch];
                const T v = (T)0 + g[ch * gc], z = 0;
                x00[ch] = at == a ? v : z;
                x01[ch] = at == a + 1 ? v : z;
                x10[ch] = at == a + W ? v : z;
                x11[ch] = at == a + W + 1 ? v : z;
                bad |= (at != a) & (at != a + 1) & (at != a + W) & (at != a + W + 1);
            }
            if (bad) return false;
        }
    return true;
}
SIMD_CLONES static bool S(pool2x2_bwd_nhwc_image)(const T *restrict gy,
                                                  const int64_t *restrict idx, int64_t OH,
                                                  int64_t OW, int64_t C, T *restrict gx) {
    return S(pool2x2_bwd_image)(gy, 1, C, idx, OH, OW, C, gx);
}
SIMD_CLONES static bool S(pool2x2_bwd_nchw_gy_image)(const T *restrict gy,
                                                     const int64_t *restrict idx, int64_t OH,
                                                     int64_t OW, int64_t C, T *restrict gx) {
    return S(pool2x2_bwd_image)(gy, OH * OW, 1, idx, OH, OW, C, gx);
}

/* Channels-last backward (idx, gx dense N, H, W, C; gy so too, or row-major: c->gy_rm),
 * parallel over the batch: each gx element receives its gy values in the plane loop's order
 * (output positions in order), so the sums are the same. */
static void S(max_pool_bwd_nhwc)(void *ctx, int64_t lo, int64_t hi) {
    S(scatter_ctx) *c = ctx;
    const int64_t C = c->k->out[0].shape[1], OH = c->k->in[0].shape[2],
                  OW = c->k->in[0].shape[3];
    const bool tiles = c->k->out[0].shape[2] == 2 * OH && c->k->out[0].shape[3] == 2 * OW;
    const int64_t gc = c->gy_rm ? c->P : 1, gi = c->gy_rm ? 1 : C;
    for (int64_t n = lo; n < hi; n++) {
        const T *gy = (const T *)c->k->in[0].data + n * c->P * C;
        const int64_t *idx = (const int64_t *)c->k->in[1].data + n * c->P * C;
        T *gx = (T *)c->k->out[0].data + n * c->HW * C;
        if (tiles && (c->gy_rm ? S(pool2x2_bwd_nchw_gy_image)(gy, idx, OH, OW, C, gx)
                               : S(pool2x2_bwd_nhwc_image)(gy, idx, OH, OW, C, gx)))
            continue;
        for (int64_t i = 0; i < c->HW * C; i++) gx[i] = 0;
        for (int64_t i = 0; i < c->P; i++)
            for (int64_t ch = 0; ch < C; ch++) {
                int64_t at = idx[i * C + ch];
                if (at < 0 || at >= c->HW) {
                    atomic_store(&c->bad, 1);
                    continue;
                }
                gx[at * C + ch] += gy[i * gi + ch * gc];
            }
    }
}

static em_status S(max_pool2d_bwd)(const em_kernel_ctx *k) {
    const em_ktensor *gx = &k->out[0], *gy = &k->in[0];
    S(scatter_ctx) c = {.k = k, .HW = gx->shape[2] * gx->shape[3],
                        .P = gy->shape[2] * gy->shape[3]};
    atomic_init(&c.bad, 0);
    if (gx->contiguous && gy->contiguous && k->in[1].contiguous) {
        nn_parallel(k, gx->shape[0] * gx->shape[1], c.HW + c.P, S(max_pool_bwd_planes), &c);
    } else { /* channels-last idx and gx (the kernel's supports() admitted nothing else) */
        c.gy_rm = !nn_dense_nhwc(gy);
        nn_parallel(k, gx->shape[0], (c.HW + c.P) * gx->shape[1], S(max_pool_bwd_nhwc), &c);
    }
    if (atomic_load(&c.bad))
        return em_set_error(EM_ERR_RANGE, "max_pool2d_backward: an index is outside the input "
                            "plane of %lld x %lld", (long long)gx->shape[2],
                            (long long)gx->shape[3]);
    return EM_OK;
}

/* avg_pool2d's window (oh, ow): its clipped bounds and PyTorch's divisor; false when empty. */
static inline bool S(avg_window)(const nn_pool *p, int64_t oh, int64_t ow, int64_t *hs,
                                 int64_t *he, int64_t *ws, int64_t *we, double *div) {
    *hs = oh * p->sh - p->ph;
    *ws = ow * p->sw - p->pw;
    *he = EM_CPU_MIN(*hs + p->kh, p->H + p->ph);
    *we = EM_CPU_MIN(*ws + p->kw, p->W + p->pw);
    int64_t pool = (*he - *hs) * (*we - *ws);
    if (*hs < 0) *hs = 0;
    if (*ws < 0) *ws = 0;
    if (*he > p->H) *he = p->H;
    if (*we > p->W) *we = p->W;
    if (*hs >= *he || *ws >= *we) return false;
    *div = (double)(p->cip ? pool : (*he - *hs) * (*we - *ws));
    return true;
}

static void S(avg_pool_planes)(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, false);
    for (int64_t pl = lo; pl < hi; pl++) {
        const T *x = (const T *)k->in[0].data + pl * p.H * p.W;
        T *y = (T *)k->out[0].data + pl * p.OH * p.OW;
        for (int64_t oh = 0; oh < p.OH; oh++)
            for (int64_t ow = 0; ow < p.OW; ow++) {
                int64_t hs, he, ws, we;
                double div, s = 0;
                if (!S(avg_window)(&p, oh, ow, &hs, &he, &ws, &we, &div)) {
                    y[oh * p.OW + ow] = 0;
                    continue;
                }
                for (int64_t h = hs; h < he; h++)
                    for (int64_t w = ws; w < we; w++) s += x[h * p.W + w];
                y[oh * p.OW + ow] = (T)(s / div);
            }
    }
}

static em_status S(avg_pool2d)(const em_kernel_ctx *k) {
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, false);
    nn_parallel(k, p.N * p.C, p.OH * p.OW * p.kh * p.kw, S(avg_pool_planes), (void *)k);
    return EM_OK;
}

static void S(avg_pool_bwd_planes)(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    nn_pool p = nn_pool_geom(&k->out[0], &k->in[0], k->attrs, false);
    for (int64_t pl = lo; pl < hi; pl++) {
        const T *gy = (const T *)k->in[0].data + pl * p.OH * p.OW;
        T *gx = (T *)k->out[0].data + pl * p.H * p.W;
        for (int64_t i = 0; i < p.H * p.W; i++) gx[i] = 0;
        for (int64_t oh = 0; oh < p.OH; oh++)
            for (int64_t ow = 0; ow < p.OW; ow++) {
                int64_t hs, he, ws, we;
                double div;
                if (!S(avg_window)(&p, oh, ow, &hs, &he, &ws, &we, &div)) continue;
                T v = (T)(gy[oh * p.OW + ow] / div);
                for (int64_t h = hs; h < he; h++)
                    for (int64_t w = ws; w < we; w++) gx[h * p.W + w] += v;
            }
    }
}

static em_status S(avg_pool2d_bwd)(const em_kernel_ctx *k) {
    nn_pool p = nn_pool_geom(&k->out[0], &k->in[0], k->attrs, false);
    nn_parallel(k, p.N * p.C, p.OH * p.OW * p.kh * p.kw + p.H * p.W, S(avg_pool_bwd_planes),
                (void *)k);
    return EM_OK;
}

/* Adaptive pooling: x (planes, H, W) <-> y (planes, OH, OW); forward when fwd. */
static void S(adaptive_planes)(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    bool fwd = strcmp(em_op_name(k->op), "adaptive_avg_pool2d") == 0;
    const em_ktensor *xt = fwd ? &k->in[0] : &k->out[0], *yt = fwd ? &k->out[0] : &k->in[0];
    int64_t H = xt->shape[2], W = xt->shape[3], OH = yt->shape[2], OW = yt->shape[3];
    for (int64_t pl = lo; pl < hi; pl++) {
        T *x = (T *)xt->data + pl * H * W, *y = (T *)yt->data + pl * OH * OW;
        if (!fwd)
            for (int64_t i = 0; i < H * W; i++) x[i] = 0;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t hs = oh * H / OH, he = ((oh + 1) * H + OH - 1) / OH;
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t ws = ow * W / OW, we = ((ow + 1) * W + OW - 1) / OW;
                double div = (double)((he - hs) * (we - ws));
                if (fwd) {
                    double s = 0;
                    for (int64_t h = hs; h < he; h++)
                        for (int64_t w = ws; w < we; w++) s += x[h * W + w];
                    y[oh * OW + ow] = (T)(s / div);
                } else {
                    T v = (T)(y[oh * OW + ow] / div);
                    for (int64_t h = hs; h < he; h++)
                        for (int64_t w = ws; w < we; w++) x[h * W + w] += v;
                }
            }
        }
    }
}

static em_status S(adaptive_avg_pool2d)(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0], *y = &k->out[0];
    int64_t per = EM_CPU_MAX(x->shape[2] * x->shape[3], y->shape[2] * y->shape[3]);
    nn_parallel(k, x->shape[0] * x->shape[1], per, S(adaptive_planes), (void *)k);
    return EM_OK;
}

/* ---- batch_norm (parallel over channels) -------------------------------------------------------- */

static void S(bn_channels)(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    const em_ktensor *xt = &k->in[0];
    int64_t N = xt->shape[0], C = xt->shape[1], HW = xt->numel / (N * C > 0 ? N * C : 1);
    const T *x = xt->data, *w = k->in[1].data, *b = k->in[2].data;
    T *rm = k->in[3].data, *rv = k->in[4].data;
    T *y = k->out[0].data, *sm = k->out[1].data, *si = k->out[2].data;
    bool training = k->attrs[0].v.b, has_w = k->in[1].numel > 0, has_b = k->in[2].numel > 0;
    double mom = k->attrs[1].v.f, eps = k->attrs[2].v.f, M = (double)(N * HW);
    for (int64_t c = lo; c < hi; c++) {
        double mean, invstd;
        if (training) {
            double s = 0, q = 0;
            for (int64_t n = 0; n < N; n++) {
                const T *xp = x + (n * C + c) * HW;
                for (int64_t i = 0; i < HW; i++) s += xp[i];
            }
            mean = M > 0 ? s / M : 0;
            for (int64_t n = 0; n < N; n++) {
                const T *xp = x + (n * C + c) * HW;
                for (int64_t i = 0; i < HW; i++) q += (xp[i] - mean) * (xp[i] - mean);
            }
            double var = M > 0 ? q / M : 0;
            invstd = 1.0 / sqrt(var + eps);
            if (k->in[3].numel && M > 0) rm[c] = (T)((1 - mom) * rm[c] + mom * mean);
            if (k->in[4].numel && M > 1) rv[c] = (T)((1 - mom) * rv[c] + mom * q / (M - 1));
        } else {
            mean = rm[c];
            invstd = 1.0 / sqrt((double)rv[c] + eps);
        }
        sm[c] = (T)mean;
        si[c] = (T)invstd;
        /* y = x * a + s with a = w * invstd, s = b - mean * a. */
        T a = (T)((has_w ? w[c] : 1) * invstd), s = (T)((has_b ? b[c] : 0) - mean * (double)a);
        for (int64_t n = 0; n < N; n++) {
            const T *xp = x + (n * C + c) * HW;
            T *yp = y + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) yp[i] = xp[i] * a + s;
        }
    }
}

static em_status S(batch_norm)(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0];
    nn_parallel(k, x->shape[1], x->numel / (x->shape[1] ? x->shape[1] : 1) * 3, S(bn_channels),
                (void *)k);
    return EM_OK;
}

static void S(bn_bwd_channels)(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    const em_ktensor *xt = &k->in[1];
    int64_t N = xt->shape[0], C = xt->shape[1], HW = xt->numel / (N * C > 0 ? N * C : 1);
    const T *gy = k->in[0].data, *x = xt->data, *w = k->in[2].data, *sm = k->in[3].data,
            *si = k->in[4].data;
    T *gx = k->out[0].data, *gw = k->out[1].data, *gb = k->out[2].data;
    bool training = k->attrs[0].v.b;
    double M = (double)(N * HW);
    for (int64_t c = lo; c < hi; c++) {
        double mean = sm[c], invstd = si[c], sdy = 0, sdyx = 0;
        for (int64_t n = 0; n < N; n++) {
            const T *xp = x + (n * C + c) * HW, *gp = gy + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) {
                sdy += gp[i];
                sdyx += gp[i] * (xp[i] - mean);
            }
        }
        gw[c] = (T)(sdyx * invstd);
        gb[c] = (T)sdy;
        double wc = k->in[2].numel ? w[c] : 1;
        /* gx = a * gy + b * x + d (training) or a * gy (eval). */
        double a = wc * invstd, bx = 0, d = 0;
        if (training && M > 0) {
            bx = -a * invstd * invstd * sdyx / M;
            d = -a * sdy / M - bx * mean;
        }
        for (int64_t n = 0; n < N; n++) {
            const T *xp = x + (n * C + c) * HW, *gp = gy + (n * C + c) * HW;
            T *op = gx + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) op[i] = (T)(a * gp[i] + bx * xp[i] + d);
        }
    }
}

static em_status S(batch_norm_bwd)(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[1];
    nn_parallel(k, x->shape[1], x->numel / (x->shape[1] ? x->shape[1] : 1) * 3, S(bn_bwd_channels),
                (void *)k);
    return EM_OK;
}

/* ---- layer_norm (parallel over rows) ------------------------------------------------------------ */

static void S(ln_rows)(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    int64_t D = nn_ln_d(&k->in[0], (int)k->attrs[0].v.i);
    const T *w = k->in[1].data, *b = k->in[2].data;
    bool has_w = k->in[1].numel > 0, has_b = k->in[2].numel > 0;
    double eps = k->attrs[1].v.f;
    for (int64_t r = lo; r < hi; r++) {
        const T *x = (const T *)k->in[0].data + r * D;
        T *y = (T *)k->out[0].data + r * D;
        double s = 0, q = 0;
        for (int64_t i = 0; i < D; i++) s += x[i];
        double mean = D ? s / (double)D : 0;
        for (int64_t i = 0; i < D; i++) q += (x[i] - mean) * (x[i] - mean);
        double rstd = 1.0 / sqrt((D ? q / (double)D : 0) + eps);
        ((T *)k->out[1].data)[r] = (T)mean;
        ((T *)k->out[2].data)[r] = (T)rstd;
        T tm = (T)mean, tr = (T)rstd;
        if (has_w && has_b) {
            for (int64_t i = 0; i < D; i++) y[i] = (x[i] - tm) * tr * w[i] + b[i];
        } else {
            for (int64_t i = 0; i < D; i++)
                y[i] = (x[i] - tm) * tr * (has_w ? w[i] : 1) + (has_b ? b[i] : 0);
        }
    }
}

static em_status S(layer_norm)(const em_kernel_ctx *k) {
    int64_t D = nn_ln_d(&k->in[0], (int)k->attrs[0].v.i);
    nn_parallel(k, D ? k->in[0].numel / D : 0, D * 3, S(ln_rows), (void *)k);
    return EM_OK;
}

static void S(ln_bwd_rows)(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    int64_t D = nn_ln_d(&k->in[1], (int)k->attrs[0].v.i);
    const T *w = k->in[4].data;
    bool has_w = k->in[4].numel > 0;
    for (int64_t r = lo; r < hi; r++) {
        const T *gy = (const T *)k->in[0].data + r * D, *x = (const T *)k->in[1].data + r * D;
        T *gx = (T *)k->out[0].data + r * D;
        double mean = ((const T *)k->in[2].data)[r], rstd = ((const T *)k->in[3].data)[r];
        double s1 = 0, s2 = 0; /* sums of gy*w and gy*w*xhat */
        for (int64_t i = 0; i < D; i++) {
            double g = gy[i] * (has_w ? (double)w[i] : 1.0);
            s1 += g;
            s2 += g * (x[i] - mean) * rstd;
        }
        s1 /= (double)D;
        s2 /= (double)D;
        for (int64_t i = 0; i < D; i++) {
            double g = gy[i] * (has_w ? (double)w[i] : 1.0), xh = (x[i] - mean) * rstd;
            gx[i] = (T)(rstd * (g - s1 - xh * s2));
        }
    }
}

static em_status S(layer_norm_bwd)(const em_kernel_ctx *k) {
    int64_t D = nn_ln_d(&k->in[1], (int)k->attrs[0].v.i), rows = D ? k->in[1].numel / D : 0;
    nn_parallel(k, rows, D * 4, S(ln_bwd_rows), (void *)k);
    /* grad_weight and grad_bias: column sums over the rows, in double. */
    const T *gy = k->in[0].data, *x = k->in[1].data, *mean = k->in[2].data, *rstd = k->in[3].data;
    T *gw = k->out[1].data, *gb = k->out[2].data;
    double *acc = D ? cpu_scratch(k, sizeof(double) * (size_t)(2 * D)) : NULL; /* (2, D) */
    if (D && !acc) return em_last_status();
    for (int64_t i = 0; i < 2 * D; i++) acc[i] = 0;
    for (int64_t r = 0; r < rows; r++) {
        double m = mean[r], s = rstd[r];
        const T *g = gy + r * D, *xr = x + r * D;
        for (int64_t i = 0; i < D; i++) {
            acc[i] += g[i] * (xr[i] - m) * s;
            acc[D + i] += g[i];
        }
    }
    for (int64_t i = 0; i < D; i++) {
        gw[i] = (T)acc[i];
        gb[i] = (T)acc[D + i];
    }
    return EM_OK; /* acc: workspace */
}

/* ---- softmax (rows of `outer x inner` lanes of length D along dim) ------------------------------ */

static void S(softmax_rows)(void *ctx, int64_t lo, int64_t hi) {
    const nn_sm *c = ctx;
    for (int64_t r = lo; r < hi; r++) {
        int64_t o = r / c->inner, in = r % c->inner, base = o * c->D * c->inner + in, st = c->inner;
        const T *x = (const T *)c->k->in[0].data + base;
        const T *y2 = c->n_in == 2 ? (const T *)c->k->in[1].data + base : NULL;
        T *y = (T *)c->k->out[0].data + base;
        if (c->kind == NN_SOFTMAX || c->kind == NN_LOG_SOFTMAX) {
            T m = -INFINITY;
            for (int64_t i = 0; i < c->D; i++)
                if (x[i * st] > m || isnan(x[i * st])) m = x[i * st];
            double s = 0;
            for (int64_t i = 0; i < c->D; i++) s += exp((double)(x[i * st] - m));
            if (c->kind == NN_SOFTMAX) {
                double inv = 1.0 / s;
                for (int64_t i = 0; i < c->D; i++) y[i * st] = (T)(exp((double)(x[i * st] - m)) * inv);
            } else {
                T ls = (T)log(s);
                for (int64_t i = 0; i < c->D; i++) y[i * st] = x[i * st] - m - ls;
            }
        } else if (c->kind == NN_SOFTMAX_BWD) { /* x = grad, y2 = output */
            double s = 0;
            for (int64_t i = 0; i < c->D; i++) s += (double)x[i * st] * y2[i * st];
            for (int64_t i = 0; i < c->D; i++) y[i * st] = (T)(y2[i * st] * (x[i * st] - s));
        } else {
            double s = 0;
            for (int64_t i = 0; i < c->D; i++) s += x[i * st];
            for (int64_t i = 0; i < c->D; i++) y[i * st] = (T)(x[i * st] - exp((double)y2[i * st]) * s);
        }
    }
}

static em_status S(softmax_any)(const em_kernel_ctx *k) {
    nn_sm c = nn_sm_geom(k);
    nn_parallel(k, c.outer * c.inner, c.D * 3, S(softmax_rows), &c);
    return EM_OK;
}

/*
 * cpu_rnn_loops.h — the LSTM and GRU kernels of cpu_rnn.c for one dtype, included once per
 * dtype with T (the element type), S(name) (the name with its dtype suffix), GEMM (cblas_sgemm
 * or cblas_dgemm), EXP and TANH defined. Contracts in core/ops_rnn.c.
 */

static inline T S(sig)(T v) { return (T)1 / ((T)1 + EXP(-v)); }

/* One batch row of one step (the cells; SIMD_CELLS: the vector f32 ones of cpu_rnn_simd.c
 * when simd). LSTM forward: the pre-activations i, f, g, o are xr + hr + bias (4H each: the
 * input projection x W_ih^T, the hidden product h W_hh^T, the bias or NULL); gr (6H) gets
 * [i, f, g, o (activated), c_prev, h_prev]; c, h (H) the state, updated; y (H) the output. */
static inline void S(lstm_cell)(T *gr, const T *xr, const T *hr, const T *bias, T *c, T *h,
                                T *y, int64_t H, bool simd) {
#if SIMD_CELLS
    if (simd) {
        cpu_rnn_lstm_cell_f32(gr, xr, hr, bias, c, h, y, H);
        return;
    }
#else
    (void)simd;
#endif
#define PRE(q) (xr[(q) * H + j] + hr[(q) * H + j] + (bias ? bias[(q) * H + j] : 0))
    for (int64_t j = 0; j < H; j++) {
        T ig = S(sig)(PRE(0)), fg = S(sig)(PRE(1)), gg = TANH(PRE(2)), og = S(sig)(PRE(3));
        T cp = c[j], hp = h[j], cnew = fg * cp + ig * gg, hnew = og * TANH(cnew);
        gr[j] = ig, gr[H + j] = fg, gr[2 * H + j] = gg, gr[3 * H + j] = og;
        gr[4 * H + j] = cp, gr[5 * H + j] = hp;
        c[j] = cnew, h[j] = hnew, y[j] = hnew;
    }
#undef PRE
}

/* LSTM backward: gr (6H) the step's workspace row, gy (H) the output gradient or NULL; dh, dc
 * (H) the state gradients (dh left 0 for the dG W_hh GEMM to fill), d (4H) the
 * pre-activation gradients. */
static inline void S(lstm_cell_bwd)(const T *gr, const T *gy, T *dh, T *dc, T *d, int64_t H,
                                    bool simd) {
#if SIMD_CELLS
    if (simd) {
        cpu_rnn_lstm_cell_bwd_f32(gr, gy, dh, dc, d, H);
        return;
    }
#else
    (void)simd;
#endif
    for (int64_t j = 0; j < H; j++) {
        T ig = gr[j], fg = gr[H + j], gg = gr[2 * H + j], og = gr[3 * H + j], cp = gr[4 * H + j];
        T tc = TANH(fg * cp + ig * gg);
        T dht = dh[j] + (gy ? gy[j] : 0);
        T dct = dc[j] + dht * og * (1 - tc * tc);
        d[j] = dct * gg * ig * (1 - ig);
        d[H + j] = dct * cp * fg * (1 - fg);
        d[2 * H + j] = dct * ig * (1 - gg * gg);
        d[3 * H + j] = dht * tc * og * (1 - og);
        dc[j] = dct * fg;
        dh[j] = 0; /* the GEMM adds dG W_hh (untaken rows: dG is 0) */
    }
}

/* GRU forward: gr (5H) holds the input-side pre-activations r, z, n and gets
 * [r, z, n, W_hn h_prev + b_hn, h_prev]; hr (3H) the hidden products; h (H) the state; y (H). */
static inline void S(gru_cell)(T *gr, const T *hr, T *h, T *y, int64_t H, bool simd) {
#if SIMD_CELLS
    if (simd) {
        cpu_rnn_gru_cell_f32(gr, hr, h, y, H);
        return;
    }
#else
    (void)simd;
#endif
    for (int64_t j = 0; j < H; j++) {
        T r = S(sig)(gr[j] + hr[j]), z = S(sig)(gr[H + j] + hr[H + j]);
        T nl = hr[2 * H + j], n = TANH(gr[2 * H + j] + r * nl), hp = h[j];
        T hnew = (1 - z) * n + z * hp;
        gr[j] = r, gr[H + j] = z, gr[2 * H + j] = n, gr[3 * H + j] = nl;
        gr[4 * H + j] = hp;
        h[j] = hnew, y[j] = hnew;
    }
}

/* Each (b, j) of a step's elementwise part runs on one thread; the rows of a step are few
 * (the batch), so the split is over batch rows, on nt threads when the step is big. */
#define RNN_ROWS(nt, N, ...)                                                                    \
    do {                                                                                        \
        if ((nt) > 1) {                                                                         \
            _Pragma("omp parallel for num_threads(nt) schedule(static)")                        \
            for (int64_t b = 0; b < (N); b++) __VA_ARGS__                                       \
        } else {                                                                                \
            for (int64_t b = 0; b < (N); b++) __VA_ARGS__                                       \
        }                                                                                       \
    } while (0)

/* The GRU's: x (M, K) times the input columns of w ((G H, K + H), transposed) into the
 * first G H columns of c (M, ldc) rows, plus bias (G H) or not: one GEMM for every step at
 * once, cpu_gemm's (oneDNN on the kernel's threads, bias as its bias argument; OpenBLAS for
 * f64). */
static em_status S(in_proj)(const em_kernel_ctx *k, const T *x, const T *w, const T *bias,
                            int64_t M, int64_t K, int64_t GH, int64_t H, T *c, int64_t ldc) {
    if (K == 0) { /* no input features: the bias (or zeros) alone */
        for (int64_t m = 0; m < M; m++) {
            T *row = c + m * ldc;
            if (bias) memcpy(row, bias, sizeof(T) * (size_t)GH);
            else memset(row, 0, sizeof(T) * (size_t)GH);
        }
        return EM_OK;
    }
    em_dtype dt = k->out[0].dtype;
    em_ktensor a = rnn_kt2((void *)x, dt, M, K, K, 1), b = rnn_kt2((void *)w, dt, K, GH, 1, K + H),
               y = rnn_kt2(c, dt, M, GH, ldc, 1);
    if (!bias) return cpu_gemm(k, &a, &b, &y, 1.0, 0.0);
    em_ktensor bt = rnn_kt2((void *)bias, dt, M, GH, 0, 1);
    return cpu_gemm_addmm(k, &bt, &a, &b, &y, 1.0, 1.0);
}

#if SIMD_CELLS
/* ---- the parallel time loop (f32, AVX-512: cpu_rnn_panel_width) ----------------------------
 *
 * One parallel region around all the steps instead of a fork-join of the worker for each
 * step's product and cells (about 256 futex wake-ups a train_lstm_h256 step). Each thread
 * owns a fixed share of the hidden units, in whole chunks of 16 (rnn_share): forward, the
 * rows of W_hh for its units' i, f, g, o gates, packed once per call for it, its columns of
 * each step's product h W_hh^T (cpu_rnn_mm_f32, one thread), its units' cells; then one
 * barrier (rnn_bar_wait), since the next step's product reads the whole new h. h is kept in
 * two buffers, the step reading one and writing the other. Backward, its units' cells (their
 * columns of dG) then the barrier, then its units of dh += dG W_hh (its columns of W_hh
 * packed for it); the next step's cells read only its own units of dh. Every output element
 * is computed by one thread in a fixed order (the product's sums in cpu_rnn_mm_f32's order,
 * the cells' lanes), so the bits do not depend on the thread count or the timing; one thread
 * (EMBER_NUM_THREADS=1, or a step below RNN_PAR_GRAIN) runs the same loop without a region.
 * The product replaces oneDNN's brgemm here: the same CPU time on one thread (bench/README.md,
 * "The LSTM's time loop in one parallel region") and, at train_lstm_h256's sizes, the same
 * bits. */
/* The calling thread's units [*j0, *j1) in the current team; returns the team's size. */
static inline int S(rnn_share)(int64_t H, int64_t *j0, int64_t *j1) {
    int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    int64_t nch = (H + 15) / 16, c0 = nch * tid / nth, c1 = nch * (tid + 1) / nth;
    *j0 = c0 * 16, *j1 = c1 * 16 < H ? c1 * 16 : H;
    return nth;
}

/* Threads for the loop: the kernel's when a step's product (N 4H H) is big enough, at most
 * one per chunk of units; and its barrier, initialised (rnn_bar_destroy after the region). */
static int S(rnn_par_threads)(const em_kernel_ctx *k, int64_t N, int64_t H, rnn_bar *bar) {
    int nt = cpu_threads(k);
    int64_t nch = (H + 15) / 16;
    if (N * 4 * H * H < RNN_PAR_GRAIN) nt = 1;
    rnn_bar_init(bar);
    return nt > nch ? (int)nch : nt < 1 ? 1 : nt;
}

static em_status S(lstm_fwd_par)(const em_kernel_ctx *k, const rnn_geom *g, const T *gx,
                                 T *gh) {
    const T *w = k->in[3].data, *bias = k->in[4].numel ? k->in[4].data : NULL;
    T *y = k->out[0].data, *hn = k->out[1].data, *cn = k->out[2].data, *ws = k->out[3].data;
    const int64_t Tn = g->L, N = g->N, Ki = g->Ki, H = g->H, WS = 6 * H, ldw = Ki + H;
    const int64_t *len = g->len, nch = (H + 15) / 16;
    /* the packed W_hh^T (4 gates x 16 nch columns x H) and the second h buffer */
    T *pk = cpu_scratch(k, sizeof(T) * (size_t)(4 * nch * 16 * H + N * H));
    if (!pk) return em_last_status();
    T *hb[2];
    hb[Tn % 2] = hn, hb[(Tn + 1) % 2] = pk + 4 * nch * 16 * H; /* the last step writes hn */
    if (hb[0] != hn) memcpy(hb[0], hn, sizeof(T) * (size_t)(N * H));
    rnn_bar bar;
    int nt = S(rnn_par_threads)(k, N, H, &bar);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t j0, j1;
        int nth = S(rnn_share)(H, &j0, &j1), spin = RNN_SPIN_MAX;
        int64_t nj = j1 - j0, np = (nj + 15) / 16;
        T *p = pk + 4 * (j0 / 16) * 16 * H; /* gate q's panels at p + q np 16 H */
        for (int64_t q = 0; q < 4 && nj > 0; q++) /* b (k, j) = W_hh[q H + j0 + j, k] */
            cpu_rnn_pack_f32(p + q * np * 16 * H, w + (q * H + j0) * ldw + Ki, H, 1, ldw, nj);
        for (int64_t s = 0; s < Tn; s++) {
            int64_t t = g->reverse ? Tn - 1 - s : s;
            const T *hin = hb[s % 2];
            T *hout = hb[(s + 1) % 2], *gt = ws + t * N * WS, *yt = y + t * N * H;
            if (nj > 0) {
                cpu_rnn_mm_f32(hin, H, N, H, p, 4, nj, H, gh + j0, 4 * H, false);
                for (int64_t b = 0; b < N; b++) {
                    T *gr = gt + b * WS, *yr = yt + b * H;
                    if (len && t >= len[b]) { /* the state stays; zeros out */
                        for (int64_t q = 0; q < 6; q++)
                            memset(gr + q * H + j0, 0, sizeof(T) * (size_t)nj);
                        memset(yr + j0, 0, sizeof(T) * (size_t)nj);
                        memcpy(hout + b * H + j0, hin + b * H + j0, sizeof(T) * (size_t)nj);
                        continue;
                    }
                    cpu_rnn_lstm_cell_part_f32(gr, gx + (t * N + b) * 4 * H, gh + b * 4 * H,
                                               bias, cn + b * H, hin + b * H, hout + b * H, yr,
                                               H, j0, j1);
                }
            }
            rnn_bar_wait(&bar, nth, &spin);
        }
    }
    rnn_bar_destroy(&bar);
    return EM_OK;
}

static em_status S(lstm_bwd_par)(const em_kernel_ctx *k, const rnn_geom *g) {
    const T *gy = k->in[0].numel ? k->in[0].data : NULL, *w = k->in[3].data,
            *ws = k->in[4].data;
    T *dG = k->out[0].data, *dh = k->out[1].data, *dc = k->out[2].data;
    const int64_t Tn = g->L, N = g->N, Ki = g->Ki, H = g->H, WS = 6 * H, ldw = Ki + H;
    const int64_t *len = g->len, nch = (H + 15) / 16;
    T *pk = cpu_scratch(k, sizeof(T) * (size_t)(nch * 16 * 4 * H)); /* W_hh, 4H x 16 nch */
    if (!pk) return em_last_status();
    rnn_bar bar;
    int nt = S(rnn_par_threads)(k, N, H, &bar);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t j0, j1;
        int nth = S(rnn_share)(H, &j0, &j1), spin = RNN_SPIN_MAX;
        int64_t nj = j1 - j0;
        T *p = pk + (j0 / 16) * 16 * 4 * H;
        if (nj > 0) cpu_rnn_pack_f32(p, w + Ki + j0, 4 * H, ldw, 1, nj); /* b (k, j) = W_hh */
        for (int64_t s = Tn - 1; s >= 0; s--) {
            int64_t t = g->reverse ? Tn - 1 - s : s;
            const T *gt = ws + t * N * WS, *gyt = gy ? gy + t * N * H : NULL;
            T *dgt = dG + t * N * 4 * H;
            for (int64_t b = 0; b < N && nj > 0; b++) {
                T *d = dgt + b * 4 * H;
                if (len && t >= len[b]) {
                    for (int64_t q = 0; q < 4; q++)
                        memset(d + q * H + j0, 0, sizeof(T) * (size_t)nj);
                    continue;
                }
                cpu_rnn_lstm_cell_bwd_part_f32(gt + b * WS, gyt ? gyt + b * H : NULL,
                                               dh + b * H, dc + b * H, d, H, j0, j1);
            }
            rnn_bar_wait(&bar, nth, &spin); /* the product reads every thread's columns of dG */
            if (nj > 0) cpu_rnn_mm_f32(dgt, 4 * H, N, 4 * H, p, 1, nj, 0, dh + j0, H, true);
        }
    }
    rnn_bar_destroy(&bar);
    return EM_OK;
}
#endif

static em_status S(lstm_fwd)(const em_kernel_ctx *k, const rnn_geom *g) {
    const T *x = k->in[0].data, *hx = k->in[1].data, *cx = k->in[2].data, *w = k->in[3].data,
            *bias = k->in[4].numel ? k->in[4].data : NULL;
    T *y = k->out[0].data, *hn = k->out[1].data, *cn = k->out[2].data, *ws = k->out[3].data;
    const int64_t Tn = g->L, N = g->N, Ki = g->Ki, H = g->H, WS = 6 * H, ldw = Ki + H;
    const int64_t *len = g->len;
    size_t state = sizeof(T) * (size_t)(N * H);
    if (k->in[1].numel) memcpy(hn, hx, state);
    else memset(hn, 0, state);
    if (k->in[2].numel) memcpy(cn, cx, state);
    else memset(cn, 0, state);
    if (Tn == 0 || N == 0) return EM_OK;
    /* Dense buffers the cell adds (a product into the workspace's strided gate columns
     * would not get oneDNN's brgemm): gx (T N, 4H) the input projection of every step at
     * once, gh (N, 4H) a step's hidden product. Neither GEMM uses the kernel workspace. */
    T *gx = cpu_scratch(k, sizeof(T) * (size_t)((Tn + 1) * N * 4 * H));
    if (!gx) return em_last_status();
    T *gh = gx + Tn * N * 4 * H;
    if (Ki == 0) {
        memset(gx, 0, sizeof(T) * (size_t)(Tn * N * 4 * H));
    } else {
#if PACKED_MM
        rnn_mm pm; /* gx = x W_ih^T */
        bool proj = rnn_mm_init(&pm, k, Tn * N, Ki, 4 * H, w, 1, ldw, 4 * H, false);
        if (proj && !rnn_mm_run(&pm, x, gx)) proj = false;
        if (proj) rnn_mm_free(&pm);
        if (!proj)
#endif
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(Tn * N), (int)(4 * H), (int)Ki, 1,
                 x, (int)Ki, w, (int)ldw, 0, gx, (int)(4 * H));
    }
#if SIMD_CELLS
    bool simd = cpu_rnn_simd_ok();
    if (simd && H > 0 && rnn_par_ok()) return S(lstm_fwd_par)(k, g, gx, gh);
#else
    bool simd = false;
#endif
    int nt = rnn_threads(k, N * H * (simd ? 1 : 8));
#if PACKED_MM
    rnn_mm mm; /* gh = h W_hh^T on W_hh^T packed once (cpu_rnn.c) */
    bool packed = rnn_mm_init(&mm, k, N, H, 4 * H, w + Ki, 1, ldw, 4 * H, false);
#endif
    for (int64_t s = 0; s < Tn; s++) {
        int64_t t = g->reverse ? Tn - 1 - s : s;
        T *gt = ws + t * N * WS, *yt = y + t * N * H;
#if PACKED_MM
        if (!packed || !rnn_mm_run(&mm, hn, gh))
#endif
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)(4 * H), (int)H, 1, hn,
                 (int)H, w + Ki, (int)ldw, 0, gh, (int)(4 * H));
        RNN_ROWS(nt, N, {
            T *gr = gt + b * WS, *h = hn + b * H, *c = cn + b * H, *yr = yt + b * H;
            const T *hr = gh + b * 4 * H, *xr = gx + (t * N + b) * 4 * H;
            if (len && t >= len[b]) {
                memset(gr, 0, sizeof(T) * (size_t)WS);
                memset(yr, 0, sizeof(T) * (size_t)H);
                continue;
            }
            S(lstm_cell)(gr, xr, hr, bias, c, h, yr, H, simd);
        });
    }
#if PACKED_MM
    if (packed) rnn_mm_free(&mm);
#endif
    return EM_OK;
}

static em_status S(lstm_bwd)(const em_kernel_ctx *k, const rnn_geom *g) {
    const T *gy = k->in[0].numel ? k->in[0].data : NULL, *ghn = k->in[1].data,
            *gcn = k->in[2].data, *w = k->in[3].data, *ws = k->in[4].data;
    T *dG = k->out[0].data, *dh = k->out[1].data, *dc = k->out[2].data;
    const int64_t Tn = g->L, N = g->N, Ki = g->Ki, H = g->H, WS = 6 * H, ldw = Ki + H;
    const int64_t *len = g->len;
    size_t state = sizeof(T) * (size_t)(N * H);
    if (k->in[1].numel) memcpy(dh, ghn, state);
    else memset(dh, 0, state);
    if (k->in[2].numel) memcpy(dc, gcn, state);
    else memset(dc, 0, state);
    if (Tn == 0 || N == 0) return EM_OK;
#if SIMD_CELLS
    bool simd = cpu_rnn_simd_ok();
    if (simd && H > 0 && rnn_par_ok()) return S(lstm_bwd_par)(k, g);
#else
    bool simd = false;
#endif
    int nt = rnn_threads(k, N * H * (simd ? 1 : 8));
#if PACKED_MM
    rnn_mm mm; /* dh += dG W_hh on W_hh packed once */
    bool packed = rnn_mm_init(&mm, k, N, 4 * H, H, w + Ki, ldw, 1, H, true);
#endif
    for (int64_t s = Tn - 1; s >= 0; s--) {
        int64_t t = g->reverse ? Tn - 1 - s : s;
        const T *gt = ws + t * N * WS, *gyt = gy ? gy + t * N * H : NULL;
        T *dgt = dG + t * N * 4 * H;
        RNN_ROWS(nt, N, {
            const T *gr = gt + b * WS;
            T *d = dgt + b * 4 * H, *dhr = dh + b * H, *dcr = dc + b * H;
            if (len && t >= len[b]) {
                memset(d, 0, sizeof(T) * (size_t)(4 * H));
                continue;
            }
            S(lstm_cell_bwd)(gr, gyt ? gyt + b * H : NULL, dhr, dcr, d, H, simd);
        });
#if PACKED_MM
        if (!packed || !rnn_mm_run(&mm, dgt, dh))
#endif
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)H, (int)(4 * H), 1,
                 dgt, (int)(4 * H), w + Ki, (int)ldw, 1, dh, (int)H);
    }
#if PACKED_MM
    if (packed) rnn_mm_free(&mm);
#endif
    return EM_OK;
}

static em_status S(gru_fwd)(const em_kernel_ctx *k, const rnn_geom *g) {
    const T *x = k->in[0].data, *hx = k->in[1].data, *w = k->in[2].data,
            *bih = k->in[3].numel ? k->in[3].data : NULL,
            *bhh = k->in[4].numel ? k->in[4].data : NULL;
    T *y = k->out[0].data, *hn = k->out[1].data, *ws = k->out[2].data;
    const int64_t Tn = g->L, N = g->N, Ki = g->Ki, H = g->H, WS = 5 * H, ldw = Ki + H;
    const int64_t *len = g->len;
    size_t state = sizeof(T) * (size_t)(N * H);
    if (k->in[1].numel) memcpy(hn, hx, state);
    else memset(hn, 0, state);
    if (Tn == 0 || N == 0) return EM_OK;
    /* The projection first: its GEMM may use the kernel workspace that gh then takes. */
    em_status st = S(in_proj)(k, x, w, bih, Tn * N, Ki, 3 * H, H, ws, WS);
    if (st != EM_OK) return st;
    T *gh = cpu_scratch(k, sizeof(T) * (size_t)(N * 3 * H)); /* (N, 3H) hidden products */
    if (!gh) return em_last_status();
#if PACKED_MM
    rnn_mm mm; /* gh += h W_hh^T on W_hh^T packed once */
    bool packed = rnn_mm_init(&mm, k, N, H, 3 * H, w + Ki, 1, ldw, 3 * H, true);
#endif
#if SIMD_CELLS
    bool simd = cpu_rnn_simd_ok();
#else
    bool simd = false;
#endif
    int nt = rnn_threads(k, N * H * (simd ? 1 : 8));
    for (int64_t s = 0; s < Tn; s++) {
        int64_t t = g->reverse ? Tn - 1 - s : s;
        T *gt = ws + t * N * WS, *yt = y + t * N * H;
        for (int64_t b = 0; b < N; b++) {
            if (bhh) memcpy(gh + b * 3 * H, bhh, sizeof(T) * (size_t)(3 * H));
            else memset(gh + b * 3 * H, 0, sizeof(T) * (size_t)(3 * H));
        }
#if PACKED_MM
        if (!packed || !rnn_mm_run(&mm, hn, gh))
#endif
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)(3 * H), (int)H, 1, hn,
                 (int)H, w + Ki, (int)ldw, 1, gh, (int)(3 * H));
        RNN_ROWS(nt, N, {
            T *gr = gt + b * WS, *h = hn + b * H, *yr = yt + b * H;
            const T *hr = gh + b * 3 * H;
            if (len && t >= len[b]) {
                memset(gr, 0, sizeof(T) * (size_t)WS);
                memset(yr, 0, sizeof(T) * (size_t)H);
                continue;
            }
            S(gru_cell)(gr, hr, h, yr, H, simd);
        });
    }
#if PACKED_MM
    if (packed) rnn_mm_free(&mm);
#endif
    return EM_OK;
}

static em_status S(gru_bwd)(const em_kernel_ctx *k, const rnn_geom *g) {
    const T *gy = k->in[0].numel ? k->in[0].data : NULL, *ghn = k->in[1].data,
            *w = k->in[2].data, *ws = k->in[3].data;
    T *dGi = k->out[0].data, *dGh = k->out[1].data, *dh = k->out[2].data;
    const int64_t Tn = g->L, N = g->N, Ki = g->Ki, H = g->H, WS = 5 * H, ldw = Ki + H;
    const int64_t *len = g->len;
    size_t state = sizeof(T) * (size_t)(N * H);
    if (k->in[1].numel) memcpy(dh, ghn, state);
    else memset(dh, 0, state);
    if (Tn == 0 || N == 0) return EM_OK;
    int nt = rnn_threads(k, N * H * 8);
#if PACKED_MM
    rnn_mm mm; /* dh += dGh W_hh on W_hh packed once */
    bool packed = rnn_mm_init(&mm, k, N, 3 * H, H, w + Ki, ldw, 1, H, true);
#endif
    for (int64_t s = Tn - 1; s >= 0; s--) {
        int64_t t = g->reverse ? Tn - 1 - s : s;
        const T *gt = ws + t * N * WS, *gyt = gy ? gy + t * N * H : NULL;
        T *dit = dGi + t * N * 3 * H, *dht_ = dGh + t * N * 3 * H;
        RNN_ROWS(nt, N, {
            const T *gr = gt + b * WS;
            T *di = dit + b * 3 * H, *dhh = dht_ + b * 3 * H, *dhr = dh + b * H;
            if (len && t >= len[b]) {
                memset(di, 0, sizeof(T) * (size_t)(3 * H));
                memset(dhh, 0, sizeof(T) * (size_t)(3 * H));
                continue;
            }
            for (int64_t j = 0; j < H; j++) {
                T r = gr[j], z = gr[H + j], n = gr[2 * H + j], nl = gr[3 * H + j],
                  hp = gr[4 * H + j];
                T dht = dhr[j] + (gyt ? gyt[b * H + j] : 0);
                T dn = dht * (1 - z) * (1 - n * n);
                T dr = dn * nl * r * (1 - r), dz = dht * (hp - n) * z * (1 - z);
                di[j] = dr, di[H + j] = dz, di[2 * H + j] = dn;
                dhh[j] = dr, dhh[H + j] = dz, dhh[2 * H + j] = dn * r;
                dhr[j] = dht * z; /* the direct path; the GEMM below adds dGh W_hh */
            }
        });
#if PACKED_MM
        if (!packed || !rnn_mm_run(&mm, dht_, dh))
#endif
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)H, (int)(3 * H), 1,
                 dht_, (int)(3 * H), w + Ki, (int)ldw, 1, dh, (int)H);
    }
#if PACKED_MM
    if (packed) rnn_mm_free(&mm);
#endif
    return EM_OK;
}

#undef RNN_ROWS

/*
 * cpu_attention_loops.h — the fused scaled_dot_product_attention loops, instantiated by
 * cpu_attention.c once per element type: T the type, S(name) its type-suffixed name, S_STATS
 * the logsumexp's type, EXP the exponential in T. Contracts and the algorithm in
 * cpu_attention.c. The per-tile functions are SIMD_CLONES (AVX-512, AVX2, baseline): their
 * inner loops run along contiguous rows (`omp simd`).
 */

/* xt (n, AT_BC) = the rows [j0, j0 + nc) of x (., n), transposed, and zeros past nc: the
 * tile products then run along contiguous keys, always AT_BC of them. */
static AT_INLINE void S(at_transpose)(const T *x, int64_t n, int64_t j0, int64_t nc, T *xt) {
    for (int64_t e = 0; e < n; e++)
        for (int64_t jj = 0; jj < AT_BC; jj++) xt[e * AT_BC + jj] = jj < nc ? x[(j0 + jj) * n + e] : 0;
}

/* c (nr, AT_BC) = a (nr, n) bt (n, AT_BC): a full row of the tile accumulates in registers
 * (AT_BC / lanes vectors of 64 bytes, unaligned loads; GCC's vector extension lowers them to
 * each clone's registers). */
typedef T S(at_vec) __attribute__((vector_size(64), aligned(sizeof(T))));
#define AT_NV ((int)(AT_BC * sizeof(T) / 64))
static AT_INLINE void S(at_tile)(const T *a, int64_t nr, int64_t n, const T *bt, T *c) {
    for (int64_t r = 0; r < nr; r++) {
        S(at_vec) acc[AT_NV];
#pragma GCC unroll 16
        for (int v = 0; v < AT_NV; v++) acc[v] = (S(at_vec)){0};
        for (int64_t e = 0; e < n; e++) {
            S(at_vec) av = (S(at_vec)){0} + a[r * n + e];
            const S(at_vec) *b = (const S(at_vec) *)(bt + e * AT_BC);
#pragma GCC unroll 16
            for (int v = 0; v < AT_NV; v++) acc[v] += av * b[v];
        }
        memcpy(c + r * AT_BC, acc, sizeof acc);
    }
}
#undef AT_NV

/* acc (w) += sum_{t < cnt} c[t cs] x[t xs .. t xs + w): the tile's product with a block of
 * rows (the values, keys, queries or output grads), a chunk of acc held in 4 vector
 * registers while every row is added (a plain axpy per row would store and reload acc). */
static AT_INLINE void S(at_mix)(T *acc, const T *c, int64_t cs, const T *x, int64_t xs,
                                int64_t cnt, int64_t w) {
    enum { LANES = 64 / (int)sizeof(T), CH = 4 * LANES };
    int64_t e0 = 0;
    for (; e0 + CH <= w; e0 += CH) {
        S(at_vec) *ap = (S(at_vec) *)(acc + e0);
        S(at_vec) a0 = ap[0], a1 = ap[1], a2 = ap[2], a3 = ap[3];
        for (int64_t t = 0; t < cnt; t++) {
            T cv = c[t * cs];
            if (cv == 0) continue;
            S(at_vec) b = (S(at_vec)){0} + cv;
            const S(at_vec) *xr = (const S(at_vec) *)(x + t * xs + e0);
            a0 += b * xr[0], a1 += b * xr[1], a2 += b * xr[2], a3 += b * xr[3];
        }
        ap[0] = a0, ap[1] = a1, ap[2] = a2, ap[3] = a3;
    }
    if (e0 < w)
        for (int64_t t = 0; t < cnt; t++) {
            T cv = c[t * cs];
            if (cv == 0) continue;
            const T *xr = x + t * xs;
#pragma omp simd
            for (int64_t e = e0; e < w; e++) acc[e] += cv * xr[e];
        }
}

/* The scores of rows [i0, i0 + nr) against keys [j0, j0 + nc) of batch b in sc (nr, AT_BC):
 * the products (already in sc) scaled, the mask applied, -inf where masked out. */
static AT_INLINE void S(at_scores)(const at_geom *g, int64_t moff, int64_t i0, int64_t nr,
                                int64_t j0, int64_t nc, T *sc) {
    T scale = (T)g->scale;
    for (int64_t r = 0; r < nr; r++) {
        int64_t i = i0 + r;
        T *s = sc + r * AT_BC;
#pragma omp simd
        for (int64_t jj = 0; jj < nc; jj++) s[jj] *= scale;
        if (g->mkind == AT_MASK_BOOL) {
            const bool *m = (const bool *)g->mask + moff + i * g->msl + j0 * g->mss;
            for (int64_t jj = 0; jj < nc; jj++)
                if (!m[jj * g->mss]) s[jj] = (T)-INFINITY;
        } else if (g->mkind == AT_MASK_FLOAT) {
            const T *m = (const T *)g->mask + moff + i * g->msl + j0 * g->mss;
            for (int64_t jj = 0; jj < nc; jj++) s[jj] += m[jj * g->mss];
        }
        if (g->causal)
            for (int64_t jj = i + 1 - j0 > 0 ? i + 1 - j0 : 0; jj < nc; jj++) s[jj] = (T)-INFINITY;
    }
}

/* Probabilities p = exp(s - lse) in place (0 where masked out or the row has no key). */
static AT_INLINE void S(at_probs)(T *s, int64_t nc, T lse) {
    if (lse == (T)-INFINITY) {
        for (int64_t j = 0; j < nc; j++) s[j] = 0;
        return;
    }
    for (int64_t j = 0; j < nc; j++) s[j] = s[j] == (T)-INFINITY ? 0 : EXP(s[j] - lse);
}

/* Forward of query rows [i0, i1) of batch b: online softmax over key blocks of AT_BC; sc the
 * scores of one (rows x keys) tile, kt the key block transposed, acc the running output, m
 * and l the running max and sum. */
SIMD_CLONES static void S(at_fwd_rows)(const em_kernel_ctx *k, const at_geom *g, int64_t b,
                                       int64_t i0, int64_t i1, T *sc, T *kt, T *acc, T *m,
                                       T *l) {
    const T *q = (const T *)k->in[0].data + (b * g->L + i0) * g->E;
    const T *kb = (const T *)k->in[1].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[2].data + b * g->S * g->Ev;
    T *out = (T *)k->out[0].data + b * g->L * g->Ev;
    int64_t moff = at_mask_offset(g, b), nr = i1 - i0, Ev = g->Ev;
    at_rng rng = AT_RNG_INIT;
    for (int64_t r = 0; r < nr; r++) m[r] = (T)-INFINITY, l[r] = 0;
    for (int64_t x = 0; x < nr * Ev; x++) acc[x] = 0;
    int64_t jend = g->causal ? EM_CPU_AT_MIN(g->S, i1) : g->S;
    for (int64_t j0 = 0; j0 < jend; j0 += AT_BC) {
        int64_t nc = EM_CPU_AT_MIN(AT_BC, jend - j0);
        S(at_transpose)(kb, g->E, j0, nc, kt);
        S(at_tile)(q, nr, g->E, kt, sc);
        S(at_scores)(g, moff, i0, nr, j0, nc, sc);
        for (int64_t r = 0; r < nr; r++) {
            T *s = sc + r * AT_BC, mx = (T)-INFINITY;
            for (int64_t jj = 0; jj < nc; jj++) mx = s[jj] > mx ? s[jj] : mx;
            T mnew = mx > m[r] ? mx : m[r];
            if (mnew == (T)-INFINITY) continue; /* every key so far masked out */
            T alpha = m[r] == (T)-INFINITY ? 0 : EXP(m[r] - mnew), sum = 0;
            T *ar = acc + r * Ev;
            if (alpha != 1)
                for (int64_t e = 0; e < Ev; e++) ar[e] *= alpha;
            S(at_probs)(s, nc, mnew);
            for (int64_t jj = 0; jj < nc; jj++) {
                sum += s[jj];
                if (g->dropping)
                    s[jj] = s[jj] != 0 && at_keep(g, &rng, b, i0 + r, j0 + jj) ? s[jj] * (T)g->rinv : 0;
            }
            S(at_mix)(ar, s, 1, vb + j0 * Ev, Ev, nc, Ev);
            l[r] = l[r] * alpha + sum;
            m[r] = mnew;
        }
    }
    S_STATS *lse = (S_STATS *)k->out[1].data + b * g->L;
    for (int64_t r = 0; r < nr; r++) {
        T *o = out + (i0 + r) * Ev, inv = l[r] > 0 ? 1 / l[r] : 0;
        for (int64_t e = 0; e < Ev; e++) o[e] = acc[r * Ev + e] * inv;
        lse[i0 + r] = l[r] > 0 ? (S_STATS)(m[r] + log(l[r])) : (S_STATS)-INFINITY;
    }
}

/* Probabilities and dropout-masked dp = gy . v of rows [i0, i0 + nr) against keys
 * [j0, j0 + nc) into p and dp (nr, AT_BC), from the key and value blocks transposed (kt, vt). */
static AT_INLINE void S(at_bwd_tile)(const em_kernel_ctx *k, const at_geom *g, at_rng *rng,
                                  int64_t b, int64_t moff, int64_t i0, int64_t nr, int64_t j0,
                                  int64_t nc, const T *kt, const T *vt, T *p, T *dp) {
    const T *gy = (const T *)k->in[0].data + (b * g->L + i0) * g->Ev;
    const T *q = (const T *)k->in[1].data + (b * g->L + i0) * g->E;
    const S_STATS *lse = (const S_STATS *)k->in[5].data + b * g->L + i0;
    S(at_tile)(q, nr, g->E, kt, p);
    S(at_scores)(g, moff, i0, nr, j0, nc, p);
    S(at_tile)(gy, nr, g->Ev, vt, dp);
    for (int64_t r = 0; r < nr; r++) {
        T *pr = p + r * AT_BC, *dr = dp + r * AT_BC;
        S(at_probs)(pr, nc, (T)lse[r]);
        if (g->dropping)
            for (int64_t jj = 0; jj < nc; jj++)
                dr[jj] = pr[jj] != 0 && at_keep(g, rng, b, i0 + r, j0 + jj) ? dr[jj] * (T)g->rinv : 0;
    }
}

/* Backward pass A, query rows [i0, i1) of batch b: the rows' p and dp against every key (one
 * row block, in pb and dpb: (nr, S) as tiles of AT_BC), D_i = sum_j p_ij dp_ij (= gy_i .
 * out_i; kept in dbuf for pass B), then gq_i = scale sum_j p_ij (dp_ij - D_i) k_j. */
SIMD_CLONES static void S(at_bwd_rows)(const em_kernel_ctx *k, const at_geom *g, int64_t b,
                                       int64_t i0, int64_t i1, T *dbuf, T *pb, T *dpb, T *kt,
                                       T *vt) {
    const T *kb = (const T *)k->in[2].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[3].data + b * g->S * g->Ev;
    T *gq = (T *)k->out[0].data + (b * g->L + i0) * g->E;
    int64_t moff = at_mask_offset(g, b), E = g->E, nr = i1 - i0, tile = AT_BR * AT_BC;
    at_rng rng = AT_RNG_INIT;
    int64_t jend = g->causal ? EM_CPU_AT_MIN(g->S, i1) : g->S;
    T *D = dbuf + b * g->L + i0;
    for (int64_t r = 0; r < nr; r++) D[r] = 0;
    for (int64_t j0 = 0, t = 0; j0 < jend; j0 += AT_BC, t++) {
        int64_t nc = EM_CPU_AT_MIN(AT_BC, jend - j0);
        S(at_transpose)(kb, E, j0, nc, kt);
        S(at_transpose)(vb, g->Ev, j0, nc, vt);
        T *p = pb + t * tile, *dp = dpb + t * tile;
        S(at_bwd_tile)(k, g, &rng, b, moff, i0, nr, j0, nc, kt, vt, p, dp);
        for (int64_t r = 0; r < nr; r++) {
            T sum = 0;
            for (int64_t jj = 0; jj < nc; jj++) sum += p[r * AT_BC + jj] * dp[r * AT_BC + jj];
            D[r] += sum;
        }
    }
    for (int64_t x = 0; x < nr * E; x++) gq[x] = 0;
    for (int64_t j0 = 0, t = 0; j0 < jend; j0 += AT_BC, t++) {
        int64_t nc = EM_CPU_AT_MIN(AT_BC, jend - j0);
        const T *p = pb + t * tile;
        T *ds = dpb + t * tile; /* dp becomes scale p (dp - D) */
        for (int64_t r = 0; r < nr; r++) {
            for (int64_t jj = 0; jj < nc; jj++)
                ds[r * AT_BC + jj] = (T)g->scale * p[r * AT_BC + jj] * (ds[r * AT_BC + jj] - D[r]);
            S(at_mix)(gq + r * E, ds + r * AT_BC, 1, kb + j0 * E, E, nc, E);
        }
    }
}

/* Backward pass B, keys [j0, j1) of batch b: gv_j = sum_i pd_ij gy_i (pd the dropped,
 * rescaled probability) and gk_j = scale sum_i ds_ij q_i, over the query blocks that see
 * them, one (rows x keys) tile of p and dp at a time. */
SIMD_CLONES static void S(at_bwd_keys)(const em_kernel_ctx *k, const at_geom *g, int64_t b,
                                       int64_t j0, int64_t j1, const T *dbuf, T *p, T *dp, T *kt,
                                       T *vt) {
    const T *gy = (const T *)k->in[0].data + b * g->L * g->Ev;
    const T *q = (const T *)k->in[1].data + b * g->L * g->E;
    const T *kb = (const T *)k->in[2].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[3].data + b * g->S * g->Ev;
    T *gk = (T *)k->out[1].data + b * g->S * g->E, *gv = (T *)k->out[2].data + b * g->S * g->Ev;
    int64_t moff = at_mask_offset(g, b), E = g->E, Ev = g->Ev, nc = j1 - j0;
    at_rng rng = AT_RNG_INIT;
    for (int64_t x = j0 * E; x < j1 * E; x++) gk[x] = 0;
    for (int64_t x = j0 * Ev; x < j1 * Ev; x++) gv[x] = 0;
    S(at_transpose)(kb, E, j0, nc, kt);
    S(at_transpose)(vb, Ev, j0, nc, vt);
    /* Causal: rows before j0 see none of these keys; start at the block holding row j0. */
    for (int64_t i0 = g->causal ? j0 / AT_BR * AT_BR : 0; i0 < g->L; i0 += AT_BR) {
        int64_t nr = EM_CPU_AT_MIN(AT_BR, g->L - i0);
        S(at_bwd_tile)(k, g, &rng, b, moff, i0, nr, j0, nc, kt, vt, p, dp);
        /* dp becomes scale p (dp - D), then p the dropped, rescaled probability. */
        for (int64_t r = 0; r < nr; r++) {
            T D = dbuf[b * g->L + i0 + r];
            for (int64_t jj = 0; jj < nc; jj++) {
                T pv = p[r * AT_BC + jj];
                dp[r * AT_BC + jj] = (T)g->scale * pv * (dp[r * AT_BC + jj] - D);
                if (g->dropping && pv != 0)
                    p[r * AT_BC + jj] = at_keep(g, &rng, b, i0 + r, j0 + jj) ? pv * (T)g->rinv : 0;
            }
        }
        for (int64_t jj = 0; jj < nc; jj++) {
            S(at_mix)(gv + (j0 + jj) * Ev, p + jj, AT_BC, gy + i0 * Ev, Ev, nr, Ev);
            S(at_mix)(gk + (j0 + jj) * E, dp + jj, AT_BC, q + i0 * E, E, nr, E);
        }
    }
}

typedef struct S(at_job) {
    const em_kernel_ctx *k;
    const at_geom *g;
    T *scratch; /* per thread `per` values (at_forward, at_backward); backward: D (B L) first */
    int64_t per;
    int nt;
    atomic_int bad;
} S(at_job);

/* This thread's scratch, or NULL (the job marked bad) when the thread count grew since the
 * scratch was made. */
static T *S(at_mine)(S(at_job) *jb, int64_t skip) {
    int th = omp_get_thread_num();
    if (th >= jb->nt) {
        atomic_store(&jb->bad, 1);
        return NULL;
    }
    return jb->scratch + skip + th * jb->per;
}

static void S(at_fwd_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    const at_geom *g = jb->g;
    T *sc = S(at_mine)(jb, 0);
    if (!sc) return;
    T *kt = sc + AT_BR * AT_BC, *acc = kt + g->E * AT_BC, *m = acc + AT_BR * g->Ev, *l = m + AT_BR;
    int64_t nb = (g->L + AT_BR - 1) / AT_BR, b = t / nb, i0 = t % nb * AT_BR;
    S(at_fwd_rows)(jb->k, g, b, i0, EM_CPU_AT_MIN(i0 + AT_BR, g->L), sc, kt, acc, m, l);
}

static int64_t S(at_key_tiles)(const at_geom *g) { return (g->S + AT_BC - 1) / AT_BC; }

static void S(at_bwd_rows_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    const at_geom *g = jb->g;
    T *pb = S(at_mine)(jb, g->B * g->L);
    if (!pb) return;
    int64_t tiles = S(at_key_tiles)(g) * AT_BR * AT_BC;
    T *dpb = pb + tiles, *kt = dpb + tiles, *vt = kt + g->E * AT_BC;
    int64_t nb = (g->L + AT_BR - 1) / AT_BR, b = t / nb, i0 = t % nb * AT_BR;
    S(at_bwd_rows)(jb->k, g, b, i0, EM_CPU_AT_MIN(i0 + AT_BR, g->L), jb->scratch, pb, dpb, kt, vt);
}

static void S(at_bwd_keys_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    const at_geom *g = jb->g;
    T *p = S(at_mine)(jb, g->B * g->L);
    if (!p) return;
    T *dp = p + AT_BR * AT_BC, *kt = dp + AT_BR * AT_BC, *vt = kt + g->E * AT_BC;
    int64_t nb = S(at_key_tiles)(g), b = t / nb, j0 = t % nb * AT_BC;
    S(at_bwd_keys)(jb->k, g, b, j0, EM_CPU_AT_MIN(j0 + AT_BC, g->S), jb->scratch, p, dp, kt, vt);
}

static em_status S(at_forward)(const em_kernel_ctx *k, const at_geom *g) {
    S(at_job) jb = {.k = k, .g = g, .nt = at_threads(k, g)};
    atomic_init(&jb.bad, 0);
    jb.per = AT_BR * AT_BC + g->E * AT_BC + AT_BR * g->Ev + 2 * AT_BR;
    jb.scratch = cpu_scratch(k, sizeof(T) * (size_t)(jb.nt * jb.per));
    if (!jb.scratch) return em_last_status();
    at_run(jb.nt, g->B * ((g->L + AT_BR - 1) / AT_BR), S(at_fwd_task), &jb);
    return atomic_load(&jb.bad) ? at_thread_error(k) : EM_OK;
}

static em_status S(at_backward)(const em_kernel_ctx *k, const at_geom *g) {
    S(at_job) jb = {.k = k, .g = g, .nt = at_threads(k, g)};
    atomic_init(&jb.bad, 0);
    /* Per thread: pass A's row block of p and dp (every key tile), or pass B's one tile of
     * each, and the key and value blocks transposed. */
    int64_t a = 2 * S(at_key_tiles)(g) * AT_BR * AT_BC, kv = (g->E + g->Ev) * AT_BC;
    jb.per = (a > 2 * AT_BR * AT_BC ? a : 2 * AT_BR * AT_BC) + kv;
    jb.scratch = cpu_scratch(k, sizeof(T) * (size_t)(g->B * g->L + jb.nt * jb.per));
    if (!jb.scratch) return em_last_status();
    at_run(jb.nt, g->B * ((g->L + AT_BR - 1) / AT_BR), S(at_bwd_rows_task), &jb);
    if (atomic_load(&jb.bad)) return at_thread_error(k);
    at_run(jb.nt, g->B * S(at_key_tiles)(g), S(at_bwd_keys_task), &jb);
    return atomic_load(&jb.bad) ? at_thread_error(k) : EM_OK;
}

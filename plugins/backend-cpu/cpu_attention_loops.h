/*
 * cpu_attention_loops.h — the fused scaled_dot_product_attention loops, instantiated by
 * cpu_attention.c once per element type: T the type, S(name) its type-suffixed name, S_STATS
 * the logsumexp's type, EXP the exponential in T, GEMM the BLAS routine (cblas_sgemm /
 * cblas_dgemm, on one OpenBLAS thread: the parallelism is ours). Contracts and the algorithm in
 * cpu_attention.c. The row functions are SIMD_CLONES (AVX-512, AVX2, baseline): their loops
 * along a row of scores run `omp simd`, the exponential through libmvec.
 */

/* The scores of rows [i0, i0 + nr) against keys [0, nc) of batch b, already scaled in sc
 * (nr, nc): the mask applied, -inf where masked out (the causal cut is at_row_keys's). */
static AT_INLINE void S(at_mask_rows)(const at_geom *g, int64_t moff, int64_t i0, int64_t nr,
                                      int64_t nc, T *sc) {
    if (g->mkind == AT_MASK_NONE) return;
    for (int64_t r = 0; r < nr; r++) {
        int64_t i = i0 + r;
        T *s = sc + r * nc;
        if (g->mkind == AT_MASK_BOOL) {
            const bool *m = (const bool *)g->mask + moff + i * g->msl;
            for (int64_t j = 0; j < nc; j++)
                if (!m[j * g->mss]) s[j] = (T)-INFINITY;
        } else if (g->mkind == AT_MASK_FLOAT) {
            const T *m = (const T *)g->mask + moff + i * g->msl;
            if (g->mss == 1) {
#pragma omp simd
                for (int64_t j = 0; j < nc; j++) s[j] += m[j];
            } else {
                for (int64_t j = 0; j < nc; j++) s[j] += m[j * g->mss];
            }
        }
    }
}

/* The keys row i sees of nc: causal rows stop at i (the loops leave the rest to zero). */
static AT_INLINE int64_t S(at_row_keys)(const at_geom *g, int64_t i, int64_t nc) {
    return g->causal && i + 1 < nc ? i + 1 : nc;
}

/* s[j] = exp(s[j] - c) for j < n and a finite c (exp(-inf) = 0: masked scores vanish), 0 for
 * j in [n, nc). One plain loop, so that it becomes libmvec's vector exp (a clamp or select
 * in it keeps GCC from vectorising; lanes at -inf take libmvec's slower special-case path,
 * which is why causal rows stop at n). */
static AT_INLINE void S(at_exp_row)(T *s, int64_t n, int64_t nc, T c) {
#pragma omp simd
    for (int64_t j = 0; j < n; j++) s[j] = EXP(s[j] - c);
    for (int64_t j = n; j < nc; j++) s[j] = 0;
}

/* Dropout on a row of n values by its keep decisions (at_keep_row): kept ones times
 * 1 / (1 - p), dropped ones +0. Written as a select, then the product: GCC (trapping math, its
 * default) does not vectorise a product inside the condition, and the scalar loop was most of
 * both directions' own time on AVX2. The bits are the same: rinv is finite and >= 0, so a
 * dropped value's 0 * rinv is +0 whatever it was (NaN and infinities included). */
static AT_INLINE void S(at_drop_row)(const at_geom *g, const uint8_t *keep, T *s, int64_t n) {
    T rinv = (T)g->rinv;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) s[j] = (keep[j] ? s[j] : 0) * rinv;
}

/* Forward of query rows [i0, i1) of batch b: the row block's scores against every key it
 * sees (one GEMM into sc, (nr, nc)), each row's softmax (its maximum, exp, sum; dropout after
 * the sum), then out = P V (one GEMM) and logsumexp. */
SIMD_CLONES static void S(at_fwd_rows)(const em_kernel_ctx *k, const at_geom *g, int64_t b,
                                       int64_t i0, int64_t i1, T *sc, uint8_t *keep) {
    const T *q = (const T *)k->in[0].data + (b * g->L + i0) * g->E;
    const T *kb = (const T *)k->in[1].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[2].data + b * g->S * g->Ev;
    T *out = (T *)k->out[0].data + (b * g->L + i0) * g->Ev;
    S_STATS *lse = (S_STATS *)k->out[1].data + b * g->L + i0;
    int64_t moff = at_mask_offset(g, b), nr = i1 - i0, Ev = g->Ev, E = g->E;
    int64_t nc = g->causal ? EM_CPU_AT_MIN(g->S, i1) : g->S;
    if (nc == 0 || E == 0) {
        /* no key, or scores of 0 everywhere (E = 0): handled by the plain rules below */
        for (int64_t x = 0; x < nr * nc; x++) sc[x] = 0;
    } else {
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)nc, (int)E, (T)g->scale, q,
             (int)E, kb, (int)E, 0, sc, (int)nc);
    }
    S(at_mask_rows)(g, moff, i0, nr, nc, sc);
    for (int64_t r = 0; r < nr; r++) {
        T *s = sc + r * nc, mx = (T)-INFINITY;
        int64_t nv = S(at_row_keys)(g, i0 + r, nc);
        /* vector reductions: their order depends on the clone's vector width only, not on
         * the thread count */
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < nv; j++) mx = s[j] > mx ? s[j] : mx;
        if (mx == (T)-INFINITY) { /* every key masked out: a zero row */
            for (int64_t j = 0; j < nc; j++) s[j] = 0;
            lse[r] = (S_STATS)-INFINITY;
            continue;
        }
        S(at_exp_row)(s, nv, nc, mx);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < nv; j++) sum += s[j];
        T inv = 1 / sum;
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) s[j] *= inv;
        if (g->dropping) {
            at_keep_row(g, b, i0 + r, nv, keep);
            S(at_drop_row)(g, keep, s, nv);
        }
        lse[r] = (S_STATS)(mx + log(sum));
    }
    if (nc == 0 || Ev == 0) {
        for (int64_t x = 0; x < nr * Ev; x++) out[x] = 0;
        return;
    }
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)Ev, (int)nc, 1, sc, (int)nc,
         vb, (int)Ev, 0, out, (int)Ev);
}

/* Backward of batch b, one row block at a time (so that the key and value gradients, summed
 * over every row block, need no atomics and have one order whatever the thread count): the
 * block's P = exp(scores - lse) and dP = gy V^T (dropout-masked) in p and dp (nr, nc),
 * D_i = sum_j p_ij dp_ij (= gy_i . out_i), dS = scale P (dP - D) in dp; then gq = dS K,
 * gk += dS^T q, gv += Pd^T gy (Pd the dropped, rescaled P), each one GEMM. */
SIMD_CLONES static void S(at_bwd_batch)(const em_kernel_ctx *k, const at_geom *g, int64_t b,
                                        T *p, T *dp, uint8_t *keep) {
    const T *gy = (const T *)k->in[0].data + b * g->L * g->Ev;
    const T *q = (const T *)k->in[1].data + b * g->L * g->E;
    const T *kb = (const T *)k->in[2].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[3].data + b * g->S * g->Ev;
    const S_STATS *lse = (const S_STATS *)k->in[5].data + b * g->L;
    T *gq = (T *)k->out[0].data + b * g->L * g->E;
    T *gk = (T *)k->out[1].data + b * g->S * g->E, *gv = (T *)k->out[2].data + b * g->S * g->Ev;
    int64_t moff = at_mask_offset(g, b), E = g->E, Ev = g->Ev;
    for (int64_t x = 0; x < g->S * E; x++) gk[x] = 0;
    for (int64_t x = 0; x < g->S * Ev; x++) gv[x] = 0;
    for (int64_t i0 = 0; i0 < g->L; i0 += g->br) {
        int64_t i1 = EM_CPU_AT_MIN(i0 + g->br, g->L), nr = i1 - i0;
        int64_t nc = g->causal ? EM_CPU_AT_MIN(g->S, i1) : g->S;
        T *gqb = gq + i0 * E;
        if (nc == 0) {
            for (int64_t x = 0; x < nr * E; x++) gqb[x] = 0;
            continue;
        }
        const T *qb = q + i0 * E, *gyb = gy + i0 * Ev;
        if (E > 0)
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)nc, (int)E, (T)g->scale,
                 qb, (int)E, kb, (int)E, 0, p, (int)nc);
        else
            for (int64_t x = 0; x < nr * nc; x++) p[x] = 0;
        if (Ev > 0)
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)nc, (int)Ev, 1, gyb,
                 (int)Ev, vb, (int)Ev, 0, dp, (int)nc);
        else
            for (int64_t x = 0; x < nr * nc; x++) dp[x] = 0;
        S(at_mask_rows)(g, moff, i0, nr, nc, p);
        for (int64_t r = 0; r < nr; r++) {
            T *pr = p + r * nc, *dr = dp + r * nc, l = (T)lse[i0 + r];
            if (l == (T)-INFINITY) {
                for (int64_t j = 0; j < nc; j++) pr[j] = 0, dr[j] = 0;
                continue;
            }
            int64_t nv = S(at_row_keys)(g, i0 + r, nc);
            S(at_exp_row)(pr, nv, nc, l);
            if (g->dropping) {
                at_keep_row(g, b, i0 + r, nv, keep);
                S(at_drop_row)(g, keep, dr, nv);
            }
            T D = 0;
#pragma omp simd reduction(+ : D)
            for (int64_t j = 0; j < nv; j++) D += pr[j] * dr[j];
            T sc = (T)g->scale;
#pragma omp simd
            for (int64_t j = 0; j < nc; j++) dr[j] = sc * pr[j] * (dr[j] - D);
            if (g->dropping) S(at_drop_row)(g, keep, pr, nv);
        }
        if (E > 0) {
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)E, (int)nc, 1, dp,
                 (int)nc, kb, (int)E, 0, gqb, (int)E);
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)E, (int)nr, 1, dp,
                 (int)nc, qb, (int)E, 1, gk, (int)E);
        }
        if (Ev > 0)
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc, (int)Ev, (int)nr, 1, p,
                 (int)nc, gyb, (int)Ev, 1, gv, (int)Ev);
    }
}

/* Values of T that hold a row's S keep decisions (bytes). */
#define AT_KEEP(g) (((g)->S + (int64_t)sizeof(T) - 1) / (int64_t)sizeof(T))

typedef struct S(at_job) {
    const em_kernel_ctx *k;
    const at_geom *g;
    T *scratch; /* per thread `per` values */
    int64_t per;
    int nt;
    atomic_int bad;
} S(at_job);

/* This thread's scratch, or NULL (the job marked bad) when the thread count grew since the
 * scratch was made. */
static T *S(at_mine)(S(at_job) *jb) {
    int th = omp_get_thread_num();
    if (th >= jb->nt) {
        atomic_store(&jb->bad, 1);
        return NULL;
    }
    return jb->scratch + th * jb->per;
}

static void S(at_fwd_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    const at_geom *g = jb->g;
    T *sc = S(at_mine)(jb);
    if (!sc) return;
    int64_t nb = (g->L + g->br - 1) / g->br, b = t / nb, i0 = t % nb * g->br;
    S(at_fwd_rows)(jb->k, g, b, i0, EM_CPU_AT_MIN(i0 + g->br, g->L), sc,
                   (uint8_t *)(sc + g->br * g->S));
}

static void S(at_bwd_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    T *p = S(at_mine)(jb);
    if (!p) return;
    const at_geom *g = jb->g;
    S(at_bwd_batch)(jb->k, g, t, p, p + g->br * g->S, (uint8_t *)(p + 2 * g->br * g->S));
}

static em_status S(at_forward)(const em_kernel_ctx *k, const at_geom *g) {
    S(at_job) jb = {.k = k, .g = g, .nt = at_threads(k, g)};
    atomic_init(&jb.bad, 0);
    jb.per = g->br * g->S + AT_KEEP(g); /* the scores, then the keep decisions of a row */
    if (g->B * g->L == 0) return EM_OK;
    jb.scratch = cpu_scratch(k, sizeof(T) * (size_t)(jb.nt * (jb.per ? jb.per : 1)));
    if (!jb.scratch) return em_last_status();
    cpu_blas_one_thread();
    at_run(jb.nt, g->B * ((g->L + g->br - 1) / g->br), S(at_fwd_task), &jb);
    return atomic_load(&jb.bad) ? at_thread_error(k) : EM_OK;
}

static em_status S(at_backward)(const em_kernel_ctx *k, const at_geom *g) {
    S(at_job) jb = {.k = k, .g = g, .nt = at_threads(k, g)};
    atomic_init(&jb.bad, 0);
    if (jb.nt > g->B) jb.nt = g->B > 0 ? (int)g->B : 1; /* one task per batch entry */
    jb.per = 2 * g->br * g->S + AT_KEEP(g);
    if (g->B == 0) return EM_OK;
    jb.scratch = cpu_scratch(k, sizeof(T) * (size_t)(jb.nt * (jb.per ? jb.per : 1)));
    if (!jb.scratch) return em_last_status();
    cpu_blas_one_thread();
    at_run(jb.nt, g->B, S(at_bwd_task), &jb);
    return atomic_load(&jb.bad) ? at_thread_error(k) : EM_OK;
}

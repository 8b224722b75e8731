/*
 * cpu_attention_loops.h — the fused scaled_dot_product_attention loops, instantiated by
 * cpu_attention.c once per element type: T the type, S(name) its type-suffixed name. Contracts
 * and the algorithm in cpu_attention.c.
 */

static inline T S(at_dot)(const T *a, const T *b, int64_t n) {
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t e = 0; e < n; e++) s += a[e] * b[e];
    return s;
}

static inline void S(at_axpy)(T *y, T a, const T *x, int64_t n) {
#pragma omp simd
    for (int64_t e = 0; e < n; e++) y[e] += a * x[e];
}

/* Score (b, i, j): the scaled dot product plus the mask, -inf when masked out. */
static inline T S(at_score)(const at_geom *g, int64_t b, int64_t i, int64_t j, const T *qi,
                            const T *kb, int64_t moff) {
    if (g->causal && j > i) return (T)-INFINITY;
    if (g->mkind == AT_MASK_BOOL && !((const bool *)g->mask)[moff + i * g->msl + j * g->mss])
        return (T)-INFINITY;
    T s = S(at_dot)(qi, kb + j * g->E, g->E) * (T)g->scale;
    if (g->mkind == AT_MASK_FLOAT) s += ((const T *)g->mask)[moff + i * g->msl + j * g->mss];
    (void)b;
    return s;
}

/* Forward of query rows [i0, i1) of batch b: online softmax over key blocks of AT_BC, the
 * scores of one (rows x keys) tile in sc, the running output in acc, running max and sum in
 * m and l. */
static void S(at_fwd_rows)(const em_kernel_ctx *k, const at_geom *g, int64_t b, int64_t i0,
                           int64_t i1, T *sc, T *acc, T *m, T *l) {
    const T *q = (const T *)k->in[0].data + b * g->L * g->E;
    const T *kb = (const T *)k->in[1].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[2].data + b * g->S * g->Ev;
    T *out = (T *)k->out[0].data + b * g->L * g->Ev;
    int64_t moff = at_mask_offset(g, b), nr = i1 - i0, Ev = g->Ev;
    at_rng rng = AT_RNG_INIT;
    for (int64_t r = 0; r < nr; r++) m[r] = (T)-INFINITY, l[r] = 0;
    for (int64_t x = 0; x < nr * Ev; x++) acc[x] = 0;
    int64_t jend = g->causal ? EM_CPU_AT_MIN(g->S, i1) : g->S;
    for (int64_t j0 = 0; j0 < jend; j0 += AT_BC) {
        int64_t j1 = EM_CPU_AT_MIN(j0 + AT_BC, jend);
        for (int64_t r = 0; r < nr; r++) {
            int64_t i = i0 + r;
            const T *qi = q + i * g->E;
            T *s = sc + r * AT_BC, mx = (T)-INFINITY;
            for (int64_t j = j0; j < j1; j++) {
                s[j - j0] = S(at_score)(g, b, i, j, qi, kb, moff);
                if (s[j - j0] > mx) mx = s[j - j0];
            }
            T mnew = mx > m[r] ? mx : m[r];
            if (mnew == (T)-INFINITY) continue; /* every key so far masked out */
            T alpha = m[r] == (T)-INFINITY ? 0 : (T)exp(m[r] - mnew), sum = 0;
            T *ar = acc + r * Ev;
            if (alpha != 1)
                for (int64_t e = 0; e < Ev; e++) ar[e] *= alpha;
            for (int64_t j = j0; j < j1; j++) {
                T e = s[j - j0] == (T)-INFINITY ? 0 : (T)exp(s[j - j0] - mnew);
                sum += e;
                if (g->dropping) e = at_keep(g, &rng, b, i, j) ? e * (T)g->rinv : 0;
                if (e != 0) S(at_axpy)(ar, e, vb + j * Ev, Ev);
            }
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

/* The probability p_ij = exp(s_ij - lse_i) (0 when masked out) and, with dropout, whether
 * the pair is kept. */
static inline T S(at_prob)(const at_geom *g, int64_t b, int64_t i, int64_t j, const T *qi,
                           const T *kb, int64_t moff, T lse) {
    T s = S(at_score)(g, b, i, j, qi, kb, moff);
    return s == (T)-INFINITY || lse == (T)-INFINITY ? 0 : (T)exp(s - lse);
}

/* Backward pass A, query rows [i0, i1) of batch b: for each row, p_ij and the dropout-masked
 * dp_ij = gy_i . v_j (kept in pb, dpb: one row), D_i = sum_j p_ij dp_ij (= gy_i . out_i; kept
 * in dbuf for pass B) and gq_i = scale sum_j p_ij (dp_ij - D_i) k_j. */
static void S(at_bwd_rows)(const em_kernel_ctx *k, const at_geom *g, int64_t b, int64_t i0,
                           int64_t i1, T *dbuf, T *pb, T *dpb) {
    const T *gy = (const T *)k->in[0].data + b * g->L * g->Ev;
    const T *q = (const T *)k->in[1].data + b * g->L * g->E;
    const T *kb = (const T *)k->in[2].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[3].data + b * g->S * g->Ev;
    const S_STATS *lse = (const S_STATS *)k->in[5].data + b * g->L;
    T *gq = (T *)k->out[0].data + b * g->L * g->E;
    int64_t moff = at_mask_offset(g, b), E = g->E, Ev = g->Ev;
    at_rng rng = AT_RNG_INIT;
    for (int64_t i = i0; i < i1; i++) {
        T D = 0, li = (T)lse[i];
        int64_t jend = g->causal ? EM_CPU_AT_MIN(g->S, i + 1) : g->S;
        for (int64_t j = 0; j < jend; j++) {
            T p = S(at_prob)(g, b, i, j, q + i * E, kb, moff, li), dp = 0;
            if (p != 0) {
                dp = S(at_dot)(gy + i * Ev, vb + j * Ev, Ev);
                if (g->dropping) dp = at_keep(g, &rng, b, i, j) ? dp * (T)g->rinv : 0;
            }
            pb[j] = p, dpb[j] = dp;
            D += p * dp;
        }
        dbuf[b * g->L + i] = D;
        T *gqi = gq + i * E;
        for (int64_t e = 0; e < E; e++) gqi[e] = 0;
        for (int64_t j = 0; j < jend; j++)
            if (pb[j] != 0) S(at_axpy)(gqi, (T)g->scale * pb[j] * (dpb[j] - D), kb + j * E, E);
    }
}

/* Backward pass B, keys [j0, j1) of batch b: gv_j = sum_i pd_ij gy_i (pd the dropped,
 * rescaled probability) and gk_j = scale sum_i ds_ij q_i, over the queries that see them. */
static void S(at_bwd_keys)(const em_kernel_ctx *k, const at_geom *g, int64_t b, int64_t j0,
                           int64_t j1, const T *dbuf) {
    const T *gy = (const T *)k->in[0].data + b * g->L * g->Ev;
    const T *q = (const T *)k->in[1].data + b * g->L * g->E;
    const T *kb = (const T *)k->in[2].data + b * g->S * g->E;
    const T *vb = (const T *)k->in[3].data + b * g->S * g->Ev;
    const S_STATS *lse = (const S_STATS *)k->in[5].data + b * g->L;
    T *gk = (T *)k->out[1].data + b * g->S * g->E, *gv = (T *)k->out[2].data + b * g->S * g->Ev;
    int64_t moff = at_mask_offset(g, b), E = g->E, Ev = g->Ev;
    at_rng rng = AT_RNG_INIT;
    for (int64_t x = j0 * E; x < j1 * E; x++) gk[x] = 0;
    for (int64_t x = j0 * Ev; x < j1 * Ev; x++) gv[x] = 0;
    for (int64_t i = g->causal ? j0 : 0; i < g->L; i++) {
        const T *qi = q + i * E, *gyi = gy + i * Ev;
        T D = dbuf[b * g->L + i], li = (T)lse[i];
        for (int64_t j = j0; j < j1; j++) {
            T p = S(at_prob)(g, b, i, j, qi, kb, moff, li);
            if (p == 0) continue;
            T dp = S(at_dot)(gyi, vb + j * Ev, Ev), pd = p;
            if (g->dropping) {
                bool keep = at_keep(g, &rng, b, i, j);
                pd = keep ? p * (T)g->rinv : 0;
                dp = keep ? dp * (T)g->rinv : 0;
            }
            if (pd != 0) S(at_axpy)(gv + j * Ev, pd, gyi, Ev);
            S(at_axpy)(gk + j * E, (T)g->scale * p * (dp - D), qi, E);
        }
    }
}

typedef struct S(at_job) {
    const em_kernel_ctx *k;
    const at_geom *g;
    T *scratch; /* forward: per thread AT_BR * AT_BC + AT_BR * Ev + 2 AT_BR; backward: D (B L),
                  then per thread 2 S (one row's p and dp) */
    int nt;
    atomic_int bad;
} S(at_job);

static void S(at_fwd_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    const at_geom *g = jb->g;
    int th = omp_get_thread_num();
    if (th >= jb->nt) { /* the thread count grew since the scratch was made */
        atomic_store(&jb->bad, 1);
        return;
    }
    int64_t per = AT_BR * AT_BC + AT_BR * g->Ev + 2 * AT_BR;
    T *sc = jb->scratch + th * per, *acc = sc + AT_BR * AT_BC, *m = acc + AT_BR * g->Ev,
      *l = m + AT_BR;
    int64_t nb = (g->L + AT_BR - 1) / AT_BR, b = t / nb, i0 = t % nb * AT_BR;
    S(at_fwd_rows)(jb->k, g, b, i0, EM_CPU_AT_MIN(i0 + AT_BR, g->L), sc, acc, m, l);
}

static void S(at_bwd_rows_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    const at_geom *g = jb->g;
    int th = omp_get_thread_num();
    if (th >= jb->nt) {
        atomic_store(&jb->bad, 1);
        return;
    }
    T *pb = jb->scratch + g->B * g->L + th * 2 * g->S;
    int64_t nb = (g->L + AT_BR - 1) / AT_BR, b = t / nb, i0 = t % nb * AT_BR;
    S(at_bwd_rows)(jb->k, g, b, i0, EM_CPU_AT_MIN(i0 + AT_BR, g->L), jb->scratch, pb, pb + g->S);
}

static void S(at_bwd_keys_task)(void *ctx, int64_t t) {
    S(at_job) *jb = ctx;
    int64_t nb = (jb->g->S + AT_BC - 1) / AT_BC, b = t / nb, j0 = t % nb * AT_BC;
    S(at_bwd_keys)(jb->k, jb->g, b, j0, EM_CPU_AT_MIN(j0 + AT_BC, jb->g->S), jb->scratch);
}

static em_status S(at_forward)(const em_kernel_ctx *k, const at_geom *g) {
    S(at_job) jb = {.k = k, .g = g, .nt = at_threads(k, g)};
    atomic_init(&jb.bad, 0);
    int64_t per = AT_BR * AT_BC + AT_BR * g->Ev + 2 * AT_BR;
    jb.scratch = cpu_scratch(k, sizeof(T) * (size_t)(jb.nt * per));
    if (!jb.scratch) return em_last_status();
    at_run(jb.nt, g->B * ((g->L + AT_BR - 1) / AT_BR), S(at_fwd_task), &jb);
    return atomic_load(&jb.bad) ? at_thread_error(k) : EM_OK;
}

static em_status S(at_backward)(const em_kernel_ctx *k, const at_geom *g) {
    S(at_job) jb = {.k = k, .g = g, .nt = at_threads(k, g)};
    atomic_init(&jb.bad, 0);
    jb.scratch = cpu_scratch(k, sizeof(T) * (size_t)(g->B * g->L + jb.nt * 2 * g->S + 1));
    if (!jb.scratch) return em_last_status();
    at_run(jb.nt, g->B * ((g->L + AT_BR - 1) / AT_BR), S(at_bwd_rows_task), &jb);
    if (atomic_load(&jb.bad)) return at_thread_error(k);
    at_run(jb.nt, g->B * ((g->S + AT_BC - 1) / AT_BC), S(at_bwd_keys_task), &jb);
    return EM_OK;
}

/*
 * cuda_attention.cu — scaled_dot_product_attention and its backward on CUDA (contracts in
 * core/ops_attention.c), f32 and f64 (f16/bf16 calls take the core's f32 path, as on the
 * CPU), with the steps of the CPU's fused loops (plugins/backend-cpu/cpu_attention_loops.h):
 *
 * Forward, for a chunk of batch entries at a time (their (L, S) score matrices in workspace,
 * at most 2^26 scores a chunk): S = scale q k^T (one batched cuBLAS GEMM), then one warp per
 * query row: the mask (bool: false gives -inf; floating: added), the causal cut (keys j > i
 * are left out), the row maximum, exp(s - max), the sum and 1 / sum in T, dropout on the
 * normalised probabilities (kept ones times 1 / (1 - p)), logsumexp = max + log(sum) in the
 * statistics dtype; a row whose keys are all masked gets zero probabilities and a logsumexp
 * of -inf; then out = P v (one batched GEMM).
 *
 * Backward, per chunk: P = scale q k^T and dP = gy v^T (two GEMMs), then per row P =
 * exp(S + mask - lse), dP dropout-masked, D = sum_j p dp, dS = scale P (dP - D) and P
 * dropout-masked; then gq = dS k, gk = dS^T q, gv = Pd^T gy (three GEMMs).
 *
 * Dropout keeps (b, i, j) when the bernoulli stream's element (b L + i) S + j of (seed,
 * offset) is below 1 - p, decided on the Philox word as the CPU does ((w >> 8) < ceil((1 -
 * p) 2^24)): the same mask as the CPU's, bit for bit. Sums along a row run in T over a fixed
 * warp butterfly, and cuBLAS orders its own sums: results are the CPU's to rounding, the same
 * on every run. Operands are contiguous (the public functions make them so).
 */
#include "cuda_gemm.cuh"

#define AT_CHUNK ((int64_t)1 << 26) /* scores of one chunk of batch entries */

enum { AT_MASK_NONE, AT_MASK_BOOL, AT_MASK_FLOAT };

struct at_geom {
    int64_t B, L, S, E, Ev;
    int nb;
    int64_t bshape[EM_MAX_DIMS], mstride[EM_MAX_DIMS];
    int64_t msl, mss;
    int mkind;
    const void *mask;
    bool causal, dropping;
    double scale, rinv;
    uint32_t thresh; /* keep when (w >> 8) < thresh */
    ck_rng rng;      /* the dropout stream's origin (a graph capture's: read on the device) */
};

__device__ __forceinline__ int64_t at_mask_offset(const at_geom &g, int64_t b) {
    if (g.mkind == AT_MASK_NONE) return 0;
    int64_t off = 0;
    for (int d = g.nb - 1; d >= 0; d--) {
        off += b % g.bshape[d] * g.mstride[d];
        b /= g.bshape[d];
    }
    return off;
}

__device__ __forceinline__ bool at_keep(const at_geom &g, int64_t b, int64_t i, int64_t j) {
    uint64_t e = ((uint64_t)b * (uint64_t)g.L + (uint64_t)i) * (uint64_t)g.S + (uint64_t)j;
    uint32_t w[4];
    ck_philox_block(ck_rng_seed(g.rng), ck_rng_offset(g.rng) + e / 4, w);
    return (w[e % 4] >> 8) < g.thresh;
}

template <class T> __device__ __forceinline__ T at_exp(T v);
template <> __device__ __forceinline__ float at_exp<float>(float v) { return expf(v); }
template <> __device__ __forceinline__ double at_exp<double>(double v) { return exp(v); }

template <class T> __device__ __forceinline__ T at_wmax(T v) {
    for (int o = 16; o > 0; o /= 2) {
        T u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}
template <class T> __device__ __forceinline__ T at_wsum(T v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The masked score s (already scale q.k) of (b, i, j). */
template <class T>
__device__ __forceinline__ T at_masked(const at_geom &g, int64_t moff, int64_t i, int64_t j, T s) {
    if (g.mkind == AT_MASK_BOOL) {
        if (!((const uint8_t *)g.mask)[moff + i * g.msl + j * g.mss]) s = (T)-INFINITY;
    } else if (g.mkind == AT_MASK_FLOAT) {
        s += ((const T *)g.mask)[moff + i * g.msl + j * g.mss];
    }
    return s;
}

/* Forward rows of batch entries [b0, b0 + nbat): p (nbat, L, S) holds the scaled scores and
 * gets the (dropped) probabilities; lse (B, L). */
template <class T, class ST>
__global__ void at_fwd_rows(at_geom g, int64_t b0, int64_t nbat, T *p, ST *lse) {
    int lane = threadIdx.x % 32;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t r = warp; r < nbat * g.L; r += nwarps) {
        int64_t bl = r / g.L, i = r % g.L, b = b0 + bl;
        int64_t moff = at_mask_offset(g, b);
        T *s = p + r * g.S;
        int64_t nv = g.causal && i + 1 < g.S ? i + 1 : g.S;
        T mx = (T)-INFINITY;
        for (int64_t j = lane; j < g.S; j += 32) {
            T v = at_masked(g, moff, i, j, s[j]);
            s[j] = v;
            if (j < nv && v > mx) mx = v;
        }
        mx = at_wmax(mx);
        __syncwarp();
        if (mx == (T)-INFINITY) { /* every key masked out: a zero row */
            for (int64_t j = lane; j < g.S; j += 32) s[j] = 0;
            if (lane == 0) lse[b * g.L + i] = (ST)-INFINITY;
            continue;
        }
        T sum = 0;
        for (int64_t j = lane; j < g.S; j += 32) {
            T e = j < nv ? at_exp(s[j] - mx) : (T)0;
            s[j] = e;
            sum += e;
        }
        sum = at_wsum(sum);
        T inv = (T)1 / sum, rinv = (T)g.rinv;
        for (int64_t j = lane; j < nv; j += 32) {
            T v = s[j] * inv;
            if (g.dropping) v = at_keep(g, b, i, j) ? v * rinv : (T)0;
            s[j] = v;
        }
        if (lane == 0) lse[b * g.L + i] = (ST)((double)mx + log((double)sum));
    }
}

/* Backward rows: p (nbat, L, S) the scaled scores, dp the products gy v^T; p becomes the
 * dropped probabilities Pd, dp the score gradients dS. */
template <class T, class ST>
__global__ void at_bwd_rows(at_geom g, int64_t b0, int64_t nbat, T *p, T *dp, const ST *lse) {
    int lane = threadIdx.x % 32;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t r = warp; r < nbat * g.L; r += nwarps) {
        int64_t bl = r / g.L, i = r % g.L, b = b0 + bl;
        int64_t moff = at_mask_offset(g, b);
        T *pr = p + r * g.S, *dr = dp + r * g.S, l = (T)lse[b * g.L + i];
        if (l == (T)-INFINITY) {
            for (int64_t j = lane; j < g.S; j += 32) pr[j] = 0, dr[j] = 0;
            continue;
        }
        int64_t nv = g.causal && i + 1 < g.S ? i + 1 : g.S;
        T rinv = (T)g.rinv, D = 0;
        for (int64_t j = lane; j < g.S; j += 32) {
            if (j >= nv) {
                pr[j] = 0;
                continue;
            }
            T pv = at_exp(at_masked(g, moff, i, j, pr[j]) - l), dv = dr[j];
            if (g.dropping) dv = at_keep(g, b, i, j) ? dv * rinv : (T)0;
            pr[j] = pv;
            dr[j] = dv;
            D += pv * dv;
        }
        D = at_wsum(D);
        T sc = (T)g.scale;
        for (int64_t j = lane; j < g.S; j += 32) {
            if (j >= nv) {
                dr[j] = 0;
                continue;
            }
            T pv = pr[j];
            dr[j] = sc * pv * (dr[j] - D);
            if (g.dropping) pr[j] = at_keep(g, b, i, j) ? pv * rinv : (T)0;
        }
    }
}

/* The geometry from q, k, v at in[iq..iq+2] and the mask at in[im]. */
static at_geom at_geom_of(const em_kernel_ctx *k, int iq, int im) {
    const em_ktensor *q = &k->in[iq], *kk = &k->in[iq + 1], *v = &k->in[iq + 2], *mk = &k->in[im];
    int nd = q->ndim;
    at_geom g;
    memset(&g, 0, sizeof g);
    g.L = q->shape[nd - 2], g.E = q->shape[nd - 1], g.S = kk->shape[nd - 2];
    g.Ev = v->shape[nd - 1], g.nb = nd - 2, g.B = 1;
    for (int d = 0; d < nd - 2; d++) g.bshape[d] = q->shape[d], g.B *= q->shape[d];
    bool none = mk->ndim == 1 && mk->numel == 0;
    g.mkind = none ? AT_MASK_NONE : mk->dtype == EM_BOOL ? AT_MASK_BOOL : AT_MASK_FLOAT;
    g.mask = mk->data;
    if (!none) {
        int64_t st = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t s = mk->shape[d] == 1 ? 0 : st;
            if (d == nd - 1) g.mss = s;
            else if (d == nd - 2) g.msl = s;
            else g.mstride[d] = s;
            st *= mk->shape[d];
        }
    }
    const em_attr *a = k->attrs; /* dropout_p, is_causal, scale, seed, offset */
    double p = a[0].v.f, keep = 1 - p;
    g.causal = a[1].v.b;
    g.scale = a[2].v.f;
    g.rng = ck_rng{0, 0, NULL}; /* at_origin */
    g.dropping = p > 0;
    g.rinv = p < 1 ? 1 / (1 - p) : 0;
    g.thresh = keep >= 1 ? 1u << 24 : keep > 0 ? (uint32_t)ceil(keep * 16777216.0) : 0;
    return g;
}

static int64_t at_chunk(const at_geom &g) {
    int64_t per = g.L * g.S > 0 ? g.L * g.S : 1, c = AT_CHUNK / per;
    return c < 1 ? 1 : c > g.B ? g.B : c;
}

static unsigned at_row_blocks(int64_t rows) {
    int64_t b = (rows + 7) / 8; /* 8 warps a block */
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

template <class T, class ST>
static em_status at_forward(const em_kernel_ctx *k, const at_geom &g) {
    const T *q = (const T *)k->in[0].data, *kk = (const T *)k->in[1].data, *v = (const T *)k->in[2].data;
    T *out = (T *)k->out[0].data;
    ST *lse = (ST *)k->out[1].data;
    if (g.B * g.L == 0) return EM_OK;
    int64_t cb = at_chunk(g), L = g.L, S = g.S, E = g.E, Ev = g.Ev;
    T *p = (T *)ck_scratch(k, sizeof(T) * (size_t)(cb * L * (S ? S : 1)));
    if (!p) return em_last_status();
    cudaStream_t s = cuda_stream_of(k);
    for (int64_t b0 = 0; b0 < g.B; b0 += cb) {
        int64_t nb = g.B - b0 < cb ? g.B - b0 : cb;
        em_status st = cg_gemm<T>(k, false, true, L, S, E, g.scale, q + b0 * L * E, E, L * E,
                                  kk + b0 * S * E, E, S * E, 0.0, p, S, L * S, nb);
        if (st != EM_OK) return st;
        at_fwd_rows<T, ST><<<at_row_blocks(nb * L), 256, 0, s>>>(g, b0, nb, p, lse);
        st = CK_CHECK(k, "scaled_dot_product_attention rows");
        if (st == EM_OK)
            st = cg_gemm<T>(k, false, false, L, Ev, S, 1.0, p, S, L * S, v + b0 * S * Ev, Ev, S * Ev,
                            0.0, out + b0 * L * Ev, Ev, L * Ev, nb);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

template <class T, class ST>
static em_status at_backward(const em_kernel_ctx *k, const at_geom &g) {
    const T *gy = (const T *)k->in[0].data, *q = (const T *)k->in[1].data,
            *kk = (const T *)k->in[2].data, *v = (const T *)k->in[3].data;
    const ST *lse = (const ST *)k->in[5].data;
    T *gq = (T *)k->out[0].data, *gk = (T *)k->out[1].data, *gv = (T *)k->out[2].data;
    if (g.B == 0) return EM_OK;
    int64_t cb = at_chunk(g), L = g.L, S = g.S, E = g.E, Ev = g.Ev, n = cb * L * (S ? S : 1);
    T *p = (T *)ck_scratch(k, sizeof(T) * (size_t)(2 * n));
    if (!p) return em_last_status();
    T *dp = p + n;
    cudaStream_t s = cuda_stream_of(k);
    for (int64_t b0 = 0; b0 < g.B; b0 += cb) {
        int64_t nb = g.B - b0 < cb ? g.B - b0 : cb;
        const T *qb = q + b0 * L * E, *kb = kk + b0 * S * E, *vb = v + b0 * S * Ev, *gyb = gy + b0 * L * Ev;
        em_status st = cg_gemm<T>(k, false, true, L, S, E, g.scale, qb, E, L * E, kb, E, S * E, 0.0,
                                  p, S, L * S, nb);
        if (st == EM_OK)
            st = cg_gemm<T>(k, false, true, L, S, Ev, 1.0, gyb, Ev, L * Ev, vb, Ev, S * Ev, 0.0, dp,
                            S, L * S, nb);
        if (st != EM_OK) return st;
        if (L > 0) {
            at_bwd_rows<T, ST><<<at_row_blocks(nb * L), 256, 0, s>>>(g, b0, nb, p, dp, lse);
            st = CK_CHECK(k, "scaled_dot_product_attention_backward rows");
        }
        /* gq = dS k (L, E); gk = dS^T q (S, E); gv = Pd^T gy (S, Ev) */
        if (st == EM_OK)
            st = cg_gemm<T>(k, false, false, L, E, S, 1.0, dp, S, L * S, kb, E, S * E, 0.0,
                            gq + b0 * L * E, E, L * E, nb);
        if (st == EM_OK)
            st = cg_gemm<T>(k, true, false, S, E, L, 1.0, dp, S, L * S, qb, E, L * E, 0.0,
                            gk + b0 * S * E, E, S * E, nb);
        if (st == EM_OK)
            st = cg_gemm<T>(k, true, false, S, Ev, L, 1.0, p, S, L * S, gyb, Ev, L * Ev, 0.0,
                            gv + b0 * S * Ev, Ev, S * Ev, nb);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* The dropout stream's origin: the attributes', or a graph capture's (no seed). */
static em_status at_origin(const em_kernel_ctx *k, at_geom &g) {
    return g.dropping ? ck_rng_of(k, 3, &g.rng) : EM_OK;
}

static em_status k_sdpa(const em_kernel_ctx *k) {
    em_status st = cg_check_dense(k);
    if (st != EM_OK) return st;
    at_geom g = at_geom_of(k, 0, 3);
    if ((st = at_origin(k, g)) != EM_OK) return st;
    return k->out[0].dtype == EM_F64 ? at_forward<double, double>(k, g) : at_forward<float, float>(k, g);
}

static em_status k_sdpa_bwd(const em_kernel_ctx *k) {
    em_status st = cg_check_dense(k);
    if (st != EM_OK) return st;
    at_geom g = at_geom_of(k, 1, 4);
    if ((st = at_origin(k, g)) != EM_OK) return st;
    return k->out[0].dtype == EM_F64 ? at_backward<double, double>(k, g)
                                     : at_backward<float, float>(k, g);
}

em_status cuda_register_attention(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    em_status st = cuda_register_dtypes(r, "scaled_dot_product_attention", dts, 2, k_sdpa,
                                        "cuda_sdpa");
    if (st == EM_OK)
        st = cuda_register_dtypes(r, "scaled_dot_product_attention_backward", dts, 2, k_sdpa_bwd,
                                  "cuda_sdpa_backward");
    return st;
}

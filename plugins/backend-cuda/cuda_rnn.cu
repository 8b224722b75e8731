/*
 * cuda_rnn.cu — the fused lstm and gru ops and their backwards on CUDA (contracts in
 * core/ops_rnn.c), f32 and f64 (f16/bf16 calls take the core's f32 path, as on the CPU), with
 * the CPU's layout of the work (plugins/backend-cpu/cpu_rnn_loops.h) and its workspace
 * layout, so a forward on one device and a backward on the other agree:
 *
 * Forward: one cuBLAS GEMM projects the input of every step at once (x (T N, I) W_ih^T; the
 * LSTM into a dense (T N, 4H) buffer, the GRU into the gate columns of the workspace after
 * its input bias was written there); then each step runs one GEMM for the hidden product
 * h W_hh^T (the GRU's on top of its hidden bias) and one launch of the cell, a thread per
 * (batch row, hidden unit): the gate nonlinearities and the state update, the workspace row
 * [i, f, g, o, c_prev, h_prev] (LSTM) or [r, z, n, W_hn h_prev + b_hn, h_prev] (GRU).
 * Backward walks the steps the other way: the cell gives the step's pre-activation
 * gradients, and one GEMM dG W_hh (beta 1) carries the gradient to the previous hidden
 * state. Untaken steps (t >= lengths[b]) leave their rows of the state alone and write zeros.
 *
 * The cells' arithmetic is the CPU's plain loops' operation for operation (without
 * contractions: --fmad=false), with CUDA's exp and tanh (within an ulp or two of glibc's and
 * libmvec's); the GEMMs sum in cuBLAS's order. The lengths are read back to the host once per
 * call to check them (EM_ERR_INVALID naming the entry, as the CPU).
 */
#include <stdlib.h>

#include "cuda_gemm.cuh"

struct rnn_geom {
    int64_t L, N, Ki, H;
    const int64_t *len; /* device (N) or NULL */
    bool reverse;
};

/* The geometry from the sequence operand (T, N, *), the weight (G H, I + H) and the lengths
 * operand (checked on the host: one read-back). */
static em_status rnn_geom_of(const em_kernel_ctx *k, int iseq, int iw, int ilen, int64_t H,
                             rnn_geom *g) {
    const em_ktensor *seq = &k->in[iseq], *w = &k->in[iw], *len = &k->in[ilen];
    g->L = seq->shape[0], g->N = seq->shape[1], g->H = H, g->Ki = w->shape[1] - H;
    g->len = len->numel ? (const int64_t *)len->data : NULL;
    g->reverse = k->attrs[0].v.b;
    if (!g->len || g->N == 0) return EM_OK;
    int64_t *h = (int64_t *)malloc(sizeof(int64_t) * (size_t)g->N);
    if (!h) return em_set_error(EM_ERR_NOMEM, "%s: out of host memory for the lengths", em_op_name(k->op));
    em_status st = ck_readback(k, h, g->len, sizeof(int64_t) * (size_t)g->N);
    for (int64_t b = 0; st == EM_OK && b < g->N; b++)
        if (h[b] < 0 || h[b] > g->L)
            st = em_set_error(EM_ERR_INVALID, "%s: lengths[%lld] is %lld; expected 0 to the "
                              "sequence length %lld", em_op_name(k->op), (long long)b,
                              (long long)h[b], (long long)g->L);
    free(h);
    return st;
}

template <class T> __device__ __forceinline__ T r_exp(T v);
template <> __device__ __forceinline__ float r_exp<float>(float v) { return expf(v); }
template <> __device__ __forceinline__ double r_exp<double>(double v) { return exp(v); }
template <class T> __device__ __forceinline__ T r_tanh(T v);
template <> __device__ __forceinline__ float r_tanh<float>(float v) { return tanhf(v); }
template <> __device__ __forceinline__ double r_tanh<double>(double v) { return tanh(v); }
template <class T> __device__ __forceinline__ T r_sig(T v) { return (T)1 / ((T)1 + r_exp(-v)); }

/* The state (N, H) from its initial value or zeros. */
template <class T> static em_status r_init(const em_kernel_ctx *k, T *dst, const em_ktensor *src, size_t n) {
    cudaStream_t s = cuda_stream_of(k);
    if (src->numel)
        return ck_rt(k, cudaMemcpyAsync(dst, src->data, n * sizeof(T), cudaMemcpyDeviceToDevice, s),
                     "cudaMemcpyAsync");
    return ck_rt(k, cudaMemsetAsync(dst, 0, n * sizeof(T), s), "cudaMemsetAsync");
}

/* rows (M) of c (row stride ldc): the first n columns = v (n) broadcast, or zeros. */
template <class T>
__global__ void r_fill_rows(T *c, int64_t M, int64_t n, int64_t ldc, const T *v) {
    int64_t tot = M * n;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < tot; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = e / n, j = e % n;
        c[m * ldc + j] = v ? v[j] : (T)0;
    }
}

/* ---- LSTM ---------------------------------------------------------------------------------- */

template <class T>
__global__ void lstm_cell(rnn_geom g, int64_t t, const T *gx, const T *gh, const T *bias, T *ws,
                          T *c, T *h, T *y) {
    int64_t H = g.H, WS = 6 * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.N * H; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e % H;
        T *gr = ws + (t * g.N + b) * WS, *yr = y + (t * g.N + b) * H;
        if (g.len && t >= g.len[b]) {
            for (int q = 0; q < 6; q++) gr[q * H + j] = 0;
            yr[j] = 0;
            continue;
        }
        const T *xr = gx + (t * g.N + b) * 4 * H, *hr = gh + b * 4 * H;
#define PRE(q) (xr[(q) * H + j] + hr[(q) * H + j] + (bias ? bias[(q) * H + j] : (T)0))
        T ig = r_sig(PRE(0)), fg = r_sig(PRE(1)), gg = r_tanh(PRE(2)), og = r_sig(PRE(3));
#undef PRE
        T cp = c[b * H + j], hp = h[b * H + j], cnew = fg * cp + ig * gg, hnew = og * r_tanh(cnew);
        gr[j] = ig, gr[H + j] = fg, gr[2 * H + j] = gg, gr[3 * H + j] = og;
        gr[4 * H + j] = cp, gr[5 * H + j] = hp;
        c[b * H + j] = cnew, h[b * H + j] = hnew, yr[j] = hnew;
    }
}

template <class T>
__global__ void lstm_cell_bwd(rnn_geom g, int64_t t, const T *ws, const T *gy, T *dh, T *dc, T *dG) {
    int64_t H = g.H, WS = 6 * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.N * H; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e % H;
        T *d = dG + (t * g.N + b) * 4 * H;
        if (g.len && t >= g.len[b]) {
            for (int q = 0; q < 4; q++) d[q * H + j] = 0;
            continue;
        }
        const T *gr = ws + (t * g.N + b) * WS;
        T ig = gr[j], fg = gr[H + j], gg = gr[2 * H + j], og = gr[3 * H + j], cp = gr[4 * H + j];
        T tc = r_tanh(fg * cp + ig * gg);
        T dht = dh[b * H + j] + (gy ? gy[(t * g.N + b) * H + j] : (T)0);
        T dct = dc[b * H + j] + dht * og * (1 - tc * tc);
        d[j] = dct * gg * ig * (1 - ig);
        d[H + j] = dct * cp * fg * (1 - fg);
        d[2 * H + j] = dct * ig * (1 - gg * gg);
        d[3 * H + j] = dht * tc * og * (1 - og);
        dc[b * H + j] = dct * fg;
        dh[b * H + j] = 0; /* the GEMM adds dG W_hh */
    }
}

template <class T> static em_status lstm_fwd(const em_kernel_ctx *k, const rnn_geom &g) {
    const T *x = (const T *)k->in[0].data, *w = (const T *)k->in[3].data;
    const T *bias = k->in[4].numel ? (const T *)k->in[4].data : NULL;
    T *y = (T *)k->out[0].data, *hn = (T *)k->out[1].data, *cn = (T *)k->out[2].data,
      *ws = (T *)k->out[3].data;
    const int64_t Tn = g.L, N = g.N, Ki = g.Ki, H = g.H, ldw = Ki + H;
    em_status st = r_init<T>(k, hn, &k->in[1], (size_t)(N * H));
    if (st == EM_OK) st = r_init<T>(k, cn, &k->in[2], (size_t)(N * H));
    if (st != EM_OK || Tn == 0 || N == 0) return st;
    T *gx = (T *)ck_scratch(k, sizeof(T) * (size_t)((Tn + 1) * N * 4 * H));
    if (!gx) return em_last_status();
    T *gh = gx + Tn * N * 4 * H;
    /* gx (T N, 4H) = x W_ih^T (zeros without input features) */
    st = cg_gemm<T>(k, false, true, Tn * N, 4 * H, Ki, 1.0, x, Ki, 0, w, ldw, 0, 0.0, gx, 4 * H, 0, 1);
    cudaStream_t s = cuda_stream_of(k);
    for (int64_t i = 0; i < Tn && st == EM_OK; i++) {
        int64_t t = g.reverse ? Tn - 1 - i : i;
        st = cg_gemm<T>(k, false, true, N, 4 * H, H, 1.0, hn, H, 0, w + Ki, ldw, 0, 0.0, gh, 4 * H, 0, 1);
        if (st != EM_OK) break;
        lstm_cell<T><<<ck_blocks(N * H, 1), CK_THREADS, 0, s>>>(g, t, gx, gh, bias, ws, cn, hn, y);
        st = CK_CHECK(k, "lstm cell");
    }
    return st;
}

template <class T> static em_status lstm_bwd(const em_kernel_ctx *k, const rnn_geom &g) {
    const T *gy = k->in[0].numel ? (const T *)k->in[0].data : NULL, *w = (const T *)k->in[3].data,
            *ws = (const T *)k->in[4].data;
    T *dG = (T *)k->out[0].data, *dh = (T *)k->out[1].data, *dc = (T *)k->out[2].data;
    const int64_t Tn = g.L, N = g.N, Ki = g.Ki, H = g.H, ldw = Ki + H;
    em_status st = r_init<T>(k, dh, &k->in[1], (size_t)(N * H));
    if (st == EM_OK) st = r_init<T>(k, dc, &k->in[2], (size_t)(N * H));
    if (st != EM_OK || Tn == 0 || N == 0) return st;
    cudaStream_t s = cuda_stream_of(k);
    for (int64_t i = Tn - 1; i >= 0 && st == EM_OK; i--) {
        int64_t t = g.reverse ? Tn - 1 - i : i;
        lstm_cell_bwd<T><<<ck_blocks(N * H, 1), CK_THREADS, 0, s>>>(g, t, ws, gy, dh, dc, dG);
        st = CK_CHECK(k, "lstm_backward cell");
        if (st == EM_OK) /* dh += dG_t W_hh */
            st = cg_gemm<T>(k, false, false, N, H, 4 * H, 1.0, dG + t * N * 4 * H, 4 * H, 0, w + Ki,
                            ldw, 0, 1.0, dh, H, 0, 1);
    }
    return st;
}

/* ---- GRU ----------------------------------------------------------------------------------- */

template <class T>
__global__ void gru_cell(rnn_geom g, int64_t t, const T *gh, T *ws, T *h, T *y) {
    int64_t H = g.H, WS = 5 * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.N * H; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e % H;
        T *gr = ws + (t * g.N + b) * WS, *yr = y + (t * g.N + b) * H;
        if (g.len && t >= g.len[b]) {
            for (int q = 0; q < 5; q++) gr[q * H + j] = 0;
            yr[j] = 0;
            continue;
        }
        const T *hr = gh + b * 3 * H;
        T r = r_sig(gr[j] + hr[j]), z = r_sig(gr[H + j] + hr[H + j]);
        T nl = hr[2 * H + j], n = r_tanh(gr[2 * H + j] + r * nl), hp = h[b * H + j];
        T hnew = (1 - z) * n + z * hp;
        gr[j] = r, gr[H + j] = z, gr[2 * H + j] = n, gr[3 * H + j] = nl, gr[4 * H + j] = hp;
        h[b * H + j] = hnew, yr[j] = hnew;
    }
}

template <class T>
__global__ void gru_cell_bwd(rnn_geom g, int64_t t, const T *ws, const T *gy, T *dh, T *dGi, T *dGh) {
    int64_t H = g.H, WS = 5 * H;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < g.N * H; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = e / H, j = e % H;
        T *di = dGi + (t * g.N + b) * 3 * H, *dhh = dGh + (t * g.N + b) * 3 * H;
        if (g.len && t >= g.len[b]) {
            for (int q = 0; q < 3; q++) di[q * H + j] = 0, dhh[q * H + j] = 0;
            continue;
        }
        const T *gr = ws + (t * g.N + b) * WS;
        T r = gr[j], z = gr[H + j], n = gr[2 * H + j], nl = gr[3 * H + j], hp = gr[4 * H + j];
        T dht = dh[b * H + j] + (gy ? gy[(t * g.N + b) * H + j] : (T)0);
        T dn = dht * (1 - z) * (1 - n * n);
        T dr = dn * nl * r * (1 - r), dz = dht * (hp - n) * z * (1 - z);
        di[j] = dr, di[H + j] = dz, di[2 * H + j] = dn;
        dhh[j] = dr, dhh[H + j] = dz, dhh[2 * H + j] = dn * r;
        dh[b * H + j] = dht * z; /* the direct path; the GEMM adds dGh W_hh */
    }
}

template <class T> static em_status gru_fwd(const em_kernel_ctx *k, const rnn_geom &g) {
    const T *x = (const T *)k->in[0].data, *w = (const T *)k->in[2].data;
    const T *bih = k->in[3].numel ? (const T *)k->in[3].data : NULL,
            *bhh = k->in[4].numel ? (const T *)k->in[4].data : NULL;
    T *y = (T *)k->out[0].data, *hn = (T *)k->out[1].data, *ws = (T *)k->out[2].data;
    const int64_t Tn = g.L, N = g.N, Ki = g.Ki, H = g.H, WS = 5 * H, ldw = Ki + H;
    em_status st = r_init<T>(k, hn, &k->in[1], (size_t)(N * H));
    if (st != EM_OK || Tn == 0 || N == 0) return st;
    T *gh = (T *)ck_scratch(k, sizeof(T) * (size_t)(N * 3 * H)); /* (N, 3H) hidden products */
    if (!gh) return em_last_status();
    cudaStream_t s = cuda_stream_of(k);
    /* ws[:, :3H] = b_ih (or 0) + x W_ih^T for every step at once */
    r_fill_rows<T><<<ck_blocks(Tn * N * 3 * H, 1), CK_THREADS, 0, s>>>(ws, Tn * N, 3 * H, WS, bih);
    st = CK_CHECK(k, "gru input bias");
    if (st == EM_OK)
        st = cg_gemm<T>(k, false, true, Tn * N, 3 * H, Ki, 1.0, x, Ki, 0, w, ldw, 0, 1.0, ws, WS, 0, 1);
    for (int64_t i = 0; i < Tn && st == EM_OK; i++) {
        int64_t t = g.reverse ? Tn - 1 - i : i;
        r_fill_rows<T><<<ck_blocks(N * 3 * H, 1), CK_THREADS, 0, s>>>(gh, N, 3 * H, 3 * H, bhh);
        st = CK_CHECK(k, "gru hidden bias");
        if (st == EM_OK)
            st = cg_gemm<T>(k, false, true, N, 3 * H, H, 1.0, hn, H, 0, w + Ki, ldw, 0, 1.0, gh, 3 * H, 0, 1);
        if (st != EM_OK) break;
        gru_cell<T><<<ck_blocks(N * H, 1), CK_THREADS, 0, s>>>(g, t, gh, ws, hn, y);
        st = CK_CHECK(k, "gru cell");
    }
    return st;
}

template <class T> static em_status gru_bwd(const em_kernel_ctx *k, const rnn_geom &g) {
    const T *gy = k->in[0].numel ? (const T *)k->in[0].data : NULL, *w = (const T *)k->in[2].data,
            *ws = (const T *)k->in[3].data;
    T *dGi = (T *)k->out[0].data, *dGh = (T *)k->out[1].data, *dh = (T *)k->out[2].data;
    const int64_t Tn = g.L, N = g.N, Ki = g.Ki, H = g.H, ldw = Ki + H;
    em_status st = r_init<T>(k, dh, &k->in[1], (size_t)(N * H));
    if (st != EM_OK || Tn == 0 || N == 0) return st;
    cudaStream_t s = cuda_stream_of(k);
    for (int64_t i = Tn - 1; i >= 0 && st == EM_OK; i--) {
        int64_t t = g.reverse ? Tn - 1 - i : i;
        gru_cell_bwd<T><<<ck_blocks(N * H, 1), CK_THREADS, 0, s>>>(g, t, ws, gy, dh, dGi, dGh);
        st = CK_CHECK(k, "gru_backward cell");
        if (st == EM_OK) /* dh += dGh_t W_hh */
            st = cg_gemm<T>(k, false, false, N, H, 3 * H, 1.0, dGh + t * N * 3 * H, 3 * H, 0, w + Ki,
                            ldw, 0, 1.0, dh, H, 0, 1);
    }
    return st;
}

/* ---- kernels -------------------------------------------------------------------------------- */

static bool r_f64(const em_kernel_ctx *k) { return k->out[0].dtype == EM_F64; }

static em_status k_lstm(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cg_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 0, 3, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return r_f64(k) ? lstm_fwd<double>(k, g) : lstm_fwd<float>(k, g);
}

static em_status k_lstm_bwd(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cg_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 4, 3, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return r_f64(k) ? lstm_bwd<double>(k, g) : lstm_bwd<float>(k, g);
}

static em_status k_gru(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cg_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 0, 2, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return r_f64(k) ? gru_fwd<double>(k, g) : gru_fwd<float>(k, g);
}

static em_status k_gru_bwd(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cg_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 3, 2, 4, k->out[2].shape[1], &g);
    if (st != EM_OK) return st;
    return r_f64(k) ? gru_bwd<double>(k, g) : gru_bwd<float>(k, g);
}

em_status cuda_register_rnn(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    em_status st = cuda_register_dtypes(r, "lstm", dts, 2, k_lstm, "cuda_lstm");
    if (st == EM_OK) st = cuda_register_dtypes(r, "lstm_backward", dts, 2, k_lstm_bwd, "cuda_lstm_backward");
    if (st == EM_OK) st = cuda_register_dtypes(r, "gru", dts, 2, k_gru, "cuda_gru");
    if (st == EM_OK) st = cuda_register_dtypes(r, "gru_backward", dts, 2, k_gru_bwd, "cuda_gru_backward");
    return st;
}

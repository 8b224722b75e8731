/*
 * cpu_rnn.c — CPU kernels of the fused lstm and gru ops and their backwards (contracts in
 * core/ops_rnn.c), f32 and f64 with OpenBLAS; f16/bf16 calls take the core's f32 path.
 *
 * Forward: one GEMM projects the input of every step at once (x (T N, I) times W_ih^T, over
 * the bias rows) into the gate columns of the workspace; then each step adds its hidden
 * product h (N, H) W_hh^T with one GEMM and runs the gate nonlinearities and the state
 * update elementwise, over the batch rows in parallel. Backward walks the steps the other
 * way: the elementwise part gives the pre-activation gradients of the step, and one GEMM
 * dG W_hh carries the gradient to the previous hidden state. Untaken steps (t >= lengths[b])
 * leave their rows of the state alone, and write zeros.
 */
#include "config.h" /* EM_HAVE_LIBMVEC */

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu.h"

typedef struct rnn_geom {
    int64_t L, N, Ki, H; /* steps, batch, input size, hidden size */
    const int64_t *len; /* (N) or NULL */
    bool reverse;
} rnn_geom;

/* Threads for a step's elementwise part of `work` element operations. */
static int rnn_threads(const em_kernel_ctx *k, int64_t work) {
    int nt = cpu_threads(k);
    return nt > 1 && work >= CPU_GRAIN ? nt : 1;
}

/* The geometry from the sequence operand (x or a gradient, (T, N, *)), the weight (G H,
 * I + H) and the lengths operand; lengths outside [0, T] are an error naming the entry. */
static em_status rnn_geom_of(const em_kernel_ctx *k, int iseq, int iw, int ilen, int64_t H,
                             rnn_geom *g) {
    const em_ktensor *seq = &k->in[iseq], *w = &k->in[iw], *len = &k->in[ilen];
    g->L = seq->shape[0], g->N = seq->shape[1], g->H = H, g->Ki = w->shape[1] - H;
    g->len = len->numel ? (const int64_t *)len->data : NULL;
    g->reverse = k->attrs[0].v.b;
    for (int64_t b = 0; g->len && b < g->N; b++)
        if (g->len[b] < 0 || g->len[b] > g->L)
            return em_set_error(EM_ERR_INVALID, "%s: lengths[%lld] is %lld; expected 0 to the "
                                "sequence length %lld", em_op_name(k->op), (long long)b,
                                (long long)g->len[b], (long long)g->L);
    return EM_OK;
}

#define T float
#define S(name) name##_f32
#define GEMM cblas_sgemm
#define EXP expf
#define TANH tanhf
#define SIMD_CELLS CPU_RNN_SIMD
#include "cpu_rnn_loops.h"
#undef T
#undef S
#undef GEMM
#undef EXP
#undef TANH
#undef SIMD_CELLS

#define T double
#define S(name) name##_f64
#define GEMM cblas_dgemm
#define EXP exp
#define TANH tanh
#define SIMD_CELLS 0
#include "cpu_rnn_loops.h"
#undef T
#undef S
#undef GEMM
#undef EXP
#undef TANH
#undef SIMD_CELLS

static bool f64(const em_kernel_ctx *k) { return k->out[0].dtype == EM_F64; }

static em_status k_lstm(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 0, 3, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? lstm_fwd_f64(k, &g) : lstm_fwd_f32(k, &g);
}

static em_status k_lstm_bwd(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 4, 3, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? lstm_bwd_f64(k, &g) : lstm_bwd_f32(k, &g);
}

static em_status k_gru(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 0, 2, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? gru_fwd_f64(k, &g) : gru_fwd_f32(k, &g);
}

static em_status k_gru_bwd(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 3, 2, 4, k->out[2].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? gru_bwd_f64(k, &g) : gru_bwd_f32(k, &g);
}

em_status cpu_register_rnn(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    em_status st = cpu_register_kernels(r, "lstm", dts, 2, k_lstm, "cpu_lstm_gemm");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "lstm_backward", dts, 2, k_lstm_bwd, "cpu_lstm_backward_gemm");
    if (st == EM_OK) st = cpu_register_kernels(r, "gru", dts, 2, k_gru, "cpu_gru_gemm");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "gru_backward", dts, 2, k_gru_bwd, "cpu_gru_backward_gemm");
    return st;
}

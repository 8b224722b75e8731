/*
 * cuda_gemm.cuh — a row-major batched GEMM on the dlopen()ed cuBLAS, for the fused kernels
 * that run their own products (attention, the recurrent cells): the cblas_?gemm(CblasRowMajor)
 * calls of the CPU's loops, one for one.
 *
 *   C[b] (M, N) = alpha op(A[b]) op(B[b]) + beta C[b]     b < batch
 *
 * with A stored (M, K) row-major (lda) or, when ta, (K, M); B stored (K, N) (ldb) or, when tb,
 * (N, K); C (M, N) with row stride ldc; batch strides sa, sb, sc in elements. Row-major C is
 * column-major C^T = op(B)^T op(A)^T, so the call passes B before A. f32 computes in f32 (TF32
 * only under the "high" matmul precision setting, as the matmul kernels), f64 in f64. K == 0
 * gives beta C (zeros for beta 0), written here: cuBLAS leaves C alone then.
 */
#ifndef EMBER_CUDA_GEMM_CUH
#define EMBER_CUDA_GEMM_CUH

#include "cuda_kernels.cuh"

template <class T> struct cg_scale_op {
    CK_OP_TYPES(T, T, ck_nil, ck_nil, 1)
    T beta;
    __device__ T operator()(T c, ck_nil, ck_nil) const { return beta == 0 ? (T)0 : c * beta; }
};

template <class T>
static em_status cg_gemm(const em_kernel_ctx *k, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                         double alpha, const T *A, int64_t lda, int64_t sa, const T *B, int64_t ldb,
                         int64_t sb, double beta, T *C, int64_t ldc, int64_t sc, int64_t batch) {
    const char *op = em_op_name(k->op);
    if (M == 0 || N == 0 || batch == 0) return EM_OK;
    if (K == 0) { /* beta C over the (batch, M, N) view */
        em_ktensor c;
        memset(&c, 0, sizeof c);
        c.data = C, c.dtype = ck_tr<T>::dt, c.ndim = 3, c.numel = batch * M * N;
        c.shape[0] = batch, c.shape[1] = M, c.shape[2] = N;
        c.strides[0] = sc, c.strides[1] = ldc, c.strides[2] = 1;
        return ck_ew_run(k, op, cg_scale_op<T>{(T)beta}, &c, &c);
    }
    const cuda_blas_table *L = cuda_blas();
    if (!L)
        return em_set_error(EM_ERR_DEVICE, "%s: cuBLAS is not loaded on this process (no CUDA "
                            "device was found when the plugin registered)", op);
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX || lda > INT32_MAX ||
        ldb > INT32_MAX || ldc > INT32_MAX)
        return em_set_error(EM_ERR_RANGE, "%s: a GEMM of (%lld, %lld, %lld, batch %lld) exceeds "
                            "cuBLAS's int range", op, (long long)M, (long long)N, (long long)K,
                            (long long)batch);
    bool f64 = ck_tr<T>::dt == EM_F64;
    cudaDataType dt = f64 ? CUDA_R_64F : CUDA_R_32F;
    cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F
                             : cuda_allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    float af = (float)alpha, bf = (float)beta;
    const void *pa = f64 ? (const void *)&alpha : (const void *)&af;
    const void *pb = f64 ? (const void *)&beta : (const void *)&bf;
    (void)cuda_stream_of(k); /* makes k's device current; the handle is bound to its stream */
    cublasStatus_t bs = L->cublasGemmStridedBatchedEx(
        cuda_exec_of(k)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
        (int)N, (int)M, (int)K, pa, B, dt, (int)ldb, (long long)sb, A, dt, (int)lda, (long long)sa,
        pb, C, dt, (int)ldc, (long long)sc, (int)batch, ct, CUBLAS_GEMM_DEFAULT);
    em_status st = cuda_check_blas(k, bs, "cublasGemmStridedBatchedEx");
    return st != EM_OK ? st : CK_CHECK(k, "cublasGemmStridedBatchedEx");
}

/* Every operand of k contiguous (the fused ops' contract: the public functions copy). */
static inline em_status cg_check_dense(const em_kernel_ctx *k) {
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (!t->contiguous)
            return em_set_error(EM_ERR_INVALID, "%s: the CUDA kernel needs contiguous operands; "
                                "%s %d is strided (call the em_ function, which copies)",
                                em_op_name(k->op), i < k->n_in ? "input" : "output",
                                i < k->n_in ? i : i - k->n_in);
    }
    return EM_OK;
}

#endif /* EMBER_CUDA_GEMM_CUH */

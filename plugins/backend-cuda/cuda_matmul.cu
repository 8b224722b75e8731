/*
 * cuda_matmul.cu — bmm and addmm on CUDA through cuBLAS (cublasGemmStridedBatchedEx from the
 * dlopen()ed table, cuda_blas()); matmul, mm and linear are the core's composites over them.
 *
 * y = alpha a b + beta y for a (M, K) / (B, M, K), b (K, N) / (B, K, N), y (M, N) / (B, M, N)
 * in y's dtype: f32 (compute f32, or TF32 when the backend's "set_float32_matmul_precision"
 * setting is "high"; "highest", full f32, is the default as in PyTorch), f64, f16 and bf16
 * (accumulated in f32). Row-major operands are handed to cuBLAS as the transposes of
 * column-major ones (y^T = b^T a^T), so a and b may be row-major or column-major views (a
 * transposed weight, as linear passes it) with any leading stride and any batch stride,
 * broadcast batches included; other layouts are copied into workspace first. y needs a unit
 * column stride (what the core allocates; supports() declines others, as the CPU does).
 * addmm fills y with the broadcast bias first and runs the GEMM with beta; with beta == 0 the
 * bias is not read.
 */
#include "cuda_kernels.cuh"

/* One operand as cuBLAS sees it: pointer, whether it is transposed relative to the
 * column-major view, leading dimension and batch stride (elements). */
struct gemm_arg {
    const void *p;
    bool trans;
    int64_t ld, bs;
};

template <class T> struct ck_copy_raw {
    CK_OP_TYPES(T, T, ck_nil, ck_nil, 1)
    __device__ T operator()(T x, ck_nil, ck_nil) const { return x; }
};
static em_status copy_raw(const em_kernel_ctx *k, const em_ktensor *y, const em_ktensor *x) {
    switch (em_dtype_size(y->dtype)) {
    case 2: return ck_ew_run(k, em_op_name(k->op), ck_copy_raw<uint16_t>(), y, x);
    case 4: return ck_ew_run(k, em_op_name(k->op), ck_copy_raw<uint32_t>(), y, x);
    default: return ck_ew_run(k, em_op_name(k->op), ck_copy_raw<uint64_t>(), y, x);
    }
}

/* The matrix t (last two dims R x C, a batch dim before them or none) for cuBLAS. As the
 * col-major view: a row-major matrix (unit column stride) is its transpose with ld = row
 * stride; a column-major one (unit row stride) is itself with ld = column stride. `want_t`
 * says which the caller needs: for y^T = b^T a^T both a and b are wanted transposed. */
static em_status gemm_operand(const em_kernel_ctx *k, const em_ktensor *t, gemm_arg *g) {
    int nd = t->ndim;
    int64_t R = t->shape[nd - 2], C = t->shape[nd - 1];
    int64_t s0 = t->strides[nd - 2], s1 = t->strides[nd - 1];
    g->bs = nd == 3 ? t->strides[0] : 0;
    if (nd == 3 && t->shape[0] == 1) g->bs = 0;
    bool rowmaj = (s1 == 1 || C <= 1) && (R <= 1 || s0 >= (C > 1 ? C : 1));
    bool colmaj = (s0 == 1 || R <= 1) && (C <= 1 || s1 >= (R > 1 ? R : 1));
    if (rowmaj) { /* the col-major view is t^T (C x R): no transpose for "wanted transposed" */
        g->p = t->data;
        g->trans = false;
        g->ld = R <= 1 ? (C > 1 ? C : 1) : s0;
        return EM_OK;
    }
    if (colmaj) {
        g->p = t->data;
        g->trans = true;
        g->ld = C <= 1 ? (R > 1 ? R : 1) : s1;
        return EM_OK;
    }
    /* Any other layout: a dense row-major copy in workspace. */
    size_t e = em_dtype_size(t->dtype);
    void *buf = ck_scratch(k, (size_t)t->numel * e);
    if (!buf) return em_last_status();
    em_ktensor dst = *t;
    dst.data = buf;
    dst.contiguous = true;
    int64_t st = 1;
    for (int d = nd - 1; d >= 0; d--) dst.strides[d] = st, st *= dst.shape[d];
    em_status s = copy_raw(k, &dst, t);
    if (s != EM_OK) return s;
    g->p = buf;
    g->trans = false;
    g->ld = C > 1 ? C : 1;
    g->bs = nd == 3 && t->shape[0] > 1 ? R * C : 0;
    return EM_OK;
}

static em_status gemm(const em_kernel_ctx *k, const em_ktensor *a, const em_ktensor *b,
                      const em_ktensor *y, double alpha, double beta) {
    const cuda_blas_table *L = cuda_blas();
    const char *op = em_op_name(k->op);
    if (!L)
        return em_set_error(EM_ERR_DEVICE, "%s: cuBLAS is not loaded on this process (no CUDA "
                            "device was found when the plugin registered)", op);
    int nd = y->ndim;
    int64_t B = nd == 3 ? y->shape[0] : 1, M = y->shape[nd - 2], N = y->shape[nd - 1];
    int64_t K = a->shape[a->ndim - 1];
    if (y->numel == 0) return EM_OK;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || B > INT32_MAX)
        return em_set_error(EM_ERR_RANGE, "%s: a dimension of (%lld, %lld, %lld, batch %lld) "
                            "exceeds cuBLAS's int range", op, (long long)M, (long long)N,
                            (long long)K, (long long)B);
    gemm_arg ga, gb;
    em_status st = gemm_operand(k, a, &ga);
    if (st == EM_OK) st = gemm_operand(k, b, &gb);
    if (st != EM_OK) return st;
    int64_t ldy = M <= 1 ? (N > 1 ? N : 1) : y->strides[nd - 2];
    int64_t bsy = nd == 3 ? y->strides[0] : 0;
    cudaDataType dt;
    cublasComputeType_t ct;
    float af = (float)alpha, bf = (float)beta;
    const void *pa = &af, *pb = &bf;
    switch (y->dtype) {
    case EM_F32: dt = CUDA_R_32F; ct = cuda_allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F; break;
    case EM_F64: dt = CUDA_R_64F; ct = CUBLAS_COMPUTE_64F; pa = &alpha, pb = &beta; break;
    case EM_F16: dt = CUDA_R_16F; ct = CUBLAS_COMPUTE_32F; break;
    case EM_BF16: dt = CUDA_R_16BF; ct = CUBLAS_COMPUTE_32F; break;
    default: return ck_no_dtype(k, y->dtype);
    }
    (void)cuda_stream_of(k); /* makes k's device current; the handle is bound to its stream */
    const cuda_exec *E = cuda_exec_of(k);
    /* y^T (N x M, col-major, ld ldy) = op(b') op(a'), where b' / a' are the col-major views. */
    cublasStatus_t bs = L->cublasGemmStridedBatchedEx(
        E->blas, gb.trans ? CUBLAS_OP_T : CUBLAS_OP_N, ga.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
        (int)N, (int)M, (int)K, pa, gb.p, dt, (int)gb.ld, (long long)gb.bs, ga.p, dt, (int)ga.ld,
        (long long)ga.bs, pb, y->data, dt, (int)ldy, (long long)bsy, (int)B, ct,
        CUBLAS_GEMM_DEFAULT);
    st = cuda_check_blas(k, bs, "cublasGemmStridedBatchedEx");
    if (st != EM_OK) return st;
    return CK_CHECK(k, "cublasGemmStridedBatchedEx");
}

/* GEMM needs its output with unit column stride and rows apart by at least a row. */
static bool gemm_supports(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    int n = y->ndim;
    if (n < 2) return false;
    return (y->strides[n - 1] == 1 || y->shape[n - 1] <= 1) &&
           (y->shape[n - 2] <= 1 || y->strides[n - 2] >= y->shape[n - 1]);
}

static em_status k_bmm(const em_kernel_ctx *k) { return gemm(k, &k->in[0], &k->in[1], &k->out[0], 1.0, 0.0); }

static em_status k_addmm(const em_kernel_ctx *k) {
    const em_ktensor *bias = &k->in[0], *y = &k->out[0];
    double beta = ck_attr_f(k, 0, 1.0), alpha = ck_attr_f(k, 1, 1.0);
    if (beta != 0 && y->numel > 0) {
        em_status st = copy_raw(k, y, bias);
        if (st != EM_OK) return st;
    }
    return gemm(k, &k->in[1], &k->in[2], y, alpha, beta);
}
/* The output must not overlap the bias it is filled from. */
static bool addmm_supports(const em_kernel_ctx *k) {
    return gemm_supports(k) && k->out[0].data != k->in[0].data;
}

em_status cuda_register_matmul(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_BF16, EM_F16};
    em_status st = EM_OK;
    for (int i = 0; i < 4 && st == EM_OK; i++)
        for (int j = 0; j < 2 && st == EM_OK; j++) {
            char name[48];
            snprintf(name, sizeof name, "cuda_%s_%s", j ? "addmm" : "bmm", em_dtype_name(dts[i]));
            em_kernel_def def;
            memset(&def, 0, sizeof def);
            def.struct_size = sizeof def;
            def.op = j ? "addmm" : "bmm";
            def.device_type = "cuda";
            def.dtype = dts[i];
            def.fn = j ? k_addmm : k_bmm;
            def.supports = j ? addmm_supports : gemm_supports;
            def.name = name;
            st = em_kernel_register(r, &def, NULL);
        }
    return st;
}

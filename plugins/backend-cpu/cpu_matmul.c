/*
 * cpu_matmul.c — batched matrix multiply (the bmm op behind em_matmul) on the CPU through
 * OpenBLAS's cblas_sgemm/dgemm. Operands whose matrices are row-major or transposed
 * (column-major) go to GEMM as they are, with the transpose flag; any other layout is copied
 * to a contiguous scratch buffer first.
 */
#include <cblas.h>
#include <stdio.h>
#include <string.h>

#include "cpu.h"

/* How a (rows, cols) matrix with element strides (rs, cs) can be passed to GEMM. */
typedef struct gemm_operand {
    const void *data;
    CBLAS_TRANSPOSE trans;
    int64_t ld;
    void *scratch; /* owned copy when the layout needed one */
} gemm_operand;

static em_status prepare(gemm_operand *g, const char *base, int64_t rows, int64_t cols,
                         int64_t rs, int64_t cs, size_t e) {
    g->scratch = NULL;
    g->data = base;
    /* A size-1 dim's stride is arbitrary: pick the one that makes the layout dense. */
    if (cols == 1) cs = 1;
    if (rows == 1) rs = (cols > 1 ? cols : 1);
    if (cs == 1 && rs >= (cols > 1 ? cols : 1)) {
        g->trans = CblasNoTrans;
        g->ld = rs;
    } else if (rs == 1 && cs >= (rows > 1 ? rows : 1)) {
        g->trans = CblasTrans;
        g->ld = cs;
    } else {
        char *s = em_host_alloc((size_t)(rows * cols) * e + 1, 64);
        if (!s) return em_set_error(EM_ERR_NOMEM, "matmul: out of memory for a %lldx%lld "
                                    "scratch copy", (long long)rows, (long long)cols);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                memcpy(s + (size_t)(i * cols + j) * e, base + (i * rs + j * cs) * (int64_t)e, e);
        g->scratch = s;
        g->data = s;
        g->trans = CblasNoTrans;
        g->ld = (cols > 1 ? cols : 1);
    }
    return EM_OK;
}

static em_status k_bmm(const em_kernel_ctx *k) {
    const em_ktensor *a = &k->in[0], *b = &k->in[1], *y = &k->out[0];
    int64_t B = a->shape[0], M = a->shape[1], K = a->shape[2], N = b->shape[2];
    size_t e = em_dtype_size(a->dtype);
    for (int64_t i = 0; i < B; i++) {
        char *yp = (char *)y->data + i * y->strides[0] * (int64_t)e;
        if (M == 0 || N == 0) continue;
        if (K == 0) { /* an empty sum: zeros */
            for (int64_t r = 0; r < M; r++)
                for (int64_t c = 0; c < N; c++)
                    memset(yp + (r * y->strides[1] + c * y->strides[2]) * (int64_t)e, 0, e);
            continue;
        }
        gemm_operand ga, gb;
        em_status st = prepare(&ga, (const char *)a->data + i * a->strides[0] * (int64_t)e, M,
                               K, a->strides[1], a->strides[2], e);
        if (st != EM_OK) return st;
        st = prepare(&gb, (const char *)b->data + i * b->strides[0] * (int64_t)e, K, N,
                     b->strides[1], b->strides[2], e);
        if (st != EM_OK) {
            em_host_free(ga.scratch);
            return st;
        }
        /* The output is freshly allocated and contiguous (bmm's outputs come from the core). */
        if (a->dtype == EM_F32)
            cblas_sgemm(CblasRowMajor, ga.trans, gb.trans, (int)M, (int)N, (int)K, 1.0f,
                        ga.data, (int)ga.ld, gb.data, (int)gb.ld, 0.0f, (float *)yp,
                        (int)y->strides[1]);
        else
            cblas_dgemm(CblasRowMajor, ga.trans, gb.trans, (int)M, (int)N, (int)K, 1.0,
                        ga.data, (int)ga.ld, gb.data, (int)gb.ld, 0.0, (double *)yp,
                        (int)y->strides[1]);
        em_host_free(ga.scratch);
        em_host_free(gb.scratch);
    }
    return EM_OK;
}

/* GEMM needs a row-major output with unit column stride (what the core allocates). */
static bool bmm_supports(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    return y->strides[2] == 1 || y->shape[2] <= 1;
}

em_status cpu_register_matmul(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "cpu_bmm_blas_%s", em_dtype_name(dts[i]));
        em_kernel_def def = {.struct_size = sizeof def, .op = "bmm", .device_type = "cpu",
                             .dtype = dts[i], .fn = k_bmm, .supports = bmm_supports,
                             .name = name};
        em_status st = em_kernel_register(r, &def, NULL);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

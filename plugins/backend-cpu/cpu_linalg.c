/*
 * cpu_linalg.c — CPU kernels for the linear algebra ops: addmm (bmm and the GEMM engine itself
 * are in cpu_matmul.c).
 */
#include <stdio.h>
#include <string.h>

#include "cpu.h"

/* y (M, N) = bias (M, N, stride 0 on broadcast dims), element by element. */
static void copy_bias(const em_ktensor *bias, const em_ktensor *y) {
    size_t e = em_dtype_size(y->dtype);
    int64_t M = y->shape[0], N = y->shape[1];
    for (int64_t i = 0; i < M; i++) {
        const char *src = (const char *)bias->data + i * bias->strides[0] * (int64_t)e;
        char *dst = (char *)y->data + i * y->strides[0] * (int64_t)e;
        int64_t cs = bias->strides[1];
        if (cs == 1) {
            memcpy(dst, src, (size_t)N * e);
        } else if (e == 4) {
            for (int64_t j = 0; j < N; j++) ((uint32_t *)dst)[j] = *(const uint32_t *)(src + j * cs * 4);
        } else if (e == 8) {
            for (int64_t j = 0; j < N; j++) ((uint64_t *)dst)[j] = *(const uint64_t *)(src + j * cs * 8);
        } else {
            for (int64_t j = 0; j < N; j++) ((uint16_t *)dst)[j] = *(const uint16_t *)(src + j * cs * 2);
        }
    }
}

static em_status k_addmm(const em_kernel_ctx *k) {
    const em_ktensor *bias = &k->in[0], *y = &k->out[0];
    double beta = k->attrs[0].type == EM_ATTR_FLOAT ? k->attrs[0].v.f : 1.0;
    double alpha = k->attrs[1].type == EM_ATTR_FLOAT ? k->attrs[1].v.f : 1.0;
    if (beta != 0) copy_bias(bias, y);
    return cpu_gemm(&k->in[1], &k->in[2], y, alpha, beta);
}

/* The output must be row-major for GEMM, and must not overlap the bias it is filled from. */
static bool addmm_supports(const em_kernel_ctx *k) {
    return cpu_gemm_supports(k) && k->out[0].data != k->in[0].data;
}

em_status cpu_register_linalg(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_BF16, EM_F16};
    em_status st = EM_OK;
    for (int i = 0; i < 4 && st == EM_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "cpu_addmm_%s", em_dtype_name(dts[i]));
        em_kernel_def def = {.struct_size = sizeof def, .op = "addmm", .device_type = "cpu",
                             .dtype = dts[i], .fn = k_addmm, .supports = addmm_supports,
                             .name = name};
        st = em_kernel_register(r, &def, NULL);
    }
    return st;
}

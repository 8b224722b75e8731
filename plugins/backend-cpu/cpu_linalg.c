/*
 * cpu_linalg.c — CPU kernels for the linear algebra ops: addmm (bmm, the GEMM engine itself and
 * addmm's bias handling are in cpu_matmul.c).
 */
#include <stdio.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu.h"

static em_status k_addmm(const em_kernel_ctx *k) {
    const em_ktensor *bias = &k->in[0], *y = &k->out[0];
    double beta = k->attrs[0].type == EM_ATTR_FLOAT ? k->attrs[0].v.f : 1.0;
    double alpha = k->attrs[1].type == EM_ATTR_FLOAT ? k->attrs[1].v.f : 1.0;
    return cpu_gemm_addmm(k, bias, &k->in[1], &k->in[2], y, alpha, beta);
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

/*
 * cuda_kernels.c — the list of the CUDA kernel families: each file's register function, called
 * by the plugin's registration (cuda_register_kernels), and the helper they share.
 */
#include <stdio.h>

#include "cuda_internal.h"
#include "ember/dtype.h"

em_status cuda_register_dtypes(em_registry *r, const char *op, const em_dtype *dts, int n,
                               em_kernel_fn fn, const char *name) {
    for (int i = 0; i < n; i++) {
        char kname[96];
        snprintf(kname, sizeof kname, "%s_%s", name, em_dtype_name(dts[i]));
        em_kernel_def def = {.struct_size = sizeof def, .op = op, .device_type = "cuda",
                             .dtype = dts[i], .fn = fn, .name = kname};
        em_status st = em_kernel_register(r, &def, NULL);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

em_status cuda_register_kernels(em_registry *r) {
    em_status (*const families[])(em_registry *) = {
        cuda_register_copy,    cuda_register_elementwise, cuda_register_math,
        cuda_register_reduce,  cuda_register_loss,        cuda_register_softmax,
        cuda_register_index,   cuda_register_optim,       cuda_register_random,
        cuda_register_matmul,
        /* the fused ops: layer norm, attention, the recurrent cells, the scaler */
        cuda_register_layernorm, cuda_register_attention,   cuda_register_rnn,
        cuda_register_amp,
        cuda_register_nn,      cuda_register_conv, /* the direct kernels first: cuDNN's go above */
    };
    em_status st = EM_OK;
    for (size_t i = 0; i < sizeof families / sizeof *families && st == EM_OK; i++)
        st = families[i](r);
    return st;
}

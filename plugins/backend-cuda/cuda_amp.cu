/*
 * cuda_amp.cu — amp_unscale_, the gradient scaler's fused check-and-unscale (contract in
 * core/ops_optim.c), on CUDA with the CPU's arithmetic (plugins/backend-cpu/cpu_optim.c):
 * per grad, every element g becomes g * inv_scale (in float for f32, f16 and bf16 grads,
 * rounded back once; in double for f64, inv_scale widened from its float), its finiteness
 * tested before the product; the grad's 0-dim float32 flag becomes 1 when some element was
 * inf or NaN, else 0.
 *
 * One elementwise launch per grad (any strides, through the shared engine), in place; the
 * flag is zeroed on the stream first and set to 1.0f by every thread that sees a non-finite
 * element (they all store the same value). Nothing is read back to the host: the scaler reads
 * the flags when it decides to skip the step.
 */
#include "cuda_kernels.cuh"

template <class T> struct unscale_op {
    CK_OP_TYPES(T, T, ck_nil, ck_nil, 1)
    typedef typename ck_tr<T>::F CT;
    CT inv;
    float *flag;
    __device__ T operator()(T g, ck_nil, ck_nil) const {
        CT v = ck_cv<T, CT>::in(g);
        if (!isfinite(v)) *flag = 1.0f;
        return ck_cv<T, CT>::out(v * inv);
    }
};

static em_status k_amp_unscale(const em_kernel_ctx *k) {
    int count = k->n_out / 2;
    double inv = k->attrs[0].v.f;
    cudaStream_t s = cuda_stream_of(k);
    for (int j = 0; j < count; j++) {
        const em_ktensor *g = &k->out[j], *flag = &k->out[count + j];
        if (flag->dtype != EM_F32)
            return em_set_error(EM_ERR_DTYPE, "amp_unscale_: found_inf flag %d is %s; the "
                                "flags are float32", j, em_dtype_name(flag->dtype));
        em_status st = ck_rt(k, cudaMemsetAsync(flag->data, 0, sizeof(float), s), "cudaMemsetAsync");
        if (st != EM_OK) return st;
        float *f = (float *)flag->data;
        switch (g->dtype) {
        case EM_F32: st = ck_ew_run(k, "amp_unscale_", unscale_op<float>{(float)inv, f}, g, g); break;
        case EM_F64: st = ck_ew_run(k, "amp_unscale_", unscale_op<double>{(double)(float)inv, f}, g, g); break;
        case EM_F16: st = ck_ew_run(k, "amp_unscale_", unscale_op<ck_h>{(float)inv, f}, g, g); break;
        case EM_BF16: st = ck_ew_run(k, "amp_unscale_", unscale_op<ck_b>{(float)inv, f}, g, g); break;
        default: return ck_no_dtype(k, g->dtype);
        }
        if (st != EM_OK) return st;
    }
    return CK_CHECK(k, "amp_unscale_");
}

em_status cuda_register_amp(em_registry *r) {
    return cuda_register_dtypes(r, "amp_unscale_", ck_flt, CK_N(ck_flt), k_amp_unscale,
                                "cuda_amp_unscale");
}

/*
 * cuda_optim.cu — the fused optimizer steps (fused_sgd, fused_adam, fused_adamw; contracts in
 * core/ops_optim.c) on CUDA, with the arithmetic of the CPU's loops
 * (plugins/backend-cpu/cpu_optim.c) operation for operation: every product and sum rounds to
 * the compute type (float for f32/f16/bf16 params, double for f64), and this file is compiled
 * without contractions (--fmad=false), sqrt and division correctly rounded (nvcc's defaults),
 * so an update gives the CPU's bits.
 *
 * One call updates every tensor of its lists: one launch per tensor (the operands of tensor j
 * share out[j]'s shape; each may have its own strides and, for states and master weights of
 * f16/bf16 params, its own dtype), one thread per element. f16/bf16 params with f32 master
 * weights update the master and store the param rounded from it; where the param is no longer
 * the master rounded (changed outside the optimizer), the param's value is taken first.
 *
 * The capturable forms (fused_sgd_capturable, fused_adam(w)_capturable) read the lr, and
 * Adam's step count, from device memory: thread 0 of each block forms the scalars that depend
 * on them (dev_scalars: the plain forms' host lines, in double, rounded to the compute type)
 * and the block reads them from shared memory; after a call's updates, one single-thread
 * launch per tensor adds 1 to its count. Nothing is read on the host, so a captured graph
 * replays with the lr and count of each replay. The bias corrections use the device's double
 * pow (within 2 ulp of the correctly rounded value by CUDA's documentation, where glibc's is
 * correctly rounded in nearly all cases): after rounding to float the scalars are almost
 * always the host's bits; in f64 they may differ in the last bit.
 */
#include "cuda_kernels.cuh"

#define MAX_OPS 6 /* weight (master or param), param (with a master), grad, up to 3 states */

struct operand {
    char *p;
    em_dtype dt;
    bool contiguous;
    int64_t st[EM_MAX_DIMS];
};

struct step {
    int nd;
    int64_t shape[EM_MAX_DIMS];
    int64_t n;
    operand op[MAX_OPS]; /* 0 weight, 1 param (master mode; p NULL otherwise), 2 grad, 3.. states */
    int nstates;
    bool adam;
    /* sgd */
    bool mom, fresh, nest, wd;
    /* adam */
    bool ams, dec;
    double s[10]; /* the scalars: sgd (neg_lr, momentum, 1-damp, wd, sign); adam (b1, 1-b1,
                     b2, 1-b2, eps, wd, decay, bc2_sqrt, -step_size, sign) */
    /* the capturable forms: the lr (and Adam's step count before this update) in device
     * memory; the scalars that depend on them (sgd: s[0]; adam: s[6], s[7], s[8]) are formed
     * on the device, as the plain forms' host code forms them from the attributes */
    const double *lr_p;
    double *step_p;
    double raw_b1, raw_b2, raw_wd; /* adam: the attributes unrounded (s[]: rounded for float) */
};

/* The capturable forms' scalars (device code of fused_adam's / fused_sgd's host lines), each
 * rounded to the compute type as the host's are. */
template <class CT> __device__ void dev_scalars(const step &S, double *s) {
    for (int i = 0; i < 10; i++) s[i] = S.s[i];
    double lr = *S.lr_p;
    if (!S.adam) {
        s[0] = (double)(CT)-lr;
        return;
    }
    double b1 = S.raw_b1, b2 = S.raw_b2, wd = S.raw_wd;
    double stp = *S.step_p + 1; /* the count after this update */
    double bc1 = 1 - pow(b1, stp), bc2_sqrt = sqrt(1 - pow(b2, stp)), step_size = lr / bc1;
    double decay = 1 - lr * wd;
    s[6] = (double)(CT)decay;
    s[7] = (double)(CT)bc2_sqrt;
    s[8] = (double)(CT)-step_size;
}

/* After a capturable Adam tensor's update: its step count + 1. */
__global__ void step_count_kernel(double *step) { *step += 1; }

__device__ __forceinline__ int64_t eoff(const step &S, const operand &o, int64_t i) {
    return o.contiguous ? i : ck_offset(S.nd, S.shape, o.st, i);
}

template <class CT> __device__ __forceinline__ CT ld(const operand &o, int64_t off) {
    switch (o.dt) {
    case EM_F32: return (CT)((const float *)o.p)[off];
    case EM_F64: return (CT)((const double *)o.p)[off];
    case EM_F16: return (CT)ck_f16_to_f32(((const uint16_t *)o.p)[off]);
    default: return (CT)ck_bf16_to_f32(((const uint16_t *)o.p)[off]);
    }
}
template <class CT> __device__ __forceinline__ void st(const operand &o, int64_t off, CT v) {
    switch (o.dt) {
    case EM_F32: ((float *)o.p)[off] = (float)v; break;
    case EM_F64: ((double *)o.p)[off] = (double)v; break;
    case EM_F16: ((uint16_t *)o.p)[off] = ck_f32_to_f16((float)v); break;
    default: ((uint16_t *)o.p)[off] = ck_f32_to_bf16((float)v); break;
    }
}

template <class CT>
__global__ void step_kernel(step S) {
    __shared__ double sh[10]; /* the scalars; capturable: formed once per block on the device */
    if (threadIdx.x == 0) {
        if (S.lr_p) dev_scalars<CT>(S, sh);
        else
            for (int k = 0; k < 10; k++) sh[k] = S.s[k];
    }
    __syncthreads();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < S.n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t o0 = eoff(S, S.op[0], i), o2 = eoff(S, S.op[2], i);
        CT x = ld<CT>(S.op[0], o0);
        int64_t o1 = 0;
        if (S.op[1].p) { /* master weights: resync where the param changed outside */
            o1 = eoff(S, S.op[1], i);
            uint16_t have = ((const uint16_t *)S.op[1].p)[o1];
            bool h = S.op[1].dt == EM_F16;
            uint16_t want = h ? ck_f32_to_f16((float)x) : ck_f32_to_bf16((float)x);
            if (have != want) x = (CT)(h ? ck_f16_to_f32(have) : ck_bf16_to_f32(have));
        }
        CT d;
        {
            CT g = ld<CT>(S.op[2], o2), sign = (CT)sh[S.adam ? 9 : 4];
            d = g * sign;
        }
        if (!S.adam) {
            const CT neg_lr = (CT)sh[0], mom = (CT)sh[1], omd = (CT)sh[2], wd = (CT)sh[3];
            if (S.wd) {
                CT dw = x * wd;
                d = d + dw;
            }
            if (S.mom) {
                int64_t ob = eoff(S, S.op[3], i);
                CT b;
                if (S.fresh) {
                    b = d;
                } else {
                    CT bm = ld<CT>(S.op[3], ob) * mom, dd = d * omd;
                    b = bm + dd;
                }
                st<CT>(S.op[3], ob, b);
                if (S.nest) {
                    CT bn = b * mom;
                    d = d + bn;
                } else {
                    d = b;
                }
            }
            CT stp = d * neg_lr;
            x = x + stp;
        } else {
            const CT b1 = (CT)sh[0], omb1 = (CT)sh[1], b2 = (CT)sh[2], omb2 = (CT)sh[3];
            const CT eps = (CT)sh[4], wd = (CT)sh[5], decay = (CT)sh[6], bc2 = (CT)sh[7];
            const CT nss = (CT)sh[8];
            if (S.dec) {
                x = x * decay;
            } else if (S.wd) {
                CT dw = x * wd;
                d = d + dw;
            }
            int64_t om = eoff(S, S.op[3], i), ov = eoff(S, S.op[4], i);
            CT m1 = ld<CT>(S.op[3], om) * b1, m2 = d * omb1;
            CT mm = m1 + m2;
            CT v1 = ld<CT>(S.op[4], ov) * b2, dd = d * d;
            CT v2 = dd * omb2;
            CT vv = v1 + v2;
            st<CT>(S.op[3], om, mm);
            st<CT>(S.op[4], ov, vv);
            CT sq = vv;
            if (S.ams) {
                int64_t ox = eoff(S, S.op[5], i);
                CT o = ld<CT>(S.op[5], ox);
                sq = o > vv || o != o ? o : vv; /* em_maximum: NaN propagates */
                st<CT>(S.op[5], ox, sq);
            }
            CT den = sqrt(sq) / bc2;
            den = den + eps;
            CT q = mm / den;
            CT stp = q * nss;
            x = x + stp;
        }
        st<CT>(S.op[0], o0, x);
        if (S.op[1].p) st<CT>(S.op[1], o1, x);
    }
}

/* ---- checks (cpu_optim.c's build_items) and launches ------------------------------------------ */

static operand operand_of(const em_ktensor *t) {
    operand o;
    memset(&o, 0, sizeof o);
    o.p = (char *)t->data;
    o.dt = t->dtype;
    o.contiguous = t->contiguous;
    for (int d = 0; d < t->ndim; d++) o.st[d] = t->strides[d];
    return o;
}

/* Tensor j of a capturable form's scalar list (lr, steps): a 0-dim float64 tensor. */
static em_status scalar_check(const em_kernel_ctx *k, const em_ktensor *t, const char *list,
                              int j) {
    if (!t->data)
        return em_set_error(EM_ERR_INVALID, "%s: the %s list is required", em_op_name(k->op),
                            list);
    if (t->dtype != EM_F64 || t->ndim != 0)
        return em_set_error(EM_ERR_DTYPE, "%s: %s %d is %s with %d dims; it must be a 0-dim "
                            "float64 tensor", em_op_name(k->op), list, j,
                            em_dtype_name(t->dtype), t->ndim);
    return EM_OK;
}

/* capturable: input list 1 holds the lrs, and (Adam) output list 3 the step counts, with no
 * master list. */
static em_status run_fused(const em_kernel_ctx *k, step &base, int n_states,
                           const char *const *names, const bool *required,
                           bool capturable = false) {
    const char *op = em_op_name(k->op);
    int count = k->n_out / em_op_schema_of(k->op)->n_outputs;
    const em_ktensor *params = k->out, *grads = k->in;
    static const em_ktensor none = {};
    bool cap_adam = capturable && base.adam;
    const em_ktensor *master = cap_adam ? &none : k->out + (size_t)(1 + n_states) * (size_t)count;
    const em_ktensor *lrs = capturable ? k->in + count : NULL;
    const em_ktensor *steps = cap_adam ? k->out + (size_t)(1 + n_states) * (size_t)count : NULL;
    for (int j = 0; capturable && j < count; j++) {
        em_status e = scalar_check(k, &lrs[j], "lr", j);
        if (e == EM_OK && steps) e = scalar_check(k, &steps[j], "steps", j);
        if (e != EM_OK) return e;
    }
    em_dtype pdt = params[0].dtype;
    bool low = pdt == EM_F16 || pdt == EM_BF16;
    if (master[0].data && !low)
        return em_set_error(EM_ERR_DTYPE, "%s: master weights are for f16 and bf16 params; the "
                            "params are %s", op, em_dtype_name(pdt));
    bool has[3] = {false, false, false};
    for (int s = 0; s < n_states; s++) {
        has[s] = k->out[(size_t)(1 + s) * (size_t)count].data != NULL;
        if (required[s] && !has[s])
            return em_set_error(EM_ERR_INVALID, "%s: the %s list is required here", op, names[s]);
    }
    /* Check every tensor before updating any. */
    for (int j = 0; j < count; j++) {
        const em_ktensor *m = master[0].data ? &master[j] : NULL;
        if (grads[j].dtype != pdt)
            return em_set_error(EM_ERR_DTYPE, "%s: grad %d is %s but its param is %s", op, j,
                                em_dtype_name(grads[j].dtype), em_dtype_name(pdt));
        if (m && m->dtype != EM_F32)
            return em_set_error(EM_ERR_DTYPE, "%s: master weight %d is %s; master weights are "
                                "f32", op, j, em_dtype_name(m->dtype));
        for (int s = 0; s < n_states; s++) {
            const em_ktensor *t = &k->out[(size_t)(1 + s) * (size_t)count + (size_t)j];
            if (has[s] && t->dtype != pdt && !(low && t->dtype == EM_F32))
                return em_set_error(EM_ERR_DTYPE, "%s: %s %d is %s; for %s params it must be %s",
                                    op, names[s], j, em_dtype_name(t->dtype), em_dtype_name(pdt),
                                    low ? "f32 or the params' dtype" : "the params' dtype");
        }
    }
    cudaStream_t s = cuda_stream_of(k);
    bool f64 = pdt == EM_F64;
    for (int j = 0; j < count; j++) {
        const em_ktensor *p = &params[j];
        if (p->numel == 0) continue;
        step S = base;
        S.nd = p->ndim;
        S.n = p->numel;
        for (int d = 0; d < p->ndim; d++) S.shape[d] = p->shape[d];
        const em_ktensor *m = master[0].data ? &master[j] : NULL;
        S.op[0] = operand_of(m ? m : p);
        memset(&S.op[1], 0, sizeof S.op[1]);
        if (m) S.op[1] = operand_of(p);
        S.op[2] = operand_of(&grads[j]);
        for (int st = 0; st < n_states; st++) {
            memset(&S.op[3 + st], 0, sizeof S.op[3 + st]);
            if (has[st]) S.op[3 + st] = operand_of(&k->out[(size_t)(1 + st) * (size_t)count + (size_t)j]);
        }
        if (capturable) S.lr_p = (const double *)lrs[j].data;
        if (steps) S.step_p = (double *)steps[j].data;
        if (f64) step_kernel<double><<<ck_blocks(S.n, 1), CK_THREADS, 0, s>>>(S);
        else step_kernel<float><<<ck_blocks(S.n, 1), CK_THREADS, 0, s>>>(S);
        em_status e = CK_CHECK(k, op);
        if (e != EM_OK) return e;
    }
    /* the counts after every tensor's update (an empty tensor's count moves too) */
    for (int j = 0; steps && j < count; j++) {
        step_count_kernel<<<1, 1, 0, s>>>((double *)steps[j].data);
        em_status e = CK_CHECK(k, op);
        if (e != EM_OK) return e;
    }
    return EM_OK;
}

static step step_base(void) {
    step S;
    memset(&S, 0, sizeof S);
    return S;
}

static em_status k_fused_sgd(const em_kernel_ctx *k) {
    double lr = ck_attr_f(k, 0, 0), mom = ck_attr_f(k, 1, 0), damp = ck_attr_f(k, 2, 0),
           wd = ck_attr_f(k, 3, 0);
    bool nesterov = ck_attr_b(k, 4, false), maximize = ck_attr_b(k, 5, false), fresh = ck_attr_b(k, 6, false);
    step S = step_base();
    S.mom = mom != 0, S.fresh = fresh, S.nest = nesterov, S.wd = wd != 0;
    /* The scalars as the CPU rounds them: to float for float compute (the kernel's (CT) cast of
     * a double holding a float is exact), double for f64. */
    bool f64 = k->out[0].dtype == EM_F64;
    double v[5] = {-lr, mom, 1 - damp, wd, maximize ? -1.0 : 1.0};
    for (int i = 0; i < 5; i++) S.s[i] = f64 ? v[i] : (double)(float)v[i];
    static const char *const names[] = {"momentum_buffer"};
    const bool required[] = {mom != 0};
    return run_fused(k, S, 1, names, required);
}

static em_status fused_adam(const em_kernel_ctx *k, bool decoupled) {
    double lr = ck_attr_f(k, 0, 0), b1 = ck_attr_f(k, 1, 0), b2 = ck_attr_f(k, 2, 0),
           eps = ck_attr_f(k, 3, 0), wd = ck_attr_f(k, 4, 0), stp = ck_attr_f(k, 5, 0);
    bool amsgrad = ck_attr_b(k, 6, false), maximize = ck_attr_b(k, 7, false);
    if (!(stp >= 1))
        return em_set_error(EM_ERR_INVALID, "%s: step must be at least 1 (the count after this "
                            "update); got %g", em_op_name(k->op), stp);
    double bc1 = 1 - pow(b1, stp), bc2_sqrt = sqrt(1 - pow(b2, stp)), step_size = lr / bc1;
    double decay = 1 - lr * wd;
    step S = step_base();
    S.adam = true;
    S.ams = amsgrad, S.dec = decoupled, S.wd = wd != 0;
    bool f64 = k->out[0].dtype == EM_F64;
    double v[10] = {b1, 1 - b1, b2, 1 - b2, eps, wd, decay, bc2_sqrt, -step_size,
                    maximize ? -1.0 : 1.0};
    for (int i = 0; i < 10; i++) S.s[i] = f64 ? v[i] : (double)(float)v[i];
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    const bool required[] = {true, true, amsgrad};
    return run_fused(k, S, 3, names, required);
}
static em_status k_fused_adam(const em_kernel_ctx *k) { return fused_adam(k, false); }
static em_status k_fused_adamw(const em_kernel_ctx *k) { return fused_adam(k, true); }

/* The capturable forms: the lr and Adam's count from device memory (dev_scalars). */
static em_status k_fused_sgd_capturable(const em_kernel_ctx *k) {
    double mom = ck_attr_f(k, 0, 0), damp = ck_attr_f(k, 1, 0), wd = ck_attr_f(k, 2, 0);
    bool nesterov = ck_attr_b(k, 3, false), maximize = ck_attr_b(k, 4, false),
         fresh = ck_attr_b(k, 5, false);
    step S = step_base();
    S.mom = mom != 0, S.fresh = fresh, S.nest = nesterov, S.wd = wd != 0;
    bool f64 = k->out[0].dtype == EM_F64;
    double v[5] = {0, mom, 1 - damp, wd, maximize ? -1.0 : 1.0};
    for (int i = 0; i < 5; i++) S.s[i] = f64 ? v[i] : (double)(float)v[i];
    static const char *const names[] = {"momentum_buffer"};
    const bool required[] = {mom != 0};
    return run_fused(k, S, 1, names, required, true);
}

static em_status fused_adam_capturable(const em_kernel_ctx *k, bool decoupled) {
    double b1 = ck_attr_f(k, 0, 0), b2 = ck_attr_f(k, 1, 0), eps = ck_attr_f(k, 2, 0),
           wd = ck_attr_f(k, 3, 0);
    bool maximize = ck_attr_b(k, 4, false);
    em_dtype pdt = k->out[0].dtype;
    if (pdt != EM_F32 && pdt != EM_F64)
        return em_set_error(EM_ERR_DTYPE, "%s: the params are %s; the capturable form takes "
                            "float32 and float64 params (no master weights)", em_op_name(k->op),
                            em_dtype_name(pdt));
    step S = step_base();
    S.adam = true;
    S.ams = false, S.dec = decoupled, S.wd = wd != 0;
    S.raw_b1 = b1, S.raw_b2 = b2, S.raw_wd = wd;
    bool f64 = pdt == EM_F64;
    double v[10] = {b1, 1 - b1, b2, 1 - b2, eps, wd, 0, 0, 0, maximize ? -1.0 : 1.0};
    for (int i = 0; i < 10; i++) S.s[i] = f64 ? v[i] : (double)(float)v[i];
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    const bool required[] = {true, true, false};
    return run_fused(k, S, 2, names, required, true);
}
static em_status k_fused_adam_capturable(const em_kernel_ctx *k) {
    return fused_adam_capturable(k, false);
}
static em_status k_fused_adamw_capturable(const em_kernel_ctx *k) {
    return fused_adam_capturable(k, true);
}

em_status cuda_register_optim(em_registry *r) {
    em_status st = cuda_register_dtypes(r, "fused_sgd", ck_flt, CK_N(ck_flt), k_fused_sgd, "cuda_fused_sgd");
    if (st == EM_OK) st = cuda_register_dtypes(r, "fused_adam", ck_flt, CK_N(ck_flt), k_fused_adam, "cuda_fused_adam");
    if (st == EM_OK) st = cuda_register_dtypes(r, "fused_adamw", ck_flt, CK_N(ck_flt), k_fused_adamw, "cuda_fused_adamw");
    static const em_dtype f32_64[] = {EM_F32, EM_F64};
    if (st == EM_OK) st = cuda_register_dtypes(r, "fused_sgd_capturable", ck_flt, CK_N(ck_flt), k_fused_sgd_capturable, "cuda_fused_sgd_capturable");
    if (st == EM_OK) st = cuda_register_dtypes(r, "fused_adam_capturable", f32_64, 2, k_fused_adam_capturable, "cuda_fused_adam_capturable");
    if (st == EM_OK) st = cuda_register_dtypes(r, "fused_adamw_capturable", f32_64, 2, k_fused_adamw_capturable, "cuda_fused_adamw_capturable");
    return st;
}

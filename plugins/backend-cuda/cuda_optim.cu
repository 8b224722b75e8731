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
};

__device__ __forceinline__ int64_t eoff(const step &S, const operand &o, int64_t i) {
    if (o.contiguous) return i;
    int64_t off = 0;
    for (int d = S.nd - 1; d >= 0; d--) {
        int64_t q = i / S.shape[d], c = i - q * S.shape[d];
        i = q;
        off += c * o.st[d];
    }
    return off;
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
            CT g = ld<CT>(S.op[2], o2), sign = (CT)S.s[S.adam ? 9 : 4];
            d = g * sign;
        }
        if (!S.adam) {
            const CT neg_lr = (CT)S.s[0], mom = (CT)S.s[1], omd = (CT)S.s[2], wd = (CT)S.s[3];
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
            const CT b1 = (CT)S.s[0], omb1 = (CT)S.s[1], b2 = (CT)S.s[2], omb2 = (CT)S.s[3];
            const CT eps = (CT)S.s[4], wd = (CT)S.s[5], decay = (CT)S.s[6], bc2 = (CT)S.s[7];
            const CT nss = (CT)S.s[8];
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

static em_status run_fused(const em_kernel_ctx *k, step &base, int n_states,
                           const char *const *names, const bool *required) {
    const char *op = em_op_name(k->op);
    int count = k->n_in;
    const em_ktensor *params = k->out, *grads = k->in;
    const em_ktensor *master = k->out + (size_t)(1 + n_states) * (size_t)count;
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
        if (f64) step_kernel<double><<<ck_blocks(S.n, 1), CK_THREADS, 0, s>>>(S);
        else step_kernel<float><<<ck_blocks(S.n, 1), CK_THREADS, 0, s>>>(S);
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

em_status cuda_register_optim(em_registry *r) {
    em_status st = cuda_register_dtypes(r, "fused_sgd", ck_flt, CK_N(ck_flt), k_fused_sgd, "cuda_fused_sgd");
    if (st == EM_OK) st = cuda_register_dtypes(r, "fused_adam", ck_flt, CK_N(ck_flt), k_fused_adam, "cuda_fused_adam");
    if (st == EM_OK) st = cuda_register_dtypes(r, "fused_adamw", ck_flt, CK_N(ck_flt), k_fused_adamw, "cuda_fused_adamw");
    return st;
}

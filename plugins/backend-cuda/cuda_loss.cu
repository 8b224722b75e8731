/*
 * cuda_loss.cu — the losses and their backward ops on CUDA (contracts in core/ops_loss.c):
 * cross_entropy, nll_loss, mse_loss, l1_loss, smooth_l1_loss,
 * binary_cross_entropy_with_logits, with the CPU's formulas (plugins/backend-cpu/cpu_loss.c):
 * f32/f16/bf16 compute in float, f64 in double, sums over elements and classes in double,
 * logsumexp shifted by the row's max.
 *
 * Class losses: one warp per position (a strided row of C logits; lanes split the classes,
 * sums combined in a fixed butterfly). Class indices are checked on the device before anything
 * is computed: a kernel finds the first bad position and sums the weights of the targets not
 * ignored (the mean's divisor), and the host reads that back (one stream synchronisation per
 * call with class indices), so a bad target is the CPU's EM_ERR_RANGE message, never a fault.
 * Reduced losses write per-position (or per-block) partial sums combined in a fixed order by
 * one block: the result is the same from run to run.
 */
#include "cuda_kernels.cuh"

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };
enum { MODE_CE, MODE_PROBS, MODE_NLL };

struct cls_job {
    int nd;
    int64_t shape[EM_MAX_DIMS];
    int64_t xs[EM_MAX_DIMS], ts[EM_MAX_DIMS], os[EM_MAX_DIMS], gs[EM_MAX_DIMS];
    int64_t npos, C, xc, tc, oc, ws;
    int mode;
    int64_t red, ignore;
    double ls;
    bool has_w;
    const void *x, *t, *w, *g;
    void *out;
    double *part;      /* forward, reduced: per-position losses */
    const double *info; /* device: [0] W (weights of the targets not ignored), [1] wall */
    double W_host;      /* W when info is NULL (npos) */
};

/* Results of the target check, on the device. */
struct cls_info {
    double W, wall;
    unsigned long long bad; /* first bad position, or ~0 */
};

__device__ __forceinline__ void pos_offsets(const cls_job &j, int64_t p, int64_t *xo, int64_t *to,
                                            int64_t *oo, int64_t *go) {
    *xo = *to = *oo = *go = 0;
    for (int d = j.nd - 1; d >= 0; d--) {
        int64_t q = p / j.shape[d], i = p - q * j.shape[d];
        p = q;
        *xo += i * j.xs[d];
        *to += i * j.ts[d];
        *oo += i * j.os[d];
        *go += i * j.gs[d];
    }
}

template <class CT> __device__ __forceinline__ CT warp_max(CT v) {
    for (int o = 16; o > 0; o /= 2) {
        CT u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v; /* NaN ignored, as the CPU's row max */
    }
    return v;
}

template <class T, class CT> __device__ __forceinline__ CT L(const T *p, int64_t i) {
    return ck_cv<T, CT>::in(p[i]);
}

/* logsumexp of row xr (stride xc) across the warp, as the CPU's ROW_LSE. */
template <class T, class CT>
__device__ __forceinline__ CT row_lse(const T *xr, int64_t C, int64_t xc, int lane) {
    CT m = (CT)-INFINITY;
    for (int64_t c = lane; c < C; c += 32) {
        CT v = L<T, CT>(xr, c * xc);
        m = v > m ? v : m;
    }
    m = warp_max(m);
    double s = 0;
    for (int64_t c = lane; c < C; c += 32) s += (double)exp((CT)(L<T, CT>(xr, c * xc) - m));
    s = ck_warp_sum(s);
    return (CT)(m + (CT)log((CT)s));
}

/* The weight of class c (1 without weights). */
template <class T, class CT> __device__ __forceinline__ CT wcls(const cls_job &j, int64_t c) {
    return j.has_w ? L<T, CT>((const T *)j.w, c * j.ws) : (CT)1;
}

template <class T>
__global__ void cls_fwd_kernel(cls_job j) {
    typedef typename ck_tr<T>::F CT;
    int lane = threadIdx.x % 32;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    const T *x = (const T *)j.x;
    const int64_t C = j.C, xc = j.xc;
    const CT ls = (CT)j.ls, lsC = C ? (CT)(j.ls / (double)C) : (CT)0;
    for (int64_t p = warp; p < j.npos; p += nwarps) {
        int64_t xo, to, oo, go;
        pos_offsets(j, p, &xo, &to, &oo, &go);
        const T *xr = x + xo;
        CT loss = 0;
        if (j.mode == MODE_PROBS) {
            const T *tr = (const T *)j.t + to;
            CT lse = row_lse<T, CT>(xr, C, xc, lane);
            double s = 0;
            for (int64_t c = lane; c < C; c += 32) {
                CT y = L<T, CT>(tr, c * j.tc);
                if (ls > 0) y = y * (1 - ls) + lsC;
                CT wc = wcls<T, CT>(j, c);
                s += (double)(wc * y * (L<T, CT>(xr, c * xc) - lse));
            }
            s = ck_warp_sum(s);
            loss = (CT)-s;
        } else {
            int64_t t = ((const int64_t *)j.t)[to];
            if (t != j.ignore) {
                CT wt = wcls<T, CT>(j, t);
                if (j.mode == MODE_NLL) {
                    loss = -wt * L<T, CT>(xr, t * xc);
                } else {
                    CT lse = row_lse<T, CT>(xr, C, xc, lane);
                    loss = -(1 - ls) * wt * (L<T, CT>(xr, t * xc) - lse);
                    if (ls > 0) {
                        double s = 0;
                        for (int64_t c = lane; c < C; c += 32)
                            s += (double)(wcls<T, CT>(j, c) * (L<T, CT>(xr, c * xc) - lse));
                        s = ck_warp_sum(s);
                        loss -= lsC * (CT)s;
                    }
                }
            }
        }
        if (lane == 0) {
            if (j.red == RED_NONE) ((T *)j.out)[oo] = ck_cv<T, CT>::out(loss);
            else j.part[p] = (double)loss;
        }
    }
}

template <class T>
__global__ void cls_bwd_kernel(cls_job j) {
    typedef typename ck_tr<T>::F CT;
    int lane = threadIdx.x % 32;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    const T *x = (const T *)j.x;
    T *gx = (T *)j.out;
    const int64_t C = j.C, xc = j.xc, oc = j.oc;
    const CT ls = (CT)j.ls, lsC = C ? (CT)(j.ls / (double)C) : (CT)0;
    double W = j.info ? j.info[0] : j.W_host, wall = j.info ? j.info[1] : (double)C;
    /* A reduced loss's grad: the scalar over W (mean) or 1, in double as the CPU's gscale. */
    double gscale = 0;
    if (j.red != RED_NONE) gscale = ck_to_double(*(const T *)j.g) / (j.red == RED_MEAN ? W : 1.0);
    for (int64_t p = warp; p < j.npos; p += nwarps) {
        int64_t xo, to, oo, go;
        pos_offsets(j, p, &xo, &to, &oo, &go);
        const T *xr = x + xo;
        T *gr = gx + oo;
        CT g = j.red == RED_NONE ? L<T, CT>((const T *)j.g, go) : (CT)gscale;
        if (j.mode == MODE_PROBS) {
            const T *tr = (const T *)j.t + to;
            CT lse = row_lse<T, CT>(xr, C, xc, lane);
            double s = 0;
            for (int64_t c = lane; c < C; c += 32) {
                CT y = L<T, CT>(tr, c * j.tc);
                if (ls > 0) y = y * (1 - ls) + lsC;
                s += (double)(wcls<T, CT>(j, c) * y);
            }
            s = ck_warp_sum(s);
            for (int64_t c = lane; c < C; c += 32) {
                CT y = L<T, CT>(tr, c * j.tc);
                if (ls > 0) y = y * (1 - ls) + lsC;
                CT wc = wcls<T, CT>(j, c);
                CT pc = exp((CT)(L<T, CT>(xr, c * xc) - lse));
                gr[c * oc] = ck_cv<T, CT>::out(g * (pc * (CT)s - wc * y));
            }
            continue;
        }
        int64_t t = ((const int64_t *)j.t)[to];
        if (t == j.ignore || j.mode == MODE_NLL) {
            for (int64_t c = lane; c < C; c += 32)
                gr[c * oc] = ck_cv<T, CT>::out(c == t && t != j.ignore ? -wcls<T, CT>(j, t) * g : (CT)0);
            continue;
        }
        CT wt = wcls<T, CT>(j, t);
        CT lse = row_lse<T, CT>(xr, C, xc, lane);
        CT A = g * (1 - ls) * wt, B = ls > 0 ? g * lsC : (CT)0;
        CT AB = ls > 0 ? A + B * (CT)wall : A;
        for (int64_t c = lane; c < C; c += 32) {
            CT pc = exp((CT)(L<T, CT>(xr, c * xc) - lse));
            CT v = pc * AB;
            if (ls > 0) v -= B * wcls<T, CT>(j, c);
            if (c == t) v -= A;
            gr[c * oc] = ck_cv<T, CT>::out(v);
        }
    }
}

/* One block: the class weights' sum (wall), and for class indices the first bad position
 * and the weights of the targets not ignored (W), summed in a fixed tree. */
template <class T>
__global__ void cls_prep_kernel(cls_job j, cls_info *info) {
    double w = 0, a = 0;
    for (int64_t c = threadIdx.x; c < j.C && j.has_w; c += blockDim.x) a += ck_to_double(((const T *)j.w)[c * j.ws]);
    if (j.mode != MODE_PROBS) {
        for (int64_t p = threadIdx.x; p < j.npos; p += blockDim.x) {
            int64_t to = 0, q = p;
            for (int d = j.nd - 1; d >= 0; d--) {
                to += (q % j.shape[d]) * j.ts[d];
                q /= j.shape[d];
            }
            int64_t c = ((const int64_t *)j.t)[to];
            if (c == j.ignore) continue;
            if (c < 0 || c >= j.C) {
                atomicMin(&info->bad, (unsigned long long)p);
                continue;
            }
            w += j.has_w ? ck_to_double(((const T *)j.w)[c * j.ws]) : 1.0;
        }
    }
    w = ck_block_sum(w);
    a = ck_block_sum(a);
    if (threadIdx.x == 0) {
        info->W = j.mode == MODE_PROBS ? (double)j.npos : w;
        info->wall = j.has_w ? a : (double)j.C;
    }
}

/* Sum n doubles in a fixed order (one block) and store the reduced loss: mean divides by the
 * divisor (info[0] when given, else div), NaN for an empty input. */
template <class T>
__global__ void finish_kernel(const double *part, int64_t n, int red, const double *info, double div,
                              bool empty, T *out) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = ck_block_sum(s);
    if (threadIdx.x == 0) {
        double v = s;
        if (red == RED_MEAN) v = empty ? nan("") : v / (info ? info[0] : div);
        *out = ck_from<T>(v);
    }
}

static int64_t attr_red(const em_kernel_ctx *k) { return ck_attr_i(k, 0, RED_MEAN); }

static void cls_setup(cls_job &j, const em_kernel_ctx *k, bool nll, const em_ktensor *x,
                      const em_ktensor *t, const em_ktensor *w, const em_ktensor *pos,
                      const em_ktensor *gx) {
    memset(&j, 0, sizeof j);
    int cdim = x->ndim == 1 ? 0 : 1;
    j.C = x->shape[cdim];
    j.xc = x->strides[cdim];
    j.mode = em_dtype_is_floating(t->dtype) ? MODE_PROBS : nll ? MODE_NLL : MODE_CE;
    j.tc = j.mode == MODE_PROBS ? t->strides[cdim] : 0;
    j.oc = gx ? gx->strides[cdim] : 0;
    j.npos = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == cdim) continue;
        int jd = d < cdim ? d : d - 1;
        j.shape[j.nd] = x->shape[d];
        j.xs[j.nd] = x->strides[d];
        j.ts[j.nd] = j.mode == MODE_PROBS ? t->strides[d] : t->strides[jd];
        j.os[j.nd] = gx ? gx->strides[d] : pos ? pos->strides[jd] : 0;
        j.gs[j.nd] = gx && pos ? pos->strides[jd] : 0;
        j.npos *= x->shape[d];
        j.nd++;
    }
    j.has_w = w->numel > 0;
    j.ws = j.has_w ? w->strides[0] : 0;
    j.red = attr_red(k);
    j.ignore = ck_attr_i(k, 1, -100);
    j.ls = j.mode == MODE_NLL ? 0 : ck_attr_f(k, 2, 0.0);
    j.x = x->data;
    j.t = t->data;
    j.w = w->data;
    j.W_host = (double)j.npos;
}

/* The target check and divisors: info on the device; an error naming the first bad target. */
static em_status cls_prep(const em_kernel_ctx *k, cls_job &j, em_dtype dt, cls_info **out) {
    cls_info *info = (cls_info *)ck_scratch(k, sizeof *info);
    if (!info) return em_last_status();
    cudaStream_t s = cuda_stream_of(k);
    em_status st = ck_rt(k, cudaMemsetAsync(&info->bad, 0xff, sizeof info->bad, s), "cudaMemsetAsync");
    if (st != EM_OK) return st;
#define GO(T) cls_prep_kernel<T><<<1, 256, 0, s>>>(j, info)
    CK_SWITCH_FLOAT(dt, GO, return ck_no_dtype(k, dt))
#undef GO
    if ((st = CK_CHECK(k, em_op_name(k->op))) != EM_OK) return st;
    *out = info;
    if (j.mode == MODE_PROBS || ck_capturing(k)) return EM_OK;
    cls_info h;
    if ((st = ck_readback(k, &h, info, sizeof h)) != EM_OK) return st;
    if (h.bad == ~0ull) return EM_OK;
    int64_t p = (int64_t)h.bad, to = 0, q = p, c = 0;
    for (int d = j.nd - 1; d >= 0; d--) {
        to += (q % j.shape[d]) * j.ts[d];
        q /= j.shape[d];
    }
    if ((st = ck_readback(k, &c, (const int64_t *)j.t + to, sizeof c)) != EM_OK) return st;
    return em_set_error(EM_ERR_RANGE, "%s: target class index %lld is out of range [0, %lld) "
                        "(target element %lld; ignore_index is %lld)", em_op_name(k->op),
                        (long long)c, (long long)j.C, (long long)p, (long long)j.ignore);
}

static unsigned warp_blocks(int64_t npos) {
    int64_t b = (npos + 7) / 8;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

static em_status class_fwd(const em_kernel_ctx *k, bool nll) {
    const em_ktensor *x = &k->in[0], *t = &k->in[1], *w = &k->in[2], *o = &k->out[0];
    cls_job j;
    cls_setup(j, k, nll, x, t, w, attr_red(k) == RED_NONE ? o : NULL, NULL);
    j.out = o->data;
    cls_info *info = NULL;
    em_status st = cls_prep(k, j, x->dtype, &info);
    if (st != EM_OK) return st;
    if (j.red != RED_NONE && !(j.part = (double *)ck_scratch(k, sizeof(double) * (size_t)(j.npos ? j.npos : 1))))
        return em_last_status();
    cudaStream_t s = cuda_stream_of(k);
    if (j.npos > 0) {
#define GO(T) cls_fwd_kernel<T><<<warp_blocks(j.npos), 256, 0, s>>>(j)
        CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
        if ((st = CK_CHECK(k, em_op_name(k->op))) != EM_OK) return st;
    }
    if (j.red == RED_NONE) return EM_OK;
    /* The mean divides by W (the class losses' info[0]), the CPU's x->numel == 0 gives NaN. */
#define GO(T) finish_kernel<T><<<1, 256, 0, s>>>(j.part, j.npos, (int)j.red, &info->W, 0, x->numel == 0, (T *)o->data)
    CK_SWITCH_FLOAT(o->dtype, GO, return ck_no_dtype(k, o->dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}

static em_status class_bwd(const em_kernel_ctx *k, bool nll) {
    const em_ktensor *g = &k->in[0], *x = &k->in[1], *t = &k->in[2], *w = &k->in[3];
    const em_ktensor *gx = &k->out[0];
    cls_job j;
    cls_setup(j, k, nll, x, t, w, attr_red(k) == RED_NONE ? g : NULL, gx);
    j.out = gx->data;
    j.g = g->data;
    cls_info *info = NULL;
    em_status st = cls_prep(k, j, x->dtype, &info);
    if (st != EM_OK) return st;
    j.info = &info->W; /* W then wall: the first two fields */
    if (j.npos == 0) return EM_OK;
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) cls_bwd_kernel<T><<<warp_blocks(j.npos), 256, 0, s>>>(j)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}

static em_status k_ce(const em_kernel_ctx *k) { return class_fwd(k, false); }
static em_status k_ce_bwd(const em_kernel_ctx *k) { return class_bwd(k, false); }
static em_status k_nll(const em_kernel_ctx *k) { return class_fwd(k, true); }
static em_status k_nll_bwd(const em_kernel_ctx *k) { return class_bwd(k, true); }

/* ---- pointwise losses -------------------------------------------------------------------------- */

enum { PW_MSE, PW_L1, PW_SL1, PW_BCE };

struct pw_job {
    int kind;
    bool red, has_w, has_pw;
    double beta, scale;
    ck_geom g; /* forward: out-or-x, x, y, w, pw; backward: grad_x, grad, x, y, w, pw */
    double *part;
};

template <class CT> __device__ __forceinline__ CT pw_fwd(const pw_job &J, CT x, CT y, CT w, CT pw) {
    const bool hp = J.has_pw;
    const CT beta = (CT)J.beta;
    switch (J.kind) {
    case PW_MSE: return (x - y) * (x - y);
    case PW_L1: return fabs(x - y);
    case PW_SL1: {
        CT d = x - y;
        if (beta == 0) return fabs(d); /* beta == 0 runs l1's loop, as the CPU */
        return sc_sl1_fwd(d, beta);
    }
    default:
        return w * ((1 - y) * x + (hp ? 1 + (pw - 1) * y : (CT)1) *
                                      (log1p(exp(-fabs(x))) + (-x > 0 ? -x : (CT)0)));
    }
}
template <class CT> __device__ __forceinline__ CT pw_bwd(const pw_job &J, CT x, CT y, CT w, CT pw) {
    const bool hp = J.has_pw;
    const CT beta = (CT)J.beta;
    switch (J.kind) {
    case PW_MSE: return (CT)2 * (x - y);
    case PW_L1: return (x - y) > 0 ? (CT)1 : (x - y) < 0 ? (CT)-1 : (CT)0;
    case PW_SL1: {
        return sc_sl1_bwd(x - y, beta);
    }
    default: {
        CT sig = (CT)1 / (1 + exp((CT)-x));
        return w * (hp ? (pw * y + 1 - y) * sig - pw * y : sig - y);
    }
    }
}

__device__ __forceinline__ void geom_offsets(const ck_geom &g, int nops, int64_t i, int64_t *off) {
    for (int k = 0; k < nops; k++) off[k] = 0;
    for (int d = g.nd - 1; d >= 0; d--) {
        int64_t q = i / g.shape[d], c = i - q * g.shape[d];
        i = q;
        for (int k = 0; k < nops; k++) off[k] += c * g.st[k][d];
    }
}

/* Forward: per element, stored (reduction none) or summed per thread then per block into
 * part[blockIdx.x] (a fixed tree). */
template <class T>
__global__ void pw_fwd_kernel(pw_job J) {
    typedef typename ck_tr<T>::F CT;
    double acc = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < J.g.n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[5];
        geom_offsets(J.g, 5, i, off);
        CT x = L<T, CT>((const T *)J.g.p[1], off[1]), y = L<T, CT>((const T *)J.g.p[2], off[2]);
        CT w = J.has_w ? L<T, CT>((const T *)J.g.p[3], off[3]) : (CT)1;
        CT pw = J.has_pw ? L<T, CT>((const T *)J.g.p[4], off[4]) : (CT)1;
        CT v = pw_fwd<CT>(J, x, y, w, pw);
        if (J.red) acc += (double)v;
        else ((T *)J.g.p[0])[off[0]] = ck_cv<T, CT>::out(v);
    }
    if (!J.red) return;
    acc = ck_block_sum(acc);
    if (threadIdx.x == 0) J.part[blockIdx.x] = acc;
}

template <class T>
__global__ void pw_bwd_kernel(pw_job J) {
    typedef typename ck_tr<T>::F CT;
    const CT scale = (CT)J.scale;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < J.g.n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t off[6];
        geom_offsets(J.g, 6, i, off);
        CT g = L<T, CT>((const T *)J.g.p[1], off[1]) * scale;
        CT x = L<T, CT>((const T *)J.g.p[2], off[2]), y = L<T, CT>((const T *)J.g.p[3], off[3]);
        CT w = J.has_w ? L<T, CT>((const T *)J.g.p[4], off[4]) : (CT)1;
        CT pw = J.has_pw ? L<T, CT>((const T *)J.g.p[5], off[5]) : (CT)1;
        ((T *)J.g.p[0])[off[0]] = ck_cv<T, CT>::out((CT)(pw_bwd<CT>(J, x, y, w, pw) * g));
    }
}

static void pw_setup(pw_job &J, const em_kernel_ctx *k, int kind, int first_in) {
    int64_t red = attr_red(k);
    const em_ktensor *x = &k->in[first_in];
    memset(&J, 0, sizeof J);
    J.kind = kind;
    J.red = red != RED_NONE;
    J.beta = kind == PW_SL1 ? ck_attr_f(k, 1, 1.0) : 0.0;
    J.scale = red == RED_MEAN && x->numel ? 1.0 / (double)x->numel : 1.0;
    J.has_w = kind == PW_BCE && k->in[first_in + 2].numel > 0;
    J.has_pw = kind == PW_BCE && k->in[first_in + 3].numel > 0;
}

static em_status pw_forward(const em_kernel_ctx *k, int kind) {
    const em_ktensor *x = &k->in[0], *o = &k->out[0];
    pw_job J;
    pw_setup(J, k, kind, 0);
    const em_ktensor *ts[5] = {J.red ? x : o, x, &k->in[1], J.has_w ? &k->in[2] : x,
                               J.has_pw ? &k->in[3] : x};
    unsigned bcast;
    ck_geom_make(&J.g, 5, ts, &bcast);
    unsigned blocks = ck_blocks(x->numel, 4);
    if (J.red && !(J.part = (double *)ck_scratch(k, sizeof(double) * blocks))) return em_last_status();
    cudaStream_t s = cuda_stream_of(k);
    em_status st = EM_OK;
    if (x->numel > 0 || J.red) {
#define GO(T) pw_fwd_kernel<T><<<blocks, 256, 0, s>>>(J)
        CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
        if ((st = CK_CHECK(k, em_op_name(k->op))) != EM_OK) return st;
    }
    if (!J.red) return EM_OK;
#define GO(T) finish_kernel<T><<<1, 256, 0, s>>>(J.part, blocks, (int)attr_red(k), NULL, (double)x->numel, x->numel == 0, (T *)o->data)
    CK_SWITCH_FLOAT(o->dtype, GO, return ck_no_dtype(k, o->dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}

static em_status pw_backward(const em_kernel_ctx *k, int kind) {
    const em_ktensor *g = &k->in[0], *x = &k->in[1];
    pw_job J;
    pw_setup(J, k, kind, 1);
    em_ktensor ge = *g; /* a reduced loss's grad, broadcast over x */
    if (J.red) {
        ge.ndim = x->ndim;
        ge.numel = x->numel;
        ge.contiguous = false;
        for (int d = 0; d < x->ndim; d++) ge.shape[d] = x->shape[d], ge.strides[d] = 0;
    }
    const em_ktensor *ts[6] = {&k->out[0], &ge, x, &k->in[2], J.has_w ? &k->in[3] : x,
                               J.has_pw ? &k->in[4] : x};
    unsigned bcast;
    ck_geom_make(&J.g, 6, ts, &bcast);
    if (x->numel == 0) return EM_OK;
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) pw_bwd_kernel<T><<<ck_blocks(x->numel, 1), 256, 0, s>>>(J)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}

static em_status k_mse(const em_kernel_ctx *k) { return pw_forward(k, PW_MSE); }
static em_status k_l1(const em_kernel_ctx *k) { return pw_forward(k, PW_L1); }
static em_status k_sl1(const em_kernel_ctx *k) { return pw_forward(k, PW_SL1); }
static em_status k_bce(const em_kernel_ctx *k) { return pw_forward(k, PW_BCE); }
static em_status k_mse_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_MSE); }
static em_status k_l1_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_L1); }
static em_status k_sl1_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_SL1); }
static em_status k_bce_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_BCE); }

em_status cuda_register_loss(em_registry *r) {
    em_status st = EM_OK;
#define REG(op, fn) if (st == EM_OK) st = cuda_register_dtypes(r, op, ck_flt, CK_N(ck_flt), fn, "cuda_" op)
    REG("cross_entropy", k_ce);
    REG("cross_entropy_backward", k_ce_bwd);
    REG("nll_loss", k_nll);
    REG("nll_loss_backward", k_nll_bwd);
    REG("mse_loss", k_mse);
    REG("mse_loss_backward", k_mse_bwd);
    REG("l1_loss", k_l1);
    REG("l1_loss_backward", k_l1_bwd);
    REG("smooth_l1_loss", k_sl1);
    REG("smooth_l1_loss_backward", k_sl1_bwd);
    REG("binary_cross_entropy_with_logits", k_bce);
    REG("binary_cross_entropy_with_logits_backward", k_bce_bwd);
#undef REG
    return st;
}

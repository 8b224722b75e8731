/*
 * cpu_optim.c — CPU kernels of the fused optimizer steps (fused_sgd, fused_adam, fused_adamw;
 * core/ops_optim.c states their contracts and arithmetic).
 *
 * One call updates every tensor of its lists. The work is the concatenation of the tensors'
 * elements, cut into one contiguous range per thread (threads only when there are at least
 * CPU_GRAIN elements in all), so a thread walks the ends of some tensors and whole others.
 * Within a tensor, a run whose operands are contiguous and already of the compute type (f32
 * or f64) goes straight to a loop the compiler vectorises (`omp simd`, built for AVX-512,
 * AVX2 and baseline x86-64); anything else (f16/bf16 params, f16/bf16 state, strided views)
 * is gathered in blocks of 256 elements into compute-type buffers, updated by the same loop
 * and written back (params rounded once, from the f32 master weight when there is one).
 *
 * The loops keep the op-by-op order of the optimizer classes: every product and sum rounds
 * to the compute type, and this file is compiled with -ffp-contract=off (no fused
 * multiply-adds: Makefile.am builds it as a convenience library with its own flags) so the
 * results are those of the separate ops; -fno-math-errno lets sqrt vectorise (sqrtps is
 * correctly rounded, like sqrtf).
 */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SIMD_CLONES
#endif

/* ---- scalars and the element loops ----------------------------------------------------------- */

/* The attributes, with the products PyTorch forms in Python floats done in double, then
 * rounded to the compute type. sign is -1 when maximizing (g * -1 is exactly -g). */
typedef struct sgd_f32 {
    float neg_lr, momentum, one_minus_damp, wd, sign;
} sgd_f32;
typedef struct sgd_f64 {
    double neg_lr, momentum, one_minus_damp, wd, sign;
} sgd_f64;
typedef struct adam_f32 {
    float b1, one_minus_b1, b2, one_minus_b2, eps, wd, decay, bc2_sqrt, neg_step_size, sign;
} adam_f32;
typedef struct adam_f64 {
    double b1, one_minus_b1, b2, one_minus_b2, eps, wd, decay, bc2_sqrt, neg_step_size, sign;
} adam_f64;

/* The loops take the flags as compile-time constants, one function per combination, so that
 * their bodies have no branches and vectorise. */

/* SGD on n elements: w (updated), g, buf (momentum buffer; NULL without momentum).
 * MOM: momentum != 0; FRESH: the buffers start as d; NEST: Nesterov; WD: weight_decay != 0. */
#define DEF_SGD(CT, SFX, MOM, FRESH, NEST, WD)                                                  \
    SIMD_CLONES static void sgd_##SFX##_##MOM##FRESH##NEST##WD(                                 \
        CT *restrict w, const CT *restrict g, CT *restrict buf, int64_t n, const sgd_##SFX *s) { \
        const CT neg_lr = s->neg_lr, mom = s->momentum, omd = s->one_minus_damp, wd = s->wd;   \
        const CT sign = s->sign;                                                               \
        (void)mom, (void)omd, (void)buf, (void)wd;                                             \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                  \
            CT x = w[i], d = g[i] * sign;                                                      \
            if (WD) {                                                                          \
                CT dw = x * wd;                                                                \
                d = d + dw;                                                                    \
            }                                                                                  \
            if (MOM) {                                                                         \
                CT b;                                                                          \
                if (FRESH) {                                                                   \
                    b = d;                                                                     \
                } else {                                                                       \
                    CT bm = buf[i] * mom, dd = d * omd;                                        \
                    b = bm + dd;                                                               \
                }                                                                              \
                buf[i] = b;                                                                    \
                if (NEST) {                                                                    \
                    CT bn = b * mom;                                                           \
                    d = d + bn;                                                                \
                } else {                                                                       \
                    d = b;                                                                     \
                }                                                                              \
            }                                                                                  \
            CT step = d * neg_lr;                                                              \
            w[i] = x + step;                                                                   \
        }                                                                                      \
    }
#define DEF_SGD_ALL(CT, SFX)                                                                    \
    DEF_SGD(CT, SFX, 0, 0, 0, 0) DEF_SGD(CT, SFX, 0, 0, 0, 1)                                  \
    DEF_SGD(CT, SFX, 1, 0, 0, 0) DEF_SGD(CT, SFX, 1, 0, 0, 1)                                  \
    DEF_SGD(CT, SFX, 1, 0, 1, 0) DEF_SGD(CT, SFX, 1, 0, 1, 1)                                  \
    DEF_SGD(CT, SFX, 1, 1, 0, 0) DEF_SGD(CT, SFX, 1, 1, 0, 1)                                  \
    DEF_SGD(CT, SFX, 1, 1, 1, 0) DEF_SGD(CT, SFX, 1, 1, 1, 1)
DEF_SGD_ALL(float, f32)
DEF_SGD_ALL(double, f64)

/* Adam on n elements: w (updated), g, m, v, vmax (NULL without amsgrad). AMS: amsgrad; DEC:
 * decoupled weight decay (AdamW); WD: weight_decay != 0 (Adam's L2 term). */
#define DEF_ADAM(CT, SFX, SQRT, AMS, DEC, WD)                                                   \
    SIMD_CLONES static void adam_##SFX##_##AMS##DEC##WD(                                        \
        CT *restrict w, const CT *restrict g, CT *restrict m, CT *restrict v,                  \
        CT *restrict vmax, int64_t n, const adam_##SFX *s) {                                   \
        const CT b1 = s->b1, omb1 = s->one_minus_b1, b2 = s->b2, omb2 = s->one_minus_b2;       \
        const CT eps = s->eps, wd = s->wd, decay = s->decay, bc2 = s->bc2_sqrt;              \
        const CT nss = s->neg_step_size, sign = s->sign;                                       \
        (void)vmax, (void)wd, (void)decay;                                                     \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                  \
            CT x = w[i], d = g[i] * sign;                                                      \
            if (DEC) {                                                                         \
                x = x * decay;                                                                 \
            } else if (WD) {                                                                   \
                CT dw = x * wd;                                                                \
                d = d + dw;                                                                    \
            }                                                                                  \
            CT m1 = m[i] * b1, m2 = d * omb1;                                                  \
            CT mm = m1 + m2;                                                                   \
            CT v1 = v[i] * b2, dd = d * d;                                                     \
            CT v2 = dd * omb2;                                                                 \
            CT vv = v1 + v2;                                                                   \
            m[i] = mm;                                                                         \
            v[i] = vv;                                                                         \
            CT sq = vv;                                                                        \
            if (AMS) {                                                                         \
                CT o = vmax[i];                                                                \
                sq = o > vv || o != o ? o : vv; /* em_maximum: NaN propagates */               \
                vmax[i] = sq;                                                                  \
            }                                                                                  \
            CT den = SQRT(sq) / bc2;                                                           \
            den = den + eps;                                                                   \
            CT q = mm / den;                                                                   \
            CT step = q * nss;                                                                 \
            w[i] = x + step;                                                                   \
        }                                                                                      \
    }
#define DEF_ADAM_ALL(CT, SFX, SQRT)                                                             \
    DEF_ADAM(CT, SFX, SQRT, 0, 0, 0) DEF_ADAM(CT, SFX, SQRT, 0, 0, 1)                          \
    DEF_ADAM(CT, SFX, SQRT, 0, 1, 0) DEF_ADAM(CT, SFX, SQRT, 1, 0, 0)                          \
    DEF_ADAM(CT, SFX, SQRT, 1, 0, 1) DEF_ADAM(CT, SFX, SQRT, 1, 1, 0)
DEF_ADAM_ALL(float, f32, sqrtf)
DEF_ADAM_ALL(double, f64, sqrt)

/* ---- operands ---------------------------------------------------------------------------------- */

/* The operands of one tensor j of a call, in loop order: 0 the weight the update is made on
 * (the master when given, else the param), 1 the grad, 2.. the states; `param` is the param
 * itself when the weight is the master (it receives the result rounded), else NULL. */
#define MAX_OPERANDS 5
typedef struct item {
    const em_ktensor *op[MAX_OPERANDS];
    const em_ktensor *param;
    int nops;
    const void *scalars; /* the capturable forms: this tensor's own; NULL: the call's */
} item;

/* A capturable call's scalars of one tensor (its lr and step count are its own). */
typedef union item_scalars {
    sgd_f32 s32;
    sgd_f64 s64;
    adam_f32 a32;
    adam_f64 a64;
} item_scalars;

typedef struct step_call {
    bool f64;            /* compute type: double (f64 params) or float */
    int variant;         /* which loop */
    const void *scalars; /* sgd_f32 / sgd_f64 / adam_f32 / adam_f64 */
    bool adam;
    const item *items;
    int count;
} step_call;

typedef void (*sgd_loop32)(float *, const float *, float *, int64_t, const sgd_f32 *);
typedef void (*sgd_loop64)(double *, const double *, double *, int64_t, const sgd_f64 *);
typedef void (*adam_loop32)(float *, const float *, float *, float *, float *, int64_t,
                            const adam_f32 *);
typedef void (*adam_loop64)(double *, const double *, double *, double *, double *, int64_t,
                            const adam_f64 *);
/* Indexed by sgd_variant / adam_variant. */
#define SGD_TABLE(SFX)                                                                          \
    {sgd_##SFX##_0000, sgd_##SFX##_0001, sgd_##SFX##_1000, sgd_##SFX##_1001, sgd_##SFX##_1010,  \
     sgd_##SFX##_1011, sgd_##SFX##_1100, sgd_##SFX##_1101, sgd_##SFX##_1110, sgd_##SFX##_1111}
#define ADAM_TABLE(SFX)                                                                         \
    {adam_##SFX##_000, adam_##SFX##_001, adam_##SFX##_010, adam_##SFX##_100, adam_##SFX##_101, \
     adam_##SFX##_110}
static const sgd_loop32 sgd32[10] = SGD_TABLE(f32);
static const sgd_loop64 sgd64[10] = SGD_TABLE(f64);
static const adam_loop32 adam32[6] = ADAM_TABLE(f32);
static const adam_loop64 adam64[6] = ADAM_TABLE(f64);

static int sgd_variant(bool mom, bool fresh, bool nesterov, bool wd) {
    return mom ? 2 + (fresh ? 4 : 0) + (nesterov ? 2 : 0) + wd : wd;
}
static int adam_variant(bool amsgrad, bool decoupled, bool wd) {
    return (amsgrad ? 3 : 0) + (decoupled ? 2 : wd);
}

/* Run the call's loop on n elements given as compute-type pointers (p[0] the weight, p[1] the
 * grad, p[2..] the states; absent states NULL). */
static void run_loop(const step_call *c, const item *it, void **p, int64_t n) {
    const void *s = it->scalars ? it->scalars : c->scalars;
    if (c->adam && c->f64)
        adam64[c->variant](p[0], p[1], p[2], p[3], p[4], n, s);
    else if (c->adam)
        adam32[c->variant](p[0], p[1], p[2], p[3], p[4], n, s);
    else if (c->f64)
        sgd64[c->variant](p[0], p[1], p[2], n, s);
    else
        sgd32[c->variant](p[0], p[1], p[2], n, s);
}

/* Element i of t (linear index in C order) as a byte pointer. */
static inline char *elem(const em_ktensor *t, int64_t i) {
    int64_t off = t->contiguous ? i : cpu_offset(t->ndim, t->shape, t->strides, i);
    return (char *)t->data + off * (int64_t)em_dtype_size(t->dtype);
}

static inline double load_elem(const em_ktensor *t, int64_t i) {
    const char *q = elem(t, i);
    switch (t->dtype) {
    case EM_F32: return *(const float *)q;
    case EM_F64: return *(const double *)q;
    case EM_F16: return cpu_h2f(*(const uint16_t *)q);
    default: return cpu_b2f(*(const uint16_t *)q);
    }
}

static inline void store_elem(const em_ktensor *t, int64_t i, double v) {
    char *q = elem(t, i);
    switch (t->dtype) {
    case EM_F32: *(float *)q = (float)v; break;
    case EM_F64: *(double *)q = v; break;
    case EM_F16: *(uint16_t *)q = cpu_f2h((float)v); break;
    default: *(uint16_t *)q = cpu_f2b((float)v); break;
    }
}

#define BLOCK 256

/* Master weights w (f32) of n elements of an f16/bf16 param from element b: where the param
 * is no longer w rounded (it was changed outside the optimizer), take the param's value. */
static void sync_master(const em_ktensor *param, int64_t b, int64_t n, float *w) {
    bool h = param->dtype == EM_F16;
    for (int64_t i = 0; i < n; i++) {
        uint16_t have = *(const uint16_t *)elem(param, b + i);
        uint16_t want = h ? cpu_f2h(w[i]) : cpu_f2b(w[i]);
        if (have != want) w[i] = h ? cpu_h2f(have) : cpu_b2f(have);
    }
}

/* Update elements [lo, hi) of one tensor. */
static void run_range(const step_call *c, const item *it, int64_t lo, int64_t hi) {
    em_dtype ct = c->f64 ? EM_F64 : EM_F32;
    bool direct = it->param == NULL;
    for (int k = 0; k < it->nops && direct; k++)
        direct = !it->op[k] || (it->op[k]->contiguous && it->op[k]->dtype == ct);
    size_t e = em_dtype_size(ct);
    if (direct) {
        void *p[MAX_OPERANDS] = {0};
        for (int k = 0; k < it->nops; k++)
            if (it->op[k]) p[k] = (char *)it->op[k]->data + lo * (int64_t)e;
        run_loop(c, it, p, hi - lo);
        return;
    }
    /* Gather, update, write back; operands already in the compute type and contiguous are
     * used in place. */
    _Alignas(64) double buf[MAX_OPERANDS][BLOCK];
    for (int64_t b = lo; b < hi; b += BLOCK) {
        int64_t n = cpu_min_i64(BLOCK, hi - b);
        void *p[MAX_OPERANDS] = {0};
        bool copied[MAX_OPERANDS] = {0};
        for (int k = 0; k < it->nops; k++) {
            const em_ktensor *t = it->op[k];
            if (!t) continue;
            if (t->contiguous && t->dtype == ct) {
                p[k] = (char *)t->data + b * (int64_t)e;
                continue;
            }
            copied[k] = true;
            p[k] = buf[k];
            if (c->f64)
                for (int64_t i = 0; i < n; i++) buf[k][i] = load_elem(t, b + i);
            else
                for (int64_t i = 0; i < n; i++) ((float *)buf[k])[i] = (float)load_elem(t, b + i);
        }
        if (it->param) sync_master(it->param, b, n, p[0]);
        run_loop(c, it, p, n);
        for (int k = 0; k < it->nops; k++) {
            if (!copied[k] || k == 1) continue; /* the grad is read-only */
            for (int64_t i = 0; i < n; i++)
                store_elem(it->op[k], b + i, c->f64 ? buf[k][i] : ((float *)buf[k])[i]);
        }
        if (it->param)
            for (int64_t i = 0; i < n; i++)
                store_elem(it->param, b + i,
                           c->f64 ? ((double *)p[0])[i] : ((float *)p[0])[i]);
    }
}

/* The elements of the call, concatenated, cut into one range per thread. */
static void run_call(const em_kernel_ctx *k, const step_call *c) {
    int64_t total = 0;
    for (int j = 0; j < c->count; j++) total += c->items[j].op[0]->numel;
    if (total == 0) return;
    int nt = cpu_threads(k);
    if (total < CPU_GRAIN || nt < 2) nt = 1;
    if (nt == 1) {
        for (int j = 0; j < c->count; j++) run_range(c, &c->items[j], 0, c->items[j].op[0]->numel);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        /* [lo, hi) of the concatenation, in whole 64-byte lines where possible. */
        int64_t lo = (total * t / n) & ~(int64_t)15, hi = t == n - 1 ? total
                                                                     : (total * (t + 1) / n) & ~(int64_t)15;
        int64_t base = 0;
        for (int j = 0; j < c->count && base < hi; j++) {
            int64_t len = c->items[j].op[0]->numel;
            int64_t a = lo > base ? lo - base : 0, z = hi - base < len ? hi - base : len;
            if (a < z) run_range(c, &c->items[j], a, z);
            base += len;
        }
    }
}

/* ---- checks and kernels -------------------------------------------------------------------------- */

/* The tensors per list of the call. */
static int list_count(const em_kernel_ctx *k) {
    return k->n_out / em_op_schema_of(k->op)->n_outputs;
}

/* Check the lists' dtypes and presence and fill the items. The output lists: 0 the params,
 * 1.. the states, then master (when has_master; the capturable Adam forms have none); the
 * grads are input list 0; required[s] says whether a state list must be there. */
static em_status build_items(const em_kernel_ctx *k, int n_states, const char *const *names,
                             const bool *required, bool has_master, item *items) {
    const char *op = em_op_name(k->op);
    int count = list_count(k);
    static const em_ktensor none = {0};
    const em_ktensor *params = k->out, *grads = k->in;
    const em_ktensor *master = has_master ? k->out + (size_t)(1 + n_states) * (size_t)count
                                          : &none;
    em_dtype pdt = params[0].dtype;
    bool low = pdt == EM_F16 || pdt == EM_BF16;
    if (master[0].data && !low)
        return em_set_error(EM_ERR_DTYPE, "%s: master weights are for f16 and bf16 params; the "
                            "params are %s", op, em_dtype_name(pdt));
    /* A list the caller left out arrives as zeroed views (data NULL): em_op_call_lists
     * passes lists whole or not at all. */
    bool has[MAX_OPERANDS];
    for (int s = 0; s < n_states; s++) {
        has[s] = k->out[(size_t)(1 + s) * (size_t)count].data != NULL;
        if (required[s] && !has[s])
            return em_set_error(EM_ERR_INVALID, "%s: the %s list is required here", op,
                                names[s]);
    }
    for (int j = 0; j < count; j++) {
        item *it = &items[j];
        memset(it, 0, sizeof *it);
        const em_ktensor *m = master[0].data ? &master[j] : NULL;
        if (grads[j].dtype != pdt)
            return em_set_error(EM_ERR_DTYPE, "%s: grad %d is %s but its param is %s", op, j,
                                em_dtype_name(grads[j].dtype), em_dtype_name(pdt));
        if (m && m->dtype != EM_F32)
            return em_set_error(EM_ERR_DTYPE, "%s: master weight %d is %s; master weights are "
                                "f32", op, j, em_dtype_name(m->dtype));
        it->op[0] = m ? m : &params[j];
        it->param = m ? &params[j] : NULL;
        it->op[1] = &grads[j];
        it->nops = 2 + n_states;
        for (int s = 0; s < n_states; s++) {
            const em_ktensor *t = &k->out[(size_t)(1 + s) * (size_t)count + (size_t)j];
            if (!has[s]) continue;
            if (t->dtype != pdt && !(low && t->dtype == EM_F32))
                return em_set_error(EM_ERR_DTYPE, "%s: %s %d is %s; for %s params it must be %s",
                                    op, names[s], j, em_dtype_name(t->dtype),
                                    em_dtype_name(pdt), low ? "f32 or the params' dtype"
                                                            : "the params' dtype");
            it->op[2 + s] = t;
        }
    }
    return EM_OK;
}

/* Attribute i as a float / bool; an absent one is 0 / false. */
static double fattr(const em_kernel_ctx *k, int i) {
    return k->attrs && k->attrs[i].type == EM_ATTR_FLOAT ? k->attrs[i].v.f : 0.0;
}
static bool battr(const em_kernel_ctx *k, int i) {
    return k->attrs && k->attrs[i].type == EM_ATTR_BOOL && k->attrs[i].v.b;
}

/* Items on the stack for calls up to this many tensors. */
#define STACK_ITEMS 32

static em_status run_fused_with(const em_kernel_ctx *k, step_call *c, int n_states,
                                const char *const *names, const bool *required, bool has_master,
                                const item_scalars *own) {
    int count = list_count(k);
    item stack[STACK_ITEMS], *items = stack;
    if (count > STACK_ITEMS && !(items = cpu_scratch(k, (size_t)count * sizeof *items)))
        return em_last_status(); /* "<op>: out of memory for ... kernel workspace" */
    em_status st = build_items(k, n_states, names, required, has_master, items);
    for (int j = 0; st == EM_OK && own && j < count; j++) items[j].scalars = &own[j];
    if (st == EM_OK) {
        c->items = items;
        c->count = count;
        c->f64 = k->out[0].dtype == EM_F64;
        run_call(k, c);
    }
    return st; /* items: the stack or workspace */
}

static em_status run_fused(const em_kernel_ctx *k, step_call *c, int n_states,
                           const char *const *names, const bool *required) {
    return run_fused_with(k, c, n_states, names, required, true, NULL);
}

static em_status k_fused_sgd(const em_kernel_ctx *k) {
    double lr = fattr(k, 0), mom = fattr(k, 1), damp = fattr(k, 2), wd = fattr(k, 3);
    bool nesterov = battr(k, 4), maximize = battr(k, 5), fresh = battr(k, 6);
    double sign = maximize ? -1 : 1;
    sgd_f32 s32 = {(float)-lr, (float)mom, (float)(1 - damp), (float)wd, (float)sign};
    sgd_f64 s64 = {-lr, mom, 1 - damp, wd, sign};
    step_call c = {.variant = sgd_variant(mom != 0, fresh, nesterov, wd != 0), .adam = false,
                   .scalars = k->out[0].dtype == EM_F64 ? (const void *)&s64 : (const void *)&s32};
    static const char *const names[] = {"momentum_buffer"};
    const bool required[] = {mom != 0};
    return run_fused(k, &c, 1, names, required);
}

static em_status fused_adam(const em_kernel_ctx *k, bool decoupled) {
    double lr = fattr(k, 0), b1 = fattr(k, 1), b2 = fattr(k, 2), eps = fattr(k, 3),
           wd = fattr(k, 4), step = fattr(k, 5);
    bool amsgrad = battr(k, 6), maximize = battr(k, 7);
    if (!(step >= 1))
        return em_set_error(EM_ERR_INVALID, "%s: step must be at least 1 (the count after this "
                            "update); got %g", em_op_name(k->op), step);
    double bc1 = 1 - pow(b1, step), bc2_sqrt = sqrt(1 - pow(b2, step)), step_size = lr / bc1;
    double decay = 1 - lr * wd;
    adam_f32 s32 = {(float)b1, (float)(1 - b1), (float)b2, (float)(1 - b2), (float)eps,
                    (float)wd, (float)decay, (float)bc2_sqrt, (float)-step_size,
                    maximize ? -1.0f : 1.0f};
    adam_f64 s64 = {b1, 1 - b1, b2, 1 - b2, eps, wd, decay, bc2_sqrt, -step_size,
                    maximize ? -1.0 : 1.0};
    step_call c = {.variant = adam_variant(amsgrad, decoupled, wd != 0), .adam = true,
                   .scalars = k->out[0].dtype == EM_F64 ? (const void *)&s64 : (const void *)&s32};
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    const bool required[] = {true, true, amsgrad};
    return run_fused(k, &c, 3, names, required);
}
static em_status k_fused_adam(const em_kernel_ctx *k) { return fused_adam(k, false); }
static em_status k_fused_adamw(const em_kernel_ctx *k) { return fused_adam(k, true); }

/* ---- the capturable forms: lr and Adam's step count read from (device) memory -------------- */

/* Tensor j of a scalar list (lr or steps): a 0-dim float64 tensor. */
static em_status scalar_of(const em_kernel_ctx *k, const em_ktensor *t, const char *list, int j,
                           double *v) {
    if (!t->data)
        return em_set_error(EM_ERR_INVALID, "%s: the %s list is required", em_op_name(k->op),
                            list);
    if (t->dtype != EM_F64 || t->ndim != 0)
        return em_set_error(EM_ERR_DTYPE, "%s: %s %d is %s with %d dims; it must be a 0-dim "
                            "float64 tensor", em_op_name(k->op), list, j,
                            em_dtype_name(t->dtype), t->ndim);
    *v = *(const double *)t->data;
    return EM_OK;
}

/* Per-tensor scalars on the stack for calls up to this many tensors. */
static item_scalars *own_scalars(const em_kernel_ctx *k, item_scalars *stack, int count) {
    return count <= STACK_ITEMS ? stack : cpu_scratch(k, (size_t)count * sizeof *stack);
}

static em_status k_fused_sgd_capturable(const em_kernel_ctx *k) {
    double mom = fattr(k, 0), damp = fattr(k, 1), wd = fattr(k, 2);
    bool nesterov = battr(k, 3), maximize = battr(k, 4), fresh = battr(k, 5);
    double sign = maximize ? -1 : 1;
    int count = list_count(k);
    bool f64 = k->out[0].dtype == EM_F64;
    item_scalars stack[STACK_ITEMS], *own = own_scalars(k, stack, count);
    if (!own) return em_last_status();
    for (int j = 0; j < count; j++) {
        double lr;
        em_status st = scalar_of(k, &k->in[count + j], "lr", j, &lr);
        if (st != EM_OK) return st;
        if (f64) own[j].s64 = (sgd_f64){-lr, mom, 1 - damp, wd, sign};
        else own[j].s32 = (sgd_f32){(float)-lr, (float)mom, (float)(1 - damp), (float)wd,
                                    (float)sign};
    }
    step_call c = {.variant = sgd_variant(mom != 0, fresh, nesterov, wd != 0), .adam = false};
    static const char *const names[] = {"momentum_buffer"};
    const bool required[] = {mom != 0};
    return run_fused_with(k, &c, 1, names, required, true, own);
}

static em_status fused_adam_capturable(const em_kernel_ctx *k, bool decoupled) {
    double b1 = fattr(k, 0), b2 = fattr(k, 1), eps = fattr(k, 2), wd = fattr(k, 3);
    bool maximize = battr(k, 4);
    int count = list_count(k);
    const em_ktensor *steps = k->out + (size_t)3 * (size_t)count;
    if (k->out[0].dtype != EM_F32 && k->out[0].dtype != EM_F64)
        return em_set_error(EM_ERR_DTYPE, "%s: the params are %s; the capturable form takes "
                            "float32 and float64 params (no master weights)", em_op_name(k->op),
                            em_dtype_name(k->out[0].dtype));
    bool f64 = k->out[0].dtype == EM_F64;
    item_scalars stack[STACK_ITEMS], *own = own_scalars(k, stack, count);
    if (!own) return em_last_status();
    for (int j = 0; j < count; j++) {
        double lr, step;
        em_status st = scalar_of(k, &k->in[count + j], "lr", j, &lr);
        if (st == EM_OK) st = scalar_of(k, &steps[j], "steps", j, &step);
        if (st != EM_OK) return st;
        if (!(step >= 0))
            return em_set_error(EM_ERR_INVALID, "%s: steps %d is %g; a step count is at least "
                                "0", em_op_name(k->op), j, step);
        step += 1; /* the count after this update, as fused_adam's attribute */
        /* fused_adam's scalars, from this tensor's lr and count */
        double bc1 = 1 - pow(b1, step), bc2_sqrt = sqrt(1 - pow(b2, step)), step_size = lr / bc1;
        double decay = 1 - lr * wd;
        if (f64)
            own[j].a64 = (adam_f64){b1, 1 - b1, b2, 1 - b2, eps, wd, decay, bc2_sqrt, -step_size,
                                    maximize ? -1.0 : 1.0};
        else
            own[j].a32 = (adam_f32){(float)b1, (float)(1 - b1), (float)b2, (float)(1 - b2),
                                    (float)eps, (float)wd, (float)decay, (float)bc2_sqrt,
                                    (float)-step_size, maximize ? -1.0f : 1.0f};
    }
    step_call c = {.variant = adam_variant(false, decoupled, wd != 0), .adam = true};
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    const bool required[] = {true, true, false};
    em_status st = run_fused_with(k, &c, 2, names, required, false, own);
    for (int j = 0; st == EM_OK && j < count; j++) *(double *)steps[j].data += 1;
    return st;
}
static em_status k_fused_adam_capturable(const em_kernel_ctx *k) {
    return fused_adam_capturable(k, false);
}
static em_status k_fused_adamw_capturable(const em_kernel_ctx *k) {
    return fused_adam_capturable(k, true);
}

/* ---- amp_unscale_: the gradient scaler's check-and-unscale ----------------------------------- */

typedef struct unscale_ctx {
    em_dtype dt;
    float inv32;
    double inv64;
    atomic_int found;
} unscale_ctx;

/* One run of n elements of one grad (ptrs[0], in place). */
static void unscale_run(char **ptrs, const int64_t *strides, int64_t n, void *arg) {
    unscale_ctx *c = arg;
    char *p = ptrs[0];
    int64_t st = strides[0];
    int bad = 0;
    switch (c->dt) {
    case EM_F32:
        for (int64_t i = 0; i < n; i++, p += st) {
            float *v = (float *)p;
            bad |= !isfinite(*v);
            *v = *v * c->inv32;
        }
        break;
    case EM_F64:
        for (int64_t i = 0; i < n; i++, p += st) {
            double *v = (double *)p;
            bad |= !isfinite(*v);
            *v = *v * c->inv64;
        }
        break;
    case EM_F16:
        for (int64_t i = 0; i < n; i++, p += st) {
            uint16_t *v = (uint16_t *)p;
            float f = cpu_h2f(*v);
            bad |= !isfinite(f);
            *v = cpu_f2h(f * c->inv32);
        }
        break;
    default: /* EM_BF16 */
        for (int64_t i = 0; i < n; i++, p += st) {
            uint16_t *v = (uint16_t *)p;
            float f = cpu_b2f(*v);
            bad |= !isfinite(f);
            *v = cpu_f2b(f * c->inv32);
        }
        break;
    }
    if (bad) atomic_store_explicit(&c->found, 1, memory_order_relaxed);
}

/* Output list 0: the grads (updated in place); list 1: one 0-dim float32 flag per grad. */
static em_status k_amp_unscale(const em_kernel_ctx *k) {
    int count = k->n_out / 2;
    double inv = k->attrs[0].v.f;
    for (int j = 0; j < count; j++) {
        const em_ktensor *g = &k->out[j], *flag = &k->out[count + j];
        if (flag->dtype != EM_F32)
            return em_set_error(EM_ERR_DTYPE, "amp_unscale_: found_inf flag %d is %s; the "
                                "flags are float32", j, em_dtype_name(flag->dtype));
        unscale_ctx c = {.dt = g->dtype, .inv32 = (float)inv, .inv64 = (double)(float)inv};
        atomic_init(&c.found, 0);
        const em_ktensor *ts[1] = {g};
        if (g->numel) cpu_foreach(k, 1, ts, unscale_run, &c, CPU_GRAIN);
        *(float *)flag->data = atomic_load(&c.found) ? 1.0f : 0.0f;
    }
    return EM_OK;
}

em_status cpu_register_optim(em_registry *r) {
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    const int n = (int)(sizeof flt / sizeof *flt);
    em_status st = cpu_register_kernels(r, "fused_sgd", flt, n, k_fused_sgd, "cpu_fused_sgd");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "fused_adam", flt, n, k_fused_adam, "cpu_fused_adam");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "fused_adamw", flt, n, k_fused_adamw, "cpu_fused_adamw");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "amp_unscale_", flt, n, k_amp_unscale, "cpu_amp_unscale");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "fused_sgd_capturable", flt, n, k_fused_sgd_capturable,
                                  "cpu_fused_sgd_capturable");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "fused_adam_capturable", flt, 2, k_fused_adam_capturable,
                                  "cpu_fused_adam_capturable");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "fused_adamw_capturable", flt, 2, k_fused_adamw_capturable,
                                  "cpu_fused_adamw_capturable");
    return st;
}

/*
 * cpu_nn.c — CPU kernels of the neural-network ops (conv2d, pooling, batch_norm, layer_norm,
 * softmax and their backward helpers; contracts in core/ops_nn.c).
 *
 * Two layers: plain loops for f32 and f64 (cpu_nn_loops.h, instantiated here per type; conv
 * is im2col + OpenBLAS GEMM), registered at priority 0; and oneDNN primitives for f32
 * (below) at priority 10, which decline (supports()) what oneDNN cannot do exactly
 * as PyTorch, falling through to the loops. EMBER_CPU_DISABLE_DNNL=1 in the environment when
 * the plugin registers (em_init) leaves the loops alone, so tests can compare both paths.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <dnnl.h>
#include <pthread.h>
#include <string.h>

#include "cpu.h"

#define EM_CPU_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EM_CPU_MAX(a, b) ((a) > (b) ? (a) : (b))

/* A convolution's geometry, from x (N, C, H, W), w (O, C/g, kH, kW), y (N, O, OH, OW) and the
 * attributes stride, padding, dilation, groups. */
typedef struct nn_conv {
    int64_t N, C, H, W, O, kh, kw, OH, OW, sh, sw, ph, pw, dh, dw, g;
} nn_conv;

static inline nn_conv nn_conv_geom(const em_ktensor *x, const em_ktensor *w, const em_ktensor *y,
                                   const em_attr *a) {
    return (nn_conv){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                     .O = w->shape[0], .kh = w->shape[2], .kw = w->shape[3],
                     .OH = y->shape[2], .OW = y->shape[3], .sh = a[0].ints[0],
                     .sw = a[0].ints[1], .ph = a[1].ints[0], .pw = a[1].ints[1],
                     .dh = a[2].ints[0], .dw = a[2].ints[1], .g = a[3].v.i};
}

/* fn(ctx, lo, hi) over [0, n), split into one contiguous range per thread when the total
 * work (n * per_item) is worth it; otherwise called once on this thread. */
typedef void (*nn_range_fn)(void *ctx, int64_t lo, int64_t hi);
static void nn_parallel(int64_t n, int64_t per_item, nn_range_fn fn, void *ctx) {
    int nt = em_num_threads();
    if (n <= 0) return;
    if (nt <= 1 || n < 2 || n * per_item < CPU_GRAIN) {
        fn(ctx, 0, n);
        return;
    }
    if (nt > n) nt = (int)n;
#pragma omp parallel num_threads(nt)
    {
        int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
        int64_t lo = n * t / T, hi = n * (t + 1) / T;
        if (lo < hi) fn(ctx, lo, hi);
    }
}

/* A pooling's geometry from x (N, C, H, W) and y (N, C, OH, OW); max pooling's attributes
 * are kernel, stride, padding, dilation, ceil_mode; average pooling's kernel, stride,
 * padding, ceil_mode, count_include_pad. */
typedef struct nn_pool {
    int64_t N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
    bool cip;
} nn_pool;

static inline nn_pool nn_pool_geom(const em_ktensor *x, const em_ktensor *y, const em_attr *a,
                                   bool max) {
    return (nn_pool){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                     .OH = y->shape[2], .OW = y->shape[3], .kh = a[0].ints[0],
                     .kw = a[0].ints[1], .sh = a[1].ints[0], .sw = a[1].ints[1],
                     .ph = a[2].ints[0], .pw = a[2].ints[1], .dh = max ? a[3].ints[0] : 1,
                     .dw = max ? a[3].ints[1] : 1, .cip = !max && a[4].v.b};
}

/* Elements per normalised row of layer_norm: the product of the last k dims. */
static inline int64_t nn_ln_d(const em_ktensor *x, int k) {
    int64_t d = 1;
    for (int i = x->ndim - k; i < x->ndim; i++) d *= x->shape[i];
    return d;
}

enum { NN_SOFTMAX, NN_LOG_SOFTMAX, NN_SOFTMAX_BWD, NN_LOG_SOFTMAX_BWD };
typedef struct nn_sm {
    const em_kernel_ctx *k;
    int kind, n_in;
    int64_t outer, D, inner;
} nn_sm;

static nn_sm nn_sm_geom(const em_kernel_ctx *k) {
    const char *name = em_op_name(k->op);
    nn_sm c = {.k = k, .n_in = k->n_in, .outer = 1, .D = 1, .inner = 1};
    c.kind = strcmp(name, "softmax") == 0            ? NN_SOFTMAX
             : strcmp(name, "log_softmax") == 0      ? NN_LOG_SOFTMAX
             : strcmp(name, "softmax_backward") == 0 ? NN_SOFTMAX_BWD
                                                     : NN_LOG_SOFTMAX_BWD;
    const em_ktensor *x = &k->in[0];
    int d = (int)k->attrs[0].v.i;
    for (int i = 0; i < x->ndim; i++) {
        if (i < d) c.outer *= x->shape[i];
        else if (i == d) c.D = x->shape[i];
        else c.inner *= x->shape[i];
    }
    if (x->numel == 0) c.outer = 0;
    return c;
}

#define T float
#define S(name) name##_f32
#define GEMM cblas_sgemm
#include "cpu_nn_loops.h"
#undef T
#undef S
#undef GEMM

#define T double
#define S(name) name##_f64
#define GEMM cblas_dgemm
#include "cpu_nn_loops.h"
#undef T
#undef S
#undef GEMM

/* Every operand contiguous (the contract: the public functions make them so); an op called
 * directly with strided inputs gets an error instead of wrong numbers. */
static em_status nn_check_dense(const em_kernel_ctx *k) {
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (!t->contiguous)
            return em_set_error(EM_ERR_INVALID, "%s: the CPU kernel needs contiguous operands; "
                                "%s %d is strided (call the em_ function, which copies)",
                                em_op_name(k->op), i < k->n_in ? "input" : "output",
                                i < k->n_in ? i : i - k->n_in);
    }
    return EM_OK;
}

#define NN_KERNEL(name)                                                                        \
    static em_status k_##name(const em_kernel_ctx *k) {                                        \
        em_status st = nn_check_dense(k);                                                      \
        if (st != EM_OK) return st;                                                            \
        return k->out[0].dtype == EM_F64 ? name##_f64(k) : name##_f32(k);                      \
    }
NN_KERNEL(conv2d_gemm)
NN_KERNEL(conv2d_bwd_data_gemm)
NN_KERNEL(conv2d_bwd_weight_gemm)
NN_KERNEL(max_pool2d)
NN_KERNEL(max_pool2d_bwd)
NN_KERNEL(avg_pool2d)
NN_KERNEL(avg_pool2d_bwd)
NN_KERNEL(adaptive_avg_pool2d)
NN_KERNEL(batch_norm)
NN_KERNEL(batch_norm_bwd)
NN_KERNEL(layer_norm)
NN_KERNEL(layer_norm_bwd)
NN_KERNEL(softmax_any)
#undef NN_KERNEL

/* ---- oneDNN: f32 convolution ----------------------------------------------------------------- */

/*
 * The f32 convolution kernels through oneDNN primitives (forward, backward data, backward
 * weights), with a primitive cache.
 *
 * Layouts are PyTorch's own (nchw activations, oihw / goihw weights): the tensors go to
 * oneDNN without reorders. The cache maps a key (primitive kind, dtype, every size, stride,
 * padding, dilation, groups, bias or not) to a created primitive; it is shared by all
 * threads behind a mutex held only for look-up and creation, holds at most DN_CACHE_CAP
 * primitives (later shapes get a primitive created and destroyed per call) and is emptied
 * at plugin shutdown. Each call creates its own stream and memory objects (cheap on the
 * CPU) and a user scratchpad, so concurrent calls on one primitive are safe.
 *
 * A kernel declines (supports() false, the im2col loops run instead) when an operand is
 * empty or strided, or oneDNN refuses the descriptor.
 */
#define DN_CACHE_CAP 512
#define DN_MAX_ARGS 4

enum { DN_CONV_FWD = 1, DN_CONV_BWD_DATA = 2, DN_CONV_BWD_WEIGHT = 3 };

typedef struct dn_key {
    int kind, dtype, has_bias, pad_;
    nn_conv geom;
} dn_key;

typedef struct dn_prim {
    dn_key key;
    dnnl_primitive_t prim;
    size_t scratch; /* bytes of user scratchpad */
    int nargs;
    int arg[DN_MAX_ARGS];            /* DNNL_ARG_* in the order the kernel passes pointers */
    dnnl_memory_desc_t md[DN_MAX_ARGS];
} dn_prim;

static pthread_mutex_t dn_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t dn_engine;
static dn_prim *dn_cache[DN_CACHE_CAP];
static int dn_count;

/* ---- building primitives ---------------------------------------------------------------------- */

static dnnl_status_t conv_build(dn_prim *p) {
    const nn_conv *g = &p->key.geom;
    dnnl_memory_desc_t src, dst, w, b;
    dnnl_dims_t sd = {g->N, g->C, g->H, g->W}, dd = {g->N, g->O, g->OH, g->OW}, bd = {g->O};
    dnnl_dims_t wd5 = {g->g, g->O / g->g, g->C / g->g, g->kh, g->kw},
                wd4 = {g->O, g->C, g->kh, g->kw};
    dnnl_dims_t strides = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1}, pl = {g->ph, g->pw};
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, dnnl_nchw);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, dnnl_nchw);
    if (s == dnnl_success)
        s = g->g > 1 ? dnnl_memory_desc_init_by_tag(&w, 5, wd5, dnnl_f32, dnnl_goihw)
                     : dnnl_memory_desc_init_by_tag(&w, 4, wd4, dnnl_f32, dnnl_oihw);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x);
    if (s != dnnl_success) return s;
    bool bias = p->key.has_bias || p->key.kind == DN_CONV_BWD_WEIGHT;
    dnnl_convolution_desc_t fd, bdsc;
    s = dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                   dnnl_convolution_direct, &src, &w,
                                                   bias ? &b : NULL, &dst, strides, dil, pl, pl);
    if (s != dnnl_success) return s;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&fpd, &fd, attr, dn_engine, NULL);
    if (s == dnnl_success) {
        switch (p->key.kind) {
        case DN_CONV_FWD:
            pd = fpd, fpd = NULL;
            p->nargs = bias ? 4 : 3;
            p->arg[0] = DNNL_ARG_SRC, p->md[0] = src;
            p->arg[1] = DNNL_ARG_WEIGHTS, p->md[1] = w;
            p->arg[2] = DNNL_ARG_DST, p->md[2] = dst;
            p->arg[3] = DNNL_ARG_BIAS, p->md[3] = b;
            break;
        case DN_CONV_BWD_DATA:
            s = dnnl_dilated_convolution_backward_data_desc_init(
                &bdsc, dnnl_convolution_direct, &src, &w, &dst, strides, dil, pl, pl);
            if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &bdsc, attr, dn_engine, fpd);
            p->nargs = 3;
            p->arg[0] = DNNL_ARG_DIFF_DST, p->md[0] = dst;
            p->arg[1] = DNNL_ARG_WEIGHTS, p->md[1] = w;
            p->arg[2] = DNNL_ARG_DIFF_SRC, p->md[2] = src;
            break;
        default:
            s = dnnl_dilated_convolution_backward_weights_desc_init(
                &bdsc, dnnl_convolution_direct, &src, &w, &b, &dst, strides, dil, pl, pl);
            if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &bdsc, attr, dn_engine, fpd);
            p->nargs = 4;
            p->arg[0] = DNNL_ARG_SRC, p->md[0] = src;
            p->arg[1] = DNNL_ARG_DIFF_DST, p->md[1] = dst;
            p->arg[2] = DNNL_ARG_DIFF_WEIGHTS, p->md[2] = w;
            p->arg[3] = DNNL_ARG_DIFF_BIAS, p->md[3] = b;
            break;
        }
    }
    if (s == dnnl_success) {
        p->scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
        s = dnnl_primitive_create(&p->prim, pd);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return s;
}

static void dn_free(dn_prim *p) {
    if (!p) return;
    if (p->prim) dnnl_primitive_destroy(p->prim);
    free(p);
}

/* The primitive for key, from the cache or built now. *owned: the caller destroys it (the
 * cache was full). NULL when oneDNN refuses it. */
static dn_prim *dn_get(const dn_key *key, bool *owned) {
    *owned = false;
    pthread_mutex_lock(&dn_lock);
    if (!dn_engine && dnnl_engine_create(&dn_engine, dnnl_cpu, 0) != dnnl_success) {
        dn_engine = NULL;
        pthread_mutex_unlock(&dn_lock);
        return NULL;
    }
    for (int i = 0; i < dn_count; i++)
        if (memcmp(&dn_cache[i]->key, key, sizeof *key) == 0) {
            dn_prim *p = dn_cache[i];
            pthread_mutex_unlock(&dn_lock);
            return p;
        }
    dn_prim *p = calloc(1, sizeof *p);
    if (p) {
        p->key = *key;
        if (conv_build(p) != dnnl_success) {
            dn_free(p);
            p = NULL;
        } else if (dn_count < DN_CACHE_CAP) {
            dn_cache[dn_count++] = p;
        } else {
            *owned = true;
        }
    }
    pthread_mutex_unlock(&dn_lock);
    return p;
}

static em_status dn_exec(const dn_prim *p, void *const *ptrs, const char *who) {
    dnnl_memory_t mem[DN_MAX_ARGS + 1] = {0};
    dnnl_exec_arg_t args[DN_MAX_ARGS + 1];
    dnnl_stream_t stream = NULL;
    dnnl_memory_desc_t smd;
    void *scratch = p->scratch ? em_host_alloc(p->scratch, 64) : NULL;
    if (p->scratch && !scratch)
        return em_set_error(EM_ERR_NOMEM, "%s: out of memory for a %zu-byte oneDNN scratchpad",
                            who, p->scratch);
    int n = p->nargs;
    dnnl_status_t s = dnnl_stream_create(&stream, dn_engine, dnnl_stream_default_flags);
    for (int i = 0; i < n && s == dnnl_success; i++) {
        s = dnnl_memory_create(&mem[i], &p->md[i], dn_engine, ptrs[i]);
        args[i] = (dnnl_exec_arg_t){.arg = p->arg[i], .memory = mem[i]};
    }
    if (s == dnnl_success && p->scratch) {
        const dnnl_dims_t d = {(dnnl_dim_t)p->scratch};
        s = dnnl_memory_desc_init_by_tag(&smd, 1, d, dnnl_u8, dnnl_x);
        if (s == dnnl_success) s = dnnl_memory_create(&mem[n], &smd, dn_engine, scratch);
        args[n++] = (dnnl_exec_arg_t){.arg = DNNL_ARG_SCRATCHPAD, .memory = mem[p->nargs]};
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(p->prim, stream, n, args);
    if (s == dnnl_success) s = dnnl_stream_wait(stream);
    for (int i = 0; i <= DN_MAX_ARGS; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    if (stream) dnnl_stream_destroy(stream);
    em_host_free(scratch);
    if (s != dnnl_success)
        return em_set_error(EM_ERR_DEVICE, "%s: oneDNN failed with status %d", who, (int)s);
    return EM_OK;
}

/* ---- kernels ---------------------------------------------------------------------------------- */

/* The key of a call; false when oneDNN should not be asked (empty or strided operands). */
static bool conv_key(const em_kernel_ctx *k, int kind, dn_key *key) {
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        bool optional_bias = kind == DN_CONV_FWD && i == 2;
        if (!t->contiguous || t->dtype != EM_F32 || (t->numel == 0 && !optional_bias))
            return false;
    }
    memset(key, 0, sizeof *key);
    key->kind = kind;
    key->dtype = EM_F32;
    if (kind == DN_CONV_FWD) {
        key->geom = nn_conv_geom(&k->in[0], &k->in[1], &k->out[0], k->attrs);
        key->has_bias = k->in[2].numel > 0;
    } else if (kind == DN_CONV_BWD_DATA) {
        key->geom = nn_conv_geom(&k->out[0], &k->in[1], &k->in[0], k->attrs);
    } else {
        key->geom = nn_conv_geom(&k->in[0], &k->out[0], &k->in[1], k->attrs);
    }
    return true;
}

static bool conv_supports(const em_kernel_ctx *k) {
    dn_key key;
    bool owned;
    if (!conv_key(k, (int)(intptr_t)k->user, &key)) return false;
    dn_prim *p = dn_get(&key, &owned);
    if (owned) dn_free(p);
    return p != NULL;
}

static em_status k_conv(const em_kernel_ctx *k) {
    int kind = (int)(intptr_t)k->user;
    dn_key key;
    bool owned;
    if (!conv_key(k, kind, &key))
        return em_set_error(EM_ERR_INVALID, "%s: the oneDNN kernel was called on operands it "
                            "declined", em_op_name(k->op));
    dn_prim *p = dn_get(&key, &owned);
    if (!p)
        return em_set_error(EM_ERR_DEVICE, "%s: oneDNN refused the convolution",
                            em_op_name(k->op));
    void *ptrs[DN_MAX_ARGS];
    switch (kind) {
    case DN_CONV_FWD: /* src, weights, dst, bias */
        ptrs[0] = k->in[0].data, ptrs[1] = k->in[1].data, ptrs[2] = k->out[0].data;
        ptrs[3] = k->in[2].data;
        break;
    case DN_CONV_BWD_DATA: /* diff_dst, weights, diff_src */
        ptrs[0] = k->in[0].data, ptrs[1] = k->in[1].data, ptrs[2] = k->out[0].data;
        break;
    default: /* src, diff_dst, diff_weights, diff_bias */
        ptrs[0] = k->in[0].data, ptrs[1] = k->in[1].data, ptrs[2] = k->out[0].data;
        ptrs[3] = k->out[1].data;
        break;
    }
    em_status st = dn_exec(p, ptrs, em_op_name(k->op));
    if (owned) dn_free(p);
    return st;
}

static em_status dnnl_register(em_registry *r) {
    static const struct {
        const char *op, *name;
        int kind;
    } ks[] = {
        {"conv2d", "cpu_conv2d_dnnl_f32", DN_CONV_FWD},
        {"conv2d_backward_data", "cpu_conv2d_backward_data_dnnl_f32", DN_CONV_BWD_DATA},
        {"conv2d_backward_weight", "cpu_conv2d_backward_weight_dnnl_f32", DN_CONV_BWD_WEIGHT},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        em_kernel_def def = {.struct_size = sizeof def, .op = ks[i].op, .device_type = "cpu",
                             .dtype = EM_F32, .priority = 10, .fn = k_conv,
                             .supports = conv_supports, .name = ks[i].name,
                             .user = (void *)(intptr_t)ks[i].kind};
        em_status st = em_kernel_register(r, &def, NULL);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static void dnnl_shutdown(void) {
    pthread_mutex_lock(&dn_lock);
    for (int i = 0; i < dn_count; i++) dn_free(dn_cache[i]);
    dn_count = 0;
    if (dn_engine) dnnl_engine_destroy(dn_engine);
    dn_engine = NULL;
    pthread_mutex_unlock(&dn_lock);
}

/* ---- registration ------------------------------------------------------------------------------ */

em_status cpu_register_nn(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    static const struct {
        const char *op;
        em_kernel_fn fn;
        const char *name;
    } loops[] = {
        {"conv2d", k_conv2d_gemm, "cpu_conv2d_im2col"},
        {"conv2d_backward_data", k_conv2d_bwd_data_gemm, "cpu_conv2d_backward_data_col2im"},
        {"conv2d_backward_weight", k_conv2d_bwd_weight_gemm, "cpu_conv2d_backward_weight_im2col"},
        {"max_pool2d", k_max_pool2d, "cpu_max_pool2d"},
        {"max_pool2d_backward", k_max_pool2d_bwd, "cpu_max_pool2d_backward"},
        {"avg_pool2d", k_avg_pool2d, "cpu_avg_pool2d"},
        {"avg_pool2d_backward", k_avg_pool2d_bwd, "cpu_avg_pool2d_backward"},
        {"adaptive_avg_pool2d", k_adaptive_avg_pool2d, "cpu_adaptive_avg_pool2d"},
        {"adaptive_avg_pool2d_backward", k_adaptive_avg_pool2d, "cpu_adaptive_avg_pool2d_backward"},
        {"batch_norm", k_batch_norm, "cpu_batch_norm"},
        {"batch_norm_backward", k_batch_norm_bwd, "cpu_batch_norm_backward"},
        {"layer_norm", k_layer_norm, "cpu_layer_norm"},
        {"layer_norm_backward", k_layer_norm_bwd, "cpu_layer_norm_backward"},
        {"softmax", k_softmax_any, "cpu_softmax"},
        {"log_softmax", k_softmax_any, "cpu_log_softmax"},
        {"softmax_backward", k_softmax_any, "cpu_softmax_backward"},
        {"log_softmax_backward", k_softmax_any, "cpu_log_softmax_backward"},
    };
    em_status st = EM_OK;
    for (size_t i = 0; i < sizeof loops / sizeof loops[0] && st == EM_OK; i++)
        st = cpu_register_kernels(r, loops[i].op, dts, 2, loops[i].fn, loops[i].name);
    const char *off = getenv("EMBER_CPU_DISABLE_DNNL");
    if (st == EM_OK && !(off && strcmp(off, "1") == 0)) st = dnnl_register(r);
    return st;
}

void cpu_shutdown_nn(void) { dnnl_shutdown(); }

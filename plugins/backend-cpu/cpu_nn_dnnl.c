/*
 * cpu_nn_dnnl.c — the f32 and bf16 kernels of the nn family through oneDNN primitives: conv2d (forward
 * and conv2d_relu's, f32 only: conv2d's forward, then relu in place over its output,
 * backward data, backward weight), avg_pool2d and adaptive_avg_pool2d (forward, backward;
 * the adaptive op when its windows are a plain pooling), batch_norm and layer_norm (forward,
 * backward), softmax and log_softmax (forward, backward). Registered at priority 10 above the
 * plain loops of cpu_nn.c; each kernel's supports() declines what oneDNN cannot do exactly as
 * PyTorch (strided or empty operands, avg_pool2d divisors oneDNN does not have, a descriptor
 * oneDNN refuses), and the loops run instead. max_pool2d stays on the loops: oneDNN's
 * workspace holds a window offset per output, not PyTorch's i64 plane index, and its max
 * does not let NaN win as PyTorch's does.
 *
 * bf16 (registered for EM_BF16 with the same functions): activations, conv weights and bias,
 * and their grads are bf16; the norms' scale, shift and statistics are f32 (oneDNN's
 * interface; core/ops_nn.c makes them so). oneDNN accumulates in f32 and rounds each result
 * once (jit_bf16 convolutions on AVX512_BF16, f32 reduction buffers for backward weights). A
 * primitive for which oneDNN only has a reference implementation (f32 softmax over an inner
 * dim; bf16 on a CPU without AVX-512) is declined: our loops, or the core's f32 path for
 * bf16, are faster. f16 is not
 * registered: oneDNN 2.6 has no f16 convolution, pooling, normalisation or softmax on CPUs
 * without AVX512-FP16 (it refuses the descriptors), so f16 takes the core's f32 path.
 *
 * Storage layouts (em_layout; docs/performance.md, "Design (a)"): the f32 convolutions
 * declare nChw16c (accepts_layouts) and pass a blocked activation (x, y, gy, gx) to oneDNN as
 * it is, with a dnnl_nChw16c descriptor, in any mix with plain (nchw or nhwc) ones; weights
 * and biases are always plain (conv_layouts). oneDNN's f32 kernels on AVX-512 take nChw16c
 * when left to choose (format any), so a blocked activation is not reordered; conv1's
 * forward reads its one-channel image as nchw and writes nChw16c. conv2d_relu's relu runs
 * over the output's bytes in any layout. bf16 and the other ops see plain tensors only (the
 * core converts for them).
 *
 * The primitive cache maps a key (kind, every size, stride, padding, flag and epsilon of the
 * call, the activations' layouts) to an entry: the primitive, for each argument the layout
 * the kernel passes (nchw / row-major, nhwc or nChw16c) and the layout the primitive
 * prefers, with a cached reorder between them when they differ (convolutions use oneDNN's
 * blocked layouts: its direct JIT kernels were
 * 1.4-4 times faster here than the gemm ones it picks for nchw, one thread, reorders
 * included; backward data into fewer than 16 channels stays plain), and one execution state:
 * memory objects (re-pointed at each call's tensors with dnnl_memory_set_data_handle) and one
 * buffer holding the blocked copies; the scratchpad is kernel workspace of each call
 * (em_kernel_workspace), and the thread count and the oneDNN stream (on the plugin's one
 * engine, cpu_matmul.c's) the call's execution context's. A call that finds that
 * state in use (another thread on the same shape) builds a temporary one, so concurrent calls
 * are safe.
 * The cache is shared by all threads behind a mutex held for look-up and creation, holds at
 * most DN_CACHE_CAP entries and DN_BUF_CAP bytes of buffers (beyond that, calls use
 * temporary state or a temporary primitive), and is emptied at plugin shutdown.
 *
 * A convolution input's blocked copy made by the forward (x) or by backward-data (gy) is kept
 * (dn_copy, at most DN_COPY_CAP copies and DN_COPY_BYTES) and used by backward-weight instead
 * of a second reorder when the tensor is provably the same: same storage id, storage version,
 * data pointer and layout (em_kernel_ctx.storage_ids and .versions).
 *
 * Backward-weight on more than one thread does not hand oneDNN the threads: it runs one batch
 * chunk per thread, each through a one-thread primitive into f32 partial sums, and adds them
 * (conv_bwd_weight_split): oneDNN's own batch split waits in a spinning barrier. Those chunk
 * primitives read their slices of the shared copies of x and gy in place when the chunk's
 * layout is a slice of the whole batch's (blocked with the batch outermost: a chunk of images
 * is a contiguous range of the copy), and reorder their own slices otherwise. Backward-weight
 * reads x and gy in the layouts the forward chose (bwd_weights_pd).
 */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>
#include <pthread.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu_nn.h"

#define DN_CACHE_CAP 256
#define DN_BUF_CAP ((size_t)512 << 20)
#define DN_MAX_ARGS 10
#define DN_KEY_N 20

enum {
    DN_CONV_FWD = 1,
    DN_CONV_BWD_DATA,
    DN_CONV_BWD_WEIGHT,
    DN_AVG_FWD,
    DN_AVG_BWD,
    DN_ADAPTIVE_FWD,
    DN_ADAPTIVE_BWD,
    DN_BN_FWD,
    DN_BN_BWD,
    DN_LN_FWD,
    DN_LN_BWD,
    DN_SOFTMAX,
    DN_LOG_SOFTMAX,
    DN_SOFTMAX_BWD,
    DN_LOG_SOFTMAX_BWD,
};
/* With DN_CONV_FWD in a kernel's user pointer: conv2d_relu (conv2d's primitive, then relu in
 * place over its output). */
#define DN_RELU 0x100

/* A convolution activation's user layout (key v[18] and v[19], dn_arg.user): what the kernel
 * passes to oneDNN as it is. */
enum { DN_NCHW, DN_NHWC, DN_NCHW16C };

/* The identity of a primitive: its kind, the activations' data type (dnnl_f32 or dnnl_bf16)
 * and DN_KEY_N numbers (zero-filled), compared bytewise. */
typedef struct dn_key {
    int64_t kind, dt;
    int64_t v[DN_KEY_N];
} dn_key;

/* One argument of a primitive. The kernel passes its tensor in `user` layout; the primitive
 * reads or writes `prim`; reorder converts (user -> prim before an input is read, prim ->
 * user after an output is written) and is NULL when the two are the same. */
typedef struct dn_arg {
    int arg; /* DNNL_ARG_* */
    bool out;
    dnnl_memory_desc_t user, prim;
    dnnl_primitive_t reorder;
    size_t off; /* of the prim-layout copy in the state's buffer (when reorder) */
    int share;  /* DN_SHARE_*: an input's reordered copy kept for, or taken from, another call */
} dn_arg;

/* Shared reordered inputs. A convolution's input x is reordered to the blocked layout by the
 * forward and again by backward-weight, and its grad gy by backward-data and again by
 * backward-weight, the same layouts each time. The first call (DN_SHARE_PUT) reorders into a
 * dn_copy named by the tensor's contents — storage id (never reused), storage version (every
 * write bumps it), data pointer, the blocked descriptor and the tensor's own layout (a
 * storage converted from nChw16c to plain in place keeps its id and version) — and
 * backward-weight (DN_SHARE_TAKE) uses a copy with the same name instead of reordering,
 * then drops it. A name that differs in anything (x written in place between the calls, a
 * new storage at the same address) is a miss: the call reorders as before. Only
 * backward-weight takes, so a copy made by a forward is never served to a later forward. */
enum { DN_SHARE_NONE, DN_SHARE_PUT, DN_SHARE_TAKE };
#define DN_COPY_CAP 8
#define DN_COPY_BYTES ((size_t)128 << 20)
typedef struct dn_copy {
    uint64_t id, version; /* 0, 0: empty */
    const void *data;
    dnnl_memory_desc_t md;   /* the blocked layout */
    dnnl_memory_desc_t user; /* the layout it was reordered from (nchw, nhwc, nChw16c) */
    dnnl_memory_t mem;       /* md on buf */
    void *buf;
    size_t bytes;
    int refs;   /* calls using it (one writer, or readers) */
    bool valid; /* filled by a call that succeeded */
    uint64_t used;
} dn_copy;

/* What one execution needs besides the primitive. */
typedef struct dn_state {
    dnnl_memory_t user[DN_MAX_ARGS], prim[DN_MAX_ARGS], scratch;
    void *buf;
} dn_state;

typedef struct dn_prim {
    dn_key key;
    dnnl_primitive_t prim;
    int nargs;
    dn_arg a[DN_MAX_ARGS];
    size_t scratch, buf_bytes; /* scratchpad (workspace per call), the state buffer */
    atomic_flag busy; /* `st` is in use by a call */
    bool st_ready, cached;
    dn_state st;
} dn_prim;

static pthread_mutex_t dn_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t dn_engine;
static dn_prim *dn_cache[DN_CACHE_CAP];
/* Keys oneDNN refused or we declined (the last DN_REFUSED_CAP, a ring): asked again, they are
 * answered without building a descriptor (tens of µs) on every call. */
#define DN_REFUSED_CAP 64
static dn_key dn_refused[DN_REFUSED_CAP];
static int dn_nrefused, dn_refused_next;
static int dn_count;
static size_t dn_buf_total; /* bytes of buffers held by cached states */
static dn_copy dn_copies[DN_COPY_CAP]; /* behind dn_lock */
static size_t dn_copy_total;
static uint64_t dn_copy_tick;

/* ---- building ---------------------------------------------------------------------------------- */

static dnnl_status_t md_plain(dnnl_memory_desc_t *md, int nd, const int64_t *dims,
                              dnnl_data_type_t dt) {
    static const dnnl_format_tag_t tags[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc,
                                             dnnl_abcd, dnnl_abcde};
    dnnl_dims_t d;
    for (int i = 0; i < nd; i++) d[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, nd, d, dt, tags[nd]);
}

/* Appends an argument whose primitive layout is queried from pd (what) and user layout is
 * given. */
static void arg_add(dn_prim *p, int arg, bool out, const dnnl_memory_desc_t *user,
                    const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    dn_arg *a = &p->a[p->nargs++];
    a->arg = arg;
    a->out = out;
    a->user = *user;
    const dnnl_memory_desc_t *q = pd ? dnnl_primitive_desc_query_md(pd, what, 0) : NULL;
    a->prim = q && q->ndims ? *q : *user;
}

/* Creates p->prim from pd and the reorders its arguments need; sizes the state's buffer. */
static dnnl_status_t finish(dn_prim *p, const_dnnl_primitive_desc_t pd) {
    dnnl_status_t s = dnnl_success;
    size_t off = 0;
    const char *impl = NULL;
    /* oneDNN's reference implementations are slower than our loops (f32 softmax over an
     * inner dim: 19.6 ms against 5.7 ms for (64, 10, 32, 32)) and than the f32 path for bf16:
     * declined. */
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl || strncmp(impl, "ref", 3) == 0)
        return dnnl_unimplemented;
    for (int i = 0; i < p->nargs && s == dnnl_success; i++) {
        dn_arg *a = &p->a[i];
        if (dnnl_memory_desc_equal(&a->user, &a->prim)) continue;
        dnnl_primitive_desc_t rpd = NULL;
        s = a->out ? dnnl_reorder_primitive_desc_create(&rpd, &a->prim, dn_engine, &a->user,
                                                        dn_engine, NULL)
                   : dnnl_reorder_primitive_desc_create(&rpd, &a->user, dn_engine, &a->prim,
                                                        dn_engine, NULL);
        if (s == dnnl_success) s = dnnl_primitive_create(&a->reorder, rpd);
        if (rpd) dnnl_primitive_desc_destroy(rpd);
        a->off = off;
        off += (dnnl_memory_desc_get_size(&a->prim) + 63) & ~(size_t)63;
    }
    if (s != dnnl_success) return s;
    p->scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    p->buf_bytes = off; /* the scratchpad is kernel workspace, per call (dn_exec_shared) */
    return dnnl_primitive_create(&p->prim, pd);
}

static dnnl_primitive_attr_t attr_user_scratch(void) {
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

/* Creates a primitive descriptor (fwd_hint may be NULL) with a user scratchpad. */
static dnnl_status_t pd_create(dnnl_primitive_desc_t *pd, const void *desc,
                               const_dnnl_primitive_desc_t hint) {
    dnnl_primitive_attr_t attr = attr_user_scratch();
    if (!attr) return dnnl_out_of_memory;
    dnnl_status_t s = dnnl_primitive_desc_create(pd, desc, attr, dn_engine, hint);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

/* A forward on fixed nhwc f32 activations with one input channel per group (fewer than
 * FWD_BRG_MIN_C): oneDNN 2.6 lists brgconv first there, which for the CNN's first convolution
 * took 1.2x the CPU time of its jit:avx512_core kernel on the same nhwc tensors with cold
 * caches (medians 0.75 against 0.62 ms) and 1.3-1.6x with warm ones (bench/README.md,
 * "conv1's primitive", bench/conv_impls); from 2 channels on neither wins on every shape. *fpd is replaced by the first
 * implementation after it that is neither brgconv nor a reference one, with the same
 * attributes; none, *fpd is kept. conv2d and conv2d_relu take
 * the same choice, so their bits agree. */
#define FWD_BRG_MIN_C 2
static dnnl_status_t fwd_skip_brgconv(dnnl_primitive_desc_t *fpd, const void *desc) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(*fpd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl || strncmp(impl, "brgconv", 7) != 0)
        return dnnl_success;
    dnnl_primitive_attr_t attr = attr_user_scratch();
    if (!attr) return dnnl_out_of_memory;
    dnnl_primitive_desc_iterator_t it = NULL;
    dnnl_status_t s = dnnl_primitive_desc_iterator_create(&it, desc, attr, dn_engine, NULL);
    while (s == dnnl_success && dnnl_primitive_desc_iterator_next(it) == dnnl_success) {
        dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
        if (!pd) break;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl && strncmp(impl, "ref", 3) != 0 && strncmp(impl, "brgconv", 7) != 0) {
            dnnl_primitive_desc_destroy(*fpd);
            *fpd = pd;
            break;
        }
        dnnl_primitive_desc_destroy(pd);
    }
    if (it) dnnl_primitive_desc_iterator_destroy(it);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

/* Backward-weight's descriptor: x and gy in the layouts the forward fpd chose for x and y,
 * when oneDNN has a kernel for that (not a reference one), else in the layouts it prefers
 * (asrc, adst: format any). Left to choose, oneDNN 2.6 gave a bf16 first convolution (C = 1:
 * forward on nchw x into nChw16c) an AMX backward-weight on nhwc x and gy, 1.7x the f32
 * time in bench/nn and spinning in its barrier on a busy 2-thread machine (train_cnn_b64_bf16's
 * CPU time 25.2 against 17.5 ms); on the forward's layouts it takes the avx512_core_bf16
 * kernel (0.89 against 1.27 ms), and x needs no copy. f32 already chose the forward's. */
static dnnl_status_t bwd_weights_pd(dnnl_primitive_desc_t *pd, const_dnnl_primitive_desc_t fpd,
                                    const dnnl_memory_desc_t *asrc, const dnnl_memory_desc_t *aw,
                                    const dnnl_memory_desc_t *b, const dnnl_memory_desc_t *adst,
                                    const dnnl_dims_t strides, const dnnl_dims_t dil,
                                    const dnnl_dims_t pl) {
    dnnl_convolution_desc_t d;
    const dnnl_memory_desc_t *fs = dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0),
                             *fd = dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0);
    *pd = NULL;
    if (fs && fs->ndims && fd && fd->ndims &&
        dnnl_dilated_convolution_backward_weights_desc_init(&d, dnnl_convolution_direct, fs, aw,
                                                            b, fd, strides, dil, pl,
                                                            pl) == dnnl_success &&
        pd_create(pd, &d, fpd) == dnnl_success) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(*pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
            impl && strncmp(impl, "ref", 3) != 0)
            return dnnl_success;
        dnnl_primitive_desc_destroy(*pd);
        *pd = NULL;
    }
    dnnl_status_t s = dnnl_dilated_convolution_backward_weights_desc_init(
        &d, dnnl_convolution_direct, asrc, aw, b, adst, strides, dil, pl, pl);
    return s == dnnl_success ? pd_create(pd, &d, fpd) : s;
}

/* Convolutions: key v = N, C, H, W, O, kh, kw, OH, OW, sh, sw, ph, pw, dh, dw, g, has_bias,
 * chunk, the layouts of x (gx) and of y (gy) (DN_NCHW, DN_NHWC, DN_NCHW16C: the user side
 * of those arguments, so calls on tensors in different layouts never share an entry);
 * conv2d_relu's forward is conv2d's primitive: the same key. Activations and weights in
 * whatever layout oneDNN prefers (format any). chunk (1):
 * a backward-weight over one batch chunk of conv_bwd_weight_split, made for one thread, its
 * diff_weights and diff_bias in f32 (the partial sums), x and gy read from the caller's
 * tensors (no shared copies: those hold the whole batch). */
static dnnl_status_t build_conv(dn_prim *p) {
    const int64_t *v = p->key.v;
    int64_t N = v[0], C = v[1], H = v[2], W = v[3], O = v[4], kh = v[5], kw = v[6], OH = v[7],
            OW = v[8], g = v[15];
    dnnl_data_type_t dt = (dnnl_data_type_t)p->key.dt;
    bool bias = v[16] || p->key.kind == DN_CONV_BWD_WEIGHT;
    dnnl_memory_desc_t src, dst, w, b, asrc, adst, aw;
    dnnl_dims_t sd = {N, C, H, W}, dd = {N, O, OH, OW}, bd = {O};
    dnnl_dims_t wd5 = {g, O / g, C / g, kh, kw}, wd4 = {O, C, kh, kw};
    dnnl_dims_t strides = {v[9], v[10]}, pl = {v[11], v[12]}, dil = {v[13] - 1, v[14] - 1};
    /* nhwc (v[18] and v[19]): channels-last activations, passed as they are with the
     * primitive fixed to that layout, so no reorder is made (docs/performance.md: on AVX2
     * every jit:avx2 kernel nChw8c has exists for nhwc, as fast forward and backward-data,
     * faster backward-weight). */
    const bool nhwc = v[18] == DN_NHWC && v[19] == DN_NHWC;
    const dnnl_format_tag_t act = nhwc ? dnnl_nhwc : dnnl_nchw;
    /* The tensors' own layouts (src, dst: the user side of each argument) are v[18] (x or gx)
     * and v[19] (y or gy): nchw, nhwc, or nChw16c for a storage in that layout
     * (EM_KCTX_LAYOUT). A blocked activation is passed as it is; the primitive takes format
     * any for it, as for plain nchw ones: for f32 on AVX-512 oneDNN's jit kernels then take
     * nChw16c, so there is no reorder (conv1's forward from one channel takes nchw x and
     * writes nChw16c, its backward-weight reads them so). Where the primitive prefers
     * another layout (a plain primitive below, another CPU), the cached reorders convert as
     * for nchw tensors. psrc, pdst: the plain layouts of a primitive fixed to them. */
    static const dnnl_format_tag_t tags[3] = {dnnl_nchw, dnnl_nhwc, dnnl_nChw16c};
    dnnl_memory_desc_t psrc, pdst;
    /* Except an f32 backward (data or weight) with at least 16 channels per group on both
     * sides on an AVX-512 CPU: there oneDNN's nChw16c kernels beat its nhwc ones by more than
     * the reorders of gy (made once, shared by backward-data and backward-weight), x and gx
     * cost (docs/performance.md, "Zen 4 AVX-512"), so the primitive takes its own layouts
     * (any) and the cached reorders convert from and to the nhwc tensors. The same for an f32
     * backward-weight from one input channel per group into at least 16: its nChw16c kernel
     * on gy is 2.5x the nhwc one, more than gy's reorder costs (bench/README.md, "conv1's
     * primitive"), and x (one channel) is the same memory in either layout. */
    const bool blocked_bwd =
        p->key.kind != DN_CONV_FWD && dt == dnnl_f32 && O / g >= 16 && cpu_nn_has_avx512() &&
        (C / g >= 16 || (p->key.kind == DN_CONV_BWD_WEIGHT && C / g == 1));
    const bool fixed = nhwc && !blocked_bwd;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&psrc, 4, sd, dt, act);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&pdst, 4, dd, dt, act);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&src, 4, sd, dt, tags[v[18]]);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&dst, 4, dd, dt, tags[v[19]]);
    if (s == dnnl_success)
        s = g > 1 ? dnnl_memory_desc_init_by_tag(&w, 5, wd5, dt, dnnl_goihw)
                  : dnnl_memory_desc_init_by_tag(&w, 4, wd4, dt, dnnl_oihw);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&b, 1, bd, dt, dnnl_x);
    bool chunk = p->key.kind == DN_CONV_BWD_WEIGHT && v[17];
    dnnl_memory_desc_t wf = w, bf = b, awf; /* diff_weights, diff_bias: f32 for a chunk */
    if (chunk && s == dnnl_success)
        s = g > 1 ? dnnl_memory_desc_init_by_tag(&wf, 5, wd5, dnnl_f32, dnnl_goihw)
                  : dnnl_memory_desc_init_by_tag(&wf, 4, wd4, dnnl_f32, dnnl_oihw);
    if (chunk && s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&bf, 1, bd, dnnl_f32, dnnl_x);
    /* Backward data into fewer than 16 channels per group: the blocked diff_src would be
     * mostly padding; oneDNN's gemm kernel on plain layouts was 8x faster here (C = 1), and
     * in bf16 3.7x (0.64 vs 2.4 ms CPU, bench/nn's conv1). */
    dnnl_format_tag_t any = p->key.kind == DN_CONV_BWD_DATA && C / g < 16 && !nhwc
                                ? dnnl_format_tag_undef
                                : dnnl_format_tag_any;
    if (any == dnnl_format_tag_undef) {
        asrc = psrc, adst = pdst, aw = w; /* a blocked gy or gx reordered */
    } else {
        if (s == dnnl_success) s = fixed ? (asrc = psrc, dnnl_success)
                                         : dnnl_memory_desc_init_by_tag(&asrc, 4, sd, dt, any);
        if (s == dnnl_success) s = fixed ? (adst = pdst, dnnl_success)
                                         : dnnl_memory_desc_init_by_tag(&adst, 4, dd, dt, any);
        if (s == dnnl_success)
            s = g > 1 ? dnnl_memory_desc_init_by_tag(&aw, 5, wd5, dt, any)
                      : dnnl_memory_desc_init_by_tag(&aw, 4, wd4, dt, any);
    }
    awf = aw;
    if (chunk && s == dnnl_success)
        s = g > 1 ? dnnl_memory_desc_init_by_tag(&awf, 5, wd5, dnnl_f32, dnnl_format_tag_any)
                  : dnnl_memory_desc_init_by_tag(&awf, 4, wd4, dnnl_f32, dnnl_format_tag_any);
    if (s != dnnl_success) return s;
    dnnl_convolution_desc_t fd, bdsc;
    s = dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                   dnnl_convolution_direct, &asrc, &aw,
                                                   bias ? &b : NULL, &adst, strides, dil, pl, pl);
    if (s != dnnl_success) return s;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    s = pd_create(&fpd, &fd, NULL);
    if (s == dnnl_success && p->key.kind == DN_CONV_FWD && fixed && dt == dnnl_f32 &&
        C / g < FWD_BRG_MIN_C)
        s = fwd_skip_brgconv(&fpd, &fd);
    if (s == dnnl_success) {
        switch (p->key.kind) {
        case DN_CONV_FWD: /* src, weights, dst, bias */
            pd = fpd, fpd = NULL;
            arg_add(p, DNNL_ARG_SRC, false, &src, pd, dnnl_query_src_md);
            p->a[p->nargs - 1].share = DN_SHARE_PUT;
            arg_add(p, DNNL_ARG_WEIGHTS, false, &w, pd, dnnl_query_weights_md);
            arg_add(p, DNNL_ARG_DST, true, &dst, pd, dnnl_query_dst_md);
            if (bias) arg_add(p, DNNL_ARG_BIAS, false, &b, NULL, 0);
            break;
        case DN_CONV_BWD_DATA: /* diff_dst, weights, diff_src */
            s = dnnl_dilated_convolution_backward_data_desc_init(
                &bdsc, dnnl_convolution_direct, &asrc, &aw, &adst, strides, dil, pl, pl);
            if (s == dnnl_success) s = pd_create(&pd, &bdsc, fpd);
            if (s != dnnl_success) break;
            arg_add(p, DNNL_ARG_DIFF_DST, false, &dst, pd, dnnl_query_diff_dst_md);
            p->a[p->nargs - 1].share = DN_SHARE_PUT;
            arg_add(p, DNNL_ARG_WEIGHTS, false, &w, pd, dnnl_query_weights_md);
            arg_add(p, DNNL_ARG_DIFF_SRC, true, &src, pd, dnnl_query_diff_src_md);
            break;
        default: /* src, diff_dst, diff_weights, diff_bias */
            s = bwd_weights_pd(&pd, fpd, &asrc, &awf, &bf, &adst, strides, dil, pl);
            if (s != dnnl_success) break;
            arg_add(p, DNNL_ARG_SRC, false, &src, pd, dnnl_query_src_md);
            p->a[p->nargs - 1].share = chunk ? DN_SHARE_NONE : DN_SHARE_TAKE;
            arg_add(p, DNNL_ARG_DIFF_DST, false, &dst, pd, dnnl_query_diff_dst_md);
            p->a[p->nargs - 1].share = chunk ? DN_SHARE_NONE : DN_SHARE_TAKE;
            arg_add(p, DNNL_ARG_DIFF_WEIGHTS, true, &wf, pd, dnnl_query_diff_weights_md);
            arg_add(p, DNNL_ARG_DIFF_BIAS, true, &bf, NULL, 0);
            break;
        }
    }
    if (s == dnnl_success) s = finish(p, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    return s;
}

/* Average pooling (plain nchw): key v = N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, pr_h, pr_w,
 * include_pad. Forward: src, dst; backward: diff_dst, diff_src. */
static dnnl_status_t build_avg(dn_prim *p) {
    const int64_t *v = p->key.v;
    bool fwd = p->key.kind == DN_AVG_FWD || p->key.kind == DN_ADAPTIVE_FWD;
    dnnl_memory_desc_t x, y;
    dnnl_data_type_t dt = (dnnl_data_type_t)p->key.dt;
    dnnl_status_t s = md_plain(&x, 4, (int64_t[]){v[0], v[1], v[2], v[3]}, dt);
    if (s == dnnl_success) s = md_plain(&y, 4, (int64_t[]){v[0], v[1], v[4], v[5]}, dt);
    if (s != dnnl_success) return s;
    dnnl_dims_t k = {v[6], v[7]}, st = {v[8], v[9]}, pl = {v[10], v[11]}, pr = {v[12], v[13]},
                dil = {0, 0};
    dnnl_alg_kind_t alg = v[14] ? dnnl_pooling_avg_include_padding : dnnl_pooling_avg_exclude_padding;
    dnnl_pooling_v2_desc_t fd, bd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    s = dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_training, alg, &x, &y, st, k, dil,
                                          pl, pr);
    if (s == dnnl_success) s = pd_create(&fpd, &fd, NULL);
    if (s == dnnl_success && fwd) {
        pd = fpd, fpd = NULL;
        arg_add(p, DNNL_ARG_SRC, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DST, true, &y, NULL, 0);
    } else if (s == dnnl_success) {
        s = dnnl_pooling_v2_backward_desc_init(&bd, alg, &x, &y, st, k, dil, pl, pr);
        if (s == dnnl_success) s = pd_create(&pd, &bd, fpd);
        arg_add(p, DNNL_ARG_DIFF_DST, false, &y, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_SRC, true, &x, NULL, 0);
    }
    if (s == dnnl_success) s = finish(p, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    return s;
}

/* batch_norm over x viewed as (N, C, S, 1): key v = N, C, S, flags, eps bits, training.
 * Forward: src, dst, mean, variance[, scale][, shift]; backward (always with scale and
 * shift, their grads being outputs of the op): src, diff_dst, mean, variance, scale, shift,
 * diff_src, diff_scale, diff_shift. */
static dnnl_status_t build_bn(dn_prim *p) {
    const int64_t *v = p->key.v;
    unsigned flags = (unsigned)v[3];
    float eps;
    double e;
    memcpy(&e, &v[4], sizeof e);
    eps = (float)e;
    bool training = v[5];
    dnnl_memory_desc_t x, c;
    dnnl_status_t s = md_plain(&x, 4, (int64_t[]){v[0], v[1], v[2], 1}, (dnnl_data_type_t)p->key.dt);
    if (s == dnnl_success) s = md_plain(&c, 1, (int64_t[]){v[1]}, dnnl_f32);
    if (s != dnnl_success) return s;
    dnnl_batch_normalization_desc_t fd, bd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    unsigned gs = training ? 0u : (unsigned)dnnl_use_global_stats;
    if (p->key.kind == DN_BN_FWD) {
        s = dnnl_batch_normalization_forward_desc_init(
            &fd, training ? dnnl_forward_training : dnnl_forward_inference, &x, eps, flags | gs);
        if (s == dnnl_success) s = pd_create(&pd, &fd, NULL);
        arg_add(p, DNNL_ARG_SRC, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DST, true, &x, NULL, 0);
        arg_add(p, DNNL_ARG_MEAN, training, &c, NULL, 0); /* outputs when training */
        arg_add(p, DNNL_ARG_VARIANCE, training, &c, NULL, 0);
        if (flags & dnnl_use_scale) arg_add(p, DNNL_ARG_SCALE, false, &c, NULL, 0);
        if (flags & dnnl_use_shift) arg_add(p, DNNL_ARG_SHIFT, false, &c, NULL, 0);
    } else {
        unsigned f = (unsigned)dnnl_use_scale | (unsigned)dnnl_use_shift | gs;
        s = dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &x, eps, f);
        if (s == dnnl_success) s = pd_create(&fpd, &fd, NULL);
        if (s == dnnl_success)
            s = dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &x, &x, eps, f);
        if (s == dnnl_success) s = pd_create(&pd, &bd, fpd);
        arg_add(p, DNNL_ARG_SRC, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_DST, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_MEAN, false, &c, NULL, 0);
        arg_add(p, DNNL_ARG_VARIANCE, false, &c, NULL, 0);
        arg_add(p, DNNL_ARG_SCALE, false, &c, NULL, 0);
        arg_add(p, DNNL_ARG_SHIFT, false, &c, NULL, 0); /* not read; execute wants it */
        arg_add(p, DNNL_ARG_DIFF_SRC, true, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_SCALE, true, &c, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_SHIFT, true, &c, NULL, 0);
    }
    if (s == dnnl_success) s = finish(p, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    return s;
}

/* layer_norm over x viewed as (rows, D): key v = rows, D, flags, eps bits. Forward: src, dst,
 * mean, variance[, scale][, shift]; backward (always with scale and shift): src, diff_dst,
 * mean, variance, scale, shift, diff_src, diff_scale, diff_shift. */
static dnnl_status_t build_ln(dn_prim *p) {
    const int64_t *v = p->key.v;
    unsigned flags = (unsigned)v[2];
    double e;
    memcpy(&e, &v[3], sizeof e);
    float eps = (float)e;
    dnnl_memory_desc_t x, st, d;
    dnnl_status_t s = md_plain(&x, 2, (int64_t[]){v[0], v[1]}, (dnnl_data_type_t)p->key.dt);
    if (s == dnnl_success) s = md_plain(&st, 1, (int64_t[]){v[0]}, dnnl_f32);
    if (s == dnnl_success) s = md_plain(&d, 1, (int64_t[]){v[1]}, dnnl_f32);
    if (s != dnnl_success) return s;
    dnnl_layer_normalization_desc_t fd, bd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    if (p->key.kind == DN_LN_FWD) {
        s = dnnl_layer_normalization_forward_desc_init(&fd, dnnl_forward_training, &x, &st, eps,
                                                       flags);
        if (s == dnnl_success) s = pd_create(&pd, &fd, NULL);
        arg_add(p, DNNL_ARG_SRC, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DST, true, &x, NULL, 0);
        arg_add(p, DNNL_ARG_MEAN, true, &st, NULL, 0);
        arg_add(p, DNNL_ARG_VARIANCE, true, &st, NULL, 0);
        if (flags & dnnl_use_scale) arg_add(p, DNNL_ARG_SCALE, false, &d, NULL, 0);
        if (flags & dnnl_use_shift) arg_add(p, DNNL_ARG_SHIFT, false, &d, NULL, 0);
    } else {
        unsigned f = (unsigned)dnnl_use_scale | (unsigned)dnnl_use_shift;
        s = dnnl_layer_normalization_forward_desc_init(&fd, dnnl_forward_training, &x, &st, eps, f);
        if (s == dnnl_success) s = pd_create(&fpd, &fd, NULL);
        if (s == dnnl_success)
            s = dnnl_layer_normalization_backward_desc_init(&bd, dnnl_backward, &x, &x, &st, eps, f);
        if (s == dnnl_success) s = pd_create(&pd, &bd, fpd);
        arg_add(p, DNNL_ARG_SRC, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_DST, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_MEAN, false, &st, NULL, 0);
        arg_add(p, DNNL_ARG_VARIANCE, false, &st, NULL, 0);
        arg_add(p, DNNL_ARG_SCALE, false, &d, NULL, 0);
        arg_add(p, DNNL_ARG_SHIFT, false, &d, NULL, 0); /* not read; execute wants it */
        arg_add(p, DNNL_ARG_DIFF_SRC, true, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_SCALE, true, &d, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_SHIFT, true, &d, NULL, 0);
    }
    if (s == dnnl_success) s = finish(p, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    return s;
}

/* softmax / log_softmax over axis 1 of x viewed as (outer, D, inner): key v = outer, D, inner.
 * Forward: src, dst; backward: diff_dst, dst, diff_src. */
static dnnl_status_t build_softmax(dn_prim *p) {
    const int64_t *v = p->key.v;
    int kind = (int)p->key.kind;
    dnnl_alg_kind_t alg = kind == DN_LOG_SOFTMAX || kind == DN_LOG_SOFTMAX_BWD ? dnnl_softmax_log
                                                                              : dnnl_softmax_accurate;
    dnnl_memory_desc_t x;
    dnnl_status_t s = md_plain(&x, 3, (int64_t[]){v[0], v[1], v[2]}, (dnnl_data_type_t)p->key.dt);
    if (s != dnnl_success) return s;
    dnnl_softmax_v2_desc_t fd, bd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    s = dnnl_softmax_v2_forward_desc_init(&fd, dnnl_forward_training, alg, &x, &x, 1);
    if (s == dnnl_success) s = pd_create(&fpd, &fd, NULL);
    if (s == dnnl_success && (kind == DN_SOFTMAX || kind == DN_LOG_SOFTMAX)) {
        pd = fpd, fpd = NULL;
        arg_add(p, DNNL_ARG_SRC, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DST, true, &x, NULL, 0);
    } else if (s == dnnl_success) {
        s = dnnl_softmax_v2_backward_desc_init(&bd, alg, &x, &x, &x, 1);
        if (s == dnnl_success) s = pd_create(&pd, &bd, fpd);
        arg_add(p, DNNL_ARG_DIFF_DST, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DST, false, &x, NULL, 0);
        arg_add(p, DNNL_ARG_DIFF_SRC, true, &x, NULL, 0);
    }
    if (s == dnnl_success) s = finish(p, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    return s;
}

static dnnl_status_t build(dn_prim *p) {
    switch (p->key.kind) {
    case DN_CONV_FWD:
    case DN_CONV_BWD_DATA:
    case DN_CONV_BWD_WEIGHT: return build_conv(p);
    case DN_AVG_FWD:
    case DN_AVG_BWD:
    case DN_ADAPTIVE_FWD:
    case DN_ADAPTIVE_BWD: return build_avg(p);
    case DN_BN_FWD:
    case DN_BN_BWD: return build_bn(p);
    case DN_LN_FWD:
    case DN_LN_BWD: return build_ln(p);
    default: return build_softmax(p);
    }
}

/* ---- execution state --------------------------------------------------------------------------- */

static void state_free(dn_state *st) {
    for (int i = 0; i < DN_MAX_ARGS; i++) {
        if (st->user[i]) dnnl_memory_destroy(st->user[i]);
        if (st->prim[i]) dnnl_memory_destroy(st->prim[i]);
    }
    if (st->scratch) dnnl_memory_destroy(st->scratch);
    em_host_free(st->buf);
    memset(st, 0, sizeof *st);
}

static dnnl_status_t state_init(const dn_prim *p, dn_state *st) {
    memset(st, 0, sizeof *st);
    if (p->buf_bytes && !(st->buf = em_host_alloc(p->buf_bytes, 64))) return dnnl_out_of_memory;
    char *buf = st->buf;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < p->nargs && s == dnnl_success; i++) {
        const dn_arg *a = &p->a[i];
        s = dnnl_memory_create(&st->user[i], &a->user, dn_engine, DNNL_MEMORY_NONE);
        if (s == dnnl_success && a->reorder)
            s = dnnl_memory_create(&st->prim[i], &a->prim, dn_engine, buf + a->off);
    }
    if (s == dnnl_success && p->scratch) {
        const dnnl_dims_t d = {(dnnl_dim_t)p->scratch};
        dnnl_memory_desc_t md;
        s = dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_x);
        if (s == dnnl_success)
            s = dnnl_memory_create(&st->scratch, &md, dn_engine, DNNL_MEMORY_NONE);
    }
    if (s != dnnl_success) state_free(st);
    return s;
}

static void prim_free(dn_prim *p) {
    if (!p) return;
    if (p->st_ready) state_free(&p->st);
    for (int i = 0; i < p->nargs; i++)
        if (p->a[i].reorder) dnnl_primitive_destroy(p->a[i].reorder);
    if (p->prim) dnnl_primitive_destroy(p->prim);
    em_host_free(p);
}

/* The entry for key, from the cache or built now (not cached when the cache is full: the
 * caller frees it, *owned). NULL when oneDNN refuses the descriptor. */
static dn_prim *dn_get(const dn_key *key, bool *owned) {
    *owned = false;
    pthread_mutex_lock(&dn_lock);
    if (!dn_engine && !(dn_engine = cpu_dnnl_engine())) { /* cpu_matmul.c's, shared */
        pthread_mutex_unlock(&dn_lock);
        return NULL;
    }
    for (int i = 0; i < dn_count; i++)
        if (memcmp(&dn_cache[i]->key, key, sizeof *key) == 0) {
            dn_prim *p = dn_cache[i];
            /* Most recently used first: a training step's dozen entries stay at the front. */
            if (i > 0) {
                memmove(&dn_cache[1], &dn_cache[0], sizeof dn_cache[0] * (size_t)i);
                dn_cache[0] = p;
            }
            pthread_mutex_unlock(&dn_lock);
            return p;
        }
    for (int i = 0; i < dn_nrefused; i++)
        if (memcmp(&dn_refused[i], key, sizeof *key) == 0) {
            pthread_mutex_unlock(&dn_lock);
            return NULL;
        }
    dn_prim *p = em_host_alloc(sizeof *p, 64);
    if (p) {
        memset(p, 0, sizeof *p);
        p->key = *key;
        atomic_flag_clear(&p->busy);
        dnnl_status_t bs = build(p);
        if (bs != dnnl_success) {
            prim_free(p);
            p = NULL;
            if (bs == dnnl_unimplemented) { /* not for lack of memory: remember */
                dn_refused[dn_refused_next] = *key;
                dn_refused_next = (dn_refused_next + 1) % DN_REFUSED_CAP;
                if (dn_nrefused < DN_REFUSED_CAP) dn_nrefused++;
            }
        } else if (dn_count < DN_CACHE_CAP) {
            memmove(&dn_cache[1], &dn_cache[0], sizeof dn_cache[0] * (size_t)dn_count);
            dn_cache[0] = p;
            dn_count++;
            p->cached = true;
        } else {
            *owned = true;
        }
    }
    pthread_mutex_unlock(&dn_lock);
    return p;
}

/* The state a call runs with: the entry's own (created on first use, when the cache's buffer
 * budget allows) unless another call holds it, else *tmp, built now. NULL on failure. */
static dn_state *state_acquire(dn_prim *p, dn_state *tmp) {
    if (p->cached && !atomic_flag_test_and_set_explicit(&p->busy, memory_order_acquire)) {
        if (p->st_ready) return &p->st;
        bool fits;
        pthread_mutex_lock(&dn_lock);
        fits = dn_buf_total + p->buf_bytes <= DN_BUF_CAP;
        if (fits) dn_buf_total += p->buf_bytes;
        pthread_mutex_unlock(&dn_lock);
        if (fits && state_init(p, &p->st) == dnnl_success) {
            p->st_ready = true;
            return &p->st;
        }
        if (fits) {
            pthread_mutex_lock(&dn_lock);
            dn_buf_total -= p->buf_bytes;
            pthread_mutex_unlock(&dn_lock);
        }
        atomic_flag_clear_explicit(&p->busy, memory_order_release);
    }
    return state_init(p, tmp) == dnnl_success ? tmp : NULL;
}

static void state_release(dn_prim *p, dn_state *st) {
    if (st == &p->st) atomic_flag_clear_explicit(&p->busy, memory_order_release);
    else state_free(st);
}

/* What names a tensor's contents at a call: its data, storage id and version. */
typedef struct dn_name {
    const void *data;
    uint64_t id, version;
} dn_name;

/* The name of input i of the call k (id 0: none, when the core passes no ids). */
static dn_name input_name(const em_kernel_ctx *k, int i) {
    if (!EM_KCTX_HAS_IDS(k)) return (dn_name){0};
    return (dn_name){k->in[i].data, k->storage_ids[i], k->versions[i]};
}

static bool copy_names(const dn_copy *c, const dn_name *t, const dn_arg *a) {
    return c->id == t->id && c->version == t->version && c->data == t->data &&
           dnnl_memory_desc_equal(&c->md, &a->prim) && dnnl_memory_desc_equal(&c->user, &a->user);
}

static void copy_clear(dn_copy *c) {
    if (c->mem) dnnl_memory_destroy(c->mem);
    em_host_free(c->buf);
    dn_copy_total -= c->bytes;
    memset(c, 0, sizeof *c);
}

/* The copy argument a of a call on t uses (*filled: it holds t's contents already), or NULL:
 * reorder into the state's buffer as without sharing. */
static dn_copy *copy_acquire(const dn_arg *a, const dn_name *t, bool *filled) {
    *filled = false;
    if (!a->reorder || a->share == DN_SHARE_NONE || !t || !t->id) return NULL;
    /* A forward without grad (inference, no_grad) has no backward-weight to come. */
    if (a->share == DN_SHARE_PUT && a->arg == DNNL_ARG_SRC && !em_grad_enabled()) return NULL;
    dn_copy *c = NULL;
    pthread_mutex_lock(&dn_lock);
    if (a->share == DN_SHARE_TAKE) {
        for (int i = 0; i < DN_COPY_CAP && !c; i++)
            if (dn_copies[i].valid && copy_names(&dn_copies[i], t, a)) c = &dn_copies[i];
        if (c) c->refs++, *filled = true;
    } else {
        /* A slot no call uses: one of the right size (no new buffer), else an empty one, else
         * the least recently used; among equals, an invalid one, then the oldest. */
        size_t bytes = dnnl_memory_desc_get_size(&a->prim);
        int best = 0;
        for (int i = 0; i < DN_COPY_CAP; i++) {
            dn_copy *d = &dn_copies[i];
            if (d->refs) continue;
            int rank = (d->bytes == bytes ? 4 : !d->bytes ? 2 : 0) + !d->valid;
            if (!c || rank > best || (rank == best && d->used < c->used)) c = d, best = rank;
        }
        if (c && c->bytes != bytes) {
            copy_clear(c);
            if (dn_copy_total + bytes > DN_COPY_BYTES || !(c->buf = em_host_alloc(bytes, 64))) c = NULL;
            else c->bytes = bytes, dn_copy_total += bytes;
        }
        if (c) {
            if (c->mem) dnnl_memory_destroy(c->mem);
            c->mem = NULL;
            if (dnnl_memory_create(&c->mem, &a->prim, dn_engine, c->buf) != dnnl_success) {
                copy_clear(c);
                c = NULL;
            }
        }
        if (c) {
            c->id = t->id, c->version = t->version, c->data = t->data, c->md = a->prim;
            c->user = a->user;
            c->valid = false, c->refs = 1;
        }
    }
    if (c) c->used = ++dn_copy_tick;
    pthread_mutex_unlock(&dn_lock);
    return c;
}

/* Ends a call's use of c: a copy it filled becomes valid when the call succeeded; one it
 * took is dropped (its one reader is done). */
static void copy_release(dn_copy *c, int share, bool ok) {
    pthread_mutex_lock(&dn_lock);
    c->refs--;
    if (share == DN_SHARE_PUT) c->valid = ok;
    else c->valid = false;
    if (!c->valid && !c->refs) c->id = c->version = 0, c->data = NULL;
    pthread_mutex_unlock(&dn_lock);
}

/* Runs p on ptrs (one per argument, in the order the builder added them); kt (NULL, or one
 * per argument, NULL entries allowed) names the tensors whose reordered copies may be shared
 * (DN_SHARE_*). */
static em_status dn_exec_on(const em_kernel_ctx *k, dn_prim *p, void *const *ptrs,
                            const dn_name *const *kt, void *const *pre, void *pad, int nt,
                            const char *who);
static em_status dn_exec_shared(const em_kernel_ctx *k, dn_prim *p, void *const *ptrs,
                                const dn_name *const *kt, const char *who) {
    void *pad = NULL;
    if (p->scratch && !(pad = cpu_scratch(k, p->scratch))) return em_last_status();
    return dn_exec_on(k, p, ptrs, kt, NULL, pad, cpu_threads(k), who);
}

/* dn_exec_shared with the scratchpad given (p->scratch bytes, or NULL when none) and oneDNN's
 * regions on nt threads: what a call made from one of our own OpenMP threads uses (the
 * kernel's workspace list is not thread-safe; the primitive was made for one thread). */
static em_status dn_exec_on(const em_kernel_ctx *k, dn_prim *p, void *const *ptrs,
                            const dn_name *const *kt, void *const *pre, void *pad, int nt,
                            const char *who) {
    dn_state tmp, *st = state_acquire(p, &tmp);
    if (!st)
        return em_set_error(EM_ERR_NOMEM, "%s: out of memory for the oneDNN buffers (%zu bytes)",
                            who, p->buf_bytes);
    /* The stream: one of the call's execution context (its library handles). */
    cpu_ctx *cc = cpu_ctx_of(k);
    dnnl_stream_t strm = cpu_dnnl_stream_take(cc);
    if (!strm) {
        state_release(p, st);
        return em_set_error(EM_ERR_DEVICE, "%s: oneDNN could not make a stream", who);
    }
    /* oneDNN's OpenMP regions take the calling thread's max-threads setting. */
    if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
    dnnl_exec_arg_t args[DN_MAX_ARGS + 1];
    dn_copy *copy[DN_MAX_ARGS] = {0};
    int n = 0;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < p->nargs && s == dnnl_success; i++) {
        const dn_arg *a = &p->a[i];
        bool filled = false;
        copy[i] = kt ? copy_acquire(a, kt[i], &filled) : NULL;
        dnnl_memory_t pm = copy[i] ? copy[i]->mem : st->prim[i];
        s = dnnl_memory_set_data_handle(st->user[i], ptrs[i]);
        if (s == dnnl_success && a->reorder && !a->out && pre && pre[i]) { /* given in prim */
            s = dnnl_memory_set_data_handle(st->prim[i], pre[i]);
            filled = true;
        }
        if (s == dnnl_success && a->reorder && !a->out && !filled) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, st->user[i]}, {DNNL_ARG_TO, pm}};
            s = dnnl_primitive_execute(a->reorder, strm, 2, ra);
        }
        args[n++] = (dnnl_exec_arg_t){a->arg, a->reorder ? pm : st->user[i]};
    }
    if (p->scratch) {
        if (s == dnnl_success) s = dnnl_memory_set_data_handle(st->scratch, pad);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, st->scratch};
    }
    if (s == dnnl_success) s = dnnl_primitive_execute(p->prim, strm, n, args);
    for (int i = 0; i < p->nargs && s == dnnl_success; i++) {
        const dn_arg *a = &p->a[i];
        if (!a->reorder || !a->out) continue;
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, st->prim[i]}, {DNNL_ARG_TO, st->user[i]}};
        s = dnnl_primitive_execute(a->reorder, strm, 2, ra);
    }
    if (s == dnnl_success) s = dnnl_stream_wait(strm);
    else dnnl_stream_wait(strm); /* nothing of ours still running on a copy */
    for (int i = 0; i < p->nargs && pre; i++) /* the state's own buffer again */
        if (pre[i] && p->a[i].reorder && !p->a[i].out) {
            char *own = (char *)st->buf + p->a[i].off;
            dnnl_status_t r = dnnl_memory_set_data_handle(st->prim[i], own);
            if (s == dnnl_success) s = r;
        }
    for (int i = 0; i < p->nargs; i++)
        if (copy[i]) copy_release(copy[i], p->a[i].share, s == dnnl_success);
    state_release(p, st);
    cpu_dnnl_stream_put(cc, strm);
    if (s != dnnl_success)
        return em_set_error(EM_ERR_DEVICE, "%s: oneDNN failed with status %d", who, (int)s);
    return EM_OK;
}

/* Runs p on ptrs (one per argument, in the order the builder added them). */
static em_status dn_exec(const em_kernel_ctx *k, dn_prim *p, void *const *ptrs, const char *who) {
    return dn_exec_shared(k, p, ptrs, NULL, who);
}

/* ---- keys -------------------------------------------------------------------------------------- */

/* The operands (inputs, then outputs: bit i for operand i) that are f32 whatever the
 * activations' dtype: the norms' scale, shift and statistics (the contracts in
 * core/ops_nn.c). */
static unsigned stat_operands(int kind) {
    switch (kind) {
    case DN_BN_FWD: return 0xDE;  /* in w, b, running mean, var (1-4); out save_mean, invstd (6, 7) */
    case DN_LN_FWD: return 0x36;  /* in w, b (1, 2); out mean, rstd (4, 5) */
    case DN_BN_BWD:               /* in w, save_mean, save_invstd (2-4); out gw, gb (6, 7) */
    case DN_LN_BWD: return 0xDC;  /* in mean, rstd, w (2-4); out gw, gb (6, 7) */
    default: return 0;
    }
}

/* The activations f32 or bf16 (input 0's dtype, into *dt), the statistics f32, every
 * operand contiguous; the first input and the first output not empty (oneDNN has no
 * zero-size primitives; the loops, or the core's f32 path, handle those). */
/* A convolution's activations (x and y, or their grads: operands 0 and the output, or 0 and
 * 1 for backward-weight; the weight and bias are always plain): into lay[0] the layout of the
 * source side (x, or gx for backward-data), into lay[1] the destination side's (y, or gy).
 * A tensor whose storage is nChw16c (EM_KCTX_LAYOUT) is DN_NCHW16C; the others are all plain
 * nchw (DN_NCHW), or all nhwc (DN_NHWC, at least one of them not also plain). False for a
 * mixture oneDNN is not asked about, or a weight, bias or weight grad in a storage layout. */
static bool conv_layouts(const em_kernel_ctx *k, int kind, int lay[2]) {
    const bool bw = kind == DN_CONV_BWD_WEIGHT;
    const int ia[2] = {0, bw ? 1 : k->n_in}; /* the activations' operand indices */
    const em_ktensor *a[2] = {&k->in[0], bw ? &k->in[1] : &k->out[0]};
    int l[2];
    bool plain = true, nhwc = true, unblocked = false;
    for (int j = 0; j < 2; j++) {
        l[j] = EM_KCTX_LAYOUT(k, ia[j]) == EM_LAYOUT_NCHW16C ? DN_NCHW16C : DN_NCHW;
        if (l[j] == DN_NCHW16C) continue;
        unblocked = true;
        plain &= a[j]->contiguous;
        nhwc &= nn_dense_nhwc(a[j]);
    }
    /* the rest plain: never blocked (the core allocates no weight blocked, a caller might) */
    for (int i = 0; i < k->n_in + k->n_out; i++)
        if (i != ia[0] && i != ia[1] && EM_KCTX_LAYOUT(k, i) != EM_LAYOUT_PLAIN) return false;
    bool dn_sd = kind == DN_CONV_BWD_DATA; /* operand 0 is the destination side */
    if (unblocked && !plain) {
        if (!nhwc) return false;
        const em_ktensor *w = bw ? &k->out[0] : &k->in[1];
        if (!w->contiguous) return false;
        for (int i = 2; i < k->n_in; i++)
            if (!k->in[i].contiguous) return false;
        for (int i = bw ? 0 : 1; i < k->n_out; i++)
            if (!k->out[i].contiguous) return false;
        for (int j = 0; j < 2; j++)
            if (l[j] != DN_NCHW16C) l[j] = DN_NHWC;
    }
    lay[0] = l[dn_sd], lay[1] = l[!dn_sd];
    return true;
}

static bool operands_ok(const em_kernel_ctx *k, int kind, dnnl_data_type_t *dt) {
    em_dtype x = k->in[0].dtype;
    if (x != EM_F32 && x != EM_BF16) return false;
    unsigned stats = stat_operands(kind);
    bool conv = kind == DN_CONV_FWD || kind == DN_CONV_BWD_DATA || kind == DN_CONV_BWD_WEIGHT;
    int lay[2];
    if (conv && !conv_layouts(k, kind, lay)) return false;
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (t->dtype != ((stats >> i) & 1 ? EM_F32 : x) || (!conv && !t->contiguous)) return false;
    }
    *dt = x == EM_BF16 ? dnnl_bf16 : dnnl_f32;
    return k->in[0].numel > 0 && k->out[0].numel > 0;
}

static void put_double(int64_t *slot, double d) { memcpy(slot, &d, sizeof d); }

/* The key of a call; false when oneDNN should not be asked. */
static bool key_of(const em_kernel_ctx *k, int kind, dn_key *key) {
    dnnl_data_type_t dt;
    if (!operands_ok(k, kind, &dt)) return false;
    memset(key, 0, sizeof *key);
    key->kind = kind;
    key->dt = dt;
    int64_t *v = key->v;
    switch (kind) {
    case DN_CONV_FWD:
    case DN_CONV_BWD_DATA:
    case DN_CONV_BWD_WEIGHT: {
        nn_conv g = kind == DN_CONV_FWD        ? nn_conv_geom(&k->in[0], &k->in[1], &k->out[0], k->attrs)
                    : kind == DN_CONV_BWD_DATA ? nn_conv_geom(&k->out[0], &k->in[1], &k->in[0], k->attrs)
                                               : nn_conv_geom(&k->in[0], &k->out[0], &k->in[1], k->attrs);
        const int64_t gv[] = {g.N,  g.C,  g.H,  g.W,  g.O,  g.kh, g.kw, g.OH,
                              g.OW, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.g};
        memcpy(v, gv, sizeof gv);
        v[16] = kind == DN_CONV_FWD && k->in[2].numel > 0;
        int lay[2];
        conv_layouts(k, kind, lay); /* operands_ok checked it */
        v[18] = lay[0], v[19] = lay[1]; /* DN_NCHW, DN_NHWC, DN_NCHW16C: x (gx), y (gy) */
        /* conv2d_relu has conv2d's key: its kernel runs conv2d's primitive, then relu in
         * place over the output (relu_f32_inplace, the bits of conv2d then relu, -inf and
         * NaN included). oneDNN's ReLU post-ops were measured and dropped: a post-op relu
         * with alpha 0 is max(x, 0), which turns NaN into 0; the NaN-keeping chain of three
         * post-ops still left -inf as -inf, slowed the CNN's first convolution's jit kernel
         * by more than relu's own pass costs (cold caches: medians 0.62 -> 1.03 ms CPU;
         * bench/README.md, "conv1's primitive"), and left the output cold for the max
         * pooling that reads it next (0.40 against 0.15 ms CPU after the pass under load;
         * bench/README.md, "The max pooling after conv2d_relu"). */
        return true;
    }
    case DN_AVG_FWD:
    case DN_AVG_BWD:
    case DN_ADAPTIVE_FWD:
    case DN_ADAPTIVE_BWD: {
        bool fwd = kind == DN_AVG_FWD || kind == DN_ADAPTIVE_FWD;
        const em_ktensor *x = fwd ? &k->in[0] : &k->out[0], *y = fwd ? &k->out[0] : &k->in[0];
        nn_pool p;
        if (kind == DN_AVG_FWD || kind == DN_AVG_BWD) {
            p = nn_pool_geom(x, y, k->attrs, false);
        } else {
            /* Adaptive windows are a plain pooling when the sizes divide. */
            p = (nn_pool){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                          .OH = y->shape[2], .OW = y->shape[3]};
            if (p.H % p.OH || p.W % p.OW) return false;
            p.kh = p.sh = p.H / p.OH, p.kw = p.sw = p.W / p.OW;
        }
        /* Right padding that makes oneDNN's output size ours; with count_include_pad
         * PyTorch's divisor only counts padding up to `padding` on the right. */
        int64_t prh = (p.OH - 1) * p.sh + p.kh - p.H - p.ph, prw = (p.OW - 1) * p.sw + p.kw - p.W - p.pw;
        if (prh < 0) prh = 0;
        if (prw < 0) prw = 0;
        if ((p.H + p.ph + prh - p.kh) / p.sh + 1 != p.OH || (p.W + p.pw + prw - p.kw) / p.sw + 1 != p.OW)
            return false;
        if (p.cip && (prh > p.ph || prw > p.pw)) return false;
        /* A window wholly in padding: PyTorch gives 0, oneDNN's divisor would be 0. */
        if (!p.cip && (prh >= p.kh || prw >= p.kw || p.ph >= p.kh || p.pw >= p.kw)) return false;
        const int64_t pv[] = {p.N, p.C, p.H, p.W, p.OH, p.OW, p.kh, p.kw,
                              p.sh, p.sw, p.ph, p.pw, prh, prw, p.cip};
        memcpy(v, pv, sizeof pv);
        return true;
    }
    case DN_BN_FWD:
    case DN_BN_BWD: {
        const em_ktensor *x = kind == DN_BN_FWD ? &k->in[0] : &k->in[1];
        if (x->ndim < 2) return false;
        v[0] = x->shape[0], v[1] = x->shape[1], v[2] = x->numel / (v[0] * v[1]);
        unsigned flags = 0;
        if (kind == DN_BN_FWD) {
            if (k->in[1].numel) flags |= dnnl_use_scale;
            if (k->in[2].numel) flags |= dnnl_use_shift;
            put_double(&v[4], k->attrs[2].v.f);
        } else {
            put_double(&v[4], 0); /* the variance passed in is invstd^-2: no epsilon to add */
        }
        v[3] = flags;
        v[5] = k->attrs[0].v.b;
        if (kind == DN_BN_FWD && !v[5] && (!k->in[3].numel || !k->in[4].numel)) return false;
        return true;
    }
    case DN_LN_FWD:
    case DN_LN_BWD: {
        const em_ktensor *x = kind == DN_LN_FWD ? &k->in[0] : &k->in[1];
        int64_t D = nn_ln_d(x, (int)k->attrs[0].v.i);
        v[0] = x->numel / D, v[1] = D;
        unsigned flags = 0;
        if (kind == DN_LN_FWD) {
            if (k->in[1].numel) flags |= dnnl_use_scale;
            if (k->in[2].numel) flags |= dnnl_use_shift;
            put_double(&v[3], k->attrs[1].v.f);
        } else {
            put_double(&v[3], 0);
        }
        v[2] = flags;
        return true;
    }
    default: {
        nn_sm c = nn_sm_geom(k);
        v[0] = c.outer, v[1] = c.D, v[2] = c.inner;
        return true;
    }
    }
}

/* ---- kernels ----------------------------------------------------------------------------------- */

/* A scratch vector of n floats for statistics conversions (C or rows of them). */
static float *fbuf(const em_kernel_ctx *k, int64_t n, const char *who) {
    (void)who; /* the workspace's error names the op */
    return cpu_scratch(k, sizeof(float) * (size_t)(n > 0 ? n : 1));
}

static em_status run_bn_fwd(const em_kernel_ctx *k, dn_prim *p, const char *who) {
    const em_ktensor *x = &k->in[0];
    int64_t C = x->shape[1], M = x->numel / C;
    bool training = k->attrs[0].v.b;
    double mom = k->attrs[1].v.f, eps = k->attrs[2].v.f;
    float *var = fbuf(k, C, who), *sm = k->out[1].data, *si = k->out[2].data;
    float *rm = k->in[3].data, *rv = k->in[4].data;
    if (!var) return EM_ERR_NOMEM;
    void *ptrs[DN_MAX_ARGS];
    int n = 0;
    ptrs[n++] = x->data, ptrs[n++] = k->out[0].data;
    ptrs[n++] = training ? (void *)sm : (void *)rm;
    ptrs[n++] = training ? (void *)var : (void *)rv;
    if (k->in[1].numel) ptrs[n++] = k->in[1].data;
    if (k->in[2].numel) ptrs[n++] = k->in[2].data;
    em_status st = dn_exec(k, p, ptrs, who);
    for (int64_t c = 0; c < C && st == EM_OK; c++) {
        if (training) {
            si[c] = (float)(1.0 / sqrt((double)var[c] + eps));
            if (k->in[3].numel) rm[c] = (float)((1 - mom) * rm[c] + mom * sm[c]);
            if (k->in[4].numel && M > 1)
                rv[c] = (float)((1 - mom) * rv[c] + mom * (double)var[c] * (double)M / (double)(M - 1));
        } else {
            sm[c] = rm[c];
            si[c] = (float)(1.0 / sqrt((double)rv[c] + eps));
        }
    }
    return st; /* var: workspace */
}

/* Backward of batch_norm / layer_norm: variance = invstd^-2 (epsilon 0 in the primitive), the
 * scale w or ones. Inputs gy (0), x (1) and mean, invstd, w at the given positions; outputs
 * gx, gw, gb. */
static em_status run_norm_bwd(const em_kernel_ctx *k, dn_prim *p, int64_t nstat, int64_t nscale,
                              int mean_in, int w_in, const char *who) {
    float *buf = fbuf(k, nstat + nscale, who);
    if (!buf) return EM_ERR_NOMEM;
    const float *si = k->in[mean_in + 1].data, *w = k->in[w_in].data;
    float *var = buf, *ones = buf + nstat;
    for (int64_t i = 0; i < nstat; i++) var[i] = (float)(1.0 / ((double)si[i] * si[i]));
    if (!k->in[w_in].numel)
        for (int64_t i = 0; i < nscale; i++) ones[i] = 1;
    void *scale = k->in[w_in].numel ? (void *)w : (void *)ones;
    void *ptrs[DN_MAX_ARGS] = {k->in[1].data,  k->in[0].data,  k->in[mean_in].data, var,
                               scale,          scale,          k->out[0].data,
                               k->out[1].data, k->out[2].data};
    return dn_exec(k, p, ptrs, who); /* buf: workspace */
}

static em_status run_ln_fwd(const em_kernel_ctx *k, dn_prim *p, const char *who) {
    int64_t rows = p->key.v[0];
    double eps = k->attrs[1].v.f;
    float *rstd = k->out[2].data;
    void *ptrs[DN_MAX_ARGS];
    int n = 0;
    /* The variance lands in rstd's memory and is turned into rstd in place. */
    ptrs[n++] = k->in[0].data, ptrs[n++] = k->out[0].data, ptrs[n++] = k->out[1].data;
    ptrs[n++] = rstd;
    if (k->in[1].numel) ptrs[n++] = k->in[1].data;
    if (k->in[2].numel) ptrs[n++] = k->in[2].data;
    em_status st = dn_exec(k, p, ptrs, who);
    if (st == EM_OK)
        for (int64_t r = 0; r < rows; r++) rstd[r] = (float)(1.0 / sqrt((double)rstd[r] + eps));
    return st;
}

/* The bytes of one image in layout big (the whole batch) when a chunk of images at a multiple
 * of them is layout small exactly (the same blocked format, the batch outermost and unblocked,
 * no offset or padding of it): a chunk's reordered input can then be read in place from the
 * whole batch's copy. 0 when not. */
static size_t batch_slice_bytes(const dnnl_memory_desc_t *big, const dnnl_memory_desc_t *small) {
    const dnnl_blocking_desc_t *a = &big->format_desc.blocking, *b = &small->format_desc.blocking;
    if (big->ndims != 4 || small->ndims != 4 || big->format_kind != dnnl_blocked ||
        small->format_kind != dnnl_blocked || big->data_type != small->data_type ||
        big->offset0 || small->offset0 || big->extra.flags || small->extra.flags ||
        big->padded_dims[0] != big->dims[0] || small->padded_dims[0] != small->dims[0] ||
        a->inner_nblks != b->inner_nblks)
        return 0;
    for (int j = 0; j < 4; j++)
        if (a->strides[j] != b->strides[j] || big->padded_offsets[j] || small->padded_offsets[j] ||
            (j && (big->dims[j] != small->dims[j] || big->padded_dims[j] != small->padded_dims[j])))
            return 0;
    for (int j = 0; j < a->inner_nblks; j++)
        if (a->inner_blks[j] != b->inner_blks[j] || a->inner_idxs[j] != b->inner_idxs[j] ||
            a->inner_idxs[j] == 0)
            return 0;
    size_t img = (size_t)a->strides[0] * dnnl_data_type_size(big->data_type);
    /* the batch outermost and dense: the images one after another */
    if (img * (size_t)big->dims[0] != dnnl_memory_desc_get_size(big) ||
        img * (size_t)small->dims[0] != dnnl_memory_desc_get_size(small))
        return 0;
    return img;
}

/* Backward-weight on nt > 1 threads, split over the batch by us: one chunk of images per
 * thread, each through a primitive made for one thread (key v[17] = 1) into its own f32
 * partial sums, reading x and gy from the whole batch's shared copies (whole's arguments,
 * names: x's and gy's) where batch_slice_bytes allows, then the partials added in chunk order
 * and rounded once to the output dtype.
 * oneDNN 2.6 splits the batch itself when given several threads, but its threads meet in a
 * spinning barrier (and reduce): on a machine whose cores are shared, a thread waiting for a
 * descheduled one burns its time slice, and bench/nn measured conv2's bf16 backward-weight at
 * 8.2 ms CPU / 24 ms wall on 2 threads against 1.5 ms on one. Here the threads only meet at
 * the region's end (OpenMP's barrier, which sleeps under OMP_WAIT_POLICY=passive). *done is
 * false (and nothing written) when the split does not apply (one thread, fewer images than
 * threads, called from a parallel region) or oneDNN refuses a chunk primitive: the caller runs
 * the whole-batch primitive. */
static em_status conv_bwd_weight_split(const em_kernel_ctx *k, const dn_key *key, dn_prim *whole,
                                       const dn_name *const *names, const char *who, bool *done) {
    *done = false;
    int nt = cpu_threads(k);
    const int64_t N = key->v[0], O = key->v[4];
    const em_ktensor *x = &k->in[0], *gy = &k->in[1], *gw = &k->out[0], *gb = &k->out[1];
    if (nt < 2 || N < nt || omp_in_parallel() || gb->numel != O) return EM_OK;
    const int64_t sz[2] = {N / nt, (N + nt - 1) / nt}; /* the chunks' two possible sizes */
    dn_prim *pc[2] = {NULL, NULL};
    bool own[2] = {false, false};
    int prev = omp_get_max_threads();
    omp_set_num_threads(1); /* oneDNN sizes its work for the threads it sees when it is made */
    for (int i = 0; i < 2; i++) {
        if (i == 1 && sz[1] == sz[0]) break;
        dn_key ck = *key;
        ck.v[0] = sz[i];
        ck.v[17] = 1;
        pc[i] = dn_get(&ck, &own[i]);
    }
    omp_set_num_threads(prev);
    if (sz[1] == sz[0]) pc[1] = pc[0];
    em_status st = EM_OK;
    if (pc[0] && pc[1]) {
        *done = true;
        const size_t es = em_dtype_size(x->dtype);
        const int64_t xi = x->numel / N, gi = gy->numel / N, nw = gw->numel, np = nw + O;
        size_t scr = pc[0]->scratch > pc[1]->scratch ? pc[0]->scratch : pc[1]->scratch;
        scr = (scr + 63) & ~(size_t)63;
        const size_t part = (sizeof(float) * (size_t)np + 63) & ~(size_t)63, each = part + scr;
        char *ws = cpu_scratch(k, each * (size_t)nt + sizeof(em_status) * (size_t)nt);
        /* x's copy from the forward and gy's from backward-data, when they are there and each
         * chunk's layout is a slice of them: read in place instead of reordered again. */
        dn_copy *cp[2] = {NULL, NULL};
        size_t slice[2] = {0, 0};
        for (int i = 0; i < 2 && ws; i++) {
            slice[i] = batch_slice_bytes(&whole->a[i].prim, &pc[0]->a[i].prim);
            if (slice[i] && pc[1] != pc[0] &&
                batch_slice_bytes(&whole->a[i].prim, &pc[1]->a[i].prim) != slice[i])
                slice[i] = 0;
            bool filled = false;
            if (slice[i] && pc[0]->a[i].reorder && pc[1]->a[i].reorder)
                cp[i] = copy_acquire(&whole->a[i], names[i], &filled);
            if (cp[i] && !filled) {
                copy_release(cp[i], whole->a[i].share, false);
                cp[i] = NULL;
            }
        }
        if (!ws) {
            st = em_last_status();
        } else {
            em_status *cst = (em_status *)(ws + each * (size_t)nt);
#pragma omp parallel num_threads(nt)
            {
                int T = omp_get_num_threads();
                for (int c = omp_get_thread_num(); c < nt; c += T) {
                    int64_t lo = N * c / nt, hi = N * (c + 1) / nt;
                    dn_prim *p = hi - lo == sz[0] ? pc[0] : pc[1];
                    char *base = ws + each * (size_t)c;
                    float *pw = (float *)base;
                    void *ptrs[4] = {(char *)x->data + (size_t)(lo * xi) * es,
                                     (char *)gy->data + (size_t)(lo * gi) * es, pw, pw + nw};
                    void *pre[4] = {cp[0] ? (char *)cp[0]->buf + (size_t)lo * slice[0] : NULL,
                                    cp[1] ? (char *)cp[1]->buf + (size_t)lo * slice[1] : NULL,
                                    NULL, NULL};
                    cst[c] = dn_exec_on(k, p, ptrs, NULL, pre, p->scratch ? base + part : NULL,
                                        1, who);
                }
            }
            for (int i = 0; i < 2; i++)
                if (cp[i]) copy_release(cp[i], whole->a[i].share, true);
            for (int c = 0; c < nt && st == EM_OK; c++)
                if (cst[c] != EM_OK)
                    st = em_set_error(cst[c], "%s: oneDNN failed on batch chunk %d of %d", who,
                                      c, nt);
            if (st == EM_OK) {
                bool bf = gw->dtype == EM_BF16;
                for (int64_t j = 0; j < np; j++) {
                    float acc = ((const float *)ws)[j];
                    for (int c = 1; c < nt; c++) acc += ((const float *)(ws + each * (size_t)c))[j];
                    void *out = j < nw ? gw->data : gb->data;
                    int64_t o = j < nw ? j : j - nw;
                    if (bf) ((uint16_t *)out)[o] = cpu_f2b(acc);
                    else ((float *)out)[o] = acc;
                }
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (own[i] && pc[i]) prim_free(pc[i]);
    return st;
}

/* relu over n f32 values in place, Ember's relu bit for bit (x <= 0 ? +0 : x; NaN kept). The
 * if clause names the parallel construct: unnamed, OpenMP applies it to the simd construct
 * too, and on one thread the loop ran scalar with a branch per element (conv1's 1.6 M outputs
 * 3.4 ms CPU instead of 0.1: bench/README.md, "The convolution chain"). */
static void relu_f32_inplace(const em_kernel_ctx *k, float *y, int64_t n) {
    int nt = n >= CPU_GRAIN_MEM && !omp_in_parallel() ? cpu_threads(k) : 1;
#pragma omp parallel for simd num_threads(nt) if (parallel : nt > 1) schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] = y[i] <= 0 ? 0 : y[i];
}

static em_status k_dnnl(const em_kernel_ctx *k) {
    int kind = (int)((intptr_t)k->user & ~(intptr_t)DN_RELU);
    const char *who = em_op_name(k->op);
    dn_key key;
    bool owned;
    if (!key_of(k, kind, &key))
        return em_set_error(EM_ERR_INVALID, "%s: the oneDNN kernel was called on operands it "
                            "declined", who);
    dn_prim *p = dn_get(&key, &owned);
    if (!p) return em_set_error(EM_ERR_DEVICE, "%s: oneDNN refused the primitive", who);
    em_status st;
    const dn_name n0 = input_name(k, 0), n1 = k->n_in > 1 ? input_name(k, 1) : (dn_name){0};
    switch (kind) {
    case DN_CONV_FWD: /* src, weights, dst[, bias] */
        st = dn_exec_shared(k, p,
                            (void *[]){k->in[0].data, k->in[1].data, k->out[0].data, k->in[2].data},
                            (const dn_name *[]){&n0, NULL, NULL, NULL}, who);
        /* conv2d_relu: relu over the (dense) output in place */
        if (st == EM_OK && ((intptr_t)k->user & DN_RELU))
            relu_f32_inplace(k, (float *)k->out[0].data, k->out[0].numel);
        break;
    case DN_CONV_BWD_WEIGHT: { /* src, diff_dst, diff_weights, diff_bias */
        bool done;
        st = conv_bwd_weight_split(k, &key, p, (const dn_name *[]){&n0, &n1}, who, &done);
        if (done) break;
        st = dn_exec_shared(k, p,
                            (void *[]){k->in[0].data, k->in[1].data, k->out[0].data, k->out[1].data},
                            (const dn_name *[]){&n0, &n1, NULL, NULL}, who);
        break;
    }
    case DN_CONV_BWD_DATA: /* diff_dst, weights, diff_src */
        st = dn_exec_shared(k, p, (void *[]){k->in[0].data, k->in[1].data, k->out[0].data},
                            (const dn_name *[]){&n0, NULL, NULL}, who);
        break;
    case DN_SOFTMAX_BWD:
    case DN_LOG_SOFTMAX_BWD: /* diff_dst, dst, diff_src */
        st = dn_exec(k, p, (void *[]){k->in[0].data, k->in[1].data, k->out[0].data}, who);
        break;
    case DN_BN_FWD: st = run_bn_fwd(k, p, who); break;
    case DN_BN_BWD: st = run_norm_bwd(k, p, key.v[1], key.v[1], 3, 2, who); break;
    case DN_LN_FWD: st = run_ln_fwd(k, p, who); break;
    case DN_LN_BWD: st = run_norm_bwd(k, p, key.v[0], key.v[1], 2, 4, who); break;
    default: /* pooling and softmax forward: x, y; pooling backward: gy, gx */
        st = dn_exec(k, p, (void *[]){k->in[0].data, k->out[0].data}, who);
        break;
    }
    if (owned) prim_free(p);
    return st;
}

/* One supports() per kind (each kernel's user pointer is its kind too). */
static bool supports_kind(const em_kernel_ctx *k, int kind) {
    dn_key key;
    bool owned;
    if (!key_of(k, kind, &key)) return false;
    dn_prim *p = dn_get(&key, &owned);
    if (owned) prim_free(p);
    return p != NULL;
}

#define DN_SUPPORTS(K) \
    static bool supports_##K(const em_kernel_ctx *k) { return supports_kind(k, DN_##K); }
DN_SUPPORTS(CONV_FWD)
DN_SUPPORTS(CONV_BWD_DATA)
DN_SUPPORTS(CONV_BWD_WEIGHT)
DN_SUPPORTS(AVG_FWD)
DN_SUPPORTS(AVG_BWD)
DN_SUPPORTS(ADAPTIVE_FWD)
DN_SUPPORTS(ADAPTIVE_BWD)
DN_SUPPORTS(BN_FWD)
DN_SUPPORTS(BN_BWD)
DN_SUPPORTS(LN_FWD)
DN_SUPPORTS(LN_BWD)
DN_SUPPORTS(SOFTMAX)
DN_SUPPORTS(LOG_SOFTMAX)
DN_SUPPORTS(SOFTMAX_BWD)
DN_SUPPORTS(LOG_SOFTMAX_BWD)
#undef DN_SUPPORTS

em_status cpu_nn_dnnl_register(em_registry *r) {
    static const struct {
        const char *op, *name;
        int kind;
        em_kernel_supports_fn supports;
    } ks[] = {
        {"conv2d", "cpu_conv2d", DN_CONV_FWD, supports_CONV_FWD},
        {"conv2d_relu", "cpu_conv2d_relu", DN_CONV_FWD | DN_RELU, supports_CONV_FWD},
        {"conv2d_backward_data", "cpu_conv2d_backward_data",
         DN_CONV_BWD_DATA, supports_CONV_BWD_DATA},
        {"conv2d_backward_weight", "cpu_conv2d_backward_weight",
         DN_CONV_BWD_WEIGHT, supports_CONV_BWD_WEIGHT},
        {"avg_pool2d", "cpu_avg_pool2d", DN_AVG_FWD, supports_AVG_FWD},
        {"avg_pool2d_backward", "cpu_avg_pool2d_backward", DN_AVG_BWD, supports_AVG_BWD},
        {"adaptive_avg_pool2d", "cpu_adaptive_avg_pool2d",
         DN_ADAPTIVE_FWD, supports_ADAPTIVE_FWD},
        {"adaptive_avg_pool2d_backward", "cpu_adaptive_avg_pool2d_backward",
         DN_ADAPTIVE_BWD, supports_ADAPTIVE_BWD},
        {"batch_norm", "cpu_batch_norm", DN_BN_FWD, supports_BN_FWD},
        {"batch_norm_backward", "cpu_batch_norm_backward", DN_BN_BWD, supports_BN_BWD},
        {"layer_norm", "cpu_layer_norm", DN_LN_FWD, supports_LN_FWD},
        {"layer_norm_backward", "cpu_layer_norm_backward", DN_LN_BWD, supports_LN_BWD},
        {"softmax", "cpu_softmax", DN_SOFTMAX, supports_SOFTMAX},
        {"log_softmax", "cpu_log_softmax", DN_LOG_SOFTMAX, supports_LOG_SOFTMAX},
        {"softmax_backward", "cpu_softmax_backward", DN_SOFTMAX_BWD, supports_SOFTMAX_BWD},
        {"log_softmax_backward", "cpu_log_softmax_backward",
         DN_LOG_SOFTMAX_BWD, supports_LOG_SOFTMAX_BWD},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (int b = 0; b < 2; b++) {
            /* conv2d_relu: f32 only (its relu pass is f32); bf16 calls compose conv2d's
             * bf16 kernel and relu. */
            if (b && ks[i].kind == (DN_CONV_FWD | DN_RELU)) continue;
            /* "cpu_<op>_dnnl_f32" and "cpu_<op>_dnnl_bf16" */
            char name[96];
            snprintf(name, sizeof name, "%s_dnnl_%s", ks[i].name, b ? "bf16" : "f32");
            /* The f32 convolutions read and write nChw16c activations (conv_layouts); bf16
             * stays on nhwc (its kernels time the same in both: docs/performance.md). */
            int kind = ks[i].kind & ~DN_RELU;
            bool conv = kind == DN_CONV_FWD || kind == DN_CONV_BWD_DATA ||
                        kind == DN_CONV_BWD_WEIGHT;
            em_kernel_def def = {.struct_size = sizeof def, .op = ks[i].op, .device_type = "cpu",
                                 .dtype = b ? EM_BF16 : EM_F32, .priority = 10, .fn = k_dnnl,
                                 .supports = ks[i].supports, .name = name,
                                 .user = (void *)(intptr_t)ks[i].kind,
                                 .accepts_layouts = conv && !b ? CPU_NCHW16C : 0};
            em_status st = em_kernel_register(r, &def, NULL);
            if (st != EM_OK) return st;
        }
    return EM_OK;
}

void cpu_nn_dnnl_shutdown(void) {
    pthread_mutex_lock(&dn_lock);
    for (int i = 0; i < dn_count; i++) prim_free(dn_cache[i]);
    dn_count = 0;
    dn_nrefused = dn_refused_next = 0;
    dn_buf_total = 0;
    for (int i = 0; i < DN_COPY_CAP; i++) copy_clear(&dn_copies[i]);
    dn_copy_tick = 0;
    dn_engine = NULL; /* cpu_matmul.c's: destroyed by cpu_gemm_shutdown, after this */
    pthread_mutex_unlock(&dn_lock);
}

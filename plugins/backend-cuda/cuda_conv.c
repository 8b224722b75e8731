/*
 * cuda_conv.c — conv2d, conv2d_backward_data and conv2d_backward_weight (contracts in
 * core/ops_nn.c) on cuDNN 9's graph (backend) API, for f32, f16 and bf16: stride, padding,
 * dilation and groups (the weight's (O, C/groups, kH, kW) shape tells cuDNN the groups).
 *
 * Why the graph API: cuDNN 9 deprecates the legacy convolution calls (cudnnConvolutionForward,
 * cudnnFindConvolution*Algorithm, ...; cudnn_cnn.h marks them CUDNN_DEPRECATED) and the
 * graph API is what its newer engines are reached through. The C backend API needs only a
 * dozen entry points of libcudnn.so.9 (cuda_dnn.c), and its engines carry numerical notes, which
 * is how both settings below are honoured.
 *
 * One call: a plan for its shape — (op, dtype, the three shapes, stride, padding, dilation,
 * the operands' alignment, deterministic mode, TF32) — is looked up in the context's cache
 * (cuda_dnn.h) or built once: tensors, a convolution descriptor, an operation graph, then
 * cuDNN's heuristics (mode A, then the fallback mode) rank engine configurations and the
 * first one that passes the filters and finalizes into an execution plan is kept. Filters:
 *   - always: no engine that down-converts its inputs or reduces in reduced precision, so
 *     results stay within f32 tolerances of the CPU;
 *   - f32 with TF32 off (the plugin's one "set_float32_matmul_precision" setting, "highest"
 *     by default): no tensor-core engine (for f32 data that means TF32);
 *   - em_deterministic(): no engine with the non-deterministic note (atomics).
 * When no engine passes (or cuDNN cannot build the graph), the plan records that, and the
 * kernel's supports() declines the call, which then runs the plugin's direct kernel (cuda_nn.cu,
 * below this one in the stack; ember-opcheck lists such declined rows); cuda_conv_plan_counts
 * says how many plans of each kind were built. The plan is built in supports(), once per shape. The bias of conv2d and the bias gradient of
 * conv2d_backward_weight are the direct kernels' (cuda_conv2d_add_bias / _bias_grad).
 *
 * Workspace comes from the core's allocator for the call (em_kernel_workspace), at most
 * CONV_MAX_WORKSPACE bytes: engines asking for more are passed over.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_dnn.h"
#include "ember/dtype.h"

enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER };
#define CONV_MAX_WORKSPACE ((int64_t)1 << 30)
#define CONV_MAX_CFGS 16

/* What a plan depends on; compared with memcmp (zeroed before it is filled). */
typedef struct conv_key {
    int kind;
    int dtype;
    int64_t x[4], w[4], y[4]; /* (N, C, H, W), (O, C/g, kH, kW), (N, O, OH, OW) */
    int64_t stride[2], pad[2], dil[2];
    int64_t align;            /* the smallest alignment of the three pointers, at most 16 */
    int det, tf32;
} conv_key;

#define CONV_MAX_DESCS (8 + 2 * CONV_MAX_CFGS)

typedef struct cuda_conv_plan {
    conv_key key;
    cudnnBackendDescriptor_t plan; /* NULL: no engine took it; the direct kernels run */
    int64_t workspace;             /* bytes the plan needs */
    /* The descriptors the plan was built from (tensors, operation, graph, heuristics, engine
     * configurations), kept as long as the plan: cudnn-frontend keeps that chain alive with
     * its plans too, and cuDNN does not document that a plan owns copies. */
    cudnnBackendDescriptor_t keep[CONV_MAX_DESCS];
    int n_keep;
    struct cuda_conv_plan *next;
} cuda_conv_plan;

static atomic_int n_engine_plans, n_direct_plans;

void cuda_conv_plan_counts(int *engine, int *direct) {
    *engine = atomic_load(&n_engine_plans);
    *direct = atomic_load(&n_direct_plans);
}

void cuda_conv_plans_free(cuda_dnn_ctx *d) {
    const cuda_dnn_table *t = cuda_dnn();
    for (cuda_conv_plan *p = d->plans, *n; p; p = n) {
        n = p->next;
        if (p->plan && t) t->cudnnBackendDestroyDescriptor(p->plan);
        for (int i = 0; t && i < p->n_keep; i++) t->cudnnBackendDestroyDescriptor(p->keep[i]);
        em_host_free(p);
    }
    d->plans = NULL;
}

/* ---- building a plan ------------------------------------------------------------------------ */

/* The descriptors one build makes, destroyed together (the plan survives them). */
typedef struct conv_build {
    const cuda_dnn_table *t;
    cudnnBackendDescriptor_t d[CONV_MAX_DESCS];
    int n;
    cudnnStatus_t st; /* the first failure */
} conv_build;

static cudnnBackendDescriptor_t bd_new(conv_build *b, cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    if (b->st != CUDNN_STATUS_SUCCESS || b->n == (int)(sizeof b->d / sizeof *b->d)) {
        if (b->st == CUDNN_STATUS_SUCCESS) b->st = CUDNN_STATUS_BAD_PARAM;
        return NULL;
    }
    b->st = b->t->cudnnBackendCreateDescriptor(type, &d);
    if (b->st == CUDNN_STATUS_SUCCESS) b->d[b->n++] = d;
    return b->st == CUDNN_STATUS_SUCCESS ? d : NULL;
}

static void bd_set(conv_build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t n, const void *v) {
    if (b->st == CUDNN_STATUS_SUCCESS) b->st = b->t->cudnnBackendSetAttribute(d, name, type, n, v);
}

static void bd_fin(conv_build *b, cudnnBackendDescriptor_t d) {
    if (b->st == CUDNN_STATUS_SUCCESS) b->st = b->t->cudnnBackendFinalize(d);
}

static void build_free(conv_build *b) {
    for (int i = 0; i < b->n; i++) b->t->cudnnBackendDestroyDescriptor(b->d[i]);
    b->n = 0;
}

/* A dense NCHW tensor of dims dim with unique id uid. */
static cudnnBackendDescriptor_t bd_tensor(conv_build *b, int64_t uid, cudnnDataType_t dt,
                                          const int64_t dim[4], int64_t align) {
    int64_t stride[4] = {dim[1] * dim[2] * dim[3], dim[2] * dim[3], dim[3], 1};
    cudnnBackendDescriptor_t d = bd_new(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bd_set(b, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    bd_set(b, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    bd_set(b, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
    bd_set(b, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    bd_set(b, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    bd_fin(b, d);
    return d;
}

/* Whether an engine configuration passes the filters (see the top of the file). */
static bool cfg_allowed(conv_build *b, cudnnBackendDescriptor_t cfg, const conv_key *key) {
    cudnnBackendDescriptor_t eng = bd_new(b, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0;
    if (b->st != CUDNN_STATUS_SUCCESS) return false;
    cudnnStatus_t st = b->t->cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t nn = 0;
    if (st == CUDNN_STATUS_SUCCESS)
        st = b->t->cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                            CUDNN_TYPE_NUMERICAL_NOTE,
                                            CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes);
    if (st != CUDNN_STATUS_SUCCESS) return false;
    for (int64_t i = 0; i < nn; i++) {
        cudnnBackendNumericalNote_t v = notes[i];
        if (v == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
            v == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
            return false;
        if (v == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && key->dtype == EM_F32 && !key->tf32)
            return false;
        if (v == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && key->det) return false;
    }
    return true;
}

/* Build e's plan for e->key with handle h (e->plan NULL: no engine took it). Only cuDNN's own
 * failures happen here; they mean "no engine". */
static void plan_build(const cuda_dnn_table *t, cudnnHandle_t h, cuda_conv_plan *e) {
    conv_build b = {.t = t};
    const conv_key *key = &e->key;
    cudnnBackendDescriptor_t *plan = &e->plan;
    int64_t *ws = &e->workspace;
    *plan = NULL;
    *ws = 0;
    cudnnDataType_t dt = key->dtype == EM_F16    ? CUDNN_DATA_HALF
                         : key->dtype == EM_BF16 ? CUDNN_DATA_BFLOAT16
                                                 : CUDNN_DATA_FLOAT;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t x = bd_tensor(&b, 'x', dt, key->x, key->align);
    cudnnBackendDescriptor_t w = bd_tensor(&b, 'w', dt, key->w, key->align);
    cudnnBackendDescriptor_t y = bd_tensor(&b, 'y', dt, key->y, key->align);
    cudnnBackendDescriptor_t conv = bd_new(&b, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    int64_t dims = 2;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    bd_set(&b, conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    bd_set(&b, conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    bd_set(&b, conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
    bd_set(&b, conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, key->dil);
    bd_set(&b, conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, key->stride);
    bd_set(&b, conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, key->pad);
    bd_set(&b, conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, key->pad);
    bd_fin(&b, conv);
    static const cudnnBackendDescriptorType_t op_type[] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    /* attribute names per kind: alpha, beta, conv, x (or dx), w (or dw), y (or dy) */
#define CONV_ATTRS(P) /* alpha, beta, conv, x (or dx), w (or dw), y (or dy) */ \
    {P##ALPHA, P##BETA, P##CONV_DESC, P##X, P##W, P##Y}
#define CONV_ATTRS_DATA(P) {P##ALPHA, P##BETA, P##CONV_DESC, P##DX, P##W, P##DY}
#define CONV_ATTRS_FILTER(P) {P##ALPHA, P##BETA, P##CONV_DESC, P##X, P##DW, P##DY}
    static const cudnnBackendAttributeName_t names[3][6] = {
        CONV_ATTRS(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_),
        CONV_ATTRS_DATA(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_),
        CONV_ATTRS_FILTER(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_)};
#undef CONV_ATTRS
#undef CONV_ATTRS_DATA
#undef CONV_ATTRS_FILTER
    const cudnnBackendAttributeName_t *nm = names[key->kind];
    float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = bd_new(&b, op_type[key->kind]);
    bd_set(&b, op, nm[0], CUDNN_TYPE_FLOAT, 1, &alpha);
    bd_set(&b, op, nm[1], CUDNN_TYPE_FLOAT, 1, &beta);
    bd_set(&b, op, nm[2], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    bd_set(&b, op, nm[3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    bd_set(&b, op, nm[4], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w);
    bd_set(&b, op, nm[5], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    bd_fin(&b, op);
    cudnnBackendDescriptor_t graph = bd_new(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    bd_set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
    /* The handle form works on every cuDNN 9 (9.x later added a device-property descriptor
     * for building without a handle; the pip cuDNN of the GPU machine may predate it). */
    bd_set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    bd_fin(&b, graph);
    static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && b.st == CUDNN_STATUS_SUCCESS; m++) {
        int mark = b.n;
        cudnnBackendDescriptor_t heur = bd_new(&b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        bd_set(&b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
               &graph);
        bd_set(&b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        bd_fin(&b, heur);
        cudnnBackendDescriptor_t cfgs[CONV_MAX_CFGS];
        int64_t n = 0;
        for (int i = 0; i < CONV_MAX_CFGS; i++)
            cfgs[i] = bd_new(&b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (b.st == CUDNN_STATUS_SUCCESS &&
            t->cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, CONV_MAX_CFGS, &n,
                                        cfgs) != CUDNN_STATUS_SUCCESS)
            n = 0;
        for (int64_t i = 0; i < n && b.st == CUDNN_STATUS_SUCCESS && !*plan; i++) {
            if (!cfg_allowed(&b, cfgs[i], key)) continue;
            cudnnBackendDescriptor_t p = NULL;
            if (t->cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) !=
                CUDNN_STATUS_SUCCESS)
                break;
            int64_t size = 0, cnt = 0;
            cudnnStatus_t st = t->cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                                           CUDNN_TYPE_HANDLE, 1, &h);
            if (st == CUDNN_STATUS_SUCCESS)
                st = t->cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = t->cudnnBackendFinalize(p);
            if (st == CUDNN_STATUS_SUCCESS)
                st = t->cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                 CUDNN_TYPE_INT64, 1, &cnt, &size);
            if (st == CUDNN_STATUS_SUCCESS && size >= 0 && size <= CONV_MAX_WORKSPACE) {
                *plan = p;
                *ws = size;
            } else {
                t->cudnnBackendDestroyDescriptor(p);
            }
        }
        if (*plan) break;
        /* this mode's descriptors are not needed any more */
        for (int i = mark; i < b.n; i++) t->cudnnBackendDestroyDescriptor(b.d[i]);
        b.n = mark;
        b.st = CUDNN_STATUS_SUCCESS; /* a heuristic mode that failed: try the next */
    }
    if (*plan) { /* the plan keeps what it was built from */
        memcpy(e->keep, b.d, sizeof(cudnnBackendDescriptor_t) * (size_t)b.n);
        e->n_keep = b.n;
        b.n = 0;
    }
    build_free(&b);
}

/* ---- the kernels ---------------------------------------------------------------------------- */

static int64_t ptr_align(const void *p, int64_t a) {
    while (a > 1 && (uintptr_t)p % (uintptr_t)a) a /= 2;
    return a;
}

/* k's plan: looked up in its context's cache, or built and cached. *d is the context's cuDNN
 * state; (*p)->plan NULL means the direct kernels run. */
static em_status plan_of(const em_kernel_ctx *k, const conv_key *key, cuda_dnn_ctx **d,
                         cuda_conv_plan **p) {
    em_status st = cuda_dnn_ctx_of(k, d);
    if (st != EM_OK) return st;
    pthread_mutex_lock(&(*d)->lock);
    cuda_conv_plan *e = (*d)->plans;
    while (e && memcmp(&e->key, key, sizeof *key) != 0) e = e->next;
    if (!e) {
        e = em_host_alloc(sizeof *e, 64);
        if (!e) {
            pthread_mutex_unlock(&(*d)->lock);
            return em_set_error(EM_ERR_NOMEM, "%s: out of host memory for a cuDNN plan",
                                em_op_name(k->op));
        }
        memset(e, 0, sizeof *e);
        e->key = *key;
        plan_build(cuda_dnn(), (*d)->handle, e);
        atomic_fetch_add(e->plan ? &n_engine_plans : &n_direct_plans, 1);
        e->next = (*d)->plans;
        (*d)->plans = e;
    }
    pthread_mutex_unlock(&(*d)->lock);
    *p = e;
    return EM_OK;
}

/* The three operands of a kind in (x, w, y) order: conv2d (x, w) -> y; backward_data (dy, w)
 * -> dx; backward_weight (x, dy) -> dw. */
static void operands(const em_kernel_ctx *k, int kind, const em_ktensor *t[3]) {
    if (kind == CONV_FWD) t[0] = &k->in[0], t[1] = &k->in[1], t[2] = &k->out[0];
    else if (kind == CONV_BWD_DATA) t[0] = &k->out[0], t[1] = &k->in[1], t[2] = &k->in[0];
    else t[0] = &k->in[0], t[1] = &k->out[0], t[2] = &k->in[1];
}

/* The plan k would run with, or false when cuDNN does not take the call: cuDNN not loaded,
 * strided or empty operands (the direct kernel gives the error, or the zeros, such calls get),
 * or no engine for the shape. */
static bool conv_plan_for(const em_kernel_ctx *k, int *kind_out, cuda_dnn_ctx **d,
                          cuda_conv_plan **p) {
    if (!cuda_dnn()) return false;
    const char *name = em_op_name(k->op);
    int kind = strcmp(name, "conv2d") == 0                 ? CONV_FWD
               : strcmp(name, "conv2d_backward_data") == 0 ? CONV_BWD_DATA
                                                           : CONV_BWD_FILTER;
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *u = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (!u->contiguous) return false;
    }
    const em_ktensor *t[3];
    operands(k, kind, t);
    if (!t[0]->numel || !t[1]->numel || !t[2]->numel) return false;
    conv_key key;
    memset(&key, 0, sizeof key);
    key.kind = kind;
    key.dtype = (int)t[0]->dtype;
    for (int i = 0; i < 4; i++) {
        key.x[i] = t[0]->shape[i];
        key.w[i] = t[1]->shape[i];
        key.y[i] = t[2]->shape[i];
    }
    for (int i = 0; i < 2; i++) {
        key.stride[i] = k->attrs[0].ints[i];
        key.pad[i] = k->attrs[1].ints[i];
        key.dil[i] = k->attrs[2].ints[i];
    }
    key.align = 16;
    for (int i = 0; i < 3; i++) key.align = ptr_align(t[i]->data, key.align);
    key.det = em_deterministic();
    key.tf32 = cuda_allow_tf32();
    *kind_out = kind;
    return plan_of(k, &key, d, p) == EM_OK && (*p)->plan;
}

/* cuDNN takes the call when it has an engine for the shape (the plan is built here once per
 * shape); otherwise the direct kernel below runs it, and ember-opcheck lists the declined row. */
static bool conv_cudnn_supports(const em_kernel_ctx *k) {
    int kind;
    cuda_dnn_ctx *d;
    cuda_conv_plan *p;
    return conv_plan_for(k, &kind, &d, &p);
}

static em_status k_conv_cudnn(const em_kernel_ctx *k) {
    int kind;
    cuda_dnn_ctx *d;
    cuda_conv_plan *p;
    if (!conv_plan_for(k, &kind, &d, &p)) return cuda_conv2d_direct(k);
    void *ws = NULL;
    em_status st = em_kernel_workspace(k, (size_t)p->workspace, &ws);
    if (st != EM_OK) return st;
    const em_ktensor *t[3];
    operands(k, kind, t);
    const cuda_dnn_table *tb = cuda_dnn();
    int64_t uids[3] = {'x', 'w', 'y'};
    void *ptrs[3] = {t[0]->data, t[1]->data, t[2]->data};
    (void)cuda_stream_of(k); /* makes k's device current */
    pthread_mutex_lock(&d->lock);
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t cs = tb->cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = tb->cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                          3, uids);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = tb->cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                          CUDNN_TYPE_VOID_PTR, 3, ptrs);
    if (cs == CUDNN_STATUS_SUCCESS)
        cs = tb->cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                          CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (cs == CUDNN_STATUS_SUCCESS) cs = tb->cudnnBackendFinalize(vp);
    if (cs == CUDNN_STATUS_SUCCESS) cs = tb->cudnnBackendExecute(d->handle, p->plan, vp);
    if (vp) tb->cudnnBackendDestroyDescriptor(vp);
    pthread_mutex_unlock(&d->lock);
    st = cuda_check_dnn(k, cs, "cudnnBackendExecute");
    if (st == EM_OK) st = cuda_check_launch(k, "cudnnBackendExecute");
    if (st == EM_OK && kind == CONV_FWD && k->in[2].numel) st = cuda_conv2d_add_bias(k);
    if (st == EM_OK && kind == CONV_BWD_FILTER) st = cuda_conv2d_bias_grad(k);
    return st;
}

em_status cuda_register_conv(em_registry *r) {
    static const char *const ops[] = {"conv2d", "conv2d_backward_data", "conv2d_backward_weight"};
    static const em_dtype dts[] = {EM_F32, EM_F16, EM_BF16};
    em_status st = EM_OK;
    for (int i = 0; i < 3 && st == EM_OK; i++)
        for (int j = 0; j < 3 && st == EM_OK; j++) {
            char kname[96];
            snprintf(kname, sizeof kname, "cuda_%s_cudnn_%s", ops[i], em_dtype_name(dts[j]));
            em_kernel_def def = {.struct_size = sizeof def, .op = ops[i], .device_type = "cuda",
                                 .dtype = dts[j], .priority = 10, .fn = k_conv_cudnn,
                                 .supports = conv_cudnn_supports, .name = kname};
            st = em_kernel_register(r, &def, NULL);
        }
    return st;
}

/*
 * gpu_cudnn.c — the baseline of issue 26's conv2d rows, on cuDNN alone (no Ember): the cuDNN
 * calls of a conv2d's forward and backward at the CNN's shapes (bench/gpu_step.c cnn), timed by
 * themselves. Built by tests/gpu/pack.sh when the cuDNN headers are there (it links cuDNN and
 * cudart); run by tests/gpu/run.sh bench.
 *
 *   gpu_cudnn [--quick]
 *
 *   conv1_64x1x28x28   x (64, 1, 28, 28), w (32, 1, 3, 3), stride 1, padding 1: forward and
 *                      backward-filter (the CNN's first convolution: its input needs no grad)
 *   conv2_64x32x14x14  x (64, 32, 14, 14), w (64, 32, 3, 3), stride 1, padding 1: forward,
 *                      backward-data and backward-filter
 * f32, NCHW, no bias (the rows time the convolutions: Ember's side, `gpu_step conv`, runs
 * em_conv2d without bias and its backward). The algorithm choice is the CUDA plugin's
 * (plugins/backend-cuda/cuda_conv.c): cuDNN 9's graph (backend) API, one operation graph per
 * call, heuristics mode A and then the fallback mode, the first engine configuration whose
 * numerical notes allow it — no down-converted inputs, no reduced-precision reduction, no
 * tensor cores for f32 (TF32 off, Ember's default) — and whose workspace is at most 1 GiB;
 * 16-byte alignment. Timing as bench/gpu_step.c: the median of 7 batches (3 with --quick) of
 * 50 calls after 10 warm-up calls, each batch ended by cudaDeviceSynchronize, on the host
 * clock. Output lines: "cudnn WORKLOAD ms=... [note=...]", after a "cudnn version=..." line.
 * Every CUDA and cuDNN call is checked: a failure prints the call and its message, exit 1.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <cudnn.h>

#define GPU_BENCH_NAME "gpu_cudnn"
#include "gpu_bench.h"

#define CKD(call)                                                                                \
    do {                                                                                         \
        cudnnStatus_t s_ = (call);                                                               \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "gpu_cudnn: %s failed: %s (line %d)\n", #call,                       \
                    cudnnGetErrorString(s_), __LINE__);                                          \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

#define MAX_WORKSPACE ((int64_t)1 << 30)
#define MAX_CFGS 16
enum { FWD, BWD_DATA, BWD_FILTER };

static cudnnHandle_t h;

static cudnnBackendDescriptor_t bd(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d;
    CKD(cudnnBackendCreateDescriptor(type, &d));
    return d;
}

static cudnnBackendDescriptor_t tensor(int64_t uid, const int64_t dim[4]) {
    int64_t stride[4] = {dim[1] * dim[2] * dim[3], dim[2] * dim[3], dim[3], 1}, align = 16;
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t d = bd(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    CKD(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    CKD(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim));
    CKD(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride));
    CKD(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    CKD(cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    CKD(cudnnBackendFinalize(d));
    return d;
}

/* The plugin's filter: no down-converted inputs, no reduced-precision reduction, no tensor
 * cores (f32 with TF32 off). */
static bool allowed(cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t eng = bd(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t n = 0, nn = 0;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    bool ok = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                       &n, &eng) == CUDNN_STATUS_SUCCESS &&
              cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) == CUDNN_STATUS_SUCCESS;
    for (int64_t i = 0; ok && i < nn; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS ||
            notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION ||
            notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
            ok = false;
    cudnnBackendDestroyDescriptor(eng);
    return ok;
}

/* One planned convolution call with its buffers (x, w, y device pointers by role). */
typedef struct call {
    cudnnBackendDescriptor_t plan, pack;
    void *ws;
} call;

static call plan(int kind, const int64_t x[4], const int64_t w[4], const int64_t y[4], void *px, void *pw,
                 void *py) {
    cudnnBackendDescriptor_t tx = tensor('x', x), tw = tensor('w', w), ty = tensor('y', y);
    cudnnBackendDescriptor_t conv = bd(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    int64_t dims = 2, one[2] = {1, 1}, pad[2] = {1, 1};
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    CKD(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    CKD(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    CKD(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims));
    CKD(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one));
    CKD(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, one));
    CKD(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    CKD(cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad));
    CKD(cudnnBackendFinalize(conv));
    static const cudnnBackendDescriptorType_t op_type[] = {
        CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR};
    static const cudnnBackendAttributeName_t names[3][6] = {
        {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY},
        {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY}};
    const cudnnBackendAttributeName_t *nm = names[kind];
    float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = bd(op_type[kind]);
    CKD(cudnnBackendSetAttribute(op, nm[0], CUDNN_TYPE_FLOAT, 1, &alpha));
    CKD(cudnnBackendSetAttribute(op, nm[1], CUDNN_TYPE_FLOAT, 1, &beta));
    CKD(cudnnBackendSetAttribute(op, nm[2], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
    CKD(cudnnBackendSetAttribute(op, nm[3], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tx));
    CKD(cudnnBackendSetAttribute(op, nm[4], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tw));
    CKD(cudnnBackendSetAttribute(op, nm[5], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ty));
    CKD(cudnnBackendFinalize(op));
    cudnnBackendDescriptor_t graph = bd(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    CKD(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
    CKD(cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h));
    CKD(cudnnBackendFinalize(graph));
    call c = {0};
    int64_t ws = 0;
    static const cudnnBackendHeurMode_t modes[] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && !c.plan; m++) {
        cudnnBackendDescriptor_t heur = bd(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        CKD(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &graph));
        CKD(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]));
        CKD(cudnnBackendFinalize(heur));
        cudnnBackendDescriptor_t cfgs[MAX_CFGS];
        int64_t n = 0;
        for (int i = 0; i < MAX_CFGS; i++) cfgs[i] = bd(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CFGS,
                                     &n, cfgs) != CUDNN_STATUS_SUCCESS)
            n = 0;
        for (int64_t i = 0; i < n && !c.plan; i++) {
            if (!allowed(cfgs[i])) continue;
            cudnnBackendDescriptor_t p = bd(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
            int64_t size = 0, cnt = 0;
            cudnnStatus_t st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                              &cnt, &size);
            if (st == CUDNN_STATUS_SUCCESS && size >= 0 && size <= MAX_WORKSPACE) {
                c.plan = p;
                ws = size;
            } else {
                cudnnBackendDestroyDescriptor(p);
            }
        }
        for (int i = 0; i < MAX_CFGS; i++) cudnnBackendDestroyDescriptor(cfgs[i]);
        cudnnBackendDestroyDescriptor(heur);
    }
    if (!c.plan) {
        fprintf(stderr, "gpu_cudnn: no cuDNN engine takes convolution kind %d of x (%lld, %lld, %lld, %lld)\n",
                kind, (long long)x[0], (long long)x[1], (long long)x[2], (long long)x[3]);
        exit(1);
    }
    if (ws) CK(cudaMalloc(&c.ws, (size_t)ws));
    int64_t uids[3] = {'x', 'w', 'y'};
    void *ptrs[3] = {px, pw, py};
    c.pack = bd(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    CKD(cudnnBackendSetAttribute(c.pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids));
    CKD(cudnnBackendSetAttribute(c.pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs));
    CKD(cudnnBackendSetAttribute(c.pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &c.ws));
    CKD(cudnnBackendFinalize(c.pack));
    cudnnBackendDescriptor_t done[] = {graph, op, conv, tx, tw, ty};
    for (size_t i = 0; i < sizeof done / sizeof done[0]; i++) cudnnBackendDestroyDescriptor(done[i]);
    return c;
}

/* The planned calls of one row, run in order: time_it's step. */
typedef struct calls {
    const call *c;
    int n;
} calls;

static void run_calls(void *arg) {
    const calls *cs = arg;
    for (int k = 0; k < cs->n; k++) CKD(cudnnBackendExecute(h, cs->c[k].plan, cs->c[k].pack));
}

static size_t numel(const int64_t d[4]) { return (size_t)(d[0] * d[1] * d[2] * d[3]); }

static void run(const char *name, const int64_t x[4], const int64_t w[4], bool bwd_data, bool quick) {
    int64_t y[4] = {x[0], w[0], x[2], x[3]}; /* 3x3, stride 1, padding 1 */
    void *px = rand_dev(numel(x), -1, 1, 1), *pw = rand_dev(numel(w), -1, 1, 2),
         *pdy = rand_dev(numel(y), -1, 1, 3);
    void *py, *pdx, *pdw;
    CK(cudaMalloc(&py, numel(y) * sizeof(float)));
    CK(cudaMalloc(&pdx, numel(x) * sizeof(float)));
    CK(cudaMalloc(&pdw, numel(w) * sizeof(float)));
    call c[3];
    int nc = 0;
    c[nc++] = plan(FWD, x, w, y, px, pw, py);
    if (bwd_data) c[nc++] = plan(BWD_DATA, x, w, y, pdx, pw, pdy);
    c[nc++] = plan(BWD_FILTER, x, w, y, px, pdw, pdy);
    calls cs = {c, nc};
    double ms = time_it(run_calls, &cs, quick ? 2 : 10, quick ? 5 : 50);
    printf("cudnn %s ms=%.6f\n", name, ms);
    for (int k = 0; k < nc; k++) {
        cudnnBackendDestroyDescriptor(c[k].pack);
        cudnnBackendDestroyDescriptor(c[k].plan);
        if (c[k].ws) CK(cudaFree(c[k].ws));
    }
    void *bufs[] = {px, pw, pdy, py, pdx, pdw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK(cudaFree(bufs[i]));
}

int main(int argc, char **argv) {
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else {
            fprintf(stderr, "usage: gpu_cudnn [--quick]\n");
            return 2;
        }
    }
    if (quick) reps = 3;
    CKD(cudnnCreate(&h));
    printf("cudnn version=%zu\n", cudnnGetVersion());
    run("conv1_64x1x28x28", (const int64_t[]){64, 1, 28, 28}, (const int64_t[]){32, 1, 3, 3}, false, quick);
    run("conv2_64x32x14x14", (const int64_t[]){64, 32, 14, 14}, (const int64_t[]){64, 32, 3, 3}, true, quick);
    fflush(stdout);
    CKD(cudnnDestroy(h));
    return 0;
}

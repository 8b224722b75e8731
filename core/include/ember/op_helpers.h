/*
 * ember/op_helpers.h — helpers for writing ops and kernels: shape inference for the common
 * cases, and a strided iterator over the tensors a kernel receives. The core's standard ops,
 * the CPU backend and the SDK's example plugin use them; a plugin's own ops may too.
 *
 *     static const em_op_schema my_schema = {
 *         .struct_size = sizeof(em_op_schema), .name = "myplugin.softsign", .n_inputs = 1,
 *         .n_outputs = 1, .flags = EM_OP_FLOATING, .infer = em_infer_same,
 *     };
 *     static em_status softsign_f32(const em_kernel_ctx *k) {
 *         const em_ktensor *ts[2] = {&k->out[0], &k->in[0]};
 *         em_kiter it;
 *         for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it)) {
 *             float x = ((const float *)ts[1]->data)[it.off[1]];
 *             ((float *)ts[0]->data)[it.off[0]] = x / (1 + fabsf(x));
 *         }
 *         return EM_OK;
 *     }
 */
#ifndef EMBER_OP_HELPERS_H
#define EMBER_OP_HELPERS_H

#include <stdbool.h>
#include <stdint.h>

#include "ember/dispatch.h"
#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- shape inference (each an em_infer_fn) ------------------------------------------------- */

/* Output 0 has input 0's shape and dtype. */
EM_API em_status em_infer_same(const em_op *op, const em_tensor *const *in,
                               const em_attr *attrs, em_tensor_meta *out /* out */);
/* Output 0 has the NumPy broadcast of every input's shape (the schema's n_inputs) and input
 * 0's dtype (with EM_OP_PROMOTE the inputs arrive promoted). EM_ERR_SHAPE names the op, the
 * shapes and the dim: "add: shapes [2, 3] and [4] cannot be broadcast (dim -1: 3 vs 4)". */
EM_API em_status em_infer_broadcast(const em_op *op, const em_tensor *const *in,
                                    const em_attr *attrs, em_tensor_meta *out /* out */);
/* The NumPy broadcast of n tensors' shapes into *ndim and shape (EM_MAX_DIMS entries);
 * EM_ERR_SHAPE naming `who` and the shapes when they do not broadcast. */
EM_API em_status em_broadcast_shapes(const char *who, const em_tensor *const *in, int n,
                                     int *ndim /* out */, int64_t *shape /* out */);

/* ---- strided iteration over kernel tensors ------------------------------------------------- */

/* The element offset of C-order linear index lin over shape (ndim dims) with strides (in
 * elements). */
static inline int64_t em_strided_offset(int ndim, const int64_t *shape, const int64_t *strides,
                                        int64_t lin) {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t s = shape[d];
        off += (lin % s) * strides[d];
        lin /= s;
    }
    return off;
}
/* The element offset (from data) of C-order linear index lin of t. */
static inline int64_t em_ktensor_offset(const em_ktensor *t, int64_t lin) {
    return em_strided_offset(t->ndim, t->shape, t->strides, lin);
}

/* t with a 0-dim tensor seen as 1-D of size 1 (PyTorch's ensure_nonempty), for kernels that
 * index along a dim. */
static inline em_ktensor em_ktensor_at_least_1d(const em_ktensor *t) {
    em_ktensor r = *t;
    if (r.ndim == 0) {
        r.ndim = 1;
        r.shape[0] = 1;
        r.strides[0] = 1;
    }
    return r;
}
/* Whether a and b address the same elements in the same order (an in-place call's output and
 * input): then a kernel need not copy one into the other first. */
static inline bool em_ktensor_same_memory(const em_ktensor *a, const em_ktensor *b) {
    if (a->data != b->data || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != 1 && a->strides[d] != b->strides[d]) return false;
    return true;
}

#define EM_KITER_MAX 8
/* Walks up to EM_KITER_MAX tensors of one shape (ts[0]'s) together in C order: off[k] is the
 * current element's offset in tensor k (in elements, from its data; stride 0 on broadcast
 * dims is fine). An odometer: no division per element. */
typedef struct em_kiter {
    int n, ndim;
    int64_t remaining;
    int64_t off[EM_KITER_MAX];
    int64_t idx[EM_MAX_DIMS];
    int64_t shape[EM_MAX_DIMS];
    int64_t strides[EM_KITER_MAX][EM_MAX_DIMS];
} em_kiter;

static inline void em_kiter_init(em_kiter *it, int n, const em_ktensor *const *ts) {
    it->n = n < EM_KITER_MAX ? n : EM_KITER_MAX;
    it->ndim = ts[0]->ndim;
    it->remaining = ts[0]->numel;
    for (int d = 0; d < it->ndim; d++) {
        it->idx[d] = 0;
        it->shape[d] = ts[0]->shape[d];
        for (int k = 0; k < it->n; k++) it->strides[k][d] = ts[k]->strides[d];
    }
    for (int k = 0; k < it->n; k++) it->off[k] = 0;
}
static inline bool em_kiter_more(const em_kiter *it) { return it->remaining > 0; }
static inline void em_kiter_next(em_kiter *it) {
    it->remaining--;
    for (int d = it->ndim - 1; d >= 0; d--) {
        for (int k = 0; k < it->n; k++) it->off[k] += it->strides[k][d];
        if (++it->idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->n; k++) it->off[k] -= it->strides[k][d] * it->shape[d];
        it->idx[d] = 0;
    }
}

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OP_HELPERS_H */

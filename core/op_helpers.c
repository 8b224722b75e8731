/*
 * op_helpers.c — the shape-inference helpers of ember/op_helpers.h, shared by the standard
 * op families (they were copied into each before), the backends and plugins.
 */
#include <string.h>

#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/op_helpers.h"
#include "ember/tensor.h"
#include "internal.h"

em_status em_infer_same(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                        em_tensor_meta *out) {
    (void)op, (void)attrs;
    out->dtype = in[0]->dtype;
    out->ndim = in[0]->ndim;
    memcpy(out->shape, in[0]->shape, sizeof(int64_t) * (size_t)in[0]->ndim);
    return EM_OK;
}

em_status em_broadcast_shapes(const char *who, const em_tensor *const *in, int n, int *ndim,
                              int64_t *shape) {
    int nd = 0;
    for (int k = 0; k < n; k++) nd = EM_MAX(nd, in[k]->ndim);
    for (int i = 0; i < nd; i++) {
        int64_t size = 1;
        for (int k = 0; k < n; k++) {
            int ik = in[k]->ndim - nd + i;
            int64_t s = ik >= 0 ? in[k]->shape[ik] : 1;
            if (s == 1 || s == size) continue;
            if (size != 1) {
                /* Name every shape: "shapes [2, 3] and [4]", "shapes [2], [3] and [4]". */
                char list[512] = "";
                size_t len = 0;
                for (int j = 0; j < n && len < sizeof list; j++) {
                    char b[160];
                    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s",
                                            j == 0 ? "" : j == n - 1 ? " and " : ", ",
                                            em__shape_str(in[j]->ndim, in[j]->shape, b, sizeof b));
                }
                return em_set_error(EM_ERR_SHAPE, "%s: shapes %s cannot be broadcast (dim %d: "
                                    "%lld vs %lld)", who, list, i - nd, (long long)size,
                                    (long long)s);
            }
            size = s;
        }
        shape[i] = size;
    }
    *ndim = nd;
    return EM_OK;
}

em_status em_infer_broadcast(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                             em_tensor_meta *out) {
    (void)attrs;
    out->dtype = in[0]->dtype;
    return em_broadcast_shapes(em_op_name(op), in, em_op_schema_of(op)->n_inputs, &out->ndim,
                               out->shape);
}

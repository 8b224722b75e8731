/*
 * ops.c — the standard op set: declared into the core's registry at em_init(), one family at a
 * time (each family's file holds its schemas, dtype rules, derivatives, kernel contracts and
 * the typed public functions of ember/ops.h that call them). Kernels live in backend plugins.
 *
 *   ops_elementwise.c  add, sub, mul, div, neg, exp, log, relu
 *   ops_fill.c         fill, arange, uniform, normal, bernoulli, randperm
 *   ops_math.c         more elementwise math, comparisons, logical ops, where, clamp, scalars
 *   ops_reduce.c       sum, mean and the other reductions
 *   ops_nn.c           convolution, pooling, normalisation, softmax, dropout
 *   ops_loss.c         the losses
 *   ops_data.c         copy, index_select, gather/scatter, cat/stack/split, pad, ...
 *   ops_linalg.c       bmm, addmm, matmul, linear
 *   ops_optim.c        the fused optimizer steps (list ops)
 *
 * How to add an op: the recipe at the top of ember/ops.h.
 */
#include "ember/dispatch.h"
#include "ember/error.h"
#include "internal.h"

/* ---- declarations ---------------------------------------------------------------------------- */

em_status em__declare(em_registry *core, const em_op **out, em_op_schema s) {
    s.struct_size = sizeof s;
    if (!s.n_outputs) s.n_outputs = 1;
    return em_op_declare(core, &s, out);
}

em_status em__declare_op(em_registry *core, const em_op **out, const char *name, int n_in,
                         int n_attrs, const char *const *attr_names, const em_attr_type *types,
                         int dispatch_arg, unsigned flags, em_infer_fn infer,
                         em_backward_fn backward, unsigned saves) {
    em_op_schema s = {.struct_size = sizeof s, .name = name, .n_inputs = n_in, .n_outputs = 1,
                      .n_attrs = n_attrs, .attr_names = attr_names, .attr_types = types,
                      .dispatch_arg = dispatch_arg, .flags = flags, .infer = infer,
                      .backward = backward, .saves = saves};
    return em_op_declare(core, &s, out);
}

em_status em__ops_declare_standard(em_registry *core) {
    /* Order: a family may look up ops of the families before it (nn's dropout: bernoulli, mul,
     * div_scalar); on a did-you-mean tie the op declared first is suggested. */
    em_status st = em__ops_declare_elementwise(core);
    if (st == EM_OK) st = em__ops_declare_fill(core);
    if (st == EM_OK) st = em__ops_declare_math(core);
    if (st == EM_OK) st = em__ops_declare_reduce(core);
    if (st == EM_OK) st = em__ops_declare_nn(core);
    if (st == EM_OK) st = em__ops_declare_attention(core);
    if (st == EM_OK) st = em__ops_declare_rnn(core);
    if (st == EM_OK) st = em__ops_declare_loss(core);
    if (st == EM_OK) st = em__ops_declare_data(core);
    if (st == EM_OK) st = em__ops_declare_linalg(core);
    if (st == EM_OK) st = em__ops_declare_optim(core);
    return st;
}

/*
 * ops_optim.c — the fused optimizer steps: list ops (EM_OP_LISTS, run with em_op_call_lists)
 * that update every parameter of a bucket in one call. The optimizer classes
 * (plugins/optim) call them when the parameters' device has a kernel for their dtype and fall
 * back to their op-by-op form otherwise. Backends register kernels per dtype of the params
 * list (output list 0); the CPU's are in plugins/backend-cpu/cpu_optim.c.
 *
 * Contracts (lists of `count` tensors; tensor j of every list has params[j]'s shape):
 *
 *   fused_sgd(grads) -> params, momentum_buffers, master
 *       attrs: lr, momentum, dampening, weight_decay (floats), nesterov, maximize,
 *              fresh_buffers (bools).
 *       PyTorch 1.13's SGD, per element, with w the master weight when given, else the param:
 *         d = maximize ? -g : g;  if (weight_decay != 0) d = d + w * weight_decay
 *         if (momentum != 0) {
 *             buf = fresh_buffers ? d : buf * momentum + d * (1 - dampening)
 *             d = nesterov ? d + buf * momentum : buf
 *         }
 *         w = w + d * -lr
 *       momentum_buffers may be NULL when momentum is 0.
 *
 *   fused_adam(grads) -> params, exp_avg, exp_avg_sq, max_exp_avg_sq, master
 *   fused_adamw(...)  the same with decoupled weight decay
 *       attrs: lr, beta1, beta2, eps, weight_decay, step (floats; the step count after this
 *              update, the same for every tensor of the call), amsgrad, maximize (bools).
 *       PyTorch 1.13's Adam / AdamW, per element:
 *         d = maximize ? -g : g
 *         Adam:  if (weight_decay != 0) d = d + w * weight_decay
 *         AdamW: w = w * (1 - lr * weight_decay)
 *         m = m * beta1 + d * (1 - beta1);  v = v * beta2 + (d * d) * (1 - beta2)
 *         if (amsgrad) vmax = max(vmax, v), v' = vmax, else v' = v
 *         denom = sqrt(v') / sqrt(1 - beta2^step) + eps
 *         w = w + (m / denom) * -(lr / (1 - beta1^step))
 *       max_exp_avg_sq is NULL unless amsgrad.
 *
 *   fused_sgd_capturable(grads, lr) -> params, momentum_buffers, master
 *   fused_adam_capturable(grads, lr) -> params, exp_avg, exp_avg_sq, steps
 *   fused_adamw_capturable(...)         the same with decoupled weight decay
 *       The forms of fused_sgd / fused_adam / fused_adamw whose scalars that change between
 *       steps are device memory the kernel reads, not attributes, so that a step captured in
 *       a graph (em_graph_capture_begin) and replayed computes what an uncaptured step would
 *       (PyTorch's capturable=True): lr (EM_OP_LISTS_SCALAR_IN) holds one 0-dim float64
 *       tensor per entry, on the params' device: the learning rate of tensor j (the
 *       optimizers pass their group's em_optimizer_lr_tensor); steps (EM_OP_LISTS_SCALAR_OUT)
 *       one 0-dim float64 tensor per entry: tensor j's step count before this update, which
 *       the kernel increments, using the new count as fused_adam uses its step attribute.
 *       The other attributes are those of the plain forms less lr and step (SGD: momentum,
 *       dampening, weight_decay, nesterov, maximize, fresh_buffers; Adam: beta1, beta2, eps,
 *       weight_decay, maximize). Per tensor the kernel forms the scalars from lr and the count
 *       as the plain forms' kernels do from the attributes (in double, then rounded to the
 *       compute type): the same bits where pow is the host's (the CPU kernels; a CUDA
 *       device's double pow may differ from glibc's in the last bit, which the rounding to
 *       float almost always hides). lr and steps are required. The Adam forms take f32 and
 *       f64 params without amsgrad (a list call holds 6 lists at most in the op-case table:
 *       there is no room for max_exp_avg_sq and master weights; capturable AMSGrad
 *       steps op by op, plugins/optim/optimizers.c).
 *
 *   amp_unscale_() -> grads, found_inf
 *       attrs: inv_scale (float; the gradient scaler's 1/scale rounded to float32).
 *       The gradient scaler's fused check-and-unscale (PyTorch's
 *       _amp_foreach_non_finite_check_and_unscale_): per tensor j, found_inf[j] (a 0-dim
 *       float32 tensor: EM_OP_LISTS_SCALAR_OUT) becomes 1 when some element of grads[j] is
 *       inf or NaN, else 0, and every element g becomes g * inv_scale (computed in float32
 *       for f32, f16 and bf16 grads and rounded back; in float64 for f64 grads, with
 *       inv_scale widened), the finiteness tested on g before the product.
 *
 * Arithmetic: each line above rounds to the compute type (the params' dtype for f32 and f64;
 * f32 for f16 and bf16) in the order written, without fused multiply-adds, with the scalars
 * (products of the attributes are formed in double) rounded to the compute type — the same
 * values the op-by-op form gives in f32 and f64. grads have the params' dtype. For f16 and
 * bf16 params the optional master list holds f32 copies of the weights: the update is made
 * on them and the params receive them rounded (without it, on the params widened to f32); a
 * master weight whose rounding is no longer the param (the param was changed since) is first
 * replaced by the param's value;
 * their state tensors may be f32 or the params' dtype (a PyTorch state dict) and are
 * computed in f32 either way. For f32 and f64 params, master is NULL and the states have the
 * params' dtype.
 */
#include "ember/dispatch.h"
#include "ember/error.h"
#include "internal.h"

em_status em__ops_declare_optim(em_registry *core) {
    static const char *const grads[] = {"grads"};
    static const char *const sgd_attrs[] = {"lr", "momentum", "dampening", "weight_decay",
                                            "nesterov", "maximize", "fresh_buffers"};
    static const em_attr_type sgd_types[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT, EM_ATTR_FLOAT,
                                             EM_ATTR_FLOAT, EM_ATTR_BOOL,  EM_ATTR_BOOL,
                                             EM_ATTR_BOOL};
    static const char *const adam_attrs[] = {"lr", "beta1", "beta2", "eps", "weight_decay",
                                             "step", "amsgrad", "maximize"};
    static const em_attr_type adam_types[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT, EM_ATTR_FLOAT,
                                              EM_ATTR_FLOAT, EM_ATTR_FLOAT, EM_ATTR_FLOAT,
                                              EM_ATTR_BOOL,  EM_ATTR_BOOL};
    const unsigned flags = EM_OP_LISTS | EM_OP_NONDIFF;
    em_op_schema sgd = {.struct_size = sizeof sgd, .name = "fused_sgd", .n_inputs = 1,
                        .input_names = grads, .n_outputs = 3, .n_attrs = 7,
                        .attr_names = sgd_attrs, .attr_types = sgd_types, .dispatch_arg = -1,
                        .flags = flags};
    em_op_schema adam = {.struct_size = sizeof adam, .name = "fused_adam", .n_inputs = 1,
                         .input_names = grads, .n_outputs = 5, .n_attrs = 8,
                         .attr_names = adam_attrs, .attr_types = adam_types,
                         .dispatch_arg = -1, .flags = flags};
    static const char *const unscale_attrs[] = {"inv_scale"};
    static const em_attr_type unscale_types[] = {EM_ATTR_FLOAT};
    em_op_schema unscale = {.struct_size = sizeof unscale, .name = "amp_unscale_",
                            .n_inputs = 0, .n_outputs = 2, .n_attrs = 1,
                            .attr_names = unscale_attrs, .attr_types = unscale_types,
                            .dispatch_arg = -1, .flags = flags | EM_OP_LISTS_SCALAR_OUT};
    static const char *const grads_lr[] = {"grads", "lr"};
    static const char *const csgd_attrs[] = {"momentum", "dampening", "weight_decay",
                                             "nesterov", "maximize", "fresh_buffers"};
    static const em_attr_type csgd_types[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT, EM_ATTR_FLOAT,
                                              EM_ATTR_BOOL,  EM_ATTR_BOOL,  EM_ATTR_BOOL};
    static const char *const cadam_attrs[] = {"beta1", "beta2", "eps", "weight_decay",
                                              "maximize"};
    static const em_attr_type cadam_types[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT, EM_ATTR_FLOAT,
                                               EM_ATTR_FLOAT, EM_ATTR_BOOL};
    em_op_schema csgd = {.struct_size = sizeof csgd, .name = "fused_sgd_capturable",
                         .n_inputs = 2, .input_names = grads_lr, .n_outputs = 3, .n_attrs = 6,
                         .attr_names = csgd_attrs, .attr_types = csgd_types,
                         .dispatch_arg = -1, .flags = flags | EM_OP_LISTS_SCALAR_IN};
    em_op_schema cadam = {.struct_size = sizeof cadam, .name = "fused_adam_capturable",
                          .n_inputs = 2, .input_names = grads_lr, .n_outputs = 4, .n_attrs = 5,
                          .attr_names = cadam_attrs, .attr_types = cadam_types,
                          .dispatch_arg = -1,
                          .flags = flags | EM_OP_LISTS_SCALAR_IN | EM_OP_LISTS_SCALAR_OUT};
    em_status st = em_op_declare(core, &sgd, NULL);
    if (st == EM_OK) st = em_op_declare(core, &unscale, NULL);
    if (st == EM_OK) st = em_op_declare(core, &adam, NULL);
    adam.name = "fused_adamw";
    if (st == EM_OK) st = em_op_declare(core, &adam, NULL);
    if (st == EM_OK) st = em_op_declare(core, &csgd, NULL);
    if (st == EM_OK) st = em_op_declare(core, &cadam, NULL);
    cadam.name = "fused_adamw_capturable";
    if (st == EM_OK) st = em_op_declare(core, &cadam, NULL);
    return st;
}

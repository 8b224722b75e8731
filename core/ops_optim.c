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
    em_status st = em_op_declare(core, &sgd, NULL);
    if (st == EM_OK) st = em_op_declare(core, &unscale, NULL);
    if (st == EM_OK) st = em_op_declare(core, &adam, NULL);
    adam.name = "fused_adamw";
    if (st == EM_OK) st = em_op_declare(core, &adam, NULL);
    return st;
}

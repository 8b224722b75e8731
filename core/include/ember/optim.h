/*
 * ember/optim.h — optimizers and learning-rate schedulers, created by name from class
 * registries (the implementations live in a plugin: plugins/optim, ember-optim.so).
 *
 *     em_dict *params = em_module_named_parameters(model, true);
 *     em_options *o = em_options_new();
 *     em_options_set_float(o, "lr", 1e-3);
 *     em_optimizer *opt = em_optimizer_new("AdamW", params, o);    // one parameter group
 *     ...
 *     em_backward(loss);
 *     em_optimizer_step(opt);                 // runs under EM_GRAD_DISABLED
 *     em_optimizer_zero_grad(opt);            // set to none
 *
 * Parameter groups: em_optimizer_new_groups() takes several (params, options) pairs; options a
 * group leaves out come from the optimizer's defaults (e.g. no weight decay on biases and norms:
 * a second group with weight_decay 0).
 *
 * State. Per-parameter state tensors (momentum buffers, Adam moments) are kept by the core,
 * by (parameter index, name), tagged EM_MEM_OPTIMIZER; hyper-parameters live in each group's
 * options. em_optimizer_state_dict() returns both: tensors under "state.<index>.<name>" and the
 * groups as JSON text (the checkpoint stores it in the file's metadata) — the layout of
 * PyTorch's optimizer.state_dict() flattened.
 *
 * Built-in classes (ember-optim.so), each step for step as PyTorch 1.13 (foreach=False).
 * SGD, Adam and AdamW update all the parameters of a device and dtype in one call of a fused
 * kernel (the list ops fused_sgd, fused_adam, fused_adamw) where the device has one, with the
 * same arithmetic; there, f16 and bf16 parameters get f32 state and f32 master weights (state
 * "master_param"), which state dicts keep in f32:
 *   SGD      lr (required), momentum, dampening, weight_decay, nesterov, maximize
 *   Adam     lr 1e-3, betas [0.9, 0.999], eps 1e-8, weight_decay 0, amsgrad, maximize
 *   AdamW    as Adam, weight_decay 1e-2 (decoupled)
 *   RMSprop  lr 1e-2, alpha 0.99, eps 1e-8, weight_decay, momentum, centered, maximize
 *   Adagrad  lr 1e-2, lr_decay, weight_decay, initial_accumulator_value, eps 1e-10, maximize
 * Schedulers, with the interval each is meant to be stepped at (em_sched_class.interval):
 *   StepLR (step_size, gamma)                         per epoch
 *   MultiStepLR (milestones: up to 8, gamma)           per epoch
 *   ExponentialLR (gamma)                              per epoch
 *   CosineAnnealingLR (T_max, eta_min)                 per epoch (or per batch, T_max in batches)
 *   LinearLR (start_factor, end_factor, total_iters)   per epoch (or per batch)
 *   SequentialLR (schedulers, milestones)              per epoch
 *   OneCycleLR (max_lr, total_steps | epochs + steps_per_epoch, pct_start, anneal_strategy,
 *               cycle_momentum, base_momentum, max_momentum, div_factor, final_div_factor,
 *               three_phase)                           per batch
 *   ReduceLROnPlateau (mode, factor, patience, threshold, threshold_mode, cooldown, min_lr,
 *               eps)                                   per epoch, with the metric
 * SequentialLR's sub-schedulers are text, as a config file writes them, created in order on
 * the same optimizer:
 *     schedulers = "LinearLR(start_factor=0.1, total_iters=5), CosineAnnealingLR(T_max=95)"
 *     milestones = [5]
 * Per-group values (OneCycleLR's max_lr and momenta, ReduceLROnPlateau's min_lr) take one
 * number or a list with one per group.
 */
#ifndef EMBER_OPTIM_H
#define EMBER_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/options.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_optimizer em_optimizer;

/* The largest step or epoch count a state dict or checkpoint may hold: 2^53, the last count a
 * double (the "step" state) holds exactly, and far enough below INT64_MAX that counting on
 * from it cannot overflow. Loading refuses larger counts, naming them. */
#define EM_STEP_MAX INT64_C(9007199254740992)

typedef struct em_optim_class {
    size_t struct_size;
    const char *name;               /* "SGD", "Adam", ... */
    const char *description;
    const em_option_spec *options;  /* per-group hyper-parameters; "lr" is expected */
    int n_options;
    /* One update of every parameter with a grad, reading group options and per-parameter
     * state (em_optimizer_state). Runs with grad mode disabled. */
    em_status (*step)(em_optimizer *o);
    /* (optional) Cross-option checks the spec's ranges cannot express, for one group's
     * resolved options (e.g. SGD's nesterov needs momentum > 0 and dampening 0); `where`
     * names the class and group for the message ("SGD (param group 1)"). NULL: none. */
    em_status (*validate)(const em_options *opts, const char *where);
    void *ext;
} em_optim_class;

/* Register an optimizer class (the "optimizer" kind of ember/plugin.h's class registry; the
 * record is copied). EM_ERR_EXISTS when the name is taken (naming who took it); EM_ERR_INVALID
 * for a record older than this core accepts, no name, no step, or a bad option table. */
EM_API em_status em_optim_class_register(em_registry *reg, const em_optim_class *cls);
/* The class, or NULL with EM_ERR_NOTFOUND listing the registered ones (and a near name). */
EM_API const em_optim_class *em_optim_class_find(const char *name);
EM_API size_t em_optim_class_count(void);
EM_API const em_optim_class *em_optim_class_get(size_t i);

/* One group: the params dict (names -> live parameter tensors, e.g. from
 * em_module_named_parameters) and its options (may be NULL: the defaults). */
typedef struct em_param_group {
    const em_dict *params;
    const em_options *options;
} em_param_group;

/* Create an optimizer over one group / several groups. The optimizer retains the parameters;
 * options are resolved against the class (errors name the class, group and option); a
 * parameter in two groups is an error naming it. */
EM_API em_optimizer *em_optimizer_new(const char *class_name, const em_dict *params,
                                      const em_options *opts);
EM_API em_optimizer *em_optimizer_new_groups(const char *class_name, const em_param_group *groups,
                                             int n_groups);
/* As em_optimizer_new_groups, with optimizer-wide defaults (PyTorch's constructor keyword
 * arguments): an option a group leaves out comes from `defaults` (may be NULL), then from the
 * class's spec. E.g. defaults lr 0.1, weight_decay 1e-4, and a second group {weight_decay: 0}
 * for biases and norms. */
EM_API em_optimizer *em_optimizer_new_groups_defaults(const char *class_name,
                                                      const em_param_group *groups,
                                                      int n_groups, const em_options *defaults);
EM_API void em_optimizer_free(em_optimizer *o);

EM_API em_status em_optimizer_step(em_optimizer *o);
/* Clear every parameter's .grad (set to none, PyTorch's default). */
EM_API void em_optimizer_zero_grad(em_optimizer *o);

/* ---- for optimizer classes and schedulers --------------------------------------------------- */

EM_API const em_optim_class *em_optimizer_class(const em_optimizer *o);
EM_API int em_optimizer_group_count(const em_optimizer *o);
/* A group's options (resolved): read with em_options_float(...); schedulers change "lr"
 * through em_optimizer_set_lr. An optimizer's "lr" must be finite and >= 0 when it is created
 * (checked by the core, EM_ERR_INVALID); em_optimizer_set_lr refuses only NaN, because
 * schedulers may drive it lower, as PyTorch's do (OneCycleLR's step past its last phase). */
EM_API const em_options *em_optimizer_group_options(const em_optimizer *o, int group);
/* The same options, writable: schedulers that cycle other hyper-parameters (OneCycleLR's
 * "momentum" or "betas") set them here. Values written must stay valid for the class. NULL
 * for a bad group (with the error set). */
EM_API em_options *em_optimizer_group_options_mutable(em_optimizer *o, int group);
EM_API em_status em_optimizer_set_lr(em_optimizer *o, int group, double lr);
EM_API double em_optimizer_lr(const em_optimizer *o, int group);
/* The group's learning rate as a 0-dim float64 tensor on dev (borrowed; NULL with the error
 * set), which the capturable optimizer steps' kernels read (fused_sgd_capturable and the
 * Adam forms, core/ops_optim.c) so that a step captured in a graph sees the lr of each
 * replay. Made on the first call (a fill on dev's current stream), refilled by this call
 * when the group's lr has changed since, and by em_optimizer_set_lr. A capture records such
 * fills with their values: call it once before a capture (an eager step does), and change
 * the lr between replays with em_optimizer_set_lr outside the captured region, as the
 * schedulers do. One device per group: a call for another device replaces the tensor. New
 * in EMBER_1.1. */
EM_API em_tensor *em_optimizer_lr_tensor(em_optimizer *o, int group, em_device dev);
/* Parameters of a group: count, and the i-th (borrowed) with its global index and name. */
EM_API int em_optimizer_param_count(const em_optimizer *o, int group);
EM_API em_tensor *em_optimizer_param(const em_optimizer *o, int group, int i, int *index,
                                     const char **name);
/* Total parameters over all groups; global indices are 0..count-1, group by group. */
EM_API int em_optimizer_param_total(const em_optimizer *o);
/* Per-parameter state by global parameter index and name (borrowed; NULL when absent).
 * The state named "step" is a 0-dim count (PyTorch's convention); every other state has its
 * parameter's shape and a floating dtype. The state dict loader checks that. */
EM_API em_tensor *em_optimizer_state(const em_optimizer *o, int index, const char *name);
/* Set (retain t, tag it EM_MEM_OPTIMIZER; replaces an existing one). */
EM_API em_status em_optimizer_set_state(em_optimizer *o, int index, const char *name,
                                        em_tensor *t);
/* The number of steps taken (saved in the state dict). */
EM_API int64_t em_optimizer_steps(const em_optimizer *o);
/* Count n steps taken without em_optimizer_step: replays of a step captured in a graph
 * (em_graph_replay runs the captured kernels, not this counter's increment). EM_ERR_RANGE
 * past EM_STEP_MAX in all. New in EMBER_1.1. */
EM_API em_status em_optimizer_count_replayed(em_optimizer *o, int64_t n);

/* State dict: tensors into *tensors (a new dict, keys "state.<index>.<name>") and the groups'
 * hyper-parameters, the step count and each group's parameter indices as JSON into *groups_json
 * (a new string, free with em_host_free). Loading checks everything before it changes
 * anything — the groups and parameter counts, every state's shape and dtype (above), the step
 * counts ("steps" and each "step" state: whole numbers in [0, EM_STEP_MAX]) — and names the
 * key of what differs; on an error the optimizer is as it was. */
EM_API em_status em_optimizer_state_dict(const em_optimizer *o, em_dict **tensors,
                                         char **groups_json);
EM_API em_status em_optimizer_load_state_dict(em_optimizer *o, const em_dict *tensors,
                                              const char *groups_json);

/* ---- gradient clipping ------------------------------------------------------------------------ */

/* torch.nn.utils.clip_grad_norm_: scale all grads so their total norm (p = 2 or inf; others
 * allowed) is at most max_norm; *total_norm (may be NULL) receives the norm before clipping.
 * error_if_nonfinite: a NaN/Inf norm is EM_ERR_RANGE instead of clipping. Runs as ops on the
 * grads' device; only the norm asked for (or checked) is read on the host. */
EM_API em_status em_clip_grad_norm_(const em_dict *params, double max_norm, double norm_type,
                                    bool error_if_nonfinite, double *total_norm);
/* The same clipping with no host read, so it can run under a graph capture
 * (em_graph_capture_begin) and be replayed: *total_norm receives the norm before clipping as a
 * new reference (em_tensor_release it) to a 0-dim float32 tensor on the first grad's device
 * (NULL when no param has a grad), and the clip coefficient stays a device tensor too
 * (PyTorch's clip_grad_norm_ with foreach and error_if_nonfinite = false). Both functions
 * compute on the grads' device with one fixed arithmetic, so they clip bit for bit alike:
 * each grad's norm in its dtype rounded to float32, combined in float64 in the params'
 * order (p = 2: squares summed, then sqrt; other p: pow), rounded to float32; the
 * coefficient float32(max_norm) / (total + 1e-6), clamped to at most 1, in float32; each grad
 * times it (float16 / bfloat16 in float32, rounded once). New in EMBER_1.1. */
EM_API em_status em_clip_grad_norm_device_(const em_dict *params, double max_norm,
                                           double norm_type, em_tensor **total_norm);
/* Clamp every grad element to [-clip, clip]. */
EM_API em_status em_clip_grad_value_(const em_dict *params, double clip);

/* ---- learning-rate schedulers ------------------------------------------------------------------ */

typedef struct em_scheduler em_scheduler;

typedef struct em_sched_class {
    size_t struct_size;
    const char *name;               /* "StepLR", "CosineAnnealingLR", ... */
    const char *description;
    const em_option_spec *options;
    int n_options;
    /* Stepped per batch ("step") or per epoch ("epoch"), as PyTorch users do. */
    const char *interval;
    size_t state_size;              /* class-private state bytes (em_scheduler_state) */
    /* Set up (e.g. record the base lrs: em_scheduler_base_lr). NULL: nothing. */
    em_status (*init)(em_scheduler *s, const em_options *opts);
    /* Compute and apply the lr for the new step count (em_scheduler_last_epoch). metric is
     * used by ReduceLROnPlateau (NaN otherwise). */
    em_status (*step)(em_scheduler *s, double metric);
    /* (optional) Free what init allocated (SequentialLR's sub-schedulers). NULL: nothing. */
    void (*free)(em_scheduler *s);
    /* (optional) The closed form: set the lr for em_scheduler_last_epoch() directly from the
     * base lrs (PyTorch's step(epoch), which SequentialLR uses at a milestone). NULL: step is
     * used, as PyTorch does for classes without _get_closed_form_lr. */
    em_status (*closed_form)(em_scheduler *s);
    /* (optional) Class-private state as JSON text (a new string, em_host_free) and back, for
     * em_scheduler_state_dict. NULL: nothing beyond the step counts and lrs the core saves. */
    em_status (*save)(const em_scheduler *s, char **json);
    em_status (*load)(em_scheduler *s, const char *json);
    void *ext;
} em_sched_class;

/* Register a scheduler class (the "scheduler" kind; as em_optim_class_register, and
 * EM_ERR_INVALID for an interval other than "step" or "epoch"). */
EM_API em_status em_sched_class_register(em_registry *reg, const em_sched_class *cls);
/* The class, or NULL with EM_ERR_NOTFOUND listing the registered ones (and a near name). */
EM_API const em_sched_class *em_sched_class_find(const char *name);
EM_API size_t em_sched_class_count(void);
EM_API const em_sched_class *em_sched_class_get(size_t i);

/* Create a scheduler bound to an optimizer (which must outlive it). Like PyTorch, creating it
 * performs the initial step (last_epoch 0). */
EM_API em_scheduler *em_scheduler_new(const char *class_name, em_optimizer *o,
                                      const em_options *opts);
EM_API void em_scheduler_free(em_scheduler *s);
/* Advance one step (per batch or per epoch, as the class says); metric for plateau schedulers,
 * NaN otherwise. */
EM_API em_status em_scheduler_step(em_scheduler *s, double metric);
/* The lr of group g after the last step (get_last_lr). */
EM_API double em_scheduler_last_lr(const em_scheduler *s, int group);
EM_API const em_sched_class *em_scheduler_class(const em_scheduler *s);
EM_API em_optimizer *em_scheduler_optimizer(const em_scheduler *s);
EM_API const em_options *em_scheduler_options(const em_scheduler *s);
EM_API void *em_scheduler_state(em_scheduler *s);
EM_API int64_t em_scheduler_last_epoch(const em_scheduler *s);
/* The lr each group had when the scheduler was created (PyTorch's base_lrs: the group's
 * "initial_lr", recorded by the first scheduler on the optimizer, so a second scheduler on
 * the same optimizer starts from the same base). */
EM_API double em_scheduler_base_lr(const em_scheduler *s, int group);
/* Change a group's base lr and the optimizer's initial_lr with it (OneCycleLR starts from
 * max_lr / div_factor). From a class's init. */
EM_API em_status em_scheduler_set_base_lr(em_scheduler *s, int group, double lr);
/* PyTorch's _step_count: steps taken including the initial one (CosineAnnealingLR reads it). */
EM_API int64_t em_scheduler_step_count(const em_scheduler *s);
/* For composite schedulers (SequentialLR) driving sub-schedulers as PyTorch does:
 * set last_epoch; redo the initial step (step count 0, then one step); step to an explicit
 * epoch (last_epoch = epoch, then the class's closed form, or step when it has none). */
EM_API void em_scheduler_set_last_epoch(em_scheduler *s, int64_t epoch);
EM_API em_status em_scheduler_initial_step(em_scheduler *s);
EM_API em_status em_scheduler_step_epoch(em_scheduler *s, int64_t epoch);
/* Its state as JSON (step count, class-private numbers) and back, for checkpoints. Loading
 * checks last_epoch (in [-1, EM_STEP_MAX]), step_count (in [0, EM_STEP_MAX]) and the lrs, and
 * the class checks its own state; on an error the scheduler is as it was (its class state is
 * saved first and put back). */
EM_API em_status em_scheduler_state_dict(const em_scheduler *s, char **json);
EM_API em_status em_scheduler_load_state_dict(em_scheduler *s, const char *json);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OPTIM_H */

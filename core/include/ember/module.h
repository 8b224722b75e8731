/*
 * ember/module.h — modules (layers, containers, losses) created by name from a class registry.
 *
 * The core knows no concrete layer: plugins (plugins/layers, ember-layers.so) and programs
 * register module classes; users create instances by name with options, exactly the same way
 * for a built-in layer, a third party's and the program's own (the nn.Module subclass
 * equivalent, without building a .so).
 *
 *     em_options *o = em_options_new();
 *     em_options_set_int(o, "in_features", 784);
 *     em_options_set_int(o, "out_features", 10);
 *     em_module *fc = em_module_new("Linear", o);          // NULL + message on a bad option
 *     em_options_free(o);
 *     em_tensor *y = em_module_forward(fc, x);              // a new reference
 *     em_dict *sd = em_module_state_dict(fc);               // "weight", "bias"
 *     em_module_free(fc);
 *
 * Parameters, buffers and children have names; state-dict keys join them with '.' the way
 * PyTorch names the equivalent nn.Module tree ("0.weight", "3.running_mean",
 * "3.num_batches_tracked", "fc.bias"), so weights move between Ember and PyTorch.
 * Parameters are tagged EM_MEM_PARAMETER and require grad; buffers are not parameters.
 *
 * A module owns its parameters, buffers, children and class-private state: em_module_free
 * releases them all. Tensors returned by forward are new references (scope-tracked like any
 * op result).
 */
#ifndef EMBER_MODULE_H
#define EMBER_MODULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/options.h"
#include "ember/random.h"
#include "ember/serialize.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_module em_module;

/* ---- classes ---------------------------------------------------------------------------------- */

typedef struct em_module_class {
    size_t struct_size;          /* sizeof(em_module_class) */
    const char *name;            /* "Linear", "CrossEntropyLoss", "myplugin.Swish" */
    const char *description;     /* one line */
    const em_option_spec *options;
    int n_options;
    /* Bytes of class-private state allocated (zeroed) with every instance: em_module_state(). */
    size_t state_size;
    /* Set the instance up from its resolved options: add parameters, buffers and children,
     * initialise them (with em_default_generator() unless told otherwise). Runs inside a scope
     * of its own: tensors it creates are released when it returns unless the module holds
     * them (add_parameter/add_buffer retain). A failure's message is prefixed with the class
     * name. NULL: nothing. */
    em_status (*init)(em_module *m, const em_options *opts);
    /* Compute the output from n_in inputs. Return a new reference: an op result, or
     * em_tensor_retain() of an input. Runs inside a scope of its own (its intermediates are
     * released on return; the result goes to the caller's scope). Errors are prefixed with
     * the class name. Most modules take one input; losses take (input, target). */
    em_tensor *(*forward)(em_module *m, em_tensor *const *in, int n_in);
    /* (optional) Free what init allocated beyond the state block, parameters and children.
     * Also called when init fails part-way. NULL: nothing. */
    void (*free)(em_module *m);
    /* Number of inputs forward takes: 1 for layers, 2 for losses (0: any). */
    int n_inputs;
    void *ext;                   /* reserved; NULL */
    /* ---- since 1.1 */
    /* The layer reads a padding mask (masked pooling, attention): while a forward runs under
     * em_module_forward_masked with a mask, this class's forward receives that mask as one
     * more input after its own, in[n_inputs] ((B, L) bool, true at real positions, false in
     * the padding; n_in is one more than without a mask). Without a mask it receives its
     * inputs alone. n_inputs counts the inputs without the mask. */
    bool takes_mask;
} em_module_class;

/* Register a module class (from a plugin's register function, or the program's registry):
 * the "module" kind of ember/plugin.h's class registry. The record is copied (a record built
 * against older headers, with a smaller struct_size, reads as zeros past its end); what its
 * pointers point at must outlive the registration. EM_ERR_EXISTS when the name is taken
 * (naming who took it); EM_ERR_INVALID for a record without forward, a bad name or option
 * table. */
EM_API em_status em_module_class_register(em_registry *reg, const em_module_class *cls);
/* Find a class; NULL with EM_ERR_NOTFOUND listing the registered names (and a near one). */
EM_API const em_module_class *em_module_class_find(const char *name);
/* Registered classes, for --list-plugins and ember-info. */
EM_API size_t em_module_class_count(void);
EM_API const em_module_class *em_module_class_get(size_t i);

/* ---- instances --------------------------------------------------------------------------------- */

/* Create an instance of a registered class; opts (may be NULL) are resolved against the class's
 * options (errors name the class and the option). The caller owns the result. */
EM_API em_module *em_module_new(const char *class_name, const em_options *opts);
/* Free a module with its parameters, buffers and children. NULL is a no-op. */
EM_API void em_module_free(em_module *m);

EM_API const em_module_class *em_module_class_of(const em_module *m);
/* The instance's resolved options (borrowed). */
EM_API const em_options *em_module_options(const em_module *m);
/* The class-private state block (state_size bytes, zeroed at creation). */
EM_API void *em_module_state(em_module *m);

/* Forward with hooks: pre-hooks, the class's forward, post-hooks. New reference. */
EM_API em_tensor *em_module_forward(em_module *m, const em_tensor *x);
EM_API em_tensor *em_module_forward_n(em_module *m, em_tensor *const *in, int n_in);
/* Forward with a padding mask (since 1.1): em_module_forward_n with `mask` ((B, L) bool,
 * true at real positions: em_batch_mask of ember/data.h) handed to every module of the call,
 * m and its children at any depth, whose class sets takes_mask (containers pass it on
 * without knowing). mask NULL: as em_module_forward_n. The mask is borrowed for the call;
 * calls nest (the innermost mask holds) and are per thread. New reference or NULL. */
EM_API em_tensor *em_module_forward_masked(em_module *m, em_tensor *const *in, int n_in,
                                           const em_tensor *mask);
/* The padding mask of the em_module_forward_masked call this thread is in (since 1.1;
 * borrowed; NULL outside one, or when it was given none). A takes_mask class whose forward
 * accepts a varying number of inputs (n_inputs 0) tells by it whether its last input is the
 * mask: that input is this very tensor. */
EM_API const em_tensor *em_module_forward_mask(void);

/* ---- parameters, buffers, children (class code and containers) ------------------------------------ */

/* Add a parameter: the module takes a reference, tags it EM_MEM_PARAMETER and makes it
 * require grad. Names are [A-Za-z0-9_]+ and unique among the module's parameters, buffers
 * and children. */
EM_API em_status em_module_add_parameter(em_module *m, const char *name, em_tensor *t);
/* Add a buffer (running statistics, counters); persistent buffers are in the state dict. */
EM_API em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *t,
                                      bool persistent);
/* Add a child module; m takes ownership (also on failure). */
EM_API em_status em_module_add_child(em_module *m, const char *name, em_module *child);
/* Add a child named by its position ("0", "1", ..., the child count before the call), as
 * torch.nn.Sequential names its children. m takes ownership (also on failure). */
EM_API em_status em_module_append_child(em_module *m, em_module *child);
/* Borrowed lookups by local name; NULL when absent. */
EM_API em_tensor *em_module_parameter(const em_module *m, const char *name);
EM_API em_tensor *em_module_buffer(const em_module *m, const char *name);
EM_API em_module *em_module_child(const em_module *m, const char *name);
/* Replace a buffer's tensor (e.g. a running-stat update that is not in place). */
EM_API em_status em_module_set_buffer(em_module *m, const char *name, em_tensor *t);
EM_API size_t em_module_child_count(const em_module *m);
/* Child i (borrowed) and its name; NULL past the end. */
EM_API em_module *em_module_child_at(const em_module *m, size_t i, const char **name);

/* ---- the module tree -------------------------------------------------------------------------------- */

/* All parameters under m with their dotted names, in registration order (a new dict; the
 * tensors are the live parameters, retained). trainable_only skips frozen ones. */
EM_API em_dict *em_module_named_parameters(const em_module *m, bool trainable_only);
EM_API int64_t em_module_parameter_count(const em_module *m, bool trainable_only);
/* Parameters and persistent buffers with PyTorch's key names (a new dict of live tensors). */
EM_API em_dict *em_module_state_dict(const em_module *m);
/* Copy sd's tensors into the module's parameters and persistent buffers of the same key
 * (converting dtype and device as needed; not recorded by autograd) through
 * em_dict_load_into (ember/serialize.h). Every problem is found before anything is copied:
 * missing keys, unexpected keys, shape mismatches (and dtype conversions, which are allowed)
 * go into *report (may be NULL; free it with em_load_report_free). strict: any missing or
 * unexpected key or shape mismatch fails (EM_ERR_INVALID) naming all of them and copies
 * nothing; not strict: the matching tensors load and the rest is only reported. */
EM_API em_status em_module_load_state_dict(em_module *m, const em_dict *sd, bool strict,
                                           em_load_report **report /* out, may be NULL */);

/* Train/eval mode for the whole subtree (Dropout, BatchNorm behave differently). */
EM_API void em_module_train(em_module *m, bool on);
EM_API bool em_module_training(const em_module *m);
/* Clear every parameter's .grad (set to none). */
EM_API void em_module_zero_grad(em_module *m);
/* Freeze (requires_grad off) or unfreeze every parameter named prefix or lying under the
 * module path prefix ("0" matches "0.weight" but not "01.weight"; "" matches all). Returns how many parameters changed via *count (may be NULL);
 * EM_ERR_NOTFOUND when nothing matches (the message lists the parameter names). */
EM_API em_status em_module_freeze(em_module *m, const char *prefix, bool frozen, int *count);
/* Move every parameter and buffer (grads too) to a device / dtype (floating ones only for
 * dtype). Parameters stay the same objects' names; tensors are replaced. */
EM_API em_status em_module_to_device(em_module *m, em_device dev);
EM_API em_status em_module_to_dtype(em_module *m, em_dtype dt);
/* Call fn on m and every descendant (depth first, parents first) with its dotted path. */
typedef em_status (*em_module_fn)(em_module *m, const char *path, void *user);
EM_API em_status em_module_apply(em_module *m, em_module_fn fn, void *user);

/* Forward hooks. A pre-hook sees the inputs; a post-hook sees inputs and the output and may
 * return a replacement output (a new reference) or NULL to keep it. */
typedef em_status (*em_forward_pre_hook)(em_module *m, em_tensor *const *in, int n_in,
                                         void *user);
typedef em_tensor *(*em_forward_hook)(em_module *m, em_tensor *const *in, int n_in,
                                      const em_tensor *out, void *user);
EM_API em_status em_module_add_forward_pre_hook(em_module *m, em_forward_pre_hook fn, void *user);
EM_API em_status em_module_add_forward_hook(em_module *m, em_forward_hook fn, void *user);

/* A torchinfo-like summary for an input shape: per layer name, class, output shape, parameter
 * and trainable counts (the module's own parameters; "--" for none); totals; estimated input,
 * parameter (with buffers), gradient (trainable parameters) and forward-activation (outputs of
 * the leaf modules) memory. The output shapes come from a forward pass on zeros of the
 * model's parameter dtype and device, in eval mode (restored after: nothing is updated) under
 * EM_GRAD_DISABLED (int64 zeros when the model
 * rejects a floating input, as an Embedding does); its failure is the summary's error. Writes
 * to f only. */
EM_API em_status em_module_summary(em_module *m, int ndim, const int64_t *input_shape,
                                   FILE *f);

/* ---- initialisation ----------------------------------------------------------------------------------- */

/* PyTorch's init functions, drawn from gen (NULL: the default generator) with grad recording
 * off (so they apply to parameters). fan_in/fan_out follow
 * torch.nn.init._calculate_fan_in_and_fan_out. kaiming: bound/std = gain(nonlinearity, a) /
 * sqrt(fan); mode "fan_in" (NULL) or "fan_out"; nonlinearity as em_init_calculate_gain (NULL:
 * "leaky_relu"); a zero-element tensor is left alone. Linear and Conv2d weights use
 * kaiming_uniform(a = sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)). xavier: std =
 * gain sqrt(2 / (fan_in + fan_out)). */
EM_API em_status em_init_uniform_(em_tensor *t, double lo, double hi, em_generator *gen);
EM_API em_status em_init_normal_(em_tensor *t, double mean, double std, em_generator *gen);
EM_API em_status em_init_zeros_(em_tensor *t);
EM_API em_status em_init_ones_(em_tensor *t);
EM_API em_status em_init_xavier_uniform_(em_tensor *t, double gain, em_generator *gen);
EM_API em_status em_init_xavier_normal_(em_tensor *t, double gain, em_generator *gen);
EM_API em_status em_init_kaiming_uniform_(em_tensor *t, double a, const char *mode,
                                          const char *nonlinearity, em_generator *gen);
EM_API em_status em_init_kaiming_normal_(em_tensor *t, double a, const char *mode,
                                         const char *nonlinearity, em_generator *gen);
/* torch.nn.init._calculate_fan_in_and_fan_out: fan_in = size(1) * receptive field,
 * fan_out = size(0) * receptive field (the product of dims 2..). EM_ERR_SHAPE for fewer than
 * 2 dims. Either out-pointer may be NULL. */
EM_API em_status em_init_calculate_fans(const em_tensor *t, int64_t *fan_in /* out */,
                                        int64_t *fan_out /* out */);
/* torch.nn.init.calculate_gain: 1 for linear/conv/sigmoid, 5/3 tanh, sqrt(2) relu,
 * sqrt(2 / (1 + param^2)) leaky_relu (param NaN: 0.01), 3/4 selu; EM_ERR_INVALID otherwise. */
EM_API em_status em_init_calculate_gain(const char *nonlinearity, double param,
                                        double *gain /* out */);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_MODULE_H */

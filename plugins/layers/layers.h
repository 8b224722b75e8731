/*
 * layers.h — shared by the files of ember-layers.so (layers, containers and losses built on
 * the public ops of ember/ops.h, so autograd runs through them). Never installed.
 *
 * Each file defines its class records and exposes them through a NULL-terminated table that
 * layers.c registers. The option-spec macros keep the tables readable.
 */
#ifndef EMBER_LAYERS_H
#define EMBER_LAYERS_H

#include <math.h>
#include <string.h>

#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/tensor.h"

/* Option specs: name, default, range, help. */
#define OPT_INT_REQ(nm, lo, hi, hlp)                                                          \
    {.name = nm, .types = EM_OPT_INT, .required = true, .has_range = true, .min = (lo),      \
     .max = (hi), .help = hlp}
#define OPT_INT(nm, dflt, lo, hi, hlp)                                                        \
    {.name = nm, .types = EM_OPT_INT, .def = {.i = (dflt)}, .has_range = true, .min = (lo),  \
     .max = (hi), .help = hlp}
#define OPT_FLOAT(nm, dflt, lo, hi, hlp)                                                      \
    {.name = nm, .types = EM_OPT_FLOAT, .def = {.f = (dflt)}, .has_range = true,             \
     .min = (lo), .max = (hi), .help = hlp}
#define OPT_BOOL(nm, dflt, hlp) {.name = nm, .types = EM_OPT_BOOL, .def = {.b = (dflt)}, .help = hlp}
#define OPT_CHOICE(nm, dflt, list, hlp)                                                       \
    {.name = nm, .types = EM_OPT_STRING, .def = {.s = (dflt)}, .choices = (list), .help = hlp}
/* A pair (H, W) given as one int or a list of 2. */
#define OPT_PAIR_REQ(nm, lo, hlp)                                                             \
    {.name = nm, .types = EM_OPT_INTS, .required = true, .has_range = true, .min = (lo),     \
     .max = 1e9, .help = hlp}
#define OPT_PAIR(nm, dflt, lo, hlp)                                                           \
    {.name = nm, .types = EM_OPT_INTS, .def = {.n = 1, .ints = {(dflt)}}, .has_range = true, \
     .min = (lo), .max = 1e9, .help = hlp}
#define OPT_FLOATS(nm, hlp) {.name = nm, .types = EM_OPT_FLOATS, .def = {.n = 0}, .help = hlp}
#define NOPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

extern const char *const layers_reductions[]; /* "none", "mean", "sum" */

/* Read a pair option (1 or 2 entries) into out; an error naming cls and the option otherwise.
 * An empty list gives `dflt` (when dflt is non-NULL). */
em_status layers_pair(const char *cls, const em_options *o, const char *name,
                         const int64_t *dflt, int64_t out[2]);
/* The reduction option as an enum. */
em_reduction layers_reduction(const em_options *o);
/* A new 1-D f32 tensor from a FLOATS option, or NULL without an error when the list is empty
 * (*made false). */
em_tensor *layers_floats_tensor(const em_options *o, const char *name, bool *made);
/* Linear/Conv2d defaults: weight kaiming_uniform(a = sqrt 5), bias U(-1/sqrt(fan_in), +). */
em_status layers_default_init(em_tensor *weight, em_tensor *bias);

/* EM_OK when x can meet the layer's floating-point parameter w (NULL: none); otherwise
 * EM_ERR_DTYPE saying that the batch is integer (uint8 images, say) and how to make it float:
 * the loader's to_float transform, or em_to_dtype. */
em_status layers_check_float_input(const em_tensor *x, const em_tensor *w);

/* Tables of class records, NULL-terminated. */
extern const em_module_class *const layers_basic[];      /* layers.c */
extern const em_module_class *const layers_norm[];       /* layers_norm.c */
extern const em_module_class *const layers_containers[]; /* layers_containers.c */
extern const em_module_class *const layers_losses[];     /* layers_loss.c */
extern const em_module_class *const layers_rnn[];        /* layers_rnn.c */
extern const em_module_class *const layers_attn[];       /* layers_attn.c */

#endif /* EMBER_LAYERS_H */

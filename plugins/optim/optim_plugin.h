/*
 * optim_plugin.h — what the files of ember-optim.so share: each registers its classes.
 */
#ifndef EMBER_OPTIM_PLUGIN_H
#define EMBER_OPTIM_PLUGIN_H

#include "ember/dispatch.h"
#include "ember/error.h"

/* SGD, Adam, AdamW, RMSprop, Adagrad (optimizers.c). */
em_status optim_plugin_register_optimizers(em_registry *reg);
/* StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, SequentialLR, OneCycleLR,
 * ReduceLROnPlateau (schedulers.c). */
em_status optim_plugin_register_schedulers(em_registry *reg);

#endif /* EMBER_OPTIM_PLUGIN_H */

/*
 * ember/ember.h — the whole public API, and starting and stopping the library.
 *
 *     #include <ember/ember.h>
 *
 *     int main(void) {
 *         if (em_init() != EM_OK) { fprintf(stderr, "%s\n", em_last_error()); return 1; }
 *         em_tensor *x = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
 *         em_tensor_print(stdout, x);              // tensor([1., 1., 1.], shape=[3])
 *         em_tensor_release(x);
 *         em_shutdown();
 *     }
 *
 * Build a program with `cc prog.c $(pkg-config --cflags --libs ember)`.
 */
#ifndef EMBER_EMBER_H
#define EMBER_EMBER_H

#include "ember/export.h"
#include "ember/error.h"
#include "ember/dtype.h"
#include "ember/device.h"
#include "ember/tensor.h"
#include "ember/dispatch.h"
#include "ember/op_helpers.h"
#include "ember/ops.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "ember/autograd.h"
#include "ember/autocast.h"
#include "ember/grad_scaler.h"
#include "ember/options.h"
#include "ember/module.h"
#include "ember/optim.h"
#include "ember/dict.h"
#include "ember/serialize.h"
#include "ember/plugin.h"
#include "ember/opcase.h"
#include "ember/transform.h"
#include "ember/data.h"
#include "ember/config.h"
#include "ember/checkpoint.h"
#include "ember/trace.h"
#include "ember/onnx.h"
#include "ember/comm.h"
#include "ember/ddp.h"
#include "ember/version.h"
#include "ember/init.h"

#endif /* EMBER_EMBER_H */

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
#include "ember/options.h"
#include "ember/module.h"
#include "ember/optim.h"
#include "ember/dict.h"
#include "ember/serialize.h"
#include "ember/plugin.h"
#include "ember/data.h"
#include "ember/config.h"
#include "ember/checkpoint.h"
#include "ember/trace.h"
#include "ember/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Start the library: read the environment (EMBER_LOG, EMBER_FALLBACK, EMBER_NUM_THREADS,
 * EMBER_SEED, EMBER_PLUGIN_PATH, EMBER_DISABLE_PLUGINS) and load the plugins. Idempotent and
 * thread-safe: later calls return the first call's result. Refused plugins do not make it
 * fail (em_plugins() lists them); it fails only when the core itself cannot start (out of
 * memory) — or when no plugin registered the CPU device, which every tensor needs. */
EM_API em_status em_init(void);
/* Unload every plugin and free every cache and registry. Tensors must all be released first
 * (the ones still alive are reported as a warning and leaked). em_init() may be called again
 * afterwards. */
EM_API void em_shutdown(void);
/* True between a successful em_init() and em_shutdown(). */
EM_API bool em_initialized(void);

/* "0.1.0" */
EM_API const char *em_version(void);
/* One line: compiler, build options, libraries. */
EM_API const char *em_build_info(void);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_EMBER_H */

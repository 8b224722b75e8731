/*
 * ember/init.h — starting and stopping the library: em_init, em_shutdown, and what the build
 * is (em_version, em_build_info). Part of the umbrella <ember/ember.h>.
 */
#ifndef EMBER_INIT_H
#define EMBER_INIT_H

#include <stdbool.h>

#include "ember/error.h"
#include "ember/export.h"

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
#endif /* EMBER_INIT_H */

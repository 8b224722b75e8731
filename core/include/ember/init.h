/*
 * ember/init.h — starting and stopping the library: em_init, em_shutdown(_checked), and what
 * the build is (em_version, em_build_info). Part of the umbrella <ember/ember.h>.
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
/* Unload every plugin and free every cache and registry, and say whether the program still
 * held anything. Returns EM_OK when nothing was left alive, or EM_ERR_BUSY, with a message
 * (em_last_error) naming what the program still holds: live tensors (the count, and the
 * shapes and dtypes of up to five, newest first, with the scope each came from), modules
 * (children included), optimizers, schedulers, datasets, loaders, dicts, configs,
 * generators, and scopes still open on the calling thread, e.g.
 *     em_shutdown_checked: the program still holds 2 tensors ([64, 784] float32, [64]
 *     int64 (from the scope opened at train.c:52)), 1 module, 1 optimizer; release them
 *     before shutting down (their memory is leaked)
 * Either way the library is shut down: what is still alive is leaked, everything else is
 * freed, and em_init() may be called again. Tests end with
 * `assert(em_shutdown_checked() == EM_OK)`, so a leak fails the test that made it. Call it
 * with no other thread using Ember. Without em_init() there is nothing to shut down, but what
 * is still alive is named the same way. */
EM_API em_status em_shutdown_checked(void);
/* em_shutdown_checked(), with its verdict logged (EM_LOG_WARN) instead of returned. */
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

/*
 * init.c — starting and stopping the library, version and build information.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "ember/device.h"
#include "ember/error.h"
#include "ember/init.h"
#include "ember/plugin.h"
#include "internal.h"

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool initialized;
static em_status init_status;
static char init_message[1024];

bool em_initialized(void) { return initialized; }
const char *em_version(void) { return PACKAGE_VERSION; }

const char *em_build_info(void) {
    return "ember " PACKAGE_VERSION " (plugin ABI " EM__STR(EM_PLUGIN_ABI_MAJOR) "), "
#if defined(__clang__)
           "clang " __clang_version__
#elif defined(__GNUC__)
           "gcc " __VERSION__
#endif
#ifdef __OPTIMIZE__
           ", optimized"
#endif
#if defined(__SANITIZE_ADDRESS__)
           ", AddressSanitizer"
#endif
           ", plugin dir " EM_PLUGIN_DIR;
}

static void teardown(void) {
    em__scope_shutdown();
    em__plugins_unload_all();
    em__registries_shutdown();
    em__dispatch_shutdown();
    em__devices_shutdown();
    em__random_shutdown();
}

em_status em_init(void) {
    pthread_mutex_lock(&init_lock);
    if (initialized) {
        em_status st = init_status;
        if (st != EM_OK) em_set_error(st, "%s", init_message);
        pthread_mutex_unlock(&init_lock);
        return st;
    }
    em__log_init();
    em__dispatch_init();
    em__random_init();
    em__autograd_init();
    em_status st = em__registries_init();
    if (st == EM_OK) st = em__ops_declare_standard(em__registry_core());
    if (st != EM_OK) {
        snprintf(init_message, sizeof init_message, "%s", em_last_error());
        teardown();
        em_set_error(st, "em_init: %s", init_message);
        pthread_mutex_unlock(&init_lock);
        return st;
    }
    initialized = true;
    /* Backends compute on OpenMP (libgomp, loaded with the CPU plugin, reads this once, when
     * it loads). Its default spin-waiting workers fight data-loader threads and other
     * processes for the cores: measured 11-27x slower training steps on a busy 2-core machine.
     * Passive waiting is the default unless the user chose otherwise. */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        /* ...but only when libgomp is not loaded yet: a program that uses OpenMP itself (or
         * preloads it) has libgomp read its environment already, and setting it now would
         * change nothing. Say so, once per process. */
        void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
        static bool told;
        if (gomp && !told) {
            told = true;
            em_log_write(EM_LOG_WARN, "OpenMP (libgomp) was loaded before em_init, so its "
                         "worker threads keep their default of spinning ~3 ms after each "
                         "parallel region instead of waiting passively; that slows training "
                         "when other threads or processes share the cores. Set "
                         "OMP_WAIT_POLICY=PASSIVE in the environment before the program starts "
                         "(or OMP_WAIT_POLICY=ACTIVE to keep spinning and silence this)");
        }
        if (gomp) dlclose(gomp);
    }
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    if (em__plugins_load_all() == EM_ERR_NOMEM) {
        snprintf(init_message, sizeof init_message, "%s", em_last_error());
        teardown();
        initialized = false;
        em_set_error(EM_ERR_NOMEM, "%s", init_message);
        pthread_mutex_unlock(&init_lock);
        return EM_ERR_NOMEM;
    }
    init_status = EM_OK;
    if (!em__device_types[EM_DEVICE_CPU_TYPE].used) {
        init_status = em_set_error(EM_ERR_PLUGIN, "em_init: no plugin registered the CPU device "
                                   "(searched %s; run ember-info to see every candidate and why "
                                   "it was refused)", em_plugin_search_path());
        snprintf(init_message, sizeof init_message, "%s", em_last_error());
    }
    st = init_status;
    pthread_mutex_unlock(&init_lock);
    return st;
}

void em_shutdown(void) {
    pthread_mutex_lock(&init_lock);
    if (!initialized) {
        pthread_mutex_unlock(&init_lock);
        return;
    }
    em__scope_shutdown();
    int64_t live = em__live_tensors();
    if (live > 0)
        em_log_write(EM_LOG_WARN, "em_shutdown: %lld tensor%s still alive; release them before "
               "shutting down (their memory is leaked)", (long long)live, live == 1 ? " is" : "s are");
    teardown();
    initialized = false;
    init_status = EM_OK;
    pthread_mutex_unlock(&init_lock);
}

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
#include "ember/opcase.h"
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
    em__autocast_thread_exit(); /* regions left open: their cached casts */
    em__scope_shutdown();
    em__plugins_unload_all();
    em__registries_shutdown();
    em__dispatch_shutdown();
    em__devices_shutdown();
    em__random_shutdown();
    em__tensors_quarantine_flush();
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
    if (st == EM_OK) {
        size_t n;
        const em_op_case *rows = em__op_cases_standard(&n);
        st = em_op_cases_register(em__registry_core(), rows, n);
    }
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
     * Passive waiting is the default unless the user chose otherwise (OMP_WAIT_POLICY or
     * GOMP_SPINCOUNT: either leaves libgomp's environment to the user). A bounded spin
     * (GOMP_SPINCOUNT, ~25 ns a spin on a Zen 4 core) was measured as the default and not
     * kept: on an idle 2-vCPU VM it shortens the MLP step (passive 2.33 ms, 10000 spins
     * 1.91-2.07, active 1.89), but with other work on the cores a sleeping worker is woken
     * ahead of the others while a spinning one burns its share, and 10000 spins made the same
     * step 1.2-4.4x slower, the CNN step 1.5-2.2x and a Fashion-MNIST epoch 1.05-1.7x; 1000
     * spins (25 us) gained at most 9% idle, was mixed loaded and cost up to 20% more CPU
     * (bench/README.md, "The OpenMP wait policy"). */
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        /* ...but only when libgomp is not loaded yet: a program that uses OpenMP itself (or
         * preloads it) has libgomp read its environment already, and setting it now would
         * change nothing. Say so, once per process. */
        void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
        static bool told;
        if (gomp && !told) {
            told = true;
            em_log_write(EM_LOG_WARN, "OpenMP (libgomp) was loaded before em_init, so its "
                         "worker threads keep their default of spinning for milliseconds after "
                         "each parallel region instead of waiting passively; that slows training "
                         "when other threads or processes share the cores. Set "
                         "OMP_WAIT_POLICY=PASSIVE in the environment before the program starts "
                         "(or OMP_WAIT_POLICY=ACTIVE to keep spinning and silence this)");
        }
        if (gomp) dlclose(gomp);
        setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    }
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

/* What the program still holds, as "2 tensors ([3] float32, ...), 1 module" into buf; false
 * when nothing. */
static bool describe_held(char *buf, size_t cap) {
    static const char *const kinds[EM__LIVE_N][2] = {
        [EM__LIVE_MODULE] = {"module", "modules"},
        [EM__LIVE_OPTIMIZER] = {"optimizer", "optimizers"},
        [EM__LIVE_SCHEDULER] = {"scheduler", "schedulers"},
        [EM__LIVE_DATASET] = {"dataset", "datasets"},
        [EM__LIVE_LOADER] = {"loader", "loaders"},
        [EM__LIVE_DICT] = {"dict", "dicts"},
        [EM__LIVE_CONFIG] = {"config", "configs"},
        [EM__LIVE_GENERATOR] = {"generator", "generators"},
    };
    size_t n = 0;
    bool any = false;
    const char *file = NULL;
    int line = 0;
    int scopes = em__scope_open(&file, &line);
    if (scopes > 0) {
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%d open scope%s on this thread "
                              "(the innermost opened at %s:%d)", scopes, scopes == 1 ? "" : "s",
                              file, line);
        any = true;
    }
    char first[512];
    int64_t live = em__tensors_describe_live(first, sizeof first, 5);
    if (live > 0) {
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%lld tensor%s (%s%s)",
                              any ? ", " : "", (long long)live, live == 1 ? "" : "s",
                              live > 5 ? "the newest: " : "", first);
        any = true;
    }
    for (int k = 0; k < EM__LIVE_N; k++) {
        long long c = atomic_load(&em__live_objects[k]);
        if (c <= 0) continue;
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%lld %s", any ? ", " : "", c,
                              kinds[k][c != 1]);
        if (k == EM__LIVE_MODULE && c > 1)
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, " (children included)");
        any = true;
    }
    return any;
}

em_status em_shutdown_checked(void) {
    pthread_mutex_lock(&init_lock);
    /* Without em_init there is nothing to tear down, but objects made without it (configs,
     * option bags' dicts, generators) are still worth naming. */
    bool was = initialized;
    if (was) em__scope_shutdown();
    if (was) em__async_copies_shutdown(); /* the host sources still being copied */
    char held[900];
    bool busy = describe_held(held, sizeof held);
    if (was) {
        teardown();
        initialized = false;
        init_status = EM_OK;
    }
    pthread_mutex_unlock(&init_lock);
    if (busy)
        return em_set_error(EM_ERR_BUSY, "em_shutdown_checked: the program still holds %s; "
                            "release them before shutting down (their memory is leaked)", held);
    return EM_OK;
}

void em_shutdown(void) {
    if (em_shutdown_checked() == EM_ERR_BUSY) em_log_write(EM_LOG_WARN, "%s", em_last_error());
}

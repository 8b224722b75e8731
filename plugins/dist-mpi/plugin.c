/*
 * plugin.c — ember-mpi.so: registers the "mpi" communicator class (ember/comm.h). This file
 * does not link MPI: the class's create loads ember-mpi-engine.so (engine.c, linked with Open
 * MPI) the first time a communicator is made, so a process that never communicates (a plain
 * ember-train, every test) loads no MPI library and em_init() costs what it did.
 *
 * The engine is found at EMBER_MPI_ENGINE when set, else in the build tree when this plugin
 * runs from it (plugins/dist-mpi/.libs), else in the installed engine directory.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/comm.h"
#include "ember/error.h"
#include "ember/plugin.h"
#include "ember/version.h"
#include "engine.h"

static const em_mpi_engine *E;

static em_status load_engine(void) {
    if (E) return EM_OK;
    char path[PATH_MAX + 64];
    const char *env = getenv("EMBER_MPI_ENGINE");
    Dl_info info;
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else if (dladdr((void *)load_engine, &info) && info.dli_fname &&
               strstr(info.dli_fname, "/plugins/dist-mpi/.libs/")) {
        snprintf(path, sizeof path, "%s/plugins/dist-mpi/engine/.libs/ember-mpi-engine.so",
                 EM_BUILD_DIR);
    } else {
        snprintf(path, sizeof path, "%s/ember-mpi-engine.so", EM_ENGINE_DIR);
    }
    /* RTLD_GLOBAL: Open MPI's own components (dlopen()ed by libopen-pal) resolve libmpi's
     * symbols through the global scope; NODELETE: MPI's threads outlive a dlclose. */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
    if (!h)
        return em_set_error(EM_ERR_PLUGIN, "comm_new: mpi: cannot load the MPI engine %s: %s",
                            path, dlerror());
    em_mpi_engine_fn fn;
    *(void **)&fn = dlsym(h, EM_MPI_ENGINE_SYMBOL);
    const em_mpi_engine *e = fn ? fn() : NULL;
    if (!e || e->struct_size < sizeof *e)
        return em_set_error(EM_ERR_PLUGIN, "comm_new: mpi: %s is not this plugin's engine (no "
                            "%s of the expected size)", path, EM_MPI_ENGINE_SYMBOL);
    E = e;
    return EM_OK;
}

static em_status t_create(const em_comm_options *o, void **state, int *rank, int *size) {
    em_status st = load_engine();
    return st != EM_OK ? st : E->cls.create(o, state, rank, size);
}
/* The slots below run only on a communicator that create made: E is set. */
static void t_destroy(void *s) { E->cls.destroy(s); }
static em_status t_start(void *s, em_collective c, uint64_t seq, const em_comm_buf *a,
                         const em_comm_buf *b, int root, void **req) {
    return E->cls.start(s, c, seq, a, b, root, req);
}
static em_status t_test(void *s, void *req, bool *done) { return E->cls.test(s, req, done); }
static em_status t_wait(void *s, void *req, double timeout_s) {
    return E->cls.wait(s, req, timeout_s);
}

static double t_done_at(void *s) { return E->cls.done_at(s); }

static const em_comm_class mpi_class = {
    .struct_size = sizeof mpi_class, .name = "mpi",
    .description = "Open MPI between processes and hosts (CPU tensors; mpirun, srun)",
    .create = t_create, .destroy = t_destroy, .start = t_start, .test = t_test, .wait = t_wait,
    .done_at = t_done_at,
};

static em_status mpi_register(em_registry *reg) { return em_comm_class_register(reg, &mpi_class); }

static void mpi_shutdown(void) {
    if (E) E->finalize();
}

static const em_plugin_descriptor mpi_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-mpi",
    .version = EM_VERSION_STRING,
    .description = "communicator: Open MPI (loaded when a communicator is created)",
    .register_fn = mpi_register,
    .shutdown_fn = mpi_shutdown,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &mpi_plugin; }

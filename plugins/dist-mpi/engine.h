/*
 * engine.h — what ember-mpi.so (plugin.c) finds in ember-mpi-engine.so (engine.c), the part
 * linked with Open MPI. The plugin registers the "mpi" communicator class without touching
 * MPI; the engine (and with it libmpi, libopen-pal, libpmix, libhwloc ...) is loaded only when
 * a communicator is created, so em_init() of a process that never communicates pays nothing.
 */
#ifndef EMBER_MPI_ENGINE_H
#define EMBER_MPI_ENGINE_H

#include <stddef.h>

#include "ember/comm.h"

typedef struct em_mpi_engine {
    size_t struct_size;   /* sizeof(em_mpi_engine) */
    em_comm_class cls;    /* create, destroy, start, test, wait */
    /* MPI_Finalize when this engine started MPI and no collective was left pending. */
    void (*finalize)(void);
} em_mpi_engine;

#define EM_MPI_ENGINE_SYMBOL "ember_mpi_engine"
typedef const em_mpi_engine *(*em_mpi_engine_fn)(void);

#endif /* EMBER_MPI_ENGINE_H */

/*
 * steptimes.c — an LD_PRELOAD shim that timestamps every optimizer step of an unmodified
 * program: it wraps em_optimizer_step, reads CLOCK_MONOTONIC when the real one returns, and at
 * exit writes one line per step (two clocks, nanoseconds) to the file named by EMBER_STEP_TIMES.
 *
 * bench/trainer_overhead.sh preloads it into both ember-train and bench/trainer_overhead (the
 * same loop by hand), so the two are timed at the same point by the same code: the interval
 * between two step ends is one whole training step (data, forward, backward, step and whatever
 * the program does around them). Each line holds two clocks: CLOCK_MONOTONIC (wall time) and
 * the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), which other processes on a busy
 * machine do not inflate — with EMBER_NUM_THREADS=1 and no loader workers the main thread does
 * all of a step's work.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <ember/ember.h>

#define MAX_STEPS 1000000

static em_status (*real_step)(em_optimizer *);
static int64_t *stamps; /* pairs: wall, thread CPU */
static size_t n_stamps;

/* default visibility: the build hides symbols unless told */
__attribute__((visibility("default"))) em_status em_optimizer_step(em_optimizer *o) {
    if (!real_step) {
        *(void **)&real_step = dlsym(RTLD_NEXT, "em_optimizer_step");
        if (!real_step) {
            fprintf(stderr, "steptimes: em_optimizer_step not found: %s\n", dlerror());
            abort();
        }
    }
    em_status s = real_step(o);
    struct timespec ts, cpu;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    if (!stamps) stamps = malloc(2 * MAX_STEPS * sizeof *stamps);
    if (stamps && n_stamps < MAX_STEPS) {
        stamps[2 * n_stamps] = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        stamps[2 * n_stamps + 1] = (int64_t)cpu.tv_sec * 1000000000 + cpu.tv_nsec;
        n_stamps++;
    }
    return s;
}

__attribute__((destructor)) static void steptimes_write(void) {
    const char *path = getenv("EMBER_STEP_TIMES");
    if (path && *path && n_stamps) { /* not the shell of a libtool wrapper */
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "steptimes: cannot write %s\n", path);
        } else {
            for (size_t i = 0; i < n_stamps; i++)
                fprintf(f, "%lld %lld\n", (long long)stamps[2 * i], (long long)stamps[2 * i + 1]);
            fclose(f);
        }
    }
    free(stamps);
    stamps = NULL;
}

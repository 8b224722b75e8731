/*
 * omp_regions.c — an LD_PRELOAD shim that counts a process's OpenMP parallel regions (GNU
 * OpenMP's GOMP_parallel and GOMP_parallel_loop_{static,dynamic,guided,runtime}) and times
 * them (issue 27: where a training step spends its time beyond its GEMM floor). At exit it
 * prints to stderr, per library that opened regions (found with dladdr from the caller's
 * address: libdnnl, the CPU plugin, its optimizer library, ...):
 *   regions    how many, and how many ran on more than one thread
 *   inside_ms  the calling thread's wall time from entering a region to leaving it
 *   wake_us    for regions on more than one thread, the mean time from the region's entry to
 *              the moment the first other thread ran the region's body: what waking an idle
 *              worker costs (with OMP_WAIT_POLICY=passive the workers sleep between regions)
 * and the process's wall time between its first region and its last, with the share outside
 * any region (the calling thread alone: small ops, dispatch, the allocator).
 *
 *   yes train_mlp_b128 | head -50 | LD_PRELOAD=bench/.libs/omp_regions.so \
 *       OMP_WAIT_POLICY=passive bench/.libs/train_step >/dev/null
 *
 * (train_step's first request runs one untimed step, which includes the GEMM autotuner's
 * measurements: divide by the number of steps, 1 + 10 per request for the MLP.) Regions
 * nested inside a region are counted as their own, and their time also lies inside the outer
 * one's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_LIBS 32

typedef struct {
    const char *name;
    uintptr_t base;
    uint64_t regions, multi;
    double inside_ms, wake_us_sum;
    uint64_t wakes;
} lib_stats;

static lib_stats L[MAX_LIBS];
static int n_libs;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static double first_ms = -1, last_ms, outside_ms, last_end_ms = -1;
static _Thread_local int depth;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static lib_stats *lib_of(void *caller) {
    Dl_info info;
    const char *name = "?";
    uintptr_t base = 0;
    if (dladdr(caller, &info) && info.dli_fname) {
        name = strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname;
        base = (uintptr_t)info.dli_fbase;
    }
    for (int i = 0; i < n_libs; i++)
        if (L[i].base == base) return &L[i];
    if (n_libs == MAX_LIBS) return &L[MAX_LIBS - 1];
    L[n_libs] = (lib_stats){.name = name, .base = base};
    return &L[n_libs++];
}

typedef struct {
    void (*fn)(void *);
    void *data;
    double t0;
    _Atomic double woke; /* when another thread first ran the body (0: none yet) */
} tramp;

static void body(void *arg) {
    tramp *t = arg;
    if (omp_get_thread_num() > 0) {
        double z = 0, now = now_ms();
        atomic_compare_exchange_strong(&t->woke, &z, now);
    }
    t->fn(t->data);
}

static void account(void *caller, tramp *t, double t1) {
    pthread_mutex_lock(&lock);
    lib_stats *s = lib_of(caller);
    s->regions++;
    s->inside_ms += t1 - t->t0;
    double w = atomic_load(&t->woke);
    if (w > 0) {
        s->multi++;
        s->wakes++;
        s->wake_us_sum += (w - t->t0) * 1e3;
    }
    if (depth == 0) {
        if (first_ms < 0) first_ms = t->t0;
        else if (last_end_ms >= 0 && t->t0 > last_end_ms) outside_ms += t->t0 - last_end_ms;
        last_end_ms = t1;
        last_ms = t1;
    }
    pthread_mutex_unlock(&lock);
}

#define REAL(name, type)                                   \
    static type real_##name;                               \
    if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

/* libgomp's entry points (GCC's ABI), wrapped here (exported whatever -fvisibility says; their
 * symbol version is libgomp's, GOMP_4.0, through bench/omp_regions.map, so the references of
 * libdnnl and the CPU plugin bind here). */
#define EXPORT __attribute__((visibility("default")))
EXPORT void GOMP_parallel(void (*fn)(void *), void *data, unsigned nt, unsigned flags);
#define LOOP_DECL(kind)                                                                      \
    EXPORT void GOMP_parallel_loop_##kind(void (*fn)(void *), void *data, unsigned nt, long start,  \
                                   long end, long incr, long chunk, unsigned flags);
LOOP_DECL(static)
LOOP_DECL(dynamic)
LOOP_DECL(guided)
LOOP_DECL(runtime)

typedef void (*par_fn)(void (*)(void *), void *, unsigned, unsigned);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned nt, unsigned flags) {
    REAL(GOMP_parallel, par_fn);
    tramp t = {.fn = fn, .data = data, .t0 = now_ms()};
    void *caller = __builtin_return_address(0);
    depth++;
    real_GOMP_parallel(body, &t, nt, flags);
    depth--;
    account(caller, &t, now_ms());
}

typedef void (*loop_fn)(void (*)(void *), void *, unsigned, long, long, long, long, unsigned);
#define LOOP(kind)                                                                           \
    void GOMP_parallel_loop_##kind(void (*fn)(void *), void *data, unsigned nt, long start,  \
                                   long end, long incr, long chunk, unsigned flags) {        \
        REAL(GOMP_parallel_loop_##kind, loop_fn);                                            \
        tramp t = {.fn = fn, .data = data, .t0 = now_ms()};                                  \
        void *caller = __builtin_return_address(0);                                          \
        depth++;                                                                             \
        real_GOMP_parallel_loop_##kind(body, &t, nt, start, end, incr, chunk, flags);        \
        depth--;                                                                             \
        account(caller, &t, now_ms());                                                       \
    }
LOOP(static)
LOOP(dynamic)
LOOP(guided)
LOOP(runtime)

__attribute__((destructor)) static void report(void) {
    uint64_t all = 0;
    for (int i = 0; i < n_libs; i++) all += L[i].regions;
    if (!all) return;
    fprintf(stderr, "omp_regions: %-28s %9s %9s %11s %9s\n", "library", "regions",
            ">1 thread", "inside_ms", "wake_us");
    for (int i = 0; i < n_libs; i++)
        fprintf(stderr, "omp_regions: %-28s %9llu %9llu %11.2f %9.1f\n", L[i].name,
                (unsigned long long)L[i].regions, (unsigned long long)L[i].multi,
                L[i].inside_ms, L[i].wakes ? L[i].wake_us_sum / (double)L[i].wakes : 0.0);
    double span = last_ms - first_ms;
    fprintf(stderr, "omp_regions: %llu regions; %.2f ms from the first to the end of the last, "
            "%.2f ms (%.1f%%) of it outside any region\n", (unsigned long long)all, span,
            outside_ms, span > 0 ? 100.0 * outside_ms / span : 0.0);
}

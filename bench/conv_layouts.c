/*
 * bench/conv_layouts.c — the CNN step's convolutions (batch 64: conv1 1 -> 32 on 28x28, conv2
 * 32 -> 64 on 14x14, 3x3, padding 1) as oneDNN primitives with their activations in a fixed
 * layout: oneDNN's choice (any), nchw, nhwc (channels-last), nChw8c (AVX2's blocking) and
 * nChw16c (AVX-512's), forward, backward-data and backward-weight, f32 and bf16, on N
 * threads and on 1. Weights are always oneDNN's choice. It decides which activation layout
 * Ember's convolutions should run on without reorders (docs/performance.md, "Design:
 * activation layouts for the convolutions").
 *
 * Every primitive is built first, then all are timed round-robin (2 warm-up calls each, then
 * ROUNDS rounds of one call each), so a loaded machine's slow minutes fall on every layout
 * alike; the best and the median wall time per call are printed, in ms, and the median CPU
 * time of the process per call (what a loaded machine's comparisons read). A layout for which
 * oneDNN has only a reference kernel (ref:any), or no kernel, is named and not timed.
 *
 *     bench/conv_layouts [ROUNDS]        # default 40; OMP_NUM_THREADS sets N
 */
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

#define MAX_JOBS 128
#define MAX_ROUNDS 1000

typedef struct {
    dnnl_primitive_t prim;
    int nargs, nt;
    dnnl_exec_arg_t args[4];
    char name[128];
    double *t, *c; /* (rounds) wall and CPU ms per call */
} job;

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double cpu_ms(void) { /* the process's CPU time: every thread's, OpenMP workers too */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A memory of md filled with small values (zero bytes for bf16 would time the same). */
static dnnl_memory_t mem_for(const dnnl_memory_desc_t *md) {
    dnnl_memory_t m = NULL;
    if (dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE) != dnnl_success) return NULL;
    void *p = NULL;
    dnnl_memory_get_data_handle(m, &p);
    size_t n = dnnl_memory_desc_get_size(md);
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i % 7 == 0 ? 0x3c : 0);
    return m;
}

enum { FWD, BWD_DATA, BWD_WEIGHT };

/* Builds the primitive of (conv C -> O on HxW, kind, activation tag, dt) into j; returns its
 * implementation's name in impl, or NULL when oneDNN has no kernel. j->prim stays NULL for a
 * reference kernel. */
static const char *build(job *j, int C, int H, int O, int kind, dnnl_format_tag_t tag,
                         dnnl_data_type_t dt) {
    dnnl_dims_t sd = {64, C, H, H}, dd = {64, O, H, H}, wd = {O, C, 3, 3}, bd = {O};
    dnnl_dims_t st = {1, 1}, pl = {1, 1}, dil = {0, 0};
    dnnl_memory_desc_t src, dst, w, b;
    dnnl_convolution_desc_t fd, bdsc;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    const char *impl = NULL;
    if (dnnl_memory_desc_init_by_tag(&src, 4, sd, dt, tag) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&dst, 4, dd, dt, tag) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&w, 4, wd, dt, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&b, 1, bd, dt, dnnl_x) != dnnl_success ||
        dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                   dnnl_convolution_direct, &src, &w, &b, &dst,
                                                   st, dil, pl, pl) != dnnl_success ||
        dnnl_primitive_desc_create(&fpd, &fd, NULL, engine, NULL) != dnnl_success)
        return NULL;
    dnnl_status_t s = dnnl_success;
    if (kind == FWD) {
        pd = fpd, fpd = NULL;
    } else if (kind == BWD_DATA) {
        s = dnnl_dilated_convolution_backward_data_desc_init(&bdsc, dnnl_convolution_direct,
                                                             &src, &w, &dst, st, dil, pl, pl);
        if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &bdsc, NULL, engine, fpd);
    } else {
        s = dnnl_dilated_convolution_backward_weights_desc_init(
            &bdsc, dnnl_convolution_direct, &src, &w, &b, &dst, st, dil, pl, pl);
        if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &bdsc, NULL, engine, fpd);
    }
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (s != dnnl_success || !pd) return NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    static const struct {
        int kind, arg;
        dnnl_query_t q;
        int index;
    } use[] = {{FWD, DNNL_ARG_SRC, dnnl_query_src_md, 0},
               {FWD, DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0},
               {FWD, DNNL_ARG_BIAS, dnnl_query_weights_md, 1},
               {FWD, DNNL_ARG_DST, dnnl_query_dst_md, 0},
               {BWD_DATA, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0},
               {BWD_DATA, DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0},
               {BWD_DATA, DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0},
               {BWD_WEIGHT, DNNL_ARG_SRC, dnnl_query_src_md, 0},
               {BWD_WEIGHT, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0},
               {BWD_WEIGHT, DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0},
               {BWD_WEIGHT, DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1}};
    bool ok = impl && strncmp(impl, "ref", 3) != 0;
    j->nargs = 0;
    for (size_t i = 0; ok && i < sizeof use / sizeof use[0]; i++) {
        if (use[i].kind != kind) continue;
        dnnl_memory_t m = mem_for(dnnl_primitive_desc_query_md(pd, use[i].q, use[i].index));
        if (!m) ok = false;
        else j->args[j->nargs++] = (dnnl_exec_arg_t){use[i].arg, m};
    }
    if (ok && dnnl_primitive_create(&j->prim, pd) != dnnl_success) ok = false;
    static char name[64];
    snprintf(name, sizeof name, "%s", impl ? impl : "?");
    dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        for (int i = 0; i < j->nargs; i++) dnnl_memory_destroy(j->args[i].memory);
        j->nargs = 0;
        j->prim = NULL;
    }
    return name;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "conv_layouts: ROUNDS must be 1..%d, not %s\n", MAX_ROUNDS, argv[1]);
        return 2;
    }
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "conv_layouts: no oneDNN CPU engine\n");
        return 1;
    }
    static const struct {
        const char *name;
        int C, H, O;
    } convs[] = {{"conv1 1->32", 1, 28, 32}, {"conv2 32->64", 32, 14, 64}};
    static const struct {
        const char *name;
        dnnl_format_tag_t tag;
    } tags[] = {{"any", dnnl_format_tag_any}, {"nchw", dnnl_nchw}, {"nhwc", dnnl_nhwc},
                {"nChw8c", dnnl_nChw8c}, {"nChw16c", dnnl_nChw16c}};
    static const char *kinds[] = {"fwd", "bwd-data", "bwd-weight"};
    static const struct {
        const char *name;
        dnnl_data_type_t dt;
    } dts[] = {{"f32", dnnl_f32}, {"bf16", dnnl_bf16}};
    int nmax = omp_get_max_threads(), nts[2] = {nmax, 1}, njobs = 0;
    static job jobs[MAX_JOBS];
    printf("conv_layouts: oneDNN %d.%d.%d; %d rounds, N = %d threads\n",
           dnnl_version()->major, dnnl_version()->minor, dnnl_version()->patch, rounds, nmax);
    for (size_t d = 0; d < 2; d++)
        for (int t = 0; t < (nmax > 1 ? 2 : 1); t++)
            for (size_t c = 0; c < 2; c++)
                for (int k = 0; k < 3; k++)
                    for (size_t g = 0; g < sizeof tags / sizeof tags[0]; g++) {
                        job *j = &jobs[njobs];
                        memset(j, 0, sizeof *j);
                        omp_set_num_threads(nts[t]);
                        const char *impl = build(j, convs[c].C, convs[c].H, convs[c].O, k,
                                                 tags[g].tag, dts[d].dt);
                        char name[128];
                        snprintf(name, sizeof name, "%-4s %2dt %-12s %-10s %-7s %s", dts[d].name,
                                 nts[t], convs[c].name, kinds[k], tags[g].name,
                                 impl ? impl : "(no kernel)");
                        if (!j->prim) {
                            printf("%s: not timed\n", name);
                            continue;
                        }
                        snprintf(j->name, sizeof j->name, "%s", name);
                        j->nt = nts[t];
                        j->t = malloc(sizeof(double) * (size_t)rounds);
                        j->c = malloc(sizeof(double) * (size_t)rounds);
                        if (!j->t || !j->c) {
                            fprintf(stderr, "conv_layouts: out of memory\n");
                            return 1;
                        }
                        if (++njobs == MAX_JOBS) goto timing;
                    }
timing:
    for (int i = 0; i < njobs; i++) {
        omp_set_num_threads(jobs[i].nt);
        for (int w = 0; w < 2; w++)
            dnnl_primitive_execute(jobs[i].prim, stream, jobs[i].nargs, jobs[i].args);
        dnnl_stream_wait(stream);
    }
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < njobs; i++) {
            omp_set_num_threads(jobs[i].nt);
            double t0 = now_ms(), c0 = cpu_ms();
            dnnl_primitive_execute(jobs[i].prim, stream, jobs[i].nargs, jobs[i].args);
            dnnl_stream_wait(stream);
            jobs[i].t[r] = now_ms() - t0;
            jobs[i].c[r] = cpu_ms() - c0;
        }
    printf("%-62s %9s %9s %9s\n", "dtype threads conv kind layout implementation", "best ms",
           "median ms", "cpu med");
    for (int i = 0; i < njobs; i++) {
        qsort(jobs[i].t, (size_t)rounds, sizeof(double), cmp);
        qsort(jobs[i].c, (size_t)rounds, sizeof(double), cmp);
        printf("%-62s %9.3f %9.3f %9.3f\n", jobs[i].name, jobs[i].t[0], jobs[i].t[rounds / 2],
               jobs[i].c[rounds / 2]);
        free(jobs[i].t);
        free(jobs[i].c);
        dnnl_primitive_destroy(jobs[i].prim);
        for (int a = 0; a < jobs[i].nargs; a++) dnnl_memory_destroy(jobs[i].args[a].memory);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
    return 0;
}

/*
 * bench/conv_impls.c — every non-reference oneDNN implementation of one convolution, each timed
 * alone (issue 27: which primitive a convolution of the CNN step should run). oneDNN picks the
 * first implementation its list has for a descriptor; this walks the list (the primitive-
 * descriptor iterator) and times each one on the same tensors.
 *
 *   bench/conv_impls [--cold] [--relu N] fwd|bwd-weight nhwc|any THREADS IC OC HW [K [MB]]
 *
 * A batch of MB (default 64) images of IC x HW x HW into OC channels, a K x K kernel (default
 * 3) with padding K/2, stride 1; activations nhwc (the layout Ember's channels-last tensors
 * hand oneDNN) or any (oneDNN's choice), weights always oneDNN's choice; THREADS OpenMP
 * threads. --relu N adds the first N of conv2d_relu's post-ops to a forward
 * (plugins/backend-cpu/cpu_nn_dnnl.c: relu with alpha 2^-149, again, then x * 1 + 0; N = 1..3),
 * --relu 0z one relu with alpha 0 instead (max(x, 0): not Ember's relu on NaN). --cold
 * writes 64 MiB before every call (not timed), so operands start out of the caches as in a
 * training step. Each implementation: 3 untimed calls, then 30 timed; prints the median CPU
 * ms of the process per call and the median wall ms.
 */
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

enum { CALLS = 30, COLD_BYTES = 64 << 20 };

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static volatile unsigned char *cold_buf;

static double clock_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void ck(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) {
        fprintf(stderr, "conv_impls: %s: oneDNN status %d\n", what, (int)s);
        exit(1);
    }
}

static void evict(void) {
    if (!cold_buf) return;
    for (size_t i = 0; i < COLD_BYTES; i += 64) cold_buf[i] = (unsigned char)(cold_buf[i] + 1);
}

/* A memory object for md, filled with values in [-0.5, 0.5). */
static dnnl_memory_t memory_for(const dnnl_memory_desc_t *md) {
    dnnl_memory_t m;
    ck(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE), "memory");
    void *p = NULL;
    ck(dnnl_memory_get_data_handle(m, &p), "memory handle");
    size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
    for (size_t i = 0; i < n; i++) ((float *)p)[i] = (float)((i * 2654435761u) % 1000u) / 1000.f - 0.5f;
    return m;
}

static void usage(void) {
    fprintf(stderr, "usage: bench/conv_impls [--cold] [--relu N] fwd|bwd-weight nhwc|any THREADS "
                    "IC OC HW [K [MB]]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int relu = 0;
    bool relu_zero = false;
    int a = 1;
    for (; a < argc; a++) {
        if (strcmp(argv[a], "--cold") == 0) {
            cold_buf = malloc(COLD_BYTES);
            if (!cold_buf) return 1;
            memset((void *)cold_buf, 0, COLD_BYTES);
        } else if (strcmp(argv[a], "--relu") == 0 && a + 1 < argc) {
            a++;
            relu_zero = strcmp(argv[a], "0z") == 0;
            relu = relu_zero ? 1 : atoi(argv[a]);
            if (relu < 0 || relu > 3) usage();
        } else {
            break;
        }
    }
    if (argc - a < 6) usage();
    bool fwd = strcmp(argv[a], "fwd") == 0;
    if (!fwd && strcmp(argv[a], "bwd-weight") != 0) usage();
    bool nhwc = strcmp(argv[a + 1], "nhwc") == 0;
    if (!nhwc && strcmp(argv[a + 1], "any") != 0) usage();
    int threads = atoi(argv[a + 2]);
    int64_t ic = atoi(argv[a + 3]), oc = atoi(argv[a + 4]), hw = atoi(argv[a + 5]);
    int64_t k = argc - a > 6 ? atoi(argv[a + 6]) : 3, mb = argc - a > 7 ? atoi(argv[a + 7]) : 64;
    if (threads < 1 || ic < 1 || oc < 1 || hw < 1 || k < 1 || mb < 1 || (relu && !fwd)) usage();
    omp_set_num_threads(threads);
    ck(dnnl_engine_create(&engine, dnnl_cpu, 0), "engine");
    ck(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "stream");

    dnnl_dims_t sd = {mb, ic, hw, hw}, wd = {oc, ic, k, k}, bd = {oc}, dd = {mb, oc, hw, hw};
    dnnl_dims_t strides = {1, 1}, pad = {k / 2, k / 2};
    dnnl_format_tag_t act = nhwc ? dnnl_nhwc : dnnl_format_tag_any;
    dnnl_memory_desc_t src, wei, bia, dst;
    ck(dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, act), "src md");
    ck(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, act), "dst md");
    ck(dnnl_memory_desc_init_by_tag(&wei, 4, wd, dnnl_f32, dnnl_format_tag_any), "weights md");
    ck(dnnl_memory_desc_init_by_tag(&bia, 1, bd, dnnl_f32, dnnl_x), "bias md");
    dnnl_convolution_desc_t fd, bwd;
    ck(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                          &src, &wei, &bia, &dst, strides, pad, pad),
       "forward desc");
    ck(dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &src, &wei,
                                                   &bia, &dst, strides, pad, pad),
       "backward-weight desc");
    dnnl_primitive_attr_t attr;
    ck(dnnl_primitive_attr_create(&attr), "attr");
    ck(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad");
    if (relu) {
        dnnl_post_ops_t po;
        ck(dnnl_post_ops_create(&po), "post-ops");
        for (int i = 0; i < relu && i < 2; i++)
            ck(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_relu, relu_zero ? 0.f : 0x1p-149f,
                                            0.f),
               "relu post-op");
        if (relu == 3) ck(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_linear, 1.f, 0.f), "linear");
        ck(dnnl_primitive_attr_set_post_ops(attr, po), "set post-ops");
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t hint = NULL;
    if (!fwd) ck(dnnl_primitive_desc_create(&hint, &fd, NULL, engine, NULL), "forward hint");
    dnnl_primitive_desc_iterator_t it;
    ck(dnnl_primitive_desc_iterator_create(&it, fwd ? (const void *)&fd : (const void *)&bwd,
                                           attr, engine, hint),
       "iterator");
    printf("conv_impls: %s %s, %d thread(s), %lld -> %lld channels, %lldx%lld, %lldx%lld kernel, "
           "batch %lld%s%s\n", fwd ? "forward" : "backward-weight", nhwc ? "nhwc" : "any", threads,
           (long long)ic, (long long)oc, (long long)hw, (long long)hw, (long long)k, (long long)k,
           (long long)mb, relu ? (relu_zero ? ", relu alpha 0 post-op" : ", conv2d_relu's post-ops") : "",
           cold_buf ? ", cold caches" : "");
    if (relu && !relu_zero) printf("  post-ops: the first %d of conv2d_relu's 3\n", relu);
    do {
        dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
        const char *impl = NULL;
        ck(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl), "impl");
        if (strncmp(impl, "ref", 3) == 0) {
            dnnl_primitive_desc_destroy(pd);
            continue;
        }
        dnnl_query_t q_w = fwd ? dnnl_query_weights_md : dnnl_query_diff_weights_md;
        dnnl_query_t q_d = fwd ? dnnl_query_dst_md : dnnl_query_diff_dst_md;
        dnnl_memory_t ms = memory_for(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0)),
                      mw = memory_for(dnnl_primitive_desc_query_md(pd, q_w, 0)),
                      mbias = memory_for(dnnl_primitive_desc_query_md(pd, q_w, 1)),
                      md = memory_for(dnnl_primitive_desc_query_md(pd, q_d, 0)),
                      msp = memory_for(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
        dnnl_exec_arg_t args[5] = {
            {DNNL_ARG_SRC, ms},
            {fwd ? DNNL_ARG_WEIGHTS : DNNL_ARG_DIFF_WEIGHTS, mw},
            {fwd ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS, mbias},
            {fwd ? DNNL_ARG_DST : DNNL_ARG_DIFF_DST, md},
            {DNNL_ARG_SCRATCHPAD, msp}};
        dnnl_primitive_t prim;
        ck(dnnl_primitive_create(&prim, pd), "primitive");
        double cpu[CALLS], wall[CALLS];
        for (int i = 0; i < 3 + CALLS; i++) {
            evict();
            double c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID), w0 = clock_ms(CLOCK_MONOTONIC);
            ck(dnnl_primitive_execute(prim, stream, 5, args), "execute");
            ck(dnnl_stream_wait(stream), "wait");
            if (i >= 3) {
                cpu[i - 3] = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
                wall[i - 3] = clock_ms(CLOCK_MONOTONIC) - w0;
            }
        }
        qsort(cpu, CALLS, sizeof *cpu, cmp_double);
        qsort(wall, CALLS, sizeof *wall, cmp_double);
        const dnnl_memory_desc_t *dm = dnnl_primitive_desc_query_md(pd, q_d, 0);
        printf("  %-26s cpu %8.4f ms   wall %8.4f ms   (dst %s)\n", impl,
               0.5 * (cpu[CALLS / 2 - 1] + cpu[CALLS / 2]),
               0.5 * (wall[CALLS / 2 - 1] + wall[CALLS / 2]),
               dm->format_desc.blocking.inner_nblks ? "blocked" : "plain strides");
        dnnl_primitive_destroy(prim);
        dnnl_memory_t all[5] = {ms, mw, mbias, md, msp};
        for (int i = 0; i < 5; i++) dnnl_memory_destroy(all[i]);
        dnnl_primitive_desc_destroy(pd);
    } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    if (hint) dnnl_primitive_desc_destroy(hint);
    dnnl_primitive_attr_destroy(attr);
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
    free((void *)cold_buf);
    return 0;
}

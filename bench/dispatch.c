/*
 * bench/dispatch.c — what one op call costs when the kernel does (almost) nothing.
 *
 * Three figures, each the median of 5 repeats of a timed loop (CLOCK_MONOTONIC):
 *   noop_call_out  em_op_call_out on a program-declared op "bench.noop" whose CPU f32 kernel
 *                  returns at once, into a preallocated output: the dispatch cost alone
 *                  (checks, kernel lookup, indirect call). The design target is < 100 ns.
 *   noop_call      em_op_call on the same op: inference, output allocation through the
 *                  caching allocator, dispatch, then em_tensor_release of the output.
 *   add_out_1elem  em_op_call_out on the standard op "add" (1-element f32 tensors, a
 *                  preallocated output): PyTorch's torch.add(a, b, out=c).
 *   add_1elem      the public em_add on two 1-element f32 tensors, then em_tensor_release.
 *   transpose_view the public em_transpose of a 2x2 f32 tensor (a view: no kernel), then
 *                  em_tensor_release.
 *   matmul_2x2     the public em_matmul of two 2x2 f32 matrices (a composite over bmm:
 *                  reshape and expand views, one GEMM), then em_tensor_release.
 * The figures are printed, never asserted.
 *
 *     bench/dispatch            # defaults
 *     bench/dispatch 2000000    # iterations per repeat for the no-op call_out loop
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ember/ember.h>

#define REPEATS 5

/* ---- the no-op op ---------------------------------------------------------------------------- */

/* Output 0 has input 0's shape and dtype. */
static em_status noop_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    (void)op, (void)attrs;
    out[0].dtype = em_tensor_dtype(in[0]);
    out[0].ndim = em_tensor_ndim(in[0]);
    memcpy(out[0].shape, em_tensor_shape(in[0]), sizeof(int64_t) * (size_t)out[0].ndim);
    return EM_OK;
}

static em_status noop_kernel(const em_kernel_ctx *ctx) {
    (void)ctx;
    return EM_OK;
}

static const em_op *declare_noop(void) {
    const em_op *op = NULL;
    em_op_schema s = {.struct_size = sizeof s, .name = "bench.noop", .n_inputs = 2,
                      .n_outputs = 1, .dispatch_arg = 0, .infer = noop_infer};
    if (em_op_declare(em_registry_program(), &s, &op) != EM_OK) return NULL;
    em_kernel_def k = {.struct_size = sizeof k, .op = "bench.noop", .device_type = "cpu",
                       .dtype = EM_F32, .fn = noop_kernel, .name = "bench_noop_f32"};
    if (em_kernel_register(em_registry_program(), &k, NULL) != EM_OK) return NULL;
    return op;
}

/* ---- timing ---------------------------------------------------------------------------------- */

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* What one benchmark runs: `iters` calls of its body; false on the first failure. */
typedef struct bench_args {
    const em_op *op;     /* bench.noop */
    const em_op *add;    /* the standard "add" */
    const em_tensor *in[2];
    em_tensor *out;
    const em_tensor *m[2]; /* 2x2 f32 matrices */
} bench_args;
typedef bool (*bench_fn)(const bench_args *a, long iters);

static bool run_call_out(const bench_args *a, long iters) {
    for (long i = 0; i < iters; i++)
        if (em_op_call_out(a->op, a->in, 2, NULL, &a->out, 1) != EM_OK) return false;
    return true;
}

static bool run_add_out(const bench_args *a, long iters) {
    for (long i = 0; i < iters; i++)
        if (em_op_call_out(a->add, a->in, 2, NULL, &a->out, 1) != EM_OK) return false;
    return true;
}

static bool run_call(const bench_args *a, long iters) {
    for (long i = 0; i < iters; i++) {
        em_tensor *y = NULL;
        if (em_op_call(a->op, a->in, 2, NULL, &y) != EM_OK) return false;
        em_tensor_release(y);
    }
    return true;
}

static bool run_add(const bench_args *a, long iters) {
    for (long i = 0; i < iters; i++) {
        em_tensor *y = em_add(a->in[0], a->in[1]);
        if (!y) return false;
        em_tensor_release(y);
    }
    return true;
}

static bool run_transpose(const bench_args *a, long iters) {
    for (long i = 0; i < iters; i++) {
        em_tensor *y = em_transpose(a->m[0], 0, 1);
        if (!y) return false;
        em_tensor_release(y);
    }
    return true;
}

static bool run_matmul(const bench_args *a, long iters) {
    for (long i = 0; i < iters; i++) {
        em_tensor *y = em_matmul(a->m[0], a->m[1]);
        if (!y) return false;
        em_tensor_release(y);
    }
    return true;
}

/* Median ns per call over REPEATS timed loops (after one warm-up loop); < 0 on failure. */
static double measure(bench_fn fn, const bench_args *a, long iters) {
    double per_call[REPEATS];
    if (!fn(a, iters / 10 + 1)) return -1;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now_ns();
        if (!fn(a, iters)) return -1;
        per_call[r] = (now_ns() - t0) / (double)iters;
    }
    qsort(per_call, REPEATS, sizeof per_call[0], cmp_double);
    return per_call[REPEATS / 2];
}

/* ---- report ---------------------------------------------------------------------------------- */

static void cpu_model(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        snprintf(buf, cap, "%s", colon + 2);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

static int fail(const char *what) {
    fprintf(stderr, "bench/dispatch: %s: %s\n", what, em_last_error());
    return 1;
}

static int run_all(long iters) {
    const em_op *op = declare_noop();
    if (!op) return fail("declaring bench.noop");
    const em_op *add = em_op_find("add");
    if (!add) return fail("finding op add");
    int64_t one[1] = {1};
    em_tensor *a = em_ones(1, one, EM_F32, em_cpu());
    em_tensor *b = em_ones(1, one, EM_F32, em_cpu());
    em_tensor *out = em_empty(1, one, EM_F32, em_cpu());
    int64_t two[2] = {2, 2};
    em_tensor *m0 = em_ones(2, two, EM_F32, em_cpu()), *m1 = em_ones(2, two, EM_F32, em_cpu());
    int rc = 0;
    if (!a || !b || !out || !m0 || !m1) {
        rc = fail("creating tensors");
    } else {
        bench_args args = {.op = op, .add = add, .in = {a, b}, .out = out, .m = {m0, m1}};
        struct { const char *name; bench_fn fn; long iters; } rows[] = {
            {"noop_call_out", run_call_out, iters},
            {"noop_call", run_call, iters / 4},
            {"add_out_1elem", run_add_out, iters / 4},
            {"add_1elem", run_add, iters / 4},
            {"transpose_view", run_transpose, iters / 4},
            {"matmul_2x2", run_matmul, iters / 20},
        };
        printf("%-16s %10s %10s\n", "name", "ns/call", "calls");
        for (size_t i = 0; i < sizeof rows / sizeof rows[0] && rc == 0; i++) {
            double ns = measure(rows[i].fn, &args, rows[i].iters);
            if (ns < 0) rc = fail(rows[i].name);
            else printf("%-16s %10.1f %10ld\n", rows[i].name, ns, rows[i].iters);
        }
    }
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(out);
    em_tensor_release(m0);
    em_tensor_release(m1);
    return rc;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? strtol(argv[1], NULL, 10) : 2000000;
    if (iters < 10) {
        fprintf(stderr, "usage: bench/dispatch [iterations >= 10]\n");
        return 2;
    }
    if (em_init() != EM_OK) return fail("em_init");
    char cpu[128];
    cpu_model(cpu, sizeof cpu);
    printf("ember %s — dispatch overhead (median of %d repeats)\n", em_version(), REPEATS);
    printf("cpu: %s, ember threads: %d\n", cpu, em_num_threads());
    int rc = run_all(iters);
    em_shutdown();
    return rc;
}

/*
 * bench/ddp.c — data-parallel training steps (ember/ddp.h on ember-mpi): run by bench/ddp.sh
 * as `mpirun -np 2 bench/ddp MODEL` and as one plain process `bench/ddp MODEL --plain`, each
 * rank with one thread and the same per-rank batch.
 *
 *   bench/ddp mlp|cnn [--plain] [--steps N] [--batch B] [--bucket-mib M]
 *
 * Prints one line per run: the median step time over N timed steps (after 3 warm-up steps),
 * the throughput in samples per second over all ranks, and under DDP the bucket figures of
 * rank 0's timed steps (em_ddp_bucket_get): the allreduce time of every bucket, from its
 * start to its completion, and how much of it lay before the end of backward (em_ddp_wait's
 * start) — the fraction hidden behind backward — and how long em_ddp_wait blocked. The
 * completion time is when the engine first saw it: ember-mpi's progress thread tests the
 * requests in flight while backward computes, so it is seen as it happens; with
 * EMBER_MPI_NO_PROGRESS_THREAD=1 only the post-accumulation hooks and the wait test them,
 * and completion is seen (and MPI progresses) only there. BENCH_DDP_TRACE=1 prints every
 * bucket of every timed step.
 *
 * MLP: 784-1024-1024-10 (1.9 M parameters); CNN: Conv2d(3, 32, 3)-ReLU-Conv2d(32, 64, 3)-
 * ReLU-MaxPool2d(2)-Flatten-Linear(64*14*14, 10) on 32x32 images (0.14 M parameters).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ember/ember.h>

static void die(const char *what) {
    fprintf(stderr, "bench/ddp: %s: %s\n", what, em_last_error());
    exit(1);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void add(em_module *seq, const char *cls, const char *k1, int64_t v1, const char *k2,
                int64_t v2, const char *k3, int64_t v3) {
    em_options *o = em_options_new();
    if (k1) em_options_set_int(o, k1, v1);
    if (k2) em_options_set_int(o, k2, v2);
    if (k3) em_options_set_int(o, k3, v3);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    if (!m || em_module_append_child(seq, m) != EM_OK) die(cls);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "mlp") && strcmp(argv[1], "cnn"))) {
        fprintf(stderr, "usage: bench/ddp mlp|cnn [--plain] [--steps N] [--batch B] "
                "[--bucket-mib M]\n");
        return 2;
    }
    bool mlp = !strcmp(argv[1], "mlp"), plain = false;
    int steps = 20, batch = 64;
    double bucket_mib = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--plain")) plain = true;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bucket-mib") && i + 1 < argc) bucket_mib = atof(argv[++i]);
        else {
            fprintf(stderr, "bench/ddp: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (em_init() != EM_OK) die("em_init");
    em_set_num_threads(1);
    em_comm *c = NULL;
    int rank = 0, size = 1;
    if (!plain) {
        if (!(c = em_comm_new("mpi", NULL))) die("comm_new");
        rank = em_comm_rank(c);
        size = em_comm_size(c);
    }
    em_seed(1);
    em_module *m = em_module_new("Sequential", NULL);
    if (mlp) {
        add(m, "Linear", "in_features", 784, "out_features", 1024, NULL, 0);
        add(m, "ReLU", NULL, 0, NULL, 0, NULL, 0);
        add(m, "Linear", "in_features", 1024, "out_features", 1024, NULL, 0);
        add(m, "ReLU", NULL, 0, NULL, 0, NULL, 0);
        add(m, "Linear", "in_features", 1024, "out_features", 10, NULL, 0);
    } else {
        add(m, "Conv2d", "in_channels", 3, "out_channels", 32, "kernel_size", 3);
        add(m, "ReLU", NULL, 0, NULL, 0, NULL, 0);
        add(m, "Conv2d", "in_channels", 32, "out_channels", 64, "kernel_size", 3);
        add(m, "ReLU", NULL, 0, NULL, 0, NULL, 0);
        add(m, "MaxPool2d", "kernel_size", 2, NULL, 0, NULL, 0);
        add(m, "Flatten", NULL, 0, NULL, 0, NULL, 0);
        add(m, "Linear", "in_features", 64 * 14 * 14, "out_features", 10, NULL, 0);
    }
    em_ddp_options dopt = {.struct_size = sizeof dopt,
                           .bucket_bytes = (int64_t)(bucket_mib * 1048576)};
    em_ddp *d = plain ? NULL : em_ddp_wrap(m, c, &dopt);
    if (!plain && !d) die("ddp_wrap");
    em_module *lossfn = em_module_new("CrossEntropyLoss", NULL);
    em_options *oo = em_options_new();
    em_options_set_float(oo, "lr", 0.01);
    em_dict *ps = em_module_named_parameters(m, true);
    em_optimizer *opt = em_optimizer_new("SGD", ps, oo);
    em_dict_free(ps);
    em_options_free(oo);
    if (!opt) die("optimizer");
    em_tensor *x = mlp ? em_empty(2, (int64_t[]){batch, 784}, EM_F32, em_cpu())
                       : em_empty(4, (int64_t[]){batch, 3, 32, 32}, EM_F32, em_cpu());
    em_tensor *y = em_zeros(1, (int64_t[]){batch}, EM_I64, em_cpu());
    em_generator *g = em_generator_new(7 + (uint64_t)rank);
    if (em_normal_(x, 0, 1, g) != EM_OK) die("data");
    em_generator_free(g);
    int warm = 3, total = warm + steps;
    double *t = calloc((size_t)total, sizeof *t);
    double comm_s = 0, hidden_s = 0, blocked_s = 0, backward_s = 0;
    for (int s = 0; s < total; s++) {
        if (c && em_comm_wait(em_comm_barrier(c)) != EM_OK) die("barrier");
        double t0 = now_s();
        em_scope_begin();
        em_tensor *out = d ? em_ddp_forward(d, x) : em_module_forward(m, x);
        if (!out || em_backward(em_module_forward_n(lossfn, (em_tensor *[]){out, y}, 2)) != EM_OK)
            die("step");
        if (d && em_ddp_wait(d) != EM_OK) die("ddp_wait");
        if (em_optimizer_step(opt) != EM_OK) die("optimizer step");
        em_optimizer_zero_grad(opt);
        em_scope_end();
        t[s] = now_s() - t0;
        if (d && s >= warm) {
            double wb = 0, blocked = 0;
            em_ddp_last_wait(d, &wb, &blocked);
            blocked_s += blocked;
            backward_s += wb;
            for (int i = 0; i < em_ddp_bucket_count(d); i++) {
                em_ddp_bucket_info bi = {.struct_size = sizeof bi};
                em_ddp_bucket_get(d, i, &bi);
                double end = bi.done_s < wb ? bi.done_s : wb;
                if (getenv("BENCH_DDP_TRACE") && rank == 0)
                    fprintf(stderr, "step %d bucket %d: %lld bytes, start %.2f ms, done %.2f ms, "
                            "backward end %.2f ms\n", s, i, (long long)bi.bytes,
                            bi.launch_s * 1e3, bi.done_s * 1e3, wb * 1e3);
                comm_s += bi.done_s - bi.launch_s;
                hidden_s += end > bi.launch_s ? end - bi.launch_s : 0;
            }
        }
    }
    qsort(t + warm, (size_t)steps, sizeof *t, cmp_d);
    double med = t[warm + steps / 2];
    if (rank == 0) {
        printf("%s %s ranks=%d batch/rank=%d params=%lld: step %.2f ms, %.0f samples/s", argv[1],
               plain ? "plain" : "ddp", size, batch, (long long)em_module_parameter_count(m, true),
               med * 1e3, size * batch / med);
        if (d)
            printf(", %d buckets, allreduce %.2f ms/step, %.0f%% hidden behind backward, "
                   "forward+backward %.2f ms/step, wait blocked %.2f ms/step",
                   em_ddp_bucket_count(d), comm_s / steps * 1e3,
                   comm_s > 0 ? 100 * hidden_s / comm_s : 0, backward_s / steps * 1e3,
                   blocked_s / steps * 1e3);
        printf("\n");
    }
    free(t);
    em_tensor_release(x);
    em_tensor_release(y);
    em_optimizer_free(opt);
    em_module_free(lossfn);
    em_ddp_free(d);
    em_module_free(m);
    em_comm_free(c);
    em_shutdown();
    return 0;
}

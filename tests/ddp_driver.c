/*
 * ddp_driver.c — the program tests/test_ddp.sh runs, under mpirun and alone:
 *
 *   ddp_driver comm                       collectives against plain loops (under mpirun)
 *   ddp_driver commerr                    an error inside MPI (a truncated broadcast)
 *   ddp_driver noinit                     em_init loads no MPI library (alone)
 *   ddp_driver train MODEL OUT [options]  data-parallel training (under mpirun): every rank
 *                                         writes OUT.rankR.safetensors, and fails unless
 *                                         every rank holds rank 0's bits
 *   ddp_driver single MODEL OUT --ranks N [options]
 *                                         the one-process reference on the ranks' batches
 *                                         concatenated in rank order (--per-slice: each
 *                                         rank's slice through the model on its own, as
 *                                         BatchNorm under data parallelism sees it)
 *   ddp_driver compare A B exact|close    weights bit for bit, or allclose(1e-5, 1e-6)
 *
 * train and single take several runs, one after the other in the same processes (one MPI
 * start for all): MODEL OUT [options] + MODEL OUT [options] + ...
 *
 * MODEL: mlp (Linear-ReLU-Linear), cnn (Conv2d-ReLU-Flatten-Linear), cnnbn (Conv2d-
 * BatchNorm2d-ReLU-Flatten-Linear). Options: --steps N (30), --batch B per rank (8),
 * --accum K (1: K micro-batches per step, the first K-1 under no_sync), --bucket-kib K,
 * --sync-bn, --timeout S, --stall R:STEP (rank R stops itself with SIGSTOP before that step),
 * --kill R:STEP (SIGKILL), --mismatch R (rank R builds a wider hidden layer), --unused (the
 * model holds a parameter no forward uses), --find-unused.
 *
 * Every rank seeds its initial weights differently (the wrap must broadcast rank 0's); the
 * data of step s is drawn from seed 1000 + s for the whole global batch, so the single
 * process sees exactly the ranks' batches. Failures print "rank R: message" and exit 1
 * without cleaning up (a stalled collective cannot be shut down).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ember/ember.h>

static int g_rank = -1;

static void die(const char *what) {
    fprintf(stderr, "ddp_driver rank %d: %s: %s\n", g_rank, what, em_last_error());
    fflush(stderr);
    _exit(1);
}

static void fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "ddp_driver rank %d: ", g_rank);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    _exit(1);
}

/* The bucket timings of the last em_ddp_wait (ember/ddp.h, what bench/ddp reports): buckets
 * start in order; each completes after it started and before the wait returned (its
 * completion time is the engine's, seen by the progress thread or a test: never later than
 * the wait that returned it). */
static void check_bucket_times(const em_ddp *d) {
    double begin = -1, blocked = -1, prev = 0;
    if (em_ddp_last_wait(d, &begin, &blocked) != EM_OK) die("ddp_last_wait");
    const double eps = 1e-6;
    for (int i = 0; i < em_ddp_bucket_count(d); i++) {
        em_ddp_bucket_info bi = {.struct_size = sizeof bi};
        if (em_ddp_bucket_get(d, i, &bi) != EM_OK) die("ddp_bucket_get");
        char what[160];
        snprintf(what, sizeof what, "bucket %d: started %.6f s, done %.6f s, wait %.6f + %.6f s",
                 i, bi.launch_s, bi.done_s, begin, blocked);
        if (!(bi.launch_s >= prev - eps && bi.done_s >= bi.launch_s - eps &&
              bi.done_s <= begin + blocked + eps))
            fail("%s%s: the bucket timings are out of order", what, "");
        prev = bi.launch_s;
    }
}

typedef struct opts {
    const char *model, *out;
    int steps, batch, accum, ranks;
    int64_t bucket_bytes;
    bool sync_bn, per_slice, unused, find_unused;
    double timeout;
    int stall_rank, stall_step, kill_rank, kill_step, mismatch_rank;
} opts;

static em_module *child(em_module *seq, const char *cls, const char *k1, int64_t v1,
                        const char *k2, int64_t v2, const char *k3, int64_t v3) {
    em_options *o = em_options_new();
    if (k1) em_options_set_int(o, k1, v1);
    if (k2) em_options_set_int(o, k2, v2);
    if (k3) em_options_set_int(o, k3, v3);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    if (!m || em_module_append_child(seq, m) != EM_OK) die("building the model");
    return m;
}

static em_module *build(const opts *o, bool wide) {
    em_module *seq = em_module_new("Sequential", NULL);
    if (!seq) die("Sequential");
    int hidden = wide ? 17 : 16;
    if (!strcmp(o->model, "mlp")) {
        child(seq, "Linear", "in_features", 32, "out_features", hidden, NULL, 0);
        child(seq, "ReLU", NULL, 0, NULL, 0, NULL, 0);
        child(seq, "Linear", "in_features", hidden, "out_features", 10, NULL, 0);
    } else {
        bool bn = !strcmp(o->model, "cnnbn");
        if (!bn && strcmp(o->model, "cnn")) fail("unknown model '%s'%s", o->model, "");
        child(seq, "Conv2d", "in_channels", 1, "out_channels", wide ? 5 : 4, "kernel_size", 3);
        if (bn) child(seq, "BatchNorm2d", "num_features", wide ? 5 : 4, NULL, 0, NULL, 0);
        child(seq, "ReLU", NULL, 0, NULL, 0, NULL, 0);
        child(seq, "Flatten", NULL, 0, NULL, 0, NULL, 0);
        child(seq, "Linear", "in_features", (wide ? 5 : 4) * 36, "out_features", 10, NULL, 0);
    }
    if (o->unused) {
        em_tensor *extra = em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu());
        if (em_module_add_parameter(seq, "extra", extra) != EM_OK) die("extra parameter");
        em_tensor_release(extra); /* the module holds it */
    }
    return seq;
}

/* The global batch of micro-step s: n samples. */
static void batch(const opts *o, int s, int64_t n, em_tensor **x, em_tensor **y) {
    em_generator *g = em_generator_new(1000 + (uint64_t)s);
    *x = !strcmp(o->model, "mlp") ? em_empty(2, (int64_t[]){n, 32}, EM_F32, em_cpu())
                                  : em_empty(4, (int64_t[]){n, 1, 8, 8}, EM_F32, em_cpu());
    em_tensor *u = em_empty(1, (int64_t[]){n}, EM_F32, em_cpu());
    if (em_normal_(*x, 0.5, 1.0, g) != EM_OK || em_uniform_(u, 0, 10, g) != EM_OK) die("data");
    *y = em_empty(1, (int64_t[]){n}, EM_I64, em_cpu());
    const float *uv = em_tensor_data(u);
    int64_t *yv = em_tensor_data(*y);
    for (int64_t i = 0; i < n; i++) yv[i] = (int64_t)floorf(uv[i]) % 10;
    em_generator_free(g);
}

static em_tensor *slice(const em_tensor *t, int64_t start, int64_t len) {
    return em_contiguous(em_narrow(t, 0, start, len));
}

static em_optimizer *sgd(em_module *m) {
    em_options *oo = em_options_new();
    em_options_set_float(oo, "lr", 0.05);
    em_options_set_float(oo, "momentum", 0.9);
    em_dict *ps = em_module_named_parameters(m, true);
    em_optimizer *opt = em_optimizer_new("SGD", ps, oo);
    em_dict_free(ps);
    em_options_free(oo);
    if (!opt) die("optimizer");
    return opt;
}

static void save(em_module *m, const char *path) {
    em_dict *sd = em_module_state_dict(m);
    if (!sd || em_save(sd, path, NULL, NULL) != EM_OK) die(path);
    em_dict_free(sd);
}

/* Every rank holds the bits of rank 0: the state dict's bytes of every rank, all-gathered,
 * compared entry by entry (every rank compares, so all fail together, naming the entry). */
static void check_ranks_agree(em_comm *c, em_module *m, const char *out) {
    int size = em_comm_size(c);
    em_dict *sd = em_module_state_dict(m);
    if (!sd) die("state_dict");
    size_t n = em_dict_len(sd);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const em_tensor *t = em_dict_value(sd, i);
        total += em_tensor_numel(t) * (int64_t)em_dtype_size(em_tensor_dtype(t));
    }
    em_scope_begin();
    em_tensor *mine = em_empty(1, (int64_t[]){total > 0 ? total : 1}, EM_U8, em_cpu());
    em_tensor *all = em_empty(1, (int64_t[]){(total > 0 ? total : 1) * size}, EM_U8, em_cpu());
    if (!mine || !all) die("check_ranks_agree");
    unsigned char *p = em_tensor_data(mine);
    for (size_t i = 0; i < n; i++) {
        em_tensor *t = em_contiguous(em_dict_value(sd, i));
        if (!t) die("contiguous");
        size_t b = (size_t)em_tensor_numel(t) * em_dtype_size(em_tensor_dtype(t));
        memcpy(p, em_tensor_data(t), b);
        p += b;
    }
    if (em_comm_wait(em_comm_allgather(c, all, mine)) != EM_OK) die("allgather of the weights");
    const unsigned char *base = em_tensor_data(all);
    for (int r = 1; r < size; r++) {
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            const em_tensor *t = em_dict_value(sd, i);
            size_t b = (size_t)em_tensor_numel(t) * em_dtype_size(em_tensor_dtype(t));
            if (memcmp(base + off, base + (size_t)r * (size_t)total + off, b) != 0) {
                char what[600];
                snprintf(what, sizeof what, "%s: rank %d's '%s'", out, r, em_dict_key(sd, i));
                fail("%s differs from rank 0's%s", what, "");
            }
            off += b;
        }
    }
    em_scope_end();
    em_dict_free(sd);
}

static em_tensor *loss_of(em_module *lossfn, em_tensor *out, em_tensor *y, double scale) {
    em_tensor *in[2] = {out, y};
    em_tensor *l = em_module_forward_n(lossfn, in, 2);
    if (!l) die("loss");
    return scale != 1.0 ? em_mul_scalar(l, scale) : l;
}

static int run_train(const opts *o) {
    em_comm_options co = {.struct_size = sizeof co, .timeout_s = o->timeout};
    em_comm *c = em_comm_new("mpi", &co);
    if (!c) die("comm_new");
    g_rank = em_comm_rank(c);
    int n = em_comm_size(c);
    em_seed(100 + (uint64_t)g_rank); /* different initial weights everywhere */
    em_module *m = build(o, g_rank == o->mismatch_rank);
    if (o->sync_bn && em_ddp_convert_sync_batchnorm(m, NULL) != EM_OK) die("sync batchnorm");
    em_ddp_options dopt = {.struct_size = sizeof dopt, .bucket_bytes = o->bucket_bytes,
                           .first_bucket_bytes = o->bucket_bytes,
                           .find_unused_parameters = o->find_unused};
    em_ddp *d = em_ddp_wrap(m, c, &dopt);
    if (!d) die("ddp_wrap");
    em_module *lossfn = em_module_new("CrossEntropyLoss", NULL);
    em_optimizer *opt = sgd(m);
    em_module_train(m, true);
    for (int step = 0; step < o->steps; step++) {
        if (g_rank == o->stall_rank && step == o->stall_step) raise(SIGSTOP);
        if (g_rank == o->kill_rank && step == o->kill_step) raise(SIGKILL);
        em_scope_begin();
        for (int k = 0; k < o->accum; k++) {
            em_tensor *x, *y;
            batch(o, step * o->accum + k, (int64_t)o->batch * n, &x, &y);
            em_tensor *xr = slice(x, (int64_t)g_rank * o->batch, o->batch);
            em_tensor *yr = slice(y, (int64_t)g_rank * o->batch, o->batch);
            bool last = k == o->accum - 1;
            if (!last && em_ddp_no_sync_begin(d) != EM_OK) die("no_sync");
            em_tensor *out = em_ddp_forward(d, xr);
            if (!out) die("forward");
            if (em_backward(loss_of(lossfn, out, yr, 1.0 / o->accum)) != EM_OK) die("backward");
            if (!last && em_ddp_no_sync_end(d) != EM_OK) die("no_sync");
            if (last && em_ddp_wait(d) != EM_OK) die("ddp_wait");
            if (last) check_bucket_times(d);
        }
        if (em_optimizer_step(opt) != EM_OK) die("step");
        em_optimizer_zero_grad(opt);
        em_scope_end();
    }
    if (em_ddp_broadcast_buffers(d) != EM_OK) die("broadcast_buffers");
    char path[4096];
    snprintf(path, sizeof path, "%s.rank%d.safetensors", o->out, g_rank);
    save(m, path);
    check_ranks_agree(c, m, o->out);
    em_optimizer_free(opt);
    em_module_free(lossfn);
    em_ddp_free(d);
    em_module_free(m);
    em_comm_free(c);
    return 0;
}

/* Copies of the buffers (running statistics) of m, to restore after the other slices. */
static void buffers_copy(em_module *m, em_dict *into, bool restore) {
    em_dict *sd = em_module_state_dict(m);
    em_dict *ps = em_module_named_parameters(m, false);
    em_grad_mode_push(EM_GRAD_DISABLED);
    for (size_t i = 0; i < em_dict_len(sd); i++) {
        const char *k = em_dict_key(sd, i);
        if (em_dict_has(ps, k)) continue;
        if (restore) {
            if (em_copy_(em_dict_value(sd, i), em_dict_get(into, k)) != EM_OK) die("restore");
        } else {
            em_tensor *cl = em_clone(em_dict_value(sd, i));
            if (!cl || em_dict_set(into, k, cl) != EM_OK) die("snapshot");
        }
    }
    em_grad_mode_pop();
    em_dict_free(sd);
    em_dict_free(ps);
}

static int run_single(const opts *o) {
    g_rank = 0;
    int n = o->ranks;
    em_seed(100);
    em_module *m = build(o, false);
    em_module *lossfn = em_module_new("CrossEntropyLoss", NULL);
    em_optimizer *opt = sgd(m);
    em_module_train(m, true);
    for (int step = 0; step < o->steps; step++) {
        em_scope_begin();
        for (int k = 0; k < o->accum; k++) {
            em_tensor *x, *y;
            batch(o, step * o->accum + k, (int64_t)o->batch * n, &x, &y);
            if (!o->per_slice) {
                em_tensor *out = em_module_forward(m, x);
                if (!out || em_backward(loss_of(lossfn, out, y, 1.0 / o->accum)) != EM_OK)
                    die("backward");
                continue;
            }
            em_dict *snap = em_dict_new();
            for (int r = 0; r < n; r++) {
                em_tensor *out = em_module_forward(m, slice(x, (int64_t)r * o->batch, o->batch));
                if (!out) die("forward");
                if (r == 0) buffers_copy(m, snap, false);
                em_tensor *l = loss_of(lossfn, out, slice(y, (int64_t)r * o->batch, o->batch),
                                       1.0 / (o->accum * n));
                if (em_backward(l) != EM_OK) die("backward");
            }
            buffers_copy(m, snap, true); /* the buffers follow rank 0's slice */
            em_dict_free(snap);
        }
        if (em_optimizer_step(opt) != EM_OK) die("step");
        em_optimizer_zero_grad(opt);
        em_scope_end();
    }
    save(m, o->out);
    em_optimizer_free(opt);
    em_module_free(lossfn);
    em_module_free(m);
    return 0;
}

static int run_compare(const char *a, const char *b, const char *how) {
    em_dict *da = NULL, *db = NULL;
    if (em_load(a, NULL, &da, NULL) != EM_OK || em_load(b, NULL, &db, NULL) != EM_OK)
        die("load");
    bool exact = !strcmp(how, "exact");
    if (em_dict_len(da) != em_dict_len(db)) fail("%s and %s hold different keys", a, b);
    double worst = 0;
    for (size_t i = 0; i < em_dict_len(da); i++) {
        const char *k = em_dict_key(da, i);
        em_tensor *ta = em_dict_value(da, i), *tb = em_dict_get(db, k);
        if (!tb || em_tensor_numel(ta) != em_tensor_numel(tb) ||
            em_tensor_dtype(ta) != em_tensor_dtype(tb))
            fail("'%s' differs in presence, size or dtype (%s)", k, b);
        size_t bytes = (size_t)em_tensor_numel(ta) * em_dtype_size(em_tensor_dtype(ta));
        if (exact || em_tensor_dtype(ta) != EM_F32) {
            if (memcmp(em_tensor_data(ta), em_tensor_data(tb), bytes) != 0)
                fail("'%s' is not bit for bit the same (%s)", k, b);
            continue;
        }
        const float *x = em_tensor_data(ta), *y = em_tensor_data(tb);
        for (int64_t j = 0; j < em_tensor_numel(ta); j++) {
            double diff = fabs((double)x[j] - (double)y[j]);
            if (diff > worst) worst = diff;
            if (!(diff <= 1e-6 + 1e-5 * fabs((double)y[j]))) {
                char msg[256];
                snprintf(msg, sizeof msg, "element %lld: %.9g vs %.9g", (long long)j, x[j], y[j]);
                fail("'%s' is not allclose(1e-5, 1e-6): %s", k, msg);
            }
        }
    }
    printf("%s and %s: %s (max abs diff %.3g)\n", a, b, exact ? "identical" : "allclose", worst);
    em_dict_free(da);
    em_dict_free(db);
    return 0;
}

/* Each collective against a plain loop over what every rank contributed. */
static int run_comm(void) {
    em_comm *c = em_comm_new("mpi", NULL);
    if (!c) die("comm_new");
    g_rank = em_comm_rank(c);
    int r = g_rank, n = em_comm_size(c);
    const int64_t k = 1000;
    em_scope_begin();
#define VAL(rank, i) ((float)((rank) + 1) * 0.5f + (float)(i) * 0.25f)
    em_tensor *t = em_empty(1, &k, EM_F32, em_cpu());
    float *tv = em_tensor_data(t);
    for (int64_t i = 0; i < k; i++) tv[i] = VAL(r, i);
    if (em_comm_wait(em_comm_allreduce(c, t, EM_REDUCE_SUM)) != EM_OK) die("allreduce");
    for (int64_t i = 0; i < k; i++) {
        float want = 0;
        for (int q = 0; q < n; q++) want += VAL(q, i);
        if (fabsf(tv[i] - want) > 1e-4f * fabsf(want)) fail("allreduce sum wrong%s%s", "", "");
    }
    for (int64_t i = 0; i < k; i++) tv[i] = VAL(r, i);
    if (em_comm_wait(em_comm_allreduce(c, t, EM_REDUCE_AVG)) != EM_OK) die("allreduce avg");
    for (int64_t i = 0; i < k; i++) {
        double want = 0;
        for (int q = 0; q < n; q++) want += VAL(q, i);
        if (fabs(tv[i] - want / n) > 1e-4 * fabs(want)) fail("allreduce avg wrong%s%s", "", "");
    }
    int root = n - 1;
    for (int64_t i = 0; i < k; i++) tv[i] = VAL(r, i);
    if (em_comm_wait(em_comm_broadcast(c, t, root)) != EM_OK) die("broadcast");
    for (int64_t i = 0; i < k; i++)
        if (tv[i] != VAL(root, i)) fail("broadcast wrong%s%s", "", "");
    em_tensor *in = em_empty(1, (int64_t[]){3}, EM_I64, em_cpu());
    em_tensor *all = em_empty(1, (int64_t[]){3 * n}, EM_I64, em_cpu());
    for (int i = 0; i < 3; i++) ((int64_t *)em_tensor_data(in))[i] = 10 * r + i;
    if (em_comm_wait(em_comm_allgather(c, all, in)) != EM_OK) die("allgather");
    for (int q = 0; q < n; q++)
        for (int i = 0; i < 3; i++)
            if (((int64_t *)em_tensor_data(all))[3 * q + i] != 10 * q + i)
                fail("allgather wrong%s%s", "", "");
    em_tensor *big = em_empty(1, (int64_t[]){4 * n}, EM_F64, em_cpu());
    em_tensor *part = em_empty(1, (int64_t[]){4}, EM_F64, em_cpu());
    for (int i = 0; i < 4 * n; i++) ((double *)em_tensor_data(big))[i] = r * 100.0 + i;
    if (em_comm_wait(em_comm_reduce_scatter(c, part, big, EM_REDUCE_SUM)) != EM_OK)
        die("reduce_scatter");
    for (int i = 0; i < 4; i++) {
        double want = 0;
        for (int q = 0; q < n; q++) want += q * 100.0 + (4 * r + i);
        if (((double *)em_tensor_data(part))[i] != want) fail("reduce_scatter wrong%s%s", "", "");
    }
    /* several in flight at once, waited in reverse order */
    em_tensor *a = em_full(1, (int64_t[]){5}, r + 1.0, EM_F32, em_cpu());
    em_tensor *b = em_full(1, (int64_t[]){7}, 2.0 * (r + 1), EM_F32, em_cpu());
    em_comm_work *wa = em_comm_allreduce(c, a, EM_REDUCE_SUM);
    em_comm_work *wb = em_comm_allreduce(c, b, EM_REDUCE_SUM);
    em_comm_work *wc = em_comm_barrier(c);
    if (em_comm_wait(wc) != EM_OK || em_comm_wait(wb) != EM_OK || em_comm_wait(wa) != EM_OK)
        die("several in flight");
    if (((float *)em_tensor_data(a))[4] != n * (n + 1) / 2.0f ||
        ((float *)em_tensor_data(b))[6] != (float)(n * (n + 1)))
        fail("concurrent allreduces wrong%s%s", "", "");
    /* errors name the collective and the rank; nothing was started on any rank */
    em_tensor *h = em_zeros(1, (int64_t[]){4}, EM_BF16, em_cpu());
    if (em_comm_allreduce(c, h, EM_REDUCE_SUM) || !strstr(em_last_error(), "allreduce on rank"))
        fail("bf16 allreduce: expected an error naming it, got '%s'%s", em_last_error(), "");
    em_tensor *i32 = em_zeros(1, (int64_t[]){4}, EM_I32, em_cpu());
    if (em_comm_allreduce(c, i32, EM_REDUCE_AVG) || !strstr(em_last_error(), "floating"))
        fail("int average: expected an error, got '%s'%s", em_last_error(), "");
    em_tensor *nc = em_transpose(em_zeros(2, (int64_t[]){3, 4}, EM_F32, em_cpu()), 0, 1);
    if (em_comm_broadcast(c, nc, 0) || !strstr(em_last_error(), "not contiguous"))
        fail("non-contiguous: expected an error, got '%s'%s", em_last_error(), "");
    if (em_comm_broadcast(c, t, n) || !strstr(em_last_error(), "root"))
        fail("bad root: expected an error, got '%s'%s", em_last_error(), "");
    if (em_comm_wait(em_comm_barrier(c)) != EM_OK) die("barrier");
    em_scope_end();
    printf("rank %d of %d: collectives ok\n", r, n);
    em_comm_free(c);
    return 0;
}

/* An error inside MPI: rank 0 broadcasts more elements than the others expect. The
 * receivers' error names the collective, its number, the rank and MPI's message. */
static int run_commerr(void) {
    em_comm_options co = {.struct_size = sizeof co, .timeout_s = 5};
    em_comm *c = em_comm_new("mpi", &co);
    if (!c) die("comm_new");
    g_rank = em_comm_rank(c);
    em_tensor *t = em_zeros(1, (int64_t[]){g_rank == 0 ? 64 : 8}, EM_F32, em_cpu());
    if (em_comm_wait(em_comm_broadcast(c, t, 0)) != EM_OK) die("broadcast");
    return 0;
}

/* em_init with ember-mpi registered maps no MPI library into the process. */
static int run_noinit(void) {
    if (!em_class_find(EM_COMM_KIND, "mpi")) die("the mpi class is not registered");
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "libmpi") || strstr(line, "libopen-pal") || strstr(line, "ember-mpi-engine"))
            fail("em_init mapped an MPI library: %s%s", line, "");
    if (f) fclose(f);
    printf("em_init: the mpi class is registered and no MPI library is loaded\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ddp_driver comm|noinit|train|single|compare ...\n");
        return 2;
    }
    if (em_init() != EM_OK) die("em_init");
    const char *mode = argv[1];
    int rc;
    if (!strcmp(mode, "compare") && argc == 5) {
        rc = run_compare(argv[2], argv[3], argv[4]);
    } else if (!strcmp(mode, "comm")) {
        rc = run_comm();
    } else if (!strcmp(mode, "commerr")) {
        rc = run_commerr();
    } else if (!strcmp(mode, "noinit")) {
        rc = run_noinit();
    } else if ((!strcmp(mode, "train") || !strcmp(mode, "single")) && argc >= 4) {
        rc = 0;
        for (int at = 2; at + 1 < argc && !rc;) { /* runs separated by "+" */
            opts o = {.model = argv[at], .out = argv[at + 1], .steps = 30, .batch = 8, .accum = 1,
                      .ranks = 1, .stall_rank = -1, .kill_rank = -1, .mismatch_rank = -1};
            int i = at + 2;
            for (; i < argc && strcmp(argv[i], "+") != 0; i++) {
                const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
                if (!strcmp(a, "--steps")) o.steps = atoi(v), i++;
                else if (!strcmp(a, "--batch")) o.batch = atoi(v), i++;
                else if (!strcmp(a, "--accum")) o.accum = atoi(v), i++;
                else if (!strcmp(a, "--ranks")) o.ranks = atoi(v), i++;
                else if (!strcmp(a, "--bucket-kib")) o.bucket_bytes = atoll(v) * 1024, i++;
                else if (!strcmp(a, "--timeout")) o.timeout = atof(v), i++;
                else if (!strcmp(a, "--mismatch")) o.mismatch_rank = atoi(v), i++;
                else if (!strcmp(a, "--stall"))
                    sscanf(v, "%d:%d", &o.stall_rank, &o.stall_step), i++;
                else if (!strcmp(a, "--kill"))
                    sscanf(v, "%d:%d", &o.kill_rank, &o.kill_step), i++;
                else if (!strcmp(a, "--sync-bn")) o.sync_bn = true;
                else if (!strcmp(a, "--per-slice")) o.per_slice = true;
                else if (!strcmp(a, "--unused")) o.unused = true;
                else if (!strcmp(a, "--find-unused")) o.find_unused = true;
                else fail("unknown option '%s'%s", a, "");
            }
            rc = !strcmp(mode, "train") ? run_train(&o) : run_single(&o);
            at = i + 1;
        }
    } else {
        fprintf(stderr, "ddp_driver: bad arguments\n");
        return 2;
    }
    if (em_shutdown_checked() != EM_OK) {
        fprintf(stderr, "ddp_driver rank %d: %s\n", g_rank, em_last_error());
        return 1;
    }
    return rc;
}

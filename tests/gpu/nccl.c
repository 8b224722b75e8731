/*
 * nccl.c — the GPU harness's nccl suite (tests/gpu/run.sh nccl): the "nccl" communicator
 * (ember-nccl.so) in a world of one process on one GPU (NCCL refuses two ranks on one GPU, so
 * nothing here has more than one rank):
 *
 *   nccl --device DEV
 *
 * On a CUDA device:
 * 1. em_comm_new("nccl"): rank 0 of 1, the class's name.
 * 2. Every collective on CUDA tensors of every dtype NCCL takes (f32 f64 f16 bf16 i32 i64 u8,
 *    bool moved only), each checked element by element on the host against the values it
 *    started from (with one rank the sum, the average, the broadcast, the gather and the
 *    scatter's block are the input): allreduce sum and average, broadcast, allgather,
 *    reduce_scatter, barrier; em_comm_test until done, then the wait.
 * 3. Stream order: with a side stream current, a 64M-float tensor is filled on it and
 *    all-reduced at once; the result must be the fill (the collective waited for the stream's
 *    work), and the time of the allreduce is printed (informational).
 * 4. Refusals through the core: a CPU tensor (EM_ERR_DEVICE, "CUDA devices only").
 * 5. Data-parallel: an MLP's gradients from one plain backward, then from em_ddp_wrap on the
 *    nccl communicator (its buckets all-reduced by NCCL): bitwise equal.
 * On the CPU (the rehearsal, tests/gpu/run.sh --device cpu): the class is registered and
 * em_comm_new("nccl") is refused for want of a CUDA device (or, where there is no
 * libnccl.so.2 either, for want of NCCL), naming it.
 * Prints a line per check; exit 0 when all hold, 1 otherwise.
 */
#include <ember/ember.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  [%s] ", ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok) failures++;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A CPU tensor of n elements: small integers (exact in every dtype), a pattern per seed. */
static em_tensor *pattern(int64_t n, em_dtype dt, int seed) {
    em_tensor *f = em_empty(1, &n, EM_F64, em_cpu());
    if (!f) return NULL;
    double *v = em_tensor_data(f);
    for (int64_t i = 0; i < n; i++)
        v[i] = dt == EM_BOOL ? (double)((i + seed) % 3 == 0)
               : dt == EM_U8 ? (double)((i * 7 + seed) % 251)
                             : (double)((i * 7 + seed) % 61) - 30.0;
    em_tensor *t = em_to_dtype(f, dt);
    em_tensor_release(f);
    return t;
}

/* Whether the device tensor d holds exactly the CPU tensor want's values. */
static bool same(const em_tensor *d, const em_tensor *want) {
    em_tensor *h = d ? em_to_device(d, em_cpu()) : NULL;
    bool ok = h && em_tensor_numel(h) == em_tensor_numel(want) &&
              em_tensor_dtype(h) == em_tensor_dtype(want) &&
              memcmp(em_tensor_data(h), em_tensor_data(want),
                     (size_t)em_tensor_numel(h) * em_dtype_size(em_tensor_dtype(h))) == 0;
    em_tensor_release(h);
    return ok;
}

static em_status wait_polling(em_comm_work *w) {
    bool done = false;
    while (w) {
        em_status st = em_comm_test(w, &done);
        if (st != EM_OK || done) break;
    }
    return em_comm_wait(w);
}

static void collectives(em_comm *c, em_device dev) {
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
    const int64_t n = 1000;
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
        em_dtype dt = dts[k];
        const char *dn = em_dtype_name(dt);
        em_tensor *want = pattern(n, dt, (int)k);
        em_tensor *x = want ? em_to_device(want, dev) : NULL;
        if (!x) {
            check(false, "%s: making the tensor: %s", dn, em_last_error());
            em_tensor_release(want);
            continue;
        }
        if (dt != EM_BOOL) {
            em_status st = wait_polling(em_comm_allreduce(c, x, EM_REDUCE_SUM));
            check(st == EM_OK && same(x, want), "allreduce sum %s (%lld): %s", dn, (long long)n,
                  st == EM_OK ? "the input (one rank)" : em_last_error());
        }
        if (em_dtype_is_floating(dt)) {
            em_status st = em_comm_wait(em_comm_allreduce(c, x, EM_REDUCE_AVG));
            check(st == EM_OK && same(x, want), "allreduce avg %s: %s", dn,
                  st == EM_OK ? "the input" : em_last_error());
        }
        em_status st = em_comm_wait(em_comm_broadcast(c, x, 0));
        check(st == EM_OK && same(x, want), "broadcast %s from rank 0: %s", dn,
              st == EM_OK ? "the input" : em_last_error());
        em_tensor *out = em_zeros(1, &n, dt, dev);
        st = out ? em_comm_wait(em_comm_allgather(c, out, x)) : em_last_status();
        check(st == EM_OK && same(out, want), "allgather %s: %s", dn,
              st == EM_OK ? "the input" : em_last_error());
        if (dt != EM_BOOL && out) {
            st = em_fill_(out, 0);
            if (st == EM_OK) st = em_comm_wait(em_comm_reduce_scatter(c, out, x, EM_REDUCE_SUM));
            check(st == EM_OK && same(out, want), "reduce_scatter %s: %s", dn,
                  st == EM_OK ? "the input" : em_last_error());
        }
        em_tensor_release(out);
        em_tensor_release(x);
        em_tensor_release(want);
    }
    em_status st = wait_polling(em_comm_barrier(c));
    check(st == EM_OK, "barrier: %s", st == EM_OK ? "completed" : em_last_error());
}

/* Fill on a side stream, allreduce at once: NCCL must see the fill. */
static void stream_order(em_comm *c, em_device dev) {
    em_stream *side = NULL;
    if (em_stream_create(dev, &side) != EM_OK || em_stream_set_current(dev, side) != EM_OK) {
        check(false, "side stream: %s", em_last_error());
        return;
    }
    int64_t n = (int64_t)64 << 20;
    em_tensor *x = em_zeros(1, &n, EM_F32, dev);
    em_status st = x ? em_device_synchronize(dev) : em_last_status();
    double t0 = now_s(), t1 = t0;
    if (st == EM_OK) st = em_fill_(x, 3.0);
    if (st == EM_OK) {
        t0 = now_s();
        st = em_comm_wait(em_comm_allreduce(c, x, EM_REDUCE_SUM));
        t1 = now_s();
    }
    int64_t bad = -1;
    if (st == EM_OK) {
        em_tensor *h = em_to_device(x, em_cpu());
        const float *v = h ? em_tensor_data(h) : NULL;
        bad = v ? 0 : n;
        for (int64_t i = 0; v && i < n; i++) bad += v[i] != 3.0f;
        em_tensor_release(h);
    }
    check(bad == 0, "allreduce of 64M f32 filled on a side stream just before it: %lld elements "
          "not 3%s%s", (long long)bad, st == EM_OK ? "" : ": ", st == EM_OK ? "" : em_last_error());
    if (st == EM_OK)
        printf("  (informational: that allreduce took %.3f ms from start to wait, with the fill "
               "before it on the stream)\n", (t1 - t0) * 1e3);
    em_tensor_release(x);
    em_stream_set_current(dev, NULL);
    em_stream_free(dev, side);
}

static void refusals(em_comm *c) {
    int64_t n = 4;
    em_tensor *x = em_zeros(1, &n, EM_F32, em_cpu());
    em_comm_work *w = x ? em_comm_allreduce(c, x, EM_REDUCE_SUM) : NULL;
    const char *m = em_last_error();
    check(!w && em_last_status() == EM_ERR_DEVICE && strstr(m, "CUDA devices only"),
          "a CPU tensor is refused: %s", m);
    em_comm_wait(w);
    em_tensor_release(x);
}

static em_module *layer(const char *cls, int64_t in, int64_t out) {
    em_options *o = em_options_new();
    if (!o) return NULL;
    if (in) em_options_set_int(o, "in_features", in);
    if (out) em_options_set_int(o, "out_features", out);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    return m;
}

/* The gradients of one backward of model on (x, y), as CPU copies in order. */
static em_status grads(em_module *model, em_ddp *d, em_tensor *x, em_tensor *y, em_tensor **out,
                       int n) {
    em_module *loss_fn = em_module_new("CrossEntropyLoss", NULL);
    if (!loss_fn) return em_last_status();
    em_scope_begin();
    em_tensor *o = d ? em_ddp_forward(d, x) : em_module_forward(model, x);
    em_tensor *loss = o ? em_module_forward_n(loss_fn, (em_tensor *[]){o, y}, 2) : NULL;
    em_status st = loss ? em_backward(loss) : em_last_status();
    if (st == EM_OK && d) st = em_ddp_wait(d);
    em_scope_end();
    em_module_free(loss_fn);
    em_dict *p = em_module_named_parameters(model, true);
    for (int i = 0; st == EM_OK && p && i < n && i < (int)em_dict_len(p); i++) {
        em_tensor *t = em_dict_value(p, (size_t)i);
        em_tensor *g = em_tensor_grad(t);
        out[i] = g ? em_to_device(g, em_cpu()) : NULL;
        if (!out[i]) st = EM_ERR_INVALID;
        if (em_tensor_set_grad(t, NULL) != EM_OK) st = em_last_status();
    }
    em_dict_free(p);
    return st;
}

static void ddp(em_comm *c, em_device dev) {
    em_module *m = em_module_new("Sequential", NULL);
    em_module *parts[3] = {layer("Linear", 32, 64), layer("ReLU", 0, 0), layer("Linear", 64, 10)};
    bool ok = m != NULL;
    for (int i = 0; i < 3; i++) {
        if (ok && parts[i] && em_module_append_child(m, parts[i]) == EM_OK) continue;
        ok = false;
        em_module_free(parts[i]);
    }
    em_tensor *xc = em_empty(2, (int64_t[]){16, 32}, EM_F32, em_cpu());
    int64_t nb = 16;
    em_tensor *yc = em_empty(1, &nb, EM_I64, em_cpu());
    if (xc && em_normal_(xc, 0, 1, NULL) != EM_OK) ok = false;
    if (yc) for (int i = 0; i < 16; i++) ((int64_t *)em_tensor_data(yc))[i] = i % 10;
    em_tensor *x = xc ? em_to_device(xc, dev) : NULL, *y = yc ? em_to_device(yc, dev) : NULL;
    ok = ok && x && y && em_module_to_device(m, dev) == EM_OK;
    em_tensor *plain[4] = {0}, *dp[4] = {0};
    em_ddp *d = NULL;
    em_status st = ok ? grads(m, NULL, x, y, plain, 4) : em_last_status();
    if (st == EM_OK) {
        d = em_ddp_wrap(m, c, NULL);
        st = d ? grads(m, d, x, y, dp, 4) : em_last_status();
    }
    bool eq = st == EM_OK;
    for (int i = 0; eq && i < 4; i++) eq = plain[i] && dp[i] && same(dp[i], plain[i]);
    check(eq, "em_ddp_wrap on nccl: an MLP's gradients after em_ddp_wait equal a plain "
          "backward's bitwise%s%s", st == EM_OK ? "" : ": ", st == EM_OK ? "" : em_last_error());
    for (int i = 0; i < 4; i++) {
        em_tensor_release(plain[i]);
        em_tensor_release(dp[i]);
    }
    em_ddp_free(d);
    em_tensor_release(x);
    em_tensor_release(y);
    em_tensor_release(xc);
    em_tensor_release(yc);
    em_module_free(m);
}

int main(int argc, char **argv) {
    const char *dev_name = argc == 3 && !strcmp(argv[1], "--device") ? argv[2] : NULL;
    if (!dev_name) {
        fprintf(stderr, "usage: nccl --device DEV\n");
        return 2;
    }
    if (em_init() != EM_OK) {
        fprintf(stderr, "nccl: em_init: %s\n", em_last_error());
        return 1;
    }
    em_device dev;
    if (em_device_parse(dev_name, &dev) != EM_OK) {
        fprintf(stderr, "nccl: --device %s: %s\n", dev_name, em_last_error());
        em_shutdown();
        return 2;
    }
    em_seed(0);
    printf("nccl suite on %s\n", dev_name);
    check(em_class_find(EM_COMM_KIND, "nccl") != NULL, "the nccl communicator class is registered");
    double t0 = now_s();
    em_comm *c = em_comm_new("nccl", NULL);
    double t_new = now_s() - t0;
    if (dev.type == em_cpu().type) {
        /* refused for want of a device, or before that for want of libnccl.so.2 (the
         * chroot check has no CUDA library at all) */
        const char *m = em_last_error();
        em_status st = em_last_status();
        check(!c && ((st == EM_ERR_DEVICE && strstr(m, "no CUDA device")) ||
                     (st == EM_ERR_PLUGIN && strstr(m, "cannot load NCCL"))),
              "without a CUDA device em_comm_new(\"nccl\") is refused: %s", c ? "(made)" : m);
        em_comm_free(c);
    } else if (!c) {
        check(false, "em_comm_new(\"nccl\"): %s", em_last_error());
    } else {
        check(em_comm_rank(c) == 0 && em_comm_size(c) == 1 &&
              !strcmp(em_comm_class_name(c), "nccl"),
              "em_comm_new(\"nccl\") in %.2f s: rank %d of %d, class %s", t_new, em_comm_rank(c),
              em_comm_size(c), em_comm_class_name(c));
        for (size_t i = 0; i < em_plugin_count(); i++) {
            em_plugin_info info;
            if (em_plugin_get(i, &info) == EM_OK && info.name && !strcmp(info.name, "ember-nccl"))
                printf("  ember-nccl: %s\n", em_plugin_describe(i) ? em_plugin_describe(i) : "");
        }
        collectives(c, dev);
        stream_order(c, dev);
        refusals(c);
        ddp(c, dev);
        em_comm_free(c);
    }
    if (em_shutdown_checked() != EM_OK) {
        check(false, "shutdown: %s", em_last_error());
    }
    printf("nccl: %s (%d failed)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}

/*
 * bench/attention.c — scaled_dot_product_attention on the CPU, forward and forward+backward,
 * the fused kernel against the same attention composed of ops (matmul, softmax, matmul: the
 * whole score matrix materialised), in milliseconds per call (median and best of 7 repeats,
 * CLOCK_MONOTONIC, after a warm-up call), float32, at the thread count EMBER_NUM_THREADS
 * gives. The shape is the 2-layer Transformer encoder of issue 25 (batch 32, 4 heads, seq 128,
 * head dim 64), causal and not. The figures are printed, never asserted.
 *
 *     bench/attention              # defaults
 *     bench/attention 8 4 256 64   # batch, heads, seq, head dim
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <ember/ember.h>

#define REPEATS 7

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The composed reference: softmax(q k^T scale + causal mask) v. */
static em_tensor *composed(em_tensor *q, em_tensor *k, em_tensor *v, bool causal,
                           const em_tensor *neg) {
    int64_t E = em_tensor_size(q, 3);
    em_tensor *s = em_mul_scalar(em_matmul(q, em_transpose(k, 2, 3)), 1 / sqrt((double)E));
    if (causal) s = em_add(s, neg);
    return em_matmul(em_softmax(s, -1), v);
}

static void run(const char *what, em_tensor **qkv, bool causal, bool fused, bool backward,
                const em_tensor *neg) {
    double t[REPEATS];
    for (int r = -1; r < REPEATS; r++) {
        em_scope_begin();
        double t0 = now_ms();
        em_tensor *y = fused ? em_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], NULL, 0,
                                                               causal, NULL, NULL, NULL)
                             : composed(qkv[0], qkv[1], qkv[2], causal, neg);
        if (!y || (backward && em_backward(em_sum(y, 0, NULL, false)) != EM_OK)) {
            fprintf(stderr, "%s: %s\n", what, em_last_error());
            exit(1);
        }
        if (r >= 0) t[r] = now_ms() - t0;
        em_scope_end();
        for (int i = 0; i < 3; i++) em_tensor_set_grad(qkv[i], NULL);
    }
    qsort(t, REPEATS, sizeof t[0], cmp);
    printf("%-44s %9.2f %9.2f\n", what, t[REPEATS / 2], t[0]);
}

int main(int argc, char **argv) {
    int64_t B = argc > 1 ? atoll(argv[1]) : 32, H = argc > 2 ? atoll(argv[2]) : 4,
            L = argc > 3 ? atoll(argv[3]) : 128, E = argc > 4 ? atoll(argv[4]) : 64;
    if (em_init() != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        return 1;
    }
    int64_t shape[4] = {B, H, L, E};
    em_tensor *qkv[3];
    for (int i = 0; i < 3; i++) {
        qkv[i] = em_empty(4, shape, EM_F32, em_cpu());
        if (!qkv[i] || em_normal_(qkv[i], 0, 1, NULL) != EM_OK ||
            em_requires_grad_(qkv[i], true) != EM_OK) {
            fprintf(stderr, "%s\n", em_last_error());
            return 1;
        }
    }
    /* -inf above the diagonal, for the composed causal rows. */
    em_tensor *neg = em_triu(em_full(2, (int64_t[]){L, L}, -INFINITY, EM_F32, em_cpu()), 1);
    printf("attention (%lld, %lld, %lld, %lld) float32, ms   median      best\n", (long long)B,
           (long long)H, (long long)L, (long long)E);
    for (int c = 0; c < 2; c++)
        for (int bw = 0; bw < 2; bw++)
            for (int f = 1; f >= 0; f--) {
                char what[96];
                snprintf(what, sizeof what, "%s%s, %s", c ? "causal" : "full",
                         bw ? " fwd+bwd" : " forward", f ? "fused" : "composed ops");
                run(what, qkv, c, f, bw, neg);
            }
    em_tensor_release(neg);
    for (int i = 0; i < 3; i++) em_tensor_release(qkv[i]);
    return em_shutdown_checked() == EM_OK ? 0 : 1;
}

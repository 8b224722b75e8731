/*
 * test_cuda_nn_index.c — the index arithmetic the CUDA pooling and convolution kernels compile
 * for the device (plugins/backend-cuda/cuda_nn_index.h, __host__ __device__ under nvcc, plain C
 * here), checked without a GPU: every range against brute force over small geometries, and the
 * backward ops' gathers, run here on the host in f64 with these ranges in the kernels' order,
 * bitwise against the CPU backend's scatter loops (what cuda_nn.cu claims for f32 and f64).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include <ember/ember.h>

#include "../plugins/backend-cuda/cuda_nn_index.h"
#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */
#include "common.h"

TestSuite(cuda_nn_index, .init = em_test_setup, .fini = em_test_teardown);

/* PyTorch's pooling output size (core/ops_nn.c's pool_out). */
static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
    int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (o - 1) * s >= in + p) o--;
    return o;
}

Test(cuda_nn_index, pool_outputs_of_is_every_window_holding_the_position) {
    for (int64_t len = 1; len <= 12; len++)
        for (int64_t k = 1; k <= 5; k++)
            for (int64_t s = 1; s <= 4; s++)
                for (int64_t p = 0; p <= k / 2; p++)
                    for (int c = 0; c < 2; c++) {
                        int64_t n = pool_out(len, k, s, p, 1, c);
                        if (n < 1) continue;
                        for (int64_t i = 0; i < len; i++) {
                            int64_t lo, hi, blo = -1, bhi = -2;
                            cnn_pool_outputs_of(i, k, s, p, n, &lo, &hi);
                            for (int64_t o = 0; o < n; o++)
                                if (o * s - p <= i && i < o * s - p + k) {
                                    if (blo < 0) blo = o;
                                    bhi = o;
                                }
                            if (blo < 0) /* held by none: the range must be empty */
                                cr_assert_gt(lo, hi, "len %lld k %lld s %lld p %lld i %lld",
                                             (long long)len, (long long)k, (long long)s,
                                             (long long)p, (long long)i);
                            else
                                cr_assert(lo == blo && hi == bhi,
                                          "len %lld k %lld s %lld p %lld i %lld: [%lld, %lld] "
                                          "!= [%lld, %lld]", (long long)len, (long long)k,
                                          (long long)s, (long long)p, (long long)i, (long long)lo,
                                          (long long)hi, (long long)blo, (long long)bhi);
                        }
                    }
}

Test(cuda_nn_index, adaptive_outputs_of_is_every_window_holding_the_position) {
    for (int64_t len = 1; len <= 24; len++)
        for (int64_t n = 1; n <= 24; n++)
            for (int64_t i = 0; i < len; i++) {
                int64_t lo, hi, blo = -1, bhi = -2;
                cnn_adaptive_outputs_of(i, len, n, &lo, &hi);
                for (int64_t o = 0; o < n; o++) {
                    /* the CPU's formula, written out (cpu_nn_loops.h) */
                    int64_t a = o * len / n, b = ((o + 1) * len + n - 1) / n;
                    cr_assert(a == cnn_adaptive_start(o, len, n) && b == cnn_adaptive_end(o, len, n));
                    if (a <= i && i < b) {
                        if (blo < 0) blo = o;
                        bhi = o;
                    }
                }
                cr_assert(blo >= 0, "every position is in some window");
                cr_assert(lo == blo && hi == bhi, "len %lld n %lld i %lld: [%lld, %lld] != [%lld, "
                          "%lld]", (long long)len, (long long)n, (long long)i, (long long)lo,
                          (long long)hi, (long long)blo, (long long)bhi);
            }
}

Test(cuda_nn_index, conv_output_of_and_max_window_are_the_forward_taps) {
    for (int64_t len = 1; len <= 10; len++)
        for (int64_t k = 1; k <= 4; k++)
            for (int64_t s = 1; s <= 3; s++)
                for (int64_t d = 1; d <= 3; d++)
                    for (int64_t p = 0; p <= 2; p++) {
                        int64_t n = (len + 2 * p - d * (k - 1) - 1) / s + 1;
                        if (len + 2 * p < d * (k - 1) + 1) continue;
                        /* conv: tap a of output o reads o*s - p + a*d */
                        for (int64_t i = 0; i < len; i++)
                            for (int64_t a = 0; a < k; a++) {
                                int64_t want = -1;
                                for (int64_t o = 0; o < n; o++)
                                    if (o * s - p + a * d == i) want = o;
                                cr_assert_eq(cnn_conv_output_of(i, a, s, p, d, n), want);
                            }
                        /* max pooling (padding at most half the kernel): the taps in range */
                        if (p > k / 2) continue;
                        int64_t m = pool_out(len, k, s, p, d, false);
                        for (int64_t o = 0; o < m; o++) {
                            int64_t st, en;
                            cnn_max_window(o, k, s, p, d, len, &st, &en);
                            bool in[16] = {false}, got[16] = {false};
                            for (int64_t a = 0; a < k; a++) {
                                int64_t t = o * s - p + a * d;
                                if (t >= 0 && t < len) in[t] = true;
                            }
                            for (int64_t t = st; t < en; t += d) {
                                cr_assert(t >= 0 && t < len);
                                got[t] = true;
                            }
                            cr_assert_arr_eq(in, got, sizeof in, "len %lld k %lld s %lld d %lld "
                                             "p %lld o %lld", (long long)len, (long long)k,
                                             (long long)s, (long long)d, (long long)p,
                                             (long long)o);
                        }
                    }
}

/* f64 (1, 1, H, W) of deterministic values. */
static em_tensor *plane(int64_t H, int64_t W, double scale) {
    double v[256];
    cr_assert_leq(H * W, 256);
    for (int64_t i = 0; i < H * W; i++) v[i] = scale * (double)((i * 7919) % 23 - 11) / 7.0;
    return em_from_data(v, 4, (const int64_t[]){1, 1, H, W}, EM_F64, em_cpu());
}

/* avg_pool2d_backward gathered as cuda_nn.cu's avg_pool_bwd_k does, against the CPU's. */
Test(cuda_nn_index, avg_pool_backward_gather_is_bitwise_the_cpus_scatter) {
    static const struct { int64_t H, W, k[2], s[2], p[2]; bool ceil, cip; } g[] = {
        {8, 7, {3, 2}, {2, 2}, {1, 1}, true, true},  {8, 7, {3, 2}, {2, 2}, {1, 1}, true, false},
        {5, 5, {3, 3}, {1, 1}, {1, 1}, false, false}, {9, 6, {4, 3}, {3, 1}, {2, 1}, true, true},
        {6, 6, {2, 2}, {2, 2}, {0, 0}, false, true},
    };
    for (size_t c = 0; c < sizeof g / sizeof *g; c++) {
        int64_t OH = pool_out(g[c].H, g[c].k[0], g[c].s[0], g[c].p[0], 1, g[c].ceil);
        int64_t OW = pool_out(g[c].W, g[c].k[1], g[c].s[1], g[c].p[1], 1, g[c].ceil);
        em_tensor *gy = plane(OH, OW, 1.0);
        const double *gyd = em_tensor_data(gy);
        em_tensor *gx = em_avg_pool2d_backward(gy, (const int64_t[]){g[c].H, g[c].W}, g[c].k,
                                               g[c].s, g[c].p, g[c].ceil, g[c].cip);
        cr_assert(gx, "%s", em_last_error());
        const double *cpu = em_tensor_data(gx);
        for (int64_t h = 0; h < g[c].H; h++)
            for (int64_t w = 0; w < g[c].W; w++) {
                int64_t oh0, oh1, ow0, ow1;
                cnn_pool_outputs_of(h, g[c].k[0], g[c].s[0], g[c].p[0], OH, &oh0, &oh1);
                cnn_pool_outputs_of(w, g[c].k[1], g[c].s[1], g[c].p[1], OW, &ow0, &ow1);
                double acc = 0;
                for (int64_t oh = oh0; oh <= oh1; oh++)
                    for (int64_t ow = ow0; ow <= ow1; ow++) {
                        int64_t hs, he, ws, we, ph, pw;
                        cr_assert(cnn_avg_window(oh, g[c].k[0], g[c].s[0], g[c].p[0], g[c].H, &hs,
                                                 &he, &ph) &&
                                  cnn_avg_window(ow, g[c].k[1], g[c].s[1], g[c].p[1], g[c].W, &ws,
                                                 &we, &pw));
                        double div = (double)(g[c].cip ? ph * pw : (he - hs) * (we - ws));
                        acc = acc + gyd[oh * OW + ow] / div;
                    }
                cr_assert(memcmp(&acc, &cpu[h * g[c].W + w], sizeof acc) == 0,
                          "case %zu (%lld, %lld): %.17g != the CPU's %.17g", c, (long long)h,
                          (long long)w, acc, cpu[h * g[c].W + w]);
            }
        em_tensor_release(gx);
        em_tensor_release(gy);
    }
}

/* adaptive_avg_pool2d_backward gathered as cuda_nn.cu's adaptive_bwd_k does. */
Test(cuda_nn_index, adaptive_backward_gather_is_bitwise_the_cpus_scatter) {
    static const int64_t g[][4] = {{5, 7, 2, 3}, {3, 5, 4, 7}, {7, 7, 3, 3}, {4, 9, 4, 2}};
    for (size_t c = 0; c < sizeof g / sizeof *g; c++) {
        int64_t H = g[c][0], W = g[c][1], OH = g[c][2], OW = g[c][3];
        em_tensor *gy = plane(OH, OW, 3.0);
        const double *gyd = em_tensor_data(gy);
        em_tensor *gx = em_adaptive_avg_pool2d_backward(gy, (const int64_t[]){H, W});
        cr_assert(gx, "%s", em_last_error());
        const double *cpu = em_tensor_data(gx);
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) {
                int64_t oh0, oh1, ow0, ow1;
                cnn_adaptive_outputs_of(h, H, OH, &oh0, &oh1);
                cnn_adaptive_outputs_of(w, W, OW, &ow0, &ow1);
                double acc = 0;
                for (int64_t oh = oh0; oh <= oh1; oh++) {
                    int64_t hn = cnn_adaptive_end(oh, H, OH) - cnn_adaptive_start(oh, H, OH);
                    for (int64_t ow = ow0; ow <= ow1; ow++) {
                        int64_t wn = cnn_adaptive_end(ow, W, OW) - cnn_adaptive_start(ow, W, OW);
                        acc = acc + gyd[oh * OW + ow] / (double)(hn * wn);
                    }
                }
                cr_assert(memcmp(&acc, &cpu[h * W + w], sizeof acc) == 0,
                          "case %zu (%lld, %lld): %.17g != the CPU's %.17g", c, (long long)h,
                          (long long)w, acc, cpu[h * W + w]);
            }
        em_tensor_release(gx);
        em_tensor_release(gy);
    }
}

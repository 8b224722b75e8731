/*
 * cuda_nn_index.h — the index arithmetic of the CUDA pooling and convolution kernels
 * (cuda_nn.cu), written once for host and device (CK_HD: __host__ __device__ under nvcc, plain
 * static inline C elsewhere) so that tests/test_cuda_nn_index.c checks it here, without a GPU,
 * against brute force and against the CPU kernels.
 *
 * The backward kernels gather where the CPU's loops scatter: each input element finds the
 * outputs whose window holds it. One dimension at a time; positions are int64.
 */
#ifndef EMBER_CUDA_NN_INDEX_H
#define EMBER_CUDA_NN_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "../common/scalar_math.h" /* CK_HD */

/* Pooling (avg_pool2d): the outputs o in [*lo, *hi] (empty when *lo > *hi) of n outputs whose
 * window [o*s - p, o*s - p + k) holds position i (0 <= i < the input size, p <= k / 2). */
CK_HD void cnn_pool_outputs_of(int64_t i, int64_t k, int64_t s, int64_t p, int64_t n, int64_t *lo,
                               int64_t *hi) {
    int64_t a = i + p - k + 1; /* o*s >= a */
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    *hi = (i + p) / s; /* o*s <= i + p */
    if (*hi > n - 1) *hi = n - 1;
}

/* Adaptive pooling: output o of n over size len reads [cnn_adaptive_start, cnn_adaptive_end). */
CK_HD int64_t cnn_adaptive_start(int64_t o, int64_t len, int64_t n) { return o * len / n; }
CK_HD int64_t cnn_adaptive_end(int64_t o, int64_t len, int64_t n) {
    return ((o + 1) * len + n - 1) / n;
}

/* The outputs o in [*lo, *hi] whose adaptive window holds position i (0 <= i < len, n >= 1):
 * start(o) <= i  <=>  o*len < (i+1)*n, and end(o) > i  <=>  (o+1)*len > i*n. */
CK_HD void cnn_adaptive_outputs_of(int64_t i, int64_t len, int64_t n, int64_t *lo, int64_t *hi) {
    *lo = i * n / len;
    *hi = ((i + 1) * n + len - 1) / len - 1;
    if (*hi > n - 1) *hi = n - 1;
}

/* avg_pool2d's window along one dimension for output o: [*start, *end) clipped to the input,
 * and the length PyTorch's divisor counts with count_include_pad (clipped to the padded input
 * only). False when the clipped window is empty. */
CK_HD bool cnn_avg_window(int64_t o, int64_t k, int64_t s, int64_t p, int64_t len, int64_t *start,
                          int64_t *end, int64_t *padded) {
    int64_t a = o * s - p, b = a + k;
    if (b > len + p) b = len + p;
    *padded = b - a;
    if (a < 0) a = 0;
    if (b > len) b = len;
    *start = a;
    *end = b;
    return a < b;
}

/* max_pool2d's window along one dimension for output o: taps start, start + d, ... < end, the
 * first at or after 0 (the CPU's loop). */
CK_HD void cnn_max_window(int64_t o, int64_t k, int64_t s, int64_t p, int64_t d, int64_t len,
                          int64_t *start, int64_t *end) {
    int64_t a = o * s - p, b = a + (k - 1) * d + 1;
    if (b > len) b = len;
    if (a < 0) a += (-a + d - 1) / d * d;
    *start = a;
    *end = b;
}

/* Convolution backward-data: the output position o (0 <= o < n) whose tap a (dilation d) reads
 * input position i, o*s - p + a*d == i; -1 when there is none. */
CK_HD int64_t cnn_conv_output_of(int64_t i, int64_t a, int64_t s, int64_t p, int64_t d, int64_t n) {
    int64_t u = i + p - a * d;
    if (u < 0 || u % s) return -1;
    return u / s < n ? u / s : -1;
}

#endif /* EMBER_CUDA_NN_INDEX_H */

/*
 * cpu_reduce.c — sum over any set of dims on the CPU.
 *
 * Floating inputs accumulate in double (f32, f16 and bf16 included), with eight independent
 * partial sums per run and pairwise combination for f64, so f32 sums of millions of elements
 * keep full f32 accuracy. int64 sums wrap on overflow, as in PyTorch.
 *
 * A full reduction of a long run is split into blocks summed in parallel and combined in
 * block order. Normally there is one block per thread; in deterministic mode
 * (em_set_deterministic) the blocks have a fixed size, so the result is bitwise identical
 * whatever the thread count.
 */
#include <string.h>

#include "cpu.h"

#define DET_BLOCK 16384

/* Sum of n elements of dtype dt at p with byte stride s, as double. */
static double run_sum_f(em_dtype dt, const char *p, int64_t s, int64_t n) {
    double acc[8] = {0};
    int64_t i = 0;
    switch (dt) {
    case EM_F32:
        if (s == 4) {
            const float *x = (const float *)p;
            for (; i + 8 <= n; i += 8)
                for (int j = 0; j < 8; j++) acc[j] += x[i + j];
        }
        for (; i < n; i++) acc[i & 7] += *(const float *)(p + i * s);
        break;
    case EM_F64:
        if (n > 1024 && s == 8) { /* pairwise: halves summed separately */
            int64_t h = (n / 2) & ~(int64_t)7;
            return run_sum_f(dt, p, s, h) + run_sum_f(dt, p + h * s, s, n - h);
        }
        for (; i < n; i++) acc[i & 7] += *(const double *)(p + i * s);
        break;
    case EM_F16:
        for (; i < n; i++) acc[i & 7] += cpu_h2f(*(const uint16_t *)(p + i * s));
        break;
    case EM_BF16:
        for (; i < n; i++) acc[i & 7] += cpu_b2f(*(const uint16_t *)(p + i * s));
        break;
    default:
        break;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static uint64_t run_sum_i(const char *p, int64_t s, int64_t n) {
    uint64_t acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (uint64_t) * (const int64_t *)(p + i * s);
    return acc;
}

static void store_sum(em_dtype dt, char *dst, double v, uint64_t iv) {
    switch (dt) {
    case EM_F32: *(float *)dst = (float)v; break;
    case EM_F64: *(double *)dst = v; break;
    case EM_F16: *(uint16_t *)dst = cpu_f2h((float)v); break;
    case EM_BF16: *(uint16_t *)dst = cpu_f2b((float)v); break;
    default: *(int64_t *)dst = (int64_t)iv; break;
    }
}

/* One long run reduced to one value, split into blocks across threads. */
static void full_sum(em_dtype dt, const char *p, int64_t s, int64_t n, char *dst) {
    int nt = em_num_threads();
    int64_t nblocks = em_deterministic() ? (n + DET_BLOCK - 1) / DET_BLOCK
                                         : (n >= 2 * CPU_GRAIN ? nt : 1);
    if (nblocks <= 1) {
        store_sum(dt, dst, dt == EM_I64 ? 0 : run_sum_f(dt, p, s, n),
                  dt == EM_I64 ? run_sum_i(p, s, n) : 0);
        return;
    }
    int64_t per = (n + nblocks - 1) / nblocks;
    double *part = em_host_alloc(sizeof(double) * (size_t)nblocks, 64);
    uint64_t *ipart = em_host_alloc(sizeof(uint64_t) * (size_t)nblocks, 64);
    if (!part || !ipart) { /* no scratch: sum in one pass (same value in non-deterministic mode) */
        em_host_free(part);
        em_host_free(ipart);
        store_sum(dt, dst, dt == EM_I64 ? 0 : run_sum_f(dt, p, s, n),
                  dt == EM_I64 ? run_sum_i(p, s, n) : 0);
        return;
    }
#pragma omp parallel for num_threads(nt) if (n >= 2 * CPU_GRAIN) schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t lo = b * per, len = cpu_min_i64(per, n - lo);
        part[b] = 0;
        ipart[b] = 0;
        if (len <= 0) continue;
        if (dt == EM_I64) ipart[b] = run_sum_i(p + lo * s, s, len);
        else part[b] = run_sum_f(dt, p + lo * s, s, len);
    }
    double v = 0;
    uint64_t iv = 0;
    for (int64_t b = 0; b < nblocks; b++) v += part[b], iv += ipart[b];
    store_sum(dt, dst, v, iv);
    em_host_free(part);
    em_host_free(ipart);
}

static em_status k_sum(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0], *y = &k->out[0];
    em_dtype dt = x->dtype;
    int64_t e = (int64_t)em_dtype_size(dt);
    bool red[EM_MAX_DIMS] = {false};
    for (int i = 0; i < k->attrs[0].n; i++) red[k->attrs[0].ints[i]] = true;
    /* Reduced dims (size > 1) in order, merged where contiguous with each other. */
    int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
    int nr = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!red[d] || x->shape[d] == 1) continue;
        int64_t sb = x->strides[d] * e;
        if (nr > 0 && red[d - 1] && rstride[nr - 1] == sb * x->shape[d]) {
            rshape[nr - 1] *= x->shape[d];
            rstride[nr - 1] = sb;
            continue;
        }
        rshape[nr] = x->shape[d];
        rstride[nr++] = sb;
    }
    if (nr == 0) rshape[0] = 1, rstride[0] = e, nr = 1;
    int64_t run = rshape[nr - 1], runs = 1;
    for (int i = 0; i < nr - 1; i++) runs *= rshape[i];
    if (x->numel == 0) run = 0, runs = 1;
    int64_t ye = (int64_t)em_dtype_size(y->dtype);
    if (y->numel == 1 && runs == 1) {
        full_sum(dt, x->data, rstride[nr - 1], run, y->data);
        return EM_OK;
    }
    int nt = em_num_threads();
#pragma omp parallel for num_threads(nt) if (x->numel >= CPU_GRAIN && y->numel > 1) schedule(static)
    for (int64_t o = 0; o < y->numel; o++) {
        /* Base of output element o in x (kept dims), and its address in y. */
        const char *base = x->data;
        char *dst = y->data;
        int64_t rem = o;
        for (int d = x->ndim - 1; d >= 0; d--) {
            int64_t i = rem % y->shape[d];
            rem /= y->shape[d];
            if (!red[d]) base += i * x->strides[d] * e;
            dst += i * y->strides[d] * ye;
        }
        double v = 0;
        uint64_t iv = 0;
        for (int64_t r = 0; r < runs; r++) {
            const char *p = base;
            int64_t rr = r;
            for (int i = nr - 2; i >= 0; i--) {
                p += (rr % rshape[i]) * rstride[i];
                rr /= rshape[i];
            }
            if (dt == EM_I64) iv += run_sum_i(p, rstride[nr - 1], run);
            else v += run_sum_f(dt, p, rstride[nr - 1], run);
        }
        store_sum(dt, dst, v, iv);
    }
    return EM_OK;
}

em_status cpu_register_reduce(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64};
    return cpu_register_kernels(r, "sum", dts, 5, k_sum, "cpu_sum");
}

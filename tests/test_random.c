/*
 * test_random.c — Philox 4x32-10 against Random123's known answers, the generator's state
 * semantics (seed, get/set, reserve, threads), and the fill ops (uniform, normal, bernoulli)
 * and randperm element by element against the stream definitions of ember/random.h,
 * recomputed here from the raw Philox words.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

static void setup(void) {
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
}

static void teardown(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

TestSuite(philox, .fini = teardown);
TestSuite(generator, .init = setup, .fini = teardown);
TestSuite(fill, .init = setup, .fini = teardown);

/* ---- Philox known answers ----------------------------------------------------------------- */

/* Random123 1.14, tests/kat_vectors, the three "philox4x32 10" lines: counter (4 words),
 * key (2 words), expected output (4 words). */
static const struct {
    uint32_t ctr[4], key[2], out[4];
} kat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

Test(philox, known_answers) {
    for (size_t k = 0; k < sizeof kat / sizeof kat[0]; k++) {
        uint32_t out[4];
        em_philox4x32_10(kat[k].ctr, kat[k].key, out);
        for (int j = 0; j < 4; j++)
            cr_expect_eq(out[j], kat[k].out[j], "vector %zu word %d: 0x%08x, want 0x%08x", k,
                         j, out[j], kat[k].out[j]);
    }
}

Test(philox, block_layout) {
    /* block b = counter {lo32(b), hi32(b), 0, 0}, key {lo32(seed), hi32(seed)} */
    uint64_t seed = 0x299f31d0a4093822ull, block = 0x85a308d3243f6a88ull;
    uint32_t got[4], want[4];
    em_philox_block(seed, block, got);
    const uint32_t ctr[4] = {0x243f6a88, 0x85a308d3, 0, 0}, key[2] = {0xa4093822, 0x299f31d0};
    em_philox4x32_10(ctr, key, want);
    cr_expect_arr_eq(got, want, sizeof got);
    em_philox_block(0, 0, got);
    cr_expect_arr_eq(got, kat[0].out, sizeof got, "block 0 of seed 0 is the all-zero vector");
}

/* ---- the reference stream, from the raw words --------------------------------------------- */

static void words(uint64_t seed, uint64_t block, uint32_t w[4]) {
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    em_philox4x32_10(ctr, key, w);
}

/* 4-per-block stream: the top 24 bits of word i % 4 of block o + i / 4, over 2^24. */
static double ref_u24(uint64_t seed, uint64_t off, uint64_t i) {
    uint32_t w[4];
    words(seed, off + i / 4, w);
    return (double)(w[i % 4] >> 8) / 16777216.0;
}

/* 2-per-block f64 stream: 27 + 26 bits of words 2j, 2j+1 over 2^53. */
static double ref_u53(uint64_t seed, uint64_t off, uint64_t i) {
    uint32_t w[4];
    words(seed, off + i / 2, w);
    int j = (int)(i % 2) * 2;
    return ((double)(w[j] >> 5) * 67108864.0 + (double)(w[j + 1] >> 6)) / 9007199254740992.0;
}

static double ref_z(uint64_t seed, uint64_t off, uint64_t i) {
    uint32_t w[4];
    words(seed, off + i / 2, w);
    int j = (int)(i % 2) * 2;
    double u1 = ((double)(w[j] >> 8) + 1.0) / 16777216.0;
    double u2 = (double)(w[j + 1] >> 8) / 16777216.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

Test(philox, header_helpers_match_definition) {
    for (uint64_t i = 0; i < 1000; i++) {
        cr_assert_eq((double)em_philox_uniform_f32(5, 11, i), ref_u24(5, 11, i));
        cr_assert_eq(em_philox_uniform_f64(5, 11, i), ref_u53(5, 11, i));
        cr_assert_eq(em_philox_normal(5, 11, i), ref_z(5, 11, i));
    }
}

/* Round a double to dt the way fills do: f64 as is, f32 once, f16/bf16 from the f32. */
static double round_to(em_dtype dt, double v) {
    float f = (float)v;
    switch (dt) {
    case EM_F64: return v;
    case EM_F32: return f;
    case EM_F16: return em_f16_to_f32(em_f32_to_f16(f));
    case EM_BF16: return em_bf16_to_f32(em_f32_to_bf16(f));
    default: return NAN;
    }
}

static double ref_uniform(em_dtype dt, em_rng_state s, uint64_t i, double lo, double hi) {
    double u = dt == EM_F64 ? ref_u53(s.seed, s.offset, i) : ref_u24(s.seed, s.offset, i);
    return round_to(dt, lo + u * (hi - lo));
}

static double ref_normal(em_dtype dt, em_rng_state s, uint64_t i, double mean, double std) {
    return round_to(dt, mean + std * ref_z(s.seed, s.offset, i));
}

static double ref_bernoulli(em_rng_state s, uint64_t i, double p) {
    return ref_u24(s.seed, s.offset, i) < p ? 1.0 : 0.0;
}

/* Element i (C order) of t, through its strides. */
static double elem(const em_tensor *t, int64_t i) {
    int nd = em_tensor_ndim(t);
    const int64_t *shape = em_tensor_shape(t), *strides = em_tensor_strides(t);
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (i % shape[d]) * strides[d];
        i /= shape[d];
    }
    return em_dtype_load(em_tensor_dtype(t), em_tensor_data(t), off);
}

static uint64_t ceil_div(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}

/* ---- generators --------------------------------------------------------------------------- */

Test(generator, new_get_set_reserve) {
    em_generator *g = em_generator_new(1234);
    cr_assert_not_null(g);
    em_rng_state s = em_generator_get_state(g);
    cr_expect_eq(s.seed, 1234);
    cr_expect_eq(s.offset, 0);

    s = em_generator_reserve(g, 5);
    cr_expect(s.seed == 1234 && s.offset == 0, "reserve returns the state before");
    s = em_generator_reserve(g, 3);
    cr_expect(s.seed == 1234 && s.offset == 5);
    s = em_generator_reserve(g, 0);
    cr_expect_eq(s.offset, 8);
    cr_expect_eq(em_generator_get_state(g).offset, 8, "reserving 0 blocks moves nothing");

    em_generator_set_state(g, (em_rng_state){.seed = 99, .offset = 1000});
    s = em_generator_get_state(g);
    cr_expect(s.seed == 99 && s.offset == 1000);
    s = em_generator_reserve(g, UINT64_C(1) << 40);
    cr_expect_eq(s.offset, 1000);
    cr_expect_eq(em_generator_get_state(g).offset, 1000 + (UINT64_C(1) << 40));
    em_generator_free(g);
    em_generator_free(NULL);
}

Test(generator, default_generator_and_seed) {
    em_generator *d = em_default_generator();
    cr_assert_not_null(d);
    cr_expect_eq(em_default_generator(), d);
    em_seed(42);
    em_rng_state s = em_generator_get_state(NULL);
    cr_expect(s.seed == 42 && s.offset == 0);
    em_generator_reserve(NULL, 7);
    cr_expect_eq(em_generator_get_state(d).offset, 7, "NULL is the default generator");
    em_generator_reserve(d, 1);
    cr_expect_eq(em_generator_get_state(NULL).offset, 8);
    em_seed(42);
    cr_expect_eq(em_generator_get_state(NULL).offset, 0, "em_seed resets the offset");
    em_generator_set_state(NULL, (em_rng_state){3, 4});
    cr_expect(em_generator_get_state(d).seed == 3 && em_generator_get_state(d).offset == 4);
    /* an explicit generator is independent of the default */
    em_generator *g = em_generator_new(3);
    cr_assert_not_null(g);
    em_generator_reserve(g, 100);
    cr_expect_eq(em_generator_get_state(NULL).offset, 4);
    em_generator_free(g);
    /* freeing the default generator is refused (a no-op) */
    em_generator_free(d);
    em_seed(5);
    cr_expect_eq(em_generator_get_state(NULL).seed, 5);
}

Test(generator, starts_at_seed_zero) {
    em_rng_state s = em_generator_get_state(NULL);
    if (getenv("EMBER_SEED") == NULL)
        cr_expect(s.seed == 0 && s.offset == 0, "(%llu, %llu)", (unsigned long long)s.seed,
                  (unsigned long long)s.offset);
}

/* Criterion runs each test in its own process, so the environment changes stay here. */
Test(generator_env, ember_seed_from_environment) {
    cr_assert_eq(setenv("EMBER_SEED", "1234567890123", 1), 0);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    em_rng_state s = em_generator_get_state(NULL);
    cr_expect(s.seed == UINT64_C(1234567890123) && s.offset == 0);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());

    cr_assert_eq(setenv("EMBER_SEED", "0xffffffffffffffff", 1), 0);
    cr_assert_eq(em_init(), EM_OK);
    cr_expect_eq(em_generator_get_state(NULL).seed, UINT64_MAX);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());

    cr_assert_eq(setenv("EMBER_SEED", "12abc", 1), 0); /* malformed: warned, seed 0 */
    cr_assert_eq(em_init(), EM_OK);
    cr_expect_eq(em_generator_get_state(NULL).seed, 0);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    unsetenv("EMBER_SEED");
}

#define RES_THREADS 8
#define RES_PER_THREAD 20000

typedef struct reserve_job {
    em_generator *g;
    pthread_barrier_t *start; /* all threads begin together, to collide as often as can be */
    uint32_t rng;
    uint64_t offset[RES_PER_THREAD], blocks[RES_PER_THREAD];
} reserve_job;

static void *reserve_worker(void *arg) {
    reserve_job *job = arg;
    pthread_barrier_wait(job->start);
    for (int k = 0; k < RES_PER_THREAD; k++) {
        job->rng = job->rng * 1664525u + 1013904223u;
        uint64_t n = 1 + (job->rng >> 28); /* 1..16 */
        em_rng_state s = em_generator_reserve(job->g, n);
        job->offset[k] = s.offset;
        job->blocks[k] = n;
    }
    return NULL;
}

static int cmp_range(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Concurrent reserves hand out disjoint ranges that tile [start, start + total). */
static void check_concurrent_reserve(em_generator *g) {
    em_generator_set_state(g, (em_rng_state){.seed = 77, .offset = 500});
    static reserve_job jobs[RES_THREADS];
    pthread_t th[RES_THREADS];
    pthread_barrier_t start;
    cr_assert_eq(pthread_barrier_init(&start, NULL, RES_THREADS), 0);
    for (int t = 0; t < RES_THREADS; t++) {
        jobs[t].g = g;
        jobs[t].start = &start;
        jobs[t].rng = 12345u + (uint32_t)t * 7919u;
        cr_assert_eq(pthread_create(&th[t], NULL, reserve_worker, &jobs[t]), 0);
    }
    for (int t = 0; t < RES_THREADS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    size_t n = (size_t)RES_THREADS * RES_PER_THREAD;
    uint64_t(*r)[2] = malloc(n * sizeof *r);
    cr_assert_not_null(r);
    uint64_t total = 0;
    for (int t = 0; t < RES_THREADS; t++)
        for (int k = 0; k < RES_PER_THREAD; k++) {
            size_t m = (size_t)t * RES_PER_THREAD + (size_t)k;
            r[m][0] = jobs[t].offset[k];
            r[m][1] = jobs[t].blocks[k];
            total += jobs[t].blocks[k];
        }
    qsort(r, n, sizeof *r, cmp_range);
    uint64_t next = 500;
    for (size_t m = 0; m < n; m++) {
        cr_assert_eq(r[m][0], next, "range %zu starts at %llu, want %llu", m,
                     (unsigned long long)r[m][0], (unsigned long long)next);
        next += r[m][1];
    }
    free(r);
    em_rng_state s = em_generator_get_state(g);
    cr_expect_eq(s.offset, 500 + total);
    cr_expect_eq(s.seed, 77);
}

Test(generator, concurrent_reserve_is_disjoint) {
    em_generator *g = em_generator_new(0);
    cr_assert_not_null(g);
    check_concurrent_reserve(g);
    em_generator_free(g);
    check_concurrent_reserve(NULL);
}

/* ---- fills -------------------------------------------------------------------------------- */

static const em_dtype float_dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16};

static em_tensor *new_tensor(int ndim, const int64_t *shape, em_dtype dt) {
    em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
    cr_assert_not_null(t, "em_empty: %s", em_last_error());
    return t;
}

/* A [rows, cols] tensor's transpose: a non-contiguous [cols, rows] view. `base` receives the
 * underlying tensor (released by the caller). */
static em_tensor *transposed(int64_t rows, int64_t cols, em_dtype dt, em_tensor **base) {
    *base = new_tensor(2, (int64_t[]){rows, cols}, dt);
    em_tensor *t = em_transpose(*base, 0, 1);
    cr_assert_not_null(t, "em_transpose: %s", em_last_error());
    cr_assert_not(em_tensor_is_contiguous(t));
    return t;
}

static void check_uniform(em_tensor *t, em_generator *g, double lo, double hi) {
    em_dtype dt = em_tensor_dtype(t);
    int64_t n = em_tensor_numel(t);
    em_rng_state s = em_generator_get_state(g);
    cr_assert_eq(em_uniform_(t, lo, hi, g), EM_OK, "uniform %s: %s", em_dtype_name(dt),
                 em_last_error());
    for (int64_t i = 0; i < n; i++) {
        double want = ref_uniform(dt, s, (uint64_t)i, lo, hi);
        cr_assert_eq(elem(t, i), want, "uniform %s element %lld: %a, want %a",
                     em_dtype_name(dt), (long long)i, elem(t, i), want);
    }
    uint64_t per = dt == EM_F64 ? 2 : 4;
    em_rng_state after = em_generator_get_state(g);
    cr_expect_eq(after.seed, s.seed);
    cr_expect_eq(after.offset, s.offset + ceil_div((uint64_t)n, per), "uniform %s offset",
                 em_dtype_name(dt));
}

static void check_normal(em_tensor *t, em_generator *g, double mean, double std) {
    em_dtype dt = em_tensor_dtype(t);
    int64_t n = em_tensor_numel(t);
    em_rng_state s = em_generator_get_state(g);
    cr_assert_eq(em_normal_(t, mean, std, g), EM_OK, "normal %s: %s", em_dtype_name(dt),
                 em_last_error());
    for (int64_t i = 0; i < n; i++) {
        double want = ref_normal(dt, s, (uint64_t)i, mean, std);
        cr_assert_eq(elem(t, i), want, "normal %s element %lld: %a, want %a",
                     em_dtype_name(dt), (long long)i, elem(t, i), want);
    }
    cr_expect_eq(em_generator_get_state(g).offset, s.offset + ceil_div((uint64_t)n, 2),
                 "normal %s offset", em_dtype_name(dt));
}

static void check_bernoulli(em_tensor *t, em_generator *g, double p) {
    em_dtype dt = em_tensor_dtype(t);
    int64_t n = em_tensor_numel(t);
    em_rng_state s = em_generator_get_state(g);
    cr_assert_eq(em_bernoulli_(t, p, g), EM_OK, "bernoulli %s: %s", em_dtype_name(dt),
                 em_last_error());
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(elem(t, i), ref_bernoulli(s, (uint64_t)i, p),
                     "bernoulli %s element %lld", em_dtype_name(dt), (long long)i);
    cr_expect_eq(em_generator_get_state(g).offset, s.offset + ceil_div((uint64_t)n, 4),
                 "bernoulli %s offset", em_dtype_name(dt));
}

Test(fill, uniform_matches_definition) {
    em_seed(2024);
    for (size_t k = 0; k < 4; k++) {
        em_dtype dt = float_dtypes[k];
        for (int64_t n = 0; n <= 9; n++) { /* every remainder mod 4, and empty */
            em_tensor *t = new_tensor(1, (int64_t[]){n}, dt);
            check_uniform(t, NULL, -1.5, 2.5);
            em_tensor_release(t);
        }
        em_tensor *base, *t = transposed(5, 7, dt, &base);
        check_uniform(t, NULL, 0.0, 1.0);
        em_tensor_release(t);
        em_tensor_release(base);
        t = new_tensor(3, (int64_t[]){3, 4, 5}, dt);
        check_uniform(t, NULL, 10.0, 20.0);
        em_tensor_release(t);
    }
}

Test(fill, normal_matches_definition) {
    em_generator *g = em_generator_new(UINT64_C(0xfedcba9876543210));
    cr_assert_not_null(g);
    for (size_t k = 0; k < 4; k++) {
        em_dtype dt = float_dtypes[k];
        for (int64_t n = 0; n <= 5; n++) {
            em_tensor *t = new_tensor(1, (int64_t[]){n}, dt);
            check_normal(t, g, 0.0, 1.0);
            em_tensor_release(t);
        }
        em_tensor *base, *t = transposed(6, 3, dt, &base);
        check_normal(t, g, 3.0, 0.5);
        em_tensor_release(t);
        em_tensor_release(base);
        t = new_tensor(0, NULL, dt); /* a scalar */
        check_normal(t, g, -1.0, 2.0);
        em_tensor_release(t);
    }
    em_generator_free(g);
}

/* Contiguous bool, u8 and f32 take the 16-blocks-at-a-time path: long fills split into
 * chunks across threads, a tail, and a counter whose low word wraps inside a group of 16
 * blocks. */
Test(fill, bernoulli_long_fills) {
    static const em_dtype dts[] = {EM_BOOL, EM_U8, EM_F32};
    static const uint64_t offsets[] = {0, 0xFFFFFFF9u, 0x1FFFFFFFEull};
    static const double ps[] = {0.9, 0.5, 1.0 / 16777216.0, 1 - 1.0 / 16777216.0};
    em_generator *g = em_generator_new(0x9E3779B97F4A7C15ull);
    cr_assert_not_null(g);
    for (int d = 0; d < 3; d++)
        for (int o = 0; o < 3; o++) {
            em_tensor *t = new_tensor(1, (int64_t[]){40003}, dts[d]);
            em_rng_state s = em_generator_get_state(g);
            s.offset = offsets[o];
            em_generator_set_state(g, s);
            check_bernoulli(t, g, ps[(d * 3 + o) % 4]);
            em_tensor_release(t);
        }
    em_generator_free(g);
}

Test(fill, bernoulli_matches_definition_every_dtype) {
    em_seed(11);
    for (int d = 0; d < EM_DTYPE_COUNT; d++) {
        em_tensor *t = new_tensor(1, (int64_t[]){37}, (em_dtype)d);
        check_bernoulli(t, NULL, 0.3);
        check_bernoulli(t, NULL, 0.0); /* u < 0 never holds */
        for (int64_t i = 0; i < 37; i++)
            cr_assert_eq(elem(t, i), 0.0);
        check_bernoulli(t, NULL, 1.0); /* u < 1 always does */
        for (int64_t i = 0; i < 37; i++)
            cr_assert_eq(elem(t, i), 1.0);
        em_tensor_release(t);
        em_tensor *base, *v = transposed(4, 9, (em_dtype)d, &base);
        check_bernoulli(v, NULL, 0.7);
        em_tensor_release(v);
        em_tensor_release(base);
    }
}

/* Consecutive fills continue the stream where the previous one stopped. */
Test(fill, consecutive_fills_continue_the_stream) {
    em_seed(7);
    em_tensor *a = new_tensor(1, (int64_t[]){10}, EM_F32);
    em_tensor *b = new_tensor(1, (int64_t[]){3}, EM_F64);
    em_tensor *c = new_tensor(1, (int64_t[]){5}, EM_F32);
    em_tensor *d = new_tensor(1, (int64_t[]){9}, EM_F64);
    cr_assert_eq(em_uniform_(a, 0, 1, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_uniform_(b, 0, 1, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_normal_(c, 0, 1, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_bernoulli_(d, 0.5, NULL), EM_OK, "%s", em_last_error());
    /* offsets: a at 0 (3 blocks), b at 3 (2), c at 5 (3), d at 8 (3), next 11 */
    em_rng_state sa = {7, 0}, sb = {7, 3}, sc = {7, 5}, sd = {7, 8};
    for (int i = 0; i < 10; i++)
        cr_expect_eq(elem(a, i), ref_uniform(EM_F32, sa, (uint64_t)i, 0, 1));
    for (int i = 0; i < 3; i++)
        cr_expect_eq(elem(b, i), ref_uniform(EM_F64, sb, (uint64_t)i, 0, 1));
    for (int i = 0; i < 5; i++)
        cr_expect_eq(elem(c, i), ref_normal(EM_F32, sc, (uint64_t)i, 0, 1));
    for (int i = 0; i < 9; i++)
        cr_expect_eq(elem(d, i), ref_bernoulli(sd, (uint64_t)i, 0.5));
    em_rng_state s = em_generator_get_state(NULL);
    cr_expect(s.seed == 7 && s.offset == 11, "(%llu, %llu)", (unsigned long long)s.seed,
              (unsigned long long)s.offset);

    /* replaying from a saved state gives the same numbers */
    em_generator_set_state(NULL, sc);
    em_tensor *c2 = new_tensor(1, (int64_t[]){5}, EM_F32);
    cr_assert_eq(em_normal_(c2, 0, 1, NULL), EM_OK);
    for (int i = 0; i < 5; i++)
        cr_expect_eq(elem(c2, i), elem(c, i));
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(c);
    em_tensor_release(d);
    em_tensor_release(c2);
}

Test(fill, same_seed_same_numbers) {
    em_generator *g1 = em_generator_new(31337), *g2 = em_generator_new(31337);
    em_generator *g3 = em_generator_new(31338);
    cr_assert(g1 && g2 && g3);
    em_tensor *x = new_tensor(1, (int64_t[]){64}, EM_F32);
    em_tensor *y = new_tensor(1, (int64_t[]){64}, EM_F32);
    em_tensor *z = new_tensor(1, (int64_t[]){64}, EM_F32);
    cr_assert_eq(em_uniform_(x, 0, 1, g1), EM_OK);
    cr_assert_eq(em_uniform_(y, 0, 1, g2), EM_OK);
    cr_assert_eq(em_uniform_(z, 0, 1, g3), EM_OK);
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        cr_expect_eq(elem(x, i), elem(y, i));
        differ += elem(x, i) != elem(z, i);
    }
    cr_expect_gt(differ, 60, "another seed gives other numbers");
    em_tensor_release(x);
    em_tensor_release(y);
    em_tensor_release(z);
    em_generator_free(g1);
    em_generator_free(g2);
    em_generator_free(g3);
}

/* ---- statistics over 10^6 samples -------------------------------------------------------
 * With n = 10^6 independent samples, the sample mean has standard deviation sigma/sqrt(n)
 * and the sample variance about sqrt((mu4 - sigma^4) / n) (CLT). The bounds are 6 of those
 * standard deviations: a correct generator fails one with probability about 2e-9. Every
 * element is also compared with the definition, which covers the multi-threaded path
 * (n > 65536). */

#define NSTAT 1000000

static void moments(const em_tensor *t, double *mean, double *var) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < NSTAT; i++)
        s += elem(t, i);
    *mean = s / NSTAT;
    for (int64_t i = 0; i < NSTAT; i++) {
        double d = elem(t, i) - *mean;
        s2 += d * d;
    }
    *var = s2 / (NSTAT - 1);
}

Test(fill, uniform_statistics) {
    em_seed(123);
    em_tensor *t = new_tensor(1, (int64_t[]){NSTAT}, EM_F32);
    check_uniform(t, NULL, 0.0, 1.0);
    double mean, var;
    moments(t, &mean, &var);
    for (int64_t i = 0; i < NSTAT; i++) {
        double v = elem(t, i);
        cr_assert(v >= 0.0 && v < 1.0, "element %lld = %a outside [0, 1)", (long long)i, v);
    }
    /* U(0,1): mean 1/2, sd of mean sqrt(1/12/n) = 2.9e-4; variance 1/12, mu4 = 1/80,
     * sd of variance sqrt((1/80 - 1/144)/n) = 7.5e-5 */
    cr_expect(fabs(mean - 0.5) < 6 * 2.9e-4, "mean %g", mean);
    cr_expect(fabs(var - 1.0 / 12) < 6 * 7.5e-5, "variance %g", var);
    em_tensor_release(t);
}

Test(fill, uniform_f64_statistics) {
    em_seed(124);
    em_tensor *t = new_tensor(1, (int64_t[]){NSTAT}, EM_F64);
    check_uniform(t, NULL, -3.0, 5.0);
    double mean, var;
    moments(t, &mean, &var);
    /* U(-3,5): mean 1, variance 64/12 = 5.333; sd of mean sqrt(5.333/n) = 2.31e-3;
     * mu4 = 8^4/80 = 51.2, sd of variance sqrt((51.2 - 28.44)/n) = 4.77e-3 */
    cr_expect(fabs(mean - 1.0) < 6 * 2.31e-3, "mean %g", mean);
    cr_expect(fabs(var - 64.0 / 12) < 6 * 4.77e-3, "variance %g", var);
    em_tensor_release(t);
}

Test(fill, normal_statistics) {
    em_seed(321);
    em_tensor *t = new_tensor(1, (int64_t[]){NSTAT}, EM_F32);
    check_normal(t, NULL, 2.0, 3.0);
    double mean, var;
    moments(t, &mean, &var);
    /* N(2, 9): sd of mean 3/sqrt(n) = 3e-3; mu4 = 3 sigma^4, so sd of variance
     * sqrt(2 * 81 / n) = 1.27e-2 */
    cr_expect(fabs(mean - 2.0) < 6 * 3e-3, "mean %g", mean);
    cr_expect(fabs(var - 9.0) < 6 * 1.27e-2, "variance %g", var);
    em_tensor_release(t);
}

Test(fill, bernoulli_frequency) {
    em_seed(999);
    em_tensor *t = new_tensor(1, (int64_t[]){NSTAT}, EM_U8);
    check_bernoulli(t, NULL, 0.3);
    double ones = 0;
    for (int64_t i = 0; i < NSTAT; i++)
        ones += elem(t, i);
    /* binomial: sd of the frequency sqrt(0.3 * 0.7 / n) = 4.58e-4 */
    cr_expect(fabs(ones / NSTAT - 0.3) < 6 * 4.58e-4, "frequency %g", ones / NSTAT);
    em_tensor_release(t);
}

/* ---- bad input ---------------------------------------------------------------------------- */

Test(fill, bad_input_is_reported) {
    em_tensor *i = new_tensor(1, (int64_t[]){4}, EM_I32);
    cr_expect_neq(em_uniform_(i, 0, 1, NULL), EM_OK, "uniform on int32");
    cr_expect(strstr(em_last_error(), "uniform") != NULL, "%s", em_last_error());
    cr_expect_neq(em_normal_(i, 0, 1, NULL), EM_OK, "normal on int32");
    cr_expect(strstr(em_last_error(), "normal") != NULL, "%s", em_last_error());
    em_tensor_release(i);

    em_tensor *f = new_tensor(1, (int64_t[]){4}, EM_F32);
    cr_expect_neq(em_normal_(f, 0, -1, NULL), EM_OK, "negative std");
    cr_expect(strstr(em_last_error(), "std") != NULL, "%s", em_last_error());
    cr_expect_neq(em_bernoulli_(f, 1.5, NULL), EM_OK, "p > 1");
    cr_expect(strstr(em_last_error(), "bernoulli") != NULL, "%s", em_last_error());
    cr_expect_neq(em_uniform_(f, 2, 1, NULL), EM_OK, "lo > hi");
    cr_expect(strstr(em_last_error(), "uniform") != NULL, "%s", em_last_error());
    em_tensor_release(f);
}

/* ---- randperm ----------------------------------------------------------------------------- */

/* ember/random.h's shuffle, written again here from the raw Philox words. */
static void ref_randperm(int64_t n, em_rng_state s, int64_t *v) {
    for (int64_t i = 0; i < n; i++) v[i] = i;
    for (int64_t k = 0; k < n - 1; k++) {
        uint32_t w[4];
        em_philox_block(s.seed, s.offset + (uint64_t)k / 4, w);
        int64_t i = n - 1 - k;
        uint64_t j = ((uint64_t)w[k % 4] * (uint64_t)(i + 1)) >> 32;
        cr_assert_leq(j, (uint64_t)i);
        int64_t x = v[i];
        v[i] = v[j];
        v[j] = x;
    }
}

static void check_randperm(int64_t n, em_dtype dt, em_generator *g) {
    em_rng_state s = em_generator_get_state(g);
    em_tensor *t = em_randperm(n, dt, em_cpu(), g);
    cr_assert_not_null(t, "randperm(%lld, %s): %s", (long long)n, em_dtype_name(dt),
                       em_last_error());
    cr_assert_eq(em_tensor_dtype(t), dt);
    cr_assert_eq(em_tensor_ndim(t), 1);
    cr_assert_eq(em_tensor_numel(t), n);
    int64_t *want = malloc((size_t)(n + 1) * sizeof *want);
    char *seen = calloc((size_t)n + 1, 1);
    cr_assert(want && seen);
    ref_randperm(n, s, want);
    for (int64_t i = 0; i < n; i++) {
        double got = elem(t, i);
        cr_assert_eq(got, (double)want[i], "randperm(%lld, %s)[%lld] = %g, want %lld",
                     (long long)n, em_dtype_name(dt), (long long)i, got, (long long)want[i]);
        cr_assert(!seen[want[i]], "value %lld twice", (long long)want[i]);
        seen[want[i]] = 1;
    }
    cr_expect_eq(em_generator_get_state(g).offset,
                 s.offset + (n > 1 ? ceil_div((uint64_t)n - 1, 4) : 0), "randperm(%lld) offset",
                 (long long)n);
    free(want);
    free(seen);
    em_tensor_release(t);
}

Test(fill, randperm_matches_definition) {
    em_seed(99);
    em_generator *g = em_generator_new(UINT64_C(0x0123456789abcdef));
    cr_assert_not_null(g);
    for (int d = 0; d < 2; d++) {
        em_dtype dt = d ? EM_I32 : EM_I64;
        for (int64_t n = 0; n <= 10; n++) { /* empty, one element, every remainder mod 4 */
            check_randperm(n, dt, NULL);
            check_randperm(n, dt, g);
        }
        check_randperm(1000, dt, g);
        check_randperm(100003, dt, NULL);
    }
    em_generator_free(g);
}

/* Replaying a generator state replays the permutation; a new state gives another one. */
Test(fill, randperm_replays_from_state) {
    em_seed(5);
    em_tensor *x = new_tensor(1, (int64_t[]){7}, EM_F32);
    cr_assert_eq(em_uniform_(x, 0, 1, NULL), EM_OK); /* randperm continues the stream */
    em_rng_state s = em_generator_get_state(NULL);
    em_tensor *a = em_randperm(50, EM_I64, em_cpu(), NULL);
    em_tensor *b = em_randperm(50, EM_I64, em_cpu(), NULL);
    em_generator_set_state(NULL, s);
    em_tensor *c = em_randperm(50, EM_I64, em_cpu(), NULL);
    cr_assert(a && b && c, "%s", em_last_error());
    int same_ab = 1;
    for (int64_t i = 0; i < 50; i++) {
        cr_expect_eq(elem(c, i), elem(a, i), "replayed element %lld", (long long)i);
        same_ab &= elem(a, i) == elem(b, i);
    }
    cr_expect(!same_ab, "two draws in a row gave the same permutation");
    em_tensor_release(x);
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(c);
}

/* The op writes through any strides: a column of a (4, 3) i64 tensor, and an i32 slice. */
Test(fill, randperm_op_into_strided_output) {
    const em_op *op = em_op_find("randperm");
    cr_assert_not_null(op, "%s", em_last_error());
    em_attr attrs[2] = {{.type = EM_ATTR_INT, .v.i = 77}, {.type = EM_ATTR_INT, .v.i = 3}};
    int64_t want[4];
    ref_randperm(4, (em_rng_state){77, 3}, want);
    for (int d = 0; d < 2; d++) {
        em_dtype dt = d ? EM_I32 : EM_I64;
        em_tensor *base = new_tensor(2, (int64_t[]){4, 3}, dt);
        cr_assert_eq(em_fill_(base, -1), EM_OK);
        em_tensor *col = em_select(base, 1, 1);
        cr_assert_not_null(col, "%s", em_last_error());
        cr_assert_not(em_tensor_is_contiguous(col));
        cr_assert_eq(em_op_call_out(op, NULL, 0, attrs, &col, 1), EM_OK, "%s", em_last_error());
        for (int64_t r = 0; r < 4; r++)
            for (int64_t c = 0; c < 3; c++)
                cr_expect_eq(elem(base, r * 3 + c), c == 1 ? (double)want[r] : -1.0,
                             "%s (%lld, %lld)", em_dtype_name(dt), (long long)r, (long long)c);
        em_tensor_release(col);
        em_tensor_release(base);
    }
}

/* Every one of the 3! permutations of n = 3 comes up about equally often. */
Test(fill, randperm_is_uniform) {
    em_seed(2025);
    int count[6] = {0};
    const int draws = 6000;
    for (int k = 0; k < draws; k++) {
        em_tensor *t = em_randperm(3, EM_I64, em_cpu(), NULL);
        cr_assert_not_null(t, "%s", em_last_error());
        int a = (int)elem(t, 0), b = (int)elem(t, 1);
        count[a * 2 + (b > (a == 0 ? 1 : 0) ? 1 : 0)]++; /* (first, order of the other two) */
        em_tensor_release(t);
    }
    /* binomial(6000, 1/6): sd 28.9; 5 sd either side of 1000 */
    for (int i = 0; i < 6; i++)
        cr_expect(abs(count[i] - draws / 6) < 145, "permutation %d drawn %d times of %d", i,
                  count[i], draws);
}

Test(fill, randperm_bad_input_is_reported) {
    em_rng_state s = em_generator_get_state(NULL);
    cr_expect_null(em_randperm(5, EM_F32, em_cpu(), NULL));
    cr_expect_eq(em_last_status(), EM_ERR_DTYPE);
    cr_expect(strstr(em_last_error(), "randperm: dtype float32") != NULL, "%s", em_last_error());
    cr_expect_null(em_randperm(-1, EM_I64, em_cpu(), NULL));
    cr_expect_eq(em_last_status(), EM_ERR_INVALID);
    cr_expect(strstr(em_last_error(), "got -1") != NULL, "%s", em_last_error());
    cr_expect_null(em_randperm((INT64_C(1) << 31) + 1, EM_I32, em_cpu(), NULL));
    cr_expect(strstr(em_last_error(), "for int32") != NULL, "%s", em_last_error());
    cr_expect_null(em_randperm((INT64_C(1) << 32) + 1, EM_I64, em_cpu(), NULL));
    cr_expect(strstr(em_last_error(), "between 0 and 4294967296") != NULL, "%s",
              em_last_error());
    em_rng_state after = em_generator_get_state(NULL);
    cr_expect(after.seed == s.seed && after.offset == s.offset,
              "a refused randperm must not take numbers from the generator");
}

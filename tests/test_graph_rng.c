/*
 * test_graph_rng.c — random numbers in captured graphs (ember/random.h, "Graph capture"), on
 * the test device with host kernels (tests/plugins/host/: it records and replays as CUDA
 * graphs do, and its drawing kernels read the capture's generator state when they run):
 *   - a captured step of dropout, bernoulli_, uniform_ and normal_ replayed 4 times: each
 *     replay's numbers are those of a plain loop over ember/random.h's streams at the
 *     generator's state before that replay (an independent reference), the same bits as the
 *     ops run eagerly on the device at that state, different in each replay, and the
 *     generator ends where the eager ops leave it; em_graph_generator reports the blocks;
 *   - scaled_dot_product_attention with dropout, forward and backward captured: each replay
 *     gives the eager output and gradients bit for bit at its generator state, and replays
 *     differ;
 *   - the refusals: randperm and a second generator in a capture name the op; an offset without
 *     a seed outside a capture (the CPU kernel) is an error naming the op.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#include "common.h"

TestSuite(graph_rng, .init = em_test_setup, .fini = em_test_teardown, .timeout = 120);

/* a and b hold the same bits (as doubles: every value here is exact in double). */
static bool same(const em_tensor *a, const em_tensor *b) {
    double *x = em_test_values(a), *y = em_test_values(b);
    bool eq = em_tensor_numel(a) == em_tensor_numel(b);
    for (int64_t i = 0; eq && i < em_tensor_numel(a); i++)
        eq = memcmp(&x[i], &y[i], sizeof x[i]) == 0;
    free(x), free(y);
    return eq;
}

enum { ROWS = 5, COLS = 37, N = ROWS * COLS };
#define P_DROP 0.3

/* The step: dropout of x, a bernoulli_, uniform_ and normal_ fill; outputs in out[0..4). */
static void draw_step(const em_tensor *x, em_tensor *b, em_tensor *u, em_tensor *nr,
                      em_tensor **y, em_tensor **mask) {
    *y = em_dropout(x, P_DROP, true, NULL, mask);
    cr_assert(*y, "dropout: %s", em_last_error());
    cr_assert_eq(em_bernoulli_(b, 0.6, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_uniform_(u, -1.0, 2.0, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_normal_(nr, 0.5, 2.0, NULL), EM_OK, "%s", em_last_error());
}

/* The plain loops of ember/random.h from state s: the mask, bernoulli, uniform and normal
 * values the step draws, in that order (blocks: N/4 rounded up each, normal N/2). */
static void reference(em_rng_state s, double *mask, double *b, double *u, double *nr) {
    uint64_t o = s.offset;
    for (int64_t i = 0; i < N; i++) mask[i] = em_philox_uniform_f32(s.seed, o, (uint64_t)i) < 1 - P_DROP;
    o += (N + 3) / 4;
    for (int64_t i = 0; i < N; i++) b[i] = em_philox_uniform_f32(s.seed, o, (uint64_t)i) < 0.6f;
    o += (N + 3) / 4;
    for (int64_t i = 0; i < N; i++)
        u[i] = (float)(-1.0 + (double)em_philox_uniform_f32(s.seed, o, (uint64_t)i) * 3.0);
    o += (N + 3) / 4;
    for (int64_t i = 0; i < N; i++) nr[i] = (float)(0.5 + 2.0 * em_philox_normal(s.seed, o, (uint64_t)i));
}

static void expect_values(const em_tensor *t, const double *want, const char *what, int r) {
    double *v = em_test_values(t);
    int bad = 0;
    for (int64_t i = 0; i < N; i++) bad += v[i] != want[i];
    free(v);
    cr_assert_eq(bad, 0, "replay %d: %s: %d of %d values differ from ember/random.h's stream", r,
                 what, bad, N);
}

Test(graph_rng, captured_draws_replay_fresh_numbers_the_eager_ops_draw) {
    em_device td = em_test_host_testdev();
    em_seed(1234);
    em_generator_reserve(NULL, 77); /* not at offset 0 */
    em_stream *s = NULL;
    cr_assert_eq(em_stream_create(td, &s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(td, s), EM_OK, "%s", em_last_error());
    const int64_t shape[2] = {ROWS, COLS};
    em_scope_begin();
    em_tensor *x = em_keep(em_to_device(em_add_scalar(em_zeros(2, shape, EM_F32, em_cpu()), 1.0), td));
    em_tensor *b = em_keep(em_zeros(2, shape, EM_F32, td)), *u = em_keep(em_zeros(2, shape, EM_F32, td)),
              *nr = em_keep(em_zeros(2, shape, EM_F32, td));
    em_tensor *eb = em_keep(em_zeros(2, shape, EM_F32, td)), *eu = em_keep(em_zeros(2, shape, EM_F32, td)),
              *en = em_keep(em_zeros(2, shape, EM_F32, td));
    cr_assert(x && b && u && nr && eb && eu && en, "%s", em_last_error());
    em_scope_end();

    em_rng_state at_capture = em_generator_get_state(NULL);
    em_graph *g = NULL;
    em_tensor *y = NULL, *mask = NULL;
    cr_assert_eq(em_graph_capture_begin(td, s), EM_OK, "%s", em_last_error());
    em_scope_begin();
    draw_step(x, b, u, nr, &y, &mask);
    em_keep(y), em_keep(mask);
    em_scope_end();
    cr_assert_eq(em_graph_capture_end(td, &g), EM_OK, "%s", em_last_error());
    /* the capture drew nothing: the generator has not moved */
    em_rng_state now = em_generator_get_state(NULL);
    cr_assert(now.seed == at_capture.seed && now.offset == at_capture.offset,
              "the capture moved the generator");
    em_generator *gen = NULL;
    uint64_t blocks = 0;
    cr_assert_eq(em_graph_generator(g, &gen, &blocks), EM_OK);
    cr_assert_eq(gen, em_default_generator());
    cr_assert_eq(blocks, 3 * ((N + 3) / 4) + (N + 1) / 2);

    double *rm = malloc(4 * N * sizeof(double)), *rb = rm + N, *ru = rb + N, *rn = ru + N;
    double *prev_mask = calloc(N, sizeof(double));
    for (int r = 0; r < 4; r++) {
        em_rng_state before = em_generator_get_state(NULL);
        if (r == 2) { /* a jump, as a checkpoint's resume sets it */
            before = (em_rng_state){.seed = 99, .offset = UINT64_C(1) << 40};
            em_generator_set_state(NULL, before);
        }
        cr_assert_eq(em_graph_replay(g), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_stream_synchronize(td, s), EM_OK, "%s", em_last_error());
        em_rng_state after = em_generator_get_state(NULL);
        cr_assert_eq(after.offset - before.offset, blocks, "replay %d moved the generator by "
                     "%llu blocks, want %llu", r, (unsigned long long)(after.offset - before.offset),
                     (unsigned long long)blocks);
        reference(before, rm, rb, ru, rn);
        expect_values(mask, rm, "dropout's mask", r);
        for (int64_t i = 0; i < N; i++) rm[i] = rm[i] ? (double)(1.0f / (float)(1 - P_DROP)) : 0.0;
        expect_values(y, rm, "dropout's output", r);
        expect_values(b, rb, "bernoulli_", r);
        expect_values(u, ru, "uniform_", r);
        expect_values(nr, rn, "normal_", r);
        double *m = em_test_values(mask);
        int diff = 0;
        for (int64_t i = 0; i < N; i++) diff += m[i] != prev_mask[i];
        cr_assert(diff > N / 10, "replay %d drew the previous replay's mask (%d of %d differ)", r,
                  diff, N);
        memcpy(prev_mask, m, N * sizeof(double));
        free(m);
        /* the same ops eagerly on the device, from the same state: the same bits, and the
         * generator where the replay left it */
        em_generator_set_state(NULL, before);
        em_scope_begin();
        em_tensor *ey = NULL, *em = NULL;
        draw_step(x, eb, eu, en, &ey, &em);
        cr_assert(same(ey, y) && same(em, mask) && same(eb, b) && same(eu, u) && same(en, nr),
                  "replay %d differs from the eager ops at its generator state", r);
        em_scope_end();
        em_rng_state eager_after = em_generator_get_state(NULL);
        cr_assert(eager_after.seed == after.seed && eager_after.offset == after.offset);
    }
    free(rm);
    free(prev_mask);
    em_graph_free(g);
    RELEASE(x, b, u, nr, eb, eu, en, y, mask);
    em_stream_set_current(td, NULL);
    em_stream_free(td, s);
}

/* out = sdpa(q, k, v) with dropout, loss = sum(out * w), and its backward: the output and
 * the three gradients (new references). */
static void sdpa_step(em_tensor *q, em_tensor *k, em_tensor *v, const em_tensor *w,
                      em_tensor **res) {
    em_scope_begin();
    em_tensor *out = em_scaled_dot_product_attention(q, k, v, NULL, 0.25, false, NULL, NULL, NULL);
    cr_assert(out, "sdpa: %s", em_last_error());
    em_tensor *loss = em_sum(em_mul(out, w), 0, NULL, false);
    cr_assert(loss, "%s", em_last_error());
    cr_assert_eq(em_backward(loss), EM_OK, "backward: %s", em_last_error());
    res[0] = em_keep(out);
    res[1] = em_tensor_retain(em_tensor_grad(q)), res[2] = em_tensor_retain(em_tensor_grad(k)),
    res[3] = em_tensor_retain(em_tensor_grad(v)); /* borrowed: retained */
    cr_assert(res[1] && res[2] && res[3], "a gradient is missing");
    em_scope_end();
}

Test(graph_rng, captured_attention_dropout_replays_the_eager_forward_and_backward) {
    em_device td = em_test_host_testdev();
    em_seed(7);
    em_stream *s = NULL;
    cr_assert_eq(em_stream_create(td, &s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(td, s), EM_OK, "%s", em_last_error());
    const int64_t sh[3] = {2, 6, 8};
    em_tensor *t[4];
    for (int i = 0; i < 4; i++) {
        em_scope_begin();
        double vals[96];
        em_test_fill_random(vals, 96, 11 + (uint64_t)i);
        t[i] = em_keep(em_to_device(em_test_tensor(EM_F32, 3, sh, vals), td));
        cr_assert(t[i], "%s", em_last_error());
        em_scope_end();
        if (i < 3) cr_assert_eq(em_requires_grad_(t[i], true), EM_OK);
    }
    em_graph *g = NULL;
    em_tensor *cap[4];
    cr_assert_eq(em_graph_capture_begin(td, s), EM_OK, "%s", em_last_error());
    sdpa_step(t[0], t[1], t[2], t[3], cap);
    cr_assert_eq(em_graph_capture_end(td, &g), EM_OK, "%s", em_last_error());
    double *prev = NULL;
    for (int r = 0; r < 3; r++) {
        em_rng_state before = em_generator_get_state(NULL);
        cr_assert_eq(em_graph_replay(g), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_stream_synchronize(td, s), EM_OK, "%s", em_last_error());
        double *o = em_test_values(cap[0]);
        if (prev) {
            int diff = 0;
            for (int64_t i = 0; i < em_tensor_numel(cap[0]); i++) diff += o[i] != prev[i];
            cr_assert(diff > 0, "replay %d repeated the previous replay's dropout", r);
            free(prev);
        }
        prev = o;
        /* eagerly at the same state, gradients fresh */
        em_generator_set_state(NULL, before);
        for (int i = 0; i < 3; i++) em_tensor_set_grad(t[i], NULL);
        em_tensor *eg[4];
        sdpa_step(t[0], t[1], t[2], t[3], eg);
        static const char *const what[] = {"output", "grad query", "grad key", "grad value"};
        for (int i = 0; i < 4; i++) {
            cr_assert(same(eg[i], cap[i]), "replay %d: %s differs from the eager step's", r,
                      what[i]);
            em_tensor_release(eg[i]);
        }
        for (int i = 0; i < 3; i++) em_tensor_set_grad(t[i], cap[i + 1]);
    }
    free(prev);
    em_graph_free(g);
    for (int i = 0; i < 4; i++) em_tensor_release(cap[i]), em_tensor_release(t[i]);
    em_stream_set_current(td, NULL);
    em_stream_free(td, s);
}

Test(graph_rng, uncovered_draws_and_a_stray_relative_offset_are_refused_naming_the_op) {
    em_device td = em_test_host_testdev();
    em_stream *s = NULL;
    cr_assert_eq(em_stream_create(td, &s), EM_OK, "%s", em_last_error());
    em_scope_begin();
    em_tensor *a = em_keep(em_zeros(1, (const int64_t[]){8}, EM_F32, td));
    em_scope_end();
    em_generator *other = em_generator_new(5);
    em_graph *g = NULL;
    cr_assert_eq(em_graph_capture_begin(td, s), EM_OK, "%s", em_last_error());
    em_scope_begin();
    cr_assert_null(em_randperm(10, EM_I64, td, NULL));
    em_assert_error(EM_ERR_STATE, "randperm: draws random numbers while a graph is captured");
    cr_assert_eq(em_bernoulli_(a, 0.5, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_uniform_(a, 0, 1, other), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "uniform: draws from a second generator in one graph capture");
    /* both attributes by name in the capture: an eager draw's, replayed as recorded */
    em_attr ab[3] = {{.type = EM_ATTR_INT, .v.i = 3}, {.type = EM_ATTR_INT, .v.i = 0},
                     {.type = EM_ATTR_FLOAT, .v.f = 0.5}};
    cr_assert_eq(em_op_call_out(em_op_find("bernoulli"), NULL, 0, ab, &a, 1), EM_OK, "%s",
                 em_last_error());
    /* a CPU op in the capture draws eagerly: the capture is testdev's */
    em_rng_state before = em_generator_get_state(NULL);
    cr_assert(em_randperm(10, EM_I64, em_cpu(), NULL), "%s", em_last_error());
    cr_assert_neq(em_generator_get_state(NULL).offset, before.offset);
    em_scope_end();
    cr_assert_eq(em_graph_capture_end(td, &g), EM_OK, "%s", em_last_error());
    em_graph_free(g);
    /* an offset without a seed by name outside a capture: the kernel's error names the op */
    em_scope_begin();
    em_tensor *c = em_zeros(1, (const int64_t[]){8}, EM_F32, em_cpu());
    em_attr at[3] = {{.type = EM_ATTR_NONE}, {.type = EM_ATTR_INT, .v.i = 0},
                     {.type = EM_ATTR_FLOAT, .v.f = 0.5}};
    cr_assert_eq(em_op_call_out(em_op_find("bernoulli"), NULL, 0, at, &c, 1), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "bernoulli: attribute 'seed' is absent with an 'offset', but "
                    "no graph capture");
    em_scope_end();
    em_generator_free(other);
    em_tensor_release(a);
    em_stream_free(td, s);
}

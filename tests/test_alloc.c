/*
 * test_alloc.c — the caching device allocator seen through the public API: exact bytes per
 * memory category for a known model, the rounding and reuse rules documented in core/alloc.c,
 * peaks, the cache and em_empty_cache(), the summary table, and the out-of-memory message.
 *
 * Expected sizes are computed here from the shapes and the documented rule (n <= 1 MiB rounds
 * up to 512 B, at least 512 B; larger n rounds up to 2 MiB), and cross-checked against values
 * worked out by hand. Every check is a delta from the stats taken after em_init(), so blocks
 * the library keeps for itself do not matter.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

/* The documented block-size rule, written independently of core/alloc.c. */
static size_t block_of(size_t n) {
    if (n <= MiB) {
        size_t b = (n + 511) / 512 * 512;
        return b < 512 ? 512 : b;
    }
    return (n + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
}

static em_memory_stats cpu_stats(void) {
    em_memory_stats s;
    cr_assert_eq(em_memory_stats_get(em_cpu(), &s), EM_OK, "%s", em_last_error());
    return s;
}

/* reserved is exactly what the categories (cached included) hold. */
static void assert_reserved_adds_up(const em_memory_stats *s) {
    size_t sum = 0;
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
        sum += s->current[c];
    cr_assert_eq(s->reserved, sum, "reserved %zu != sum of categories %zu", s->reserved, sum);
    cr_assert_geq(s->peak_reserved, s->reserved);
}

/* A new f32 tensor of the given shape in category c. */
static em_tensor *tensor_in(int ndim, const int64_t *shape, em_mem_category c) {
    em_tensor *t = em_empty(ndim, shape, EM_F32, em_cpu());
    cr_assert_not_null(t, "%s", em_last_error());
    if (c != EM_MEM_ACTIVATION)
        cr_assert_eq(em_tensor_set_category(t, c), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_category(t), c);
    return t;
}

static void setup(void) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    em_empty_cache(); /* start every test from an empty cache */
}

static void teardown(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

TestSuite(alloc, .init = setup, .fini = teardown);

/* ---- a known model: MLP 784-128-10 trained with Adam on a batch of 64 -------------------- */

#define BATCH 64
static const int64_t g_param_shapes[4][2] = {{128, 784}, {128, 0}, {10, 128}, {10, 0}};
static const int g_param_ndim[4] = {2, 1, 2, 1};

typedef struct mlp {
    em_tensor *param[4], *grad[4], *adam_m[4], *adam_v[4];
    em_tensor *x, *h, *logits;
} mlp;

static void mlp_make(mlp *m) {
    for (int i = 0; i < 4; i++) {
        m->param[i] = tensor_in(g_param_ndim[i], g_param_shapes[i], EM_MEM_PARAMETER);
        m->grad[i] = tensor_in(g_param_ndim[i], g_param_shapes[i], EM_MEM_GRADIENT);
        m->adam_m[i] = tensor_in(g_param_ndim[i], g_param_shapes[i], EM_MEM_OPTIMIZER);
        m->adam_v[i] = tensor_in(g_param_ndim[i], g_param_shapes[i], EM_MEM_OPTIMIZER);
    }
    m->x = tensor_in(2, (int64_t[]){BATCH, 784}, EM_MEM_DATA);
    m->h = tensor_in(2, (int64_t[]){BATCH, 128}, EM_MEM_ACTIVATION);
    m->logits = tensor_in(2, (int64_t[]){BATCH, 10}, EM_MEM_ACTIVATION);
}

static void mlp_free(mlp *m) {
    for (int i = 0; i < 4; i++) {
        em_tensor_release(m->param[i]);
        em_tensor_release(m->grad[i]);
        em_tensor_release(m->adam_m[i]);
        em_tensor_release(m->adam_v[i]);
    }
    em_tensor_release(m->x);
    em_tensor_release(m->h);
    em_tensor_release(m->logits);
}

/* Bytes of the parameters as blocks: sum of block_of(numel * 4). */
static size_t mlp_param_bytes(void) {
    size_t total = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)g_param_shapes[i][0];
        if (g_param_ndim[i] == 2)
            n *= (size_t)g_param_shapes[i][1];
        total += block_of(n * sizeof(float));
    }
    return total;
}

Test(alloc, mlp_bytes_per_category_are_exact) {
    em_memory_stats base = cpu_stats();
    mlp m;
    mlp_make(&m);
    em_memory_stats s = cpu_stats();

    size_t param = mlp_param_bytes();
    /* By hand: 401408 + 512 + 5120 + 512 (the 40-byte bias rounds up to 512). */
    cr_assert_eq(param, (size_t)407552);
    size_t data = block_of(BATCH * 784 * sizeof(float));
    cr_assert_eq(data, (size_t)200704);
    size_t act = block_of(BATCH * 128 * sizeof(float)) + block_of(BATCH * 10 * sizeof(float));
    cr_assert_eq(act, (size_t)(32768 + 2560));

    size_t want[EM_MEM_CATEGORY_COUNT] = {[EM_MEM_PARAMETER] = param,
                                          [EM_MEM_GRADIENT] = param,
                                          [EM_MEM_OPTIMIZER] = 2 * param,
                                          [EM_MEM_DATA] = data,
                                          [EM_MEM_ACTIVATION] = act};
    size_t want_count[EM_MEM_CATEGORY_COUNT] = {[EM_MEM_PARAMETER] = 4, [EM_MEM_GRADIENT] = 4,
                                                [EM_MEM_OPTIMIZER] = 8, [EM_MEM_DATA] = 1,
                                                [EM_MEM_ACTIVATION] = 2};
    for (int c = 0; c < EM_MEM_CACHED; c++) {
        cr_expect_eq(s.current[c] - base.current[c], want[c], "%s: %zu bytes, expected %zu",
                     em_mem_category_name(c), s.current[c] - base.current[c], want[c]);
        cr_expect_eq(s.count[c] - base.count[c], want_count[c], "%s blocks",
                     em_mem_category_name(c));
        cr_expect_geq(s.peak[c], s.current[c]);
    }
    size_t total = 4 * param + data + act;
    cr_assert_eq(s.reserved - base.reserved, total);
    assert_reserved_adds_up(&s);

    /* Releasing moves every block to the cache; peaks remember the model. */
    mlp_free(&m);
    em_memory_stats r = cpu_stats();
    for (int c = 0; c < EM_MEM_CACHED; c++) {
        cr_expect_eq(r.current[c], base.current[c], "%s after release", em_mem_category_name(c));
        cr_expect_geq(r.peak[c] - base.current[c], want[c], "%s peak", em_mem_category_name(c));
    }
    cr_assert_eq(r.current[EM_MEM_CACHED] - base.current[EM_MEM_CACHED], total);
    cr_assert_eq(r.count[EM_MEM_CACHED] - base.count[EM_MEM_CACHED], (size_t)19);
    cr_assert_eq(r.reserved, s.reserved, "releasing keeps the memory reserved (cached)");
    assert_reserved_adds_up(&r);

    /* After reset_peak the peaks are the current values. */
    em_memory_reset_peak();
    em_memory_stats p = cpu_stats();
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
        cr_expect_eq(p.peak[c], p.current[c], "%s peak after reset", em_mem_category_name(c));
    cr_assert_eq(p.peak_reserved, p.reserved);
}

/* ---- rounding and reuse ------------------------------------------------------------------- */

Test(alloc, blocks_follow_the_rounding_rule) {
    /* numel of an f32 tensor -> block bytes, worked out by hand from the rule. */
    static const struct {
        int64_t numel;
        size_t block;
    } cases[] = {
        {1, 512},                          /* 4 B -> the 512 B minimum */
        {128, 512},                        /* exactly 512 B */
        {129, 1024},                       /* 516 B -> 1 KiB */
        {1000, 4096},                      /* 4000 B -> 4 KiB */
        {262144, 1 << 20},                 /* exactly 1 MiB stays small */
        {262145, 2 << 20},                 /* 1 MiB + 4 B -> 2 MiB */
        {786432, 4 << 20},                 /* 3 MiB -> 4 MiB */
        {(2 << 20) / 4 * 3, 6 << 20},      /* 6 MiB stays 6 MiB */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(block_of((size_t)cases[i].numel * 4), cases[i].block);
        em_memory_stats before = cpu_stats();
        em_tensor *t = tensor_in(1, &cases[i].numel, EM_MEM_ACTIVATION);
        em_memory_stats after = cpu_stats();
        cr_expect_eq(after.current[EM_MEM_ACTIVATION] - before.current[EM_MEM_ACTIVATION],
                     cases[i].block, "%lld floats: block %zu, expected %zu",
                     (long long)cases[i].numel,
                     after.current[EM_MEM_ACTIVATION] - before.current[EM_MEM_ACTIVATION],
                     cases[i].block);
        cr_expect_eq(after.count[EM_MEM_ACTIVATION] - before.count[EM_MEM_ACTIVATION], (size_t)1);
        em_tensor_release(t);
        em_empty_cache();
    }
}

Test(alloc, same_size_is_a_cache_hit) {
    int64_t shape[2] = {128, 784};
    em_memory_stats s0 = cpu_stats();
    em_tensor *a = tensor_in(2, shape, EM_MEM_ACTIVATION);
    void *first = em_tensor_data(a);
    em_memory_stats s1 = cpu_stats();
    cr_assert_eq(s1.device_allocs - s0.device_allocs, 1u);
    cr_assert_eq(s1.cache_hits, s0.cache_hits);
    em_tensor_release(a);

    em_memory_stats s2 = cpu_stats();
    cr_assert_eq(s2.current[EM_MEM_CACHED] - s0.current[EM_MEM_CACHED], (size_t)401408);
    cr_assert_eq(s2.count[EM_MEM_CACHED] - s0.count[EM_MEM_CACHED], (size_t)1);

    em_tensor *b = tensor_in(2, shape, EM_MEM_PARAMETER);
    em_memory_stats s3 = cpu_stats();
    cr_assert_eq(s3.cache_hits - s0.cache_hits, 1u, "the same size is served from the cache");
    cr_assert_eq(s3.device_allocs, s1.device_allocs, "no new device allocation");
    cr_assert_eq(em_tensor_data(b), first, "the cached block itself is handed out");
    cr_assert_eq(s3.current[EM_MEM_CACHED], s0.current[EM_MEM_CACHED]);
    cr_assert_eq(s3.current[EM_MEM_PARAMETER] - s0.current[EM_MEM_PARAMETER], (size_t)401408);

    /* A different small size is not served by that block. */
    em_tensor_release(b);
    em_tensor *c = tensor_in(2, (int64_t[]){128, 783}, EM_MEM_ACTIVATION);
    em_memory_stats s4 = cpu_stats();
    cr_assert_eq(s4.device_allocs - s3.device_allocs, 1u);
    cr_assert_eq(s4.cache_hits, s3.cache_hits);
    cr_assert_eq(s4.current[EM_MEM_CACHED] - s0.current[EM_MEM_CACHED], (size_t)401408);
    assert_reserved_adds_up(&s4);
    em_tensor_release(c);
}

Test(alloc, large_blocks_are_reused_up_to_twice_the_request) {
    em_memory_stats s0 = cpu_stats();
    /* 5 MiB + 4 B rounds to 6 MiB. */
    em_tensor *a = tensor_in(1, (int64_t[]){5 * (int64_t)MiB / 4 + 1}, EM_MEM_ACTIVATION);
    em_tensor_release(a);
    /* 2.5 MiB rounds to 4 MiB; the cached 6 MiB block is within 2 x 4 MiB: a hit, and the
     * statistics count the whole 6 MiB block. */
    em_tensor *b = tensor_in(1, (int64_t[]){5 * (int64_t)MiB / 8}, EM_MEM_ACTIVATION);
    em_memory_stats s1 = cpu_stats();
    cr_assert_eq(s1.cache_hits - s0.cache_hits, 1u);
    cr_assert_eq(s1.current[EM_MEM_ACTIVATION] - s0.current[EM_MEM_ACTIVATION], 6 * MiB);
    em_tensor_release(b);
    /* 1.5 MiB rounds to 2 MiB; 6 MiB is more than twice that: a new 2 MiB block. */
    em_tensor *c = tensor_in(1, (int64_t[]){3 * (int64_t)MiB / 8}, EM_MEM_ACTIVATION);
    em_memory_stats s2 = cpu_stats();
    cr_assert_eq(s2.cache_hits, s1.cache_hits);
    cr_assert_eq(s2.device_allocs - s1.device_allocs, 1u);
    cr_assert_eq(s2.current[EM_MEM_ACTIVATION] - s0.current[EM_MEM_ACTIVATION], 2 * MiB);
    cr_assert_eq(s2.current[EM_MEM_CACHED] - s0.current[EM_MEM_CACHED], 6 * MiB);
    assert_reserved_adds_up(&s2);
    em_tensor_release(c);
}

/* ---- peaks, categories, the cache ------------------------------------------------------- */

Test(alloc, peak_survives_release_until_reset) {
    em_memory_stats s0 = cpu_stats();
    em_tensor *a = tensor_in(1, (int64_t[]){1000}, EM_MEM_WORKSPACE); /* 4 KiB */
    em_tensor *b = tensor_in(1, (int64_t[]){2000}, EM_MEM_WORKSPACE); /* 8 KiB */
    em_tensor_release(b);
    em_memory_stats s1 = cpu_stats();
    cr_assert_eq(s1.current[EM_MEM_WORKSPACE] - s0.current[EM_MEM_WORKSPACE], 4 * KiB);
    cr_assert_eq(s1.peak[EM_MEM_WORKSPACE] - s0.current[EM_MEM_WORKSPACE], 12 * KiB);
    cr_assert_eq(s1.count[EM_MEM_WORKSPACE] - s0.count[EM_MEM_WORKSPACE], (size_t)1);

    em_memory_reset_peak();
    em_memory_stats s2 = cpu_stats();
    cr_assert_eq(s2.peak[EM_MEM_WORKSPACE], s2.current[EM_MEM_WORKSPACE]);
    cr_assert_eq(s2.peak_reserved, s2.reserved);

    em_tensor_release(a);
    em_memory_stats s3 = cpu_stats();
    cr_assert_eq(s3.current[EM_MEM_WORKSPACE], s0.current[EM_MEM_WORKSPACE]);
    cr_assert_eq(s3.peak[EM_MEM_WORKSPACE], s2.peak[EM_MEM_WORKSPACE],
                 "a release does not change the peak");
}

Test(alloc, set_category_moves_the_storage_bytes) {
    em_memory_stats s0 = cpu_stats();
    em_tensor *w = em_zeros(2, (int64_t[]){10, 128}, EM_F32, em_cpu()); /* 5120 B */
    cr_assert_not_null(w, "%s", em_last_error());
    cr_assert_eq(em_tensor_category(w), EM_MEM_ACTIVATION, "the default category");
    em_memory_stats s1 = cpu_stats();
    cr_assert_eq(s1.current[EM_MEM_ACTIVATION] - s0.current[EM_MEM_ACTIVATION], (size_t)5120);

    cr_assert_eq(em_tensor_set_category(w, EM_MEM_PARAMETER), EM_OK, "%s", em_last_error());
    em_memory_stats s2 = cpu_stats();
    cr_assert_eq(s2.current[EM_MEM_ACTIVATION], s0.current[EM_MEM_ACTIVATION]);
    cr_assert_eq(s2.current[EM_MEM_PARAMETER] - s0.current[EM_MEM_PARAMETER], (size_t)5120);
    cr_assert_eq(s2.peak[EM_MEM_PARAMETER] - s0.current[EM_MEM_PARAMETER], (size_t)5120);
    cr_assert_eq(s2.reserved, s1.reserved, "retagging takes no memory");

    /* A view shares the storage, so retagging it moves the same block. */
    em_tensor *wt = em_transpose(w, 0, 1);
    cr_assert_not_null(wt, "%s", em_last_error());
    cr_assert_eq(em_tensor_set_category(wt, EM_MEM_GRADIENT), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_category(w), EM_MEM_GRADIENT);
    em_memory_stats s3 = cpu_stats();
    cr_assert_eq(s3.current[EM_MEM_PARAMETER], s0.current[EM_MEM_PARAMETER]);
    cr_assert_eq(s3.current[EM_MEM_GRADIENT] - s0.current[EM_MEM_GRADIENT], (size_t)5120);
    cr_assert_eq(s3.count[EM_MEM_GRADIENT] - s0.count[EM_MEM_GRADIENT], (size_t)1);

    em_tensor_release(w);
    em_memory_stats s4 = cpu_stats();
    cr_assert_eq(s4.current[EM_MEM_GRADIENT] - s0.current[EM_MEM_GRADIENT], (size_t)5120,
                 "the view still holds the storage");
    em_tensor_release(wt);
    em_memory_stats s5 = cpu_stats();
    cr_assert_eq(s5.current[EM_MEM_GRADIENT], s0.current[EM_MEM_GRADIENT]);
    cr_assert_eq(s5.current[EM_MEM_CACHED] - s0.current[EM_MEM_CACHED], (size_t)5120);
    assert_reserved_adds_up(&s5);
}

Test(alloc, empty_cache_returns_cached_blocks) {
    em_memory_stats s0 = cpu_stats();
    cr_assert_eq(s0.current[EM_MEM_CACHED], 0u, "the fixture emptied the cache");
    int64_t sizes[3] = {100, 5000, 300000}; /* 400 B, 20000 B, 1200000 B */
    size_t want = 0;
    for (int i = 0; i < 3; i++) {
        em_tensor_release(tensor_in(1, &sizes[i], EM_MEM_DATA));
        want += block_of((size_t)sizes[i] * 4);
    }
    cr_assert_eq(want, (size_t)512 + 20480 + 2 * MiB, "worked out by hand");
    em_memory_stats s1 = cpu_stats();
    cr_assert_eq(s1.current[EM_MEM_CACHED], want);
    cr_assert_eq(s1.count[EM_MEM_CACHED], (size_t)3);
    cr_assert_eq(s1.reserved - s0.reserved, want);
    cr_assert_eq(s1.current[EM_MEM_DATA], s0.current[EM_MEM_DATA]);

    em_empty_cache();
    em_memory_stats s2 = cpu_stats();
    cr_assert_eq(s2.current[EM_MEM_CACHED], 0u);
    cr_assert_eq(s2.count[EM_MEM_CACHED], 0u);
    cr_assert_eq(s2.reserved, s0.reserved, "reserved drops by the cached bytes");
    cr_assert_geq(s2.peak[EM_MEM_CACHED], want, "the cache's peak is remembered");
    cr_assert_geq(s2.peak_reserved - s0.reserved, want);
    assert_reserved_adds_up(&s2);

    /* The next allocation of those sizes goes back to the device. */
    em_tensor *t = tensor_in(1, &sizes[1], EM_MEM_DATA);
    em_memory_stats s3 = cpu_stats();
    cr_assert_eq(s3.device_allocs - s2.device_allocs, 1u);
    cr_assert_eq(s3.cache_hits, s2.cache_hits);
    em_tensor_release(t);
}

/* ---- summary ------------------------------------------------------------------------------ */

/* The summary line of category `name` ("  parameter   398.0 KiB ..."), copied into line. */
static void summary_line(const char *text, const char *name, char *line, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "\n  %s ", name);
    const char *p = strstr(text, key);
    cr_assert_not_null(p, "no '%s' row in the summary:\n%s", name, text);
    p += 1;
    size_t n = strcspn(p, "\n");
    cr_assert_lt(n, cap);
    memcpy(line, p, n);
    line[n] = '\0';
}

/* Whitespace-separated fields of a line, in place. */
static int split_fields(char *line, char **fields, int max) {
    int n = 0;
    for (char *tok = strtok(line, " "); tok && n < max; tok = strtok(NULL, " "))
        fields[n++] = tok;
    return n;
}

Test(alloc, summary_names_categories_and_sizes) {
    em_memory_stats base = cpu_stats();
    cr_assert_eq(base.current[EM_MEM_PARAMETER], 0u, "nothing is a parameter before the test");
    mlp m;
    mlp_make(&m);
    em_tensor *gone = tensor_in(2, (int64_t[]){256, 1024}, EM_MEM_ACTIVATION); /* 1 MiB */
    em_tensor_release(gone);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    em_memory_summary(f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_not_null(strstr(text, "cpu: memory by category"), "%s", text);
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
        cr_expect_not_null(strstr(text, em_mem_category_name(c)), "%s missing:\n%s",
                           em_mem_category_name(c), text);

    /* 407552 B = 398.0 KiB in 4 blocks, for parameters and for gradients; optimizer twice. */
    static const struct {
        const char *name, *current, *blocks;
    } rows[] = {{"parameter", "398.0 KiB", "4"}, {"gradient", "398.0 KiB", "4"},
                {"optimizer", "796.0 KiB", "8"}, {"data", "196.0 KiB", "1"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char line[256], *fld[8];
        summary_line(text, rows[i].name, line, sizeof line);
        int n = split_fields(line, fld, 8);
        /* category, current (number + unit), peak (number + unit), blocks */
        cr_assert_eq(n, 6, "row '%s' has %d fields", rows[i].name, n);
        char cur[32];
        snprintf(cur, sizeof cur, "%s %s", fld[1], fld[2]);
        cr_expect_str_eq(cur, rows[i].current, "%s current", rows[i].name);
        cr_expect_str_eq(fld[5], rows[i].blocks, "%s blocks", rows[i].name);
    }
    char line[256], *fld[8];
    summary_line(text, "cached", line, sizeof line);
    cr_assert_eq(split_fields(line, fld, 8), 6);
    cr_expect_str_eq(fld[1], "1.0");
    cr_expect_str_eq(fld[2], "MiB");
    cr_expect_not_null(strstr(text, "reserved"), "%s", text);
    cr_expect_not_null(strstr(text, "cache hits"), "%s", text);
    free(text);
    mlp_free(&m);
}

/* ---- errors --------------------------------------------------------------------------------- */

Test(alloc, stats_of_a_bad_device_or_null_out) {
    em_memory_stats s;
    em_device bogus = {.type = EM_MAX_DEVICE_TYPES - 1, .index = 0};
    cr_assert_eq(em_memory_stats_get(bogus, &s), EM_ERR_DEVICE);
    cr_assert_not_null(strstr(em_last_error(), "em_memory_stats_get"), "%s", em_last_error());
    cr_assert_not_null(strstr(em_last_error(), "15"), "names the type: %s", em_last_error());

    em_device cpu7 = {.type = EM_DEVICE_CPU_TYPE, .index = 7};
    cr_assert_eq(em_memory_stats_get(cpu7, &s), EM_ERR_DEVICE);
    cr_assert_not_null(strstr(em_last_error(), "cpu"), "%s", em_last_error());

    cr_assert_eq(em_memory_stats_get(em_cpu(), NULL), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "out"), "%s", em_last_error());
}

Test(alloc, category_names) {
    static const char *const want[] = {"activation", "parameter", "gradient", "optimizer",
                                       "data", "workspace", "cached"};
    cr_assert_eq(sizeof want / sizeof want[0], (size_t)EM_MEM_CATEGORY_COUNT);
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
        cr_expect_str_eq(em_mem_category_name(c), want[c]);
    cr_expect_str_eq(em_mem_category_name(EM_MEM_CATEGORY_COUNT), "unknown");
    cr_expect_str_eq(em_mem_category_name((em_mem_category)-1), "unknown");
}

Test(alloc, host_alloc_alignment) {
    for (size_t align = 8; align <= 4096; align *= 2) {
        void *p = em_host_alloc(100, align);
        cr_assert_not_null(p, "%s", em_last_error());
        cr_assert_eq((uintptr_t)p % align, 0u, "aligned to %zu", align);
        memset(p, 0xab, 100);
        em_host_free(p);
    }
    cr_assert_null(em_host_alloc(100, 24));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "24"), "%s", em_last_error());
    em_host_free(NULL);
}

/* ---- threads -------------------------------------------------------------------------------- */

static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < 300; i++) {
        int64_t n = 1 + (int64_t)(rand_r(&seed) % 4000);
        em_tensor *t = em_empty(1, &n, EM_F32, em_cpu());
        if (!t)
            return (void *)1;
        if (i % 3 == 0 && em_tensor_set_category(t, EM_MEM_WORKSPACE) != EM_OK)
            return (void *)1;
        em_tensor_release(t);
    }
    return NULL;
}

Test(alloc, concurrent_alloc_and_release_keep_the_books) {
    em_memory_stats s0 = cpu_stats();
    pthread_t th[4];
    for (uintptr_t i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, churn, (void *)(i + 1)), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        cr_expect_null(r, "thread %d failed: %s", i, em_last_error());
    }
    em_memory_stats s1 = cpu_stats();
    for (int c = 0; c < EM_MEM_CACHED; c++) {
        cr_expect_eq(s1.current[c], s0.current[c], "%s", em_mem_category_name(c));
        cr_expect_eq(s1.count[c], s0.count[c], "%s", em_mem_category_name(c));
    }
    cr_assert_eq(s1.cache_hits + s1.device_allocs - s0.cache_hits - s0.device_allocs, 1200u,
                 "every allocation is a hit or a miss");
    assert_reserved_adds_up(&s1);
}

/* ---- device out of memory ------------------------------------------------------------------- */

/* A host allocator with a byte budget: each block carries its size in a header. */
static struct {
    size_t live, budget;
} g_budget;

static void *budget_alloc(size_t n, size_t align, void *user) {
    (void)user;
    size_t hdr = align < 16 ? 16 : align;
    if (g_budget.live + n > g_budget.budget)
        return NULL;
    void *base = NULL;
    if (posix_memalign(&base, align < 16 ? 16 : align, hdr + n) != 0)
        return NULL;
    char *p = (char *)base + hdr;
    ((size_t *)p)[-1] = n;
    ((size_t *)p)[-2] = hdr;
    g_budget.live += n;
    return p;
}

static void budget_free(void *ptr, void *user) {
    (void)user;
    char *p = ptr;
    g_budget.live -= ((size_t *)p)[-1];
    free(p - ((size_t *)p)[-2]);
}

static void budget_setup(void) {
    g_budget.live = 0;
    g_budget.budget = SIZE_MAX / 2;
    em_host_allocator_set(&(em_host_allocator){budget_alloc, budget_free, NULL});
    setup();
}

/* The test body shuts down itself to check that nothing stays allocated; this is a no-op
 * then, and cleans up when the body stopped early. */
static void budget_teardown(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    em_host_allocator_set(NULL);
}

/* Its own suite: Criterion runs a suite's fixtures as well as a test's, and this allocator
 * must be installed before em_init(). */
TestSuite(alloc_budget, .init = budget_setup, .fini = budget_teardown);

Test(alloc_budget, device_oom_empties_the_cache_retries_and_then_names_the_holders) {
    em_tensor *w = tensor_in(1, (int64_t[]){(int64_t)MiB}, EM_MEM_PARAMETER); /* 4 MiB */
    em_tensor_release(tensor_in(1, (int64_t[]){3 * (int64_t)MiB / 2}, EM_MEM_ACTIVATION));
    /* 4 MiB parameter + 6 MiB cached are live; allow 12 MiB more than that minus the cache:
     * an 8 MiB request fits only once the cache has been handed back. */
    em_memory_stats s0 = cpu_stats();
    cr_assert_eq(s0.current[EM_MEM_CACHED], 6 * MiB);
    g_budget.budget = g_budget.live - 6 * MiB + 8 * MiB + 64 * KiB;

    em_tensor *big = tensor_in(1, (int64_t[]){2 * (int64_t)MiB}, EM_MEM_ACTIVATION);
    em_memory_stats s1 = cpu_stats();
    cr_assert_eq(s1.current[EM_MEM_CACHED], 0u, "the cache was emptied to make room");
    cr_assert_eq(s1.current[EM_MEM_ACTIVATION] - s0.current[EM_MEM_ACTIVATION], 8 * MiB);
    assert_reserved_adds_up(&s1);
    em_tensor_release(big); /* 8 MiB cached */

    /* 20 MiB cannot fit even with the cache emptied. */
    em_clear_error();
    em_tensor *huge = em_empty(1, (int64_t[]){5 * (int64_t)MiB}, EM_F32, em_cpu());
    cr_assert_null(huge);
    cr_assert_eq(em_last_status(), EM_ERR_NOMEM);
    const char *msg = em_last_error();
    cr_expect_not_null(strstr(msg, "out of memory on cpu"), "%s", msg);
    cr_expect_not_null(strstr(msg, "tried to allocate 20.0 MiB"), "%s", msg);
    cr_expect_not_null(strstr(msg, "parameter 4.0 MiB"), "%s", msg);
    cr_expect_not_null(strstr(msg, "8.0 MiB cached"), "%s", msg);
    em_memory_stats s2 = cpu_stats();
    cr_assert_eq(s2.current[EM_MEM_CACHED], 0u);
    cr_assert_eq(s2.current[EM_MEM_PARAMETER], 4 * MiB);
    assert_reserved_adds_up(&s2);
    /* what is reserved (all of it in use: nothing is fragmented once the cache is returned),
     * the peak, and what to do */
    char want[160];
    snprintf(want, sizeof want, "%.1f MiB reserved from the device (peak %.1f MiB), of which "
             "0 B is fragmented", (double)s2.reserved / MiB, (double)s2.peak_reserved / MiB);
    cr_expect_not_null(strstr(msg, want), "no '%s' in: %s", want, msg);
    cr_expect_not_null(strstr(msg, "the device reports "), "%s", msg);
    cr_expect_not_null(strstr(msg, "em_empty_cache()"), "%s", msg);
    cr_expect_not_null(strstr(msg, "smaller batch"), "%s", msg);

    /* The host allocator itself reports the same way. */
    cr_assert_null(em_host_alloc(64 * MiB, 64));
    cr_assert_eq(em_last_status(), EM_ERR_NOMEM);
    cr_expect_not_null(strstr(em_last_error(), "out of memory allocating 67108864 bytes"), "%s",
                       em_last_error());

    g_budget.budget = SIZE_MAX / 2;
    em_tensor_release(w);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    cr_assert_eq(g_budget.live, 0u, "%zu host bytes still allocated after em_shutdown",
                 g_budget.live);
}

/* ---- CPU blocks on huge-page chunks (plugins/backend-cpu/cpu.c, "Tensor memory on
 * transparent huge pages") --------------------------------------------------------------- */

/* A host allocator that counts what it holds, honouring the alignment (align_ok) or not. */
static struct {
    pthread_mutex_t lock;
    long live;
    bool align_ok;
} g_hp = {PTHREAD_MUTEX_INITIALIZER, 0, true};

static void *hp_alloc(size_t n, size_t align, void *user) {
    (void)user;
    void *p = NULL;
    if (g_hp.align_ok) {
        if (posix_memalign(&p, align, n) != 0) return NULL;
    } else {
        /* 64-byte aligned, never on a 2 MiB boundary, whatever was asked */
        char *q = NULL;
        if (posix_memalign((void **)&q, 64, n + 128) != 0) return NULL;
        p = q + ((uintptr_t)(q + 64) % (2 * MiB) ? 64 : 128);
        ((void **)p)[-1] = q;
    }
    pthread_mutex_lock(&g_hp.lock);
    g_hp.live++;
    pthread_mutex_unlock(&g_hp.lock);
    return p;
}

static void hp_free(void *p, void *user) {
    (void)user;
    if (!p) return;
    pthread_mutex_lock(&g_hp.lock);
    g_hp.live--;
    pthread_mutex_unlock(&g_hp.lock);
    free(g_hp.align_ok ? p : ((void **)p)[-1]);
}

/* Tensors on both sides of the 64 KiB and 1 MiB thresholds, each filled with its own index:
 * none overlaps another, each is 64-byte aligned, a block of 64 KiB..1 MiB never crosses a
 * 2 MiB boundary and a larger one starts on one (when the host allocator aligns), and once
 * they are released and the cache emptied the host allocator holds nothing more than before. */
static void hp_blocks_check(bool align_ok) {
    g_hp.align_ok = align_ok;
    g_hp.live = 0;
    em_host_allocator_set(&(em_host_allocator){hp_alloc, hp_free, NULL});
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    int64_t one = 1; /* the first tensor makes what the library keeps for itself */
    em_tensor_release(em_empty(1, &one, EM_F32, em_cpu()));
    em_empty_cache();
    long live0 = g_hp.live;
    static const int64_t sizes[] = {60 * 256, 64 * 256, 300 * 256, 300 * 256, 700 * 256,
                                    256 * 1024, 256 * 1024 + 1, 3 * 256 * 1024, 40 * 256};
    enum { NS = sizeof sizes / sizeof sizes[0], REP = 7 };
    em_tensor *t[NS * REP];
    for (int i = 0; i < NS * REP; i++) {
        int64_t n = sizes[i % NS];
        t[i] = em_empty(1, &n, EM_F32, em_cpu());
        cr_assert_not_null(t[i], "%s", em_last_error());
        float *d = em_tensor_data(t[i]);
        cr_assert_eq((uintptr_t)d % 64, 0, "tensor %d of %lld floats at %p", i, (long long)n,
                     (void *)d);
        size_t bytes = (size_t)n * 4;
        if (align_ok && bytes >= 64 * KiB && bytes <= MiB)
            cr_assert_eq((uintptr_t)d / (2 * MiB), ((uintptr_t)d + bytes - 1) / (2 * MiB),
                         "a %zu-byte block crosses a 2 MiB boundary", bytes);
        if (align_ok && bytes > MiB)
            cr_assert_eq((uintptr_t)d % (2 * MiB), 0, "a %zu-byte block at %p", bytes, (void *)d);
        for (int64_t j = 0; j < n; j++) d[j] = (float)i;
    }
    for (int i = 0; i < NS * REP; i++) {
        const float *d = em_tensor_data(t[i]);
        for (int64_t j = 0; j < sizes[i % NS]; j++)
            if (d[j] != (float)i)
                cr_assert_fail("tensor %d element %lld holds %g: blocks overlap", i,
                               (long long)j, (double)d[j]);
    }
    /* every other one first, then the rest: chunks empty in another order than they filled */
    for (int i = 0; i < NS * REP; i += 2) em_tensor_release(t[i]);
    em_empty_cache();
    for (int i = 1; i < NS * REP; i += 2) em_tensor_release(t[i]);
    em_empty_cache();
    cr_assert_eq(g_hp.live, live0, "host blocks held: %ld after, %ld before", g_hp.live, live0);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    cr_assert_eq(g_hp.live, 0, "%ld host blocks leaked", g_hp.live);
    em_host_allocator_set(NULL);
}

Test(alloc_hugepages, cpu_blocks_do_not_overlap_and_chunks_are_returned) { hp_blocks_check(true); }

Test(alloc_hugepages, an_allocator_ignoring_the_alignment_gets_plain_blocks) {
    hp_blocks_check(false);
}

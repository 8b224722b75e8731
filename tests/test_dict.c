/*
 * test_dict.c — the ordered tensor dictionary (ember/dict.h): order, replacement, lookups,
 * growth to 10k keys, bad keys, reference counting (seen through em_tensor_wrap's release
 * callback, which runs exactly when the last tensor over the memory goes away), and
 * out-of-memory: a host allocator that fails the Nth allocation must leave the dict unchanged
 * and leak nothing.
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

/* ---- a counting host allocator, installed before em_init() ------------------------------- */

static struct {
    atomic_long calls; /* alloc calls since arming */
    atomic_long live;  /* allocations not yet freed */
    long fail_at;      /* 1-based call to refuse; 0 = never */
} g_alloc;

static void *counting_alloc(size_t n, size_t align, void *user) {
    (void)user;
    long call = atomic_fetch_add(&g_alloc.calls, 1) + 1;
    if (g_alloc.fail_at && call == g_alloc.fail_at)
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : 1) != 0)
        return NULL;
    atomic_fetch_add(&g_alloc.live, 1);
    return p;
}

static void counting_free(void *p, void *user) {
    (void)user;
    if (!p)
        return;
    atomic_fetch_sub(&g_alloc.live, 1);
    free(p);
}

static void arm(long fail_at) {
    atomic_store(&g_alloc.calls, 0);
    g_alloc.fail_at = fail_at;
}

static void setup(void) {
    atomic_store(&g_alloc.live, 0);
    arm(0);
    em_host_allocator_set(&(em_host_allocator){counting_alloc, counting_free, NULL});
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
}

static void teardown(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    em_host_allocator_set(NULL);
}

TestSuite(dict, .init = setup, .fini = teardown);

/* ---- helpers ------------------------------------------------------------------------------ */

/* A 1-element f32 tensor holding v. */
static em_tensor *scalar_tensor(float v) {
    em_tensor *t = em_from_data(&v, 1, (const int64_t[]){1}, EM_F32, em_cpu());
    cr_assert_not_null(t, "em_from_data: %s", em_last_error());
    return t;
}

/* The first element of a 1- or 2-element f32 tensor. */
static float value_of(const em_tensor *t) {
    float v[2] = {0, 0};
    cr_assert_not_null(t);
    cr_assert_leq(em_tensor_numel(t), 2);
    cr_assert_eq(em_tensor_to_host(t, v, em_tensor_nbytes(t)), EM_OK, "%s", em_last_error());
    return v[0];
}

/* A tensor over caller memory whose release callback counts into *released. */
typedef struct watched {
    float data[2];
    int released;
} watched;

static void on_release(void *data, void *user) {
    (void)data;
    ((watched *)user)->released++;
}

static em_tensor *watched_tensor(watched *w, float v) {
    w->data[0] = v;
    w->data[1] = -v;
    w->released = 0;
    em_tensor *t = em_tensor_wrap(w->data, 1, (const int64_t[]){2}, NULL, EM_F32, em_cpu(),
                                  on_release, w);
    cr_assert_not_null(t, "em_tensor_wrap: %s", em_last_error());
    return t;
}

/* ---- order, replace, lookups -------------------------------------------------------------- */

Test(dict, insertion_order_and_lookups) {
    em_dict *d = em_dict_new();
    cr_assert_not_null(d);
    cr_assert_eq(em_dict_len(d), 0);
    const char *keys[] = {"zeta", "alpha", "0.weight", "0.bias", "m"};
    for (int i = 0; i < 5; i++) {
        em_tensor *t = scalar_tensor((float)i);
        cr_assert_eq(em_dict_set(d, keys[i], t), EM_OK, "%s", em_last_error());
        em_tensor_release(t);
    }
    cr_assert_eq(em_dict_len(d), 5);
    for (size_t i = 0; i < 5; i++) {
        cr_assert_str_eq(em_dict_key(d, i), keys[i]);
        cr_assert_eq(value_of(em_dict_value(d, i)), (float)i);
        cr_assert(em_dict_has(d, keys[i]));
        cr_assert_eq(em_dict_get(d, keys[i]), em_dict_value(d, i));
    }
    cr_assert_null(em_dict_key(d, 5));
    cr_assert_null(em_dict_value(d, 5));
    em_clear_error();
    cr_assert_null(em_dict_get(d, "missing"));
    cr_assert_eq(em_last_status(), EM_OK, "a missing key sets no error");
    cr_assert_not(em_dict_has(d, "missing"));
    cr_assert_not(em_dict_has(d, "0.weigh"), "prefixes do not match");
    em_dict_free(d);
}

Test(dict, key_is_copied) {
    em_dict *d = em_dict_new();
    char key[16] = "layer.w";
    em_tensor *t = scalar_tensor(3.f);
    cr_assert_eq(em_dict_set(d, key, t), EM_OK);
    strcpy(key, "changed");
    cr_assert(em_dict_has(d, "layer.w"));
    cr_assert_not(em_dict_has(d, "changed"));
    cr_assert_str_eq(em_dict_key(d, 0), "layer.w");
    em_tensor_release(t);
    em_dict_free(d);
}

Test(dict, replace_keeps_position) {
    em_dict *d = em_dict_new();
    watched w_old, w_new;
    em_tensor *a = scalar_tensor(1.f), *old = watched_tensor(&w_old, 2.f), *c = scalar_tensor(3.f);
    cr_assert_eq(em_dict_set(d, "a", a), EM_OK);
    cr_assert_eq(em_dict_set(d, "b", old), EM_OK);
    cr_assert_eq(em_dict_set(d, "c", c), EM_OK);
    em_tensor_release(old);
    cr_assert_eq(w_old.released, 0, "the dict keeps its reference");

    em_tensor *repl = watched_tensor(&w_new, 20.f);
    cr_assert_eq(em_dict_set(d, "b", repl), EM_OK);
    cr_assert_eq(w_old.released, 1, "replacing releases the old tensor");
    cr_assert_eq(em_dict_len(d), 3);
    cr_assert_str_eq(em_dict_key(d, 0), "a");
    cr_assert_str_eq(em_dict_key(d, 1), "b");
    cr_assert_str_eq(em_dict_key(d, 2), "c");
    cr_assert_eq(em_dict_get(d, "b"), repl);
    cr_assert_eq(value_of(em_dict_value(d, 1)), 20.f);

    /* Setting the same tensor again keeps it alive (retain before release). */
    cr_assert_eq(em_dict_set(d, "b", repl), EM_OK);
    em_tensor_release(repl);
    cr_assert_eq(w_new.released, 0);
    cr_assert_eq(value_of(em_dict_get(d, "b")), 20.f);

    em_tensor_release(a);
    em_tensor_release(c);
    em_dict_free(d);
    cr_assert_eq(w_new.released, 1, "em_dict_free releases what the dict holds");
}

Test(dict, remove_keeps_order) {
    em_dict *d = em_dict_new();
    watched w;
    const char *keys[] = {"k0", "k1", "k2", "k3"};
    for (int i = 0; i < 4; i++) {
        em_tensor *t = i == 2 ? watched_tensor(&w, 2.f) : scalar_tensor((float)i);
        cr_assert_eq(em_dict_set(d, keys[i], t), EM_OK);
        em_tensor_release(t);
    }
    cr_assert_eq(em_dict_remove(d, "k2"), EM_OK, "%s", em_last_error());
    cr_assert_eq(w.released, 1, "remove releases the tensor");
    cr_assert_eq(em_dict_len(d), 3);
    cr_assert_str_eq(em_dict_key(d, 0), "k0");
    cr_assert_str_eq(em_dict_key(d, 1), "k1");
    cr_assert_str_eq(em_dict_key(d, 2), "k3");
    cr_assert_eq(value_of(em_dict_get(d, "k3")), 3.f);
    cr_assert_not(em_dict_has(d, "k2"));

    cr_assert_eq(em_dict_remove(d, "k2"), EM_ERR_NOTFOUND);
    cr_assert_not_null(strstr(em_last_error(), "k2"), "%s", em_last_error());

    /* Re-inserting appends at the end. */
    em_tensor *t = scalar_tensor(22.f);
    cr_assert_eq(em_dict_set(d, "k2", t), EM_OK);
    em_tensor_release(t);
    cr_assert_str_eq(em_dict_key(d, 3), "k2");
    cr_assert_eq(value_of(em_dict_get(d, "k2")), 22.f);

    cr_assert_eq(em_dict_remove(d, "k0"), EM_OK);
    cr_assert_str_eq(em_dict_key(d, 0), "k1");
    cr_assert_eq(value_of(em_dict_get(d, "k1")), 1.f);
    em_dict_free(d);
}

Test(dict, ten_thousand_keys) {
    enum { N = 10000 };
    em_dict *d = em_dict_new();
    em_tensor *shared = scalar_tensor(0.f);
    em_tensor *odd = scalar_tensor(1.f);
    char key[32];
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "layers.%d.weight", i);
        cr_assert_eq(em_dict_set(d, key, i % 2 ? odd : shared), EM_OK, "%s", em_last_error());
    }
    cr_assert_eq(em_dict_len(d), N);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "layers.%d.weight", i);
        cr_assert_str_eq(em_dict_key(d, (size_t)i), key);
        cr_assert_eq(em_dict_get(d, key), i % 2 ? odd : shared, "key %s", key);
    }
    /* Remove every third key; the rest keep their order and are still found. */
    for (int i = 0; i < N; i += 3) {
        snprintf(key, sizeof key, "layers.%d.weight", i);
        cr_assert_eq(em_dict_remove(d, key), EM_OK, "%s", em_last_error());
    }
    size_t pos = 0;
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "layers.%d.weight", i);
        if (i % 3 == 0) {
            cr_assert_not(em_dict_has(d, key), "%s was removed", key);
            continue;
        }
        cr_assert_str_eq(em_dict_key(d, pos), key);
        cr_assert_eq(em_dict_get(d, key), i % 2 ? odd : shared);
        pos++;
    }
    cr_assert_eq(em_dict_len(d), pos);
    em_tensor_release(shared);
    em_tensor_release(odd);
    em_dict_free(d);
}

/* ---- references --------------------------------------------------------------------------- */

Test(dict, holds_its_own_reference) {
    watched w;
    em_dict *d = em_dict_new();
    em_tensor *t = watched_tensor(&w, 5.f);
    cr_assert_eq(em_dict_set(d, "w", t), EM_OK);
    em_tensor_release(t);
    cr_assert_eq(w.released, 0, "the dict's reference keeps the tensor alive");
    em_tensor *got = em_dict_get(d, "w");
    float v[2];
    cr_assert_eq(em_tensor_to_host(got, v, sizeof v), EM_OK, "%s", em_last_error());
    cr_assert(v[0] == 5.f && v[1] == -5.f);
    em_dict_free(d);
    cr_assert_eq(w.released, 1, "em_dict_free released the last reference");
}

Test(dict, free_null_is_noop) {
    em_dict_free(NULL);
    cr_assert_eq(em_dict_len(NULL), 0);
    cr_assert_null(em_dict_key(NULL, 0));
}

/* ---- bad arguments ------------------------------------------------------------------------ */

Test(dict, bad_keys_and_tensors) {
    em_dict *d = em_dict_new();
    em_tensor *t = scalar_tensor(1.f);

    cr_assert_eq(em_dict_set(d, NULL, t), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "key is NULL"), "%s", em_last_error());
    cr_assert_eq(em_dict_set(d, "", t), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "key is empty"), "%s", em_last_error());
    cr_assert_eq(em_dict_set(d, "w", NULL), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "'w'"), "%s", em_last_error());
    cr_assert_not_null(strstr(em_last_error(), "NULL"), "%s", em_last_error());
    cr_assert_eq(em_dict_set(NULL, "w", t), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "dict is NULL"), "%s", em_last_error());
    cr_assert_eq(em_dict_len(d), 0, "nothing was inserted");

    cr_assert_eq(em_dict_remove(d, NULL), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "key is NULL"), "%s", em_last_error());
    cr_assert_eq(em_dict_remove(d, ""), EM_ERR_INVALID);
    cr_assert_not_null(strstr(em_last_error(), "key is empty"), "%s", em_last_error());
    cr_assert_eq(em_dict_remove(d, "absent"), EM_ERR_NOTFOUND);
    cr_assert_not_null(strstr(em_last_error(), "'absent'"), "%s", em_last_error());

    cr_assert_null(em_dict_get(d, NULL));
    cr_assert_not(em_dict_has(d, NULL));
    cr_assert_null(em_dict_get(NULL, "w"));
    em_tensor_release(t);
    em_dict_free(d);
}

/* ---- out of memory ------------------------------------------------------------------------ */

/* A dict with n keys "k0".."k{n-1}" holding t. */
static em_dict *dict_with(int n, em_tensor *t) {
    em_dict *d = em_dict_new();
    cr_assert_not_null(d);
    char key[16];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "k%d", i);
        cr_assert_eq(em_dict_set(d, key, t), EM_OK, "%s", em_last_error());
    }
    return d;
}

/* Keys "k0".."k{n-1}" are the first n entries, in order, all holding t. */
static void expect_first_keys(const em_dict *d, int n, em_tensor *t, long fail_at) {
    char key[16];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "k%d", i);
        cr_assert_str_eq(em_dict_key(d, (size_t)i), key, "fail_at=%ld", fail_at);
        cr_assert_eq(em_dict_get(d, key), t, "fail_at=%ld: %s lost", fail_at, key);
    }
}

/* Insert "new.key" into a dict of n keys with allocation N failing, N = 1, 2, ... until the
 * insertion succeeds. Returns the number of failed attempts. */
static long sweep_insert(int n) {
    watched w;
    em_tensor *t = scalar_tensor(1.f), *nt = watched_tensor(&w, 9.f);
    long baseline = atomic_load(&g_alloc.live);
    long fails = 0;
    for (long fail_at = 1;; fail_at++) {
        em_dict *d = dict_with(n, t);
        arm(fail_at);
        em_status st = em_dict_set(d, "new.key", nt);
        arm(0);
        if (st == EM_OK) {
            cr_assert_eq(em_dict_len(d), (size_t)n + 1);
            cr_assert_str_eq(em_dict_key(d, (size_t)n), "new.key");
            cr_assert_eq(em_dict_get(d, "new.key"), nt);
            expect_first_keys(d, n, t, fail_at);
        } else {
            cr_assert_eq(st, EM_ERR_NOMEM, "fail_at=%ld: %s", fail_at, em_status_name(st));
            cr_assert_not_null(strstr(em_last_error(), "out of memory"), "%s", em_last_error());
            cr_assert_eq(em_dict_len(d), (size_t)n, "fail_at=%ld: length changed", fail_at);
            expect_first_keys(d, n, t, fail_at);
            cr_assert_not(em_dict_has(d, "new.key"), "fail_at=%ld: half-inserted", fail_at);
            fails++;
        }
        em_dict_free(d);
        cr_assert_eq(atomic_load(&g_alloc.live), baseline, "fail_at=%ld (n=%d): %ld leaked",
                     fail_at, n, atomic_load(&g_alloc.live) - baseline);
        if (st == EM_OK)
            break;
        cr_assert_lt(fail_at, 100, "em_dict_set never succeeded");
    }
    em_tensor_release(t);
    em_tensor_release(nt);
    cr_assert_eq(w.released, 1, "the new tensor's references were all dropped");
    return fails;
}

Test(dict, oom_leaves_dict_unchanged) {
    /* n = 0: first insertion allocates the key, the entry array and the index;
     * n = 7: the index grows; n = 8: the entry array grows; n = 3: only the key copy. */
    cr_assert_eq(sweep_insert(0), 3, "key, entries and index are three allocations");
    cr_assert_eq(sweep_insert(3), 1);
    cr_assert_eq(sweep_insert(7), 2);
    cr_assert_eq(sweep_insert(8), 2);
    cr_assert_geq(sweep_insert(64), 1);
}

Test(dict, oom_in_dict_new) {
    long baseline = atomic_load(&g_alloc.live);
    arm(1);
    em_dict *d = em_dict_new();
    arm(0);
    cr_assert_null(d);
    cr_assert_eq(em_last_status(), EM_ERR_NOMEM);
    cr_assert_not_null(strstr(em_last_error(), "dict"), "%s", em_last_error());
    cr_assert_eq(atomic_load(&g_alloc.live), baseline);
}

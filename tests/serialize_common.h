/*
 * serialize_common.h — helpers shared by the safetensors tests (test_serialize*.c): a scratch
 * directory per test, reading and writing whole files, tensors' bytes, and the testdev suite
 * set-up.
 */
#ifndef EMBER_TESTS_SERIALIZE_COMMON_H
#define EMBER_TESTS_SERIALIZE_COMMON_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define ST_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* A fresh directory under $TMPDIR (or /tmp) into buf. */
static inline void st_mkdtemp(char *buf, size_t cap) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/ember-st-XXXXXX", t && *t ? t : "/tmp");
    cr_assert(mkdtemp(buf), "mkdtemp %s failed", buf);
}

/* Remove a directory and the files in it (one level: the tests make no subdirectories). */
static inline void st_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[4096 + 512];
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Number of entries of dir whose name contains `needle`. */
static inline int st_count_files(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    cr_assert(d, "opendir %s", dir);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strstr(de->d_name, needle))
            n++;
    closedir(d);
    return n;
}

/* A whole file into a malloc'ed buffer (the caller frees). */
static inline unsigned char *st_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static inline void st_write_file(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s", path);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

/* A tensor's C-order bytes, copied to the host (malloc'ed; the caller frees). */
static inline unsigned char *st_bytes(const em_tensor *t, size_t *n) {
    *n = em_tensor_nbytes(t);
    unsigned char *buf = malloc(*n ? *n : 1);
    cr_assert_eq(em_tensor_to_host(t, buf, *n), EM_OK, "to_host: %s", em_last_error());
    return buf;
}

/* Two tensors with the same dtype, shape and bytes (bitwise: NaN payloads and -0.0 count). */
static inline void st_assert_same(const em_tensor *a, const em_tensor *b, const char *what) {
    cr_assert(a && b, "%s: missing tensor", what);
    cr_assert_eq(em_tensor_dtype(a), em_tensor_dtype(b), "%s: dtype %s vs %s", what,
                 em_dtype_name(em_tensor_dtype(a)), em_dtype_name(em_tensor_dtype(b)));
    cr_assert_eq(em_tensor_ndim(a), em_tensor_ndim(b), "%s: ndim", what);
    for (int i = 0; i < em_tensor_ndim(a); i++)
        cr_assert_eq(em_tensor_shape(a)[i], em_tensor_shape(b)[i], "%s: dim %d", what, i);
    size_t na, nb;
    unsigned char *x = st_bytes(a, &na), *y = st_bytes(b, &nb);
    cr_assert_eq(na, nb, "%s: nbytes", what);
    cr_assert(memcmp(x, y, na) == 0, "%s: bytes differ", what);
    free(x);
    free(y);
}

/* Two dicts with the same keys in the same order and the same tensors. */
static inline void st_assert_dicts_equal(const em_dict *a, const em_dict *b) {
    cr_assert_eq(em_dict_len(a), em_dict_len(b), "dict sizes %zu vs %zu", em_dict_len(a),
                 em_dict_len(b));
    for (size_t i = 0; i < em_dict_len(a); i++) {
        cr_assert_str_eq(em_dict_key(a, i), em_dict_key(b, i));
        st_assert_same(em_dict_value(a, i), em_dict_value(b, i), em_dict_key(a, i));
    }
}

/* The same check without asserting (for forked children, which report through a pipe). */
static inline bool st_dicts_equal(const em_dict *a, const em_dict *b) {
    if (em_dict_len(a) != em_dict_len(b)) return false;
    bool ok = true;
    for (size_t i = 0; ok && i < em_dict_len(a); i++) {
        const em_tensor *x = em_dict_value(a, i), *y = em_dict_value(b, i);
        if (strcmp(em_dict_key(a, i), em_dict_key(b, i)) || em_tensor_dtype(x) != em_tensor_dtype(y) ||
            em_tensor_ndim(x) != em_tensor_ndim(y) || em_tensor_nbytes(x) != em_tensor_nbytes(y))
            return false;
        for (int d = 0; d < em_tensor_ndim(x); d++)
            if (em_tensor_shape(x)[d] != em_tensor_shape(y)[d]) return false;
        size_t n = em_tensor_nbytes(x);
        unsigned char *p = malloc(n ? n : 1), *q = malloc(n ? n : 1);
        ok = em_tensor_to_host(x, p, n) == EM_OK && em_tensor_to_host(y, q, n) == EM_OK &&
             memcmp(p, q, n) == 0;
        free(p);
        free(q);
    }
    return ok;
}

/* Load the testdev plugin (a second device type with its own address space) before em_init. */
static inline void st_setup_testdev(void) {
    const char *dir = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert_not_null(dir, "EMBER_TEST_PLUGIN_DIR is not set (make check sets it)");
    char path[4096];
    snprintf(path, sizeof path, "%s/testdev.so", dir);
    cr_assert_eq(em_plugin_load(path), EM_OK, "%s", em_last_error());
    em_test_setup();
}

#endif /* EMBER_TESTS_SERIALIZE_COMMON_H */

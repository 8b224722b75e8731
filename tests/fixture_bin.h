/*
 * fixture_bin.h — reading binary tensor fixtures written by PyTorch scripts in tests/fixtures
 * (gen_autograd.py, gen_train.py), and comparing Ember's tensors with them elementwise.
 *
 * A fixture directory (tests/fixtures/<dir>/) holds raw little-endian f32 / i64 files and an
 * index.txt with one line per tensor:  NAME FILE DTYPE OFFSET NDIM DIM...  ('#' lines are
 * comments). fx_open reads the index; a binary file is read the first time one of its tensors
 * is asked for. Every failure is a Criterion assertion naming the file, line or tensor.
 *
 * Used by one translation unit per test program: everything here is static.
 */
#ifndef EMBER_TESTS_FIXTURE_BIN_H
#define EMBER_TESTS_FIXTURE_BIN_H

#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h> /* close, unlink (fx_state_dicts) */

#ifndef EM_TEST_FIXTURES
#error "EM_TEST_FIXTURES must name the tests/fixtures directory"
#endif

typedef struct fx_entry {
    char name[96], file[32];
    bool i64;
    long offset;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t numel;
} fx_entry;

typedef struct fx_file {
    char name[32];
    unsigned char *bytes;
    size_t len;
} fx_file;

typedef struct fixtures {
    char dir[64];   /* under EM_TEST_FIXTURES, e.g. "autograd" */
    char gen[64];   /* the script that writes it, for messages */
    fx_entry *e;
    int n, cap;
    fx_file f[8];
    int nf;
} fixtures;

static const fx_file *fx_bytes(fixtures *fx, const char file[32]) {
    for (int i = 0; i < fx->nf; i++)
        if (strcmp(fx->f[i].name, file) == 0) return &fx->f[i];
    cr_assert_lt(fx->nf, 8, "too many fixture files");
    fx_file *b = &fx->f[fx->nf++];
    memcpy(b->name, file, sizeof b->name); /* fx_entry.file: the same size, NUL-terminated */
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", EM_TEST_FIXTURES, fx->dir, file);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s: %s (run tests/fixtures/%s)", path, strerror(errno), fx->gen);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    cr_assert_gt(len, 0, "%s is empty", path);
    rewind(f);
    b->bytes = malloc((size_t)len);
    b->len = (size_t)len;
    cr_assert_eq(fread(b->bytes, 1, b->len, f), b->len, "short read of %s", path);
    fclose(f);
    return b;
}

/* Reads <dir>/index.txt (the binary files are read when first used); gen names the script
 * that writes the directory. Free with fx_close. */
static fixtures *fx_open(const char *dir, const char *gen) {
    fixtures *fx = calloc(1, sizeof *fx);
    snprintf(fx->dir, sizeof fx->dir, "%s", dir);
    snprintf(fx->gen, sizeof fx->gen, "%s", gen);
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/%s/index.txt", EM_TEST_FIXTURES, dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s: %s (run tests/fixtures/%s)", path, strerror(errno), gen);
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (fx->n == fx->cap) {
            fx->cap = fx->cap ? 2 * fx->cap : 64;
            fx->e = realloc(fx->e, sizeof *fx->e * (size_t)fx->cap);
            cr_assert(fx->e, "out of memory reading %s", path);
        }
        fx_entry *e = &fx->e[fx->n++];
        memset(e, 0, sizeof *e);
        char dt[8];
        int used = 0;
        cr_assert_eq(sscanf(line, "%95s %31s %7s %ld %d%n", e->name, e->file, dt, &e->offset,
                            &e->ndim, &used),
                     5, "%s:%d: malformed line", path, lineno);
        cr_assert(strcmp(dt, "f32") == 0 || strcmp(dt, "i64") == 0, "%s:%d: dtype %s", path,
                  lineno, dt);
        e->i64 = dt[0] == 'i';
        cr_assert(e->ndim >= 0 && e->ndim <= EM_MAX_DIMS, "%s:%d: ndim %d", path, lineno,
                  e->ndim);
        e->numel = 1;
        const char *p = line + used;
        for (int i = 0; i < e->ndim; i++) {
            int k = 0;
            long long s;
            cr_assert_eq(sscanf(p, "%lld%n", &s, &k), 1, "%s:%d: dim %d", path, lineno, i);
            p += k;
            e->shape[i] = s;
            e->numel *= s;
        }
    }
    fclose(f);
    cr_assert_gt(fx->n, 0, "%s has no entries", path);
    return fx;
}

static void fx_close(fixtures *fx) {
    for (int i = 0; i < fx->nf; i++) free(fx->f[i].bytes);
    free(fx->e);
    free(fx);
}

/* The entry `name`, or NULL when index.txt lacks it. */
static const fx_entry *fx_lookup(const fixtures *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (strcmp(fx->e[i].name, name) == 0) return &fx->e[i];
    return NULL;
}

static const fx_entry *fx_find(const fixtures *fx, const char *name) {
    const fx_entry *e = fx_lookup(fx, name);
    cr_assert(e, "fixture %s is not in %s/index.txt", name, fx->dir);
    return e;
}

/* Tensor `name` as a new reference (in the innermost scope, if one is open), decoded from
 * little-endian bytes whatever the host's order. */
static em_tensor *fx_tensor(fixtures *fx, const char *name) {
    const fx_entry *e = fx_find(fx, name);
    const fx_file *b = fx_bytes(fx, e->file);
    size_t w = e->i64 ? 8 : 4;
    cr_assert_leq((size_t)e->offset + w * (size_t)e->numel, b->len, "%s overruns %s", name,
                  e->file);
    const unsigned char *src = b->bytes + e->offset;
    void *buf = malloc(w * (size_t)(e->numel ? e->numel : 1));
    for (int64_t i = 0; i < e->numel; i++) {
        uint64_t u = 0;
        for (size_t k = 0; k < w; k++) u |= (uint64_t)src[i * (int64_t)w + (int64_t)k] << (8 * k);
        if (e->i64) {
            ((int64_t *)buf)[i] = (int64_t)u;
        } else {
            uint32_t u32 = (uint32_t)u;
            memcpy((float *)buf + i, &u32, 4);
        }
    }
    em_tensor *t = em_from_data(buf, e->ndim, e->shape, e->i64 ? EM_I64 : EM_F32, em_cpu());
    free(buf);
    cr_assert(t, "em_from_data(%s): %s", name, em_last_error());
    return t;
}

/* ---- comparison ----------------------------------------------------------------------------- */

/* t's values as a new malloc'd array of doubles. */
static double *fx_host_f64(const em_tensor *t) {
    int64_t n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_scope_begin();
    em_tensor *c = em_to_dtype(t, EM_F64);
    cr_assert(c, "%s", em_last_error());
    cr_assert_eq(em_tensor_to_host(c, v, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    em_scope_end();
    return v;
}

/* allclose(got, want, rtol, atol): |got - want| <= atol + rtol |want| for every element of n
 * (NaN never passes). On failure writes the worst element (the largest excess over its
 * tolerance) into msg and returns false. *ratio (may be NULL) receives the largest
 * |got - want| / (atol + rtol |want|) over the elements: how much of the tolerance is used. */
static bool fx_close_all(const char *what, const double *got, const double *want, int64_t n,
                         double rtol, double atol, char *msg, size_t cap, double *ratio) {
    int64_t worst = -1;
    double excess = 0, maxabs = 0, maxratio = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]), tol = atol + rtol * fabs(want[i]);
        if (!(d <= tol)) {
            double x = isnan(d) ? INFINITY : d - tol;
            if (worst < 0 || x > excess) worst = i, excess = x;
        }
        if (d > maxabs || isnan(d)) maxabs = d;
        double r = isnan(d) ? INFINITY : d / tol;
        if (r > maxratio) maxratio = r;
    }
    if (ratio) *ratio = maxratio;
    if (worst < 0) return true;
    snprintf(msg, cap,
             "%s: element %lld of %lld: Ember %.9g, PyTorch %.9g, |diff| %.3g > atol %g + rtol "
             "%g * |PyTorch| (largest |diff| %.3g)",
             what, (long long)worst, (long long)n, got[worst], want[worst],
             fabs(got[worst] - want[worst]), atol, rtol, maxabs);
    return false;
}

/* got (NULL fails with the last error) against the fixture tensor `name`: the same dims and
 * allclose(rtol, atol) (fx_close_all). */
static inline void fx_expect_close(fixtures *fx, const char *name, const em_tensor *got,
                                   double rtol, double atol) {
    cr_assert(got, "%s: no tensor (%s)", name, em_last_error());
    em_scope_begin();
    em_tensor *want = fx_tensor(fx, name);
    cr_assert_eq(em_tensor_ndim(got), em_tensor_ndim(want), "%s: %d dims, PyTorch %d", name,
                 em_tensor_ndim(got), em_tensor_ndim(want));
    for (int i = 0; i < em_tensor_ndim(want); i++)
        cr_assert_eq(em_tensor_size(got, i), em_tensor_size(want, i), "%s: dim %d", name, i);
    double *g = fx_host_f64(got), *w = fx_host_f64(want);
    char msg[512];
    bool ok = fx_close_all(name, g, w, em_tensor_numel(want), rtol, atol, msg, sizeof msg, NULL);
    free(g), free(w);
    cr_assert(ok, "%s", msg);
    em_scope_end();
}

/* The entry of state dict `back` under PyTorch's key k, whose tensor in PyTorch's state dict
 * is b: it must be there with b's dtype and shape (`what` names the case). Borrowed. */
static inline em_tensor *fx_state_entry(em_dict *back, const char *k, const em_tensor *b,
                                        const char *what) {
    em_tensor *a = em_dict_get(back, k);
    cr_assert(a, "%s: Ember's state dict lacks PyTorch's key %s", what, k);
    cr_assert_eq(em_tensor_dtype(a), em_tensor_dtype(b), "%s: %s dtype", what, k);
    cr_assert_eq(em_tensor_ndim(a), em_tensor_ndim(b), "%s: %s ndim", what, k);
    for (int d = 0; d < em_tensor_ndim(b); d++)
        cr_assert_eq(em_tensor_size(a, d), em_tensor_size(b, d), "%s: %s dim %d", what, k, d);
    return a;
}

/* A module's state dict written to a safetensors file and read back (*back: what a user's
 * --save-weights file holds) and PyTorch's from torch_path (*torch); both must load and have
 * as many keys (`what` names the case). The caller frees both. */
static inline void fx_state_dicts(em_module *m, const char *torch_path, const char *what,
                                  em_dict **back, em_dict **torch) {
    char tmp[] = "/tmp/ember_state_dict_XXXXXX";
    int fd = mkstemp(tmp);
    cr_assert(fd >= 0);
    close(fd);
    em_dict *mine = em_module_state_dict(m);
    cr_assert_eq(em_save(mine, tmp, NULL, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(mine);
    *back = *torch = NULL;
    cr_assert_eq(em_load(tmp, NULL, back, NULL), EM_OK, "%s", em_last_error());
    unlink(tmp);
    cr_assert_eq(em_load(torch_path, NULL, torch, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_dict_len(*back), em_dict_len(*torch), "%s: %zu keys, PyTorch %zu", what,
                 em_dict_len(*back), em_dict_len(*torch));
}

#endif /* EMBER_TESTS_FIXTURE_BIN_H */

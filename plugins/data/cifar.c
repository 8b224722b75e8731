/*
 * cifar.c — dataset class "cifar10": the CIFAR-10 binary version. Each file is a run of
 * 3073-byte records: one label byte (0..9) then a 32x32 image as 1024 red, 1024 green and
 * 1024 blue bytes (so items are (3, 32, 32) u8, C order, as the file stores them). The train
 * split is every data_batch_*.bin in the directory (however many, in natural order:
 * data_batch_2 before data_batch_10), the test split
 * test_batch.bin. Files may be gzip-compressed (zlib reads both). Everything is read and
 * checked at open (whole records, labels in [0, 10)) into a dt_table. Items are the fields
 * "input" (3, 32, 32) uint8 and "target" (an int64 label).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/data.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/options.h"
#include "data.h"

#define REC 3073
#define IMG 3072

static const char *const cifar_splits[] = {"train", "test", NULL};
static const em_option_spec cifar_options[] = {
    {.name = "path", .types = EM_OPT_STRING, .required = true,
     .help = "directory holding data_batch_*.bin and test_batch.bin"},
    {.name = "split", .types = EM_OPT_STRING, .def = {.s = "train"}, .choices = cifar_splits,
     .help = "train (data_batch_*.bin) or test (test_batch.bin)"},
};

/* Names in natural order: runs of digits compare as numbers, so data_batch_10.bin comes after
 * data_batch_9.bin. */
static int cmp_natural(const void *pa, const void *pb) {
    const char *a = *(const char *const *)pa, *b = *(const char *const *)pb;
    while (*a && *b) {
        if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
            while (*a == '0') a++;
            while (*b == '0') b++;
            size_t la = strspn(a, "0123456789"), lb = strspn(b, "0123456789");
            if (la != lb) return la < lb ? -1 : 1;
            int c = strncmp(a, b, la);
            if (c) return c;
            a += la;
            b += lb;
        } else {
            if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    return *a ? 1 : *b ? -1 : strcmp(*(const char *const *)pa, *(const char *const *)pb);
}

/* Append file `path` to s (col[0]: n * 3072 image bytes, col[1]: n int64 labels): whole
 * records only, labels checked. */
static em_status load_file(dt_table *s, const char *path, int64_t *cap) {
    dt_file *f = dt_open("cifar10", path);
    if (!f) return em_last_status();
    uint8_t rec[REC];
    em_status st = EM_OK;
    for (int64_t r = 0;; r++) {
        size_t got;
        if ((st = dt_read_upto(f, rec, REC, &got)) != EM_OK || got == 0) break;
        if (got < REC) {
            st = em_set_error(EM_ERR_FORMAT, "cifar10: %s: truncated: record %lld has %zu of "
                              "its %d bytes (the file is not a whole number of 3073-byte "
                              "records)", path, (long long)r, got, REC);
            break;
        }
        if (rec[0] >= 10) {
            st = em_set_error(EM_ERR_FORMAT, "cifar10: %s: record %lld (item %lld) has label "
                              "%u, outside [0, 10)", path, (long long)r, (long long)s->n, rec[0]);
            break;
        }
        if (s->n == *cap) {
            int64_t nc = *cap ? *cap * 2 : 64; /* grows with the records read */
            uint8_t *im = realloc(s->col[0], (size_t)nc * IMG);
            if (im) s->col[0] = im;
            int64_t *lb = im ? realloc(s->col[1], sizeof(int64_t) * (size_t)nc) : NULL;
            if (lb) s->col[1] = lb;
            if (!im || !lb) {
                st = em_set_error(EM_ERR_NOMEM, "cifar10: out of memory reading %s", path);
                break;
            }
            *cap = nc;
        }
        ((int64_t *)s->col[1])[s->n] = rec[0];
        memcpy((uint8_t *)s->col[0] + (size_t)s->n * IMG, rec + 1, IMG);
        s->n++;
    }
    dt_close(f);
    return st;
}

static em_status cifar_open(const em_options *o, em_dataset_layout *lay, void **out) {
    const char *dir = em_options_string(o, "path");
    bool train = strcmp(em_options_string(o, "split"), "train") == 0;
    char **names = NULL; /* every matching file, however many */
    size_t k = 0, kcap = 0;
    em_status st = EM_OK;
    DIR *d = opendir(dir);
    if (!d) return em_set_error(EM_ERR_IO, "cifar10: cannot open directory %s: %s", dir,
                                strerror(errno));
    for (struct dirent *e; st == EM_OK && (e = readdir(d));) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        bool match = train ? strncmp(n, "data_batch_", 11) == 0 &&
                                 ((len > 4 && strcmp(n + len - 4, ".bin") == 0) ||
                                  (len > 7 && strcmp(n + len - 7, ".bin.gz") == 0))
                           : strcmp(n, "test_batch.bin") == 0 || strcmp(n, "test_batch.bin.gz") == 0;
        if (!match) continue;
        if (k == kcap) {
            size_t nc = kcap ? kcap * 2 : 16;
            char **nn = realloc(names, nc * sizeof *nn);
            if (!nn) {
                st = em_set_error(EM_ERR_NOMEM, "cifar10: out of memory listing %s", dir);
                break;
            }
            names = nn;
            kcap = nc;
        }
        if (!(names[k] = strdup(n)))
            st = em_set_error(EM_ERR_NOMEM, "cifar10: out of memory listing %s", dir);
        else
            k++;
    }
    closedir(d);
    if (st == EM_OK && k == 0)
        st = em_set_error(EM_ERR_IO, "cifar10: no %s in %s", train ? "data_batch_*.bin files"
                          : "test_batch.bin", dir);
    if (k > 1) qsort(names, k, sizeof *names, cmp_natural);
    dt_table *s = NULL;
    if (st == EM_OK && !(s = dt_table_new("cifar10"))) st = EM_ERR_NOMEM;
    int64_t cap = 0;
    for (size_t i = 0; i < k; i++) {
        if (st == EM_OK) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            st = load_file(s, path, &cap);
        }
        free(names[i]);
    }
    free(names);
    if (st != EM_OK) {
        dt_table_close(s);
        return st;
    }
    dt_table_declare(s, lay, EM_U8, 3, (const int64_t[]){3, 32, 32}, 10, 0);
    *out = s;
    return EM_OK;
}

em_status dt_register_cifar(em_registry *r) {
    em_dataset_class_def d = {
        .struct_size = sizeof d, .name = "cifar10",
        .description = "CIFAR-10 binary batches (data_batch_*.bin, test_batch.bin)",
        .options = cifar_options, .n_options = (int)(sizeof cifar_options / sizeof cifar_options[0]),
        .open_fields = cifar_open, .read_fields = dt_table_read,
        .close = dt_table_close};
    return em_dataset_class_register(r, &d);
}

/*
 * idx.c — dataset class "mnist": MNIST / Fashion-MNIST in IDX format (raw or gzip), images
 * and labels in separate files, the split chosen by the standard file-name prefixes in a
 * directory: train-* and t10k-* (e.g. train-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte).
 *
 * IDX: two zero bytes, a type code (0x08 = unsigned byte), a dim count, the dims as
 * big-endian uint32, then the data in C order. Images are (N, H, W) u8 and become items of
 * shape (1, H, W); labels are (N) u8 and become int64 in [0, classes). Both files are read
 * into memory at open and checked there: magic, dims, truncation, trailing bytes, matching
 * counts, label range. Memory follows what the files deliver, not what their headers claim
 * (dt_read_alloc). Items are the fields "input" (1, H, W) uint8 and "target" (an int64 label);
 * they are held in a dt_table, whose reads are memcpy, safe from any number of threads.
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

static const char *const idx_splits[] = {"train", "test", NULL};
static const em_option_spec idx_options[] = {
    {.name = "path", .types = EM_OPT_STRING, .required = true,
     .help = "directory holding train-* and t10k-* IDX files (raw or .gz)"},
    {.name = "split", .types = EM_OPT_STRING, .def = {.s = "train"}, .choices = idx_splits,
     .help = "train (train-* files) or test (t10k-* files)"},
    {.name = "classes", .types = EM_OPT_INT, .def = {.i = 10}, .has_range = true, .min = 1,
     .max = 256, .help = "labels must lie in [0, classes)"},
};

/* In dir, the file whose name starts with prefix and contains kind ("images"/"labels");
 * an uncompressed one wins over a .gz. Writes the path into out. */
static em_status find_file(const char *dir, const char *prefix, const char *kind, char *out,
                           size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return em_set_error(EM_ERR_IO, "mnist: cannot open directory %s: %s", dir,
                              strerror(errno));
    char best[512] = "";
    bool best_gz = true;
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        if (strncmp(n, prefix, strlen(prefix)) != 0 || !strstr(n, kind)) continue;
        size_t len = strlen(n);
        bool gz = len > 3 && strcmp(n + len - 3, ".gz") == 0;
        if (!*best || (best_gz && !gz) || (best_gz == gz && strcmp(n, best) < 0)) {
            snprintf(best, sizeof best, "%s", n);
            best_gz = gz;
        }
    }
    closedir(d);
    if (!*best)
        return em_set_error(EM_ERR_IO, "mnist: no %s%s* file in %s (expected e.g. "
                            "%s%s-idx%d-ubyte or the same with .gz)", prefix, kind, dir, prefix,
                            kind, strcmp(kind, "images") == 0 ? 3 : 1);
    snprintf(out, cap, "%s/%s", dir, best);
    return EM_OK;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Read an IDX header with `ndims` dims of unsigned bytes into dims[]. */
static em_status idx_header(dt_file *f, int ndims, uint32_t *dims) {
    uint8_t h[4];
    em_status st = dt_read(f, h, 4, "the IDX magic number");
    if (st != EM_OK) return st;
    uint32_t magic = be32(h), want = 0x800u | (uint32_t)ndims;
    if (h[0] != 0 || h[1] != 0 || h[2] != 0x08 || h[3] != ndims)
        return em_set_error(EM_ERR_FORMAT, "mnist: %s: bad magic number 0x%08x, expected "
                            "0x%08x (IDX, unsigned bytes, %d dims)", dt_path(f), magic, want,
                            ndims);
    uint8_t d[12];
    st = dt_read(f, d, 4 * (size_t)ndims, "the IDX dims");
    for (int i = 0; st == EM_OK && i < ndims; i++) dims[i] = be32(d + 4 * i);
    return st;
}

static em_status idx_open(const em_options *o, em_dataset_layout *lay, void **out) {
    const char *dir = em_options_string(o, "path");
    bool train = strcmp(em_options_string(o, "split"), "train") == 0;
    const char *prefix = train ? "train-" : "t10k-";
    int64_t classes = em_options_int(o, "classes");
    char ipath[1024], lpath[1024];
    em_status st = find_file(dir, prefix, "images", ipath, sizeof ipath);
    if (st == EM_OK) st = find_file(dir, prefix, "labels", lpath, sizeof lpath);
    if (st != EM_OK) return st;

    dt_table *s = dt_table_new("mnist"); /* col[0]: N * H * W images, col[1]: N labels */
    uint8_t *lab = NULL;
    void *lab_block = NULL; /* the allocation lab lies in */
    int64_t *labels = NULL;
    dt_file *fi = NULL, *fl = NULL;
    if (!s) return EM_ERR_NOMEM;
    uint32_t idims[3], ldims[1];
    if (!(fi = dt_open("mnist", ipath))) goto fail;
    if ((st = idx_header(fi, 3, idims)) != EM_OK) goto fail;
    if (idims[1] == 0 || idims[2] == 0 || (uint64_t)idims[0] * idims[1] * idims[2] > (1ull << 36)) {
        em_set_error(EM_ERR_FORMAT, "mnist: %s: implausible image dims %u x %u x %u", ipath,
                     idims[0], idims[1], idims[2]);
        goto fail;
    }
    if (!(fl = dt_open("mnist", lpath))) goto fail;
    if ((st = idx_header(fl, 1, ldims)) != EM_OK) goto fail;
    if (ldims[0] != idims[0]) {
        em_set_error(EM_ERR_FORMAT, "mnist: image/label count mismatch: %s holds %u images but "
                     "%s holds %u labels", ipath, idims[0], lpath, ldims[0]);
        goto fail;
    }
    s->n = idims[0];
    size_t nbytes = (size_t)s->n * idims[1] * idims[2];
    /* The header's counts are claims: memory grows with the bytes the files deliver. */
    char what[96];
    snprintf(what, sizeof what, "%u images of %u x %u", idims[0], idims[1], idims[2]);
    void *buf, *block;
    if (dt_read_alloc(fi, nbytes, what, &buf, &block) != EM_OK) goto fail;
    s->col[0] = buf;
    s->block[0] = block;
    snprintf(what, sizeof what, "%u labels", ldims[0]);
    if (dt_read_alloc(fl, (size_t)s->n, what, &buf, &lab_block) != EM_OK) goto fail;
    lab = buf;
    if (!(s->col[1] = labels = malloc(sizeof(int64_t) * (size_t)(s->n ? s->n : 1)))) {
        em_set_error(EM_ERR_NOMEM, "mnist: out of memory for %lld labels", (long long)s->n);
        goto fail;
    }
    if (dt_expect_end(fi) != EM_OK || dt_expect_end(fl) != EM_OK) goto fail;
    for (int64_t i = 0; i < s->n; i++) {
        if (lab[i] >= classes) {
            em_set_error(EM_ERR_FORMAT, "mnist: %s: item %lld has label %u, outside [0, %lld) "
                         "(set the 'classes' option if the dataset has more)", lpath,
                         (long long)i, lab[i], (long long)classes);
            goto fail;
        }
        labels[i] = lab[i];
    }
    free(lab_block);
    dt_close(fi);
    dt_close(fl);
    dt_table_declare(s, lay, EM_U8, 3, (const int64_t[]){1, idims[1], idims[2]}, classes, 0);
    *out = s;
    return EM_OK;
fail:
    st = em_last_status() != EM_OK ? em_last_status() : EM_ERR_FORMAT;
    dt_close(fi);
    dt_close(fl);
    free(lab_block);
    dt_table_close(s);
    return st;
}

em_status dt_register_idx(em_registry *r) {
    em_dataset_class_def d = {
        .struct_size = sizeof d, .name = "mnist",
        .description = "MNIST / Fashion-MNIST IDX files (raw or gzip) in a directory; split "
                       "train (train-*) or test (t10k-*)",
        .options = idx_options, .n_options = (int)(sizeof idx_options / sizeof idx_options[0]),
        .open_fields = idx_open, .read_fields = dt_table_read, .close = dt_table_close};
    return em_dataset_class_register(r, &d);
}

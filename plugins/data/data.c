/*
 * data.c — the ember-data plugin: dataset classes for MNIST/Fashion-MNIST IDX files (raw or
 * gzip), CIFAR-10 binary batches, CSV tables, a synthetic dataset for benchmarks, and
 * next-token windows of text files (text.c); and what
 * they share: file reading (regular files only, dt_open_input; a whole single-member gzip file
 * through libdeflate at open, everything else, plain files too, through zlib's stream; into
 * memory that grows with what the file delivers, dt_read_alloc), their items
 * as the named fields "input" and "target" (dt_declare_io), and the in-memory table the file
 * formats read from (dt_table).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <libdeflate.h>
#include <zlib.h>

#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/plugin.h"
#include "ember/version.h"
#include "data.h"

struct dt_file {
    gzFile gz;           /* NULL when the file was decompressed whole at open (whole) */
    bool whole;
    unsigned char *mem;  /* whole: the decompressed bytes [0, len); NULL once handed over */
    size_t len, pos;     /* whole: the bytes and the read position */
    char *path;
    const char *who;
    uint64_t off;
};

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO (named pipe)"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int dt_open_input(const char *who, const char *path) {
    /* O_NONBLOCK: opening a FIFO without a writer would block in open() itself. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        em_set_error(EM_ERR_IO, "%s: cannot open %s: %s", who, path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        em_set_error(EM_ERR_IO, "%s: cannot stat %s: %s", who, path, strerror(err));
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        em_set_error(EM_ERR_IO, "%s: %s is %s, not a regular file (datasets are read only from "
                     "regular files: reading this could block or never end)", who, path,
                     file_kind(sb.st_mode));
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* DEFLATE's largest expansion is 1032:1 (a 258-byte match per 2 bits): a gzip trailer that
 * claims more than that for the file's size is a lie, whatever the header above it says. */
#define DT_DEFLATE_MAX_RATIO 1032u

/* The compressed and the inflated buffers' pages, faulted in by a second thread while this
 * one reads the file and inflates: a fresh page costs its fault and its zeroing, about 1.5 us
 * a 4 KiB page on the bench VM (Zen 4, KVM): ~10 ms for the 26 MB of Fashion-MNIST's gzip
 * training images and ~20 ms for the 47 MB they inflate to, of the ~105 ms reading and
 * inflating them took. The helper faults the compressed buffer first, ahead of the read
 * (which then only copies), then the output, ahead of the inflater (which writes it front
 * to back at ~6 us a page). MADV_POPULATE_WRITE (Linux 5.14) faults pages in as a write
 * would, without changing a byte (a page already there is left alone), so it never races
 * with the reader's or the inflater's writes; without it, or with one thread
 * (EMBER_NUM_THREADS=1, a one-CPU machine), nothing is started and the pages fault as
 * before. */
#define DT_PREFAULT_MIN ((size_t)4 << 20)

typedef struct prefault {
    pthread_t thread;
    bool started;
    void *at[2];
    size_t len[2];
} prefault;

static void *prefault_main(void *arg) {
#ifdef MADV_POPULATE_WRITE
    prefault *pf = arg;
    for (int k = 0; k < 2; k++) /* an error: the reader or the inflater faults them */
        if (pf->len[k]) (void)madvise(pf->at[k], pf->len[k], MADV_POPULATE_WRITE);
#else
    (void)arg;
#endif
    return NULL;
}

/* The whole pages inside [buf, buf + n) into range k. */
static void prefault_range(prefault *pf, int k, unsigned char *buf, size_t n, uintptr_t page) {
    uintptr_t a = ((uintptr_t)buf + page - 1) & ~(page - 1), z = ((uintptr_t)buf + n) & ~(page - 1);
    pf->at[k] = (void *)a;
    pf->len[k] = z > a ? z - a : 0;
}

static void prefault_start(prefault *pf, unsigned char *in, size_t n_in, unsigned char *out,
                           size_t n_out) {
    pf->started = false;
#ifdef MADV_POPULATE_WRITE
    long page = sysconf(_SC_PAGESIZE);
    if (n_in + n_out < DT_PREFAULT_MIN || page <= 0 || em_num_threads() < 2) return;
    prefault_range(pf, 0, in, n_in, (uintptr_t)page);
    prefault_range(pf, 1, out, n_out, (uintptr_t)page);
    pf->started = pthread_create(&pf->thread, NULL, prefault_main, pf) == 0;
#else
    (void)in, (void)n_in, (void)out, (void)n_out;
#endif
}

static void prefault_join(prefault *pf) {
    if (pf->started) pthread_join(pf->thread, NULL);
    pf->started = false;
}

/* A gzip file of one member (no bytes after it), decompressed whole by libdeflate into
 * f->mem: about twice as fast as zlib's stream on IDX images, and one allocation of the size
 * the trailer gives (ISIZE, believed up to DEFLATE's maximum ratio to the file's size). false
 * for anything else (not gzip, several members, trailing bytes, more than 4 GiB inflated, a
 * corrupt or cut stream, no memory): zlib's stream then reads the file from its start, with
 * its own error messages, so the result and every error are the stream's. */
static bool whole_gzip(dt_file *f, int fd) {
    struct stat sb;
    /* 18: a gzip header and trailer around an empty stream; from 4 GiB of compressed bytes
     * on, the inflated size is past what the trailer's 32 bits can say */
    if (fstat(fd, &sb) != 0 || sb.st_size < 18 || (uint64_t)sb.st_size >= (1ull << 32))
        return false;
    size_t n = (size_t)sb.st_size;
    unsigned char magic[2], tail[4];
    if (pread(fd, magic, 2, 0) != 2 || magic[0] != 0x1f || magic[1] != 0x8b) return false;
    /* the trailer's ISIZE first, so that the output's pages fault in while the file is read
     * (the whole file's last 4 bytes are read again below: a file changed meanwhile is
     * judged by the bytes inflated) */
    if (pread(fd, tail, 4, (off_t)(n - 4)) != 4) return false;
    size_t isize = (size_t)tail[0] | (size_t)tail[1] << 8 | (size_t)tail[2] << 16 |
                   (size_t)tail[3] << 24;
    if ((uint64_t)isize > (uint64_t)n * DT_DEFLATE_MAX_RATIO) return false;
    /* read, not mapped: a mapping of a file that another process truncates meanwhile faults
     * (SIGBUS), where a read returns short */
    unsigned char *in = malloc(n), *out = malloc(isize ? isize : 1);
    if (!in || !out) {
        free(in);
        free(out);
        return false;
    }
    prefault pf;
    prefault_start(&pf, in, n, out, isize);
    size_t have = 0;
    for (ssize_t k = 1; have < n && k > 0; have += k > 0 ? (size_t)k : 0)
        k = pread(fd, in + have, n - have, (off_t)have);
    bool ok = false;
    struct libdeflate_decompressor *d = NULL;
    if (have == n && memcmp(in + n - 4, tail, 4) == 0 &&
        (d = libdeflate_alloc_decompressor())) {
        size_t used = 0, got = 0;
        ok = libdeflate_gzip_decompress_ex(d, in, n, out, isize, &used, &got) ==
                 LIBDEFLATE_SUCCESS && used == n && got == isize;
    }
    prefault_join(&pf);
    libdeflate_free_decompressor(d);
    free(in);
    if (!ok) {
        free(out);
        return false;
    }
    f->whole = true;
    f->mem = out;
    f->len = isize;
    return true;
}

dt_file *dt_open(const char *who, const char *path) {
    int fd = dt_open_input(who, path);
    if (fd < 0) return NULL;
    dt_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        close(fd);
        em_set_error(EM_ERR_NOMEM, "%s: out of memory opening %s", who, path);
        return NULL;
    }
    f->who = who;
    if (whole_gzip(f, fd)) {
        close(fd);
        return f;
    }
    errno = 0;
    if (lseek(fd, 0, SEEK_SET) != 0 || !(f->gz = gzdopen(fd, "rb"))) {
        /* the checked descriptor: no second open by name */
        em_set_error(EM_ERR_IO, "%s: cannot open %s: %s", who, path,
                     errno ? strerror(errno) : "zlib could not open it");
        close(fd);
        free(f->path);
        free(f);
        return NULL;
    }
    gzbuffer(f->gz, 1 << 17);
    return f;
}

/* whole: copy up to n of the bytes left. */
static size_t whole_take(dt_file *f, void *buf, size_t n) {
    size_t k = f->len - f->pos < n ? f->len - f->pos : n;
    if (k) memcpy(buf, f->mem + f->pos, k);
    f->pos += k;
    f->off += (uint64_t)k;
    return k;
}

/* zlib's message for f's stream without the "<fd:N>: " it puts first for a gzdopen()ed file
 * (the path is in our message already); *err: its code. */
static const char *gz_message(const dt_file *f, int *err) {
    const char *m = gzerror(f->gz, err);
    if (!m) return "";
    const char *c = strncmp(m, "<fd:", 4) == 0 ? strstr(m, ">: ") : NULL;
    return c ? c + 3 : m;
}

/* The error of a gzread that failed (k < 0) or gave nothing (k == 0) after f->off inflated
 * bytes, while reading `what` (NULL: a read of whatever is left). A failed check or a cut or
 * damaged gzip stream is the file's fault: EM_ERR_FORMAT, "corrupt gzip file: " and the check
 * that failed. Only a failed read(2) is EM_ERR_IO. EM_OK when the stream simply ended (k == 0:
 * the caller says what was missing). zlib inflates ahead of what was asked (its buffer), so a
 * checksum or a damaged block is the file's, not that of the field being read: only a read
 * error names `what`. */
static em_status gz_failure(const dt_file *f, int k, const char *what) {
    int err;
    const char *msg = gz_message(f, &err);
    switch (err) {
    case Z_OK:
        if (k == 0) return EM_OK;
        break;
    case Z_BUF_ERROR: /* zlib's "unexpected end of file": the member's end never came */
        return em_set_error(EM_ERR_FORMAT, "%s: %s: corrupt gzip file: truncated: the compressed "
                            "data ends after %llu inflated bytes, without its end marker and "
                            "checksum", f->who, f->path, (unsigned long long)f->off);
    case Z_DATA_ERROR:
        if (strstr(msg, "incorrect data check"))
            return em_set_error(EM_ERR_FORMAT, "%s: %s: corrupt gzip file: CRC-32 mismatch (the "
                                "checksum in its trailer is not that of the data inflated)",
                                f->who, f->path);
        if (strstr(msg, "incorrect length check"))
            return em_set_error(EM_ERR_FORMAT, "%s: %s: corrupt gzip file: length mismatch (the "
                                "size in its trailer is not that of the data inflated)", f->who,
                                f->path);
        if (strstr(msg, "unknown compression method") || strstr(msg, "unknown header flags") ||
            strstr(msg, "header crc mismatch"))
            return em_set_error(EM_ERR_FORMAT, "%s: %s: corrupt gzip file: not gzip: it starts "
                                "with the gzip magic bytes but its header is invalid (%s)", f->who,
                                f->path, msg);
        return em_set_error(EM_ERR_FORMAT, "%s: %s: corrupt gzip file: the compressed data is "
                            "damaged (%s)", f->who, f->path, msg);
    case Z_MEM_ERROR:
        return em_set_error(EM_ERR_NOMEM, "%s: %s: out of memory inflating the gzip data",
                            f->who, f->path);
    default: /* Z_ERRNO: the operating system's read failed */
        break;
    }
    return em_set_error(EM_ERR_IO, "%s: %s: read error at byte %llu%s%s%s: %s", f->who, f->path,
                        (unsigned long long)f->off, what ? " (" : "", what ? what : "",
                        what ? ")" : "", *msg ? msg : "zlib gave no reason");
}

em_status dt_read(dt_file *f, void *buf, size_t n, const char *what) {
    char *p = buf;
    size_t left = n;
    if (f->whole && (left -= whole_take(f, buf, n)) > 0)
        return em_set_error(EM_ERR_FORMAT, "%s: %s: truncated: %s needs %zu more bytes but the "
                            "file ends at byte %llu", f->who, f->path, what, left,
                            (unsigned long long)f->off);
    while (left > 0) {
        unsigned chunk = left > (1u << 30) ? (1u << 30) : (unsigned)left;
        int got = gzread(f->gz, p, chunk);
        if (got <= 0) {
            em_status st = gz_failure(f, got, what);
            if (st != EM_OK) return st;
            return em_set_error(EM_ERR_FORMAT, "%s: %s: truncated: %s needs %zu more bytes "
                                "but the file ends at byte %llu", f->who, f->path, what, left,
                                (unsigned long long)f->off);
        }
        p += got;
        left -= (size_t)got;
        f->off += (uint64_t)got;
    }
    return EM_OK;
}

em_status dt_read_upto(dt_file *f, void *buf, size_t n, size_t *got) {
    *got = 0;
    if (f->whole) {
        *got = whole_take(f, buf, n);
        return EM_OK;
    }
    while (*got < n) {
        unsigned chunk = n - *got > (1u << 30) ? (1u << 30) : (unsigned)(n - *got);
        int k = gzread(f->gz, (char *)buf + *got, chunk);
        if (k <= 0) {
            em_status st = gz_failure(f, k, NULL);
            if (st != EM_OK) return st;
            break;
        }
        *got += (size_t)k;
        f->off += (uint64_t)k;
    }
    return EM_OK;
}

em_status dt_read_alloc(dt_file *f, size_t n, const char *what, void **out, void **block) {
    *out = *block = NULL;
    if (f->whole && n == f->len - f->pos && n) {
        /* the rest of the file: the decompressed buffer itself, the bytes after the ones
         * read already (a header), instead of a second buffer of this size and a copy (or
         * a memmove of all of it: ~6 ms for 47 MB of images) */
        *out = f->mem + f->pos;
        *block = f->mem;
        f->mem = NULL;
        f->pos = f->len = 0;
        f->off += (uint64_t)n;
        return EM_OK;
    }
    if (f->whole && n > f->len - f->pos) {
        size_t left = n - (f->len - f->pos);
        f->off += (uint64_t)(f->len - f->pos);
        f->pos = f->len;
        return em_set_error(EM_ERR_FORMAT, "%s: %s: truncated: %s needs %zu more bytes but the "
                            "file ends at byte %llu", f->who, f->path, what, left,
                            (unsigned long long)f->off);
    }
    size_t cap = n < ((size_t)1 << 20) ? n : (size_t)1 << 20, got = 0;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf) return em_set_error(EM_ERR_NOMEM, "%s: out of memory reading %s", f->who, f->path);
    while (got < n) {
        if (got == cap) { /* the file has delivered cap bytes: it justifies twice as many */
            size_t nc = cap > n / 2 ? n : cap * 2;
            unsigned char *nb = realloc(buf, nc);
            if (!nb) {
                free(buf);
                return em_set_error(EM_ERR_NOMEM, "%s: out of memory reading %s (%zu bytes of "
                                    "%s)", f->who, f->path, nc, what);
            }
            buf = nb;
            cap = nc;
        }
        size_t k;
        em_status st = dt_read_upto(f, buf + got, cap - got, &k);
        if (st == EM_OK && k < cap - got)
            st = em_set_error(EM_ERR_FORMAT, "%s: %s: truncated: %s needs %zu more bytes but "
                              "the file ends at byte %llu", f->who, f->path, what,
                              n - got - k, (unsigned long long)f->off);
        if (st != EM_OK) {
            free(buf);
            return st;
        }
        got += k;
    }
    *out = *block = buf;
    return EM_OK;
}

em_status dt_expect_end(dt_file *f) {
    char c;
    size_t got;
    uint64_t at = f->off;
    em_status st = dt_read_upto(f, &c, 1, &got);
    if (st == EM_OK && got)
        st = em_set_error(EM_ERR_FORMAT, "%s: %s: unexpected bytes after the %llu the header "
                          "accounts for (a damaged file, or a header for fewer items)", f->who,
                          f->path, (unsigned long long)at);
    return st;
}

const char *dt_path(const dt_file *f) { return f->path; }

void dt_close(dt_file *f) {
    if (!f) return;
    if (f->gz) gzclose(f->gz);
    free(f->mem);
    free(f->path);
    free(f);
}

/* ---- items: the fields "input" and "target" ------------------------------------------------ */

void dt_declare_io(em_dataset_layout *lay, em_field f[2], int64_t length, em_dtype dtype,
                   int ndim, const int64_t *shape, int64_t classes, int64_t values) {
    f[0] = (em_field){.struct_size = sizeof(em_field), .name = "input", .dtype = dtype,
                      .ndim = ndim};
    memcpy(f[0].shape, shape, sizeof(int64_t) * (size_t)ndim);
    if (classes > 0)
        f[1] = (em_field){.struct_size = sizeof(em_field), .name = "target", .dtype = EM_I64,
                          .num_classes = classes};
    else
        f[1] = (em_field){.struct_size = sizeof(em_field), .name = "target", .dtype = EM_F32,
                          .ndim = 1, .shape = {values}};
    lay->length = length;
    lay->fields = f;
    lay->n_fields = 2;
}

dt_table *dt_table_new(const char *who) {
    dt_table *t = calloc(1, sizeof *t);
    if (!t) em_set_error(EM_ERR_NOMEM, "%s: out of memory", who);
    return t;
}

void dt_table_declare(dt_table *t, em_dataset_layout *lay, em_dtype dtype, int ndim,
                      const int64_t *shape, int64_t classes, int64_t values) {
    dt_declare_io(lay, t->fields, t->n, dtype, ndim, shape, classes, values);
    for (int k = 0; k < 2; k++) {
        size_t b = em_dtype_size(t->fields[k].dtype);
        for (int d = 0; d < t->fields[k].ndim; d++) b *= (size_t)t->fields[k].shape[d];
        t->bytes[k] = b;
    }
}

em_status dt_table_read(void *state, const int64_t *idx, int64_t n, void *const *data,
                        int64_t *const *lengths) {
    (void)lengths; /* both fields are fixed */
    const dt_table *t = state;
    for (int k = 0; k < 2; k++)
        for (int64_t j = 0; j < n; j++)
            memcpy((char *)data[k] + (size_t)j * t->bytes[k],
                   (const char *)t->col[k] + (size_t)idx[j] * t->bytes[k], t->bytes[k]);
    return EM_OK;
}

void dt_table_close(void *state) {
    dt_table *t = state;
    if (!t) return;
    for (int k = 0; k < 2; k++) free(t->block[k] ? t->block[k] : t->col[k]);
    free(t);
}

static em_status data_register(em_registry *r) {
    em_status st = dt_register_idx(r);
    if (st == EM_OK) st = dt_register_cifar(r);
    if (st == EM_OK) st = dt_register_csv(r);
    if (st == EM_OK) st = dt_register_synthetic(r);
    if (st == EM_OK) st = dt_register_text(r);
    return st;
}

static const em_plugin_descriptor data_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-data",
    .version = EM_VERSION_STRING,
    .description = "dataset classes: mnist (IDX, raw or gzip), cifar10, csv, synthetic, text",
    .register_fn = data_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &data_plugin; }

/*
 * serialize.c — safetensors files (ember/serialize.h): metadata maps, the crash-safe streaming
 * writer, the validating reader, copying a dict into existing tensors with a report, and
 * checkpoint rotation.
 *
 * Writing. The header is built with jansson (compact, in the order Python's safetensors uses:
 * __metadata__, then per tensor dtype/shape/data_offsets), padded with spaces to a multiple of
 * 8 bytes, then each tensor's bytes are written straight from its memory (CPU) or through a
 * bounded staging buffer (other devices). Everything goes to a temporary file beside the
 * target (a symbolic link's target: saves write through links), which is fsync'd, renamed over
 * the target, and the directory fsync'd; the temporary name carries the host and pid, so the
 * files killed saves leave can be told from a live writer's and removed. The
 * EMBER_TEST_SAVE_KILL hook (test-only, see the header) raises SIGKILL at a chosen byte or
 * step so the tests can prove a killed save never damages the previous file.
 *
 * Checkpoint files. A pattern's "{step}" numbers the files; each file's header names the run
 * that wrote it (ember.run), which rotation reads so that it deletes only the writing run's
 * files, never the one just written, and never another run's.
 *
 * Reading. Every input file is opened through em__input_open (regular files only: a FIFO or
 * /dev/zero would block or never end). The header is read and validated completely — length,
 * JSON (jansson, duplicates rejected), every entry's dtype, shape and offsets, and that the
 * offsets tile the data section exactly (no overlap, no hole, nothing past the end: the same
 * rules as Python's safetensors) — before any tensor is created, so a malformed file fails
 * cleanly and no read ever leaves the data section. Then each tensor's bytes are read with
 * pread straight into its memory (through a bounded staging buffer for another device). The
 * file is not mapped: another process truncating a mapped file kills the reader with SIGBUS,
 * while a read returns short, an error naming the file (a whole-file check at the end catches
 * a rewrite of the same size). A load plan (em__load_planned, em_load_into) sees the header
 * before any data is read and picks the tensors to read, so a tensor nobody asked for costs
 * no memory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/serialize.h"
#include "ember/tensor.h"
#include "internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "serialize.c writes tensors' bytes as they are in memory: little-endian hosts only"
#endif

/* ---- dtype names ---------------------------------------------------------------------------- */

/* safetensors' name for each em_dtype, and the rank of Python's Dtype enum (its sort key:
 * descending rank puts wider types first). */
static const struct {
    const char *name;
    int python_rank;
} st_dtypes[EM_DTYPE_COUNT] = {
    [EM_F32] = {"F32", 5}, [EM_F64] = {"F64", 6}, [EM_F16] = {"F16", 2},
    [EM_BF16] = {"BF16", 3}, [EM_I32] = {"I32", 4}, [EM_I64] = {"I64", 7},
    [EM_U8] = {"U8", 1}, [EM_BOOL] = {"BOOL", 0},
};

#define ST_SUPPORTED "F32, F64, F16, BF16, I64, I32, U8, BOOL"

static bool st_dtype_parse(const char *s, em_dtype *out) {
    for (int i = 0; i < EM_DTYPE_COUNT; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (em_dtype)i;
            return true;
        }
    return false;
}

static bool utf8_valid(const char *s) {
    json_t *j = json_string(s); /* jansson refuses invalid UTF-8 */
    if (!j)
        return false;
    json_decref(j);
    return true;
}

/* ---- metadata ------------------------------------------------------------------------------- */

struct em_metadata {
    char **keys, **values; /* [len], insertion order, owned */
    size_t len, cap;
    em__strindex index;    /* keys -> position: a header's n entries cost O(n) */
    uint64_t compares;     /* key comparisons made by em_metadata_set */
};

em_metadata *em_metadata_new(void) {
    return em__calloc(1, sizeof(em_metadata), "metadata");
}

void em_metadata_free(em_metadata *m) {
    if (!m)
        return;
    for (size_t i = 0; i < m->len; i++) {
        em__free(m->keys[i]);
        em__free(m->values[i]);
    }
    em__free(m->keys);
    em__free(m->values);
    em__strindex_free(&m->index);
    em__free(m);
}

static ptrdiff_t meta_find(const em_metadata *m, const char *key, uint64_t *compares) {
    if (!m || !key)
        return -1;
    return em__strindex_find(&m->index, m->keys, sizeof(char *), key, compares);
}

em_status em_metadata_set(em_metadata *m, const char *key, const char *value) {
    if (!m || !key || !value)
        return em_set_error(EM_ERR_INVALID, "metadata_set: NULL %s",
                            !m ? "metadata" : !key ? "key" : "value");
    if (!key[0])
        return em_set_error(EM_ERR_INVALID, "metadata_set: key is empty");
    if (!utf8_valid(key))
        return em_set_error(EM_ERR_INVALID, "metadata_set: key is not valid UTF-8");
    if (!utf8_valid(value))
        return em_set_error(EM_ERR_INVALID, "metadata_set: value of '%s' is not valid UTF-8",
                            key);
    char *v = em__strdup(value, "metadata value");
    if (!v)
        return EM_ERR_NOMEM;
    ptrdiff_t pos = meta_find(m, key, &m->compares);
    if (pos >= 0) {
        em__free(m->values[pos]);
        m->values[pos] = v;
        return EM_OK;
    }
    char *k = em__strdup(key, "metadata key");
    if (!k) {
        em__free(v);
        return EM_ERR_NOMEM;
    }
    if (m->len == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        char **nk = em__realloc(m->keys, m->cap * sizeof(char *), cap * sizeof(char *),
                                "metadata keys");
        if (nk)
            m->keys = nk;
        char **nv = nk ? em__realloc(m->values, m->cap * sizeof(char *), cap * sizeof(char *),
                                     "metadata values")
                       : NULL;
        if (nv)
            m->values = nv;
        if (!nk || !nv) {
            em__free(k);
            em__free(v);
            return EM_ERR_NOMEM;
        }
        m->cap = cap;
    }
    m->keys[m->len] = k;
    if (em__strindex_add(&m->index, m->keys, sizeof(char *), m->len, &m->compares) != EM_OK) {
        em__free(k);
        em__free(v);
        return EM_ERR_NOMEM;
    }
    m->values[m->len] = v;
    m->len++;
    return EM_OK;
}

const char *em_metadata_get(const em_metadata *m, const char *key) {
    ptrdiff_t pos = meta_find(m, key, NULL);
    return pos >= 0 ? m->values[pos] : NULL;
}

uint64_t em_metadata_key_compares(const em_metadata *m) {
    return m ? m->compares : 0;
}

size_t em_metadata_len(const em_metadata *m) {
    return m ? m->len : 0;
}

const char *em_metadata_key(const em_metadata *m, size_t i) {
    return m && i < m->len ? m->keys[i] : NULL;
}

const char *em_metadata_value(const em_metadata *m, size_t i) {
    return m && i < m->len ? m->values[i] : NULL;
}

/* ---- the writer ------------------------------------------------------------------------------ */

/* Test-only kill points (EMBER_TEST_SAVE_KILL). */
typedef enum kill_step {
    KILL_NONE,
    KILL_BYTES,   /* after kill_at bytes */
    KILL_CREATED,
    KILL_WRITTEN,
    KILL_SYNCED,
    KILL_RENAMED,
} kill_step;

typedef struct writer {
    int fd;
    const char *path;   /* how messages name the target (quoted: shown_name) */
    uint64_t written;   /* bytes of the file written so far */
    uint64_t total;     /* bytes the file will have */
    kill_step kill;
    uint64_t kill_at;
} writer;

static void kill_parse(writer *w) {
    w->kill = KILL_NONE;
    const char *s = getenv("EMBER_TEST_SAVE_KILL");
    if (!s || !*s)
        return;
    static const struct {
        const char *name;
        kill_step step;
    } steps[] = {{"created", KILL_CREATED}, {"written", KILL_WRITTEN},
                 {"synced", KILL_SYNCED}, {"renamed", KILL_RENAMED}};
    for (size_t i = 0; i < EM_ARRAY_LEN(steps); i++)
        if (strcmp(s, steps[i].name) == 0) {
            w->kill = steps[i].step;
            return;
        }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!errno && *end == '\0' && s[0] >= '0' && s[0] <= '9') {
        w->kill = KILL_BYTES;
        w->kill_at = v;
    }
}

static void kill_point(const writer *w, kill_step step) {
    if (w->kill == step)
        raise(SIGKILL);
}

static em_status write_error(const writer *w, int err) {
    return em_set_error(EM_ERR_IO, "save: writing %s failed after %llu of %llu bytes: %s",
                        w->path, (unsigned long long)w->written,
                        (unsigned long long)w->total, strerror(err));
}

/* Write n bytes, honouring the byte kill point: exactly kill_at bytes reach the file, then
 * the process dies. */
static em_status w_write(writer *w, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        size_t chunk = EM_MIN(n, (size_t)1 << 30);
        bool die = false;
        if (w->kill == KILL_BYTES && w->written + chunk >= w->kill_at) {
            chunk = (size_t)(w->kill_at - w->written);
            die = true;
        }
        while (chunk > 0) {
            ssize_t r = write(w->fd, c, chunk);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                return write_error(w, errno);
            }
            c += r;
            n -= (size_t)r;
            chunk -= (size_t)r;
            w->written += (uint64_t)r;
        }
        if (die)
            raise(SIGKILL);
    }
    return EM_OK;
}

#define STAGING_BYTES ((size_t)4 << 20)

/* Stream one tensor's C-order bytes. */
static em_status write_tensor(writer *w, const em_tensor *t, const char *key) {
    size_t nbytes = em_tensor_nbytes(t);
    if (nbytes == 0)
        return EM_OK;
    em_tensor *c = em__contiguous(t);
    if (!c)
        return em_set_error(em_last_status(), "save: %s: making '%s' contiguous failed: %s",
                            w->path, key, em_last_error());
    em_device dev = em_tensor_device(c);
    const char *data = em_tensor_data(c);
    em_status st = EM_OK;
    if (dev.type == EM_DEVICE_CPU_TYPE) {
        st = w_write(w, data, nbytes);
    } else {
        size_t cap = EM_MIN(nbytes, STAGING_BYTES);
        char *buf = em__malloc(cap, "save staging buffer");
        if (!buf)
            st = EM_ERR_NOMEM;
        for (size_t off = 0; st == EM_OK && off < nbytes; off += cap) {
            size_t n = EM_MIN(cap, nbytes - off);
            st = em__device_copy(em_cpu(), buf, dev, data + off, n);
            if (st != EM_OK) {
                char d[48];
                em_set_error(st, "save: %s: copying '%s' from %s failed: %s", w->path, key,
                             em_device_str(dev, d, sizeof d), em_last_error());
            } else {
                st = w_write(w, buf, n);
            }
        }
        em__free(buf);
    }
    em_tensor_release(c);
    return st;
}

typedef struct save_entry {
    const char *key;
    const em_tensor *t;
    uint64_t nbytes;
} save_entry;

static int python_order_cmp(const void *a, const void *b) {
    const save_entry *x = a, *y = b;
    int rx = st_dtypes[em_tensor_dtype(x->t)].python_rank;
    int ry = st_dtypes[em_tensor_dtype(y->t)].python_rank;
    if (rx != ry)
        return ry - rx;
    return strcmp(x->key, y->key);
}

/* The header: JSON text padded with spaces to a multiple of 8 bytes (malloc'ed by jansson's
 * allocator family: free with free()). */
static em_status build_header(const char *path, const save_entry *e, size_t n,
                              const em_metadata *meta, char **out, size_t *out_len) {
    json_t *root = json_object();
    if (!root)
        return em_set_error(EM_ERR_NOMEM, "save: '%s': out of memory building the header", path);
    em_status st = EM_OK;
    if (meta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m) != 0)
            goto nomem;
        for (size_t i = 0; i < meta->len; i++)
            if (json_object_set_new(m, meta->keys[i], json_string(meta->values[i])) != 0)
                goto nomem;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const em_tensor *t = e[i].t;
        json_t *shape = json_array();
        if (!shape)
            goto nomem;
        for (int d = 0; d < em_tensor_ndim(t); d++)
            if (json_array_append_new(shape, json_integer(em_tensor_shape(t)[d])) != 0) {
                json_decref(shape);
                goto nomem;
            }
        json_t *info = json_pack("{s:s, s:o, s:[I, I]}", "dtype",
                                 st_dtypes[em_tensor_dtype(t)].name, "shape", shape,
                                 "data_offsets", (json_int_t)off,
                                 (json_int_t)(off + e[i].nbytes));
        if (!info || json_object_set_new(root, e[i].key, info) != 0)
            goto nomem;
        off += e[i].nbytes;
    }
    /* Keys were checked for UTF-8 before; jansson keeps insertion order. */
    char *text = json_dumps(root, JSON_COMPACT);
    if (!text)
        goto nomem;
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    char *buf = realloc(text, padded + 1);
    if (!buf) {
        free(text);
        goto nomem;
    }
    memset(buf + len, ' ', padded - len);
    buf[padded] = '\0';
    *out = buf;
    *out_len = padded;
    json_decref(root);
    return st;
nomem:
    json_decref(root);
    return em_set_error(EM_ERR_NOMEM, "save: '%s': out of memory building the header", path);
}

static atomic_uint tmp_counter;

/* Split path into its directory ("." when none) and base name, into dir (cap PATH_MAX). */
static const char *path_base(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, cap, ".");
        return path;
    }
    size_t n = (size_t)(slash - path);
    if (n == 0)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)n, path);
    return slash + 1;
}

/* ---- the target, temporary names, the file-size limit --------------------------------------- */

/* This host's name as it appears in temporary file names (and run identities): at most 32
 * bytes of [A-Za-z0-9_-], anything else written '_', so the name holds no '.' and splits
 * unambiguously. */
void em__host_tag(char *buf, size_t cap) {
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) != 0 || !h[0])
        snprintf(h, sizeof h, "localhost");
    h[sizeof h - 1] = '\0';
    size_t n = 0;
    for (const char *c = h; *c && n + 1 < cap && n < 32; c++) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '_' || *c == '-';
        buf[n++] = ok ? *c : '_';
    }
    buf[n] = '\0';
}

/* The file a save to `path` replaces: path itself, or — when path is a symbolic link, or a
 * chain of them — the file the last one names (which may not exist yet), like open() would
 * write. Into out (cap bytes). */
static em_status resolve_target(const char *path, char *out, size_t cap) {
    if (strlen(path) >= cap)
        return em_set_error(EM_ERR_INVALID, "save: path '%.64s...' is too long", path);
    snprintf(out, cap, "%s", path);
    for (int hops = 0;; hops++) {
        struct stat sb;
        if (lstat(out, &sb) != 0 || !S_ISLNK(sb.st_mode))
            return EM_OK; /* absent (a new file) or not a link; other errors surface later */
        if (hops == 40)
            return em_set_error(EM_ERR_IO, "save: '%s': too many levels of symbolic links", path);
        char link[PATH_MAX], next[PATH_MAX], dir[PATH_MAX];
        ssize_t n = readlink(out, link, sizeof link - 1);
        if (n < 0)
            return em_set_error(EM_ERR_IO, "save: '%s': cannot read the symbolic link '%s': %s",
                                path, out, strerror(errno));
        link[n] = '\0';
        int len;
        if (link[0] == '/') {
            len = snprintf(next, sizeof next, "%s", link);
        } else {
            path_base(out, dir, sizeof dir);
            len = snprintf(next, sizeof next, "%s/%s", dir, link);
        }
        if (len < 0 || (size_t)len >= cap)
            return em_set_error(EM_ERR_INVALID, "save: '%s': the file its symbolic link names "
                                "has too long a path", path);
        memcpy(out, next, (size_t)len + 1);
    }
}

/* How messages name the file: 'PATH', or 'PATH' (a symbolic link to 'TARGET'). */
static void shown_name(char *buf, size_t cap, const char *path, const char *target) {
    if (strcmp(path, target) == 0)
        snprintf(buf, cap, "'%s'", path);
    else
        snprintf(buf, cap, "'%s' (a symbolic link to '%s')", path, target);
}

/* A target that exists must be a regular file: a save renames a new file over it, which would
 * turn a device or a FIFO into a file (and a directory cannot be replaced). */
static em_status check_target_kind(const char *target, const char *shown, bool *exists,
                                   struct stat *sb) {
    *exists = stat(target, sb) == 0;
    if (*exists && S_ISDIR(sb->st_mode))
        return em_set_error(EM_ERR_INVALID, "save: %s is a directory", shown);
    if (*exists && !S_ISREG(sb->st_mode))
        return em_set_error(EM_ERR_INVALID, "save: %s is not a regular file (a device, FIFO "
                            "or socket); a save replaces the file, so it refuses", shown);
    return EM_OK;
}

/* Create a new temporary file ".BASE.tmp-HOST-PID-N" in dir; its path into tmp. The fd, or -1
 * with errno. */
static int create_temp(const char *dir, const char *base, char *tmp, size_t cap) {
    char host[40];
    em__host_tag(host, sizeof host);
    for (int attempt = 0;; attempt++) {
        snprintf(tmp, cap, "%s/.%s.tmp-%s-%ld-%u", dir, base, host, (long)getpid(),
                 atomic_fetch_add(&tmp_counter, 1));
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST || attempt == 100)
            return fd;
    }
}

static em_status create_error(const char *dir, const char *shown, int err, const char *tail) {
    return em_set_error(EM_ERR_IO, "save: cannot create a file in '%s' for %s: %s%s%s", dir,
                        shown, strerror(err),
                        err == ENOENT    ? " (the directory does not exist)"
                        : err == ENOTDIR ? " (a part of the path is not a directory)"
                                         : "",
                        tail);
}

/* The file-size limit (RLIMIT_FSIZE, `ulimit -f`) makes write() fail with EFBIG and raise
 * SIGXFSZ, whose default action kills the process. While it writes, em_save blocks SIGXFSZ in
 * the calling thread and then discards the one its own writes raised, so the limit is an error
 * naming the file whatever the program's disposition for the signal. */
typedef struct xfsz_guard {
    sigset_t old;
    bool was_pending;
} xfsz_guard;

static void xfsz_block(xfsz_guard *g) {
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &s, &g->old);
    g->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1;
}

static void xfsz_restore(const xfsz_guard *g) {
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGXFSZ);
    if (!g->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1) {
        const struct timespec zero = {0, 0};
        while (sigtimedwait(&s, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* Where a save to path writes: the target file (through symbolic links) into target, its
 * directory into dir, its name (*base, inside target), and how to show it in messages. target
 * and dir hold PATH_MAX bytes. EM_ERR_INVALID for a directory or a path too long. */
static em_status save_place(const char *path, char *target, char *dir, char *shown,
                            size_t shown_cap, const char **base) {
    em_status st = resolve_target(path, target, PATH_MAX);
    if (st != EM_OK)
        return st;
    *base = path_base(target, dir, PATH_MAX);
    if (!**base)
        return em_set_error(EM_ERR_INVALID, "save: '%s' names a directory, not a file", path);
    if (strlen(target) + 64 >= PATH_MAX)
        return em_set_error(EM_ERR_INVALID, "save: path '%.64s...' is too long", path);
    shown_name(shown, shown_cap, path, target);
    return EM_OK;
}

em_status em_save_check(const char *path) {
    if (!path || !*path)
        return em_set_error(EM_ERR_INVALID, "save: path is %s", path ? "empty" : "NULL");
    char target[PATH_MAX], dir[PATH_MAX], shown[2 * PATH_MAX + 64];
    const char *base;
    em_status st = save_place(path, target, dir, shown, sizeof shown, &base);
    if (st != EM_OK)
        return st;
    bool exists;
    struct stat sb;
    if ((st = check_target_kind(target, shown, &exists, &sb)) != EM_OK)
        return st;
    char tmp[2 * PATH_MAX + 64];
    int fd = create_temp(dir, base, tmp, sizeof tmp);
    if (fd < 0)
        return create_error(dir, shown, errno, "");
    close(fd);
    unlink(tmp);
    return EM_OK;
}

em_status em_save(const em_dict *d, const char *path, const em_metadata *metadata,
                  const em_save_options *opt) {
    if (!d || !path || !*path)
        return em_set_error(EM_ERR_INVALID, "save: %s", !d ? "dict is NULL" : "path is empty");
    em_save_options o = EM_SAVE_OPTIONS_INIT;
    if (opt) {
        em_status rd = EM__STRUCT_READ(em_save_options, &o, opt,
                                       offsetof(em_save_options, ext), "save");
        if (rd != EM_OK) return rd;
        if (o.order != EM_SAVE_ORDER_DICT && o.order != EM_SAVE_ORDER_PYTHON)
            return em_set_error(EM_ERR_INVALID, "save: '%s': unknown order %d", path, o.order);
    }
    char target[PATH_MAX], dir[PATH_MAX], shown[2 * PATH_MAX + 64];
    const char *base;
    em_status st = save_place(path, target, dir, shown, sizeof shown, &base);
    if (st != EM_OK)
        return st;

    /* Check every key before touching the disk. */
    for (size_t i = 0; metadata && i < metadata->len; i++)
        if (!utf8_valid(metadata->keys[i]) || !utf8_valid(metadata->values[i]))
            return em_set_error(EM_ERR_INVALID, "save: '%s': metadata '%s' is not valid UTF-8",
                                path, metadata->keys[i]);
    size_t n = em_dict_len(d);
    save_entry *e = em__calloc(n ? n : 1, sizeof *e, "save entries");
    if (!e)
        return EM_ERR_NOMEM;
    uint64_t data_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        e[i].key = em_dict_key(d, i);
        e[i].t = em_dict_value(d, i);
        e[i].nbytes = em_tensor_nbytes(e[i].t);
        data_bytes += e[i].nbytes;
        if (strcmp(e[i].key, "__metadata__") == 0) {
            st = em_set_error(EM_ERR_INVALID, "save: '%s': the key '__metadata__' is reserved "
                              "by the safetensors format", path);
            goto out_entries;
        }
        if (!utf8_valid(e[i].key)) {
            st = em_set_error(EM_ERR_INVALID, "save: '%s': key %zu ('%s') is not valid UTF-8",
                              path, i, e[i].key);
            goto out_entries;
        }
    }
    if (o.order == EM_SAVE_ORDER_PYTHON && n > 1)
        qsort(e, n, sizeof *e, python_order_cmp);

    char *header = NULL;
    size_t header_len = 0;
    st = build_header(path, e, n, metadata, &header, &header_len);
    if (st != EM_OK)
        goto out_entries;

    struct stat prev;
    bool had_prev;
    if ((st = check_target_kind(target, shown, &had_prev, &prev)) != EM_OK)
        goto out_header;
    const char *untouched = had_prev ? "; the previous file is untouched" : "";

    writer w = {.fd = -1, .path = shown, .total = 8 + header_len + data_bytes};
    kill_parse(&w);
    char tmp[2 * PATH_MAX + 64]; /* dir and base are each shorter than PATH_MAX - 64 */
    w.fd = create_temp(dir, base, tmp, sizeof tmp);
    if (w.fd < 0) {
        st = create_error(dir, shown, errno, untouched);
        goto out_header;
    }
    if (had_prev)
        (void)fchmod(w.fd, prev.st_mode & 07777); /* keep the file's permissions */
    kill_point(&w, KILL_CREATED);

    xfsz_guard xg;
    xfsz_block(&xg);
    bool pushed = em_grad_mode_push(EM_GRAD_DISABLED) == EM_OK; /* copies need no history */
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)header_len >> (8 * i));
    st = w_write(&w, len8, 8);
    if (st == EM_OK)
        st = w_write(&w, header, header_len);
    for (size_t i = 0; st == EM_OK && i < n; i++)
        st = write_tensor(&w, e[i].t, e[i].key);
    if (pushed)
        em_grad_mode_pop();
    xfsz_restore(&xg);
    if (st == EM_OK) {
        kill_point(&w, KILL_WRITTEN);
        if (fsync(w.fd) != 0)
            st = em_set_error(EM_ERR_IO, "save: syncing %s failed: %s", shown, strerror(errno));
    }
    if (close(w.fd) != 0 && st == EM_OK)
        st = em_set_error(EM_ERR_IO, "save: closing %s failed: %s", shown, strerror(errno));
    if (st == EM_OK) {
        kill_point(&w, KILL_SYNCED);
        if (rename(tmp, target) != 0)
            st = em_set_error(EM_ERR_IO, "save: renaming '%s' to '%s' failed: %s", tmp, target,
                              strerror(errno));
    }
    if (st != EM_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        unlink(tmp);
        em_set_error(em_last_status(), "%s%s", msg, untouched);
        goto out_header;
    }
    kill_point(&w, KILL_RENAMED);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (fsync(dfd) != 0 && errno != EINVAL && errno != EROFS)
            st = em_set_error(EM_ERR_IO, "save: %s was written but syncing its directory "
                              "'%s' failed (%s): the file may not survive a power loss", shown,
                              dir, strerror(errno));
        close(dfd);
    }
out_header:
    free(header);
out_entries:
    em__free(e);
    return st;
}

/* ---- input files ------------------------------------------------------------------------------ */

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO (named pipe)"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int em__input_open(const char *who, const char *path, uint64_t *size) {
    if (size)
        *size = 0;
    if (!path || !*path) {
        em_set_error(EM_ERR_INVALID, "%s: the path is %s", who, path ? "empty" : "NULL");
        return -1;
    }
    /* O_NONBLOCK: opening a FIFO without a writer would block in open() itself. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        em_set_error(errno == ENOENT ? EM_ERR_NOTFOUND : EM_ERR_IO, "%s: cannot open '%s': %s",
                     who, path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        em_set_error(EM_ERR_IO, "%s: cannot stat '%s': %s", who, path, strerror(err));
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        em_set_error(EM_ERR_IO, "%s: '%s' is %s, not a regular file (Ember reads its inputs "
                     "only from regular files: reading this could block or never end)", who,
                     path, file_kind(sb.st_mode));
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size)
        *size = (uint64_t)sb.st_size;
    return fd;
}

em_status em__input_pread(int fd, const char *who, const char *path, void *buf, size_t n,
                          uint64_t off, const char *what) {
    char *p = buf;
    uint64_t pos = off;
    while (n > 0) {
        ssize_t r = pread(fd, p, EM_MIN(n, (size_t)1 << 30), (off_t)pos);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return em_set_error(EM_ERR_IO, "%s: '%s': reading %s at byte %llu failed: %s", who,
                                path, what, (unsigned long long)pos, strerror(errno));
        if (r == 0)
            return em_set_error(EM_ERR_IO, "%s: '%s': the file ends at byte %llu, inside %s "
                                "(%zu more bytes expected): it was truncated or rewritten while "
                                "being read", who, path, (unsigned long long)pos, what, n);
        p += r;
        n -= (size_t)r;
        pos += (uint64_t)r;
    }
    return EM_OK;
}

em_status em__input_read_all(const char *who, const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    uint64_t size;
    int fd = em__input_open(who, path, &size);
    if (fd < 0)
        return em_last_status();
    em_status st = EM_OK;
    char *buf = NULL;
    if (size >= SIZE_MAX)
        st = em_set_error(EM_ERR_RANGE, "%s: '%s' is too large (%llu bytes)", who, path,
                          (unsigned long long)size);
    else if ((buf = em__malloc((size_t)size + 1, "input file")) == NULL)
        st = em_set_error(EM_ERR_NOMEM, "%s: out of memory reading '%s' (%llu bytes)", who,
                          path, (unsigned long long)size);
    else
        st = em__input_pread(fd, who, path, buf, (size_t)size, 0, "the file");
    close(fd);
    if (st != EM_OK) {
        em__free(buf);
        return st;
    }
    buf[size] = '\0';
    *out = buf;
    *len = (size_t)size;
    return EM_OK;
}

/* ---- the reader ------------------------------------------------------------------------------ */

typedef struct load_entry {
    const char *key;     /* borrowed from the JSON document */
    em_dtype dt;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    uint64_t begin, end; /* relative to the data section */
} load_entry;

#define FMT(...) em_set_error(EM_ERR_FORMAT, __VA_ARGS__)

/* A JSON integer >= 0 as uint64, or false. */
static bool json_uint(const json_t *j, uint64_t *out) {
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return false;
    *out = (uint64_t)json_integer_value(j);
    return true;
}

static em_status parse_entry(const char *name, const char *key, const json_t *v,
                             uint64_t data_len, load_entry *e) {
    if (!json_is_object(v))
        return FMT("load: '%s': entry '%s' is not a JSON object", name, key);
    const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                 *offs = json_object_get(v, "data_offsets");
    if (!dt || !shape || !offs)
        return FMT("load: '%s': entry '%s' has no \"%s\"", name, key,
                   !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!json_is_string(dt))
        return FMT("load: '%s': the dtype of '%s' is not a string", name, key);
    if (!st_dtype_parse(json_string_value(dt), &e->dt))
        return em_set_error(EM_ERR_DTYPE, "load: '%s': tensor '%s' has dtype '%s', which Ember "
                            "does not support (supported: " ST_SUPPORTED ")", name, key,
                            json_string_value(dt));
    if (!json_is_array(shape))
        return FMT("load: '%s': the shape of '%s' is not an array", name, key);
    size_t nd = json_array_size(shape);
    if (nd > EM_MAX_DIMS)
        return FMT("load: '%s': tensor '%s' has %zu dims; Ember supports at most %d", name, key,
                   nd, EM_MAX_DIMS);
    e->ndim = (int)nd;
    uint64_t numel = 1, nonzero = 1; /* nonzero: the product of the dims > 0, which the
                                      * strides reach even when a zero dim makes numel 0 */
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t s;
        if (!json_uint(json_array_get(shape, i), &s))
            return FMT("load: '%s': dim %zu of the shape of '%s' is not an integer >= 0", name,
                       i, key);
        e->shape[i] = (int64_t)s;
        overflow |= __builtin_mul_overflow(numel, s, &numel);
        if (s)
            overflow |= __builtin_mul_overflow(nonzero, s, &nonzero) || nonzero > INT64_MAX;
    }
    size_t esize = em_dtype_size(e->dt);
    uint64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)esize, &nbytes);
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_uint(json_array_get(offs, 0), &e->begin) ||
        !json_uint(json_array_get(offs, 1), &e->end))
        return FMT("load: '%s': data_offsets of '%s' are not two integers >= 0", name, key);
    if (e->end < e->begin)
        return FMT("load: '%s': data_offsets [%llu, %llu] of '%s' end before they begin", name,
                   (unsigned long long)e->begin, (unsigned long long)e->end, key);
    if (e->end > data_len)
        return FMT("load: '%s': data_offsets [%llu, %llu] of '%s' run past the end of the "
                   "data (%llu bytes)", name, (unsigned long long)e->begin,
                   (unsigned long long)e->end, key, (unsigned long long)data_len);
    if (overflow || nbytes != e->end - e->begin) {
        char sb[256];
        em__shape_str(e->ndim, e->shape, sb, sizeof sb);
        if (overflow)
            return FMT("load: '%s': shape %s of '%s' is too large", name, sb, key);
        return FMT("load: '%s': shape %s of %s '%s' needs %llu bytes but its data_offsets "
                   "[%llu, %llu] hold %llu", name, sb, st_dtypes[e->dt].name, key,
                   (unsigned long long)nbytes, (unsigned long long)e->begin,
                   (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
    }
    return EM_OK;
}

static int entry_offset_cmp(const void *a, const void *b) {
    const load_entry *x = *(const load_entry *const *)a, *y = *(const load_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* The offsets must tile [0, data_len) exactly, as the specification requires ("the byte
 * buffer needs to be entirely indexed, and cannot contain holes"). */
static em_status check_tiling(const char *name, load_entry *e, size_t n, uint64_t data_len) {
    load_entry **by = em__malloc((n ? n : 1) * sizeof *by, "load offsets");
    if (!by)
        return EM_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        by[i] = &e[i];
    qsort(by, n, sizeof *by, entry_offset_cmp);
    em_status st = EM_OK;
    uint64_t pos = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < n && st == EM_OK; i++) {
        if (by[i]->begin < pos)
            st = FMT("load: '%s': data_offsets of '%s' [%llu, %llu] overlap those of '%s' "
                     "(which end at %llu)", name, by[i]->key,
                     (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end, prev,
                     (unsigned long long)pos);
        else if (by[i]->begin > pos)
            st = FMT("load: '%s': bytes [%llu, %llu) of the data belong to no tensor (a hole "
                     "before '%s')", name, (unsigned long long)pos,
                     (unsigned long long)by[i]->begin, by[i]->key);
        pos = by[i]->end;
        prev = by[i]->key;
    }
    if (st == EM_OK && pos != data_len)
        st = FMT("load: '%s': the tensors cover %llu bytes of data but the file holds %llu "
                 "(truncated, or trailing bytes)", name, (unsigned long long)pos,
                 (unsigned long long)data_len);
    em__free(by);
    return st;
}

/* A validated header: its tensor entries (keys borrowed from root) and its metadata. */
typedef struct st_header {
    json_t *root;
    load_entry *e;
    size_t n;
    em_metadata *meta;
} st_header;

static void header_free(st_header *h) {
    em__free(h->e);
    em_metadata_free(h->meta);
    json_decref(h->root);
    memset(h, 0, sizeof *h);
}

/* When the first 8 bytes of a file that is not safetensors are those of torch.save's formats
 * (a zip archive since PyTorch 1.6, a bare pickle before or with
 * _use_new_zipfile_serialization=False), say so and how to convert it: a .pt/.pth file is the
 * first thing a PyTorch user hands over. Ember never unpickles (a pickle can run code). */
static em_status not_pytorch_pickle(const char *name, const unsigned char *b8) {
    bool zip = b8[0] == 'P' && b8[1] == 'K' && b8[2] == 3 && b8[3] == 4;
    bool pickle = b8[0] == 0x80 && b8[1] >= 2 && b8[1] <= 5;
    if (!zip && !pickle) return EM_OK;
    return FMT("load: '%s' is a PyTorch file written by torch.save (%s), not safetensors; Ember "
               "does not read pickles (loading one can run code). Convert it once in Python: "
               "import torch; from safetensors.torch import save_file; sd = torch.load('%s', "
               "map_location='cpu'); save_file({k: v.contiguous() for k, v in sd.items()}, "
               "'model.safetensors') (for a checkpoint dict, pass its state_dict part)", name,
               zip ? "a zip archive holding a pickle" : "a pickle", name);
}

/* The header length from the first 8 bytes of a file of len bytes, checked against the
 * format's limit and the file's size. */
static em_status header_len(const char *name, const unsigned char *b8, uint64_t len,
                            uint64_t *hlen) {
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h |= (uint64_t)b8[i] << (8 * i);
    if ((h > EM_SAFETENSORS_MAX_HEADER || h > len - 8) && not_pytorch_pickle(name, b8) != EM_OK)
        return em_last_status();
    if (h > EM_SAFETENSORS_MAX_HEADER)
        return FMT("load: '%s': header length %llu exceeds the limit of %llu bytes (not a "
                   "safetensors file?)", name, (unsigned long long)h,
                   EM_SAFETENSORS_MAX_HEADER);
    if (h > len - 8)
        return FMT("load: '%s': header length %llu runs past the end of the file (%llu bytes; "
                   "truncated?)", name, (unsigned long long)h, (unsigned long long)len);
    *hlen = h;
    return EM_OK;
}

static em_status too_short(const char *name, uint64_t len) {
    return FMT("load: '%s': the file is %llu bytes, too short for the 8-byte header length "
               "(truncated?)", name, (unsigned long long)len);
}

/* Parse and validate the JSON header (hlen bytes at text) of a file whose data section holds
 * data_len bytes, completely: nothing after this reads outside the data section. */
static em_status header_parse(const char *name, const char *text, size_t hlen,
                              uint64_t data_len, st_header *h) {
    memset(h, 0, sizeof *h);
    json_error_t jerr;
    json_t *root = json_loadb(text, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return FMT("load: '%s': invalid JSON header at byte %d: %s", name, jerr.position,
                   jerr.text);
    h->root = root;
    if (!json_is_object(root)) {
        header_free(h);
        return FMT("load: '%s': the header is not a JSON object", name);
    }
    em_status st = EM_OK;
    size_t cap = json_object_size(root);
    load_entry *e = h->e = em__calloc(cap ? cap : 1, sizeof *e, "load entries");
    em_metadata *meta = h->meta = em_metadata_new();
    size_t n = 0;
    if (!e || !meta) {
        st = EM_ERR_NOMEM;
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v)) {
                st = FMT("load: '%s': __metadata__ is not a JSON object", name);
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    st = FMT("load: '%s': metadata '%s' is not a string (safetensors metadata "
                             "maps strings to strings)", name, mk);
                    goto fail;
                }
                if (!*mk) {
                    st = FMT("load: '%s': a metadata key is empty", name);
                    goto fail;
                }
                if ((st = em_metadata_set(meta, mk, json_string_value(mv))) != EM_OK)
                    goto fail;
            }
            continue;
        }
        if (!*key) {
            st = FMT("load: '%s': a tensor name is empty", name);
            goto fail;
        }
        e[n].key = key;
        if ((st = parse_entry(name, key, v, data_len, &e[n])) != EM_OK)
            goto fail;
        n++;
    }
    h->n = n;
    if ((st = check_tiling(name, e, n, data_len)) != EM_OK)
        goto fail;
    return EM_OK;
fail:
    header_free(h);
    return st;
}

/* Where a file's tensor bytes come from: a buffer already in memory, or the file itself,
 * read with pread. Files are never mapped: a mapped file that another process truncates
 * while it is copied (cp over it, rsync --inplace) kills the reader with SIGBUS; a read of
 * the same file returns fewer bytes, which is an error naming the file. */
typedef struct st_source {
    const char *name;
    const unsigned char *data; /* buffer: the data section; NULL for a file */
    int fd;                    /* file: its descriptor; -1 for a buffer */
    uint64_t data_off;         /* file: where the data section starts */
} st_source;

/* n bytes of entry e's data, from byte off of its bytes, into dst (host memory). */
static em_status source_read(const st_source *s, const load_entry *e, uint64_t off, void *dst,
                             size_t n) {
    if (!s->data) {
        char what[96];
        snprintf(what, sizeof what, "tensor '%.64s'", e->key);
        return em__input_pread(s->fd, "load", s->name, dst, n, s->data_off + e->begin + off,
                               what);
    }
    if (n)
        memcpy(dst, s->data + e->begin + off, n);
    return EM_OK;
}

#define LOAD_STAGING_BYTES ((size_t)4 << 20)

/* Entry e's bytes into the tensor memory dst on device dev (a bounded staging buffer for a
 * file read onto another device). */
static em_status source_to_device(const st_source *s, const load_entry *e, em_device dev,
                                  void *dst) {
    size_t n = (size_t)(e->end - e->begin);
    if (dev.type == EM_DEVICE_CPU_TYPE)
        return source_read(s, e, 0, dst, n);
    if (s->data)
        return em__device_copy(dev, dst, em_cpu(), s->data + e->begin, n);
    size_t cap = EM_MIN(n, LOAD_STAGING_BYTES);
    char *buf = em__malloc(cap ? cap : 1, "load staging buffer");
    if (!buf)
        return EM_ERR_NOMEM;
    em_status st = EM_OK;
    for (size_t off = 0; st == EM_OK && off < n; off += cap) {
        size_t k = EM_MIN(cap, n - off);
        st = source_read(s, e, off, buf, k);
        if (st == EM_OK)
            st = em__device_copy(dev, (char *)dst + off, em_cpu(), buf, k);
    }
    em__free(buf);
    return st;
}

/* One tensor from its bytes, on the options' device and dtype. */
static em_tensor *make_tensor(const st_source *s, const load_entry *e,
                              const em_load_options *o) {
    em_dtype want = e->dt;
    if (o->convert_floats && em_dtype_is_floating(e->dt))
        want = o->float_dtype;
    bool direct = want == e->dt;
    em_device where = direct ? o->device : em_cpu();
    em_tensor *t = em__empty(e->ndim, e->shape, e->dt, where);
    if (!t)
        return NULL;
    if (source_to_device(s, e, where, em_tensor_data(t)) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    if (direct)
        return t;
    em_tensor *c = em__to_dtype(t, want);
    em_tensor_release(t);
    if (!c)
        return NULL;
    em_tensor *m = em__to_device(c, o->device);
    em_tensor_release(c);
    return m;
}

static em_status options_check(const char *who, const em_load_options *opt,
                               em_load_options *o) {
    *o = (em_load_options)EM_LOAD_OPTIONS_INIT;
    if (!opt)
        return EM_OK;
    em_status rd = EM__STRUCT_READ(em_load_options, o, opt, offsetof(em_load_options, ext), who);
    if (rd != EM_OK) return rd;
    if (o->convert_floats && !em_dtype_is_floating(o->float_dtype))
        return em_set_error(EM_ERR_INVALID, "%s: options.float_dtype is %s; converting floats "
                            "needs a floating dtype", who, em_dtype_name(o->float_dtype));
    return em__device_check(o->device, who);
}

/* The header's entries as a plan sees them (em__st_entry borrows from h). */
static em__st_entry *plan_entries(const st_header *h) {
    em__st_entry *p = em__calloc(h->n ? h->n : 1, sizeof *p, "load plan");
    for (size_t i = 0; p && i < h->n; i++)
        p[i] = (em__st_entry){.key = h->e[i].key, .dtype = h->e[i].dt, .ndim = h->e[i].ndim,
                              .shape = h->e[i].shape};
    return p;
}

/* Run the plan (may be NULL: load everything) into *load (a new array, em__free). */
static em_status plan_run(const st_header *h, em__load_plan_fn plan, void *user, bool **load) {
    *load = em__malloc((h->n ? h->n : 1) * sizeof **load, "load plan");
    if (!*load)
        return EM_ERR_NOMEM;
    for (size_t i = 0; i < h->n; i++)
        (*load)[i] = true;
    if (!plan)
        return EM_OK;
    em__st_entry *p = plan_entries(h);
    if (!p)
        return EM_ERR_NOMEM;
    em_status st = plan(user, p, h->n, h->meta, *load);
    em__free(p);
    if (st != EM_OK && !em__error_pending())
        st = em_set_error(st, "load: the file was refused without a reason");
    return st;
}

/* Every entry the plan kept, as tensors into a new dict. */
static em_status make_dict(const st_source *s, const st_header *h, const bool *load,
                           const em_load_options *o, em_dict **out) {
    em_dict *d = em_dict_new();
    if (!d)
        return EM_ERR_NOMEM;
    em_status st = EM_OK;
    for (size_t i = 0; i < h->n && st == EM_OK; i++) {
        if (!load[i])
            continue;
        em_tensor *t = make_tensor(s, &h->e[i], o);
        if (!t) {
            st = em_last_status();
            if (!strstr(em_last_error(), s->name))
                st = em_set_error(st, "load: '%s': tensor '%s': %s", s->name, h->e[i].key,
                                  em_last_error());
            break;
        }
        st = em_dict_set(d, h->e[i].key, t);
        em_tensor_release(t);
    }
    if (st != EM_OK) {
        em_dict_free(d);
        return st;
    }
    *out = d;
    return EM_OK;
}

/* Hand the header's metadata to the caller (or free it). */
static void give_metadata(st_header *h, em_metadata **metadata_out) {
    if (metadata_out)
        *metadata_out = h->meta;
    else
        em_metadata_free(h->meta);
    h->meta = NULL;
}

em_status em_load_buffer(const void *buf, size_t len, const char *name,
                         const em_load_options *opt, em_dict **out, em_metadata **metadata_out) {
    if (out)
        *out = NULL;
    if (metadata_out)
        *metadata_out = NULL;
    if (!name)
        name = "<buffer>";
    if (!out || (!buf && len))
        return em_set_error(EM_ERR_INVALID, "load: '%s': %s is NULL", name,
                            !out ? "out" : "buffer");
    em_load_options o;
    em_status st = options_check("load", opt, &o);
    if (st != EM_OK)
        return st;
    const unsigned char *b = buf;
    uint64_t hlen;
    if (len < 8)
        return too_short(name, len);
    if ((st = header_len(name, b, len, &hlen)) != EM_OK)
        return st;
    st_header h;
    if ((st = header_parse(name, (const char *)b + 8, (size_t)hlen, len - 8 - hlen, &h)) != EM_OK)
        return st;
    st_source src = {.name = name, .data = b + 8 + hlen, .fd = -1};
    bool *load = NULL;
    st = plan_run(&h, NULL, NULL, &load);
    if (st == EM_OK)
        st = make_dict(&src, &h, load, &o, out);
    em__free(load);
    if (st == EM_OK)
        give_metadata(&h, metadata_out);
    header_free(&h);
    return st;
}

/* An open file with its validated header. */
typedef struct st_file {
    st_source src;
    st_header h;
    struct stat sb; /* when opened: a change by the end is an error */
} st_file;

static void file_close(st_file *f) {
    if (f->src.fd >= 0)
        close(f->src.fd);
    f->src.fd = -1;
    header_free(&f->h);
}

static em_status file_open(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    f->src = (st_source){.name = path, .fd = -1};
    uint64_t len;
    int fd = em__input_open("load", path, &len);
    if (fd < 0)
        return em_last_status();
    f->src.fd = fd;
    em_status st = EM_OK;
    unsigned char b8[8];
    uint64_t hlen = 0;
    char *text = NULL;
    if (fstat(fd, &f->sb) != 0)
        st = em_set_error(EM_ERR_IO, "load: cannot stat '%s': %s", path, strerror(errno));
    else if (len < 8)
        st = too_short(path, len);
    else if ((st = em__input_pread(fd, "load", path, b8, 8, 0, "the header length")) == EM_OK &&
             (st = header_len(path, b8, len, &hlen)) == EM_OK) {
        /* hlen is at most EM_SAFETENSORS_MAX_HEADER and within the file. */
        if (!(text = em__malloc(hlen ? (size_t)hlen : 1, "load header")))
            st = EM_ERR_NOMEM;
        else if ((st = em__input_pread(fd, "load", path, text, (size_t)hlen, 8,
                                       "the header")) == EM_OK)
            st = header_parse(path, text, (size_t)hlen, len - 8 - hlen, &f->h);
    }
    em__free(text);
    if (st != EM_OK) {
        close(fd);
        f->src.fd = -1;
        return st;
    }
    f->src.data_off = 8 + hlen;
    return EM_OK;
}

/* After the reads: the file must be the one that was opened, unchanged (a rewrite of the same
 * size would otherwise give a mix of two files). */
static em_status file_check_unchanged(const st_file *f) {
    struct stat now;
    if (fstat(f->src.fd, &now) != 0)
        return em_set_error(EM_ERR_IO, "load: cannot stat '%s': %s", f->src.name,
                            strerror(errno));
    if (now.st_size != f->sb.st_size || now.st_mtim.tv_sec != f->sb.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != f->sb.st_mtim.tv_nsec)
        return em_set_error(EM_ERR_IO, "load: '%s' changed while it was being read (%s); "
                            "nothing was loaded", f->src.name,
                            now.st_size != f->sb.st_size ? "its size changed"
                                                         : "it was written to");
    return EM_OK;
}

em_status em__load_planned(const char *path, const em_load_options *opt, em__load_plan_fn plan,
                           void *user, em_dict **out, em_metadata **metadata_out) {
    if (out)
        *out = NULL;
    if (metadata_out)
        *metadata_out = NULL;
    if (!path || !out)
        return em_set_error(EM_ERR_INVALID, "load: %s is NULL", !path ? "path" : "out");
    em_load_options o;
    em_status st = options_check("load", opt, &o);
    if (st != EM_OK)
        return st;
    st_file f;
    if ((st = file_open(path, &f)) != EM_OK)
        return st;
    bool *load = NULL;
    em_dict *d = NULL;
    st = plan_run(&f.h, plan, user, &load);
    if (st == EM_OK)
        st = make_dict(&f.src, &f.h, load, &o, &d);
    if (st == EM_OK && (st = file_check_unchanged(&f)) != EM_OK) {
        em_dict_free(d);
        d = NULL;
    }
    em__free(load);
    if (st == EM_OK) {
        *out = d;
        give_metadata(&f.h, metadata_out);
    }
    file_close(&f);
    return st;
}

em_status em_load(const char *path, const em_load_options *opt, em_dict **out,
                  em_metadata **metadata_out) {
    return em__load_planned(path, opt, NULL, NULL, out, metadata_out);
}

/* ---- load_into and its report ---------------------------------------------------------------- */

struct em_load_report {
    em_load_issue *items[EM_LOAD_ISSUE_KIND_COUNT];
    size_t n[EM_LOAD_ISSUE_KIND_COUNT], cap[EM_LOAD_ISSUE_KIND_COUNT];
    char **keys; /* owned copies the items point to */
    size_t nkeys, capkeys;
    size_t loaded;
};

size_t em_load_report_count(const em_load_report *r, em_load_issue_kind kind) {
    if (!r || (unsigned)kind >= EM_LOAD_ISSUE_KIND_COUNT)
        return 0;
    return r->n[kind];
}

const em_load_issue *em_load_report_get(const em_load_report *r, em_load_issue_kind kind,
                                        size_t i) {
    if (!r || (unsigned)kind >= EM_LOAD_ISSUE_KIND_COUNT || i >= r->n[kind])
        return NULL;
    return &r->items[kind][i];
}

size_t em_load_report_loaded(const em_load_report *r) {
    return r ? r->loaded : 0;
}

void em_load_report_free(em_load_report *r) {
    if (!r)
        return;
    for (int k = 0; k < EM_LOAD_ISSUE_KIND_COUNT; k++)
        em__free(r->items[k]);
    for (size_t i = 0; i < r->nkeys; i++)
        em__free(r->keys[i]);
    em__free(r->keys);
    em__free(r);
}

static em_status report_add(em_load_report *r, em_load_issue_kind kind, const char *key,
                            const em_tensor *target, const em__st_entry *source) {
    if (r->n[kind] == r->cap[kind]) {
        size_t cap = r->cap[kind] ? r->cap[kind] * 2 : 8;
        em_load_issue *p = em__realloc(r->items[kind], r->cap[kind] * sizeof *p,
                                       cap * sizeof *p, "load report");
        if (!p)
            return EM_ERR_NOMEM;
        r->items[kind] = p;
        r->cap[kind] = cap;
    }
    if (r->nkeys == r->capkeys) {
        size_t cap = r->capkeys ? r->capkeys * 2 : 8;
        char **p = em__realloc(r->keys, r->capkeys * sizeof *p, cap * sizeof *p, "load report");
        if (!p)
            return EM_ERR_NOMEM;
        r->keys = p;
        r->capkeys = cap;
    }
    char *k = em__strdup(key, "load report key");
    if (!k)
        return EM_ERR_NOMEM;
    r->keys[r->nkeys++] = k;
    em_load_issue *it = &r->items[kind][r->n[kind]++];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    it->key = k;
    it->target_ndim = it->source_ndim = -1;
    if (target) {
        it->target_ndim = em_tensor_ndim(target);
        memcpy(it->target_shape, em_tensor_shape(target), sizeof(int64_t) * (size_t)it->target_ndim);
        it->target_dtype = em_tensor_dtype(target);
    }
    if (source) {
        it->source_ndim = source->ndim;
        memcpy(it->source_shape, source->shape, sizeof(int64_t) * (size_t)it->source_ndim);
        it->source_dtype = source->dtype;
    }
    return EM_OK;
}

/* Append printf-style text at *pos of buf (cap), counting what the whole text needs. */
static void cat(char *buf, size_t cap, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void cat(char *buf, size_t cap, size_t *pos, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*pos < cap ? buf + *pos : NULL, *pos < cap ? cap - *pos : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        *pos += (size_t)n;
}

static size_t report_format(const em_load_report *r, unsigned mask, char *buf, size_t cap) {
    static const char *what[EM_LOAD_ISSUE_KIND_COUNT][2] = {
        {"missing key", "missing keys"},
        {"unexpected key", "unexpected keys"},
        {"shape mismatch", "shape mismatches"},
        {"dtype conversion", "dtype conversions"},
    };
    size_t pos = 0;
    if (cap)
        buf[0] = '\0';
    bool any = false;
    for (int k = 0; r && k < EM_LOAD_ISSUE_KIND_COUNT; k++) {
        if (!(mask & (1u << k)) || r->n[k] == 0)
            continue;
        cat(buf, cap, &pos, "%s%zu %s (", any ? ", " : "", r->n[k], what[k][r->n[k] != 1]);
        any = true;
        for (size_t i = 0; i < r->n[k]; i++) {
            const em_load_issue *it = &r->items[k][i];
            cat(buf, cap, &pos, "%s%s", i ? ", " : "", it->key);
            if (k == EM_LOAD_SHAPE_MISMATCH) {
                char a[256], b[256];
                em__shape_str(it->target_ndim, it->target_shape, a, sizeof a);
                em__shape_str(it->source_ndim, it->source_shape, b, sizeof b);
                cat(buf, cap, &pos, ": %s in the target, %s in the source", a, b);
            } else if (k == EM_LOAD_DTYPE_CONVERTED) {
                cat(buf, cap, &pos, ": %s -> %s", em_dtype_name(it->source_dtype),
                    em_dtype_name(it->target_dtype));
            }
        }
        cat(buf, cap, &pos, ")");
    }
    if (!any)
        cat(buf, cap, &pos, "no problems");
    return pos;
}

size_t em_load_report_format(const em_load_report *r, char *buf, size_t cap) {
    return report_format(r, ~0u, buf, cap);
}

static bool same_shape(const em_tensor *t, const em__st_entry *s) {
    int n = em_tensor_ndim(t);
    return n == s->ndim && memcmp(em_tensor_shape(t), s->shape, sizeof(int64_t) * (size_t)n) == 0;
}

/* The tensors a report compares with a target: a dict's, or a file header's entries (sorted
 * by key for the lookups, each key once: the reader refuses duplicates). */
typedef struct src_set {
    const em_dict *dict;
    const em__st_entry *e;      /* entries, in file order */
    const em__st_entry **by;    /* the same, by key */
    size_t n;
} src_set;

static em__st_entry entry_of(const char *key, const em_tensor *t) {
    return (em__st_entry){.key = key, .dtype = em_tensor_dtype(t), .ndim = em_tensor_ndim(t),
                          .shape = em_tensor_shape(t)};
}

static int entry_key_cmp(const void *a, const void *b) {
    return strcmp((*(const em__st_entry *const *)a)->key, (*(const em__st_entry *const *)b)->key);
}

static em_status src_set_entries(src_set *s, const em__st_entry *e, size_t n) {
    *s = (src_set){.e = e, .n = n};
    s->by = em__malloc((n ? n : 1) * sizeof *s->by, "load report");
    if (!s->by)
        return EM_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        s->by[i] = &e[i];
    qsort(s->by, n, sizeof *s->by, entry_key_cmp);
    return EM_OK;
}

static size_t src_len(const src_set *s) {
    return s->dict ? em_dict_len(s->dict) : s->n;
}

static em__st_entry src_at(const src_set *s, size_t i) {
    return s->dict ? entry_of(em_dict_key(s->dict, i), em_dict_value(s->dict, i)) : s->e[i];
}

/* The source tensor of key into *out; false when there is none. */
static bool src_find(const src_set *s, const char *key, em__st_entry *out) {
    if (s->dict) {
        const em_tensor *t = em_dict_get(s->dict, key);
        if (t)
            *out = entry_of(key, t);
        return t != NULL;
    }
    em__st_entry k = {.key = key};
    const em__st_entry *kp = &k, **hit = bsearch(&kp, s->by, s->n, sizeof *s->by, entry_key_cmp);
    if (hit)
        *out = **hit;
    return hit != NULL;
}

/* Every finding of loading s into target, into a new report. */
static em_status report_check(const em_dict *target, const src_set *s, em_load_report **out) {
    *out = NULL;
    em_load_report *r = em__calloc(1, sizeof *r, "load report");
    if (!r)
        return EM_ERR_NOMEM;
    em_status st = EM_OK;
    size_t nt = em_dict_len(target), ns = src_len(s);
    for (size_t i = 0; i < nt && st == EM_OK; i++) {
        const char *key = em_dict_key(target, i);
        const em_tensor *t = em_dict_value(target, i);
        em__st_entry e;
        if (!src_find(s, key, &e))
            st = report_add(r, EM_LOAD_MISSING, key, t, NULL);
        else if (!same_shape(t, &e))
            st = report_add(r, EM_LOAD_SHAPE_MISMATCH, key, t, &e);
        else if (em_tensor_dtype(t) != e.dtype)
            st = report_add(r, EM_LOAD_DTYPE_CONVERTED, key, t, &e);
    }
    for (size_t i = 0; i < ns && st == EM_OK; i++) {
        em__st_entry e = src_at(s, i);
        if (!em_dict_has(target, e.key))
            st = report_add(r, EM_LOAD_UNEXPECTED, e.key, NULL, &e);
    }
    if (st != EM_OK) {
        em_load_report_free(r);
        return st;
    }
    *out = r;
    return EM_OK;
}

#define REPORT_PROBLEMS (1u << EM_LOAD_MISSING | 1u << EM_LOAD_UNEXPECTED | \
                         1u << EM_LOAD_SHAPE_MISMATCH)

static bool report_has_problems(const em_load_report *r) {
    return r->n[EM_LOAD_MISSING] || r->n[EM_LOAD_UNEXPECTED] || r->n[EM_LOAD_SHAPE_MISMATCH];
}

/* A strict load's refusal: the error "load: [<'name'>: ]<problems>", the report to the caller
 * (or freed). */
static em_status report_refuse(em_load_report *r, const char *name,
                               em_load_report **report_out) {
    char msg[1024];
    report_format(r, REPORT_PROBLEMS, msg, sizeof msg);
    em_status st = name ? em_set_error(EM_ERR_INVALID, "load: '%s': %s", name, msg)
                        : em_set_error(EM_ERR_INVALID, "load: %s", msg);
    if (report_out)
        *report_out = r;
    else
        em_load_report_free(r);
    return st;
}

static void report_give(em_load_report *r, em_load_report **report_out) {
    if (report_out)
        *report_out = r;
    else
        em_load_report_free(r);
}

em_status em_dict_load_into(em_dict *target, const em_dict *source, bool strict,
                            em_load_report **report_out) {
    if (report_out)
        *report_out = NULL;
    if (!target || !source)
        return em_set_error(EM_ERR_INVALID, "load: %s dict is NULL", !target ? "target" : "source");
    src_set s = {.dict = source};
    em_load_report *r;
    em_status st = report_check(target, &s, &r);
    if (st != EM_OK)
        return st;
    if (strict && report_has_problems(r))
        return report_refuse(r, NULL, report_out);
    size_t nt = em_dict_len(target);
    bool pushed = em_grad_mode_push(EM_GRAD_DISABLED) == EM_OK; /* like torch.no_grad() */
    for (size_t i = 0; i < nt; i++) {
        const char *key = em_dict_key(target, i);
        em_tensor *t = em_dict_value(target, i);
        const em_tensor *src = em_dict_get(source, key);
        if (!src)
            continue;
        em__st_entry e = entry_of(key, src);
        if (!same_shape(t, &e))
            continue;
        if (em_copy_(t, src) != EM_OK) {
            st = em_set_error(em_last_status(), "load: copying '%s' failed: %s", key,
                              em_last_error());
            break;
        }
        r->loaded++;
    }
    if (pushed)
        em_grad_mode_pop();
    if (st != EM_OK) {
        em_load_report_free(r);
        return st;
    }
    report_give(r, report_out);
    return EM_OK;
}

em_status em__load_report_entries(const em_dict *target, const em__st_entry *e, size_t n,
                                  const char *prefix, em_load_report **out) {
    *out = NULL;
    size_t plen = prefix ? strlen(prefix) : 0, k = 0;
    em__st_entry *sel = em__calloc(n ? n : 1, sizeof *sel, "load report");
    if (!sel)
        return EM_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        if (!plen || strncmp(e[i].key, prefix, plen) == 0) {
            sel[k] = e[i];
            sel[k++].key += plen;
        }
    src_set s;
    em_status st = src_set_entries(&s, sel, k);
    if (st == EM_OK)
        st = report_check(target, &s, out);
    em__free(s.by);
    em__free(sel);
    return st;
}

em_status em_load_into(const char *path, em_dict *target, bool strict,
                       em_load_report **report_out, em_metadata **metadata_out) {
    if (report_out)
        *report_out = NULL;
    if (metadata_out)
        *metadata_out = NULL;
    if (!path || !target)
        return em_set_error(EM_ERR_INVALID, "load_into: %s is NULL", !path ? "path" : "target");
    st_file f;
    em_status st = file_open(path, &f);
    if (st != EM_OK)
        return st;
    /* Every key and shape is checked from the header: no byte of a tensor the target does not
     * take is ever read. */
    em_load_report *r = NULL;
    em__st_entry *e = plan_entries(&f.h);
    st = e ? em__load_report_entries(target, e, f.h.n, NULL, &r) : EM_ERR_NOMEM;
    em__free(e);
    if (st != EM_OK)
        goto done;
    if (strict && report_has_problems(r)) {
        st = report_refuse(r, path, report_out);
        r = NULL;
        goto done;
    }
    bool pushed = em_grad_mode_push(EM_GRAD_DISABLED) == EM_OK; /* like torch.no_grad() */
    for (size_t i = 0; i < f.h.n && st == EM_OK; i++) {
        const load_entry *le = &f.h.e[i];
        em_tensor *t = em_dict_get(target, le->key);
        em__st_entry se = {.key = le->key, .dtype = le->dt, .ndim = le->ndim, .shape = le->shape};
        if (!t || !same_shape(t, &se))
            continue;
        em_load_options o = EM_LOAD_OPTIONS_INIT;
        o.device = em_tensor_device(t); /* each tensor straight onto its target's device */
        em_tensor *src = make_tensor(&f.src, le, &o);
        if (!src || em_copy_(t, src) != EM_OK) {
            st = em_last_status();
            if (!strstr(em_last_error(), path))
                st = em_set_error(st, "load: '%s': tensor '%s': %s", path, le->key,
                                  em_last_error());
        } else {
            r->loaded++;
        }
        em_tensor_release(src);
    }
    if (pushed)
        em_grad_mode_pop();
    if (st == EM_OK)
        st = file_check_unchanged(&f);
    if (st == EM_OK) {
        report_give(r, report_out);
        r = NULL;
        give_metadata(&f.h, metadata_out);
    }
done:
    em_load_report_free(r);
    file_close(&f);
    return st;
}

/* ---- checkpoint files: naming, listing by run, rotation ---------------------------------------- */

#define STEP_TOKEN "{step}"

typedef struct pattern_parts {
    char dir[PATH_MAX];
    bool dir_given; /* the pattern names a directory (else dir is ".", left out of paths) */
    char prefix[NAME_MAX + 1], suffix[NAME_MAX + 1];
} pattern_parts;

static em_status pattern_split(const char *who, const char *pattern, pattern_parts *p) {
    if (!pattern)
        return em_set_error(EM_ERR_INVALID, "%s: pattern is NULL", who);
    const char *tok = strstr(pattern, STEP_TOKEN);
    if (!tok)
        return em_set_error(EM_ERR_INVALID, "%s: pattern '%s' has no " STEP_TOKEN, who, pattern);
    if (strstr(tok + 1, STEP_TOKEN))
        return em_set_error(EM_ERR_INVALID, "%s: pattern '%s' has more than one " STEP_TOKEN,
                            who, pattern);
    if (strchr(tok, '/'))
        return em_set_error(EM_ERR_INVALID, "%s: pattern '%s' has " STEP_TOKEN " in a "
                            "directory name; it must be in the file name", who, pattern);
    const char *base = path_base(pattern, p->dir, sizeof p->dir);
    p->dir_given = base != pattern;
    size_t pre = (size_t)(tok - base), suf = strlen(tok + strlen(STEP_TOKEN));
    if (pre > NAME_MAX || suf > NAME_MAX)
        return em_set_error(EM_ERR_INVALID, "%s: pattern '%s' is too long", who, pattern);
    memcpy(p->prefix, base, pre);
    p->prefix[pre] = '\0';
    memcpy(p->suffix, tok + strlen(STEP_TOKEN), suf + 1);
    return EM_OK;
}

em_status em_checkpoint_path(const char *pattern, int64_t step, char *buf, size_t cap) {
    pattern_parts p;
    em_status st = pattern_split("checkpoint_path", pattern, &p);
    if (st != EM_OK)
        return st;
    if (step < 0)
        return em_set_error(EM_ERR_INVALID, "checkpoint_path: step %lld is negative",
                            (long long)step);
    if (!buf)
        return em_set_error(EM_ERR_INVALID, "checkpoint_path: buf is NULL");
    const char *tok = strstr(pattern, STEP_TOKEN);
    int n = snprintf(buf, cap, "%.*s%lld%s", (int)(tok - pattern), pattern, (long long)step,
                     tok + strlen(STEP_TOKEN));
    if (n < 0 || (size_t)n >= cap)
        return em_set_error(EM_ERR_RANGE, "checkpoint_path: the path for step %lld needs %d "
                            "bytes, the buffer has %zu", (long long)step, n + 1, cap);
    return EM_OK;
}

/* The step a directory entry stands for, or -1 when it does not match. */
static int64_t match_step(const pattern_parts *p, const char *name) {
    size_t len = strlen(name), pre = strlen(p->prefix), suf = strlen(p->suffix);
    if (len <= pre + suf || strncmp(name, p->prefix, pre) != 0 ||
        strcmp(name + len - suf, p->suffix) != 0)
        return -1;
    size_t digits = len - pre - suf;
    if (digits > 18)
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < digits; i++) {
        char c = name[pre + i];
        if (c < '0' || c > '9')
            return -1;
        v = v * 10 + (c - '0');
    }
    return v;
}

bool em__checkpoint_run_id_valid(const char *s) {
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == ':' || c == '+' || c == '@' || c == '-';
        if (!ok || n + 1 >= EM_CHECKPOINT_RUN_ID_MAX)
            return false;
    }
    return n > 0;
}

struct em_checkpoint_files {
    em_checkpoint_file *f; /* [n], highest step first */
    size_t n, cap;
};

size_t em_checkpoint_files_len(const em_checkpoint_files *l) {
    return l ? l->n : 0;
}

const em_checkpoint_file *em_checkpoint_files_get(const em_checkpoint_files *l, size_t i) {
    return l && i < l->n ? &l->f[i] : NULL;
}

void em_checkpoint_files_free(em_checkpoint_files *l) {
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++) {
        em__free((void *)l->f[i].path);
        em__free((void *)l->f[i].error);
    }
    em__free(l->f);
    em__free(l);
}

static bool read_full(int fd, void *buf, size_t n, off_t off) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        off += r;
        n -= (size_t)r;
    }
    return true;
}

/* Fill f's run_id, is_checkpoint and mtime from the file's header (only the header is read:
 * its length is bounded by the file's size and EM_SAFETENSORS_MAX_HEADER). On failure the
 * status and a message naming the file, into err. Non-blocking open: a FIFO never hangs. */
static em_status read_run_of(em_checkpoint_file *f, char *err, size_t cap) {
    int fd = open(f->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, cap, "'%s': cannot open it: %s", f->path, strerror(errno));
        return errno == ENOENT ? EM_ERR_NOTFOUND : EM_ERR_IO;
    }
    em_status st = EM_OK;
    char *h = NULL;
    json_t *root = NULL;
    struct stat sb;
    unsigned char len8[8];
    uint64_t hlen = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, cap, "'%s' is not a regular file", f->path);
        st = EM_ERR_IO;
        goto done;
    }
    f->mtime = (int64_t)sb.st_mtime;
    if (sb.st_size < 8 || !read_full(fd, len8, 8, 0)) {
        snprintf(err, cap, "'%s': the file is %lld bytes, too short for a safetensors header "
                 "(truncated?)", f->path, (long long)sb.st_size);
        st = EM_ERR_FORMAT;
        goto done;
    }
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen > EM_SAFETENSORS_MAX_HEADER || hlen > (uint64_t)sb.st_size - 8) {
        snprintf(err, cap, "'%s': header length %llu runs past the end of the file (%lld "
                 "bytes; truncated?)", f->path, (unsigned long long)hlen, (long long)sb.st_size);
        st = EM_ERR_FORMAT;
        goto done;
    }
    if (!(h = em__malloc(hlen ? (size_t)hlen : 1, "checkpoint header"))) {
        snprintf(err, cap, "'%s': out of memory reading its header", f->path);
        st = EM_ERR_NOMEM;
        goto done;
    }
    if (!read_full(fd, h, (size_t)hlen, 8)) {
        snprintf(err, cap, "'%s': reading its header failed: %s", f->path, strerror(errno));
        st = EM_ERR_IO;
        goto done;
    }
    json_error_t jerr;
    root = json_loadb(h, (size_t)hlen, 0, &jerr);
    const json_t *meta = json_is_object(root) ? json_object_get(root, "__metadata__") : NULL;
    if (!json_is_object(root) || (meta && !json_is_object(meta))) {
        snprintf(err, cap, "'%s': the header is not a safetensors JSON object%s%s", f->path,
                 root ? "" : ": ", root ? "" : jerr.text);
        st = EM_ERR_FORMAT;
        goto done;
    }
    const json_t *run = meta ? json_object_get(meta, EM_CHECKPOINT_RUN_KEY) : NULL;
    f->is_checkpoint = meta && json_is_string(json_object_get(meta, "ember.checkpoint"));
    if (run && (!json_is_string(run) || !em__checkpoint_run_id_valid(json_string_value(run)))) {
        snprintf(err, cap, "'%s': metadata entry '" EM_CHECKPOINT_RUN_KEY "' is not a run "
                 "identity (1 to %d characters of A-Z a-z 0-9 . _ : + @ -)", f->path,
                 EM_CHECKPOINT_RUN_ID_MAX - 1);
        st = EM_ERR_FORMAT;
        goto done;
    }
    if (run)
        snprintf(f->run_id, sizeof f->run_id, "%s", json_string_value(run));
done:
    json_decref(root);
    em__free(h);
    close(fd);
    return st;
}

static int file_desc_cmp(const void *a, const void *b) {
    const em_checkpoint_file *x = a, *y = b;
    if (x->step != y->step)
        return x->step > y->step ? -1 : 1;
    return strcmp(x->path, y->path);
}

static void join(char *buf, size_t cap, const pattern_parts *p, const char *name) {
    if (!p->dir_given)
        snprintf(buf, cap, "%s", name);
    else if (strcmp(p->dir, "/") == 0)
        snprintf(buf, cap, "/%s", name);
    else
        snprintf(buf, cap, "%s/%s", p->dir, name);
}

/* Every file of the pattern's directory that matches it, highest step first, each with the
 * run its header names. */
static em_status list_files(const char *who, const pattern_parts *p, em_checkpoint_files **out) {
    *out = NULL;
    DIR *dir = opendir(p->dir);
    if (!dir)
        return em_set_error(errno == ENOENT ? EM_ERR_NOTFOUND : EM_ERR_IO,
                            "%s: cannot read the directory '%s': %s", who, p->dir,
                            strerror(errno));
    em_checkpoint_files *l = em__calloc(1, sizeof *l, "checkpoint list");
    em_status st = l ? EM_OK : EM_ERR_NOMEM;
    struct dirent *de;
    while (st == EM_OK && (de = readdir(dir)) != NULL) {
        int64_t step = match_step(p, de->d_name);
        if (step < 0)
            continue;
        if (l->n == l->cap) {
            size_t nc = l->cap ? l->cap * 2 : 16;
            em_checkpoint_file *nf = em__realloc(l->f, l->cap * sizeof *nf, nc * sizeof *nf,
                                                 "checkpoint list");
            if (!nf) {
                st = EM_ERR_NOMEM;
                break;
            }
            l->f = nf;
            l->cap = nc;
        }
        em_checkpoint_file *f = &l->f[l->n];
        memset(f, 0, sizeof *f);
        f->step = step;
        char path[PATH_MAX + NAME_MAX + 2];
        join(path, sizeof path, p, de->d_name);
        if (!(f->path = em__strdup(path, "checkpoint name"))) {
            st = EM_ERR_NOMEM;
            break;
        }
        l->n++;
        char err[1024];
        if ((f->status = read_run_of(f, err, sizeof err)) != EM_OK &&
            !(f->error = em__strdup(err, "checkpoint error")))
            st = EM_ERR_NOMEM;
    }
    closedir(dir);
    if (st != EM_OK) {
        em_checkpoint_files_free(l);
        return st;
    }
    if (l->n > 1)
        qsort(l->f, l->n, sizeof *l->f, file_desc_cmp);
    *out = l;
    return EM_OK;
}

em_status em_checkpoint_list(const char *pattern, em_checkpoint_files **out) {
    if (!out)
        return em_set_error(EM_ERR_INVALID, "checkpoint_list: out is NULL");
    *out = NULL;
    if (pattern && !strstr(pattern, STEP_TOKEN)) { /* one file: itself, when it exists */
        em_checkpoint_files *l = em__calloc(1, sizeof *l, "checkpoint list");
        struct stat sb;
        if (!l)
            return EM_ERR_NOMEM;
        if (stat(pattern, &sb) == 0) {
            em_checkpoint_file *f = l->f = em__calloc(1, sizeof *f, "checkpoint list");
            char err[1024];
            if (f && (f->path = em__strdup(pattern, "checkpoint name"))) {
                l->n = l->cap = 1;
                f->step = -1;
                if ((f->status = read_run_of(f, err, sizeof err)) != EM_OK)
                    f->error = em__strdup(err, "checkpoint error");
            }
            if (!f || !f->path || (f->status != EM_OK && !f->error)) {
                em_checkpoint_files_free(l);
                return EM_ERR_NOMEM;
            }
        }
        *out = l;
        return EM_OK;
    }
    pattern_parts p;
    em_status st = pattern_split("checkpoint_list", pattern, &p);
    if (st != EM_OK)
        return st;
    return list_files("checkpoint_list", &p, out);
}

/* "run 'A' (3 files, steps 100 to 300, the newest 'ck/run-300.safetensors'); run 'B' (...)":
 * the runs of l's readable files, each once, in the order of their newest files. */
static void describe_runs(const em_checkpoint_files *l, char *buf, size_t cap) {
    size_t pos = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < l->n; i++) {
        const em_checkpoint_file *f = &l->f[i];
        bool seen = f->status != EM_OK;
        for (size_t j = 0; j < i && !seen; j++)
            seen = l->f[j].status == EM_OK && strcmp(l->f[j].run_id, f->run_id) == 0;
        if (seen)
            continue;
        size_t count = 0;
        int64_t lowest = f->step;
        for (size_t j = i; j < l->n; j++)
            if (l->f[j].status == EM_OK && strcmp(l->f[j].run_id, f->run_id) == 0) {
                count++;
                lowest = l->f[j].step;
            }
        char who[EM_CHECKPOINT_RUN_ID_MAX + 16];
        if (f->run_id[0])
            snprintf(who, sizeof who, "run '%s'", f->run_id);
        else
            snprintf(who, sizeof who, "no recorded run");
        char steps[64];
        if (count == 1)
            snprintf(steps, sizeof steps, "step %lld", (long long)f->step);
        else
            snprintf(steps, sizeof steps, "steps %lld to %lld", (long long)lowest,
                     (long long)f->step);
        cat(buf, cap, &pos, "%s%s (%zu file%s, %s, the newest '%s')", pos ? "; " : "", who,
            count, count == 1 ? "" : "s", steps, f->path);
    }
}

em_status em_checkpoint_latest(const char *pattern, int64_t *step, char *buf, size_t cap) {
    pattern_parts p;
    em_status st = pattern_split("checkpoint_latest", pattern, &p);
    if (st != EM_OK)
        return st;
    if (!step)
        return em_set_error(EM_ERR_INVALID, "checkpoint_latest: step is NULL");
    em_checkpoint_files *l;
    if ((st = list_files("checkpoint_latest", &p, &l)) != EM_OK)
        return st;
    const em_checkpoint_file *best = NULL, *unreadable = NULL;
    size_t runs = 0;
    for (size_t i = 0; i < l->n; i++) {
        const em_checkpoint_file *f = &l->f[i];
        if (f->status != EM_OK) {
            if (!unreadable)
                unreadable = f;
            continue;
        }
        if (!best) {
            best = f;
            runs = 1;
        } else if (strcmp(f->run_id, best->run_id) != 0) {
            runs++;
        }
    }
    if (l->n == 0) {
        st = em_set_error(EM_ERR_NOTFOUND, "checkpoint_latest: no file in '%s' matches '%s'",
                          p.dir, pattern);
    } else if (!best) {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint_latest: none of the %zu file%s matching "
                          "'%s' can be read; the newest: %s", l->n, l->n == 1 ? "" : "s",
                          pattern, unreadable->error);
    } else if (runs > 1) {
        char text[900];
        describe_runs(l, text, sizeof text);
        st = em_set_error(EM_ERR_STATE, "checkpoint_latest: the files matching '%s' belong to "
                          "different runs, so which is the latest is not clear: %s", pattern,
                          text);
    } else {
        *step = best->step;
        if (buf && strlen(best->path) >= cap)
            st = em_set_error(EM_ERR_RANGE, "checkpoint_latest: the path '%s' needs %zu bytes, "
                              "the buffer has %zu", best->path, strlen(best->path) + 1, cap);
        else if (buf)
            memcpy(buf, best->path, strlen(best->path) + 1);
    }
    em_checkpoint_files_free(l);
    return st;
}

static bool same_file(const struct stat *a, const char *path) {
    struct stat b;
    return stat(path, &b) == 0 && a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

em_status em_checkpoint_rotate(const char *pattern, const char *written, int keep,
                               em_checkpoint_rotation *out) {
    if (out)
        *out = (em_checkpoint_rotation){0, 0, -1};
    pattern_parts p;
    em_status st = pattern_split("checkpoint_rotate", pattern, &p);
    if (st != EM_OK)
        return st;
    if (keep < 0)
        return em_set_error(EM_ERR_INVALID, "checkpoint_rotate: keep is %d; it must be >= 0 "
                            "(0: the default, %d)", keep, EM_CHECKPOINT_KEEP_DEFAULT);
    if (keep == 0)
        keep = EM_CHECKPOINT_KEEP_DEFAULT;
    if (!written)
        return em_set_error(EM_ERR_INVALID, "checkpoint_rotate: written is NULL (the file just "
                            "saved, whose run's older files are rotated)");
    struct stat ws;
    if (stat(written, &ws) != 0)
        return em_set_error(errno == ENOENT ? EM_ERR_NOTFOUND : EM_ERR_IO, "checkpoint_rotate: "
                            "the file just written, '%s': %s", written, strerror(errno));
    em_checkpoint_files *l;
    if ((st = list_files("checkpoint_rotate", &p, &l)) != EM_OK)
        return st;
    const em_checkpoint_file *me = NULL;
    for (size_t i = 0; i < l->n && !me; i++)
        if (same_file(&ws, l->f[i].path))
            me = &l->f[i];
    if (!me) {
        st = em_set_error(EM_ERR_INVALID, "checkpoint_rotate: '%s' is not one of the files of "
                          "the pattern '%s'", written, pattern);
    } else if (me->status != EM_OK) {
        st = em_set_error(me->status, "checkpoint_rotate: %s", me->error);
    } else if (!me->run_id[0]) {
        st = em_set_error(EM_ERR_INVALID, "checkpoint_rotate: '%s' records no run (metadata "
                          "'" EM_CHECKPOINT_RUN_KEY "'), so there is no run whose files to "
                          "rotate; write it with em_checkpoint_save", written);
    }
    int kept = 0;
    for (size_t i = 0; st == EM_OK && i < l->n; i++) {
        const em_checkpoint_file *f = &l->f[i];
        if (f->status != EM_OK || strcmp(f->run_id, me->run_id) != 0) {
            if (out) {
                out->others++;
                if (f->step > out->others_newest_step)
                    out->others_newest_step = f->step;
            }
            continue;
        }
        if (kept < keep) {
            kept++;
            continue;
        }
        if (f == me || same_file(&ws, f->path))
            continue; /* never the file just written, under any of its names */
        if (unlink(f->path) != 0 && errno != ENOENT)
            st = em_set_error(EM_ERR_IO, "checkpoint_rotate: cannot delete '%s': %s", f->path,
                              strerror(errno));
        else if (out)
            out->removed++;
    }
    em_checkpoint_files_free(l);
    return st;
}

/* ---- temporary files of killed saves --------------------------------------------------------- */

/* Whether `rest` is "HOST-PID-N" with this host's tag and the pid of a process that no longer
 * exists (kill(pid, 0) fails with ESRCH; EPERM means it lives under another user). */
static bool stale_tail(const char *rest, const char *host) {
    const char *d2 = strrchr(rest, '-');
    if (!d2 || !d2[1] || strspn(d2 + 1, "0123456789") != strlen(d2 + 1))
        return false;
    const char *d1 = d2;
    while (d1 > rest && d1[-1] != '-')
        d1--;
    if (d1 - 1 <= rest || d1 == d2)
        return false; /* no host, or no pid */
    size_t hl = (size_t)(d1 - 1 - rest), pl = (size_t)(d2 - d1);
    if (hl != strlen(host) || strncmp(rest, host, hl) != 0 || pl > 9 ||
        strspn(d1, "0123456789") < pl)
        return false;
    long pid = strtol(d1, NULL, 10);
    if (pid <= 0 || pid == (long)getpid())
        return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

em_status em_save_remove_stale(const char *path, size_t *removed) {
    if (removed)
        *removed = 0;
    if (!path || !*path)
        return em_set_error(EM_ERR_INVALID, "save_remove_stale: path is %s",
                            path ? "empty" : "NULL");
    pattern_parts p;
    bool is_pattern = strstr(path, STEP_TOKEN) != NULL;
    char target[PATH_MAX], dirbuf[PATH_MAX];
    const char *dname = NULL, *base = NULL;
    em_status st;
    if (is_pattern) {
        if ((st = pattern_split("save_remove_stale", path, &p)) != EM_OK)
            return st;
        dname = p.dir;
    } else {
        if ((st = resolve_target(path, target, sizeof target)) != EM_OK)
            return st;
        base = path_base(target, dirbuf, sizeof dirbuf);
        dname = dirbuf;
    }
    DIR *dir = opendir(dname);
    if (!dir)
        return errno == ENOENT ? EM_OK /* no directory, no files */
                               : em_set_error(EM_ERR_IO, "save_remove_stale: cannot read the "
                                              "directory '%s': %s", dname, strerror(errno));
    char host[40];
    em__host_tag(host, sizeof host);
    struct dirent *de;
    while (st == EM_OK && (de = readdir(dir)) != NULL) {
        const char *name = de->d_name, *tmp = NULL;
        for (const char *q = strstr(name, ".tmp-"); q; q = strstr(q + 1, ".tmp-"))
            tmp = q; /* the last: the tail after it holds no '.' */
        if (name[0] != '.' || !tmp || tmp == name)
            continue;
        char target_name[NAME_MAX + 1];
        size_t tl = (size_t)(tmp - name - 1);
        if (tl > NAME_MAX)
            continue;
        memcpy(target_name, name + 1, tl);
        target_name[tl] = '\0';
        bool ours = is_pattern ? match_step(&p, target_name) >= 0 : strcmp(target_name, base) == 0;
        if (!ours || !stale_tail(tmp + 5, host))
            continue;
        char full[PATH_MAX + NAME_MAX + 2];
        snprintf(full, sizeof full, "%s/%s", dname, name);
        if (unlink(full) != 0 && errno != ENOENT)
            st = em_set_error(EM_ERR_IO, "save_remove_stale: cannot delete '%s': %s", full,
                              strerror(errno));
        else if (removed)
            (*removed)++;
    }
    closedir(dir);
    return st;
}

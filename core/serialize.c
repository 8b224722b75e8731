/*
 * serialize.c — safetensors files (ember/serialize.h): metadata maps, the crash-safe streaming
 * writer, the validating reader, copying a dict into existing tensors with a report, and
 * checkpoint rotation.
 *
 * Writing. The header is built with jansson (compact, in the order Python's safetensors uses:
 * __metadata__, then per tensor dtype/shape/data_offsets), padded with spaces to a multiple of
 * 8 bytes, then each tensor's bytes are written straight from its memory (CPU) or through a
 * bounded staging buffer (other devices). Everything goes to a temporary file beside the
 * target, which is fsync'd, renamed over the target, and the directory fsync'd. The
 * EMBER_TEST_SAVE_KILL hook (test-only, see the header) raises SIGKILL at a chosen byte or
 * step so the tests can prove a killed save never damages the previous file.
 *
 * Reading. The file is mapped; the header is validated completely — length, JSON (jansson,
 * duplicates rejected), every entry's dtype, shape and offsets, and that the offsets tile the
 * data section exactly (no overlap, no hole, nothing past the end: the same rules as Python's
 * safetensors) — before any tensor is created, so a malformed file fails cleanly and no read
 * ever leaves the mapping. Then each tensor's bytes are copied onto the target device.
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
    const char *path;   /* the target, for messages */
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
    return em_set_error(EM_ERR_IO, "save: writing '%s' failed after %llu of %llu bytes: %s",
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
        return em_set_error(em_last_status(), "save: '%s': making '%s' contiguous failed: %s",
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
                em_set_error(st, "save: '%s': copying '%s' from %s failed: %s", w->path, key,
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

em_status em_save(const em_dict *d, const char *path, const em_metadata *metadata,
                  const em_save_options *opt) {
    if (!d || !path || !*path)
        return em_set_error(EM_ERR_INVALID, "save: %s", !d ? "dict is NULL" : "path is empty");
    em_save_options o = EM_SAVE_OPTIONS_INIT;
    if (opt) {
        if (opt->struct_size < sizeof(em_save_options))
            return em_set_error(EM_ERR_INVALID, "save: options.struct_size is %zu, expected "
                                "sizeof(em_save_options) = %zu (use EM_SAVE_OPTIONS_INIT)",
                                opt->struct_size, sizeof(em_save_options));
        o = *opt;
        if (o.order != EM_SAVE_ORDER_DICT && o.order != EM_SAVE_ORDER_PYTHON)
            return em_set_error(EM_ERR_INVALID, "save: '%s': unknown order %d", path, o.order);
    }
    char dir[PATH_MAX];
    const char *base = path_base(path, dir, sizeof dir);
    if (!*base)
        return em_set_error(EM_ERR_INVALID, "save: '%s' names a directory, not a file", path);
    if (strlen(path) + 64 >= PATH_MAX)
        return em_set_error(EM_ERR_INVALID, "save: path '%.64s...' is too long", path);

    /* Check every key before touching the disk. */
    for (size_t i = 0; metadata && i < metadata->len; i++)
        if (!utf8_valid(metadata->keys[i]) || !utf8_valid(metadata->values[i]))
            return em_set_error(EM_ERR_INVALID, "save: '%s': metadata '%s' is not valid UTF-8",
                                path, metadata->keys[i]);
    size_t n = em_dict_len(d);
    save_entry *e = em__calloc(n ? n : 1, sizeof *e, "save entries");
    if (!e)
        return EM_ERR_NOMEM;
    em_status st = EM_OK;
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
    bool had_prev = stat(path, &prev) == 0;
    if (had_prev && S_ISDIR(prev.st_mode)) {
        st = em_set_error(EM_ERR_INVALID, "save: '%s' is a directory", path);
        goto out_header;
    }
    const char *untouched = had_prev ? "; the previous file is untouched" : "";

    writer w = {.fd = -1, .path = path, .total = 8 + header_len + data_bytes};
    kill_parse(&w);
    char tmp[2 * PATH_MAX + 64]; /* dir and base are each shorter than PATH_MAX - 64 */
    for (int attempt = 0;; attempt++) {
        snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%ld-%u", dir, base, (long)getpid(),
                 atomic_fetch_add(&tmp_counter, 1));
        w.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w.fd >= 0 || errno != EEXIST || attempt == 100)
            break;
    }
    if (w.fd < 0) {
        int err = errno;
        st = em_set_error(EM_ERR_IO, "save: cannot create a file in '%s' for '%s': %s%s", dir, path,
                          strerror(err), untouched);
        goto out_header;
    }
    if (had_prev)
        (void)fchmod(w.fd, prev.st_mode & 07777); /* keep the file's permissions */
    kill_point(&w, KILL_CREATED);

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
    if (st == EM_OK) {
        kill_point(&w, KILL_WRITTEN);
        if (fsync(w.fd) != 0)
            st = em_set_error(EM_ERR_IO, "save: syncing '%s' failed: %s", path, strerror(errno));
    }
    if (close(w.fd) != 0 && st == EM_OK)
        st = em_set_error(EM_ERR_IO, "save: closing '%s' failed: %s", path, strerror(errno));
    if (st == EM_OK) {
        kill_point(&w, KILL_SYNCED);
        if (rename(tmp, path) != 0)
            st = em_set_error(EM_ERR_IO, "save: renaming '%s' to '%s' failed: %s", tmp, path,
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
            st = em_set_error(EM_ERR_IO, "save: '%s' was written but syncing its directory "
                              "'%s' failed (%s): the file may not survive a power loss", path,
                              dir, strerror(errno));
        close(dfd);
    }
out_header:
    free(header);
out_entries:
    em__free(e);
    return st;
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

/* One tensor from its bytes in host memory, on the options' device and dtype. */
static em_tensor *make_tensor(const load_entry *e, const unsigned char *bytes,
                              const em_load_options *o) {
    em_dtype want = e->dt;
    if (o->convert_floats && em_dtype_is_floating(e->dt))
        want = o->float_dtype;
    bool direct = want == e->dt;
    em_device where = direct ? o->device : em_cpu();
    em_tensor *t = em__empty(e->ndim, e->shape, e->dt, where);
    if (!t)
        return NULL;
    em_status st = em__device_copy(where, em_tensor_data(t), em_cpu(), bytes,
                                   (size_t)(e->end - e->begin));
    if (st != EM_OK) {
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
    if (opt->struct_size < sizeof(em_load_options))
        return em_set_error(EM_ERR_INVALID, "%s: options.struct_size is %zu, expected "
                            "sizeof(em_load_options) = %zu (use EM_LOAD_OPTIONS_INIT)", who,
                            opt->struct_size, sizeof(em_load_options));
    *o = *opt;
    if (o->convert_floats && !em_dtype_is_floating(o->float_dtype))
        return em_set_error(EM_ERR_INVALID, "%s: options.float_dtype is %s; converting floats "
                            "needs a floating dtype", who, em_dtype_name(o->float_dtype));
    return em__device_check(o->device, who);
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
    if (len < 8)
        return FMT("load: '%s': the file is %zu bytes, too short for the 8-byte header length "
                   "(truncated?)", name, len);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)b[i] << (8 * i);
    if (hlen > EM_SAFETENSORS_MAX_HEADER)
        return FMT("load: '%s': header length %llu exceeds the limit of %llu bytes (not a "
                   "safetensors file?)", name, (unsigned long long)hlen,
                   EM_SAFETENSORS_MAX_HEADER);
    if (hlen > len - 8)
        return FMT("load: '%s': header length %llu runs past the end of the file (%zu bytes; "
                   "truncated?)", name, (unsigned long long)hlen, len);
    uint64_t data_len = len - 8 - hlen;
    const unsigned char *data = b + 8 + hlen;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return FMT("load: '%s': invalid JSON header at byte %d: %s", name, jerr.position,
                   jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return FMT("load: '%s': the header is not a JSON object", name);
    }

    size_t cap = json_object_size(root);
    load_entry *e = em__calloc(cap ? cap : 1, sizeof *e, "load entries");
    em_metadata *meta = em_metadata_new();
    em_dict *d = em_dict_new();
    size_t n = 0;
    if (!e || !meta || !d) {
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
    if ((st = check_tiling(name, e, n, data_len)) != EM_OK)
        goto fail;

    for (size_t i = 0; i < n; i++) {
        em_tensor *t = make_tensor(&e[i], data + e[i].begin, &o);
        if (!t) {
            st = em_set_error(em_last_status(), "load: '%s': tensor '%s': %s", name, e[i].key,
                              em_last_error());
            goto fail;
        }
        st = em_dict_set(d, e[i].key, t);
        em_tensor_release(t);
        if (st != EM_OK)
            goto fail;
    }
    em__free(e);
    json_decref(root);
    *out = d;
    if (metadata_out)
        *metadata_out = meta;
    else
        em_metadata_free(meta);
    return EM_OK;
fail:
    em__free(e);
    em_metadata_free(meta);
    em_dict_free(d);
    json_decref(root);
    return st;
}

em_status em_load(const char *path, const em_load_options *opt, em_dict **out,
                  em_metadata **metadata_out) {
    if (out)
        *out = NULL;
    if (metadata_out)
        *metadata_out = NULL;
    if (!path || !out)
        return em_set_error(EM_ERR_INVALID, "load: %s is NULL", !path ? "path" : "out");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return em_set_error(errno == ENOENT ? EM_ERR_NOTFOUND : EM_ERR_IO,
                            "load: cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return em_set_error(EM_ERR_IO, "load: cannot stat '%s': %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return em_set_error(EM_ERR_IO, "load: '%s' %s", path,
                            S_ISDIR(sb.st_mode) ? "is a directory" : "is not a regular file");
    }
    size_t len = (size_t)sb.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int err = errno;
            close(fd);
            return em_set_error(EM_ERR_IO, "load: cannot map '%s' (%zu bytes): %s", path, len,
                                strerror(err));
        }
    }
    close(fd);
    em_status st = em_load_buffer(map, len, path, opt, out, metadata_out);
    if (map)
        munmap(map, len);
    return st;
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
                            const em_tensor *target, const em_tensor *source) {
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
        it->source_ndim = em_tensor_ndim(source);
        memcpy(it->source_shape, em_tensor_shape(source), sizeof(int64_t) * (size_t)it->source_ndim);
        it->source_dtype = em_tensor_dtype(source);
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

static bool same_shape(const em_tensor *a, const em_tensor *b) {
    int n = em_tensor_ndim(a);
    return n == em_tensor_ndim(b) &&
           memcmp(em_tensor_shape(a), em_tensor_shape(b), sizeof(int64_t) * (size_t)n) == 0;
}

em_status em_dict_load_into(em_dict *target, const em_dict *source, bool strict,
                            em_load_report **report_out) {
    if (report_out)
        *report_out = NULL;
    if (!target || !source)
        return em_set_error(EM_ERR_INVALID, "load: %s dict is NULL", !target ? "target" : "source");
    em_load_report *r = em__calloc(1, sizeof *r, "load report");
    if (!r)
        return EM_ERR_NOMEM;
    em_status st = EM_OK;
    size_t nt = em_dict_len(target), ns = em_dict_len(source);
    for (size_t i = 0; i < nt && st == EM_OK; i++) {
        const char *key = em_dict_key(target, i);
        const em_tensor *t = em_dict_value(target, i), *s = em_dict_get(source, key);
        if (!s)
            st = report_add(r, EM_LOAD_MISSING, key, t, NULL);
        else if (!same_shape(t, s))
            st = report_add(r, EM_LOAD_SHAPE_MISMATCH, key, t, s);
        else if (em_tensor_dtype(t) != em_tensor_dtype(s))
            st = report_add(r, EM_LOAD_DTYPE_CONVERTED, key, t, s);
    }
    for (size_t i = 0; i < ns && st == EM_OK; i++) {
        const char *key = em_dict_key(source, i);
        if (!em_dict_has(target, key))
            st = report_add(r, EM_LOAD_UNEXPECTED, key, NULL, em_dict_value(source, i));
    }
    if (st != EM_OK) {
        em_load_report_free(r);
        return st;
    }
    unsigned problems = 1u << EM_LOAD_MISSING | 1u << EM_LOAD_UNEXPECTED |
                        1u << EM_LOAD_SHAPE_MISMATCH;
    if (strict && (r->n[EM_LOAD_MISSING] || r->n[EM_LOAD_UNEXPECTED] ||
                   r->n[EM_LOAD_SHAPE_MISMATCH])) {
        char msg[1024];
        report_format(r, problems, msg, sizeof msg);
        st = em_set_error(EM_ERR_INVALID, "load: %s", msg);
        if (report_out)
            *report_out = r;
        else
            em_load_report_free(r);
        return st;
    }
    bool pushed = em_grad_mode_push(EM_GRAD_DISABLED) == EM_OK; /* like torch.no_grad() */
    for (size_t i = 0; i < nt; i++) {
        const char *key = em_dict_key(target, i);
        em_tensor *t = em_dict_value(target, i);
        const em_tensor *s = em_dict_get(source, key);
        if (!s || !same_shape(t, s))
            continue;
        if (em_copy_(t, s) != EM_OK) {
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
    if (report_out)
        *report_out = r;
    else
        em_load_report_free(r);
    return EM_OK;
}

/* ---- checkpoint rotation ---------------------------------------------------------------------- */

#define STEP_TOKEN "{step}"

typedef struct pattern_parts {
    char dir[PATH_MAX];
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

typedef struct step_file {
    int64_t step;
    char *name;
} step_file;

static int step_desc_cmp(const void *a, const void *b) {
    const step_file *x = a, *y = b;
    if (x->step != y->step)
        return x->step > y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

static void step_files_free(step_file *f, size_t n) {
    for (size_t i = 0; i < n; i++)
        em__free(f[i].name);
    em__free(f);
}

/* Every file of the pattern's directory that matches it, highest step first. */
static em_status list_steps(const char *who, const pattern_parts *p, step_file **out,
                            size_t *out_n) {
    *out = NULL;
    *out_n = 0;
    DIR *dir = opendir(p->dir);
    if (!dir)
        return em_set_error(errno == ENOENT ? EM_ERR_NOTFOUND : EM_ERR_IO,
                            "%s: cannot read the directory '%s': %s", who, p->dir,
                            strerror(errno));
    step_file *f = NULL;
    size_t n = 0, cap = 0;
    em_status st = EM_OK;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        int64_t step = match_step(p, de->d_name);
        if (step < 0)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            step_file *nf = em__realloc(f, cap * sizeof *f, nc * sizeof *f, "checkpoint list");
            if (!nf) {
                st = EM_ERR_NOMEM;
                break;
            }
            f = nf;
            cap = nc;
        }
        f[n].step = step;
        f[n].name = em__strdup(de->d_name, "checkpoint name");
        if (!f[n].name) {
            st = EM_ERR_NOMEM;
            break;
        }
        n++;
    }
    closedir(dir);
    if (st != EM_OK) {
        step_files_free(f, n);
        return st;
    }
    if (n > 1)
        qsort(f, n, sizeof *f, step_desc_cmp);
    *out = f;
    *out_n = n;
    return EM_OK;
}

static void join(char *buf, size_t cap, const pattern_parts *p, const char *name) {
    snprintf(buf, cap, "%s/%s", p->dir, name);
}

em_status em_checkpoint_latest(const char *pattern, int64_t *step, char *buf, size_t cap) {
    pattern_parts p;
    em_status st = pattern_split("checkpoint_latest", pattern, &p);
    if (st != EM_OK)
        return st;
    if (!step)
        return em_set_error(EM_ERR_INVALID, "checkpoint_latest: step is NULL");
    step_file *f;
    size_t n;
    if ((st = list_steps("checkpoint_latest", &p, &f, &n)) != EM_OK)
        return st;
    if (n == 0) {
        step_files_free(f, n);
        return em_set_error(EM_ERR_NOTFOUND, "checkpoint_latest: no file in '%s' matches '%s'",
                            p.dir, pattern);
    }
    *step = f[0].step;
    if (buf) {
        char path[PATH_MAX + NAME_MAX + 2];
        join(path, sizeof path, &p, f[0].name);
        if (strlen(path) >= cap)
            st = em_set_error(EM_ERR_RANGE, "checkpoint_latest: the path '%s' needs %zu bytes, "
                              "the buffer has %zu", path, strlen(path) + 1, cap);
        else
            memcpy(buf, path, strlen(path) + 1);
    }
    step_files_free(f, n);
    return st;
}

em_status em_checkpoint_rotate(const char *pattern, int keep, size_t *removed) {
    if (removed)
        *removed = 0;
    pattern_parts p;
    em_status st = pattern_split("checkpoint_rotate", pattern, &p);
    if (st != EM_OK)
        return st;
    if (keep < 0)
        return em_set_error(EM_ERR_INVALID, "checkpoint_rotate: keep is %d; it must be >= 0 "
                            "(0: the default, %d)", keep, EM_CHECKPOINT_KEEP_DEFAULT);
    if (keep == 0)
        keep = EM_CHECKPOINT_KEEP_DEFAULT;
    step_file *f;
    size_t n;
    if ((st = list_steps("checkpoint_rotate", &p, &f, &n)) != EM_OK)
        return st;
    for (size_t i = (size_t)keep; i < n && st == EM_OK; i++) {
        char path[PATH_MAX + NAME_MAX + 2];
        join(path, sizeof path, &p, f[i].name);
        if (unlink(path) != 0 && errno != ENOENT)
            st = em_set_error(EM_ERR_IO, "checkpoint_rotate: cannot delete '%s': %s", path,
                              strerror(errno));
        else if (removed)
            (*removed)++;
    }
    step_files_free(f, n);
    return st;
}

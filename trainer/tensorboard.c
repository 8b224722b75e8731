/*
 * tensorboard.c — the --tensorboard sink (tensorboard.h): TFRecord framing, CRC-32C and the
 * few Event/Summary protobuf fields TensorBoard reads scalars and histograms from.
 *
 * The protobuf side is a small encoder of exactly the fields written, from the wire format
 * (varints, 64-bit and 32-bit fixed fields, length-delimited fields, packed repeated doubles),
 * rather than protobuf-c: TensorBoard's event.proto and summary.proto are not in Debian, so
 * protobuf-c would need copies of them in the tree and a generated-code step in the build for
 * twelve fields, and the trainer would link protobuf-c for it; the encoder is ~80 lines, and
 * tests/test_tensorboard.sh checks its output with TensorBoard's own parser. The fields, with
 * their numbers (from TensorBoard's published schema):
 *   Event          1 wall_time (double)  2 step (int64)  3 file_version (string)
 *                  5 summary (Summary)  7 session_log (SessionLog)
 *   SessionLog     1 status (enum; START = 1)
 *   Summary        1 value (repeated Value)
 *   Summary.Value  1 tag (string)  2 simple_value (float)  5 histo (HistogramProto)
 *   HistogramProto 1 min  2 max  3 num  4 sum  5 sum_squares (double)
 *                  6 bucket_limit  7 bucket (repeated double, packed)
 * CRC-32C: zlib has only the IEEE CRC-32, and Debian 12's archive has no C library for the
 * Castagnoli one (`apt-cache search crc32c` finds only python3-crc32c; libcrc32c is the Linux
 * kernel's module), so it is the usual byte-wise table here, checked against RFC 3720's
 * vectors in tests/test_tensorboard.c (it reads each record once: a few hundred bytes a row).
 */
#include "tensorboard.h"

#include "ember/autograd.h"
#include "ember/dict.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/tensor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TB_FLUSH_S 10.0    /* buffered records reach the file at least this often */
#define TB_BUCKETS 30      /* histogram buckets (equal widths between min and max) */

/* A message into err (long paths cut at cap, which is why it is not a plain snprintf). */
__attribute__((format(printf, 3, 4))) static void set_err(char *err, size_t cap,
                                                          const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

/* ---- CRC-32C and TFRecord framing ----------------------------------------------------------- */

static uint32_t crc_table[256];

static void crc_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t tb_crc32c(uint32_t crc, const void *data, size_t n) {
    if (!crc_table[1]) crc_table_init(); /* idempotent: a race writes the same values */
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t tb_masked_crc32c(const void *data, size_t n) {
    uint32_t c = tb_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

bool tb_write_record(FILE *f, const void *data, size_t n) {
    uint8_t head[12], tail[4];
    put_le(head, n, 8);
    put_le(head + 8, tb_masked_crc32c(head, 8), 4);
    put_le(tail, tb_masked_crc32c(data, n), 4);
    return fwrite(head, 1, 12, f) == 12 && (n == 0 || fwrite(data, 1, n, f) == n) &&
           fwrite(tail, 1, 4, f) == 4;
}

/* ---- the protobuf encoder ----------------------------------------------------------------- */

size_t tb_varint(uint8_t out[10], uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

/* A growing byte buffer; `failed` after an allocation failed (the rest is then dropped). */
typedef struct pb_buf {
    uint8_t *p;
    size_t n, cap;
    bool failed;
} pb_buf;

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

static void pb_raw(pb_buf *b, const void *data, size_t n) {
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pb_uvarint(pb_buf *b, uint64_t v) {
    uint8_t tmp[10];
    pb_raw(b, tmp, tb_varint(tmp, v));
}

static void pb_key(pb_buf *b, int field, int wire) { pb_uvarint(b, (uint64_t)field << 3 | (uint64_t)wire); }

/* A double's bits, little-endian (no key: the elements of a packed field). */
static void pb_double_bits(pb_buf *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    uint8_t le[8];
    put_le(le, u, 8);
    pb_raw(b, le, 8);
}

static void pb_double(pb_buf *b, int field, double v) {
    pb_key(b, field, WIRE_I64);
    pb_double_bits(b, v);
}

static void pb_float(pb_buf *b, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    uint8_t le[4];
    put_le(le, u, 4);
    pb_key(b, field, WIRE_I32);
    pb_raw(b, le, 4);
}

static void pb_int64(pb_buf *b, int field, int64_t v) {
    pb_key(b, field, WIRE_VARINT);
    pb_uvarint(b, (uint64_t)v); /* negative int64: ten bytes of two's complement */
}

/* A string, bytes or an embedded message (its encoded bytes). */
static void pb_len(pb_buf *b, int field, const void *data, size_t n) {
    pb_key(b, field, WIRE_LEN);
    pb_uvarint(b, n);
    pb_raw(b, data, n);
}

static void pb_packed_doubles(pb_buf *b, int field, const double *v, size_t n) {
    pb_key(b, field, WIRE_LEN);
    pb_uvarint(b, 8 * (uint64_t)n);
    for (size_t i = 0; i < n && !b->failed; i++) pb_double_bits(b, v[i]);
}

/* ---- the sink --------------------------------------------------------------------------------- */

typedef struct tb_ctx {
    FILE *f;
    char path[4096];
    const char *metric_name;
    int err;               /* the first write failure's errno; 0: none */
    double last_flush;     /* CLOCK_MONOTONIC seconds */
    pb_buf ev, sum, val, his; /* Event, Summary, Summary.Value, HistogramProto being built */
    void *host;            /* a parameter's elements copied to the host */
    size_t host_cap;
} tb_ctx;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool fail_io(metrics_sink *s, tb_ctx *c) {
    set_err(s->err, sizeof s->err, "%s: writing failed: %s", c->path, strerror(c->err));
    return false;
}

static bool tb_flush_now(metrics_sink *s, tb_ctx *c) {
    if (!c->err && fflush(c->f) != 0) c->err = errno ? errno : EIO;
    c->last_flush = mono_s();
    return c->err ? fail_io(s, c) : true;
}

/* Start an event's Summary. */
static void summary_begin(tb_ctx *c) {
    c->sum.n = 0;
    c->sum.failed = false;
}

/* Write an Event at step whose payload is field `field` holding [data, data + n) — the
 * Summary built so far when data is NULL; flushed when TB_FLUSH_S passed since the last
 * flush. */
static bool event_write_field(metrics_sink *s, tb_ctx *c, int64_t step, int field,
                              const void *data, size_t n) {
    pb_buf *e = &c->ev;
    e->n = 0;
    e->failed = c->sum.failed;
    pb_double(e, 1, wall_s());
    pb_int64(e, 2, step);
    if (data) pb_len(e, field, data, n);
    else pb_len(e, 5, c->sum.p, c->sum.n);
    if (e->failed) {
        set_err(s->err, sizeof s->err, "%s: out of memory encoding an event", c->path);
        return false;
    }
    if (c->err) return fail_io(s, c);
    errno = 0;
    if (!tb_write_record(c->f, e->p, e->n)) {
        c->err = errno ? errno : EIO;
        return fail_io(s, c);
    }
    if (mono_s() - c->last_flush >= TB_FLUSH_S) return tb_flush_now(s, c);
    return true;
}

/* An Event with the Summary built so far. */
static bool event_write(metrics_sink *s, tb_ctx *c, int64_t step) {
    return event_write_field(s, c, step, 5, NULL, 0);
}

/* Append a Summary.Value with a scalar to the summary; NaN (not measured) is left out. */
static void scalar(tb_ctx *c, const char *tag, double v) {
    if (isnan(v)) return;
    pb_buf *b = &c->val;
    b->n = 0;
    b->failed = false;
    pb_len(b, 1, tag, strlen(tag));
    pb_float(b, 2, (float)v);
    if (b->failed) c->sum.failed = true;
    pb_len(&c->sum, 1, b->p, b->n);
}

static bool tb_step(metrics_sink *s, const step_row *r) {
    tb_ctx *c = s->ctx;
    summary_begin(c);
    scalar(c, "train/loss", r->loss);
    for (int g = 0; g < r->n_groups && g < METRIC_GROUPS_MAX; g++) {
        char tag[32];
        snprintf(tag, sizeof tag, "train/lr/group%d", g);
        scalar(c, tag, r->lr[g]);
    }
    scalar(c, "train/grad_norm", r->grad_norm);
    scalar(c, "train/samples_per_s", r->samples_s);
    scalar(c, "train/data_wait_s", r->data_wait_s);
    if (r->amp) {
        scalar(c, "train/skipped_steps", (double)r->skipped_steps);
        scalar(c, "train/loss_scale", r->loss_scale);
    }
    return event_write(s, c, r->step);
}

static bool tb_epoch(metrics_sink *s, const epoch_row *r) {
    tb_ctx *c = s->ctx;
    char tag[64];
    summary_begin(c);
    scalar(c, "epoch/epoch", (double)r->epoch);
    scalar(c, "epoch/train_loss", r->train_loss);
    snprintf(tag, sizeof tag, "epoch/train_%s", c->metric_name);
    scalar(c, tag, r->train_metric);
    scalar(c, "epoch/lr", r->lr);
    scalar(c, "epoch/grad_norm", r->grad_norm);
    scalar(c, "epoch/samples_per_s", r->samples_s);
    scalar(c, "epoch/data_wait_pct", r->wait_pct);
    scalar(c, "epoch/peak_memory", (double)r->peak);
    scalar(c, "val/loss", r->val_loss);
    snprintf(tag, sizeof tag, "val/%s", c->metric_name);
    scalar(c, tag, r->val_metric);
    scalar(c, "test/loss", r->test_loss);
    snprintf(tag, sizeof tag, "test/%s", c->metric_name);
    scalar(c, tag, r->test_metric);
    if (!isnan(r->loss_scale)) { /* --amp fp16 */
        scalar(c, "epoch/skipped_steps", (double)r->skipped_steps);
        scalar(c, "epoch/loss_scale", r->loss_scale);
    }
    if (r->ppl) { /* a language model */
        scalar(c, "epoch/train_ppl", r->train_ppl);
        scalar(c, "val/ppl", r->val_ppl);
        scalar(c, "val/unigram_ppl", r->val_unigram_ppl);
    }
    return event_write(s, c, r->step) && tb_flush_now(s, c);
}

/* Append the histogram of t's finite elements as a Summary.Value tagged `tag`: TB_BUCKETS
 * equal-width buckets from the minimum to the maximum (one when they are equal), each
 * bucket_limit the right edge of its bucket; bucket i holds bucket_limit[i-1] <= v <
 * bucket_limit[i], the last one v == max as well (as TensorBoard draws them: the first
 * bucket starts at min, the last ends at max). Nothing is appended when t has no finite
 * element. False on an error reading t (em_last_error says why). */
static bool histogram(tb_ctx *c, const char *tag, const em_tensor *t) {
    int64_t n = em_tensor_numel(t);
    em_dtype dt = em_tensor_dtype(t);
    size_t bytes = (size_t)n * em_dtype_size(dt);
    if (n <= 0) return true;
    if (bytes > c->host_cap) {
        void *p = realloc(c->host, bytes);
        if (!p) {
            em_set_error(EM_ERR_NOMEM, "%zu bytes for a host copy", bytes);
            return false;
        }
        c->host = p;
        c->host_cap = bytes;
    }
    if (em_tensor_to_host(t, c->host, c->host_cap) != EM_OK) return false;
    double mn = INFINITY, mx = -INFINITY, sum = 0, sum2 = 0, num = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = em_dtype_load(dt, c->host, i);
        if (!isfinite(v)) continue;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        sum += v;
        sum2 += v * v;
        num++;
    }
    if (num == 0) return true;
    int nb = mx > mn ? TB_BUCKETS : 1;
    double lim[TB_BUCKETS], cnt[TB_BUCKETS] = {0};
    for (int i = 0; i < nb - 1; i++) lim[i] = mn + (mx - mn) * (i + 1) / nb;
    lim[nb - 1] = mx;
    for (int64_t i = 0; i < n; i++) {
        double v = em_dtype_load(dt, c->host, i);
        if (!isfinite(v)) continue;
        int lo = 0, hi = nb - 1; /* the first bucket whose limit is above v, else the last */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (v < lim[mid]) hi = mid;
            else lo = mid + 1;
        }
        cnt[lo]++;
    }
    pb_buf *h = &c->his, *b = &c->val;
    h->n = 0;
    h->failed = false;
    pb_double(h, 1, mn);
    pb_double(h, 2, mx);
    pb_double(h, 3, num);
    pb_double(h, 4, sum);
    pb_double(h, 5, sum2);
    pb_packed_doubles(h, 6, lim, (size_t)nb);
    pb_packed_doubles(h, 7, cnt, (size_t)nb);
    b->n = 0;
    b->failed = h->failed;
    pb_len(b, 1, tag, strlen(tag));
    pb_len(b, 5, h->p, h->n);
    if (b->failed) c->sum.failed = true;
    pb_len(&c->sum, 1, b->p, b->n);
    return true;
}

static bool tb_params(metrics_sink *s, int64_t epoch, int64_t step, const em_dict *params) {
    (void)epoch;
    tb_ctx *c = s->ctx;
    size_t np = em_dict_len(params);
    for (size_t i = 0; i < np; i++) {
        const char *name = em_dict_key(params, i);
        const em_tensor *w = em_dict_value(params, i), *g = em_tensor_grad(w);
        size_t tl = strlen(name) + 16;
        char *tag = malloc(tl);
        if (!tag) {
            set_err(s->err, sizeof s->err, "%s: out of memory", c->path);
            return false;
        }
        summary_begin(c);
        snprintf(tag, tl, "weights/%s", name);
        bool ok = histogram(c, tag, w);
        snprintf(tag, tl, "gradients/%s", name);
        ok = ok && (!g || histogram(c, tag, g));
        free(tag);
        if (!ok) {
            set_err(s->err, sizeof s->err, "%s: the histogram of parameter '%s': %s", c->path,
                     name, em_last_error());
            return false;
        }
        if (c->sum.n && !event_write(s, c, step)) return false;
    }
    return true;
}

static bool tb_flush(metrics_sink *s) { return tb_flush_now(s, s->ctx); }

static void ctx_free(tb_ctx *c) {
    free(c->ev.p);
    free(c->sum.p);
    free(c->val.p);
    free(c->his.p);
    free(c->host);
    free(c);
}

static bool tb_close(metrics_sink *s) {
    tb_ctx *c = s->ctx;
    if (!c) return true;
    bool ok = tb_flush_now(s, c);
    errno = 0;
    if (fclose(c->f) != 0 && ok) {
        c->err = errno ? errno : EIO;
        ok = fail_io(s, c);
    }
    ctx_free(c);
    s->ctx = NULL;
    return ok;
}

const char *tensorboard_sink_path(const metrics_sink *s) {
    const tb_ctx *c = s->ctx;
    return c ? c->path : NULL;
}

/* mkdir -p dir; false with the reason in err. */
static bool make_dirs(const char *dir, char *err, size_t cap) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        set_err(err, cap, "%.200s...: the directory name is too long", dir);
        return false;
    }
    for (char *q = p + 1;; q++) {
        if (*q != '/' && *q) continue;
        char keep = *q;
        *q = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            set_err(err, cap, "%s: cannot create the directory %s: %s", dir, p, strerror(errno));
            return false;
        }
        *q = keep;
        if (!keep) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0) {
        set_err(err, cap, "%s: %s", dir, strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        set_err(err, cap, "%s: exists and is not a directory", dir);
        return false;
    }
    return true;
}

/* The largest <seconds> of the events.out.tfevents.<seconds>.* files in dir; -1: none. */
static long long newest_events_file(const char *dir) {
    long long newest = -1;
    DIR *d = opendir(dir);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        const char *p = e->d_name;
        if (strncmp(p, "events.out.tfevents.", 20)) continue;
        char *end;
        long long t = strtoll(p + 20, &end, 10);
        if (end > p + 20 && *end == '.' && t > newest) newest = t;
    }
    closedir(d);
    return newest;
}

bool tensorboard_sink_open(metrics_sink *s, const char *dir, bool histograms,
                           const char *metric_name, int64_t resumed_at) {
    *s = (metrics_sink){.option = "--tensorboard", .metric_name = metric_name};
    if (!dir || !*dir) {
        set_err(s->err, sizeof s->err, "an empty directory name");
        return false;
    }
    if (!make_dirs(dir, s->err, sizeof s->err)) return false;
    tb_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        set_err(s->err, sizeof s->err, "%s: out of memory", dir);
        return false;
    }
    c->metric_name = metric_name;
    /* PyTorch's SummaryWriter names: events.out.tfevents.<seconds>.<host>.<pid>.<n>; n makes
     * a second sink of the process (and a clash with a file already there) a new file.
     * TensorBoard reads a directory's files in the order of their names, so <seconds> is
     * past every file already there: a run resumed within the second its first run started
     * (or by a smaller pid) still comes after it. */
    long long stamp = (long long)time(NULL), newest = newest_events_file(dir);
    if (newest >= stamp) stamp = newest + 1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *h = host; *h; h++)
        if (*h == '/') *h = '_';
    static int serial;
    int fd = -1;
    for (int tries = 0; tries < 100 && fd < 0; tries++) {
        int len = snprintf(c->path, sizeof c->path, "%s/events.out.tfevents.%lld.%s.%d.%d", dir,
                           stamp, host, (int)getpid(), serial++);
        if (len >= (int)sizeof c->path) {
            set_err(s->err, sizeof s->err, "%.200s...: the directory name is too long", dir);
            ctx_free(c);
            return false;
        }
        fd = open(c->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(c->f = fdopen(fd, "wb"))) {
        set_err(s->err, sizeof s->err, "%s: cannot create: %s", c->path, strerror(errno));
        if (fd >= 0) close(fd);
        ctx_free(c);
        return false;
    }
    s->ctx = c;
    s->step = tb_step;
    s->epoch = tb_epoch;
    s->params = histograms ? tb_params : NULL;
    s->flush = tb_flush;
    s->close = tb_close;
    c->last_flush = mono_s();
    /* the header event, on disk at once: a full disk shows before the first step; a resumed
     * run's SessionLog START at the first step it trains makes TensorBoard drop what earlier
     * files hold from that step on (rows a run wrote after its last checkpoint) */
    static const uint8_t start[] = {0x08, 0x01}; /* SessionLog: status = START */
    if (!event_write_field(s, c, 0, 3, "brain.Event:2", 13) ||
        (resumed_at >= 0 && !event_write_field(s, c, resumed_at + 1, 7, start, sizeof start)) ||
        !tb_flush_now(s, c)) {
        char why[sizeof s->err], path[sizeof c->path];
        memcpy(why, s->err, sizeof why);
        memcpy(path, c->path, sizeof path);
        tb_close(s);
        unlink(path); /* a file without its header is no events file */
        *s = (metrics_sink){.option = "--tensorboard", .metric_name = metric_name};
        memcpy(s->err, why, sizeof why);
        return false;
    }
    return true;
}

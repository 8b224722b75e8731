/*
 * tensor_print.c — em_tensor_print / em_tensor_format: tensors as text, the way PyTorch 1.13's
 * torch.Tensor.__repr__ (torch/_tensor_str.py) writes them, so that output can be compared
 * line by line with a PyTorch session.
 *
 * What follows PyTorch exactly:
 *   - one format for every element, chosen by _Formatter from the elements that are shown:
 *     floats whose finite values are all integers print as "1." / "-2."; others as fixed
 *     point with `precision` digits; scientific ("1.0000e+05") when max/min of the nonzero
 *     finite magnitudes exceeds 1000, the max exceeds 1e8, or (non-integers only) the min is
 *     below 1e-4. Only nonzero finite values set the width; nan and inf print as nan/inf;
 *   - right alignment to a common width, nested brackets indented under the opening one,
 *     dim-1 newlines between the blocks of a dim;
 *   - summarisation ("...") when numel > threshold, keeping edgeitems at each end of each dim;
 *   - wrapping of the innermost rows at linewidth, and of the suffixes (_add_suffixes).
 * What differs, on purpose: the suffixes are ", dtype=float64" (whenever the dtype is not
 * float32, int64 and bool included), ", device=cuda:0" (when not the CPU) and, for tensors
 * with at least one dim, ", shape=[2, 3]". Zero-size tensors print "tensor([], shape=[0, 3])".
 *
 * The values are read from a host copy made with em_tensor_to_host (so any device works).
 * The text is built in a growable buffer; on out-of-memory the whole call fails cleanly.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "internal.h"

/* ---- print options (process-wide, like torch.set_printoptions) ---------------------------- */

#define PRINT_MAX_PRECISION 30

static const em_print_options print_defaults = {
    .precision = 4, .threshold = 1000, .edgeitems = 3, .linewidth = 80};
static em_print_options print_opts = {
    .precision = 4, .threshold = 1000, .edgeitems = 3, .linewidth = 80};
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

/* Out-of-range values are clamped: precision to [0, 30], edgeitems >= 0, linewidth >= 1.
 * edgeitems 0 shows only "..." for a summarised dim. */
void em_print_options_set(const em_print_options *opt) {
    em_print_options o = opt ? *opt : print_defaults;
    o.precision = EM_MAX(0, EM_MIN(o.precision, PRINT_MAX_PRECISION));
    o.edgeitems = EM_MAX(0, o.edgeitems);
    o.linewidth = EM_MAX(1, o.linewidth);
    pthread_mutex_lock(&print_lock);
    print_opts = o;
    pthread_mutex_unlock(&print_lock);
}

em_print_options em_print_options_get(void) {
    pthread_mutex_lock(&print_lock);
    em_print_options o = print_opts;
    pthread_mutex_unlock(&print_lock);
    return o;
}

/* ---- a growable string ---------------------------------------------------------------------- */

typedef struct strbuf {
    char *p;
    size_t len, cap;
    bool failed; /* an allocation failed; the text is incomplete */
} strbuf;

static bool sb_reserve(strbuf *b, size_t extra) {
    if (b->failed)
        return false;
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = em__realloc(b->p, b->cap, cap, "tensor_print text");
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void sb_putn(strbuf *b, const char *s, size_t n) {
    if (!sb_reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s) {
    sb_putn(b, s, strlen(s));
}

static void sb_repeat(strbuf *b, char c, size_t n) {
    if (!sb_reserve(b, n))
        return;
    memset(b->p + b->len, c, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* ---- the formatter (PyTorch's _Formatter) ----------------------------------------------------- */

/* Longest element text: fixed point is used only for magnitudes <= 1e8, so it stays under
 * 10 + precision characters; scientific under 10 + precision; int64 under 21. */
#define ELEM_CAP 64

typedef struct printer {
    em_dtype dt;
    const void *data;        /* host copy, C order */
    int ndim;
    const int64_t *shape;
    int64_t cstride[EM_MAX_DIMS]; /* C-order strides of the host copy */
    em_print_options opt;
    bool summarize;
    /* the chosen format */
    bool floating, int_mode, sci_mode;
    int width;
} printer;

/* Element i as text, without padding. Returns its length. */
static int elem_str(const printer *p, int64_t i, char out[ELEM_CAP]) {
    if (p->dt == EM_I64)
        return snprintf(out, ELEM_CAP, "%" PRId64, ((const int64_t *)p->data)[i]);
    double v = em_dtype_load(p->dt, p->data, i);
    if (p->dt == EM_BOOL)
        return snprintf(out, ELEM_CAP, "%s", v != 0 ? "True" : "False");
    if (!p->floating)
        return snprintf(out, ELEM_CAP, "%" PRId64, (int64_t)v);
    if (isnan(v)) /* Python prints every NaN as "nan", whatever its sign bit */
        return snprintf(out, ELEM_CAP, "nan");
    if (isinf(v))
        return snprintf(out, ELEM_CAP, "%s", v > 0 ? "inf" : "-inf");
    if (p->sci_mode)
        return snprintf(out, ELEM_CAP, "%.*e", p->opt.precision, v);
    if (p->int_mode)
        return snprintf(out, ELEM_CAP, "%.0f.", v);
    return snprintf(out, ELEM_CAP, "%.*f", p->opt.precision, v);
}

/* True when index k of a dim of size n is shown. */
static bool shown(const printer *p, int64_t n, int64_t k) {
    if (!p->summarize || n <= 2 * (int64_t)p->opt.edgeitems)
        return true;
    return k < p->opt.edgeitems || k >= n - p->opt.edgeitems;
}

typedef void (*elem_fn)(printer *p, int64_t i, void *acc);

/* Call fn for every shown element (get_summarized_data's elements), in C order. */
static void visit(printer *p, int dim, int64_t base, elem_fn fn, void *acc) {
    if (dim == p->ndim) {
        fn(p, base, acc);
        return;
    }
    for (int64_t k = 0; k < p->shape[dim]; k++) {
        if (!shown(p, p->shape[dim], k))
            continue;
        visit(p, dim + 1, base + k * p->cstride[dim], fn, acc);
    }
}

typedef struct float_stats {
    int64_t count; /* nonzero finite values */
    double min_abs, max_abs;
    bool all_integers;
} float_stats;

static void acc_float_stats(printer *p, int64_t i, void *acc) {
    float_stats *s = acc;
    double v = em_dtype_load(p->dt, p->data, i);
    if (!isfinite(v) || v == 0)
        return;
    double a = fabs(v);
    s->min_abs = s->count ? EM_MIN(s->min_abs, a) : a;
    s->max_abs = s->count ? EM_MAX(s->max_abs, a) : a;
    s->count++;
    if (v != ceil(v))
        s->all_integers = false;
}

/* Width over every shown element (integers, bool) or the nonzero finite ones (floats). */
static void acc_width(printer *p, int64_t i, void *acc) {
    int *w = acc;
    if (p->floating) {
        double v = em_dtype_load(p->dt, p->data, i);
        if (!isfinite(v) || v == 0)
            return;
    }
    char s[ELEM_CAP];
    *w = EM_MAX(*w, elem_str(p, i, s));
}

static void choose_format(printer *p) {
    p->floating = em_dtype_is_floating(p->dt);
    p->int_mode = true;
    p->sci_mode = false;
    p->width = 1;
    if (p->floating) {
        float_stats s = {.all_integers = true};
        visit(p, 0, 0, acc_float_stats, &s);
        if (s.count == 0)
            return; /* nothing but zeros, nan and inf: "0.", "nan", width 1 */
        double ratio = s.max_abs / s.min_abs;
        p->int_mode = s.all_integers;
        p->sci_mode = ratio > 1000.0 || s.max_abs > 1.0e8 ||
                      (!p->int_mode && s.min_abs < 1.0e-4);
    }
    visit(p, 0, 0, acc_width, &p->width);
}

/* ---- layout (PyTorch's _vector_str and _tensor_str_with_formatter) -------------------------- */

static void put_elem(const printer *p, strbuf *b, int64_t i) {
    char s[ELEM_CAP];
    int n = elem_str(p, i, s);
    if (n < p->width)
        sb_repeat(b, ' ', (size_t)(p->width - n));
    sb_putn(b, s, (size_t)n);
}

/* The last dim, wrapped at linewidth: "[a, b, c,\n<indent+1>d]". */
static void put_vector(const printer *p, strbuf *b, int64_t base, int indent) {
    int64_t n = p->shape[p->ndim - 1];
    int64_t per_line = EM_MAX(1, (p->opt.linewidth - indent) / (p->width + 2));
    int64_t item = 0;
    sb_puts(b, "[");
    for (int64_t k = 0; k < n; k++) {
        bool ellipsis = p->summarize && n > 2 * (int64_t)p->opt.edgeitems &&
                        k == p->opt.edgeitems;
        if (!shown(p, n, k) && !ellipsis)
            continue;
        if (item > 0 && item % per_line == 0) {
            sb_puts(b, ",\n");
            sb_repeat(b, ' ', (size_t)indent + 1);
        } else if (item > 0) {
            sb_puts(b, ", ");
        }
        item++;
        if (ellipsis) {
            sb_puts(b, " ...");
            k = n - p->opt.edgeitems - 1; /* continue with the last edgeitems */
        } else {
            put_elem(p, b, base + k);
        }
    }
    sb_puts(b, "]");
}

/* Dims dim.. of the block starting at base; blocks of a dim are separated by "," and
 * (ndim - dim - 1) newlines, and indented one past the bracket. */
static void put_block(const printer *p, strbuf *b, int dim, int64_t base, int indent) {
    if (dim == p->ndim - 1) {
        put_vector(p, b, base, indent);
        return;
    }
    int64_t n = p->shape[dim];
    bool cut = p->summarize && n > 2 * (int64_t)p->opt.edgeitems;
    bool first = true;
    sb_puts(b, "[");
    for (int64_t k = 0; k < n; k++) {
        if (!shown(p, n, k) && !(cut && k == p->opt.edgeitems))
            continue;
        if (!first) {
            sb_puts(b, ",");
            sb_repeat(b, '\n', (size_t)(p->ndim - dim - 1));
            sb_repeat(b, ' ', (size_t)indent + 1);
        }
        first = false;
        if (cut && k == p->opt.edgeitems) {
            sb_puts(b, "...");
            k = n - p->opt.edgeitems - 1;
        } else {
            put_block(p, b, dim + 1, base + k * p->cstride[dim], indent + 1);
        }
    }
    sb_puts(b, "]");
}

/* ---- suffixes (PyTorch's _add_suffixes) ----------------------------------------------------- */

/* Append ", suffix", or ",\n<indent>suffix" when the line would pass linewidth. *line_len is
 * PyTorch's running estimate of the current line's length. */
static void put_suffix(strbuf *b, const char *suffix, int indent, int linewidth,
                       size_t *line_len) {
    size_t n = strlen(suffix);
    if (*line_len + n + 2 > (size_t)linewidth) {
        sb_puts(b, ",\n");
        sb_repeat(b, ' ', (size_t)indent);
        *line_len = (size_t)indent + n;
    } else {
        sb_puts(b, ", ");
        *line_len += n + 2;
    }
    sb_puts(b, suffix);
}

/* PyTorch's `len(s) - s.rfind("\n") + 1` (with rfind = -1 when there is no newline). */
static size_t last_line_len(const strbuf *b) {
    for (size_t i = b->len; i > 0; i--)
        if (b->p[i - 1] == '\n')
            return b->len - (i - 1) + 1;
    return b->len + 2;
}

static void put_suffixes(const em_tensor *t, strbuf *b, int indent, int linewidth) {
    size_t line_len = last_line_len(b);
    char s[64 + 24 * EM_MAX_DIMS];
    em_dtype dt = em_tensor_dtype(t);
    if (dt != EM_F32) {
        snprintf(s, sizeof s, "dtype=%s", em_dtype_name(dt));
        put_suffix(b, s, indent, linewidth, &line_len);
    }
    em_device dev = em_tensor_device(t);
    if (!em_device_equal(dev, em_cpu())) {
        char d[32];
        snprintf(s, sizeof s, "device=%s", em_device_str(dev, d, sizeof d));
        put_suffix(b, s, indent, linewidth, &line_len);
    }
    int ndim = em_tensor_ndim(t);
    if (ndim > 0) {
        const int64_t *shape = em_tensor_shape(t);
        size_t n = (size_t)snprintf(s, sizeof s, "shape=[");
        for (int d = 0; d < ndim; d++)
            n += (size_t)snprintf(s + n, sizeof s - n, "%s%" PRId64, d ? ", " : "", shape[d]);
        snprintf(s + n, sizeof s - n, "]");
        put_suffix(b, s, indent, linewidth, &line_len);
    }
}

/* ---- the whole text ------------------------------------------------------------------------- */

#define PRINT_PREFIX "tensor("

/* The values part ("[...]" or a scalar) of t, from its host copy. */
static em_status put_values(const em_tensor *t, strbuf *b, const em_print_options *opt) {
    int64_t numel = em_tensor_numel(t);
    if (numel == 0) {
        sb_puts(b, "[]");
        return EM_OK;
    }
    size_t nbytes = em_tensor_nbytes(t);
    void *host = em__malloc(nbytes, "tensor_print host copy");
    if (!host)
        return EM_ERR_NOMEM;
    em_status st = em_tensor_to_host(t, host, nbytes);
    if (st == EM_OK) {
        printer p = {.dt = em_tensor_dtype(t), .data = host, .ndim = em_tensor_ndim(t),
                     .shape = em_tensor_shape(t), .opt = *opt,
                     .summarize = numel > opt->threshold};
        em__contiguous_strides(p.ndim, p.shape, p.cstride);
        choose_format(&p);
        if (p.ndim == 0)
            put_elem(&p, b, 0);
        else
            put_block(&p, b, 0, 0, (int)strlen(PRINT_PREFIX));
    }
    em__free(host);
    return st;
}

/* Build the full text of t into b (b->p is NULL or owned by the caller on return). */
static em_status build_text(const em_tensor *t, strbuf *b) {
    em_print_options opt = em_print_options_get();
    int indent = (int)strlen(PRINT_PREFIX);
    sb_puts(b, PRINT_PREFIX);
    em_status st = put_values(t, b, &opt);
    if (st != EM_OK)
        return st;
    put_suffixes(t, b, indent, opt.linewidth);
    sb_puts(b, ")");
    return b->failed ? EM_ERR_NOMEM : EM_OK;
}

em_status em_tensor_print(FILE *f, const em_tensor *t) {
    if (!em__check_inputs("tensor_print", &t, 1))
        return EM_ERR_INVALID;
    if (!f)
        return em_set_error(EM_ERR_INVALID, "tensor_print: the stream is NULL");
    strbuf b = {0};
    em_status st = build_text(t, &b);
    if (st == EM_OK && (fwrite(b.p, 1, b.len, f) != b.len || fputc('\n', f) == EOF))
        st = em_set_error(EM_ERR_IO, "tensor_print: writing %zu bytes to the stream failed",
                          b.len + 1);
    em__free(b.p);
    return st;
}

size_t em_tensor_format(const em_tensor *t, char *buf, size_t cap) {
    if (buf && cap > 0)
        buf[0] = '\0';
    if (!em__check_inputs("tensor_format", &t, 1))
        return 0;
    if (!buf && cap > 0) {
        em_set_error(EM_ERR_INVALID, "tensor_format: buf is NULL but cap is %zu", cap);
        return 0;
    }
    strbuf b = {0};
    em_status st = build_text(t, &b);
    size_t len = st == EM_OK ? b.len : 0;
    if (st == EM_OK && cap > 0) {
        size_t n = EM_MIN(len, cap - 1);
        memcpy(buf, b.p, n);
        buf[n] = '\0';
    }
    em__free(b.p);
    return len;
}

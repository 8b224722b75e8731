/*
 * csv.c — dataset class "csv": a table of numbers, one item per row, parsed with libcsv
 * (RFC 4180 quoting). Either one column holds a class label (a non-negative integer; the
 * default is the last column) and the rest are float32 features, or `target_columns` names
 * float32 regression targets. A header row is optional (auto: a first row with a
 * non-numeric field is a header). Every row must have as many fields as the first; every
 * field must be a number (a NUL byte inside one is an error, not the end of it). A UTF-8
 * byte-order mark at the start is skipped. Errors name the file, the line, the column and
 * the reason. The whole table is parsed at open into a dt_table, its memory growing with the
 * rows read; reads are memcpy. Items are the fields "input" (the features, (k) float32) and
 * "target" (an int64 label, or (t) float32 regression targets).
 */
#include <csv.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ember/data.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/options.h"
#include "data.h"

static const char *const csv_header_auto[] = {"auto", NULL};
static const em_option_spec csv_options[] = {
    {.name = "path", .types = EM_OPT_STRING, .required = true, .help = "the CSV file"},
    {.name = "delimiter", .types = EM_OPT_STRING, .def = {.s = ","},
     .help = "one character, or 'tab'"},
    {.name = "header", .types = EM_OPT_BOOL | EM_OPT_STRING, .def_type = EM_OPT_STRING,
     .def = {.s = "auto"}, .choices = csv_header_auto,
     .help = "whether the first row names the columns (auto: when it is not all numbers)"},
    {.name = "label_column", .types = EM_OPT_INT, .def = {.i = -1}, .has_range = true,
     .min = -1e9, .max = 1e9,
     .help = "0-based column of the class label; negative counts from the end (-1: last)"},
    {.name = "target_columns", .types = EM_OPT_INTS | EM_OPT_STRING, .def_type = EM_OPT_STRING,
     .def = {.s = ""}, .has_range = true, .min = -1e9, .max = 1e9,
     .help = "0-based columns of float regression targets (instead of a label): a list of up "
             "to 8, or comma-separated text for more"},
    {.name = "classes", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true, .min = 0,
     .max = 1e9, .help = "labels must lie in [0, classes); 0: the largest label + 1"},
};

/* Parsing state, shared by libcsv's callbacks. */
typedef struct parse {
    const char *path;
    int64_t line;          /* line being fed */
    int64_t row_line;      /* line where the current row's first field ended */
    double *cells;         /* rows * ncols */
    int64_t *lines;        /* the line of each stored row */
    int64_t rows, cap;     /* rows stored, capacity (rows) */
    int64_t ncols;         /* fields per row (from the first row); -1 before it */
    int64_t first_line;    /* line of the row that fixed ncols */
    double *row;           /* the current row's values */
    int64_t nfields, row_cap;
    bool row_ok;           /* every field of the current row parsed as a number */
    char bad_field[64];    /* the first non-numeric field of the current row */
    bool bad_nul;          /* it holds a NUL byte */
    int64_t bad_col;
    int header;            /* -1 auto, 0 no, 1 yes */
    bool header_done;
    bool failed;
} parse;

static bool parse_number(const char *s, size_t len, double *out) {
    char buf[128];
    /* strtod would stop at a NUL byte and read "1<NUL>garbage" as 1. */
    if (len == 0 || len >= sizeof buf || memchr(s, '\0', len)) return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    while (*end == ' ' || *end == '\t') end++;
    if (end == buf || *end || errno == ERANGE || !isfinite(v)) return false;
    *out = v;
    return true;
}

static void on_field(void *s, size_t len, void *data) {
    parse *p = data;
    if (p->failed) return;
    if (p->nfields == 0) p->row_line = p->line;
    if (p->nfields == p->row_cap) {
        int64_t nc = p->row_cap ? p->row_cap * 2 : 64;
        double *r = realloc(p->row, sizeof(double) * (size_t)nc);
        if (!r) {
            p->failed = true;
            em_set_error(EM_ERR_NOMEM, "csv: out of memory reading %s", p->path);
            return;
        }
        p->row = r;
        p->row_cap = nc;
    }
    double v = 0;
    if (!parse_number(s ? s : "", s ? len : 0, &v) && p->row_ok) {
        p->row_ok = false;
        p->bad_col = p->nfields;
        size_t n = len < sizeof p->bad_field - 1 ? len : sizeof p->bad_field - 1;
        if (s) memcpy(p->bad_field, s, n);
        p->bad_field[n] = '\0';
        for (size_t i = 0; i < n; i++) /* the message shows a NUL, not a cut-off field */
            if (p->bad_field[i] == '\0') p->bad_field[i] = '?';
        p->bad_nul = s && memchr(s, '\0', len) != NULL;
    }
    p->row[p->nfields++] = v;
}

static void on_row(int c, void *data) {
    (void)c;
    parse *p = data;
    if (p->failed) return;
    int64_t nf = p->nfields;
    p->nfields = 0;
    bool ok = p->row_ok;
    p->row_ok = true;
    if (!p->header_done) {
        p->header_done = true;
        if (p->header == 1 || (p->header == -1 && !ok)) {
            p->ncols = nf; /* the header fixes the field count too */
            p->first_line = p->row_line;
            return;
        }
    }
    if (p->ncols < 0) {
        p->ncols = nf;
        p->first_line = p->row_line;
    }
    if (nf != p->ncols) {
        p->failed = true;
        em_set_error(EM_ERR_FORMAT, "csv: %s line %lld: %lld field%s, expected %lld (as in "
                     "line %lld)", p->path, (long long)p->row_line, (long long)nf,
                     nf == 1 ? "" : "s", (long long)p->ncols, (long long)p->first_line);
        return;
    }
    if (!ok) {
        p->failed = true;
        em_set_error(EM_ERR_FORMAT, "csv: %s line %lld, column %lld: '%s' is not a number%s",
                     p->path, (long long)p->row_line, (long long)p->bad_col + 1, p->bad_field,
                     p->bad_nul ? " (it holds a NUL byte, shown as '?': a binary file?)" : "");
        return;
    }
    if (p->rows == p->cap) {
        int64_t nc = p->cap ? p->cap * 2 : 1; /* grows with the rows read, never ahead */
        double *cells = realloc(p->cells, sizeof(double) * (size_t)(nc * nf));
        if (cells) p->cells = cells;
        int64_t *lines = cells ? realloc(p->lines, sizeof(int64_t) * (size_t)nc) : NULL;
        if (lines) p->lines = lines;
        if (!cells || !lines) {
            p->failed = true;
            em_set_error(EM_ERR_NOMEM, "csv: out of memory reading %s", p->path);
            return;
        }
        p->cap = nc;
    }
    p->lines[p->rows] = p->row_line;
    memcpy(p->cells + p->rows * nf, p->row, sizeof(double) * (size_t)nf);
    p->rows++;
}

/* Append target column c (negative: from the end) to cols (at most cap), with checks against
 * ncols. */
static em_status add_column(const char *path, long long c, int64_t ncols, int64_t *cols,
                            int64_t *n, int64_t cap) {
    long long given = c;
    if (c < 0) c += ncols;
    if (c < 0 || c >= ncols || *n >= cap)
        return em_set_error(EM_ERR_INVALID, "dataset 'csv': target column %lld is outside the "
                            "%lld columns of %s", given, (long long)ncols, path);
    for (int64_t i = 0; i < *n; i++)
        if (cols[i] == c)
            return em_set_error(EM_ERR_INVALID, "dataset 'csv': target column %lld is listed "
                                "twice", c);
    cols[(*n)++] = c;
    return EM_OK;
}

/* The target columns of option 'target_columns' (a list, or text "3,4") into cols. */
static em_status target_columns(const em_options *o, const char *path, int64_t ncols,
                                int64_t *cols, int64_t *n, int64_t cap) {
    *n = 0;
    if (em_options_type(o, "target_columns") == EM_OPT_INTS) {
        int64_t v[EM_OPT_MAX_LIST];
        int k = em_options_ints(o, "target_columns", v, EM_OPT_MAX_LIST);
        for (int i = 0; i < k; i++) {
            em_status st = add_column(path, (long long)v[i], ncols, cols, n, cap);
            if (st != EM_OK) return st;
        }
        return EM_OK;
    }
    const char *spec = em_options_string(o, "target_columns");
    for (const char *q = spec; *q;) {
        char *end;
        long long c = strtoll(q, &end, 10);
        if (end == q || (*end && *end != ','))
            return em_set_error(EM_ERR_INVALID, "dataset 'csv': option 'target_columns' = '%s' "
                                "is not a comma-separated list of column numbers", spec);
        em_status st = add_column(path, c, ncols, cols, n, cap);
        if (st != EM_OK) return st;
        q = *end ? end + 1 : end;
    }
    return EM_OK;
}

static em_status csv_open(const em_options *o, em_dataset_layout *lay, void **out) {
    const char *path = em_options_string(o, "path");
    const char *delim = em_options_string(o, "delimiter");
    /* header: true/false, or the string "auto" */
    int header = em_options_type(o, "header") == EM_OPT_BOOL ? em_options_bool(o, "header") : -1;
    char dc;
    if (strcmp(delim, "tab") == 0 || strcmp(delim, "\\t") == 0) dc = '\t';
    else if (strlen(delim) == 1 && delim[0] != '"' && delim[0] != '\n' && delim[0] != '\r') dc = delim[0];
    else
        return em_set_error(EM_ERR_INVALID, "dataset 'csv': option 'delimiter' = '%s' must be "
                            "one character (not a quote or newline) or 'tab'", delim);
    int fd = dt_open_input("csv", path); /* regular files only: a FIFO would block */
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) {
            close(fd);
            em_set_error(EM_ERR_IO, "csv: cannot open %s: %s", path, strerror(errno));
        }
        return em_last_status();
    }
    parse p = {.path = path, .ncols = -1, .row_ok = true,
               .header = header};
    struct csv_parser cp;
    csv_init(&cp, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL);
    csv_set_delim(&cp, (unsigned char)dc);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    em_status st = EM_OK;
    while (!p.failed && (len = getline(&line, &lcap, f)) > 0) {
        p.line++;
        char *text = line;
        if (p.line == 1 && len >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3)) {
            text += 3; /* a UTF-8 byte-order mark is not part of the first field */
            len -= 3;
        }
        if (csv_parse(&cp, text, (size_t)len, on_field, on_row, &p) != (size_t)len) {
            st = em_set_error(EM_ERR_FORMAT, "csv: %s line %lld: %s (a stray or unclosed "
                              "quote?)", path, (long long)p.line, csv_strerror(csv_error(&cp)));
            break;
        }
    }
    if (st == EM_OK && !p.failed && ferror(f))
        st = em_set_error(EM_ERR_IO, "csv: %s: read error: %s", path, strerror(errno));
    if (st == EM_OK && !p.failed && csv_fini(&cp, on_field, on_row, &p) != 0)
        st = em_set_error(EM_ERR_FORMAT, "csv: %s line %lld: %s (an unclosed quote at the end "
                          "of the file?)", path, (long long)p.line, csv_strerror(csv_error(&cp)));
    if (st == EM_OK && p.failed) st = em_last_status();
    csv_free(&cp);
    free(line);
    free(p.row);
    fclose(f);
    if (st == EM_OK && p.rows == 0)
        st = em_set_error(EM_ERR_FORMAT, "csv: %s holds no data rows", path);
    if (st != EM_OK) {
        free(p.cells);
        free(p.lines);
        return st;
    }

    int64_t nc = p.ncols, tcols[64], nt = 0;
    bool labels = em_options_type(o, "target_columns") == EM_OPT_STRING &&
                  !*em_options_string(o, "target_columns");
    if (labels) {
        int64_t lc = em_options_int(o, "label_column");
        if (lc < 0) lc += nc;
        if (lc < 0 || lc >= nc) {
            free(p.cells);
            free(p.lines);
            return em_set_error(EM_ERR_INVALID, "dataset 'csv': label_column %lld is outside the "
                                "%lld columns of %s", (long long)em_options_int(o, "label_column"),
                                (long long)nc, path);
        }
        tcols[0] = lc;
        nt = 1;
    } else if ((st = target_columns(o, path, nc, tcols, &nt, 64)) != EM_OK) {
        free(p.cells);
        free(p.lines);
        return st;
    }
    if (nt >= nc) {
        free(p.cells);
        free(p.lines);
        return em_set_error(EM_ERR_INVALID, "dataset 'csv': %s has %lld columns and all are "
                            "targets; no feature is left", path, (long long)nc);
    }
    /* col[0]: rows * nfeat features, col[1]: rows * (an int64 label | nt floats) */
    dt_table *s = calloc(1, sizeof *s);
    int64_t nfeat = nc - nt;
    float *features = NULL;
    void *targets = NULL;
    if (s) {
        s->n = p.rows;
        s->col[0] = features = malloc(sizeof(float) * (size_t)(s->n * nfeat));
        s->col[1] = targets =
            malloc((labels ? sizeof(int64_t) : sizeof(float) * (size_t)nt) * (size_t)s->n);
    }
    if (!s || !features || !targets) {
        free(p.cells);
        free(p.lines);
        dt_table_close(s);
        return em_set_error(EM_ERR_NOMEM, "csv: out of memory for %lld rows of %s",
                            (long long)p.rows, path);
    }
    int64_t classes = em_options_int(o, "classes"), maxlab = 0;
    for (int64_t r = 0; r < s->n; r++) {
        const double *row = p.cells + r * nc;
        int64_t k = 0;
        for (int64_t c = 0; c < nc; c++) {
            bool is_t = false;
            for (int64_t t = 0; t < nt; t++) is_t |= tcols[t] == c;
            if (!is_t) features[r * nfeat + k++] = (float)row[c];
        }
        if (labels) {
            double v = row[tcols[0]];
            if (v != floor(v) || v < 0 || (classes > 0 && v >= (double)classes) || v > 1e9) {
                if (classes > 0)
                    st = em_set_error(EM_ERR_FORMAT, "csv: %s line %lld (item %lld), column "
                                      "%lld: label %g is outside [0, %lld)", path,
                                      (long long)p.lines[r], (long long)r,
                                      (long long)tcols[0] + 1, v, (long long)classes);
                else
                    st = em_set_error(EM_ERR_FORMAT, "csv: %s line %lld (item %lld), column "
                                      "%lld: label %g is not a non-negative integer", path,
                                      (long long)p.lines[r], (long long)r,
                                      (long long)tcols[0] + 1, v);
                break;
            }
            ((int64_t *)targets)[r] = (int64_t)v;
            if ((int64_t)v > maxlab) maxlab = (int64_t)v;
        } else {
            for (int64_t t = 0; t < nt; t++) ((float *)targets)[r * nt + t] = (float)row[tcols[t]];
        }
    }
    free(p.cells);
    free(p.lines);
    if (st != EM_OK) {
        dt_table_close(s);
        return st;
    }
    dt_table_declare(s, lay, EM_F32, 1, &nfeat,
                     labels ? (classes > 0 ? classes : maxlab + 1) : 0, nt);
    *out = s;
    return EM_OK;
}

em_status dt_register_csv(em_registry *r) {
    em_dataset_class_def d = {
        .struct_size = sizeof d, .name = "csv",
        .description = "CSV of numeric features with a class-label column or float target "
                       "columns (libcsv)",
        .options = csv_options, .n_options = (int)(sizeof csv_options / sizeof csv_options[0]),
        .open_fields = csv_open, .read_fields = dt_table_read, .close = dt_table_close};
    return em_dataset_class_register(r, &d);
}

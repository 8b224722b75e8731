/*
 * options.c — typed, validated option bags for everything created by name (ember/options.h).
 *
 * A bag is an array of entries in the order they were first set. An entry holds either a typed
 * value (set from C) or text (set from a config file, with where it came from). Nothing is
 * checked when a value is set: em_options_resolve() checks the whole bag against a class's
 * spec table at once, turns text into the type the spec allows (so "[3, 3]" becomes a list of
 * ints for kernel_size and "same" stays a string for padding), converts where it is lossless
 * (an int for a float option, an int for a list option), checks ranges and choices, and fills
 * in defaults. Errors name the owner class, the option, the value and what is allowed, with
 * the text's `where` in front ("model.yaml:12:5: Conv2d: ...").
 *
 * Resolving changes the bag only when everything is valid: values are converted into a
 * scratch array first and swapped in at the end, so a failed resolve leaves the bag as given.
 * A large bag (a config map of many options) finds names through a hashed index, so filling
 * it stays linear.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ember/error.h"
#include "ember/options.h"
#include "internal.h"

#define OPT_TEXT 0u /* an entry holding unresolved text */

typedef struct opt_entry {
    char *name;      /* owned */
    unsigned type;   /* one EM_OPT_* bit, or OPT_TEXT */
    em_option_value v;
    char *s;         /* owned string for EM_OPT_STRING, or the text for OPT_TEXT */
    char *where;     /* owned; where the text came from, or NULL */
} opt_entry;

struct em_options {
    opt_entry *e;
    size_t n, cap;
    /* names -> position once a bag is large (a config map of n options costs O(n), not
     * O(n^2)); an accelerator only: when it does not cover all n entries (small bags, or an
     * allocation failed) lookups scan */
    em__strindex index;
    uint64_t compares; /* name comparisons made by put */
};

#define OPT_INDEX_FROM 16 /* entries: below, a scan is as quick */

/* ---- the bag ------------------------------------------------------------------------------- */

em_options *em_options_new(void) { return em__calloc(1, sizeof(em_options), "options"); }

static void entry_clear(opt_entry *e) {
    em__free(e->name);
    em__free(e->s);
    em__free(e->where);
    memset(e, 0, sizeof *e);
}

void em_options_free(em_options *o) {
    if (!o)
        return;
    for (size_t i = 0; i < o->n; i++)
        entry_clear(&o->e[i]);
    em__free(o->e);
    em__strindex_free(&o->index);
    em__free(o);
}

/* The position of name, or -1; the comparisons made are added to *compares (may be NULL). */
static ptrdiff_t find_counted(const em_options *o, const char *name, uint64_t *compares) {
    if (!o || !name)
        return -1;
    if (o->n > OPT_INDEX_FROM && o->index.count == o->n)
        return em__strindex_find(&o->index, &o->e[0].name, sizeof(opt_entry), name, compares);
    for (size_t i = 0; i < o->n; i++) {
        if (compares)
            (*compares)++;
        if (strcmp(o->e[i].name, name) == 0)
            return (ptrdiff_t)i;
    }
    return -1;
}

static ptrdiff_t find(const em_options *o, const char *name) {
    return find_counted(o, name, NULL);
}

/* Bring the index up to date after entries were appended (or rebuild it after o->e was
 * replaced: the caller freed it). Out of memory drops it: lookups scan. */
static void index_sync(em_options *o) {
    if (o->n <= OPT_INDEX_FROM)
        return;
    for (size_t i = o->index.count; i < o->n; i++)
        if (em__strindex_add(&o->index, &o->e[0].name, sizeof(opt_entry), i, &o->compares) !=
            EM_OK) {
            em__strindex_free(&o->index);
            return;
        }
}

/* Deep copy of one entry into dst (zeroed); false on out of memory (dst cleared). */
static bool entry_copy(opt_entry *dst, const opt_entry *src) {
    *dst = *src;
    dst->name = em__strdup(src->name, "options");
    dst->s = src->s ? em__strdup(src->s, "options") : NULL;
    dst->where = src->where ? em__strdup(src->where, "options") : NULL;
    if (!dst->name || (src->s && !dst->s) || (src->where && !dst->where)) {
        entry_clear(dst);
        return false;
    }
    if (dst->type == EM_OPT_STRING)
        dst->v.s = dst->s;
    return true;
}

em_options *em_options_copy(const em_options *o) {
    em_options *c = em_options_new();
    if (!c || !o)
        return c;
    if (o->n) {
        c->e = em__calloc(o->n, sizeof(opt_entry), "options");
        if (!c->e)
            goto fail;
        c->cap = o->n;
        for (; c->n < o->n; c->n++)
            if (!entry_copy(&c->e[c->n], &o->e[c->n]))
                goto fail;
        index_sync(c);
    }
    return c;
fail:
    em_options_free(c);
    return NULL;
}

static bool valid_name(const char *name) {
    if (!name || !*name)
        return false;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return false;
    return true;
}

/* Install entry e (its strings owned and freshly allocated) under its name: replaces an entry
 * of the same name in place, or appends. On failure e's strings are freed. */
static em_status put(em_options *o, opt_entry *e) {
    if (!o) {
        entry_clear(e);
        return em_set_error(EM_ERR_INVALID, "options: NULL bag");
    }
    ptrdiff_t k = find_counted(o, e->name, &o->compares);
    if (k >= 0) {
        entry_clear(&o->e[k]);
        o->e[k] = *e;
        if (e->type == EM_OPT_STRING)
            o->e[k].v.s = o->e[k].s;
        return EM_OK;
    }
    if (o->n == o->cap) {
        size_t ncap = o->cap ? o->cap * 2 : 8;
        opt_entry *ne = em__realloc(o->e, o->cap * sizeof(opt_entry), ncap * sizeof(opt_entry),
                                    "options");
        if (!ne) {
            entry_clear(e);
            return EM_ERR_NOMEM;
        }
        o->e = ne;
        o->cap = ncap;
    }
    o->e[o->n] = *e;
    if (e->type == EM_OPT_STRING)
        o->e[o->n].v.s = o->e[o->n].s;
    o->n++;
    index_sync(o);
    return EM_OK;
}

/* A fresh entry named name of the given type; false with an error on a bad name / no memory. */
static bool entry_start(opt_entry *e, const char *name, unsigned type) {
    memset(e, 0, sizeof *e);
    if (!valid_name(name)) {
        em_set_error(EM_ERR_INVALID, "options: bad option name '%s' (letters, digits, '_', '-', "
                     "'.')", name ? name : "(null)");
        return false;
    }
    e->name = em__strdup(name, "options");
    e->type = type;
    return e->name != NULL;
}

em_status em_options_set_int(em_options *o, const char *name, int64_t v) {
    opt_entry e;
    if (!entry_start(&e, name, EM_OPT_INT))
        return em_last_status();
    e.v.i = v;
    return put(o, &e);
}

em_status em_options_set_float(em_options *o, const char *name, double v) {
    opt_entry e;
    if (!entry_start(&e, name, EM_OPT_FLOAT))
        return em_last_status();
    e.v.f = v;
    return put(o, &e);
}

em_status em_options_set_bool(em_options *o, const char *name, bool v) {
    opt_entry e;
    if (!entry_start(&e, name, EM_OPT_BOOL))
        return em_last_status();
    e.v.b = v;
    return put(o, &e);
}

em_status em_options_set_string(em_options *o, const char *name, const char *v) {
    if (!v)
        return em_set_error(EM_ERR_INVALID, "options: NULL string for option '%s'",
                            name ? name : "(null)");
    opt_entry e;
    if (!entry_start(&e, name, EM_OPT_STRING))
        return em_last_status();
    e.s = em__strdup(v, "options");
    if (!e.s) {
        entry_clear(&e);
        return EM_ERR_NOMEM;
    }
    return put(o, &e);
}

static em_status set_list(em_options *o, const char *name, int n, const int64_t *vi,
                          const double *vf) {
    if (n < 0 || n > EM_OPT_MAX_LIST || (n > 0 && !vi && !vf))
        return em_set_error(EM_ERR_INVALID, "options: option '%s': a list of %d values (at most "
                            "%d)", name ? name : "(null)", n, EM_OPT_MAX_LIST);
    opt_entry e;
    if (!entry_start(&e, name, vi ? EM_OPT_INTS : EM_OPT_FLOATS))
        return em_last_status();
    e.v.n = n;
    for (int i = 0; i < n; i++) {
        if (vi)
            e.v.ints[i] = vi[i];
        else
            e.v.floats[i] = vf[i];
    }
    return put(o, &e);
}

em_status em_options_set_ints(em_options *o, const char *name, int n, const int64_t *v) {
    static const int64_t none[1] = {0};
    return set_list(o, name, n, v ? v : none, NULL);
}

em_status em_options_set_floats(em_options *o, const char *name, int n, const double *v) {
    static const double none[1] = {0};
    return set_list(o, name, n, NULL, v ? v : none);
}

em_status em_options_set_text(em_options *o, const char *name, const char *text,
                              const char *where) {
    if (!text)
        return em_set_error(EM_ERR_INVALID, "options: NULL text for option '%s'",
                            name ? name : "(null)");
    opt_entry e;
    if (!entry_start(&e, name, OPT_TEXT))
        return em_last_status();
    e.s = em__strdup(text, "options");
    e.where = where ? em__strdup(where, "options") : NULL;
    if (!e.s || (where && !e.where)) {
        entry_clear(&e);
        return EM_ERR_NOMEM;
    }
    return put(o, &e);
}

/* ---- formatting ---------------------------------------------------------------------------- */

/* Shortest "%.*g" that reads back as the same double; always looks like a float ("1.0"). */
static void fmt_double(char *buf, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (!strpbrk(buf, ".eEn") && strlen(buf) + 3 < cap)
        strcat(buf, ".0");
}

/* Append printf output to buf (of cap, currently holding a string), truncating. */
static void cat(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cat(char *buf, size_t cap, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

static void fmt_value(char *buf, size_t cap, unsigned type, const em_option_value *v,
                      const char *s) {
    char tmp[40];
    buf[0] = 0;
    switch (type) {
    case EM_OPT_INT: snprintf(buf, cap, "%" PRId64, v->i); break;
    case EM_OPT_FLOAT: fmt_double(buf, cap, v->f); break;
    case EM_OPT_BOOL: snprintf(buf, cap, "%s", v->b ? "true" : "false"); break;
    case EM_OPT_STRING: snprintf(buf, cap, "%s", s ? s : (v->s ? v->s : "")); break;
    case EM_OPT_INTS:
    case EM_OPT_FLOATS:
        cat(buf, cap, "[");
        for (int i = 0; i < v->n; i++) {
            if (type == EM_OPT_INTS)
                snprintf(tmp, sizeof tmp, "%" PRId64, v->ints[i]);
            else
                fmt_double(tmp, sizeof tmp, v->floats[i]);
            cat(buf, cap, "%s%s", i ? ", " : "", tmp);
        }
        cat(buf, cap, "]");
        break;
    default: snprintf(buf, cap, "%s", s ? s : ""); break; /* text */
    }
}

/* "an int or a list of ints" */
static void fmt_types(char *buf, size_t cap, unsigned types) {
    static const struct { unsigned bit; const char *what; } names[] = {
        {EM_OPT_INT, "an int"},          {EM_OPT_FLOAT, "a number"},
        {EM_OPT_BOOL, "true or false"},  {EM_OPT_STRING, "a string"},
        {EM_OPT_INTS, "a list of ints"}, {EM_OPT_FLOATS, "a list of numbers"},
    };
    buf[0] = 0;
    int k = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (types & names[i].bit)
            cat(buf, cap, "%s%s", k++ ? " or " : "", names[i].what);
    if (!k)
        cat(buf, cap, "nothing (a spec without types)");
}

/* What the spec allows, in words: types, range and choices. */
static void fmt_allowed(char *buf, size_t cap, const em_option_spec *sp) {
    char tmp[64], lo[40], hi[40];
    if (sp->choices) {
        snprintf(buf, cap, "one of ");
        for (int i = 0; sp->choices[i]; i++)
            cat(buf, cap, "%s'%s'", i ? ", " : "", sp->choices[i]);
        if (sp->types & ~(unsigned)EM_OPT_STRING) {
            fmt_types(tmp, sizeof tmp, sp->types & ~(unsigned)EM_OPT_STRING);
            cat(buf, cap, ", or %s", tmp);
        }
    } else {
        fmt_types(buf, cap, sp->types);
    }
    if (sp->has_range) {
        bool ints = (sp->types & (EM_OPT_INT | EM_OPT_INTS)) && !(sp->types & (EM_OPT_FLOAT |
                                                                               EM_OPT_FLOATS));
        if (ints && fabs(sp->min) < 9e15 && fabs(sp->max) < 9e15) {
            snprintf(lo, sizeof lo, "%.0f", sp->min);
            snprintf(hi, sizeof hi, "%.0f", sp->max);
        } else {
            snprintf(lo, sizeof lo, "%g", sp->min);
            snprintf(hi, sizeof hi, "%g", sp->max);
        }
        cat(buf, cap, " in [%s, %s]", lo, hi);
    }
}

/* ---- resolving ----------------------------------------------------------------------------- */

static unsigned lowest_bit(unsigned x) { return x & (~x + 1u); }

/* An error about entry e of spec sp for owner: "<where>: <owner>: option '<name>' = <value>:
 * <why>; expected <allowed>". */
static em_status value_error(const char *owner, const opt_entry *e, const em_option_spec *sp,
                             const char *why) {
    char val[256], allowed[512];
    fmt_value(val, sizeof val, e->type, &e->v, e->s);
    fmt_allowed(allowed, sizeof allowed, sp);
    const char *quote = (e->type == OPT_TEXT || e->type == EM_OPT_STRING) ? "'" : "";
    return em_set_error(EM_ERR_INVALID, "%s%s%s: option '%s' = %s%s%s: %s; expected %s%s%s%s",
                        e->where ? e->where : "", e->where ? ": " : "", owner, e->name, quote,
                        val, quote, why, allowed, sp->help ? " (" : "", sp->help ? sp->help : "",
                        sp->help ? ")" : "");
}

static const char *skip_ws(const char *p) {
    while (isspace((unsigned char)*p))
        p++;
    return p;
}

/* The token [p, end) as a string in buf (cap bytes); false when it is empty or does not fit
 * (no number needs 64 characters). */
static bool token_copy(const char *p, const char *end, char *buf, size_t cap) {
    size_t len = (size_t)(end - p);
    if (len == 0 || len >= cap)
        return false;
    memcpy(buf, p, len);
    buf[len] = 0;
    return true;
}

/* Parse a whole (trimmed) token [p, end) as an int64; false when it is not one. */
static bool parse_int(const char *p, const char *end, int64_t *out) {
    char buf[64];
    if (!token_copy(p, end, buf, sizeof buf))
        return false;
    const char *q = buf;
    if (*q == '+' || *q == '-')
        q++;
    if (!isdigit((unsigned char)*q))
        return false;
    errno = 0;
    char *stop;
    long long v = strtoll(buf, &stop, 10);
    if (*stop || errno)
        return false;
    *out = (int64_t)v;
    return true;
}

static bool parse_float(const char *p, const char *end, double *out) {
    char buf[64];
    if (!token_copy(p, end, buf, sizeof buf))
        return false;
    /* strtod also reads hex and "infinity"; only decimal numbers, inf and nan are options */
    const char *q = buf;
    if (*q == '+' || *q == '-')
        q++;
    if (strncasecmp(q, "inf", 3) == 0 || strncasecmp(q, "nan", 3) == 0) {
        if (q[3])
            return false;
    } else if (!isdigit((unsigned char)*q) && !(*q == '.' && isdigit((unsigned char)q[1]))) {
        return false;
    } else if (strpbrk(q, "xXpP")) {
        return false;
    }
    char *stop;
    errno = 0;
    double v = strtod(buf, &stop);
    /* "1e400" is not "inf": a number beyond a double's range is refused, not rounded to one */
    if (*stop || (errno == ERANGE && isinf(v)))
        return false;
    *out = v;
    return true;
}

/* Whether the text between p and end is a decimal number too large for a double. */
static bool float_overflows(const char *p, const char *end) {
    char buf[64];
    if (!token_copy(p, end, buf, sizeof buf))
        return false;
    char *stop;
    errno = 0;
    double v = strtod(buf, &stop);
    return !*stop && errno == ERANGE && isinf(v);
}

static bool parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = true, true;
        if (strcasecmp(s, no[i]) == 0) return *out = false, true;
    }
    return false;
}

/* Type text t (trimmed) as the spec allows; fills out (type and value; a string result points
 * into *owned, which the caller frees). Returns a reason on failure, NULL on success. */
static const char *type_text(const char *text, unsigned types, opt_entry *out, char **owned) {
    const char *p = skip_ws(text);
    const char *end = p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1]))
        end--;
    size_t len = (size_t)(end - p);
    int64_t iv;
    double fv;
    bool bv;

    /* a list: [a, b] or (a, b) */
    if (len >= 2 && ((*p == '[' && end[-1] == ']') || (*p == '(' && end[-1] == ')'))) {
        if (!(types & (EM_OPT_INTS | EM_OPT_FLOATS)))
            return "a list is not allowed here";
        em_option_value v = {0};
        bool all_int = true;
        const char *q = skip_ws(p + 1), *lend = end - 1;
        if (q < lend) {
            for (;;) {
                const char *tok = q, *te = q;
                while (te < lend && *te != ',')
                    te++;
                const char *next = te;
                while (te > tok && isspace((unsigned char)te[-1]))
                    te--;
                if (v.n == EM_OPT_MAX_LIST)
                    return "too many list entries (at most 8)";
                if (parse_int(tok, te, &iv)) {
                    v.ints[v.n] = iv;
                    v.floats[v.n] = (double)iv;
                } else if (parse_float(tok, te, &fv)) {
                    all_int = false;
                    v.floats[v.n] = fv;
                } else {
                    return te == tok ? "an empty list entry" : "a list entry is not a number";
                }
                v.n++;
                if (next >= lend)
                    break;
                q = skip_ws(next + 1);
            }
        }
        if (all_int && (types & EM_OPT_INTS)) {
            out->type = EM_OPT_INTS;
        } else if (types & EM_OPT_FLOATS) {
            out->type = EM_OPT_FLOATS;
        } else {
            return "list entries must be integers";
        }
        out->v = v;
        return NULL;
    }
    if (parse_int(p, end, &iv)) {
        if (types & EM_OPT_INT) {
            out->type = EM_OPT_INT;
            out->v.i = iv;
            return NULL;
        }
        if (types & EM_OPT_FLOAT) {
            out->type = EM_OPT_FLOAT;
            out->v.f = (double)iv;
            return NULL;
        }
        if (types & EM_OPT_INTS) {
            out->type = EM_OPT_INTS;
            out->v.n = 1;
            out->v.ints[0] = iv;
            return NULL;
        }
        if (types & EM_OPT_FLOATS) {
            out->type = EM_OPT_FLOATS;
            out->v.n = 1;
            out->v.floats[0] = (double)iv;
            return NULL;
        }
        if ((types & EM_OPT_BOOL) && (iv == 0 || iv == 1)) {
            out->type = EM_OPT_BOOL;
            out->v.b = iv == 1;
            return NULL;
        }
    } else if (parse_float(p, end, &fv)) {
        if (types & EM_OPT_FLOAT) {
            out->type = EM_OPT_FLOAT;
            out->v.f = fv;
            return NULL;
        }
        if (types & EM_OPT_FLOATS) {
            out->type = EM_OPT_FLOATS;
            out->v.n = 1;
            out->v.floats[0] = fv;
            return NULL;
        }
        if (types & (EM_OPT_INT | EM_OPT_INTS))
            return "not an integer";
    }
    char *s = em__malloc(len + 1, "options");
    if (!s)
        return "out of memory";
    memcpy(s, p, len);
    s[len] = 0;
    if (parse_bool(s, &bv) && (types & EM_OPT_BOOL)) {
        em__free(s);
        out->type = EM_OPT_BOOL;
        out->v.b = bv;
        return NULL;
    }
    if (types & EM_OPT_STRING) {
        /* a quoted string loses its quotes */
        if (len >= 2 && (s[0] == '"' || s[0] == '\'') && s[len - 1] == s[0]) {
            memmove(s, s + 1, len - 2);
            s[len - 2] = 0;
        }
        out->type = EM_OPT_STRING;
        out->v.s = s;
        *owned = s;
        return NULL;
    }
    em__free(s);
    return float_overflows(p, end) ? "beyond the range of a double" : "wrong type";
}

/* Convert a typed value to a type the spec allows (losslessly); NULL on success. */
static const char *convert(unsigned types, opt_entry *e) {
    if (e->type & types)
        return NULL;
    em_option_value v = e->v;
    switch (e->type) {
    case EM_OPT_INT:
        if (types & EM_OPT_FLOAT) {
            e->type = EM_OPT_FLOAT;
            e->v.f = (double)v.i;
        } else if (types & EM_OPT_INTS) {
            e->type = EM_OPT_INTS;
            e->v.n = 1;
            e->v.ints[0] = v.i;
        } else if (types & EM_OPT_FLOATS) {
            e->type = EM_OPT_FLOATS;
            e->v.n = 1;
            e->v.floats[0] = (double)v.i;
        } else {
            return "wrong type";
        }
        return NULL;
    case EM_OPT_FLOAT:
        if (types & EM_OPT_FLOATS) {
            e->type = EM_OPT_FLOATS;
            e->v.n = 1;
            e->v.floats[0] = v.f;
            return NULL;
        }
        return (types & (EM_OPT_INT | EM_OPT_INTS)) ? "not an integer" : "wrong type";
    case EM_OPT_INTS:
        if (types & EM_OPT_FLOATS) {
            e->type = EM_OPT_FLOATS;
            for (int i = 0; i < v.n; i++)
                e->v.floats[i] = (double)v.ints[i];
            return NULL;
        }
        if ((types & EM_OPT_INT) && v.n == 1) {
            e->type = EM_OPT_INT;
            e->v.i = v.ints[0];
            return NULL;
        }
        return "wrong type";
    case EM_OPT_FLOATS:
        if ((types & EM_OPT_FLOAT) && v.n == 1) {
            e->type = EM_OPT_FLOAT;
            e->v.f = v.floats[0];
            return NULL;
        }
        return "wrong type";
    default:
        return "wrong type";
    }
}

static bool in_range(const em_option_spec *sp, double x) {
    return !isnan(x) && x >= sp->min && x <= sp->max;
}

/* Check e (typed, of an allowed type) against sp's range and choices. NULL when fine. */
static const char *check_value(const em_option_spec *sp, const opt_entry *e) {
    if (sp->has_range) {
        switch (e->type) {
        case EM_OPT_INT:
            if (!in_range(sp, (double)e->v.i)) return "out of range";
            break;
        case EM_OPT_FLOAT:
            if (!in_range(sp, e->v.f)) return "out of range";
            break;
        case EM_OPT_INTS:
            for (int i = 0; i < e->v.n; i++)
                if (!in_range(sp, (double)e->v.ints[i])) return "a list entry is out of range";
            break;
        case EM_OPT_FLOATS:
            for (int i = 0; i < e->v.n; i++)
                if (!in_range(sp, e->v.floats[i])) return "a list entry is out of range";
            break;
        default: break;
        }
    }
    if (sp->choices && e->type == EM_OPT_STRING) {
        for (int i = 0; sp->choices[i]; i++)
            if (strcmp(sp->choices[i], e->s) == 0)
                return NULL;
        return "not one of the choices";
    }
    return NULL;
}

/* Levenshtein distance ignoring case, capped at 64-character names (longer ones compare as far
 * apart). Shared with module.c's did-you-mean. */
int em__edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 1000;
    int row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int sub = diag + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int best = sub;
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static em_status unknown_key(const char *owner, const opt_entry *e, const em_option_spec *specs,
                             int n) {
    char list[768] = "", hint[160] = "";
    int best = 1000, bi = -1;
    for (int i = 0; i < n; i++) {
        cat(list, sizeof list, "%s%s", i ? ", " : "", specs[i].name);
        int d = em__edit_distance(e->name, specs[i].name);
        if (d < best) {
            best = d;
            bi = i;
        }
    }
    int len = (int)strlen(e->name);
    int limit = len <= 3 ? 1 : (len <= 8 ? 2 : 3);
    if (bi >= 0 && best <= limit)
        snprintf(hint, sizeof hint, " (did you mean '%s'?)", specs[bi].name);
    return em_set_error(EM_ERR_INVALID, "%s%s%s: unknown option '%s'%s; %s takes: %s",
                        e->where ? e->where : "", e->where ? ": " : "", owner, e->name, hint,
                        owner, n ? list : "no options");
}

em_status em_options_resolve(em_options *o, const char *owner, const em_option_spec *specs,
                             int n) {
    if (!owner)
        owner = "options";
    if (!o || (n > 0 && !specs) || n < 0)
        return em_set_error(EM_ERR_INVALID, "%s: resolve without a bag or spec table", owner);

    /* Unknown keys first: they are the likeliest mistake, and a typo would otherwise show up
     * as a missing required option. */
    for (size_t k = 0; k < o->n; k++) {
        int i = 0;
        while (i < n && strcmp(specs[i].name, o->e[k].name) != 0)
            i++;
        if (i == n)
            return unknown_key(owner, &o->e[k], specs, n);
    }

    /* Typed copies of every entry, then the defaults, swapped in only when all is well. */
    size_t cap = o->n + (size_t)n;
    opt_entry *ne = em__calloc(cap ? cap : 1, sizeof(opt_entry), "options");
    if (!ne)
        return EM_ERR_NOMEM;
    size_t nn = 0;
    em_status st = EM_OK;
    for (size_t k = 0; k < o->n && st == EM_OK; k++) {
        const opt_entry *src = &o->e[k];
        const em_option_spec *sp = specs;
        while (strcmp(sp->name, src->name) != 0)
            sp++;
        opt_entry *d = &ne[nn];
        if (!entry_copy(d, src)) {
            st = EM_ERR_NOMEM;
            break;
        }
        nn++;
        const char *why;
        if (d->type == OPT_TEXT) {
            char *owned = NULL;
            opt_entry t = {0};
            why = type_text(d->s, sp->types, &t, &owned);
            if (why) {
                st = value_error(owner, d, sp, why);
                break;
            }
            d->type = t.type;
            d->v = t.v;
            if (t.type == EM_OPT_STRING) {
                em__free(d->s);
                d->s = owned;
                d->v.s = owned;
            }
        } else if ((why = convert(sp->types, d)) != NULL) {
            st = value_error(owner, d, sp, why);
            break;
        }
        if (d->type != EM_OPT_STRING && d->s) {
            em__free(d->s); /* the text, now typed */
            d->s = NULL;
        }
        if ((why = check_value(sp, d)) != NULL)
            st = value_error(owner, d, sp, why);
    }
    for (int i = 0; i < n && st == EM_OK; i++) {
        if (find(o, specs[i].name) >= 0)
            continue;
        const em_option_spec *sp = &specs[i];
        if (sp->required) {
            char allowed[512];
            fmt_allowed(allowed, sizeof allowed, sp);
            st = em_set_error(EM_ERR_INVALID, "%s: option '%s' is required: %s%s%s%s", owner,
                              sp->name, allowed, sp->help ? " (" : "", sp->help ? sp->help : "",
                              sp->help ? ")" : "");
            break;
        }
        opt_entry *d = &ne[nn];
        d->name = em__strdup(sp->name, "options");
        if (!d->name) {
            st = EM_ERR_NOMEM;
            break;
        }
        nn++;
        d->type = sp->def_type ? sp->def_type : lowest_bit(sp->types);
        d->v = sp->def;
        d->v.s = NULL;
        if (d->type == EM_OPT_STRING) {
            d->s = em__strdup(sp->def.s ? sp->def.s : "", "options");
            if (!d->s) {
                st = EM_ERR_NOMEM;
                break;
            }
            d->v.s = d->s;
        }
    }
    if (st != EM_OK) {
        for (size_t k = 0; k < nn; k++)
            entry_clear(&ne[k]);
        em__free(ne);
        return st;
    }
    for (size_t k = 0; k < o->n; k++)
        entry_clear(&o->e[k]);
    em__free(o->e);
    o->e = ne;
    o->n = nn;
    o->cap = cap ? cap : 1;
    em__strindex_free(&o->index); /* the positions changed */
    index_sync(o);
    return EM_OK;
}

/* ---- reading ------------------------------------------------------------------------------- */

uint64_t em_options_key_compares(const em_options *o) {
    return o ? o->compares : 0;
}

static const opt_entry *get(const em_options *o, const char *name) {
    ptrdiff_t k = find(o, name);
    return k >= 0 ? &o->e[k] : NULL;
}

bool em_options_has(const em_options *o, const char *name) { return get(o, name) != NULL; }

unsigned em_options_type(const em_options *o, const char *name) {
    const opt_entry *e = get(o, name);
    return e ? e->type : 0;
}

int64_t em_options_int(const em_options *o, const char *name) {
    const opt_entry *e = get(o, name);
    if (!e) return 0;
    if (e->type == EM_OPT_INT) return e->v.i;
    if (e->type == EM_OPT_INTS && e->v.n >= 1) return e->v.ints[0];
    if (e->type == EM_OPT_BOOL) return e->v.b;
    return 0;
}

double em_options_float(const em_options *o, const char *name) {
    const opt_entry *e = get(o, name);
    if (!e) return 0;
    if (e->type == EM_OPT_FLOAT) return e->v.f;
    if (e->type == EM_OPT_INT) return (double)e->v.i;
    if (e->type == EM_OPT_FLOATS && e->v.n >= 1) return e->v.floats[0];
    return 0;
}

bool em_options_bool(const em_options *o, const char *name) {
    const opt_entry *e = get(o, name);
    return e && e->type == EM_OPT_BOOL ? e->v.b : false;
}

const char *em_options_string(const em_options *o, const char *name) {
    const opt_entry *e = get(o, name);
    return e && e->type == EM_OPT_STRING ? e->s : NULL;
}

int em_options_ints(const em_options *o, const char *name, int64_t *out, int cap) {
    const opt_entry *e = get(o, name);
    if (!e) return 0;
    if (e->type == EM_OPT_INT) {
        if (cap >= 1 && out) out[0] = e->v.i;
        return 1;
    }
    if (e->type != EM_OPT_INTS) return 0;
    for (int i = 0; i < e->v.n && i < cap && out; i++)
        out[i] = e->v.ints[i];
    return e->v.n;
}

int em_options_floats(const em_options *o, const char *name, double *out, int cap) {
    const opt_entry *e = get(o, name);
    if (!e) return 0;
    if (e->type == EM_OPT_INT || e->type == EM_OPT_FLOAT) {
        if (cap >= 1 && out) out[0] = e->type == EM_OPT_INT ? (double)e->v.i : e->v.f;
        return 1;
    }
    if (e->type != EM_OPT_FLOATS && e->type != EM_OPT_INTS) return 0;
    for (int i = 0; i < e->v.n && i < cap && out; i++)
        out[i] = e->type == EM_OPT_FLOATS ? e->v.floats[i] : (double)e->v.ints[i];
    return e->v.n;
}

size_t em_options_count(const em_options *o) { return o ? o->n : 0; }

const char *em_options_name(const em_options *o, size_t i) {
    return o && i < o->n ? o->e[i].name : NULL;
}

const char *em_options_text(const em_options *o, size_t i, char *buf, size_t cap) {
    if (!buf || cap == 0)
        return buf;
    buf[0] = 0;
    if (o && i < o->n)
        fmt_value(buf, cap, o->e[i].type, &o->e[i].v, o->e[i].s);
    return buf;
}

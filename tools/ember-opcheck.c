/*
 * ember-opcheck — every kernel checked against an independent reference on every device,
 * gradients against finite differences in float64 (docs/opcheck.md).
 *
 *     ember-opcheck                              eval, grad and support of every op, on the CPU
 *     ember-opcheck --plugin ./my.so             the ops my.so declares and the kernels it adds
 *     ember-opcheck --op add,mul --device testdev --mode eval --seed 7
 *
 * The cases are the op-case rows of the registry (ember/opcase.h): the core's for the standard
 * ops, a plugin's for its own; an op without rows is tried with generic inputs derived from its
 * schema. Modes (--mode, a comma list; default eval,grad,support):
 *   eval     on the CPU: every kernel of the op's priority stack against the one below it, on
 *            outputs poisoned first (NaN, or a sentinel for integers and bools, so every element
 *            must be written); every float32/float16/bfloat16 result against the same case in
 *            float64 within the dtype's tolerance; layout invariance (a transposed, sliced,
 *            expanded or channels-last input gives the bits of its contiguous copy; rows
 *            flagged EM_CASE_LAYOUT_TOL, the convolutions on channels-last operands, within
 *            the dtype's tolerance). On another device: every
 *            kernel it registers against the CPU; ops it runs through the fallback policy are
 *            reported as "fallback", never as passed.
 *   grad     the backward of every differentiable row against central finite differences in
 *            float64 (em_gradcheck), on the CPU and on another device computed there (float32
 *            with a looser, stated step and tolerance where the device lacks a float64 kernel
 *            for what the check needs), and there also against the CPU's backward. An op declared
 *            EM_OP_NONDIFF must give outputs that do not require grad; an op with neither a
 *            backward nor the declaration fails.
 *   support  the op x device x dtype matrix from the registry (kernel, composite, fallback),
 *            with whether each op is differentiable, checked against what the rows list.
 *   perf     time per call per op, device and dtype at the rows' sizes (not pass/fail).
 * Always on: invalid rows must fail with their status and a message; the allocator's bytes in
 * use return to their baseline after each case; the same case run from two threads at once
 * gives the same bits.
 *
 * Every failure line names the op, device, dtype, row, layout, the worst element and the
 * tolerance, and ends with the --seed that reproduces it. Exit status 0 only when every check
 * passed (fallback and declined entries are listed, never counted as passed), 1 otherwise, 2 for
 * a bad command line. The last line of the output is "N passed, M failed".
 */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/init.h"
#include "ember/opcase.h"
#include "ember/ops.h"
#include "ember/plugin.h"
#include "ember/scope.h"
#include "ember/tensor.h"

enum { M_EVAL = 1, M_GRAD = 2, M_SUPPORT = 4, M_PERF = 8 };

typedef struct options {
    const char *plugins[16];
    int n_plugins;
    const char *ops;    /* comma list, or NULL */
    const char *device; /* "cpu" (default), a type, "type:N" or "all" */
    unsigned dtypes;    /* EM_CASE_DT set; 0: every dtype */
    unsigned modes;
    uint64_t seed;
    bool json, verbose;
} options;

static options O = {.modes = M_EVAL | M_GRAD | M_SUPPORT, .seed = 1};

/* ---- results ------------------------------------------------------------------------------ */

typedef enum { R_PASS, R_FAIL, R_FALLBACK, R_DECLINED, R_NOTE } rkind;
static const char *rkind_name[] = {"pass", "fail", "fallback", "declined", "note"};
static long n_pass, n_fail, n_fallback, n_declined, n_notes;
static json_t *J; /* the --json document's results */

/* One entry: a check of (mode, op, device, dtype) and what it found. */
static void result(rkind k, const char *mode, const char *op, const char *dev, const char *dt,
                   const char *fmt, ...) {
    char detail[1400] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    switch (k) {
    case R_PASS: n_pass++; break;
    case R_FAIL: n_fail++; break;
    case R_FALLBACK: n_fallback++; break;
    case R_DECLINED: n_declined++; break;
    case R_NOTE: n_notes++; break;
    }
    if (J) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s}", "result", rkind_name[k], "mode", mode,
                              "op", op, "device", dev, "dtype", dt ? dt : "");
        if (detail[0]) json_object_set_new(o, "detail", json_string(detail));
        json_array_append_new(J, o);
        return;
    }
    if (k == R_PASS && !O.verbose) return;
    static const char *tag[] = {"ok", "FAIL", "fallback", "declined", "note"};
    printf("%-8s %-7s %s %s%s%s%s%s\n", tag[k], mode, op, dev, dt ? " " : "", dt ? dt : "",
           detail[0] ? ": " : "", detail);
}

/* A (mode, op, device, dtype) check collects its rows' failures before it is reported. */
typedef struct unit {
    const char *mode, *op, *dev, *dt;
    int fails, checked, fallbacks, declined;
    char first[1400]; /* the first failure, in full */
    char notes[600];
    /* Kernels whose supports() declined rows, with how many. */
    const em_kernel *dk[8];
    int dn[8], n_dk;
} unit;

static void unit_declined(unit *u, const em_kernel *k) {
    u->declined++;
    for (int i = 0; i < u->n_dk; i++)
        if (u->dk[i] == k) {
            u->dn[i]++;
            return;
        }
    if (u->n_dk < 8) u->dk[u->n_dk] = k, u->dn[u->n_dk++] = 1;
}

static void unit_fail(unit *u, const char *fmt, ...) {
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* Every failing row is printed; the unit counts once. */
    if (!J)
        printf("FAIL     %-7s %s %s %s: %s [--seed %llu]\n", u->mode, u->op, u->dev, u->dt, buf,
               (unsigned long long)O.seed);
    if (!u->fails++)
        snprintf(u->first, sizeof u->first, "%s [--seed %llu]", buf, (unsigned long long)O.seed);
}

static void unit_note(unit *u, const char *fmt, ...) {
    size_t len = strlen(u->notes);
    if (len + 4 >= sizeof u->notes || strstr(u->notes, fmt)) return;
    va_list ap;
    va_start(ap, fmt);
    if (len) snprintf(u->notes + len, sizeof u->notes - len, "; "), len += 2;
    vsnprintf(u->notes + len, sizeof u->notes - len, fmt, ap);
    va_end(ap);
}

static void unit_end(unit *u) {
    for (int i = 0; i < u->n_dk; i++) {
        const em_kernel_def *d = em_kernel_def_of(u->dk[i]);
        result(R_DECLINED, u->mode, u->op, u->dev, u->dt, "kernel %s (priority %d) declines %d "
               "row(s): not checked on them", d->name, d->priority, u->dn[i]);
    }
    if (u->fails) {
        if (J) result(R_FAIL, u->mode, u->op, u->dev, u->dt, "%s", u->first);
        else n_fail++;
    } else if (u->fallbacks) {
        result(R_FALLBACK, u->mode, u->op, u->dev, u->dt,
               "runs on the CPU through the fallback policy (%d of %d rows)", u->fallbacks,
               u->checked + u->fallbacks);
    } else if (u->checked) {
        result(R_PASS, u->mode, u->op, u->dev, u->dt, "%d row(s)%s%s", u->checked,
               u->notes[0] ? "; " : "", u->notes);
        return;
    } else if (!u->declined) {
        result(R_NOTE, u->mode, u->op, u->dev, u->dt, "nothing checked%s%s",
               u->notes[0] ? ": " : "", u->notes);
        return;
    }
    if (u->notes[0] && !u->fails) result(R_NOTE, u->mode, u->op, u->dev, u->dt, "%s", u->notes);
}

/* ---- tensors ------------------------------------------------------------------------------ */

static em_device CPU;

/* t's elements in C order, as float64 (NULL on error; free()). */
static double *values(const em_tensor *t) {
    int64_t n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_tensor *h = em_to_dtype(em_to_device(t, CPU), EM_F64);
    if (!v || !h || em_tensor_to_host(h, v, sizeof(double) * (size_t)n) != EM_OK) {
        free(v);
        return NULL;
    }
    return v;
}

/* t's bytes in C order (free()). */
static unsigned char *bytes(const em_tensor *t, size_t *n) {
    *n = (size_t)em_tensor_numel(t) * em_dtype_size(em_tensor_dtype(t));
    unsigned char *b = malloc(*n ? *n : 1);
    if (b && em_tensor_to_host(t, b, *n) != EM_OK) {
        free(b);
        return NULL;
    }
    return b;
}

/* "[1, 2]" for element e of a tensor of t's shape. */
static const char *index_str(const em_tensor *t, int64_t e, char *buf, size_t cap) {
    int nd = em_tensor_ndim(t);
    const int64_t *sh = em_tensor_shape(t);
    int64_t idx[EM_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = sh[d] ? e % sh[d] : 0;
        e = sh[d] ? e / sh[d] : 0;
    }
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < nd && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)idx[d]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

static bool same_shape(const em_tensor *a, const em_tensor *b) {
    if (em_tensor_ndim(a) != em_tensor_ndim(b) || em_tensor_dtype(a) != em_tensor_dtype(b))
        return false;
    for (int d = 0; d < em_tensor_ndim(a); d++)
        if (em_tensor_shape(a)[d] != em_tensor_shape(b)[d]) return false;
    return true;
}

/* Compare output got with want: floating values within tol * (1 + |want|), tol got's dtype's
 * tolerance (em_case_tolerance) times scale (NaN matches NaN); anything else (or scale < 0:
 * bitwise) byte for byte. On a mismatch *why names the worst
 * element, both values and the tolerance, and says when the element still holds the poison. */
static bool compare(const em_tensor *got, const em_tensor *want, double scale, char *why,
                    size_t cap) {
    char sg[96], sw[96];
    double tol = scale < 0 ? -1 : em_case_tolerance(em_tensor_dtype(got)) * scale;
    if (!same_shape(got, want) && !(tol >= 0 && em_tensor_ndim(got) == em_tensor_ndim(want) &&
                                    em_tensor_numel(got) == em_tensor_numel(want))) {
        snprintf(why, cap, "%s %s where the reference is %s %s",
                 em_dtype_name(em_tensor_dtype(got)),
                 em_shape_str(em_tensor_ndim(got), em_tensor_shape(got), sg, sizeof sg),
                 em_dtype_name(em_tensor_dtype(want)),
                 em_shape_str(em_tensor_ndim(want), em_tensor_shape(want), sw, sizeof sw));
        return false;
    }
    int64_t n = em_tensor_numel(got);
    if (tol < 0 || !em_dtype_is_floating(em_tensor_dtype(got)) ||
        !em_dtype_is_floating(em_tensor_dtype(want))) {
        if (em_tensor_dtype(got) == em_tensor_dtype(want)) {
            size_t na, nb;
            unsigned char *a = bytes(got, &na), *b = bytes(want, &nb);
            bool ok = a && b && na == nb && memcmp(a, b, na) == 0;
            if (!ok && a && b) {
                size_t es = em_dtype_size(em_tensor_dtype(got));
                int64_t e = 0;
                while (e < n && memcmp(a + (size_t)e * es, b + (size_t)e * es, es) == 0) e++;
                double x = em_dtype_load(em_tensor_dtype(got), a, e),
                       y = em_dtype_load(em_tensor_dtype(want), b, e);
                bool poison = true;
                for (size_t k = 0; k < es; k++) poison &= a[(size_t)e * es + k] == 0xA5;
                if (em_dtype_is_floating(em_tensor_dtype(got))) poison = isnan(x) && !isnan(y);
                snprintf(why, cap, "element %s: %.9g vs %.9g (bitwise)%s",
                         index_str(want, e, sg, sizeof sg), x, y,
                         poison ? " (not written: still the poison)" : "");
            } else if (!ok) {
                snprintf(why, cap, "could not read the outputs: %s", em_last_error());
            }
            free(a);
            free(b);
            return ok;
        }
    }
    double *x = values(got), *y = values(want);
    bool ok = x && y;
    if (!ok) snprintf(why, cap, "could not read the outputs: %s", em_last_error());
    int64_t worst = -1;
    double worst_ex = 0;
    for (int64_t i = 0; ok && i < n; i++) {
        if (x[i] == y[i] || (isnan(x[i]) && isnan(y[i]))) continue;
        double lim = tol * (1 + fabs(y[i]));
        double ex = isfinite(x[i]) && isfinite(y[i]) ? fabs(x[i] - y[i]) / (lim > 0 ? lim : 1e-300)
                                                     : INFINITY;
        if (ex > 1 && (worst < 0 || ex > worst_ex)) worst = i, worst_ex = ex;
    }
    if (ok && worst >= 0) {
        ok = false;
        snprintf(why, cap, "worst element %s: %.9g vs %.9g (|diff| %.3g, tolerance %.3g * (1 + "
                 "|ref|))%s", index_str(want, worst, sg, sizeof sg), x[worst], y[worst],
                 fabs(x[worst] - y[worst]), tol,
                 isnan(x[worst]) && !isnan(y[worst]) ? " (not written: still the poison)" : "");
    }
    free(x);
    free(y);
    return ok;
}

/* ---- rows --------------------------------------------------------------------------------- */

/* A row and where it came from. */
typedef struct row {
    const em_op_case *c;
    int index;    /* in the registry, or -1 for a generic row */
    bool generic; /* made here from the schema */
} row;

static const char *layout_name(const em_op_case *c) {
    static const char *names[] = {"contiguous", "transposed", "sliced", "expanded",
                                  "channels-last", "nchw16c"};
    int worst = 0;
    for (int i = 0; i < c->n_in; i++)
        if (!c->in[i].absent && (int)c->in[i].layout > worst) worst = (int)c->in[i].layout;
    return names[worst];
}

/* "row 12 (broadcast), transposed" */
static const char *row_str(const row *r, char *buf, size_t cap) {
    if (r->generic)
        snprintf(buf, cap, "generic inputs (%s, %s)", r->c->variant, layout_name(r->c));
    else
        snprintf(buf, cap, "row %d (%s), %s", r->index, r->c->variant ? r->c->variant : "",
                 layout_name(r->c));
    return buf;
}

static uint64_t row_seed(const row *r, int k) {
    return O.seed * 1000003u + (uint64_t)(r->index + 1) * 7919u + (uint64_t)k;
}

/* Generic rows for an op without case rows: every input a floating tensor of one shape, in
 * several shapes and layouts, default attributes. */
#define N_GENERIC 4
static em_op_case generic_rows[N_GENERIC];

static int make_generic(const em_op *op, unsigned dtypes) {
    const em_op_schema *s = em_op_schema_of(op);
    static const struct {
        const char *what;
        int nd;
        int64_t shape[4];
        em_case_layout lay;
    } g[N_GENERIC] = {{"shape [3, 4]", 2, {3, 4}, EM_CASE_CONTIG},
                      {"shape [3, 4]", 2, {3, 4}, EM_CASE_TRANSPOSED},
                      {"shape [2, 3, 5]", 3, {2, 3, 5}, EM_CASE_SLICED},
                      {"shape [4]", 1, {4}, EM_CASE_EXPANDED}};
    int n_in = s->n_inputs ? s->n_inputs : 1;
    if (n_in > EM_CASE_MAX_IN || (s->flags & EM_OP_LISTS)) return 0;
    bool diff = !(s->flags & EM_OP_NONDIFF) && (s->backward || s->composite);
    for (int k = 0; k < N_GENERIC; k++) {
        em_op_case *c = &generic_rows[k];
        *c = (em_op_case){.struct_size = sizeof *c, .op = em_op_name(op), .variant = g[k].what,
                          .n_in = s->n_inputs, .dtypes = dtypes, .expect = EM_OK,
                          .differentiable = diff};
        for (int i = 0; i < n_in; i++) {
            c->in[i] = (em_case_input){.ndim = g[k].nd, .layout = g[k].lay, .dtype = -1};
            memcpy(c->in[i].shape, g[k].shape, sizeof g[k].shape);
        }
    }
    return N_GENERIC;
}

/* The inputs of a row in dt (n entries; a fill's one entry is its output). */
static em_status build(const row *r, em_dtype dt, em_tensor **in) {
    const em_op_case *c = r->c;
    int n = c->n_in ? c->n_in : 1;
    for (int i = 0; i < n; i++) {
        in[i] = em_case_make(&c->in[i], dt, row_seed(r, i));
        if (!in[i] && !c->in[i].absent) return em_last_status();
    }
    return EM_OK;
}

/* Call the row's op by name: out[0 .. *n) new references in the scope. A fill writes into a
 * tensor like in[0] (into `given` when set). */
static em_status call(const em_op *op, const em_op_case *c, em_tensor *const *in,
                      em_tensor **out, int *n, em_tensor *given) {
    const em_op_schema *s = em_op_schema_of(op);
    *n = 0;
    if (s->n_inputs == 0) {
        em_tensor *t = given ? given : em_empty_like(in[0]);
        if (!t) return em_last_status();
        em_status st = em_op_call_out(op, NULL, 0, c->attrs, &t, 1);
        if (st == EM_OK) out[0] = t, *n = 1;
        return st;
    }
    return em_op_call_n(op, (const em_tensor *const *)in, c->n_in, c->attrs, out, 16, n);
}

static size_t mem_in_use(em_device dev) {
    em_memory_stats m;
    if (em_memory_stats_get(dev, &m) != EM_OK) return 0;
    size_t t = 0;
    for (int k = 0; k < EM_MEM_CATEGORY_COUNT; k++)
        if (k != EM_MEM_CACHED) t += m.current[k]; /* kept for reuse is not held */
    return t;
}

static uint64_t fallbacks_of(em_device dev) {
    char name[48];
    em_device_str(dev, name, sizeof name);
    char *colon = strchr(name, ':');
    if (colon) *colon = 0;
    em_placement_stats p;
    return em_placement_get(name, &p) == EM_OK ? p.fallbacks : 0;
}

/* ---- two threads at once ------------------------------------------------------------------ */

typedef struct twin {
    const em_op *op;
    const em_op_case *c;
    em_tensor *const *in;
    pthread_barrier_t *bar;
    unsigned char *b[16];
    size_t nb[16];
    int n;
    em_status st;
} twin;

static void *twin_run(void *p) {
    twin *t = p;
    em_scope_begin();
    pthread_barrier_wait(t->bar);
    em_tensor *out[16] = {0};
    t->st = call(t->op, t->c, t->in, out, &t->n, NULL);
    for (int k = 0; t->st == EM_OK && k < t->n; k++) t->b[k] = bytes(out[k], &t->nb[k]);
    em_scope_end();
    return NULL;
}

/* The row run from two threads at once must give ref's bits in both. */
static void two_threads(unit *u, const em_op *op, const row *r, em_tensor *const *in,
                        em_tensor *const *ref, int n_ref) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    twin t[2] = {{.op = op, .c = r->c, .in = in, .bar = &bar},
                 {.op = op, .c = r->c, .in = in, .bar = &bar}};
    pthread_t th;
    bool threaded = pthread_create(&th, NULL, twin_run, &t[1]) == 0;
    if (!threaded) { /* one thread: it runs alone */
        pthread_barrier_destroy(&bar);
        pthread_barrier_init(&bar, NULL, 1);
    }
    twin_run(&t[0]);
    if (threaded) pthread_join(th, NULL);
    pthread_barrier_destroy(&bar);
    char rs[160];
    for (int w = 0; w < 2; w++) {
        if (t[w].st != EM_OK || t[w].n != n_ref) {
            unit_fail(u, "%s: from two threads at once, thread %d gave %s", row_str(r, rs, sizeof rs),
                      w, em_status_name(t[w].st));
        } else {
            for (int k = 0; k < n_ref; k++) {
                size_t nb;
                unsigned char *b = bytes(ref[k], &nb);
                if (!b || nb != t[w].nb[k] || memcmp(b, t[w].b[k], nb) != 0)
                    unit_fail(u, "%s: from two threads at once, output %d of thread %d differs "
                              "bitwise from a call alone", row_str(r, rs, sizeof rs), k, w);
                free(b);
            }
        }
        for (int k = 0; k < 16; k++) free(t[w].b[k]);
    }
}

/* ---- eval --------------------------------------------------------------------------------- */

/* Every kernel of the stack the row dispatches on (device dev), each on outputs poisoned
 * first: on the CPU each against the next one below it that runs the call, the lowest against
 * `ref` (the call by name); on another device each against `ref`, the CPU's result. */
static void check_stack(unit *u, const em_op *op, const row *r, em_device dev,
                        em_tensor *const *in, int n_in, em_tensor *const *ref, int n_ref,
                        em_tensor *const *r64, double sc) {
    const em_op_schema *s = em_op_schema_of(op);
    bool on_cpu = em_device_equal(dev, CPU);
    char rs[160], why[600];
    row_str(r, rs, sizeof rs);
    enum { MAXK = 16 };
    em_tensor *outs[MAXK][16];
    const em_kernel *ks[MAXK];
    int n_ok = 0;
    for (size_t depth = 0; depth < MAXK; depth++) {
        em_tensor **out = outs[n_ok];
        memset(out, 0, sizeof outs[0]);
        if (n_in == 0 && !(out[0] = em_empty_like(ref[0])))
            return unit_fail(u, "%s: %s", rs, em_last_error());
        int n = 0;
        const em_kernel *k = NULL;
        em_status st = em_op_call_at(op, depth, EM_CALL_POISON, (const em_tensor *const *)in,
                                     n_in, r->c->attrs, out, 16, &n, &k);
        if (st == EM_OK && !k) { /* a composite that did not call its kernel here */
            unit_note(u, "the composite does not reach its kernel for some rows");
            break;
        }
        const em_kernel_def *d = em_kernel_def_of(k);
        if (st == EM_ERR_RANGE && !k) { /* past the bottom of the stack */
            em_clear_error();
            break;
        }
        if (st == EM_ERR_NOKERNEL && k) {
            em_clear_error();
            unit_declined(u, k);
            continue;
        }
        if (st != EM_OK) {
            unit_fail(u, "%s: kernel %s failed: %s", rs, d ? d->name : "?", em_last_error());
            em_clear_error();
            continue;
        }
        ks[n_ok++] = k;
    }
    for (int i = 0; i < n_ok; i++) {
        const em_kernel_def *d = em_kernel_def_of(ks[i]);
        bool last = i + 1 == n_ok || !on_cpu;
        /* The lowest of several is checked against float64 (eval_row), not against the call
         * by name, which ran the top one. */
        bool vs64 = on_cpu && last && n_ok > 1;
        if (vs64 && !r64) break;
        for (int j = 0; j < n_ref && j < s->n_outputs; j++) {
            const em_tensor *want = vs64 ? r64[j] : last ? ref[j] : outs[i + 1][j];
            if (!compare(outs[i][j], want, sc, why, sizeof why))
                unit_fail(u, "%s: kernel %s (priority %d) output %d against %s: %s", rs, d->name,
                          d->priority, j,
                          vs64    ? "float64"
                          : !last ? em_kernel_def_of(ks[i + 1])->name
                          : on_cpu ? "the call by name" : "the CPU",
                          why);
        }
    }
}

/* An invalid row: the status it lists, with a message. */
static void check_invalid(unit *u, const em_op *op, const row *r, em_dtype dt) {
    char rs[160];
    em_tensor *in[EM_CASE_MAX_IN] = {0}, *out[16];
    int n;
    em_status st = build(r, dt, in);
    if (st == EM_OK) {
        if (em_op_schema_of(op)->flags & EM_OP_LISTS)
            st = em_op_call_lists(op, 1, (const em_tensor *const *)in, r->c->attrs,
                                  in + em_op_schema_of(op)->n_inputs);
        else
            st = call(op, r->c, in, out, &n, NULL);
    }
    const char *msg = em_last_error();
    if (st != r->c->expect)
        unit_fail(u, "%s: %s (%s) where the row expects %s", row_str(r, rs, sizeof rs),
                  em_status_name(st), st ? msg : "", em_status_name(r->c->expect));
    else if (!msg || !msg[0])
        unit_fail(u, "%s: %s without a message", row_str(r, rs, sizeof rs), em_status_name(st));
    else
        u->checked++;
    em_clear_error();
}

/* A list op: the update in dt against the same update in float64. */
static void check_lists(unit *u, const em_op *op, const row *r, em_dtype dt, double sc) {
    const em_op_schema *s = em_op_schema_of(op);
    em_tensor *in[EM_CASE_MAX_IN] = {0}, *in64[EM_CASE_MAX_IN] = {0};
    char rs[160], why[600];
    row_str(r, rs, sizeof rs);
    if (build(r, dt, in) != EM_OK) return unit_fail(u, "%s: inputs: %s", rs, em_last_error());
    for (int i = 0; i < r->c->n_in; i++)
        in64[i] = in[i] && r->c->in[i].dtype < 0 ? em_to_dtype(in[i], EM_F64)
                  : in[i] && i >= s->n_inputs ? em_clone(in[i]) /* updated: each call its own */
                                              : in[i];
    em_status st = em_op_call_lists(op, 1, (const em_tensor *const *)in, r->c->attrs,
                                    in + s->n_inputs);
    if (st == EM_OK && em_dtype_is_floating(dt) && dt != EM_F64)
        st = em_op_call_lists(op, 1, (const em_tensor *const *)in64, r->c->attrs,
                              in64 + s->n_inputs);
    if (st != EM_OK) return unit_fail(u, "%s: %s", rs, em_last_error());
    for (int j = 0; em_dtype_is_floating(dt) && dt != EM_F64 && j < s->n_outputs; j++)
        if (in[s->n_inputs + j] && !compare(in[s->n_inputs + j], in64[s->n_inputs + j], sc, why,
                                            sizeof why))
            unit_fail(u, "%s: output list %d against float64: %s", rs, j, why);
    u->checked++;
}

/* The dtypes an op has a kernel for on the device type of dev. */
static unsigned kernel_dtypes(const em_op *op, em_device dev) {
    unsigned m = 0;
    for (int d = 0; d < EM_DTYPE_COUNT; d++)
        if (em_op_kernel_count(op, dev, (em_dtype)d)) m |= EM_CASE_DT(d);
    return m;
}

/* One valid row of one dtype on the CPU (dev == CPU) or on another device. */
static void eval_row(unit *u, const em_op *op, const row *r, em_dtype dt, em_device dev,
                     bool threads) {
    const em_op_schema *s = em_op_schema_of(op);
    const em_op_case *c = r->c;
    bool on_cpu = em_device_equal(dev, CPU);
    double sc = c->tol_scale > 0 ? c->tol_scale : 1;
    char rs[160], why[600];
    row_str(r, rs, sizeof rs);
    if (s->flags & EM_OP_LISTS) {
        if (on_cpu) check_lists(u, op, r, dt, sc);
        else unit_note(u, "list ops are checked on the CPU");
        return;
    }
    em_tensor *in[EM_CASE_MAX_IN] = {0}, *ref[16] = {0}, *plain[EM_CASE_MAX_IN] = {0};
    int n_in = c->n_in, n_ref = 0;
    if (build(r, dt, in) != EM_OK) return unit_fail(u, "%s: inputs: %s", rs, em_last_error());
    /* A storage-layout input (EM_CASE_BLOCKED): its plain copy for the layout invariance below,
     * taken now (any copy converts the storage to plain in place, so the input is made again
     * in its layout). */
    for (int i = 0; i < n_in; i++) {
        if (!in[i] || em_tensor_layout(in[i]) == EM_LAYOUT_PLAIN) continue;
        em_layout l = em_tensor_layout(in[i]);
        if (!(plain[i] = em_clone(in[i])) || !(in[i] = em_to_layout(in[i], l)))
            return unit_fail(u, "%s: input %d's plain copy: %s", rs, i, em_last_error());
    }
    em_status st = call(op, c, in, ref, &n_ref, NULL);
    if (st != EM_OK) {
        if (r->generic) { /* the op's own rules refused the schema's generic inputs */
            unit_note(u, "generic inputs refused (%s)", em_last_error());
            em_clear_error();
            return;
        }
        unit_fail(u, "%s: %s", rs, em_last_error());
        em_clear_error();
        return;
    }
    if (on_cpu) {
        /* Against float64. */
        em_tensor *in64[EM_CASE_MAX_IN] = {0}, *r64[16] = {0};
        bool have64 = false;
        bool fixed = false;
        for (int i = 0; i < n_in; i++) fixed |= !c->in[i].absent && c->in[i].dtype >= 0;
        if (em_dtype_is_floating(dt) && dt != EM_F64 && (c->dtypes & EM_CASE_DT(EM_F64)) &&
            !(c->flags & EM_CASE_DRAWS)) {
            int n64 = 0;
            int nb = n_in ? n_in : 1;
            for (int i = 0; i < nb; i++)
                in64[i] = in[i] && (c->in[i].dtype < 0 || n_in == 0) ? em_to_dtype(in[i], EM_F64)
                                                                     : in[i];
            if (call(op, c, in64, r64, &n64, NULL) != EM_OK) {
                unit_fail(u, "%s: the float64 reference failed: %s", rs, em_last_error());
                em_clear_error();
            } else {
                have64 = n64 >= n_ref;
                for (int j = 0; j < n_ref && j < n64; j++)
                    if (!compare(ref[j], r64[j], sc, why, sizeof why))
                        unit_fail(u, "%s: output %d against float64: %s", rs, j, why);
            }
        }
        (void)fixed;
        /* Layout invariance. */
        bool strided = false;
        em_tensor *dense[EM_CASE_MAX_IN] = {0};
        for (int i = 0; i < n_in; i++) {
            dense[i] = in[i];
            if (plain[i]) {
                strided = true;
                dense[i] = plain[i];
            } else if (in[i] && !em_tensor_is_contiguous(in[i])) {
                strided = true;
                dense[i] = em_contiguous(in[i]);
            }
        }
        if (strided) {
            em_tensor *rd[16] = {0};
            int nd = 0;
            if (call(op, c, dense, rd, &nd, NULL) != EM_OK) {
                unit_fail(u, "%s: on contiguous copies of the inputs: %s", rs, em_last_error());
                em_clear_error();
            } else {
                /* Bit for bit, unless the row says the layout runs another kernel. */
                double lt = (c->flags & EM_CASE_LAYOUT_TOL) ? sc : -1;
                for (int j = 0; j < n_ref && j < nd; j++)
                    if (!compare(ref[j], rd[j], lt, why, sizeof why))
                        unit_fail(u, "%s: output %d differs from the result on contiguous copies "
                                  "of the inputs: %s", rs, j, why);
            }
        }
        /* The kernel stack. */
        if (s->infer) check_stack(u, op, r, dev, in, n_in, ref, n_ref, have64 ? r64 : NULL, sc);
        if (threads) two_threads(u, op, r, in, ref, n_ref);
        u->checked++;
        return;
    }
    /* Another device: the call there against the CPU's. */
    em_tensor *din[EM_CASE_MAX_IN] = {0}, *dout[16] = {0};
    int nb = n_in ? n_in : 1, nd = 0;
    for (int i = 0; i < nb; i++)
        if (in[i] && !(din[i] = em_to_device(in[i], dev)))
            return unit_fail(u, "%s: copying input %d to the device: %s", rs, i, em_last_error());
    uint64_t fb0 = fallbacks_of(dev);
    st = call(op, c, din, dout, &nd, n_in ? NULL : din[0]);
    if (st != EM_OK) {
        unit_fail(u, "%s: %s", rs, em_last_error());
        em_clear_error();
        return;
    }
    bool fell_back = fallbacks_of(dev) != fb0;
    for (int j = 0; j < n_ref && j < nd; j++)
        if (!compare(dout[j], ref[j], sc, why, sizeof why))
            unit_fail(u, "%s: output %d against the CPU: %s", rs, j, why);
    if (s->infer && kernel_dtypes(op, dev))
        check_stack(u, op, r, dev, din, n_in, ref, n_ref, NULL, sc);
    if (threads && !fell_back) two_threads(u, op, r, din, dout, nd);
    if (fell_back) u->fallbacks++;
    else u->checked++;
}

/* ---- grad --------------------------------------------------------------------------------- */

static bool gradable(const em_op_case *c) {
    if (!c->differentiable || c->expect != EM_OK || !(c->dtypes & EM_CASE_DT(EM_F64)))
        return false;
    /* Expanded inputs repeat values: the ties of max-like ops make one-sided finite differences
     * disagree with the tie rule. */
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i].layout == EM_CASE_EXPANDED) return false;
    return true;
}

/* Whether a row's function value f (the set-up g's) is something finite differences can check:
 * non-empty and finite, with no empty input. */
static bool checkable(const em_tensor *f, const row *r, const em_case_grad *g) {
    bool ok = f && em_tensor_numel(f) > 0 && isfinite(em_item(f));
    for (int i = 0; i < r->c->n_in && ok; i++)
        if (g->all[i] && em_tensor_numel(g->all[i]) == 0) ok = false;
    return ok;
}

/* The analytical gradients of the row (f64 on the CPU, or dt on dev), as float64 CPU tensors. */
static int row_grads(const row *r, em_dtype dt, em_device dev, em_tensor **grads, bool *finite) {
    em_case_grad g = {.struct_size = sizeof g};
    em_tensor *vary[EM_CASE_MAX_IN], *gr[EM_CASE_MAX_IN] = {0};
    int n = em_case_grad_setup(r->c, dt, row_seed(r, 100), &g, vary);
    if (n <= 0) return n;
    if (!em_device_equal(dev, CPU)) {
        for (int i = 0; i < r->c->n_in; i++)
            if (g.all[i]) g.all[i] = em_to_device(g.all[i], dev);
        for (int k = 0; k < n; k++) {
            vary[k] = em_detach(em_to_device(vary[k], dev));
            if (!vary[k] || em_requires_grad_(vary[k], true) != EM_OK) return -1;
        }
    }
    em_tensor *y = em_case_grad_fn(vary, n, &g);
    *finite = checkable(y, r, &g);
    if (!*finite) {
        em_clear_error();
        return 0;
    }
    if (em_grad(1, &y, NULL, n, vary, gr, NULL) != EM_OK) return -1;
    for (int k = 0; k < n; k++) grads[k] = gr[k] ? em_to_dtype(em_to_device(gr[k], CPU), EM_F64) : NULL;
    return n;
}

/* Finite differences in float32 (a device without float64 kernels for what the check needs):
 * central differences with a step of 1e-3, float32's rounding of the projection (about 1e-7
 * relative per term) divided by the step stays well under 1e-2. */
#define GRAD32_EPS 1e-3
#define GRAD32_EPS_S "1e-3"
#define GRAD32_TOL 1e-2
#define GRAD32_TOL_S "1e-2"

/* The row's function with float64 leaves, run in float32: each leaf converted first. */
static em_tensor *grad_fn_f32(em_tensor *const *inputs, int n, void *user) {
    em_tensor *in32[EM_CASE_MAX_IN];
    for (int k = 0; k < n && k < EM_CASE_MAX_IN; k++)
        if (!(in32[k] = em_to_dtype(inputs[k], EM_F32))) return NULL;
    return em_case_grad_fn(in32, n, user);
}

/* em_gradcheck of row r on device dev, the op run in dt (float64, or float32 from float64
 * leaves): 1 checked, 0 nothing to check (empty or not finite), -1 failed (the error set), 2
 * the function or its backward went through the fallback policy (tried once before the finite
 * differences, which would repeat the fallback for every element). */
static int dev_gradcheck(const row *r, em_dtype dt, em_device dev) {
    em_case_grad g = {.struct_size = sizeof g};
    em_tensor *vary[EM_CASE_MAX_IN];
    int n = em_case_grad_setup(r->c, dt, row_seed(r, 100), &g, vary);
    if (n <= 0) return n < 0 ? -1 : 0;
    for (int i = 0; i < r->c->n_in; i++)
        if (g.all[i] && !(g.all[i] = em_to_device(g.all[i], dev))) return -1;
    for (int k = 0; k < n; k++) {
        vary[k] = em_detach(em_to_device(em_to_dtype(vary[k], EM_F64), dev));
        if (!vary[k] || em_requires_grad_(vary[k], true) != EM_OK) return -1;
    }
    em_gradcheck_fn fn = dt == EM_F64 ? em_case_grad_fn : grad_fn_f32;
    uint64_t fb0 = fallbacks_of(dev);
    em_tensor *f = fn(vary, n, &g), *gr[EM_CASE_MAX_IN];
    bool finite = checkable(f, r, &g);
    if (!f) return fallbacks_of(dev) != fb0 ? 2 : -1;
    if (!finite) return 0;
    if (em_grad(1, &f, NULL, n, vary, gr, NULL) != EM_OK) return fallbacks_of(dev) != fb0 ? 2 : -1;
    if (fallbacks_of(dev) != fb0) return 2;
    em_status st = dt == EM_F64 ? em_gradcheck(fn, n, vary, &g, 0, 0, 0)
                                : em_gradcheck(fn, n, vary, &g, GRAD32_EPS, GRAD32_TOL, GRAD32_TOL);
    return st == EM_OK ? 1 : -1;
}

static void grad_row(unit *u, const em_op *op, const row *r, em_device dev) {
    char rs[160], why[600];
    row_str(r, rs, sizeof rs);
    (void)op;
    if (em_device_equal(dev, CPU)) {
        em_case_grad g = {.struct_size = sizeof g};
        em_tensor *vary[EM_CASE_MAX_IN];
        int n = em_case_grad_setup(r->c, EM_F64, row_seed(r, 100), &g, vary);
        if (n <= 0) return;
        em_tensor *f = em_case_grad_fn(vary, n, &g);
        bool finite = checkable(f, r, &g);
        if (!f && r->generic) {
            unit_note(u, "generic inputs refused (%s)", em_last_error());
            em_clear_error();
            return;
        }
        em_clear_error();
        if (!finite) return; /* empty or not finite: nothing finite differences could check */
        if (em_gradcheck(em_case_grad_fn, n, vary, &g, 0, 0, 0) != EM_OK)
            unit_fail(u, "%s: backward against finite differences in float64: %s", rs,
                      em_last_error());
        em_clear_error();
        u->checked++;
        return;
    }
    /* Another device: finite differences of the op computed there, in float64 when everything
     * the check runs (the op, its backward's ops, the reduction's mul and sum) has a float64
     * kernel on the device, else in float32 with float64 leaves converted inside the function
     * and a looser step and tolerance (docs/opcheck.md); what needs the fallback policy in
     * float32 too is reported as fallback. Then the device's backward against the CPU's. */
    em_dtype dt = EM_F64;
    bool fell_back = false;
    for (int pass = 0; pass < 2; pass++) {
        dt = pass ? EM_F32 : EM_F64;
        em_scope_begin();
        uint64_t fb0 = fallbacks_of(dev);
        int st = dev_gradcheck(r, dt, dev);
        fell_back = st == 2 || fallbacks_of(dev) != fb0;
        if (!fell_back && st < 0)
            unit_fail(u, "%s: backward on the device against finite differences in %s there: %s",
                      rs, em_dtype_name(dt), em_last_error());
        em_clear_error();
        em_scope_end();
        if (!fell_back) {
            if (st == 0) return; /* empty or not finite: nothing to check */
            break;
        }
    }
    if (fell_back) {
        u->fallbacks++;
        return;
    }
    double atol = dt == EM_F64 ? 1e-9 : 1e-4, rtol = dt == EM_F64 ? 1e-7 : 1e-3;
    em_tensor *g64[EM_CASE_MAX_IN] = {0}, *gd[EM_CASE_MAX_IN] = {0};
    bool f1 = false, f2 = false;
    int n1 = row_grads(r, EM_F64, CPU, g64, &f1);
    int n2 = row_grads(r, dt, dev, gd, &f2);
    if (n1 <= 0 || !f1) {
        em_clear_error();
        u->checked++;
        return;
    }
    if (n2 != n1) {
        unit_fail(u, "%s: backward on the device: %s", rs, n2 < 0 ? em_last_error() : "");
        em_clear_error();
        return;
    }
    for (int k = 0; k < n1; k++) {
        if (!g64[k] || !gd[k]) {
            if (!g64[k] != !gd[k]) unit_fail(u, "%s: input %d has a gradient on one device only", rs, k);
            continue;
        }
        double *a = values(gd[k]), *b = values(g64[k]);
        int64_t ne = em_tensor_numel(g64[k]);
        for (int64_t e = 0; a && b && e < ne; e++)
            if (!(fabs(a[e] - b[e]) <= atol + rtol * fabs(b[e]))) {
                unit_fail(u, "%s: gradient of input %d, element %s: %s %.9g vs CPU float64 %.9g "
                          "(tolerance %g + %g * |ref|)", rs, k,
                          index_str(g64[k], e, why, sizeof why), em_dtype_name(dt), a[e], b[e],
                          atol, rtol);
                break;
            }
        free(a);
        free(b);
    }
    u->checked++;
    unit_note(u, dt == EM_F64 ? "finite differences in float64 on the device"
                              : "finite differences in float32 on the device (no float64 kernel "
                                "for all it needs): step " GRAD32_EPS_S ", atol " GRAD32_TOL_S
                                " + rtol " GRAD32_TOL_S " * |numerical|");
}

/* A non-differentiable op's outputs never require grad; an op with no derivative at all fails
 * (declare EM_OP_NONDIFF or give it a backward). */
static void grad_declared(unit *u, const em_op *op, const row *rows, int n_rows, em_device dev) {
    const em_op_schema *s = em_op_schema_of(op);
    bool nondiff = s->flags & EM_OP_NONDIFF;
    for (int k = 0; k < n_rows; k++) {
        const em_op_case *c = rows[k].c;
        if (c->expect != EM_OK || !(c->dtypes & (EM_CASE_DT(EM_F64) | EM_CASE_DT(EM_F32))) ||
            (s->flags & EM_OP_LISTS) || s->n_inputs == 0)
            continue;
        em_dtype dt = c->dtypes & EM_CASE_DT(EM_F64) ? EM_F64 : EM_F32;
        em_tensor *in[EM_CASE_MAX_IN] = {0}, *out[16] = {0};
        int n = 0;
        if (build(&rows[k], dt, in) != EM_OK) continue;
        bool any = false;
        for (int i = 0; i < c->n_in; i++)
            if (in[i] && em_dtype_is_floating(em_tensor_dtype(in[i]))) {
                in[i] = em_to_device(em_contiguous(in[i]), dev);
                any |= in[i] && em_requires_grad_(in[i], true) == EM_OK;
            }
        if (!any || call(op, c, in, out, &n, NULL) != EM_OK) {
            em_clear_error();
            continue;
        }
        char rs[160];
        row_str(&rows[k], rs, sizeof rs);
        for (int j = 0; j < n; j++) {
            if (!nondiff || !em_tensor_requires_grad(out[j])) continue;
            unit_fail(u, "%s: declared EM_OP_NONDIFF, but output %d requires grad", rs, j);
        }
        if (!nondiff) {
            /* Neither a backward nor the declaration: backpropagating is an error naming it
             * (documented in ember/dispatch.h); the op still fails the check. */
            em_tensor *y = em_sum(out[0], 0, NULL, false);
            em_status st = y ? em_backward(y) : em_last_status();
            const char *msg = em_last_error();
            unit_fail(u, "%s: has neither a backward nor the EM_OP_NONDIFF declaration "
                      "(backpropagating into it gives %s: %s); declare the op "
                      "non-differentiable, or give its schema a backward", rs,
                      em_status_name(st), st != EM_OK && msg ? msg : "no error");
            em_clear_error();
        }
        u->checked++;
        return;
    }
    if (!nondiff)
        unit_fail(u, "has neither a backward nor the EM_OP_NONDIFF declaration (declare the op "
                  "non-differentiable, or give its schema a backward)");
    else {
        u->checked++; /* the declaration is there; no floating input to try it on */
        unit_note(u, "declared EM_OP_NONDIFF (it has no floating input to check its outputs on)");
    }
}

/* ---- perf --------------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void perf_row(const em_op *op, const row *r, em_dtype dt, em_device dev) {
    const em_op_schema *s = em_op_schema_of(op);
    if (s->flags & EM_OP_LISTS) return;
    em_tensor *in[EM_CASE_MAX_IN] = {0}, *out[16];
    int n;
    if (build(r, dt, in) != EM_OK) return;
    for (int i = 0; i < (r->c->n_in ? r->c->n_in : 1); i++)
        if (in[i]) in[i] = em_to_device(in[i], dev);
    if (call(op, r->c, in, out, &n, NULL) != EM_OK) {
        em_clear_error();
        return;
    }
    long reps = 0;
    double t0 = now_s(), t;
    do {
        em_scope_begin();
        call(op, r->c, in, out, &n, NULL);
        em_scope_end();
        reps++;
        t = now_s() - t0;
    } while (t < 0.02 && reps < 100000);
    em_device_synchronize(dev);
    t = now_s() - t0;
    char dn[48], rs[160];
    em_device_str(dev, dn, sizeof dn);
    if (J) {
        json_array_append_new(J, json_pack("{s:s, s:s, s:s, s:s, s:s, s:f, s:I}", "result", "perf",
                                           "op", em_op_name(op), "device", dn, "dtype",
                                           em_dtype_name(dt), "row", row_str(r, rs, sizeof rs),
                                           "us_per_call", 1e6 * t / (double)reps, "calls",
                                           (json_int_t)reps));
        return;
    }
    printf("perf     %s %s %s: %.2f us per call (%ld calls), %s\n", em_op_name(op), dn,
           em_dtype_name(dt), 1e6 * t / (double)reps, reps, row_str(r, rs, sizeof rs));
}

/* ---- one op ------------------------------------------------------------------------------- */

/* An op without rows still gets inputs it should refuse: bool tensors, and (with two inputs
 * or more) shapes that do not match. It may accept them; refusing must come with a message,
 * and nothing may crash. */
static void bad_inputs(const em_op *op) {
    const em_op_schema *s = em_op_schema_of(op);
    static const char *what[2] = {"bool inputs", "inputs of shapes [3, 4] and [2, 5]"};
    for (int v = 0; v < (s->n_inputs > 1 ? 2 : 1); v++) {
        unit u = {.mode = "eval", .op = em_op_name(op), .dev = "cpu", .dt = v ? "float32" : "bool"};
        em_scope_begin();
        em_tensor *in[8] = {0}, *out[16];
        int n = 0;
        for (int i = 0; i < s->n_inputs && i < 8; i++) {
            int64_t sh[2] = {v && i ? 2 : 3, v && i ? 5 : 4};
            in[i] = em_zeros(2, sh, v ? EM_F32 : EM_BOOL, CPU);
        }
        em_status st = em_op_call_n(op, (const em_tensor *const *)in, s->n_inputs, NULL, out, 16,
                                    &n);
        const char *msg = em_last_error();
        if (st != EM_OK && (!msg || !msg[0]))
            unit_fail(&u, "%s: refused (%s) without a message", what[v], em_status_name(st));
        else
            u.checked++;
        if (st != EM_OK) unit_note(&u, "refuses %s: %s", what[v], msg);
        em_clear_error();
        em_scope_end();
        unit_end(&u);
    }
}

static void check_op(const em_op *op, em_device *devs, int n_devs) {
    const char *name = em_op_name(op);
    const em_op_schema *s = em_op_schema_of(op);
    row rows[1024];
    int n_rows = 0;
    size_t total = em_op_case_count();
    for (size_t i = 0; i < total && n_rows < 1024; i++) {
        const em_op_case *c = em_op_case_get(i);
        if (strcmp(c->op, name) == 0) rows[n_rows++] = (row){.c = c, .index = (int)i};
    }
    bool generic = false;
    if (!n_rows) {
        unsigned dts = kernel_dtypes(op, CPU) &
                       (EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64) | EM_CASE_DT(EM_F16) |
                        EM_CASE_DT(EM_BF16));
        if (!dts && s->composite) dts = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64);
        int ng = make_generic(op, dts);
        for (int k = 0; k < ng; k++) rows[n_rows++] = (row){.c = &generic_rows[k], .index = -1, .generic = true};
        generic = true;
        result(R_NOTE, "cases", name, "-", NULL,
               ng ? "no case rows: tried generic inputs from the schema (every input a floating "
                    "tensor of one shape: [3, 4] contiguous and transposed, [2, 3, 5] sliced, [4] "
                    "expanded; default attributes). Not checked: other shapes and attribute "
                    "values, integer and bool dtypes, invalid inputs. Register rows with "
                    "em_op_cases_register (ember/opcase.h)"
                  : "no case rows, and the schema allows no generic inputs (a list op, or more "
                    "than 6 inputs): not checked");
    }
    if (generic && (O.modes & M_EVAL) && s->n_inputs > 0 && !(s->flags & EM_OP_LISTS))
        bad_inputs(op);
    for (int di = 0; di < n_devs; di++) {
        em_device dev = devs[di];
        char dn[48];
        em_device_str(dev, dn, sizeof dn);
        bool on_cpu = em_device_equal(dev, CPU);
        for (int d = 0; d < EM_DTYPE_COUNT; d++) {
            if (O.dtypes && !(O.dtypes & EM_CASE_DT(d))) continue;
            bool listed = false; /* another device runs the valid rows only */
            for (int k = 0; k < n_rows; k++)
                listed |= (rows[k].c->dtypes & EM_CASE_DT(d)) != 0 &&
                          (on_cpu || rows[k].c->expect == EM_OK);
            if (!listed) continue;
            em_dtype dt = (em_dtype)d;
            const char *dtn = em_dtype_name(dt);
            if (O.modes & M_EVAL) {
                unit u = {.mode = "eval", .op = name, .dev = dn, .dt = dtn};
                bool threads = true;
                for (int k = 0; k < n_rows; k++) {
                    const em_op_case *c = rows[k].c;
                    if (!(c->dtypes & EM_CASE_DT(d))) continue;
                    em_scope_begin();
                    size_t m0 = mem_in_use(CPU), md0 = on_cpu ? 0 : mem_in_use(dev);
                    if (c->expect != EM_OK) {
                        if (on_cpu) check_invalid(&u, op, &rows[k], dt);
                    } else {
                        eval_row(&u, op, &rows[k], dt, dev, threads);
                        threads = false;
                    }
                    em_scope_end();
                    em_clear_error();
                    size_t m1 = mem_in_use(CPU), md1 = on_cpu ? 0 : mem_in_use(dev);
                    if (m1 != m0 || md1 != md0) {
                        char rs[160];
                        if (on_cpu)
                            unit_fail(&u, "%s: the allocator holds %lld more bytes on the CPU "
                                      "after the case than before (a leak)",
                                      row_str(&rows[k], rs, sizeof rs),
                                      (long long)m1 - (long long)m0);
                        else
                            unit_fail(&u, "%s: the allocator holds %lld more bytes on the CPU "
                                      "and %lld on %s after the case than before (a leak)",
                                      row_str(&rows[k], rs, sizeof rs),
                                      (long long)m1 - (long long)m0,
                                      (long long)md1 - (long long)md0, dn);
                    }
                }
                if (generic && !u.checked && !u.fails) unit_note(&u, "no generic input was accepted");
                unit_end(&u);
            }
            if ((O.modes & M_PERF)) {
                for (int k = 0; k < n_rows; k++)
                    if (rows[k].c->expect == EM_OK && (rows[k].c->dtypes & EM_CASE_DT(d))) {
                        em_scope_begin();
                        perf_row(op, &rows[k], dt, dev);
                        em_scope_end();
                        em_clear_error();
                        break;
                    }
            }
        }
        if (O.modes & M_GRAD) {
            bool diff = !(s->flags & EM_OP_NONDIFF) && (s->backward || s->composite);
            unit u = {.mode = "grad", .op = name, .dev = dn, .dt = on_cpu ? "float64" : "-"};
            em_scope_begin();
            if (!diff) {
                if (on_cpu) grad_declared(&u, op, rows, n_rows, dev);
            } else {
                for (int k = 0; k < n_rows; k++) {
                    if (!gradable(rows[k].c)) continue;
                    em_scope_begin();
                    grad_row(&u, op, &rows[k], dev);
                    em_scope_end();
                    em_clear_error();
                }
                if (!u.checked && !u.fails && !u.fallbacks)
                    unit_note(&u, "differentiable, but no valid float64 row without an expanded "
                              "input gives a finite, non-empty result to check (rows, or for "
                              "generic inputs a float64 kernel, let its backward be checked)");
            }
            em_scope_end();
            if (on_cpu || diff) unit_end(&u);
        }
    }
}

/* ---- support ------------------------------------------------------------------------------ */

static void support(const em_op *const *ops, int n_ops, em_device *devs, int n_devs) {
    long cells[5] = {0}, diff = 0; /* kernel, composite, fallback, none, converted */
    int dts_seen = 0;
    unsigned any_dt = 0;
    for (int i = 0; i < n_ops; i++) {
        const em_op *op = ops[i];
        const em_op_schema *s = em_op_schema_of(op);
        bool d = !(s->flags & EM_OP_NONDIFF) && (s->backward || s->composite);
        diff += d;
        unsigned listed = em_case_dtypes_of(em_op_name(op));
        any_dt |= listed;
        json_t *jo = J ? json_object() : NULL;
        char line[2048];
        size_t len = (size_t)snprintf(line, sizeof line, "%-28s %-16s", em_op_name(op),
                                      d ? "differentiable" : (s->flags & EM_OP_NONDIFF)
                                                                 ? "non-differentiable"
                                                                 : "no derivative");
        for (int di = 0; di < n_devs; di++) {
            char dn[48];
            em_device_str(devs[di], dn, sizeof dn);
            char cell[400] = "";
            size_t cl = 0;
            json_t *jd = J ? json_object() : NULL;
            for (int dt = 0; dt < EM_DTYPE_COUNT; dt++) {
                if (!(listed & EM_CASE_DT(dt)) && !em_op_kernel_count(op, devs[di], (em_dtype)dt))
                    continue;
                any_dt |= EM_CASE_DT(dt);
                const char *what;
                if (em_op_kernel_count(op, devs[di], (em_dtype)dt)) what = "kernel", cells[0]++;
                else if (s->composite) what = "composite", cells[1]++;
                else if (!em_device_equal(devs[di], CPU) && em_op_kernel_count(op, CPU, (em_dtype)dt))
                    what = "fallback", cells[2]++;
                else if (((s->flags & (EM_OP_FLOAT_RESULT | EM_OP_PROMOTE)) || s->prepare) &&
                         (em_device_equal(devs[di], CPU) || kernel_dtypes(op, devs[di])))
                    what = "converted", cells[4]++; /* the dtype rule picks another kernel */
                else if (!em_device_equal(devs[di], CPU) && kernel_dtypes(op, CPU))
                    what = "fallback", cells[2]++;
                else what = "none", cells[3]++;
                cl += (size_t)snprintf(cell + cl, sizeof cell - cl, "%s%s:%c", cl ? " " : "",
                                       em_dtype_name((em_dtype)dt), what[0] == 'k' ? 'K'
                                       : what[0] == 'c' ? (what[1] == 'o' && what[2] == 'm' ? 'C' : 'P')
                                       : what[0] == 'f' ? 'F' : '-');
                if (jd) json_object_set_new(jd, em_dtype_name((em_dtype)dt), json_string(what));
                /* The rows list this dtype: the CPU must run it (a kernel or a composite). */
                if (em_device_equal(devs[di], CPU) && (listed & EM_CASE_DT(dt)) && what[0] == 'n')
                    result(R_FAIL, "support", em_op_name(op), dn, em_dtype_name((em_dtype)dt),
                           "the case rows list it, but the CPU has no kernel and the op no "
                           "composite");
            }
            if (jo) json_object_set_new(jo, dn, jd);
            len += (size_t)snprintf(line + len, sizeof line - len, "  %s[%s]", dn, cell);
        }
        if (J) {
            json_object_set_new(jo, "differentiable", json_boolean(d));
            json_array_append_new(J, json_pack("{s:s, s:s, s:o}", "result", "support", "op",
                                               em_op_name(op), "matrix", jo));
        } else if (O.verbose || (O.modes & M_SUPPORT)) {
            printf("support  %s\n", line);
        }
        /* The rows' differentiable flag is the schema's. */
        bool agree = true;
        size_t total = em_op_case_count();
        for (size_t r = 0; r < total; r++) {
            const em_op_case *c = em_op_case_get(r);
            if (strcmp(c->op, em_op_name(op)) == 0 && c->differentiable != d) agree = false;
        }
        if (agree) result(R_PASS, "support", em_op_name(op), "-", NULL, NULL);
        else
            result(R_FAIL, "support", em_op_name(op), "-", NULL, "a case row says the op is "
                   "%sdifferentiable; the schema %s", d ? "not " : "",
                   d ? "has a derivative" : "has none");
    }
    for (int dt = 0; dt < EM_DTYPE_COUNT; dt++) dts_seen += (any_dt >> dt) & 1;
    char totals[400];
    snprintf(totals, sizeof totals, "%d ops x %d device(s) x %d dtypes: %ld (op, device, dtype) "
             "cells with a kernel, %ld through a composite, %ld converted by the op's dtype rule to "
             "another dtype's kernel, %ld fallback, %ld none; %ld ops differentiable", n_ops,
             n_devs, dts_seen, cells[0], cells[1], cells[4], cells[2], cells[3], diff);
    if (J)
        json_array_append_new(J, json_pack("{s:s, s:s}", "result", "support-totals", "detail",
                                           totals));
    else
        printf("support  (K kernel, C composite, P converted by the op's dtype rule, F fallback, "
               "- none)\nsupport  totals: %s\n", totals);
}

/* ---- command line ------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: ember-opcheck [--plugin PATH.so]... [--op NAME[,NAME]] [--device D]\n"
            "                     [--dtype DT[,DT]] [--mode eval,grad,support,perf] [--seed N]\n"
            "                     [--json] [--verbose]\n"
            "\n"
            "Check ops against independent references: every kernel of an op's stack against the\n"
            "one below it on poisoned outputs, float32/16/bfloat16 against float64, layout\n"
            "invariance, other devices against the CPU, backward against float64 finite\n"
            "differences, the support matrix. The cases are the op-case rows in the registry\n"
            "(ember/opcase.h); ops without rows get generic inputs from their schema.\n"
            "\n"
            "  --plugin PATH   load a plugin and check the ops it declares and the kernels it\n"
            "                  registers (repeatable)\n"
            "  --op LIST       only these ops (default: every declared op, or the plugin's)\n"
            "  --device D      cpu (default), a device type (testdev), type:N, or all\n"
            "  --dtype LIST    only these dtypes (float32, f16, bf16, int64, bool, ...)\n"
            "  --mode LIST     eval, grad, support, perf (default eval,grad,support)\n"
            "  --seed N        the inputs' seed (default 1); every failure line prints it\n"
            "  --json          one JSON document on stdout (the summary line goes to stderr)\n"
            "  --verbose       also list what passed\n"
            "\n"
            "Exit status: 0 when every check passed, 1 when one failed, 2 for a bad command line.\n"
            "Fallback (run on the CPU through the fallback policy) and declined entries are\n"
            "listed, never counted as passed. The last line is \"N passed, M failed\".\n");
}

static int parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE                                                                              \
    if (!v) {                                                                                   \
        fprintf(stderr, "ember-opcheck: %s needs a value\n", a);                                \
        return 2;                                                                               \
    }                                                                                           \
    i++
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--json")) {
            O.json = true;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            O.verbose = true;
        } else if (!strcmp(a, "--plugin")) {
            NEED_VALUE;
            if (O.n_plugins == 16) {
                fprintf(stderr, "ember-opcheck: at most 16 --plugin options\n");
                return 2;
            }
            O.plugins[O.n_plugins++] = v;
        } else if (!strcmp(a, "--op")) {
            NEED_VALUE;
            O.ops = v;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE;
            O.device = v;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE;
            char *end;
            O.seed = strtoull(v, &end, 10);
            if (!*v || *end) {
                fprintf(stderr, "ember-opcheck: --seed takes a non-negative integer, not '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--mode")) {
            NEED_VALUE;
            O.modes = 0;
            static const char *names[] = {"eval", "grad", "support", "perf"};
            for (const char *p = v; *p;) {
                const char *e = strchr(p, ',');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                int k = 0;
                while (k < 4 && !(strlen(names[k]) == len && !strncmp(p, names[k], len))) k++;
                if (k == 4) {
                    fprintf(stderr, "ember-opcheck: unknown mode '%.*s' (eval, grad, support, "
                            "perf)\n", (int)len, p);
                    return 2;
                }
                O.modes |= 1u << k;
                p = e ? e + 1 : p + len;
            }
            if (!O.modes) {
                fprintf(stderr, "ember-opcheck: --mode needs at least one mode\n");
                return 2;
            }
        } else if (!strcmp(a, "--dtype")) {
            NEED_VALUE;
            O.dtypes = 0;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                em_dtype dt;
                if (em_dtype_parse(t, &dt) != EM_OK) {
                    fprintf(stderr, "ember-opcheck: unknown dtype '%s'\n", t);
                    return 2;
                }
                O.dtypes |= EM_CASE_DT(dt);
            }
        } else {
            fprintf(stderr, "ember-opcheck: unknown option '%s' (see --help)\n", a);
            return 2;
        }
#undef NEED_VALUE
    }
    return 0;
}

/* Whether some op of the list is in ops[0 .. n). */
static bool have_op(const em_op *const *ops, int n, const em_op *op) {
    for (int i = 0; i < n; i++)
        if (ops[i] == op) return true;
    return false;
}

int main(int argc, char **argv) {
    int rc = parse_args(argc, argv);
    if (rc) return rc;
    for (int i = 0; i < O.n_plugins; i++) em_plugin_load(O.plugins[i]);
    if (em_init() != EM_OK) {
        fprintf(stderr, "ember-opcheck: em_init failed: %s\n", em_last_error());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    CPU = em_cpu();
    if (O.json) J = json_array();
    /* The plugins under test. */
    const em_registry *theirs[16] = {0};
    int n_theirs = 0;
    bool bad = false;
    for (int p = 0; p < O.n_plugins; p++) {
        bool found = false;
        for (size_t i = 0; i < em_plugin_count(); i++) {
            em_plugin_info info;
            if (em_plugin_get(i, &info) != EM_OK || !info.path) continue;
            const char *base = strrchr(O.plugins[p], '/');
            const char *ibase = strrchr(info.path, '/');
            if (strcmp(info.path, O.plugins[p]) != 0 &&
                strcmp(ibase ? ibase + 1 : info.path, base ? base + 1 : O.plugins[p]) != 0)
                continue;
            if (info.status != EM_PLUGIN_LOADED) continue;
            found = true;
            theirs[n_theirs++] = info.registry;
            break;
        }
        if (!found) {
            const char *why = "not found among the loaded plugins";
            for (size_t i = 0; i < em_plugin_count(); i++) {
                em_plugin_info info;
                if (em_plugin_get(i, &info) == EM_OK && info.path && info.reason &&
                    strstr(info.path, O.plugins[p]))
                    why = info.reason;
            }
            result(R_FAIL, "load", O.plugins[p], "-", NULL, "%s", why);
            bad = true;
        }
    }
    /* The ops: named ones; else the plugins' (declared, or with a kernel of theirs); else all. */
    static const em_op *ops[4096];
    int n_ops = 0;
    const em_registry *regs[64];
    int n_regs = 0;
    regs[n_regs++] = em_registry_core();
    for (size_t i = 0; i < em_plugin_count() && n_regs < 63; i++) {
        em_plugin_info info;
        if (em_plugin_get(i, &info) == EM_OK && info.status == EM_PLUGIN_LOADED && info.registry)
            regs[n_regs++] = info.registry;
    }
    regs[n_regs++] = em_registry_program();
    if (O.ops) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", O.ops);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            const em_op *op = em_op_find(t);
            if (!op) {
                fprintf(stderr, "ember-opcheck: --op: %s\n", em_last_error());
                return 2;
            }
            if (!have_op(ops, n_ops, op) && n_ops < 4096) ops[n_ops++] = op;
        }
    } else if (O.n_plugins && !n_theirs) {
        /* No plugin under test loaded (reported above): nothing of theirs to check. */
    } else if (n_theirs) {
        for (int p = 0; p < n_theirs; p++) {
            for (size_t i = 0; i < em_registry_op_count(theirs[p]) && n_ops < 4096; i++) {
                const em_op *op = em_op_find(em_registry_op_name(theirs[p], i));
                if (op && !have_op(ops, n_ops, op)) ops[n_ops++] = op;
            }
            for (size_t i = 0; i < em_registry_kernel_count(theirs[p]) && n_ops < 4096; i++) {
                em_kernel_info ki;
                if (em_registry_kernel_get(theirs[p], i, &ki) != EM_OK) continue;
                const em_op *op = em_op_find(ki.op);
                if (op && !have_op(ops, n_ops, op)) ops[n_ops++] = op;
            }
        }
    } else {
        for (int r = 0; r < n_regs; r++)
            for (size_t i = 0; i < em_registry_op_count(regs[r]) && n_ops < 4096; i++) {
                const em_op *op = em_op_find(em_registry_op_name(regs[r], i));
                if (op && !have_op(ops, n_ops, op)) ops[n_ops++] = op;
            }
    }
    /* The devices. */
    em_device devs[32];
    int n_devs = 0;
    const char *want = O.device ? O.device : "cpu";
    if (!strcmp(want, "all")) {
        for (int r = 0; r < n_regs; r++)
            for (size_t i = 0; i < em_registry_device_type_count(regs[r]) && n_devs < 32; i++) {
                em_device d;
                const char *t = em_registry_device_type_name(regs[r], i);
                if (em_device_count(t) > 0 && em_device_parse(t, &d) == EM_OK) devs[n_devs++] = d;
            }
    } else {
        em_device d;
        if (em_device_parse(want, &d) != EM_OK) {
            fprintf(stderr, "ember-opcheck: --device: %s\n", em_last_error());
            return 2;
        }
        /* Another device is checked against the CPU, so both are run. */
        devs[n_devs++] = d;
    }
    bool other_device = false;
    for (int i = 0; i < n_devs; i++) other_device |= !em_device_equal(devs[i], CPU);
    em_fallback_policy saved = em_fallback_get();
    if (other_device) em_fallback_set(EM_FALLBACK_ALLOW); /* reported as "fallback", never passed */
    if (O.modes & M_SUPPORT) support(ops, n_ops, devs, n_devs);
    if (O.modes & (M_EVAL | M_GRAD | M_PERF)) {
        unsigned modes = O.modes;
        for (int i = 0; i < n_ops; i++) {
            O.modes = modes & ~(unsigned)M_SUPPORT;
            check_op(ops[i], devs, n_devs);
        }
        O.modes = modes;
    }
    em_fallback_set(saved);
    (void)bad;
    if (J) {
        json_t *doc = json_pack("{s:o, s:I, s:I, s:I, s:I, s:I}", "results", J, "passed",
                                (json_int_t)n_pass, "failed", (json_int_t)n_fail, "fallback",
                                (json_int_t)n_fallback, "declined", (json_int_t)n_declined,
                                "notes", (json_int_t)n_notes);
        json_dumpf(doc, stdout, JSON_INDENT(1));
        printf("\n");
        json_decref(doc);
    } else if (n_fallback || n_declined) {
        printf("%ld fallback, %ld declined (neither counted as passed)\n", n_fallback, n_declined);
    }
    em_shutdown();
    fprintf(J ? stderr : stdout, "%ld passed, %ld failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

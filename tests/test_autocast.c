/*
 * test_autocast.c — autocast regions (ember/autocast.h):
 *   - the lists written in the header (read from it here) are the classes the standard ops'
 *     schemas declare, and every listed name is a declared op;
 *   - every valid row of the op-case table in float32 (and, for the float32 and promote
 *     classes, in bfloat16 and mixed) called under a bf16 region gives what the documented
 *     class says: the same outputs, bit for bit, as the op called outside any region on the
 *     inputs cast by this test's own reading of the list (lower: every float32/float16/bfloat16
 *     input to bf16; float32: to float32; promote: to the widest; unaffected: as given), by
 *     the typed function and by name; a lower-class op's floating outputs are bf16 and a
 *     float32-class op's are float32;
 *   - nesting, the disabled region, errors, float64 and other devices untouched, the
 *     parameter cast cache (one cast per region, again after a version change), backward
 *     outside and inside a region, float32 gradients of float32 parameters;
 *   - a plugin's op without the field, and one declaring a class, or an invalid one.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"
#include "tests/op_cases.h"
#include "tests/fixtures/autocast/autocast_fixture.h"

TestSuite(autocast, .init = em_test_setup, .fini = em_test_teardown);

/* ---- the header's lists ------------------------------------------------------------------ */

#define MAX_LISTED 128
typedef struct listed {
    char name[64];
    int cls;
    bool plus; /* [+]: not in PyTorch's CPU lists */
} listed;
static listed lists[MAX_LISTED];
static int n_listed;

static void read_lists(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/core/include/ember/autocast.h", EM_TEST_SRCDIR);
    FILE *f = fopen(path, "r");
    cr_assert(f, "open %s", path);
    char line[512];
    bool in = false;
    int cls = -1;
    n_listed = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "<autocast-lists>")) { in = true; continue; }
        if (strstr(line, "</autocast-lists>")) break;
        if (!in) continue;
        for (char *tok = strtok(line, " \t\n*"); tok; tok = strtok(NULL, " \t\n*")) {
            if (strcmp(tok, "lower:") == 0) { cls = EM_AUTOCAST_LOWER; continue; }
            if (strcmp(tok, "float32:") == 0) { cls = EM_AUTOCAST_FLOAT32; continue; }
            if (strcmp(tok, "promote:") == 0) { cls = EM_AUTOCAST_PROMOTE; continue; }
            cr_assert(cls >= 0, "%s: '%s' before a class name", path, tok);
            char *mark = strstr(tok, "[+]");
            if (mark) *mark = '\0';
            cr_assert_lt(n_listed, MAX_LISTED);
            lists[n_listed].plus = mark != NULL;
            snprintf(lists[n_listed].name, sizeof lists[n_listed].name, "%s", tok);
            lists[n_listed++].cls = cls;
        }
    }
    fclose(f);
    cr_assert(in, "%s has no <autocast-lists> block", path);
    cr_assert_gt(n_listed, 20, "only %d ops listed", n_listed);
}

static int documented_class(const char *op) {
    for (int i = 0; i < n_listed; i++)
        if (strcmp(lists[i].name, op) == 0) return lists[i].cls;
    return EM_AUTOCAST_NONE;
}

Test(autocast, header_lists_are_the_schemas_classes) {
    read_lists();
    for (int i = 0; i < n_listed; i++) {
        for (int j = 0; j < i; j++)
            cr_expect_neq(strcmp(lists[i].name, lists[j].name), 0, "%s is listed twice",
                          lists[i].name);
        cr_expect(em_op_find(lists[i].name), "the header lists '%s', which is not declared",
                  lists[i].name);
        em_clear_error();
    }
    const em_registry *core = em_registry_core();
    size_t n = em_registry_op_count(core);
    int classed = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = em_registry_op_name(core, i);
        const em_op_schema *s = em_op_schema_of(em_op_find(name));
        cr_assert(s, "%s", name);
        cr_expect_eq(s->autocast, documented_class(name), "%s: the schema declares class %d, "
                     "ember/autocast.h lists %d", name, s->autocast, documented_class(name));
        classed += s->autocast != EM_AUTOCAST_NONE;
    }
    cr_expect_eq(classed, n_listed);
    em_test_assert_clean_shutdown();
}

/* The ops the header takes from PyTorch's CPU lists behave there as their class says
 * (PyTorch AUTOCAST_TORCH_VERSION, probed by tests/fixtures/gen_autocast.py); the [+] float32
 * entries are Ember's own (PyTorch's CPU autocast leaves them alone). */
Test(autocast, lists_follow_pytorch_cpu_autocast) {
    read_lists();
    int compared = 0;
    for (size_t i = 0; i < sizeof torch_classes / sizeof torch_classes[0]; i++) {
        const torch_class *t = &torch_classes[i];
        int ours = documented_class(t->op);
        bool plus = false;
        for (int j = 0; j < n_listed; j++)
            if (strcmp(lists[j].name, t->op) == 0) plus = lists[j].plus;
        if (plus) {
            if (ours == EM_AUTOCAST_FLOAT32)
                cr_expect_neq(t->cls, EM_AUTOCAST_FLOAT32, "%s is marked [+] (not PyTorch's) but "
                              "PyTorch %s keeps it in float32: drop the mark", t->op,
                              AUTOCAST_TORCH_VERSION);
            continue;
        }
        cr_expect_eq(ours, t->cls, "%s: Ember's class %d, PyTorch %s's CPU autocast %d", t->op,
                     ours, AUTOCAST_TORCH_VERSION, t->cls);
        compared++;
    }
    cr_expect_gt(compared, 15);
}

/* ---- the MLP and the CNN against PyTorch under bf16 autocast ------------------------------
 * Tolerances: bf16 has an 8-bit significand (relative rounding 2^-9); the products are summed
 * in f32 by both libraries, in different orders, and a sum rounded to bf16 can land one bf16
 * step (2^-8 relative) apart, which the layers after it carry: logits within 2^-6 relative +
 * 2e-2, the float32 loss within 1e-2 relative, each gradient within 3e-2 of its largest
 * magnitude. */

static em_tensor *from(const double *v, int ndim, const int64_t *shape, bool grad) {
    em_tensor *t = em_test_tensor(EM_F32, ndim, shape, v);
    if (grad) cr_assert_eq(em_requires_grad_(t, true), EM_OK);
    return t;
}

static void expect_close(const em_tensor *got, const double *want, double rtol, double atol,
                         const char *what) {
    em_tensor *g = em_contiguous(em_to_dtype(got, EM_F64));
    int64_t n = em_tensor_numel(g);
    const double *v = em_tensor_data(g);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(v[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
            if (bad++ < 3)
                cr_expect(false, "%s[%lld]: %.6g, PyTorch %.6g", what, (long long)i, v[i], want[i]);
        }
    cr_expect_eq(bad, 0, "%s: %d of %lld values outside tolerance", what, bad, (long long)n);
}

static double max_abs(const double *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(v[i]));
    return m;
}

static void check_model(bool conv) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *p[4], *x, *y;
    const double *g[4];
    int64_t n[4];
    if (!conv) {
        p[0] = from(mlp_p0, 2, (int64_t[]){16, 20}, true);
        p[1] = from(mlp_p1, 1, (int64_t[]){16}, true);
        p[2] = from(mlp_p2, 2, (int64_t[]){5, 16}, true);
        p[3] = from(mlp_p3, 1, (int64_t[]){5}, true);
        x = from(mlp_x, 2, (int64_t[]){8, 20}, false);
        y = em_to_dtype(from(mlp_y, 1, (int64_t[]){8}, false), EM_I64);
        g[0] = mlp_g0, g[1] = mlp_g1, g[2] = mlp_g2, g[3] = mlp_g3;
    } else {
        p[0] = from(cnn_p0, 4, (int64_t[]){4, 1, 3, 3}, true);
        p[1] = from(cnn_p1, 1, (int64_t[]){4}, true);
        p[2] = from(cnn_p2, 2, (int64_t[]){5, 64}, true);
        p[3] = from(cnn_p3, 1, (int64_t[]){5}, true);
        x = from(cnn_x, 4, (int64_t[]){4, 1, 8, 8}, false);
        y = em_to_dtype(from(cnn_y, 1, (int64_t[]){4}, false), EM_I64);
        g[0] = cnn_g0, g[1] = cnn_g1, g[2] = cnn_g2, g[3] = cnn_g3;
    }
    for (int i = 0; i < 4; i++) n[i] = em_tensor_numel(p[i]);
    cr_assert_eq(em_autocast_begin("cpu", EM_BF16), EM_OK);
    em_tensor *logits;
    if (!conv) {
        logits = em_linear(em_relu(em_linear(x, p[0], p[1])), p[2], p[3]);
    } else {
        em_tensor *h = em_relu(em_conv2d(x, p[0], p[1], (int64_t[]){1, 1}, (int64_t[]){1, 1},
                                         (int64_t[]){1, 1}, 1));
        em_tensor *pooled = NULL, *idx = NULL;
        cr_assert_eq(em_max_pool2d(h, (int64_t[]){2, 2}, (int64_t[]){2, 2}, (int64_t[]){0, 0},
                                   (int64_t[]){1, 1}, false, &pooled, &idx),
                     EM_OK, "%s", em_last_error());
        logits = em_linear(em_flatten(pooled, 1, -1), p[2], p[3]);
    }
    cr_assert(logits, "%s", em_last_error());
    em_tensor *loss = em_cross_entropy(logits, y, NULL, EM_REDUCTION_MEAN, -100, 0.0);
    cr_assert(loss, "%s", em_last_error());
    cr_assert_eq(em_autocast_end(), EM_OK);
    cr_expect_eq(em_tensor_dtype(logits), EM_BF16);
    cr_expect_eq(em_tensor_dtype(loss), EM_F32);
    cr_assert_eq(em_backward(loss), EM_OK, "%s", em_last_error());
    const char *m = conv ? "cnn" : "mlp";
    char what[64];
    snprintf(what, sizeof what, "%s logits", m);
    expect_close(logits, conv ? cnn_logits : mlp_logits, 0x1p-6, 2e-2, what);
    snprintf(what, sizeof what, "%s loss", m);
    expect_close(loss, conv ? &cnn_loss : &mlp_loss, 1e-2, 0, what);
    for (int i = 0; i < 4; i++) {
        em_tensor *gr = em_tensor_grad(p[i]);
        cr_assert(gr);
        cr_expect_eq(em_tensor_dtype(gr), EM_F32, "%s parameter %d's gradient is %s", m, i,
                     em_dtype_name(em_tensor_dtype(gr)));
        snprintf(what, sizeof what, "%s grad of parameter %d", m, i);
        expect_close(gr, g[i], 0, 3e-2 * max_abs(g[i], n[i]), what);
    }
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

Test(autocast, mlp_matches_pytorch) { check_model(false); }
Test(autocast, cnn_matches_pytorch) { check_model(true); }

/* ---- every row under a region ------------------------------------------------------------- */

static bool castable(em_dtype dt) { return dt == EM_F32 || dt == EM_F16 || dt == EM_BF16; }

/* The inputs as the documented class says the region casts them (the test's own reading). */
static void cast_as_documented(int cls, em_tensor **in, int n, em_tensor **out) {
    em_dtype wide = EM_BF16;
    bool any = false;
    for (int i = 0; i < n; i++)
        if (in[i] && castable(em_tensor_dtype(in[i]))) {
            em_dtype d = em_tensor_dtype(in[i]);
            /* the widest of f32, f16, bf16: f32 if any; f16 and bf16 together: f32 */
            if (!any) wide = d;
            else if (wide != d) wide = EM_F32;
            any = true;
        }
    for (int i = 0; i < n; i++) {
        out[i] = in[i];
        if (!in[i] || !castable(em_tensor_dtype(in[i])) || cls == EM_AUTOCAST_NONE) continue;
        em_dtype to = cls == EM_AUTOCAST_LOWER ? EM_BF16 : cls == EM_AUTOCAST_FLOAT32 ? EM_F32
                                                                                     : wide;
        if (em_tensor_dtype(in[i]) != to) cr_assert(out[i] = em_to_dtype(in[i], to));
    }
}

static bool same_bits(const em_tensor *a, const em_tensor *b) {
    if (em_tensor_dtype(a) != em_tensor_dtype(b) || em_tensor_ndim(a) != em_tensor_ndim(b))
        return false;
    for (int d = 0; d < em_tensor_ndim(a); d++)
        if (em_tensor_shape(a)[d] != em_tensor_shape(b)[d]) return false;
    em_tensor *ca = em_contiguous(a), *cb = em_contiguous(b);
    size_t n = em_tensor_nbytes(ca);
    if (n == 0) return true;
    unsigned char *x = malloc(n), *y = malloc(n);
    cr_assert(em_tensor_to_host(ca, x, n) == EM_OK && em_tensor_to_host(cb, y, n) == EM_OK);
    bool eq = memcmp(x, y, n) == 0;
    free(x);
    free(y);
    return eq;
}

typedef struct call_result {
    em_status st;
    int n;
    em_tensor *out[16];
    char err[256];
} call_result;

static call_result call(const em_op_case *c, const em_op *op, bool typed, em_tensor **in) {
    call_result r = {0};
    if (typed) r.st = c->typed((const em_tensor *const *)in, c->attrs, r.out, &r.n);
    else r.st = em_op_call_n(op, (const em_tensor *const *)in, c->n_in, c->attrs, r.out, 16, &r.n);
    if (r.st != EM_OK) snprintf(r.err, sizeof r.err, "%s", em_last_error());
    em_clear_error();
    return r;
}

/* Row c with its inputs built in dt (mixed: input 1 in bf16, the rest in f32). */
static int check_row(const em_op_case *c, int r, em_dtype dt, bool mixed) {
    const em_op *op = em_op_find(c->op);
    cr_assert(op);
    int cls = documented_class(c->op);
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *in[EM_CASE_MAX_IN] = {0}, *ref_in[EM_CASE_MAX_IN] = {0};
    for (int i = 0; i < c->n_in; i++) {
        in[i] = em_case_make(&c->in[i], dt, (uint64_t)r * 131 + (uint64_t)i);
        cr_assert(in[i] || c->in[i].absent, "%s: %s", c->op, em_last_error());
        if (mixed && i == 1 && in[i] && em_tensor_dtype(in[i]) == EM_F32)
            cr_assert(in[i] = em_to_dtype(in[i], EM_BF16));
    }
    cast_as_documented(cls, in, c->n_in, ref_in);
    int checked = 0;
    for (int typed = 0; typed < 2; typed++) {
        if (typed && !c->typed) continue;
        char what[256];
        snprintf(what, sizeof what, "%s (%s) in %s%s, %s", c->op, c->variant,
                 em_dtype_name(dt), mixed ? " with input 1 bf16" : "",
                 typed ? "typed" : "by name");
        call_result want = call(c, op, typed, ref_in);
        cr_assert_eq(em_autocast_begin("cpu", EM_BF16), EM_OK, "%s", em_last_error());
        call_result got = call(c, op, typed, in);
        cr_assert_eq(em_autocast_end(), EM_OK);
        cr_expect_eq(got.st, want.st, "%s: under autocast %s (%s); the documented casts give "
                     "%s (%s)", what, em_status_str(got.st), got.err, em_status_str(want.st),
                     want.err);
        if (got.st != EM_OK || want.st != EM_OK) continue;
        cr_expect_eq(got.n, want.n, "%s", what);
        for (int k = 0; k < got.n && k < want.n; k++) {
            em_dtype gd = em_tensor_dtype(got.out[k]);
            cr_expect_eq(gd, em_tensor_dtype(want.out[k]), "%s: output %d is %s, the documented "
                         "class (%d) gives %s", what, k, em_dtype_name(gd), cls,
                         em_dtype_name(em_tensor_dtype(want.out[k])));
            if (k == 0 && cls == EM_AUTOCAST_LOWER && em_dtype_is_floating(gd) && dt != EM_F64)
                cr_expect_eq(gd, EM_BF16, "%s: a lower-precision op gave %s", what,
                             em_dtype_name(gd));
            if (k == 0 && cls == EM_AUTOCAST_FLOAT32 && em_dtype_is_floating(gd) && dt != EM_F64)
                cr_expect_eq(gd, EM_F32, "%s: a float32 op gave %s", what, em_dtype_name(gd));
            if (!(c->flags & EM_CASE_DRAWS))
                cr_expect(same_bits(got.out[k], want.out[k]), "%s: output %d differs from the "
                          "op on the documented casts", what, k);
        }
        checked++;
    }
    cr_assert_eq(em_scope_end(), EM_OK);
    return checked;
}

Test(autocast, every_row_follows_the_documented_lists) {
    read_lists();
    int checked = 0, by_class[4] = {0};
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
        const em_op_case *c = em_op_case_get(r);
        const em_op_schema *s = em_op_schema_of(em_op_find(c->op));
        if (c->expect != EM_OK || (s->flags & EM_OP_LISTS) || s->n_inputs == 0) continue;
        int cls = documented_class(c->op);
        int k = 0;
        if (c->dtypes & EM_CASE_DT(EM_F32)) k += check_row(c, r, EM_F32, false);
        if (c->dtypes & EM_CASE_DT(EM_F32) && c->n_in >= 2 && cls != EM_AUTOCAST_NONE)
            k += check_row(c, r, EM_F32, true);
        if (c->dtypes & EM_CASE_DT(EM_BF16)) k += check_row(c, r, EM_BF16, false);
        if (c->dtypes & EM_CASE_DT(EM_F64)) k += check_row(c, r, EM_F64, false);
        checked += k;
        by_class[cls] += k;
    }
    cr_expect_gt(checked, 300, "checked %d calls", checked);
    for (int k = 0; k < 4; k++) cr_expect_gt(by_class[k], 0, "no call of class %d checked", k);
    em_test_assert_clean_shutdown();
}

/* ---- regions ------------------------------------------------------------------------------ */

static em_tensor *randn(int ndim, const int64_t *shape, em_dtype dt, uint64_t seed) {
    em_generator *g = em_generator_new(seed);
    em_tensor *t = em_empty(ndim, shape, EM_F32, em_cpu());
    cr_assert(t && em_normal_(t, 0, 1, g) == EM_OK, "%s", em_last_error());
    em_generator_free(g);
    return dt == EM_F32 ? t : em_to_dtype(t, dt);
}

Test(autocast, regions_nest_and_disable) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *a = randn(2, (int64_t[]){3, 4}, EM_F32, 1), *b = randn(2, (int64_t[]){4, 2}, EM_F32, 2);
    em_dtype dt = EM_F32;
    cr_expect(!em_autocast_enabled("cpu", &dt));
    cr_expect_eq(em_tensor_dtype(em_matmul(a, b)), EM_F32);
    cr_assert_eq(em_autocast_begin("cpu", EM_BF16), EM_OK);
    cr_expect(em_autocast_enabled("cpu", &dt) && dt == EM_BF16);
    cr_expect_eq(em_tensor_dtype(em_matmul(a, b)), EM_BF16);
    cr_expect_eq(em_tensor_dtype(em_relu(a)), EM_F32, "relu is unaffected");
    cr_assert_eq(em_autocast_begin_disabled(), EM_OK);
    cr_expect(!em_autocast_enabled("cpu", NULL));
    cr_expect_eq(em_tensor_dtype(em_matmul(a, b)), EM_F32);
    cr_assert_eq(em_autocast_begin("cpu", EM_F16), EM_OK); /* enabled again inside */
    cr_expect_eq(em_tensor_dtype(em_matmul(a, b)), EM_F16);
    cr_assert_eq(em_autocast_end(), EM_OK);
    cr_expect_eq(em_tensor_dtype(em_matmul(a, b)), EM_F32);
    cr_assert_eq(em_autocast_end(), EM_OK);
    cr_expect_eq(em_tensor_dtype(em_matmul(a, b)), EM_BF16);
    /* float32 ops take bf16 to float32; float64 is never cast */
    em_tensor *h = em_to_dtype(a, EM_BF16);
    cr_expect_eq(em_tensor_dtype(em_softmax(h, 1)), EM_F32);
    cr_expect_eq(em_tensor_dtype(em_sum(h, 0, NULL, false)), EM_F32);
    em_tensor *a64 = em_to_dtype(a, EM_F64), *b64 = em_to_dtype(b, EM_F64);
    cr_expect_eq(em_tensor_dtype(em_matmul(a64, b64)), EM_F64);
    /* promote: cat of f32 and bf16 is f32 */
    const em_tensor *parts[2] = {a, h};
    cr_expect_eq(em_tensor_dtype(em_cat(2, parts, 0)), EM_F32);
    cr_assert_eq(em_autocast_end(), EM_OK);
    cr_expect(!em_autocast_enabled("cpu", NULL));
    cr_expect_eq(em_tensor_dtype(em_matmul(a, b)), EM_F32);
    /* errors */
    cr_expect_eq(em_autocast_end(), EM_ERR_STATE);
    cr_expect(strstr(em_last_error(), "no autocast region"), "%s", em_last_error());
    cr_expect_eq(em_autocast_begin("cpu", EM_F32), EM_ERR_DTYPE);
    cr_expect(strstr(em_last_error(), "bfloat16 or float16"), "%s", em_last_error());
    cr_expect_eq(em_autocast_begin("tpu", EM_BF16), EM_ERR_NOTFOUND);
    cr_expect(strstr(em_last_error(), "'tpu'"), "%s", em_last_error());
    cr_expect_eq(em_autocast_begin(NULL, EM_BF16), EM_ERR_NOTFOUND);
    em_clear_error();
    int opened = 0;
    while (em_autocast_begin("cpu", EM_BF16) == EM_OK) opened++;
    cr_expect_eq(em_last_status(), EM_ERR_RANGE);
    cr_expect_eq(opened, 64);
    for (int i = 0; i < opened; i++) cr_assert_eq(em_autocast_end(), EM_OK);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

static void *thread_region(void *arg) {
    bool *enabled = arg;
    *enabled = em_autocast_enabled("cpu", NULL);
    return NULL;
}

Test(autocast, regions_are_per_thread) {
    cr_assert_eq(em_autocast_begin("cpu", EM_BF16), EM_OK);
    bool enabled = true;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, thread_region, &enabled), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_expect(!enabled, "another thread saw this thread's region");
    cr_expect(em_autocast_enabled("cpu", NULL));
    cr_assert_eq(em_autocast_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

/* ---- parameters: the cast cache and float32 gradients ------------------------------------ */

static em_tensor *param(int ndim, const int64_t *shape, uint64_t seed) {
    em_tensor *w = randn(ndim, shape, EM_F32, seed);
    cr_assert_eq(em_requires_grad_(w, true), EM_OK);
    return w;
}

/* Counts the to_dtype copies the observer sees. */
static int n_casts;
static void count_casts(void *user, const em_op_event *ev) {
    (void)user;
    if (ev->kind == EM_OP_EVENT_COPY && strcmp(ev->name, "to_dtype") == 0) n_casts++;
}

Test(autocast, parameter_casts_are_cached_per_region) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *w = param(2, (int64_t[]){5, 4}, 3), *x = randn(2, (int64_t[]){2, 4}, EM_F32, 4);
    em_observer obs = {.struct_size = sizeof obs, .begin = count_casts};
    cr_assert_eq(em_observer_push(&obs), EM_OK);
    cr_assert_eq(em_autocast_begin("cpu", EM_BF16), EM_OK);
    n_casts = 0;
    em_tensor *y1 = em_linear(x, w, NULL);
    cr_expect_eq(n_casts, 2, "x and w cast once each, got %d", n_casts);
    cr_expect_eq(em_autocast_cache_size(), 1, "only the parameter is cached");
    n_casts = 0;
    em_tensor *y2 = em_linear(x, w, NULL);
    cr_expect_eq(n_casts, 1, "the parameter's cast is reused; x (not a parameter) is cast "
                 "again: %d casts", n_casts);
    cr_expect(same_bits(y1, y2));
    /* A new value of the parameter (an optimizer step) is cast again. */
    em_grad_mode_push(EM_GRAD_DISABLED);
    cr_assert_eq(em_mul_scalar_(w, 2.0), EM_OK);
    em_grad_mode_pop();
    n_casts = 0;
    em_tensor *y3 = em_linear(x, w, NULL);
    cr_expect_eq(n_casts, 2, "after a version change the parameter is cast again");
    cr_expect_eq(em_autocast_cache_size(), 1);
    em_tensor *want = em_linear(em_to_dtype(x, EM_BF16), em_to_dtype(w, EM_BF16), NULL);
    cr_expect(same_bits(y3, want), "the new cast holds the new values");
    /* no_grad: its own entry (a cast made without history must not feed a backward) */
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_tensor *y4 = em_linear(x, w, NULL);
    em_grad_mode_pop();
    cr_expect(!em_tensor_requires_grad(y4));
    cr_expect_eq(em_autocast_cache_size(), 2);
    em_tensor *y5 = em_linear(x, w, NULL);
    cr_expect(em_tensor_requires_grad(y5));
    cr_assert_eq(em_autocast_end(), EM_OK);
    cr_expect_eq(em_autocast_cache_size(), 0, "the outermost end drops the cache");
    cr_assert_eq(em_observer_pop(&obs), EM_OK);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

/* A two-layer MLP's loss: by autocast, or with the casts written out. */
static em_tensor *mlp_written_loss(em_tensor *x, em_tensor *w1, em_tensor *b1, em_tensor *w2,
                           em_tensor *b2, em_tensor *y, bool manual) {
#define C(t) (manual ? em_to_dtype((t), EM_BF16) : (t))
    em_tensor *h = em_relu(em_linear(C(x), C(w1), C(b1)));
    em_tensor *z = em_linear(C(h), C(w2), C(b2));
#undef C
    if (manual) z = em_to_dtype(z, EM_F32);
    return em_cross_entropy(z, y, NULL, EM_REDUCTION_MEAN, -100, 0.0);
}

Test(autocast, float32_parameters_get_float32_gradients) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *w1 = param(2, (int64_t[]){16, 8}, 5), *b1 = param(1, (int64_t[]){16}, 6),
              *w2 = param(2, (int64_t[]){3, 16}, 7), *b2 = param(1, (int64_t[]){3}, 8);
    em_tensor *x = randn(2, (int64_t[]){4, 8}, EM_F32, 9);
    em_tensor *y = em_test_tensor(EM_I64, 1, (int64_t[]){4}, (double[]){0, 2, 1, 2});
    em_tensor *ps[4] = {w1, b1, w2, b2}, *want[4];
    em_tensor *ref = mlp_written_loss(x, w1, b1, w2, b2, y, true);
    cr_assert(ref && em_backward(ref) == EM_OK, "%s", em_last_error());
    for (int i = 0; i < 4; i++) {
        want[i] = em_clone(em_tensor_grad(ps[i]));
        cr_assert_eq(em_tensor_set_grad(ps[i], NULL), EM_OK);
    }
    for (int inside = 0; inside < 2; inside++) {
        cr_assert_eq(em_autocast_begin("cpu", EM_BF16), EM_OK);
        em_tensor *loss = mlp_written_loss(x, w1, b1, w2, b2, y, false);
        cr_assert(loss, "%s", em_last_error());
        cr_expect_eq(em_tensor_dtype(loss), EM_F32);
        if (inside) cr_assert_eq(em_backward(loss), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_autocast_end(), EM_OK);
        if (!inside) cr_assert_eq(em_backward(loss), EM_OK, "%s", em_last_error());
        cr_expect(same_bits(loss, ref), "the loss is the one of the written-out casts");
        for (int i = 0; i < 4; i++) {
            em_tensor *g = em_tensor_grad(ps[i]);
            cr_assert(g);
            cr_expect_eq(em_tensor_dtype(g), EM_F32, "parameter %d's gradient is %s", i,
                         em_dtype_name(em_tensor_dtype(g)));
            cr_expect(same_bits(g, want[i]), "parameter %d's gradient (backward %s the region)",
                      i, inside ? "inside" : "outside");
            cr_assert_eq(em_tensor_set_grad(ps[i], NULL), EM_OK);
        }
    }
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

/* ---- ops declared outside the core -------------------------------------------------------- */

static em_status same_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    (void)op, (void)attrs;
    out[0].dtype = em_tensor_dtype(in[0]);
    out[0].ndim = em_tensor_ndim(in[0]);
    memcpy(out[0].shape, em_tensor_shape(in[0]), sizeof(int64_t) * (size_t)out[0].ndim);
    return EM_OK;
}
static em_status copy_kernel(const em_kernel_ctx *k) {
    size_t es = em_dtype_size(k->in[0].dtype);
    memcpy(k->out[0].data, k->in[0].data, (size_t)k->out[0].numel * es);
    return EM_OK;
}

Test(autocast, plugin_ops_declare_their_class) {
    em_registry *reg = em_registry_program();
    /* An op declared with the schema as it was before the field: unaffected. */
    em_op_schema old = {.struct_size = offsetof(em_op_schema, autocast), .name = "test.old",
                        .n_inputs = 1, .n_outputs = 1, .infer = same_infer};
    em_op_schema lower = {.struct_size = sizeof lower, .name = "test.lower", .n_inputs = 1,
                          .n_outputs = 1, .infer = same_infer, .autocast = EM_AUTOCAST_LOWER};
    em_op_schema bad = lower;
    bad.name = "test.bad";
    bad.autocast = 7;
    const em_op *o_old, *o_low;
    cr_assert_eq(em_op_declare(reg, &old, &o_old), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_op_declare(reg, &lower, &o_low), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_op_declare(reg, &bad, NULL), EM_ERR_INVALID);
    cr_expect(strstr(em_last_error(), "test.bad") && strstr(em_last_error(), "class 7"), "%s",
              em_last_error());
    cr_expect_eq(em_op_schema_of(o_old)->autocast, EM_AUTOCAST_NONE);
    em_dtype dts[] = {EM_F32, EM_BF16};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            em_kernel_def k = {.struct_size = sizeof k, .op = j ? "test.lower" : "test.old",
                               .device_type = "cpu", .dtype = dts[i], .fn = copy_kernel};
            cr_assert_eq(em_kernel_register(reg, &k, NULL), EM_OK, "%s", em_last_error());
        }
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *x = randn(1, (int64_t[]){5}, EM_F32, 10), *out[1];
    cr_assert_eq(em_autocast_begin("cpu", EM_BF16), EM_OK);
    cr_assert_eq(em_op_call(o_old, (const em_tensor *const *)&x, 1, NULL, out), EM_OK);
    cr_expect_eq(em_tensor_dtype(out[0]), EM_F32);
    cr_assert_eq(em_op_call(o_low, (const em_tensor *const *)&x, 1, NULL, out), EM_OK);
    cr_expect_eq(em_tensor_dtype(out[0]), EM_BF16);
    cr_assert_eq(em_autocast_end(), EM_OK);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

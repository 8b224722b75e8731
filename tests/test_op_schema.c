/*
 * test_op_schema.c — the op is its schema (issue 14), over the one op-case table
 * (tests/op_cases.h):
 *   - coverage: every op the core declares has a row; each row's differentiable flag is the
 *     schema's;
 *   - equivalence: for every row (invalid variants included) and every dtype it lists, the
 *     typed function and em_op_call_n through em_op_find give the same status, the status
 *     the row expects, and bitwise-equal outputs (dtype, shape and bytes). Fills compare the
 *     typed function with em_op_call_out into the tensor the row describes; list ops (no
 *     typed function) must give the row's status by name;
 *   - the cases the issue names: clamp of int64 [1, 4, 9] with min 1.5 by name.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "op_cases.h"

TestSuite(op_schema, .init = em_test_setup, .fini = em_test_teardown);

static const char *dt_name(em_dtype dt) { return em_dtype_name(dt); }

/* Bytes of t in C order. */
static void *bytes_of(const em_tensor *t, size_t *n) {
    *n = (size_t)em_tensor_numel(t) * em_dtype_size(em_tensor_dtype(t));
    void *b = malloc(*n ? *n : 1);
    cr_assert(b);
    cr_assert_eq(em_tensor_to_host(t, b, *n), EM_OK, "%s", em_last_error());
    return b;
}

/* The same dtype, shape and bytes. */
static void expect_same(const em_tensor *a, const em_tensor *b, const char *what, int k) {
    cr_assert(a && b, "%s: output %d missing", what, k);
    cr_expect_eq(em_tensor_dtype(a), em_tensor_dtype(b), "%s: output %d dtype %s vs %s", what, k,
                 dt_name(em_tensor_dtype(a)), dt_name(em_tensor_dtype(b)));
    char sa[96], sb[96];
    em_shape_str(em_tensor_ndim(a), em_tensor_shape(a), sa, sizeof sa);
    em_shape_str(em_tensor_ndim(b), em_tensor_shape(b), sb, sizeof sb);
    cr_assert_str_eq(sa, sb, "%s: output %d shape %s vs %s", what, k, sa, sb);
    size_t na, nb;
    void *ba = bytes_of(a, &na), *bb = bytes_of(b, &nb);
    cr_expect(na == nb && memcmp(ba, bb, na) == 0, "%s: output %d differs bitwise", what, k);
    free(ba);
    free(bb);
}

static int count_bits(unsigned v) {
    int n = 0;
    for (; v; v &= v - 1) n++;
    return n;
}

Test(op_schema, every_standard_op_has_a_row) {
    const em_registry *core = em_registry_core();
    cr_assert(core);
    size_t n = em_registry_op_count(core);
    cr_assert_gt(n, 100, "the core declares %zu ops", n);
    char missing[2048] = "";
    int n_missing = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = em_registry_op_name(core, i);
        const em_op_schema *s = em_op_schema_of(em_op_find(name));
        cr_assert(s, "%s", name);
        bool diff = !(s->flags & EM_OP_NONDIFF) && (s->backward || s->composite);
        int rows = 0;
        for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
            const em_op_case *c = em_op_case_get(r);
            if (strcmp(c->op, name) != 0) continue;
            rows++;
            cr_expect_eq(c->differentiable, diff, "%s (%s): the table says %sdifferentiable, the "
                         "schema %s", name, c->variant, c->differentiable ? "" : "not ",
                         diff ? "has a derivative" : "has none");
            cr_expect(c->dtypes != 0, "%s (%s): no dtypes", name, c->variant);
        }
        if (!rows) {
            n_missing++;
            size_t len = strlen(missing);
            snprintf(missing + len, sizeof missing - len, "%s%s", len ? ", " : "", name);
        }
    }
    cr_expect_eq(n_missing, 0, "%d declared standard op(s) without a row in core/op_cases.c: %s",
                 n_missing, missing);
    /* Every row names a declared op. */
    for (int r = 0, nr = em_std_case_count(); r < nr; r++)
        cr_expect(em_op_find(em_op_case_get(r)->op), "row %d names '%s', which is not declared", r,
                  em_op_case_get(r)->op);
}

/* One row in one dtype. */
static void check_row(const em_op_case *c, int r, em_dtype dt) {
    char what[256];
    snprintf(what, sizeof what, "%s (%s) in %s", c->op, c->variant, dt_name(dt));
    const em_op *op = em_op_find(c->op);
    cr_assert(op, "%s", what);
    const em_op_schema *s = em_op_schema_of(op);
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *in[EM_CASE_MAX_IN] = {0};
    int n_build = c->n_in ? c->n_in : 1; /* a fill's entry describes its output */
    for (int i = 0; i < n_build; i++) {
        in[i] = em_case_make(&c->in[i], dt, (uint64_t)r * 131 + (uint64_t)i);
        cr_assert(in[i] || c->in[i].absent, "%s: input %d: %s", what, i, em_last_error());
    }
    if (s->flags & EM_OP_LISTS) {
        /* in[]: the input lists, then the output lists (updated in place). */
        em_status st = em_op_call_lists(op, 1, (const em_tensor *const *)in, c->attrs,
                                        in + s->n_inputs);
        cr_expect_eq(st, c->expect, "%s: by name %s (%s), the table expects %s", what,
                     em_status_str(st), st ? em_last_error() : "", em_status_str(c->expect));
        em_clear_error();
        cr_assert_eq(em_scope_end(), EM_OK);
        return;
    }
    em_tensor *a[16] = {0}, *b[16] = {0}; /* split_sizes makes 10 */
    int na = 0, nb = 0;
    if (!c->typed) { /* a helper of a derivative, or a by-name-only row: by name only */
        em_tensor *t = s->n_inputs == 0 ? em_clone(in[0]) : NULL; /* a fill writes into t */
        em_status st = s->n_inputs == 0
                           ? em_op_call_out(op, NULL, 0, c->attrs, &t, 1)
                           : em_op_call_n(op, (const em_tensor *const *)in, c->n_in, c->attrs,
                                          b, 16, &nb);
        cr_expect_eq(st, c->expect, "%s: by name %s (%s), the table expects %s", what,
                     em_status_str(st), st ? em_last_error() : "", em_status_str(c->expect));
        em_clear_error();
        cr_assert_eq(em_scope_end(), EM_OK);
        return;
    }
    em_status sa = c->typed((const em_tensor *const *)in, c->attrs, a, &na);
    char ea[512];
    snprintf(ea, sizeof ea, "%s", sa == EM_OK ? "" : em_last_error());
    em_clear_error();
    em_status sb;
    if (s->n_inputs == 0) {
        /* A fill: by name it writes into a tensor of the typed result's geometry (or the
         * row's, when the typed call failed). */
        em_tensor *t = na ? em_empty_like(a[0]) : em_clone(in[0]);
        cr_assert(t, "%s: %s", what, em_last_error());
        sb = em_op_call_out(op, NULL, 0, c->attrs, &t, 1);
        b[0] = t;
        nb = sb == EM_OK;
    } else {
        sb = em_op_call_n(op, (const em_tensor *const *)in, c->n_in, c->attrs, b, 16, &nb);
    }
    char eb[512];
    snprintf(eb, sizeof eb, "%s", sb == EM_OK ? "" : em_last_error());
    em_clear_error();
    cr_expect_eq(sa, sb, "%s: typed %s (%s), by name %s (%s)", what, em_status_str(sa), ea,
                 em_status_str(sb), eb);
    cr_expect_eq(sa, c->expect, "%s: typed %s (%s), the table expects %s", what,
                 em_status_str(sa), ea, em_status_str(c->expect));
    if (sa == EM_OK && sb == EM_OK) {
        cr_expect_eq(na, nb, "%s: typed made %d outputs, by name %d", what, na, nb);
        for (int k = 0; k < na && k < nb; k++) expect_same(a[k], b[k], what, k);
    }
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(op_schema, typed_and_by_name_are_the_same_op) {
    int checked = 0;
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
        const em_op_case *c = em_op_case_get(r);
        for (int d = 0; d < EM_DTYPE_COUNT; d++) {
            if (!(c->dtypes & EM_CASE_DT(d))) continue;
            check_row(c, r, (em_dtype)d);
            checked++;
        }
    }
    int bits = 0;
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) bits += count_bits(em_op_case_get(r)->dtypes);
    cr_expect_eq(checked, bits);
    cr_expect_gt(checked, 500, "only %d (row, dtype) pairs", checked);
}

/* The example of issue 14: by name, clamp follows the number's dtype rule as em_clamp does. */
Test(op_schema, clamp_int64_with_float_min_by_name) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s3 = 3;
    em_tensor *x = em_test_tensor(EM_I64, 1, &s3, (double[]){1, 4, 9});
    em_attr attrs[2] = {{.type = EM_ATTR_FLOAT, .v.f = 1.5}, {.type = EM_ATTR_NONE}};
    em_tensor *out[1] = {NULL};
    cr_assert_eq(em_op_call(em_op_find("clamp"), (const em_tensor *const[]){x}, 1, attrs, out),
                 EM_OK, "%s", em_last_error());
    cr_expect_eq(em_tensor_dtype(out[0]), EM_F32, "by name: %s",
                 em_dtype_name(em_tensor_dtype(out[0])));
    double want[3] = {1.5, 4, 9};
    for (int i = 0; i < 3; i++) cr_expect_eq(em_test_at(out[0], i), want[i]);
    double lo = 1.5;
    em_tensor *typed = em_clamp(x, &lo, NULL);
    cr_assert(typed);
    expect_same(typed, out[0], "clamp", 0);
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* By name, the argument checks of the schema run: softplus-style attribute checks cannot be
 * skipped (leaky_relu of an int tensor, gelu's approximate, pow_scalar of ints to -1). */
Test(op_schema, checks_run_by_name) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s3 = 3;
    em_tensor *xi = em_test_tensor(EM_I64, 1, &s3, (double[]){1, 2, 3});
    em_tensor *xf = em_test_tensor(EM_F32, 1, &s3, (double[]){1, 2, 3});
    em_tensor *out[1];
    em_attr slope = {.type = EM_ATTR_FLOAT, .v.f = 0.1};
    cr_expect_eq(em_op_call(em_op_find("leaky_relu"), (const em_tensor *const[]){xi}, 1, &slope,
                            out), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "leaky_relu: expected a floating tensor, got int64");
    em_attr p = {.type = EM_ATTR_FLOAT, .v.f = -1};
    cr_expect_eq(em_op_call(em_op_find("pow_scalar"), (const em_tensor *const[]){xi}, 1, &p, out),
                 EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "pow_scalar: integers to negative integer powers");
    em_attr dims[2] = {{.type = EM_ATTR_INTS, .n = 1, .ints = {-1}},
                       {.type = EM_ATTR_BOOL, .v.b = false}};
    cr_expect_eq(em_op_call(em_op_find("sum"), (const em_tensor *const[]){xi}, 1, dims, out),
                 EM_OK, "%s", em_last_error());
    cr_expect_eq(em_tensor_dtype(out[0]), EM_I64);
    cr_expect_eq(em_test_at(out[0], 0), 6);
    em_attr bad[2] = {{.type = EM_ATTR_INTS, .n = 1, .ints = {-3}},
                      {.type = EM_ATTR_BOOL, .v.b = false}};
    cr_expect_eq(em_op_call(em_op_find("sum"), (const em_tensor *const[]){xf}, 1, bad, out),
                 EM_ERR_RANGE);
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* The table's tolerances: every valid row that lists float16 or bfloat16 with float32 gives,
 * in the low-precision dtype, the float32 result on the same (rounded) inputs within the
 * dtype's tolerance (tests/op_cases.h: em_case_tolerance, scaled by the row's tol_scale):
 * |low - f32| <= tol * (1 + |f32|). Outputs that are not floating must be equal. */
static void low_vs_f32(const em_op_case *c, int r, em_dtype low) {
    char what[256];
    snprintf(what, sizeof what, "%s (%s) in %s", c->op, c->variant, em_dtype_name(low));
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *in_low[EM_CASE_MAX_IN] = {0}, *in_f32[EM_CASE_MAX_IN] = {0};
    int n_build = c->n_in ? c->n_in : 1;
    for (int i = 0; i < n_build; i++) {
        in_low[i] = em_case_make(&c->in[i], low, (uint64_t)r * 131 + (uint64_t)i);
        bool row_dtype = c->in[i].dtype < 0;
        in_f32[i] = in_low[i] && row_dtype ? em_to_dtype(in_low[i], EM_F32) : in_low[i];
        cr_assert(in_f32[i] || c->in[i].absent, "%s: %s", what, em_last_error());
    }
    em_tensor *a[16] = {0}, *b[16] = {0};
    int na = 0, nb = 0;
    em_status sa = c->typed((const em_tensor *const *)in_low, c->attrs, a, &na);
    em_status sb = c->typed((const em_tensor *const *)in_f32, c->attrs, b, &nb);
    cr_assert(sa == EM_OK && sb == EM_OK, "%s: %s", what, em_last_error());
    cr_assert_eq(na, nb, "%s", what);
    double tol = em_case_tolerance(low) * (c->tol_scale > 0 ? c->tol_scale : 1);
    for (int k = 0; k < na; k++) {
        double *x = em_test_values(a[k]), *y = em_test_values(b[k]);
        int64_t n = em_tensor_numel(a[k]);
        cr_assert_eq(n, em_tensor_numel(b[k]), "%s: output %d", what, k);
        bool fl = em_dtype_is_floating(em_tensor_dtype(a[k]));
        for (int64_t i = 0; i < n; i++) {
            bool same = x[i] == y[i] || (isnan(x[i]) && isnan(y[i]));
            bool close = fl && isfinite(y[i]) && fabs(x[i] - y[i]) <= tol * (1 + fabs(y[i]));
            cr_expect(same || close, "%s: output %d element %lld: %.9g vs float32 %.9g (tol %g)",
                      what, k, (long long)i, x[i], y[i], tol);
        }
        free(x);
        free(y);
    }
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(op_schema, low_precision_within_the_tables_tolerance) {
    int checked = 0;
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
        const em_op_case *c = em_op_case_get(r);
        const em_op_schema *s = em_op_schema_of(em_op_find(c->op));
        if (!c->typed || c->expect != EM_OK || !(c->dtypes & EM_CASE_DT(EM_F32)) ||
            s->n_inputs == 0)
            continue;
        for (int k = 0; k < 2; k++) {
            em_dtype low = k ? EM_BF16 : EM_F16;
            if (!(c->dtypes & EM_CASE_DT(low))) continue;
            low_vs_f32(c, r, low);
            checked++;
        }
    }
    cr_expect_gt(checked, 100, "only %d rows", checked);
}

/* The differentiable flag: every valid row marked differentiable that lists float64 passes
 * em_gradcheck for its floating inputs of the row's dtype (contiguous copies of them, so they
 * can be leaves; rows with an expanded input repeat values, and ties make the one-sided
 * finite differences of max-like ops disagree with the tie rule, so those are left to the
 * per-family tests). The row is reduced to one number as em_case_grad_fn says (a fixed
 * random direction per output). */
Test(op_schema, differentiable_rows_pass_gradcheck_in_f64) {
    int checked = 0;
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
        const em_op_case *c = em_op_case_get(r);
        if (!c->typed || !c->differentiable || c->expect != EM_OK ||
            !(c->dtypes & EM_CASE_DT(EM_F64)))
            continue;
        bool expanded = false;
        for (int i = 0; i < c->n_in; i++) expanded |= c->in[i].layout == EM_CASE_EXPANDED;
        if (expanded) continue;
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_case_grad g = {.struct_size = sizeof g};
        em_tensor *vary[EM_CASE_MAX_IN];
        em_case_grad_setup(c, EM_F64, (uint64_t)r, &g, vary);
        /* Rows whose results are empty or not finite (a NaN bound, division by 0) have
         * nothing finite differences could check. */
        em_tensor *f = g.n > 0 ? em_case_grad_fn(vary, g.n, &g) : NULL;
        bool finite = f && em_tensor_numel(f) > 0 && isfinite(em_item(f));
        for (int i = 0; i < c->n_in && finite; i++)
            if (g.all[i] && em_tensor_numel(g.all[i]) == 0) finite = false;
        em_clear_error();
        if (finite) {
            em_status st = em_gradcheck(em_case_grad_fn, g.n, vary, &g, 0, 0, 0);
            cr_expect_eq(st, EM_OK, "row %d, %s (%s): %s", r, c->op, c->variant, em_last_error());
            em_clear_error();
            checked++;
        }
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    cr_expect_gt(checked, 100, "only %d rows", checked);
}

/* A NULL attribute array by name means every attribute absent: defaults or an error, never a
 * read through NULL (gelu's inference and fill's kernel read their attribute 0). */
Test(op_schema, null_attrs_by_name_are_absent_attributes) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *x = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu()), *y = NULL;
    cr_expect_eq(em_op_call(em_op_find("gelu"), (const em_tensor *const[]){x}, 1, NULL, &y),
                 EM_OK, "%s", em_last_error());
    cr_expect_eq(em_op_call_out(em_op_find("fill"), NULL, 0, NULL, &x, 1), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "fill: attribute 'value' is required");
    cr_expect_eq(em_op_call(em_op_find("clamp"), (const em_tensor *const[]){x}, 1, NULL, &y),
                 EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "clamp: at least one of min and max must be given");
    cr_assert_eq(em_scope_end(), EM_OK);
}

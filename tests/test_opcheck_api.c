/*
 * test_opcheck_api.c — the registry calls ember-opcheck is built on (issue 18):
 *   - case rows (ember/opcase.h): the core's rows are in the registry at em_init, every row
 *     names a declared op, rows of the program's registry are added after them and found,
 *     registration refuses an undeclared op, a bad input count and a row without dtypes, and
 *     rows of a newer (larger) em_op_case are read by their prefix;
 *   - kernel stacks: em_op_kernel_count/get list a stack top first, em_op_call_at runs the
 *     kernel at a depth (the ordinary call keeps choosing the top), EM_ERR_RANGE past the
 *     bottom, EM_ERR_NOKERNEL (with the kernel) when supports() declines, EM_CALL_POISON leaves
 *     an element a kernel does not write as NaN, and a composite's own kernel call takes the
 *     choice.
 */
#include <math.h>

#include "common.h"

TestSuite(opcheck_api, .init = em_test_setup, .fini = em_test_teardown);

/* y = x * user (a float); "skip_last" writes every element but the last. */
static em_status times(const em_kernel_ctx *k) {
    const float *x = k->in[0].data;
    float *y = k->out[0].data;
    for (int64_t i = 0; i < k->out[0].numel; i++) y[i] = x[i] * *(const float *)k->user;
    return EM_OK;
}
static em_status skip_last(const em_kernel_ctx *k) {
    const float *x = k->in[0].data;
    float *y = k->out[0].data;
    for (int64_t i = 0; i + 1 < k->out[0].numel; i++) y[i] = x[i];
    return EM_OK;
}
static bool never(const em_kernel_ctx *k) {
    (void)k;
    return false;
}

static const float one = 1, two = 2;

static const em_op *declare(const char *name) {
    em_op_schema s = {.struct_size = sizeof s, .name = name, .n_inputs = 1, .n_outputs = 1,
                      .dispatch_arg = 0, .infer = em_infer_same};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    return op;
}

static void reg(const char *op, int prio, em_kernel_fn fn, em_kernel_supports_fn sup,
                const float *user, const char *name) {
    em_kernel_def k = {.struct_size = sizeof k, .op = op, .device_type = "cpu", .dtype = EM_F32,
                       .priority = prio, .fn = fn, .supports = sup, .name = name,
                       .user = (void *)user};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                 em_last_error());
}

Test(opcheck_api, the_core_rows_are_in_the_registry) {
    size_t n = em_op_case_count();
    cr_assert_gt(n, 500, "%zu rows", n);
    size_t core = 0;
    for (size_t i = 0; i < n; i++) {
        const em_op_case *c = em_op_case_get(i);
        cr_assert(c && c->struct_size == sizeof *c);
        cr_expect(em_op_find(c->op), "row %zu names '%s'", i, c->op);
        core += em_op_case_owner(i) == em_registry_core();
    }
    cr_expect_eq(core, n, "every row so far is the core's");
    cr_expect_null(em_op_case_get(n));
    cr_expect_null(em_op_case_owner(n));
    cr_expect_neq(em_case_dtypes_of("add") & EM_CASE_DT(EM_F32), 0u);
    cr_expect_eq(em_case_dtypes_of("no such op"), 0u);
}

Test(opcheck_api, a_program_registers_rows_for_its_op) {
    declare("api.twice");
    static const em_op_case rows[] = {
        {.struct_size = sizeof(em_op_case), .op = "api.twice", .variant = "a", .n_in = 1,
         .in = {{.ndim = 1, .shape = {3}, .dtype = -1}}, .dtypes = EM_CASE_DT(EM_F32)},
    };
    size_t before = em_op_case_count();
    cr_assert_eq(em_op_cases_register(em_registry_program(), rows, 1), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_op_case_count(), before + 1);
    cr_expect_eq(em_op_case_get(before), &rows[0], "the row is referenced, not copied");
    cr_expect_eq(em_op_case_owner(before), (const em_registry *)em_registry_program());
    cr_expect_eq(em_case_dtypes_of("api.twice"), EM_CASE_DT(EM_F32));

    em_op_case bad = rows[0];
    bad.op = "api.undeclared";
    cr_expect_eq(em_op_cases_register(em_registry_program(), &bad, 1), EM_ERR_NOTFOUND);
    em_assert_error(EM_ERR_NOTFOUND, "op_cases_register: row 0 (a) names op 'api.undeclared', "
                    "which is not declared (declare it before its cases)");
    bad = rows[0], bad.n_in = 7;
    cr_expect_eq(em_op_cases_register(em_registry_program(), &bad, 1), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "op_cases_register: row 0 (api.twice, a) has 7 inputs (0 to 6)");
    bad = rows[0], bad.dtypes = 0;
    cr_expect_eq(em_op_cases_register(em_registry_program(), &bad, 1), EM_ERR_INVALID);
    bad = rows[0], bad.struct_size = 8;
    cr_expect_eq(em_op_cases_register(em_registry_program(), &bad, 1), EM_ERR_INVALID);
    cr_expect_eq(em_op_case_count(), before + 1, "refused rows are not added");
}

/* Rows from newer headers (a larger em_op_case, laid out at their own stride) are read by the
 * prefix this core knows. */
Test(opcheck_api, a_newer_larger_row_is_read_by_its_prefix) {
    declare("api.newer");
    size_t stride = sizeof(em_op_case) + 16;
    static unsigned char raw[2 * (sizeof(em_op_case) + 16)];
    memset(raw, 0x5A, sizeof raw);
    for (int i = 0; i < 2; i++) {
        em_op_case c = {.struct_size = stride, .op = "api.newer", .variant = i ? "b" : "a",
                        .n_in = 1, .in = {{.ndim = 1, .shape = {2}, .dtype = -1}},
                        .dtypes = EM_CASE_DT(EM_F64)};
        memcpy(raw + (size_t)i * stride, &c, sizeof c);
    }
    size_t before = em_op_case_count();
    cr_assert_eq(em_op_cases_register(em_registry_program(), (const em_op_case *)raw, 2), EM_OK,
                 "%s", em_last_error());
    for (int i = 0; i < 2; i++) {
        const em_op_case *c = em_op_case_get(before + (size_t)i);
        cr_expect_str_eq(c->op, "api.newer");
        cr_expect_str_eq(c->variant, i ? "b" : "a");
        cr_expect_eq(c->dtypes, EM_CASE_DT(EM_F64));
    }
}

Test(opcheck_api, em_op_call_at_runs_each_kernel_of_the_stack) {
    const em_op *op = declare("api.stack");
    reg("api.stack", 0, times, NULL, &one, "api_plain");
    reg("api.stack", 5, skip_last, NULL, NULL, "api_skip_last");
    reg("api.stack", 9, times, never, &two, "api_never");
    cr_assert_eq(em_op_kernel_count(op, em_cpu(), EM_F32), 3);
    cr_expect_eq(em_op_kernel_count(op, em_cpu(), EM_F64), 0);
    const char *names[3] = {"api_never", "api_skip_last", "api_plain"};
    for (size_t i = 0; i < 3; i++) {
        const em_kernel_def *d = em_kernel_def_of(em_op_kernel_get(op, em_cpu(), EM_F32, i));
        cr_assert(d);
        cr_expect_str_eq(d->name, names[i]);
        cr_expect_eq(em_kernel_owner(em_op_kernel_get(op, em_cpu(), EM_F32, i)),
                     (const em_registry *)em_registry_program());
    }
    cr_expect_null(em_op_kernel_get(op, em_cpu(), EM_F32, 3));

    em_scope_begin();
    int64_t n = 4;
    em_tensor *x = em_test_tensor(EM_F32, 1, &n, (double[]){1, 2, 3, 4});
    const em_tensor *in[1] = {x};
    em_tensor *out[1] = {NULL};
    int n_out = -1;
    const em_kernel *k = NULL;
    /* depth 0: the top declines. */
    cr_expect_eq(em_op_call_at(op, 0, 0, in, 1, NULL, out, 1, &n_out, &k), EM_ERR_NOKERNEL);
    em_assert_error(EM_ERR_NOKERNEL, "api.stack: kernel api_never declines this call (its "
                    "supports() returned false)");
    cr_expect_eq(k, em_op_kernel_get(op, em_cpu(), EM_F32, 0));
    cr_expect_eq(n_out, 0);
    /* depth 1, poisoned: the element it skips stays NaN. */
    out[0] = NULL;
    cr_assert_eq(em_op_call_at(op, 1, EM_CALL_POISON, in, 1, NULL, out, 1, &n_out, &k), EM_OK,
                 "%s", em_last_error());
    cr_expect_eq(n_out, 1);
    cr_expect_str_eq(em_kernel_def_of(k)->name, "api_skip_last");
    cr_expect_eq(em_test_at(out[0], 2), 3);
    cr_expect(isnan(em_test_at(out[0], 3)), "the unwritten element is %g", em_test_at(out[0], 3));
    /* depth 2: the plain kernel, into a caller-made output. */
    em_tensor *given = em_empty(1, &n, EM_F32, em_cpu());
    out[0] = given;
    cr_assert_eq(em_op_call_at(op, 2, EM_CALL_POISON, in, 1, NULL, out, 1, &n_out, &k), EM_OK,
                 "%s", em_last_error());
    cr_expect_eq(out[0], given);
    for (int i = 0; i < 4; i++) cr_expect_eq(em_test_at(given, i), i + 1);
    /* depth 3: past the bottom. */
    out[0] = NULL;
    cr_expect_eq(em_op_call_at(op, 3, 0, in, 1, NULL, out, 1, &n_out, &k), EM_ERR_RANGE);
    em_assert_error(EM_ERR_RANGE, "api.stack: the cpu float32 kernel stack has 3 kernel(s); "
                    "there is none at depth 3");
    cr_expect_null(k);
    /* A given output of the wrong shape. */
    int64_t n3 = 3;
    out[0] = em_empty(1, &n3, EM_F32, em_cpu());
    cr_expect_eq(em_op_call_at(op, 2, 0, in, 1, NULL, out, 1, &n_out, NULL), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "api.stack: output 0 given as float32 [3]; the call makes "
                    "float32 [4]");
    /* The ordinary call still walks the stack: api_never declines, api_skip_last runs. */
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(op, in, 1, NULL, &y), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_test_at(y, 0), 1);
    em_scope_end();
}

/* sum is a composite with a kernel of its own: the choice reaches the kernel its composite
 * calls. */
Test(opcheck_api, a_composites_kernel_call_takes_the_depth) {
    const em_op *sum = em_op_find("sum");
    size_t nk = em_op_kernel_count(sum, em_cpu(), EM_F32);
    cr_assert_gt(nk, 0);
    em_scope_begin();
    int64_t sh[2] = {2, 3};
    em_tensor *x = em_test_tensor(EM_F32, 2, sh, (double[]){1, 2, 3, 4, 5, 6});
    em_attr attrs[2] = {{.type = EM_ATTR_INTS, .n = 1, .ints = {1}},
                        {.type = EM_ATTR_BOOL, .v.b = false}};
    for (size_t d = 0; d < nk; d++) {
        em_tensor *out[1] = {NULL};
        int n_out = 0;
        const em_kernel *k = NULL;
        em_status st = em_op_call_at(sum, d, EM_CALL_POISON, (const em_tensor *const[]){x}, 1,
                                     attrs, out, 1, &n_out, &k);
        if (st == EM_ERR_NOKERNEL) continue; /* declined */
        cr_assert_eq(st, EM_OK, "%s", em_last_error());
        cr_expect_eq(k, em_op_kernel_get(sum, em_cpu(), EM_F32, d));
        cr_expect_eq(em_test_at(out[0], 0), 6);
        cr_expect_eq(em_test_at(out[0], 1), 15);
    }
    em_tensor *out[1] = {NULL};
    int n_out = 0;
    cr_expect_eq(em_op_call_at(sum, nk, 0, (const em_tensor *const[]){x}, 1, attrs, out, 1,
                               &n_out, NULL), EM_ERR_RANGE);
    em_clear_error();
    em_scope_end();
}

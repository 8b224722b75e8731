/* Op declaration and lookup, argument checking in the dispatcher, and the placement
 * counters. Kernel stacking, fallback and cross-device errors are in test_plugin.c. */
#include "common.h"

TestSuite(dispatch, .init = em_test_setup, .fini = em_test_teardown);


/* y = x * scale, for f32 contiguous inputs (declines others through supports()). */
static em_status scale_kernel(const em_kernel_ctx *k) {
    const float *x = k->in[0].data;
    float *y = k->out[0].data;
    for (int64_t i = 0; i < k->out[0].numel; i++) y[i] = x[i] * (float)k->attrs[0].v.f;
    return EM_OK;
}
static bool scale_supports(const em_kernel_ctx *k) { return k->in[0].contiguous; }

static const em_op *declare_scale(void) {
    static const char *const names[] = {"scale"};
    static const em_attr_type types[] = {EM_ATTR_FLOAT};
    em_op_schema s = {.struct_size = sizeof s, .name = "test.scale", .n_inputs = 1,
                      .n_outputs = 1, .n_attrs = 1, .attr_names = names, .attr_types = types,
                      .dispatch_arg = 0, .infer = em_test_infer_same};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    em_kernel_def k = {.struct_size = sizeof k, .op = "test.scale", .device_type = "cpu",
                       .dtype = EM_F32, .fn = scale_kernel, .supports = scale_supports,
                       .name = "test_scale_f32"};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                 em_last_error());
    return op;
}

Test(dispatch, a_program_declares_and_runs_its_own_op) {
    const em_op *op = declare_scale();
    cr_assert_eq(em_op_find("test.scale"), op);
    cr_assert_str_eq(em_op_name(op), "test.scale");
    em_tensor *x = em_arange(0, 6, 1, EM_F32, em_cpu());
    em_attr a = {.type = EM_ATTR_FLOAT, .v.f = 2.5};
    em_tensor *y = NULL;
    const em_tensor *in[1] = {x};
    cr_assert_eq(em_op_call(op, in, 1, &a, &y), EM_OK, "%s", em_last_error());
    for (int i = 0; i < 6; i++) cr_assert_float_eq(em_test_at(y, i), 2.5 * i, 0);
    /* The program's registry is listed last by em_plugins(). */
    em_plugin_info info;
    cr_assert_eq(em_plugin_get(em_plugin_count() - 1, &info), EM_OK);
    cr_assert_str_eq(info.name, "<program>");
    cr_assert_eq(em_registry_op_count(info.registry), 1);
    cr_assert_str_eq(em_registry_op_name(info.registry, 0), "test.scale");
    em_tensor_release(x);
    em_tensor_release(y);
}

Test(dispatch, supports_can_decline_and_then_no_kernel_is_an_error) {
    const em_op *op = declare_scale();
    em_tensor *x = em_ones(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    em_tensor *xt = em_transpose(x, 0, 1);
    em_attr a = {.type = EM_ATTR_FLOAT, .v.f = 2};
    em_tensor *y = NULL;
    const em_tensor *in[1] = {xt};
    cr_assert_eq(em_op_call(op, in, 1, &a, &y), EM_ERR_NOKERNEL);
    em_assert_error(EM_ERR_NOKERNEL, "test.scale: no kernel for device 'cpu' and dtype float32 takes "
                    "this call (registered but declining these operands: test_scale_f32); "
                    "registered: cpu (float32)");
    em_tensor *x64 = em_ones(1, (int64_t[]){3}, EM_F64, em_cpu());
    in[0] = x64;
    cr_assert_eq(em_op_call(op, in, 1, &a, &y), EM_ERR_NOKERNEL);
    em_assert_error(EM_ERR_NOKERNEL, "dtype float64");
    em_tensor_release(x);
    em_tensor_release(xt);
    em_tensor_release(x64);
}

/* supports() gets the kernel's user pointer, as the kernel does: a plugin that registers one
 * function for several variants tells them apart there (it used to see the previous value). */
static int variant_a, variant_b;
static bool variant_supports(const em_kernel_ctx *k) { return k->user == &variant_a; }
static em_status variant_kernel(const em_kernel_ctx *k) {
    cr_assert_eq(k->user, &variant_a);
    return scale_kernel(k);
}
Test(dispatch, supports_sees_the_kernels_user_pointer) {
    static const char *const names[] = {"scale"};
    static const em_attr_type types[] = {EM_ATTR_FLOAT};
    em_op_schema s = {.struct_size = sizeof s, .name = "test.variant", .n_inputs = 1,
                      .n_outputs = 1, .n_attrs = 1, .attr_names = names, .attr_types = types,
                      .dispatch_arg = 0, .infer = em_test_infer_same};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    em_kernel_def k = {.struct_size = sizeof k, .op = "test.variant", .device_type = "cpu",
                       .dtype = EM_F32, .fn = variant_kernel, .supports = variant_supports,
                       .user = &variant_a, .name = "variant_a", .priority = 0};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                 em_last_error());
    k.user = &variant_b, k.name = "variant_b", k.priority = 10; /* on top; declines */
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                 em_last_error());
    em_tensor *x = em_arange(0, 4, 1, EM_F32, em_cpu()), *y = NULL;
    em_attr a = {.type = EM_ATTR_FLOAT, .v.f = 3};
    const em_tensor *in[1] = {x};
    cr_assert_eq(em_op_call(op, in, 1, &a, &y), EM_OK, "%s", em_last_error());
    for (int i = 0; i < 4; i++) cr_assert_float_eq(em_test_at(y, i), 3.0 * i, 0);
    em_tensor_release(x);
    em_tensor_release(y);
}

Test(dispatch, arguments_are_checked_against_the_schema) {
    const em_op *op = declare_scale();
    em_tensor *x = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
    const em_tensor *in[2] = {x, x};
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(op, in, 2, NULL, &y), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "test.scale: called with 2 inputs; it takes 1");
    em_attr wrong = {.type = EM_ATTR_INT, .v.i = 2};
    cr_assert_eq(em_op_call(op, in, 1, &wrong, &y), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "attribute 'scale'");
    /* Declaring the same name twice, and malformed schemas, are refused. */
    em_op_schema s = {.struct_size = sizeof s, .name = "test.scale", .n_inputs = 1,
                      .n_outputs = 1, .dispatch_arg = 0, .infer = em_test_infer_same};
    cr_assert_eq(em_op_declare(em_registry_program(), &s, NULL), EM_ERR_EXISTS);
    em_assert_error(EM_ERR_EXISTS, "'test.scale' is already declared");
    s.name = "test.bad";
    s.n_outputs = 0;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "the schema of 'test.bad' is malformed");
    em_tensor_release(x);
}

Test(dispatch, unknown_ops_suggest_a_near_name) {
    cr_assert_null(em_op_find("ad"));
    em_assert_error(EM_ERR_NOTFOUND, "no op named 'ad' is declared (did you mean 'add'?)");
    em_kernel_def k = {.struct_size = sizeof k, .op = "no.such.op", .device_type = "cpu",
                       .dtype = EM_F32, .fn = scale_kernel};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_ERR_NOTFOUND);
    em_assert_error(EM_ERR_NOTFOUND, "no op named 'no.such.op'");
    k.op = "add";
    k.device_type = "tpu";
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_ERR_NOTFOUND);
    em_assert_error(EM_ERR_NOTFOUND, "no device type 'tpu'");
}

Test(dispatch, placement_counts_ops_and_profiles_time) {
    em_placement_reset();
    em_profile_enable(true);
    em_tensor *x = em_ones(1, (int64_t[]){100000}, EM_F32, em_cpu());
    em_tensor *y = em_exp(x);
    em_placement_stats s;
    cr_assert_eq(em_placement_get("cpu", &s), EM_OK);
    cr_assert_eq(s.ops, 2, "fill and exp ran on the CPU (got %llu)", (unsigned long long)s.ops);
    cr_assert_gt(s.ns, 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    em_placement_report(f);
    fclose(f);
    cr_assert(strstr(text, "cpu"), "%s", text);
    free(text);
    em_profile_enable(false);
    cr_assert_eq(em_placement_get("tpu", &s), EM_ERR_NOTFOUND);
    em_tensor_release(x);
    em_tensor_release(y);
}

Test(dispatch, settings_round_trip) {
    em_set_num_threads(3);
    cr_assert_eq(em_num_threads(), 3);
    em_set_num_threads(0);
    cr_assert_eq(em_num_threads(), 1, "thread counts below 1 become 1");
    em_set_deterministic(true);
    cr_assert(em_deterministic());
    em_set_deterministic(false);
    em_fallback_set(EM_FALLBACK_ALLOW);
    cr_assert_eq(em_fallback_get(), EM_FALLBACK_ALLOW);
    em_fallback_set(EM_FALLBACK_ERROR);
}

Test(dispatch, env_variables_set_the_policy_at_init) {
    em_test_assert_clean_shutdown();
    setenv("EMBER_FALLBACK", "warn", 1);
    setenv("EMBER_NUM_THREADS", "1", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_fallback_get(), EM_FALLBACK_WARN);
    cr_assert_eq(em_num_threads(), 1);
    unsetenv("EMBER_FALLBACK");
    unsetenv("EMBER_NUM_THREADS");
}

/* ---- schema version 2: variadic ops, composites, old-size schemas ------------------------- */

/* y = the sum of every input (f32, one shape): a kernel op with any number of inputs. */
static em_status sum_n_kernel(const em_kernel_ctx *k) {
    float *y = k->out[0].data;
    for (int64_t e = 0; e < k->out[0].numel; e++) {
        float acc = 0;
        for (int i = 0; i < k->n_in; i++) acc += ((const float *)k->in[i].data)[e];
        y[e] = acc;
    }
    return EM_OK;
}

Test(dispatch, a_variadic_kernel_op_takes_more_than_8_inputs) {
    em_op_schema s = {.struct_size = sizeof s, .name = "test.sum_n", .n_inputs = 1,
                      .n_outputs = 1, .flags = EM_OP_VARIADIC | EM_OP_NONDIFF,
                      .infer = em_test_infer_same};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    em_kernel_def k = {.struct_size = sizeof k, .op = "test.sum_n", .device_type = "cpu",
                       .dtype = EM_F32, .fn = sum_n_kernel};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                 em_last_error());
    em_scope_begin();
    const em_tensor *in[12];
    for (int i = 0; i < 12; i++) in[i] = em_full(1, (int64_t[]){3}, i + 1, EM_F32, em_cpu());
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(op, in, 12, NULL, &y), EM_OK, "%s", em_last_error());
    for (int e = 0; e < 3; e++) cr_expect_eq(em_test_at(y, e), 78);
    em_tensor *z = em_empty(1, (int64_t[]){3}, EM_F32, em_cpu());
    cr_assert_eq(em_op_call_out(op, in, 10, NULL, &z, 1), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_test_at(z, 0), 55);
    cr_expect_eq(em_op_call(op, in, 0, NULL, &y), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "test.sum_n: called with 0 inputs; it takes at least 1");
    em_scope_end();
    /* A differentiable variadic kernel op is refused: autograd records at most 8 inputs. */
    em_op_schema d = s;
    d.name = "test.sum_n_diff";
    d.flags = EM_OP_VARIADIC;
    cr_expect_eq(em_op_declare(em_registry_program(), &d, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "must be EM_OP_NONDIFF");
}

/* A schema of the size before prepare/composite (what an older plugin passes) still declares
 * an op that runs; the newer fields read as absent. */
Test(dispatch, an_old_size_schema_still_works) {
    static const char *const names[] = {"scale"};
    static const em_attr_type types[] = {EM_ATTR_FLOAT};
    em_op_schema s = {.name = "test.old_scale", .n_inputs = 1, .n_outputs = 1, .n_attrs = 1,
                      .attr_names = names, .attr_types = types, .infer = em_test_infer_same,
                      /* garbage past the old size must not be read */
                      .prepare = (em_prepare_fn)(uintptr_t)1,
                      .composite = (em_composite_fn)(uintptr_t)1, .category = (const char *)1};
    s.struct_size = offsetof(em_op_schema, prepare);
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    const em_op_schema *got = em_op_schema_of(op);
    cr_expect_null(got->prepare);
    cr_expect_null(got->composite);
    cr_expect_null(got->category);
    em_kernel_def k = {.struct_size = sizeof k, .op = "test.old_scale", .device_type = "cpu",
                       .dtype = EM_F32, .fn = scale_kernel};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK);
    em_scope_begin();
    em_tensor *x = em_arange(0, 4, 1, EM_F32, em_cpu()), *y = NULL;
    em_attr a = {.type = EM_ATTR_FLOAT, .v.f = 3};
    cr_assert_eq(em_op_call(op, (const em_tensor *const[]){x}, 1, &a, &y), EM_OK, "%s",
                 em_last_error());
    cr_expect_eq(em_test_at(y, 3), 9);
    em_scope_end();
}

/* EM_OP_CHANNELS_LAST with layout_arg: the outputs take the layout of the input the schema
 * names (max_pool2d_backward's indices), not input 0's; a layout_arg that names no input is
 * refused, and a schema shorter than the field follows input 0. The kernel fills its dense
 * output (any order) with 1. */
static em_status fill_one_kernel(const em_kernel_ctx *k) {
    float *y = k->out[0].data;
    for (int64_t i = 0; i < k->out[0].numel; i++) y[i] = 1;
    return EM_OK;
}

static const em_op *declare_follow(const char *name, int layout_arg, size_t size) {
    em_op_schema s = {.struct_size = size, .name = name, .n_inputs = 2, .n_outputs = 1,
                      .dispatch_arg = 0, .flags = EM_OP_NONDIFF | EM_OP_CHANNELS_LAST,
                      .infer = em_test_infer_same, .layout_arg = layout_arg};
    const em_op *op = NULL;
    if (em_op_declare(em_registry_program(), &s, &op) != EM_OK) return NULL;
    em_kernel_def k = {.struct_size = sizeof k, .op = name, .device_type = "cpu",
                       .dtype = EM_F32, .fn = fill_one_kernel, .name = name};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                 em_last_error());
    return op;
}

Test(dispatch, channels_last_outputs_follow_the_schemas_layout_arg) {
    cr_assert_null(declare_follow("test.follow_bad", 2, sizeof(em_op_schema)));
    em_assert_error(EM_ERR_INVALID, "layout_arg");
    cr_assert(strstr(em_last_error(), "test.follow_bad"), "%s", em_last_error());
    cr_assert_null(declare_follow("test.follow_neg", -1, sizeof(em_op_schema)));
    em_assert_error(EM_ERR_INVALID, "layout_arg");
    const em_op *f1 = declare_follow("test.follow1", 1, sizeof(em_op_schema));
    const em_op *f0 = declare_follow("test.follow0", 1, offsetof(em_op_schema, layout_arg));
    cr_assert(f1 && f0, "%s", em_last_error());
    cr_expect_eq(em_op_schema_of(f1)->layout_arg, 1);
    cr_expect_eq(em_op_schema_of(f0)->layout_arg, 0, "a shorter schema follows input 0");
    em_scope_begin();
    const int64_t sh[4] = {2, 3, 4, 5};
    em_tensor *plain = em_zeros(4, sh, EM_F32, em_cpu()), *cl = em_channels_last(plain);
    cr_assert(cl && em_tensor_is_channels_last(cl), "%s", em_last_error());
    const struct { const em_op *op; em_tensor *a, *b; bool want; } cs[] = {
        {f1, plain, cl, true}, {f1, cl, plain, false}, {f0, cl, plain, true},
        {f0, plain, cl, false}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        em_tensor *y = NULL;
        cr_assert_eq(em_op_call(cs[i].op, (const em_tensor *const[]){cs[i].a, cs[i].b}, 2, NULL,
                                &y), EM_OK, "%s", em_last_error());
        cr_expect_eq(em_tensor_is_channels_last(y), cs[i].want, "case %zu", i);
        cr_expect_eq(em_tensor_is_contiguous(y), !cs[i].want, "case %zu", i);
        cr_expect_eq(em_item(em_sum(y, 0, NULL, false)), 120, "case %zu", i);
    }
    em_scope_end();
}

/* A program-declared composite with variadic outputs, run by name with em_op_call_n: written
 * with the public ops in a scope of its own, it retains what it returns (the contract of
 * em_composite_fn). */
static em_status halves(const em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)n_in, (void)attrs;
    int n = 0;
    em_scope_begin();
    em_status st = em_split(in[0], (em_tensor_size(in[0], 0) + 1) / 2, 0, cap, out, &n);
    for (int i = 0; st == EM_OK && i < n; i++) em_tensor_retain(out[i]);
    em_scope_end();
    if (st == EM_OK) *n_out = n;
    return st;
}

Test(dispatch, a_composite_with_variadic_outputs) {
    em_op_schema s = {.struct_size = sizeof s, .name = "test.halves", .n_inputs = 1,
                      .n_outputs = 1, .flags = EM_OP_VARIADIC_OUTPUTS, .composite = halves};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    em_scope_begin();
    em_tensor *x = em_arange(0, 6, 1, EM_F32, em_cpu()), *out[4] = {0}, *one = NULL;
    int n = 0;
    cr_assert_eq(em_op_call_n(op, (const em_tensor *const[]){x}, 1, NULL, out, 4, &n), EM_OK,
                 "%s", em_last_error());
    cr_expect_eq(n, 2);
    cr_expect_eq(em_test_at(out[1], 0), 3);
    cr_expect_eq(em_op_call(op, (const em_tensor *const[]){x}, 1, NULL, &one), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "run it with em_op_call_n");
    em_scope_end();
}

/* ember/op_helpers.h: the iterator's offsets are the strided offsets of each linear index, for
 * transposed, expanded and 0-dim tensors; em_infer_broadcast names every shape. */
Test(dispatch, op_helpers_iterate_and_broadcast) {
    em_ktensor a = {.ndim = 3, .numel = 24, .shape = {2, 3, 4}, .strides = {1, 8, 2}};
    em_ktensor b = {.ndim = 3, .numel = 24, .shape = {2, 3, 4}, .strides = {0, 4, 1}};
    em_ktensor c = {.ndim = 3, .numel = 24, .shape = {2, 3, 4}, .strides = {12, 4, 1}};
    const em_ktensor *ts[3] = {&a, &b, &c};
    em_kiter it;
    int64_t lin = 0;
    for (em_kiter_init(&it, 3, ts); em_kiter_more(&it); em_kiter_next(&it), lin++) {
        cr_expect_eq(it.off[0], em_ktensor_offset(&a, lin), "a at %lld", (long long)lin);
        cr_expect_eq(it.off[1], em_ktensor_offset(&b, lin), "b at %lld", (long long)lin);
        cr_expect_eq(it.off[2], lin);
    }
    cr_expect_eq(lin, 24);
    em_ktensor z = {.ndim = 0, .numel = 1};
    const em_ktensor *zs[1] = {&z};
    int n = 0;
    for (em_kiter_init(&it, 1, zs); em_kiter_more(&it); em_kiter_next(&it)) n += it.off[0] == 0;
    cr_expect_eq(n, 1, "a 0-dim tensor has one element");
    em_scope_begin();
    em_tensor *x = em_zeros(2, (int64_t[]){2, 1}, EM_F32, em_cpu()),
              *y = em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu()),
              *w = em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu());
    int nd;
    int64_t shape[EM_MAX_DIMS];
    cr_assert_eq(em_broadcast_shapes("t", (const em_tensor *const[]){x, y}, 2, &nd, shape), EM_OK);
    cr_expect(nd == 2 && shape[0] == 2 && shape[1] == 3);
    cr_expect_eq(em_broadcast_shapes("t", (const em_tensor *const[]){x, y, w}, 3, &nd, shape),
                 EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "t: shapes [2, 1], [3] and [2] cannot be broadcast (dim -1: 3 vs 2)");
    em_scope_end();
}

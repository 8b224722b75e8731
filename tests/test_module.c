/*
 * test_module.c — the module class registry and instances, driven by classes this test
 * registers itself through em_registry_program() (the core's part, independent of
 * ember-layers): registration errors, option errors naming the class, members and names,
 * state-dict keys and load_state_dict, train/eval, zero_grad, freeze, hooks, apply, to_dtype,
 * the summary text, and torch.nn.init (fans, bounds and moments, Philox determinism).
 */
#define _GNU_SOURCE /* open_memstream */
#include <stdio.h>

#include "common.h"

TestSuite(module, .init = em_test_setup, .fini = em_test_teardown);

/* ---- test classes --------------------------------------------------------------------------- */

/* "test.Scale": y = x * w, w of n ones; buffers count (persistent), scratch (not). */
static const em_option_spec scale_opts[] = {
    {.name = "n", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1000, .help = "size of the last dim"},
    {.name = "init", .types = EM_OPT_FLOAT, .def = {.f = 1.0}},
};
static int scale_frees;
static em_status scale_init(em_module *m, const em_options *o) {
    int64_t n = em_options_int(o, "n");
    em_tensor *w = em_full(1, &n, em_options_float(o, "init"), EM_F32, em_cpu());
    em_status st = em_module_add_parameter(m, "w", w);
    if (st == EM_OK)
        st = em_module_add_buffer(m, "count", em_zeros(0, NULL, EM_I64, em_cpu()), true);
    if (st == EM_OK)
        st = em_module_add_buffer(m, "scratch", em_zeros(1, &n, EM_F32, em_cpu()), false);
    return st;
}
static em_tensor *scale_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_mul(in[0], em_module_parameter(m, "w"));
}
static void scale_free(em_module *m) {
    (void)m;
    scale_frees++;
}
static const em_module_class scale_class = {
    .struct_size = sizeof(em_module_class), .name = "test.Scale", .description = "x * w",
    .options = scale_opts, .n_options = 2, .init = scale_init, .forward = scale_forward,
    .free = scale_free, .n_inputs = 1,
};

/* "test.Chain": children applied in order (a minimal Sequential of the test's own). */
static em_tensor *chain_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    em_tensor *x = in[0];
    for (size_t i = 0; i < em_module_child_count(m) && x; i++)
        x = em_module_forward(em_module_child_at(m, i, NULL), x);
    return x == in[0] ? em_tensor_retain(x) : x;
}
static const em_module_class chain_class = {
    .struct_size = sizeof(em_module_class), .name = "test.Chain", .forward = chain_forward,
    .n_inputs = 1,
};

/* "test.Fails": init fails after adding a parameter. */
static em_status fails_init(em_module *m, const em_options *o) {
    (void)o;
    em_module_add_parameter(m, "p", em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu()));
    return em_set_error(EM_ERR_INVALID, "the test class always fails");
}
static const em_module_class fails_class = {
    .struct_size = sizeof(em_module_class), .name = "test.Fails", .init = fails_init,
    .forward = scale_forward, .n_inputs = 1,
};

static void register_test_classes(void) {
    em_registry *r = em_registry_program();
    cr_assert_eq(em_module_class_register(r, &scale_class), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_module_class_register(r, &chain_class), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_module_class_register(r, &fails_class), EM_OK, "%s", em_last_error());
}

static em_module *scale(int64_t n) {
    em_options *o = em_options_new();
    em_options_set_int(o, "n", n);
    em_module *m = em_module_new("test.Scale", o);
    em_options_free(o);
    cr_assert(m, "%s", em_last_error());
    return m;
}

/* Chain(Scale(3), Chain(Scale(3), Scale(3))) */
static em_module *tree(void) {
    em_module *root = em_module_new("test.Chain", NULL);
    em_module *inner = em_module_new("test.Chain", NULL);
    cr_assert(root && inner);
    cr_assert_eq(em_module_append_child(root, scale(3)), EM_OK);
    cr_assert_eq(em_module_append_child(inner, scale(3)), EM_OK);
    cr_assert_eq(em_module_add_child(inner, "fc", scale(3)), EM_OK);
    cr_assert_eq(em_module_add_child(root, "body", inner), EM_OK);
    return root;
}

/* ---- registry ------------------------------------------------------------------------------- */

Test(module, register_find_and_errors) {
    register_test_classes();
    cr_assert_eq(em_module_class_find("test.Scale"), em_module_class_find("test.Scale"));
    cr_assert_str_eq(em_module_class_find("test.Scale")->name, "test.Scale");
    cr_assert_eq(em_module_class_register(em_registry_program(), &scale_class), EM_ERR_EXISTS);
    em_assert_error(EM_ERR_EXISTS, "'test.Scale' is already registered (by <program>)");

    em_module_class bad = scale_class;
    bad.name = "bad name";
    cr_assert_eq(em_module_class_register(em_registry_program(), &bad), EM_ERR_INVALID);
    bad.name = "test.NoForward";
    bad.forward = NULL;
    cr_assert_eq(em_module_class_register(em_registry_program(), &bad), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "has no forward");

    cr_assert_null(em_module_class_find("test.Scal"));
    em_assert_error(EM_ERR_NOTFOUND, "no module class named 'test.Scal' (did you mean "
                    "'test.Scale'?)");
    cr_assert_null(em_module_new("test.Nothing", NULL));
    em_assert_error(EM_ERR_NOTFOUND, "no module class named 'test.Nothing'");
    /* a class that may live in a plugin not loaded: the message says where plugins come from */
    em_assert_error(EM_ERR_NOTFOUND, "add its file or directory to EMBER_PLUGIN_PATH");

    /* the program's registry lists them, and em_plugins lists the program */
    const em_registry *r = em_registry_program();
    cr_assert_eq(em_registry_module_class_count(r), 3);
    cr_assert_str_eq(em_registry_module_class_name(r, 0), "test.Scale");
    cr_assert_str_eq(em_registry_module_class_name(r, 2), "test.Fails");
    cr_assert_null(em_registry_module_class_name(r, 3));
    bool listed = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        cr_assert_eq(em_plugin_get(i, &info), EM_OK);
        listed |= info.registry == r;
    }
    cr_assert(listed);
}

Test(module, classes_withdrawn_at_shutdown) {
    register_test_classes();
    size_t n = em_module_class_count();
    cr_assert_geq(n, 3);
    em_test_assert_clean_shutdown();
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_module_class_count(), n - 3, "the program's classes are gone after "
                 "em_shutdown");
    cr_assert_null(em_module_class_find("test.Scale"));
}

Test(module, options_errors_name_the_class) {
    register_test_classes();
    em_options *o = em_options_new();
    cr_assert_null(em_module_new("test.Scale", o));
    em_assert_error(EM_ERR_INVALID, "test.Scale: option 'n' is required");
    em_options_set_int(o, "n", 0);
    cr_assert_null(em_module_new("test.Scale", o));
    em_assert_error(EM_ERR_INVALID, "test.Scale: option 'n' = 0: out of range; expected an int "
                    "in [1, 1000] (size of the last dim)");
    em_options_set_int(o, "n", 2);
    em_options_set_text(o, "nn", "3", "model.yaml:3:7");
    cr_assert_null(em_module_new("test.Scale", o));
    em_assert_error(EM_ERR_INVALID, "model.yaml:3:7: test.Scale: unknown option 'nn' (did you "
                    "mean 'n'?)");
    em_options_free(o);

    /* a failing init: the message names the class, the partial module is freed */
    cr_assert_null(em_module_new("test.Fails", NULL));
    em_assert_error(EM_ERR_INVALID, "test.Fails: the test class always fails");
}

/* ---- members and the tree ------------------------------------------------------------------ */

Test(module, members_and_state_dict_keys) {
    register_test_classes();
    scale_frees = 0;
    em_module *m = tree();
    em_dict *sd = em_module_state_dict(m);
    const char *want[] = {"0.w", "0.count", "body.0.w", "body.0.count", "body.fc.w",
                          "body.fc.count"};
    cr_assert_eq(em_dict_len(sd), 6);
    for (size_t i = 0; i < 6; i++)
        cr_assert_str_eq(em_dict_key(sd, i), want[i]);
    em_dict_free(sd);

    em_dict *np = em_module_named_parameters(m, false);
    cr_assert_eq(em_dict_len(np), 3);
    cr_assert_str_eq(em_dict_key(np, 2), "body.fc.w");
    /* live tensors, tagged and requiring grad */
    em_tensor *w = em_dict_value(np, 0);
    cr_assert_eq(w, em_module_parameter(em_module_child(m, "0"), "w"));
    cr_assert(em_tensor_requires_grad(w));
    cr_assert_eq(em_tensor_category(w), EM_MEM_PARAMETER);
    em_dict_free(np);
    cr_assert_eq(em_module_parameter_count(m, false), 9);

    /* name rules */
    em_scope_begin();
    em_module *c = em_module_child(m, "0");
    cr_assert_eq(em_module_add_parameter(c, "w", em_zeros(1, (int64_t[]){1}, EM_F32, em_cpu())),
                 EM_ERR_EXISTS);
    em_assert_error(EM_ERR_EXISTS, "test.Scale: cannot add parameter 'w': a parameter of that "
                    "name exists");
    cr_assert_eq(em_module_add_buffer(c, "a.b", em_zeros(0, NULL, EM_F32, em_cpu()), true),
                 EM_ERR_INVALID);
    cr_assert_eq(em_module_add_child(m, "body", scale(1)), EM_ERR_EXISTS);
    em_tensor *ints = em_zeros(1, (int64_t[]){2}, EM_I64, em_cpu());
    cr_assert_eq(em_module_add_parameter(c, "i", ints), EM_ERR_DTYPE);
    em_scope_end();
    cr_assert_null(em_module_child_at(m, 2, NULL));
    em_module_free(m);
    cr_assert_eq(scale_frees, 4, "free ran for every Scale (3 in the tree, 1 refused child)");
}

Test(module, forward_train_eval_zero_grad) {
    register_test_classes();
    em_module *m = tree();
    em_scope_begin();
    em_tensor *x = em_test_tensor(EM_F32, 2, (int64_t[]){2, 3},
                                  (double[]){1, 2, 3, 4, 5, 6});
    em_tensor *y = em_module_forward(m, x);
    cr_assert(y, "%s", em_last_error());
    cr_assert_float_eq(em_test_at(y, 5), 6.0, 1e-6);
    cr_assert_eq(em_backward(em_sum(y, 0, NULL, false)), EM_OK, "%s", em_last_error());
    em_tensor *w0 = em_module_parameter(em_module_child(m, "0"), "w");
    cr_assert(em_tensor_grad(w0));
    cr_assert_float_eq(em_test_at(em_tensor_grad(w0), 0), 5.0, 1e-6); /* 1 + 4 */
    em_module_zero_grad(m);
    cr_assert_null(em_tensor_grad(w0));

    /* a wrong number of inputs */
    em_tensor *two[2] = {x, x};
    cr_assert_null(em_module_forward_n(m, two, 2));
    em_assert_error(EM_ERR_INVALID, "test.Chain: forward takes 1 input, got 2");
    /* an op error inside is prefixed with the class */
    em_tensor *bad = em_zeros(2, (int64_t[]){2, 4}, EM_F32, em_cpu());
    cr_assert_null(em_module_forward(m, bad));
    cr_assert(strstr(em_last_error(), "test.Chain: test.Scale: "), "%s", em_last_error());

    cr_assert(em_module_training(m));
    em_module_train(m, false);
    cr_assert(!em_module_training(em_module_child(em_module_child(m, "body"), "fc")));
    em_scope_end();
    em_module_free(m);
}

Test(module, forward_returns_a_reference_without_scope) {
    register_test_classes();
    em_module *m = scale(2);
    em_tensor *x = em_ones(1, (int64_t[]){2}, EM_F32, em_cpu());
    em_tensor *y = em_module_forward(m, x);
    cr_assert(y, "%s", em_last_error());
    em_module *c = em_module_new("test.Chain", NULL); /* empty: retains its input */
    em_tensor *z = em_module_forward(c, x);
    cr_assert_eq(z, x);
    em_tensor_release(z);
    em_tensor_release(y);
    em_tensor_release(x);
    em_module_free(c);
    em_module_free(m);
}

Test(module, freeze_by_prefix) {
    register_test_classes();
    em_module *m = tree();
    int n = -1;
    cr_assert_eq(em_module_freeze(m, "body", true, &n), EM_OK, "%s", em_last_error());
    cr_assert_eq(n, 2);
    cr_assert_eq(em_module_parameter_count(m, true), 3);
    em_dict *t = em_module_named_parameters(m, true);
    cr_assert_eq(em_dict_len(t), 1);
    cr_assert_str_eq(em_dict_key(t, 0), "0.w");
    em_dict_free(t);
    /* a parameter by its full name; "bod" is not a path prefix */
    cr_assert_eq(em_module_freeze(m, "body.fc.w", false, &n), EM_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(em_module_freeze(m, "bod", true, &n), EM_ERR_NOTFOUND);
    em_assert_error(EM_ERR_NOTFOUND, "parameters: 0.w, body.0.w, body.fc.w");
    cr_assert_eq(em_module_freeze(m, "", true, &n), EM_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(em_module_parameter_count(m, true), 0);
    /* a frozen model's forward does not require grad */
    em_scope_begin();
    em_tensor *y = em_module_forward(m, em_ones(1, (int64_t[]){3}, EM_F32, em_cpu()));
    cr_assert(y && !em_tensor_requires_grad(y));
    em_scope_end();
    em_module_free(m);
}

/* ---- hooks ---------------------------------------------------------------------------------- */

typedef struct hook_log {
    int pre, post;
    double seen_sum;
} hook_log;

static em_status pre_hook(em_module *m, em_tensor *const *in, int n, void *user) {
    (void)m;
    hook_log *l = user;
    l->pre++;
    cr_assert_eq(n, 1);
    l->seen_sum += em_item(em_sum(in[0], 0, NULL, false));
    return EM_OK;
}
static em_tensor *post_hook(em_module *m, em_tensor *const *in, int n, const em_tensor *out,
                            void *user) {
    (void)m, (void)in, (void)n;
    hook_log *l = user;
    l->post++;
    return em_mul_scalar(out, 10.0); /* a replacement */
}
static em_tensor *keep_hook(em_module *m, em_tensor *const *in, int n, const em_tensor *out,
                            void *user) {
    (void)m, (void)in, (void)n, (void)out;
    ((hook_log *)user)->post++;
    return NULL;
}
static em_status failing_pre(em_module *m, em_tensor *const *in, int n, void *user) {
    (void)m, (void)in, (void)n, (void)user;
    return em_set_error(EM_ERR_STATE, "hook refused");
}

Test(module, forward_hooks) {
    register_test_classes();
    em_module *m = tree();
    em_module *fc = em_module_child(em_module_child(m, "body"), "fc");
    hook_log l = {0};
    cr_assert_eq(em_module_add_forward_pre_hook(fc, pre_hook, &l), EM_OK);
    cr_assert_eq(em_module_add_forward_hook(fc, post_hook, &l), EM_OK);
    cr_assert_eq(em_module_add_forward_hook(m, keep_hook, &l), EM_OK);
    em_scope_begin();
    em_tensor *x = em_full(1, (int64_t[]){3}, 2.0, EM_F32, em_cpu());
    em_tensor *y = em_module_forward(m, x);
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(l.pre, 1);
    cr_assert_eq(l.post, 2);
    cr_assert_float_eq(l.seen_sum, 6.0, 1e-6);
    cr_assert_float_eq(em_test_at(y, 0), 20.0, 1e-6, "the post-hook's replacement is used");
    cr_assert_eq(em_module_add_forward_pre_hook(m, failing_pre, NULL), EM_OK);
    cr_assert_null(em_module_forward(m, x));
    em_assert_error(EM_ERR_STATE, "test.Chain: hook refused");
    em_scope_end();
    em_module_free(m);
}

/* ---- apply, to_dtype, load_state_dict --------------------------------------------------------- */

static em_status count_paths(em_module *m, const char *path, void *user) {
    char *buf = user;
    strcat(buf, "[");
    strcat(buf, path);
    strcat(buf, ":");
    strcat(buf, em_module_class_of(m)->name);
    strcat(buf, "]");
    return EM_OK;
}

Test(module, apply_paths) {
    register_test_classes();
    em_module *m = tree();
    char buf[512] = "";
    cr_assert_eq(em_module_apply(m, count_paths, buf), EM_OK);
    cr_assert_str_eq(buf, "[:test.Chain][0:test.Scale][body:test.Chain][body.0:test.Scale]"
                          "[body.fc:test.Scale]");
    em_module_free(m);
}

Test(module, to_dtype_keeps_flags_and_grads) {
    register_test_classes();
    em_module *m = tree();
    em_scope_begin();
    cr_assert_eq(em_backward(em_sum(em_module_forward(m, em_ones(1, (int64_t[]){3}, EM_F32,
                                                                  em_cpu())), 0, NULL, false)),
                 EM_OK, "%s", em_last_error());
    em_scope_end();
    em_module_freeze(m, "body.fc", true, NULL);
    cr_assert_eq(em_module_to_dtype(m, EM_F64), EM_OK, "%s", em_last_error());
    em_dict *sd = em_module_state_dict(m);
    cr_assert_eq(em_tensor_dtype(em_dict_get(sd, "0.w")), EM_F64);
    cr_assert_eq(em_tensor_dtype(em_dict_get(sd, "0.count")), EM_I64, "integer buffers stay");
    cr_assert(em_tensor_requires_grad(em_dict_get(sd, "0.w")));
    cr_assert(!em_tensor_requires_grad(em_dict_get(sd, "body.fc.w")));
    em_tensor *g = em_tensor_grad(em_dict_get(sd, "0.w"));
    cr_assert(g);
    cr_assert_eq(em_tensor_dtype(g), EM_F64);
    cr_assert_eq(em_tensor_category(em_dict_get(sd, "0.w")), EM_MEM_PARAMETER);
    em_dict_free(sd);
    /* forward in f64 */
    em_scope_begin();
    em_tensor *y = em_module_forward(m, em_ones(1, (int64_t[]){3}, EM_F64, em_cpu()));
    cr_assert(y && em_tensor_dtype(y) == EM_F64, "%s", em_last_error());
    em_scope_end();
    cr_assert_eq(em_module_to_dtype(m, EM_I32), EM_ERR_DTYPE);
    cr_assert_eq(em_module_to_device(m, em_cpu()), EM_OK);
    em_module_free(m);
}

Test(module, load_state_dict_round_trip) {
    register_test_classes();
    em_module *a = tree(), *b = tree();
    em_scope_begin();
    em_dict *sa = em_module_state_dict(a);
    for (size_t i = 0; i < em_dict_len(sa); i++)
        if (em_tensor_dtype(em_dict_value(sa, i)) == EM_F32) {
            em_grad_mode_push(EM_GRAD_DISABLED);
            em_uniform_(em_dict_value(sa, i), -1, 1, NULL);
            em_grad_mode_pop();
        }
    cr_assert_eq(em_module_load_state_dict(b, sa, true, NULL), EM_OK, "%s", em_last_error());
    em_dict *sb = em_module_state_dict(b);
    for (size_t i = 0; i < em_dict_len(sa); i++) {
        cr_assert_neq(em_dict_value(sa, i), em_dict_value(sb, i));
        for (int64_t k = 0; k < em_tensor_numel(em_dict_value(sa, i)); k++)
            cr_assert_eq(em_test_at(em_dict_value(sa, i), k), em_test_at(em_dict_value(sb, i), k));
    }
    /* strict: a missing and an unexpected key, all named at once; nothing copied */
    em_dict *bad = em_dict_new();
    em_dict_set(bad, "0.w", em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu()));
    em_dict_set(bad, "extra", em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu()));
    em_load_report *rep = NULL;
    cr_assert_eq(em_module_load_state_dict(b, bad, true, &rep), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "1 unexpected key (extra)");
    cr_assert(strstr(em_last_error(), "missing keys") && strstr(em_last_error(), "0.count") &&
              strstr(em_last_error(), "body.0.w"), "%s", em_last_error());
    cr_assert_eq(em_load_report_count(rep, EM_LOAD_UNEXPECTED), 1);
    em_load_report_free(rep);
    cr_assert_neq(em_test_at(em_module_parameter(em_module_child(b, "0"), "w"), 0), 0.0);
    /* not strict: copies what matches and reports the rest */
    cr_assert_eq(em_module_load_state_dict(b, bad, false, &rep), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_test_at(em_module_parameter(em_module_child(b, "0"), "w"), 0), 0.0);
    cr_assert_gt(em_load_report_count(rep, EM_LOAD_MISSING), 0);
    em_load_report_free(rep);
    /* a shape mismatch, both shapes named; and a dtype conversion, reported */
    em_dict_set(bad, "0.w", em_zeros(1, (int64_t[]){4}, EM_F32, em_cpu()));
    cr_assert_eq(em_module_load_state_dict(b, bad, true, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "0.w: [3] in the target, [4] in the source");
    em_dict_set(bad, "0.w", em_zeros(1, (int64_t[]){3}, EM_F64, em_cpu()));
    cr_assert_eq(em_module_load_state_dict(b, bad, false, &rep), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_load_report_count(rep, EM_LOAD_DTYPE_CONVERTED), 1);
    em_load_report_free(rep);
    em_dict_free(bad);
    em_dict_free(sb);
    em_dict_free(sa);
    em_scope_end();
    em_module_free(a);
    em_module_free(b);
}

/* ---- summary -------------------------------------------------------------------------------- */

Test(module, summary_text) {
    register_test_classes();
    em_module *m = tree();
    em_module_freeze(m, "body.fc", true, NULL);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(em_module_summary(m, 2, (int64_t[]){4, 3}, f), EM_OK, "%s", em_last_error());
    fclose(f);
    cr_assert(strstr(text, "Layer (type)"), "%s", text);
    cr_assert(strstr(text, "test.Chain                               [4, 3]"), "%s", text);
    cr_assert(strstr(text, "  0 (test.Scale)"), "%s", text);
    cr_assert(strstr(text, "    fc (test.Scale)                      [4, 3]"), "%s", text);
    cr_assert(strstr(text, "Total params: 9\n"), "%s", text);
    cr_assert(strstr(text, "Trainable params: 6\n"), "%s", text);
    cr_assert(strstr(text, "Non-trainable params: 3\n"), "%s", text);
    cr_assert(strstr(text, "Input size (MB): 0.00"), "%s", text);
    free(text);
    /* a bad input shape: the forward's error */
    text = NULL;
    f = open_memstream(&text, &len);
    cr_assert_eq(em_module_summary(m, 2, (int64_t[]){4, 5}, f), EM_ERR_SHAPE);
    fclose(f);
    free(text);
    em_assert_error(EM_ERR_SHAPE, "module_summary: the forward pass on an input of shape [4, 5] "
                    "failed");
    em_module_free(m);
}

/* ---- init ----------------------------------------------------------------------------------- */

static void moments(const em_tensor *t, double *mean, double *var, double *maxabs) {
    int64_t n = em_tensor_numel(t);
    double s = 0, s2 = 0, mx = 0;
    em_scope_begin();
    em_tensor *d = em_to_dtype(t, EM_F64);
    const double *p = em_tensor_data(d);
    for (int64_t i = 0; i < n; i++) {
        s += p[i];
        s2 += p[i] * p[i];
        mx = fmax(mx, fabs(p[i]));
    }
    em_scope_end();
    *mean = s / (double)n;
    *var = s2 / (double)n - *mean * *mean;
    *maxabs = mx;
}

Test(module, fans_and_gains) {
    em_scope_begin();
    int64_t fi, fo;
    em_tensor *w = em_empty(4, (int64_t[]){16, 3, 5, 5}, EM_F32, em_cpu());
    cr_assert_eq(em_init_calculate_fans(w, &fi, &fo), EM_OK);
    cr_assert_eq(fi, 75);
    cr_assert_eq(fo, 400);
    cr_assert_eq(em_init_calculate_fans(em_empty(1, (int64_t[]){5}, EM_F32, em_cpu()), &fi, &fo),
                 EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "fewer than 2 dimensions");
    double g;
    cr_assert_eq(em_init_calculate_gain("relu", NAN, &g), EM_OK);
    cr_assert_float_eq(g, sqrt(2.0), 1e-15);
    cr_assert_eq(em_init_calculate_gain("leaky_relu", sqrt(5.0), &g), EM_OK);
    cr_assert_float_eq(g, sqrt(1.0 / 3.0), 1e-15);
    cr_assert_eq(em_init_calculate_gain("tanh", NAN, &g), EM_OK);
    cr_assert_float_eq(g, 5.0 / 3.0, 1e-15);
    cr_assert_eq(em_init_calculate_gain("swish", NAN, &g), EM_ERR_INVALID);
    em_scope_end();
}

Test(module, kaiming_uniform_a_sqrt5_bounds_and_variance) {
    em_scope_begin();
    em_tensor *w = em_empty(2, (int64_t[]){256, 300}, EM_F32, em_cpu());
    cr_assert_eq(em_init_kaiming_uniform_(w, sqrt(5.0), "fan_in", "leaky_relu", NULL), EM_OK,
                 "%s", em_last_error());
    double mean, var, mx, bound = 1.0 / sqrt(300.0);
    moments(w, &mean, &var, &mx);
    cr_assert_leq(mx, bound, "a value %g lies outside the bound %g", mx, bound);
    cr_assert_gt(mx, 0.99 * bound);
    cr_assert_lt(fabs(mean), 0.01 * bound);
    cr_assert_lt(fabs(var / (bound * bound / 3.0) - 1.0), 0.03, "variance %g vs %g", var,
                 bound * bound / 3.0);

    /* kaiming_normal (relu, fan_out) and xavier on a conv weight */
    em_tensor *c = em_empty(4, (int64_t[]){64, 32, 3, 3}, EM_F32, em_cpu());
    cr_assert_eq(em_init_kaiming_normal_(c, 0, "fan_out", "relu", NULL), EM_OK);
    moments(c, &mean, &var, &mx);
    double want = 2.0 / (64 * 9);
    cr_assert_lt(fabs(var / want - 1.0), 0.03, "kaiming_normal variance %g vs %g", var, want);
    cr_assert_eq(em_init_xavier_uniform_(c, 1.0, NULL), EM_OK);
    moments(c, &mean, &var, &mx);
    double a = sqrt(6.0 / (32 * 9 + 64 * 9));
    cr_assert_leq(mx, a);
    cr_assert_lt(fabs(var / (a * a / 3.0) - 1.0), 0.03);
    cr_assert_eq(em_init_xavier_normal_(c, 2.0, NULL), EM_OK);
    moments(c, &mean, &var, &mx);
    cr_assert_lt(fabs(var / (4.0 * 2.0 / (32 * 9 + 64 * 9)) - 1.0), 0.03);
    cr_assert_eq(em_init_kaiming_uniform_(c, 0, "fan_middle", "relu", NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "mode 'fan_middle' is not supported");

    /* zeros/ones, and a parameter that requires grad can be initialised */
    em_tensor *p = em_empty(1, (int64_t[]){4}, EM_F32, em_cpu());
    em_requires_grad_(p, true);
    cr_assert_eq(em_init_ones_(p), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_test_at(p, 3), 1.0);
    cr_assert_eq(em_init_zeros_(p), EM_OK);
    cr_assert_eq(em_test_at(p, 0), 0.0);
    em_scope_end();
}

Test(module, init_is_deterministic_from_the_philox_generator) {
    em_scope_begin();
    em_tensor *a = em_empty(2, (int64_t[]){10, 10}, EM_F32, em_cpu());
    em_tensor *b = em_empty(2, (int64_t[]){10, 10}, EM_F32, em_cpu());
    em_seed(1234);
    em_init_kaiming_uniform_(a, sqrt(5.0), NULL, NULL, NULL);
    em_seed(1234);
    em_init_kaiming_uniform_(b, sqrt(5.0), NULL, NULL, NULL);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(em_test_at(a, i), em_test_at(b, i));
    em_generator *g = em_generator_new(1234);
    em_init_kaiming_uniform_(b, sqrt(5.0), NULL, NULL, g);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(em_test_at(a, i), em_test_at(b, i), "an explicit generator of the same seed");
    em_generator_free(g);
    em_scope_end();
}

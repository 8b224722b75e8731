/*
 * test_sdk.c — the SDK's worked example plugin (sdk/example/square.c) loads through
 * EMBER_PLUGIN_PATH and its op "square" computes x * x on contiguous and strided tensors,
 * checked against a plain loop; its backward against f64 finite differences and 2 * x * g;
 * its layer square.Quadratic (options, parameters, a buffer, train/eval) against plain loops,
 * with PyTorch-style state-dict names inside a Sequential. The C++ example
 * (sdk/example/softsign.cpp, built with g++) loads from the same directory: its op against a
 * plain loop and finite differences.
 */
#include "common.h"

static void sdk_setup(void) {
    const char *dir = getenv("EMBER_TEST_SDK_DIR");
    cr_assert(dir, "EMBER_TEST_SDK_DIR is not set (run through `make check`)");
    cr_assert_eq(setenv("EMBER_PLUGIN_PATH", dir, 1), 0);
    em_test_setup();
}

static void sdk_teardown(void) {
    em_test_teardown();
    unsetenv("EMBER_PLUGIN_PATH");
}

TestSuite(sdk, .init = sdk_setup, .fini = sdk_teardown);

/* x as f64 values in C order. */
static void host_values(const em_tensor *t, double *buf, int64_t n) {
    em_tensor *d = em_to_dtype(t, EM_F64);
    cr_assert(d, "to_dtype: %s", em_last_error());
    cr_assert_eq(em_tensor_numel(d), n);
    cr_assert_eq(em_tensor_to_host(d, buf, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    em_tensor_release(d);
}

/* Run square on x and compare with the loop y[i] = x[i] * x[i] over x's values in C order. */
static void check_square(const em_tensor *x) {
    const em_op *sq = em_op_find("square");
    cr_assert(sq, "op square not found: %s", em_last_error());
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(sq, (const em_tensor *const[]){x}, 1, NULL, &y), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_tensor_dtype(y), em_tensor_dtype(x));
    cr_assert_eq(em_tensor_ndim(y), em_tensor_ndim(x));
    for (int d = 0; d < em_tensor_ndim(x); d++)
        cr_assert_eq(em_tensor_size(y, d), em_tensor_size(x, d));
    int64_t n = em_tensor_numel(x);
    double xs[64], ys[64];
    cr_assert(n <= 64);
    host_values(x, xs, n);
    host_values(y, ys, n);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(ys[i], xs[i] * xs[i], "element %lld: %g, expected %g", (long long)i,
                     ys[i], xs[i] * xs[i]);
    em_tensor_release(y);
}

/* A (3, 4) tensor holding -5.5, -4.5, ..., 5.5 (exact in f32 and f64, and so are squares). */
static em_tensor *make_x(em_dtype dt) {
    double v[12];
    for (int i = 0; i < 12; i++) v[i] = i - 5.5;
    return em_test_tensor(dt, 2, (int64_t[]){3, 4}, v);
}

Test(sdk, plugin_is_listed_as_loaded) {
    bool found = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info p;
        cr_assert_eq(em_plugin_get(i, &p), EM_OK);
        if (!p.name || strcmp(p.name, "ember-square") != 0) continue;
        found = true;
        cr_assert_eq(p.status, EM_PLUGIN_LOADED, "refused: %s", p.reason ? p.reason : "");
        cr_assert_eq(em_registry_op_count(p.registry), 1);
        cr_assert_str_eq(em_registry_op_name(p.registry, 0), "square");
        cr_assert_eq(em_registry_kernel_count(p.registry), 2);
        cr_assert_eq(em_registry_class_count(p.registry, "module"), 1);
    }
    cr_assert(found, "ember-square is not among the %zu plugins", em_plugin_count());
}

Test(sdk, contiguous_f32) {
    em_tensor *x = make_x(EM_F32);
    cr_assert(em_tensor_is_contiguous(x));
    check_square(x);
    em_tensor_release(x);
}

Test(sdk, transposed_f64) {
    em_tensor *x = make_x(EM_F64);
    em_tensor *xt = em_transpose(x, 0, 1); /* (4, 3), strides (1, 4) */
    cr_assert(xt, "%s", em_last_error());
    cr_assert(!em_tensor_is_contiguous(xt));
    check_square(xt);
    em_tensor_release(xt);
    em_tensor_release(x);
}

Test(sdk, sliced_f32) {
    em_tensor *x = make_x(EM_F32);
    em_tensor *s = em_slice(x, 1, 1, 4, 2); /* columns 1 and 3: (3, 2), strides (4, 2) */
    cr_assert(s, "%s", em_last_error());
    check_square(s);
    em_tensor_release(s);
    em_tensor_release(x);
}

/* em_op_call_out into a transposed (strided) output: the kernel must follow y's strides. */
Test(sdk, strided_output) {
    const em_op *sq = em_op_find("square");
    cr_assert(sq, "%s", em_last_error());
    em_tensor *x = make_x(EM_F64);
    em_tensor *xt = em_transpose(x, 0, 1);                                     /* (4, 3) */
    em_tensor *base = em_zeros(2, (int64_t[]){3, 4}, EM_F64, em_cpu());        /* (3, 4) */
    em_tensor *yt = em_transpose(base, 0, 1);                                  /* (4, 3) */
    cr_assert(xt && base && yt, "%s", em_last_error());
    cr_assert_eq(em_op_call_out(sq, (const em_tensor *const[]){xt}, 1, NULL,
                                (em_tensor *const[]){yt}, 1), EM_OK, "%s", em_last_error());
    /* base[i][j] = yt[j][i] = xt[j][i]^2 = x[i][j]^2 */
    for (int64_t i = 0; i < 12; i++) {
        double xv = em_test_at(x, i), bv = em_test_at(base, i);
        cr_assert_eq(bv, xv * xv, "element %lld: %g, expected %g", (long long)i, bv, xv * xv);
    }
    em_tensor_release(yt);
    em_tensor_release(base);
    em_tensor_release(xt);
    em_tensor_release(x);
}

Test(sdk, integer_input_is_refused_by_name) {
    const em_op *sq = em_op_find("square");
    cr_assert(sq, "%s", em_last_error());
    em_tensor *x = em_test_tensor(EM_I32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(sq, (const em_tensor *const[]){x}, 1, NULL, &y), EM_ERR_DTYPE);
    cr_assert_null(y);
    em_assert_error(EM_ERR_DTYPE, "square");
    em_assert_error(EM_ERR_DTYPE, "int32");
    em_tensor_release(x);
}

/* ---- the derivative ----------------------------------------------------------------------- */

static em_tensor *f_square(em_tensor *const *in, int n, void *user) {
    (void)n;
    const em_tensor *x = in[0];
    if (user) x = em_transpose(in[0], 0, 1); /* a strided view inside the function */
    em_tensor *y = NULL;
    return em_op_call(em_op_find("square"), &x, 1, NULL, &y) == EM_OK ? y : NULL;
}

Test(sdk, backward_matches_finite_differences) {
    em_tensor *x = make_x(EM_F64);
    cr_assert_eq(em_requires_grad_(x, true), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_gradcheck(f_square, 1, &x, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_gradcheck(f_square, 1, &x, "transposed", 0, 0, 0), EM_OK, "%s",
                 em_last_error());
    em_tensor_release(x);
}

/* x.grad after backward(sum(g * square(x))) is 2 * x * g, element by element (f32). */
Test(sdk, backward_is_two_x_times_the_incoming_gradient) {
    em_tensor *x = make_x(EM_F32);
    double gv[12];
    for (int i = 0; i < 12; i++) gv[i] = 0.25 * (i % 5) - 0.5;
    em_tensor *g = em_test_tensor(EM_F32, 2, (int64_t[]){3, 4}, gv);
    cr_assert_eq(em_requires_grad_(x, true), EM_OK, "%s", em_last_error());
    em_scope_begin();
    em_tensor *y = f_square(&x, 1, NULL);
    cr_assert(y, "%s", em_last_error());
    cr_assert_str_eq(em_tensor_grad_fn_name(y), "square");
    cr_assert_eq(em_backward(em_sum(em_mul(y, g), 0, NULL, false)), EM_OK, "%s",
                 em_last_error());
    em_scope_end();
    const em_tensor *gx = em_tensor_grad(x);
    cr_assert(gx);
    for (int64_t i = 0; i < 12; i++) {
        double want = 2 * em_test_at(x, i) * gv[i];
        cr_assert_eq(em_test_at(gx, i), want, "element %lld: %g, expected %g", (long long)i,
                     em_test_at(gx, i), want);
    }
    em_tensor_release(g);
    em_tensor_release(x);
}

/* ---- the layer: square.Quadratic ------------------------------------------------------------ */

static em_module *quadratic(int64_t features, double momentum) {
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_int(o, "features", features), EM_OK);
    cr_assert_eq(em_options_set_float(o, "momentum", momentum), EM_OK);
    em_module *m = em_module_new("square.Quadratic", o);
    em_options_free(o);
    cr_assert(m, "%s", em_last_error());
    return m;
}

/* The forward by plain loops: y[i][j] = w[j] * (x[i][j]^2 - c[j]) + b[j], c the batch mean of
 * x^2 (train) or rm (eval); rm updated in train. */
static void quadratic_ref(const double *x, int64_t n, int64_t f, const double *w,
                          const double *b, double *rm, double momentum, bool train, double *y) {
    double c[8];
    for (int64_t j = 0; j < f; j++) {
        double m = 0;
        for (int64_t i = 0; i < n; i++) m += x[i * f + j] * x[i * f + j];
        m /= (double)n;
        c[j] = train ? m : rm[j];
        if (train) rm[j] = (1 - momentum) * rm[j] + momentum * m;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < f; j++)
            y[i * f + j] = w[j] * (x[i * f + j] * x[i * f + j] - c[j]) + b[j];
}

Test(sdk, layer_trains_and_evaluates_like_the_reference) {
    em_module *m = quadratic(4, 0.25);
    em_dict *sd = em_module_state_dict(m);
    cr_assert_eq(em_dict_len(sd), 3);
    cr_assert_str_eq(em_dict_key(sd, 0), "weight");
    cr_assert_str_eq(em_dict_key(sd, 1), "bias");
    cr_assert_str_eq(em_dict_key(sd, 2), "running_mean");
    em_dict_free(sd);
    cr_assert(em_tensor_requires_grad(em_module_parameter(m, "weight")));
    cr_assert(!em_tensor_requires_grad(em_module_buffer(m, "running_mean")));
    /* weights other than the initial ones, so that they show in the result */
    double w[4] = {1.5, -0.5, 2, 0.25}, b[4] = {0.1, 0.2, -0.3, 0.4}, rm[4] = {0, 0, 0, 0};
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_tensor *wt = em_test_tensor(EM_F32, 1, (int64_t[]){4}, w);
    em_tensor *bt = em_test_tensor(EM_F32, 1, (int64_t[]){4}, b);
    cr_assert_eq(em_copy_(em_module_parameter(m, "weight"), wt), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_copy_(em_module_parameter(m, "bias"), bt), EM_OK, "%s", em_last_error());
    em_grad_mode_pop();
    em_tensor_release(wt);
    em_tensor_release(bt);
    em_tensor *x = make_x(EM_F32); /* (3, 4) */
    double xv[12], want[12];
    host_values(x, xv, 12);
    for (int step = 0; step < 3; step++) { /* train, train, eval */
        bool train = step < 2;
        em_module_train(m, train);
        em_scope_begin();
        em_tensor *y = em_module_forward(m, x);
        cr_assert(y, "%s", em_last_error());
        quadratic_ref(xv, 3, 4, w, b, rm, 0.25, train, want);
        for (int64_t i = 0; i < 12; i++)
            cr_assert_float_eq(em_test_at(y, i), want[i], 1e-5, "step %d, element %lld: %g vs %g",
                               step, (long long)i, em_test_at(y, i), want[i]);
        em_scope_end();
        for (int64_t j = 0; j < 4; j++)
            cr_assert_float_eq(em_test_at(em_module_buffer(m, "running_mean"), j), rm[j], 1e-5,
                               "step %d, running_mean[%lld]", step, (long long)j);
    }
    /* a wrong input shape names the class and both shapes */
    em_tensor *bad = em_zeros(2, (int64_t[]){3, 5}, EM_F32, em_cpu());
    cr_assert_null(em_module_forward(m, bad));
    em_assert_error(EM_ERR_SHAPE, "square.Quadratic");
    em_assert_error(EM_ERR_SHAPE, "expected an input of shape (N, 4), got [3, 5]");
    em_tensor_release(bad);
    em_tensor_release(x);
    em_module_free(m);
}

/* Gradients through the layer (the plugin's backward inside it) reach the input and both
 * parameters, against f64 finite differences (the module moved to float64). */
static em_tensor *f_layer(em_tensor *const *in, int n, void *user) {
    (void)n;
    return em_module_forward((em_module *)user, in[0]);
}

Test(sdk, layer_gradients_match_finite_differences) {
    em_module *m = quadratic(4, 0.1);
    cr_assert_eq(em_module_to_dtype(m, EM_F64), EM_OK, "%s", em_last_error());
    em_module_train(m, false); /* eval: running_mean is a constant, forward is deterministic */
    em_tensor *x = make_x(EM_F64);
    cr_assert_eq(em_requires_grad_(x, true), EM_OK, "%s", em_last_error());
    em_tensor *in[3] = {x, em_module_parameter(m, "weight"), em_module_parameter(m, "bias")};
    cr_assert_eq(em_gradcheck(f_layer, 3, in, m, 0, 0, 0), EM_OK, "%s", em_last_error());
    em_module_train(m, true); /* train: the batch mean is part of the function too */
    cr_assert_eq(em_gradcheck(f_layer, 3, in, m, 0, 0, 0), EM_OK, "%s", em_last_error());
    em_tensor_release(x);
    em_module_free(m);
}

Test(sdk, layer_in_a_sequential_has_pytorch_state_dict_names) {
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_int(o, "in_features", 3), EM_OK);
    cr_assert_eq(em_options_set_int(o, "out_features", 4), EM_OK);
    em_module *seq = em_module_new("Sequential", NULL);
    cr_assert(seq, "%s", em_last_error());
    cr_assert_eq(em_module_append_child(seq, em_module_new("Linear", o)), EM_OK, "%s",
                 em_last_error());
    em_options_free(o);
    cr_assert_eq(em_module_append_child(seq, quadratic(4, 0.1)), EM_OK, "%s", em_last_error());
    em_dict *sd = em_module_state_dict(seq);
    const char *keys[] = {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean"};
    cr_assert_eq(em_dict_len(sd), 5);
    for (size_t i = 0; i < 5; i++) cr_assert_str_eq(em_dict_key(sd, i), keys[i]);
    em_dict_free(sd);
    em_module_free(seq);
}

Test(sdk, layer_options_are_checked_by_name) {
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_int(o, "features", 4), EM_OK);
    cr_assert_eq(em_options_set_float(o, "momentum", 2.0), EM_OK);
    cr_assert_null(em_module_new("square.Quadratic", o));
    em_assert_error(EM_ERR_INVALID, "square.Quadratic");
    em_assert_error(EM_ERR_INVALID, "momentum");
    em_options_free(o);
    cr_assert_null(em_module_new("square.Quadratic", NULL));
    em_assert_error(EM_ERR_INVALID, "features");
}

/* ---- the C++ example: ember-cxx-example ------------------------------------------------------ */

static em_tensor *f_softsign(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    const em_tensor *x = in[0];
    em_tensor *y = NULL;
    return em_op_call(em_op_find("cxx_example.softsign"), &x, 1, NULL, &y) == EM_OK ? y : NULL;
}

Test(sdk, cxx_plugin_loads_and_computes_softsign) {
    em_plugin_info p = {0};
    bool found = false;
    for (size_t i = 0; i < em_plugin_count() && !found; i++)
        found = em_plugin_get(i, &p) == EM_OK && p.name &&
                strcmp(p.name, "ember-cxx-example") == 0;
    cr_assert(found, "ember-cxx-example is not among the %zu plugins", em_plugin_count());
    cr_assert_eq(p.status, EM_PLUGIN_LOADED, "refused: %s", p.reason ? p.reason : "");
    const em_dtype dts[] = {EM_F32, EM_F64};
    for (size_t k = 0; k < 2; k++) {
        em_tensor *x = make_x(dts[k]);
        em_tensor *views[2] = {x, em_slice(x, 1, 1, 4, 2)};
        for (int v = 0; v < 2; v++) {
            em_tensor *y = f_softsign(&views[v], 1, NULL); /* outside a scope: ours to release */
            cr_assert(y, "%s", em_last_error());
            cr_assert_eq(em_tensor_dtype(y), dts[k]);
            int64_t n = em_tensor_numel(views[v]);
            double xs[12], ys[12];
            host_values(views[v], xs, n);
            host_values(y, ys, n);
            for (int64_t i = 0; i < n; i++) {
                double want = xs[i] / (1 + fabs(xs[i]));
                cr_assert_float_eq(ys[i], want, dts[k] == EM_F32 ? 1e-6 : 1e-15,
                                   "%s view %d element %lld: %g vs %g", em_dtype_name(dts[k]), v,
                                   (long long)i, ys[i], want);
            }
            em_tensor_release(y);
        }
        em_tensor_release(views[1]);
        em_tensor_release(x);
    }
    em_tensor *x = make_x(EM_F64);
    cr_assert_eq(em_requires_grad_(x, true), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_gradcheck(f_softsign, 1, &x, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    em_tensor_release(x);
    em_tensor *xi = em_zeros(1, (int64_t[]){3}, EM_I64, em_cpu());
    cr_assert_null(f_softsign(&xi, 1, NULL));
    em_assert_error(EM_ERR_DTYPE, "cxx_example.softsign: dtype int64 is not supported");
    em_tensor_release(xi);
}

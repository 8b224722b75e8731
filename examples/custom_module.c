/*
 * custom_module.c — a program that defines its own layer, with no .so to build: the C
 * equivalent of subclassing torch.nn.Module.
 *
 * It registers "example.Swish" (y = x * sigmoid(beta * x) with a learnable beta per feature)
 * in the program's registry, builds Sequential(Linear(4, 8), Swish(8), Linear(8, 1)) BY NAME
 * — the Swish exactly as the built-in layers — prints the summary and the state-dict keys,
 * then fits y = sum(x) for 200 SGD steps and checks that the loss fell and beta learned.
 * Exit status 0 when all of that holds (`make check` runs it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <ember/ember.h>

/* ---- the class ------------------------------------------------------------------------------ */

static const em_option_spec swish_opts[] = {
    {.name = "features", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e9, .help = "size of the last dim (one beta each)"},
    {.name = "beta", .types = EM_OPT_FLOAT, .def = {.f = 1.0}, .help = "initial beta"},
};

static em_status swish_init(em_module *m, const em_options *o) {
    int64_t n = em_options_int(o, "features");
    /* init runs in a scope of its own: the module keeps the reference it needs */
    em_tensor *beta = em_full(1, &n, em_options_float(o, "beta"), EM_F32, em_cpu());
    return em_module_add_parameter(m, "beta", beta);
}

static em_tensor *swish_forward(em_module *m, em_tensor *const *in, int n_in) {
    (void)n_in;
    em_tensor *x = in[0]; /* (N, features) */
    return em_mul(x, em_sigmoid(em_mul(x, em_module_parameter(m, "beta"))));
}

static const em_module_class swish_class = {
    .struct_size = sizeof(em_module_class),
    .name = "example.Swish",
    .description = "x * sigmoid(beta x), beta learned per feature",
    .options = swish_opts,
    .n_options = 2,
    .init = swish_init,
    .forward = swish_forward,
    .n_inputs = 1,
};

/* ---- using it -------------------------------------------------------------------------------- */

static em_module *layer(const char *cls, const char *k1, int64_t v1, const char *k2, int64_t v2) {
    em_options *o = em_options_new();
    if (k1) em_options_set_int(o, k1, v1);
    if (k2) em_options_set_int(o, k2, v2);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    if (!m) fprintf(stderr, "custom_module: %s\n", em_last_error());
    return m;
}

static int fail(const char *what) {
    fprintf(stderr, "custom_module: %s: %s\n", what, em_last_error());
    em_shutdown();
    return 1;
}

int main(void) {
    if (em_init() != EM_OK) return fail("em_init");
    if (em_module_class_register(em_registry_program(), &swish_class) != EM_OK)
        return fail("register");
    em_seed(0);

    em_module *net = em_module_new("Sequential", NULL);
    if (!net) return fail("Sequential");
    if (em_module_append_child(net, layer("Linear", "in_features", 4, "out_features", 8)) ||
        em_module_append_child(net, layer("example.Swish", "features", 8, NULL, 0)) ||
        em_module_append_child(net, layer("Linear", "in_features", 8, "out_features", 1)))
        return fail("building the model");

    if (em_module_summary(net, 2, (int64_t[]){32, 4}, stdout) != EM_OK) return fail("summary");
    em_dict *sd = em_module_state_dict(net);
    printf("state dict:");
    for (size_t i = 0; i < em_dict_len(sd); i++) printf(" %s", em_dict_key(sd, i));
    printf("\n");

    /* data: y = sum of the 4 inputs */
    em_tensor *x = em_empty(2, (int64_t[]){32, 4}, EM_F32, em_cpu());
    em_normal_(x, 0, 1, NULL);
    em_tensor *y = em_sum(x, 1, (int[]){1}, true); /* (32, 1) */
    em_options *lo = em_options_new();
    em_module *mse = em_module_new("MSELoss", lo);
    em_options_free(lo);
    if (!mse) return fail("MSELoss");

    em_dict *params = em_module_named_parameters(net, true);
    em_tensor *beta = em_dict_get(sd, "1.beta");
    double beta0 = 1.0, first = 0, last = 0;
    for (int step = 0; step < 200; step++) {
        em_scope_begin();
        em_tensor *pred = em_module_forward(net, x);
        em_tensor *loss = em_module_forward_n(mse, (em_tensor *[]){pred, y}, 2);
        if (!loss || em_backward(loss) != EM_OK) {
            em_scope_end();
            return fail("training step");
        }
        last = em_item(loss);
        if (step == 0) first = last;
        em_grad_mode_push(EM_GRAD_DISABLED); /* p -= 0.05 grad */
        for (size_t i = 0; i < em_dict_len(params); i++) {
            em_tensor *p = em_dict_value(params, i);
            em_sub_(p, em_mul_scalar(em_tensor_grad(p), 0.05));
        }
        em_grad_mode_pop();
        em_module_zero_grad(net);
        em_scope_end();
    }
    em_scope_begin();
    double beta_moved = fabs(em_item(em_sum(beta, 0, NULL, false)) / 8.0 - beta0);
    em_scope_end();
    printf("loss %.4f -> %.4f after 200 steps; mean |beta change| %.4f\n", first, last,
           beta_moved);
    int ok = last < 0.1 * first && beta_moved > 1e-4;

    em_dict_free(params);
    em_dict_free(sd);
    em_tensor_release(y);
    em_tensor_release(x);
    em_module_free(mse);
    em_module_free(net);
    /* Everything is released: a shutdown that finds anything still alive says what. */
    if (em_shutdown_checked() != EM_OK) {
        fprintf(stderr, "custom_module: %s\n", em_last_error());
        return 1;
    }
    if (!ok) fprintf(stderr, "custom_module: the model did not learn\n");
    return ok ? 0 : 1;
}

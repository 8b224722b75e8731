/*
 * test_optim.c — optimizers (plugins/optim) and the core's optimizer object (core/optim.c).
 *
 * References:
 *   - PyTorch 1.13's parameters after 10, 20, ..., 50 steps of every optimizer and flag
 *     combination, with one and with two parameter groups, from fixed gradient sequences
 *     (tests/fixtures/optim_fixtures.h, made by tests/fixtures/gen_optim.py); tolerance
 *     |got - want| <= 1e-5 + 1e-4 |want| (the allclose).
 *   - State dict round trip: 20 steps, save, load into a fresh optimizer over fresh
 *     parameters, 30 more steps: bitwise equal to 50 straight steps.
 *   - Clipping against a plain loop in double over the same gradients.
 *   - Errors: bad options, bad groups, bad state dicts, each naming what is wrong.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures/optim_fixtures.h"
#include "tests/common.h"

TestSuite(optim, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(optim_errors, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(clip, .init = em_test_setup, .fini = em_test_teardown);

static const char *const pnames[OPT_N_PARAMS] = {"w", "b", "v"};

/* Options from "key=value;key=value" text (NULL or "": empty bag). */
static em_options *opts_from(const char *text, char sep) {
    em_options *o = em_options_new();
    cr_assert(o);
    if (!text) return o;
    char *copy = strdup(text), *save = NULL, seps[2] = {sep, 0};
    for (char *kv = strtok_r(copy, seps, &save); kv; kv = strtok_r(NULL, seps, &save)) {
        char *eq = strchr(kv, '=');
        cr_assert(eq, "bad fixture option '%s'", kv);
        *eq = '\0';
        cr_assert_eq(em_options_set_text(o, kv, eq + 1, "fixture"), EM_OK, "%s", em_last_error());
    }
    free(copy);
    return o;
}

/* The three parameters (requires_grad leaves with the fixture's initial values). */
static void make_params(em_tensor **p) {
    int64_t off = 0;
    for (int i = 0; i < OPT_N_PARAMS; i++) {
        int64_t n = opt_ndim[i] == 2 ? opt_shape[i][0] * opt_shape[i][1] : opt_shape[i][0];
        p[i] = em_from_data(opt_init + off, opt_ndim[i], opt_shape[i], EM_F32, em_cpu());
        cr_assert(p[i], "%s", em_last_error());
        cr_assert_eq(em_requires_grad_(p[i], true), EM_OK);
        off += n;
    }
}

static em_optimizer *make_opt(const opt_case *c, em_tensor **p) {
    em_options *def = opts_from(c->defaults, ';');
    em_optimizer *o;
    if (!c->group0) {
        em_dict *d = em_dict_new();
        for (int i = 0; i < OPT_N_PARAMS; i++) em_dict_set(d, pnames[i], p[i]);
        o = em_optimizer_new(c->cls, d, def);
        em_dict_free(d);
    } else {
        em_dict *d0 = em_dict_new(), *d1 = em_dict_new();
        em_dict_set(d0, pnames[0], p[0]);
        em_dict_set(d0, pnames[1], p[1]);
        em_dict_set(d1, pnames[2], p[2]);
        em_options *g0 = opts_from(c->group0, ';'), *g1 = opts_from(c->group1, ';');
        em_param_group groups[2] = {{d0, g0}, {d1, g1}};
        o = em_optimizer_new_groups_defaults(c->cls, groups, 2, def);
        em_options_free(g0);
        em_options_free(g1);
        em_dict_free(d0);
        em_dict_free(d1);
    }
    em_options_free(def);
    cr_assert(o, "%s: %s", c->name, em_last_error());
    return o;
}

/* Set the grads of step `step` (parameter 2 has none when step % 7 == 3). */
static void set_grads(em_tensor **p, int step) {
    int64_t off = 0;
    for (int i = 0; i < OPT_N_PARAMS; i++) {
        int64_t n = em_tensor_numel(p[i]);
        if (i == 2 && step % 7 == 3) {
            cr_assert_eq(em_tensor_set_grad(p[i], NULL), EM_OK);
        } else {
            em_tensor *g = em_from_data(opt_grads[step] + off, opt_ndim[i], opt_shape[i], EM_F32,
                                        em_cpu());
            cr_assert_eq(em_tensor_set_grad(p[i], g), EM_OK, "%s", em_last_error());
        }
        off += n;
    }
}

static void flat_params(em_tensor **p, float *out) {
    int64_t off = 0;
    for (int i = 0; i < OPT_N_PARAMS; i++) {
        int64_t n = em_tensor_numel(p[i]);
        cr_assert_eq(em_tensor_to_host(p[i], out + off, sizeof(float) * (size_t)n), EM_OK);
        off += n;
    }
}

static void run_steps(em_optimizer *o, em_tensor **p, int from, int to, const opt_case *c) {
    for (int s = from; s < to; s++) {
        em_scope_begin();
        set_grads(p, s);
        cr_assert_eq(em_optimizer_step(o), EM_OK, "%s step %d: %s", c->name, s, em_last_error());
        em_scope_end();
        if (c && (s + 1) % OPT_CHECK_EVERY == 0) {
            float got[OPT_NUMEL];
            flat_params(p, got);
            const float *want = c->want[(s + 1) / OPT_CHECK_EVERY - 1];
            for (int k = 0; k < OPT_NUMEL; k++)
                cr_assert(fabsf(got[k] - want[k]) <= 1e-5f + 1e-4f * fabsf(want[k]),
                          "%s: after step %d element %d is %.9g, PyTorch %.9g", c->name, s + 1,
                          k, got[k], want[k]);
        }
    }
}

Test(optim, parity_with_pytorch_every_optimizer_and_flag) {
    double worst = 0;
    for (size_t ci = 0; ci < sizeof opt_cases / sizeof opt_cases[0]; ci++) {
        const opt_case *c = &opt_cases[ci];
        em_scope_begin();
        em_tensor *p[OPT_N_PARAMS];
        make_params(p);
        em_optimizer *o = make_opt(c, p);
        run_steps(o, p, 0, OPT_STEPS, c);
        float got[OPT_NUMEL];
        flat_params(p, got);
        for (int k = 0; k < OPT_NUMEL; k++) {
            double w = c->want[OPT_STEPS / OPT_CHECK_EVERY - 1][k];
            double d = fabs(got[k] - w) / (1e-5 + 1e-4 * fabs(w));
            if (d > worst) worst = d;
        }
        /* State is kept per parameter, tagged as optimizer memory. */
        em_tensor *st = NULL;
        const char *probe = strcmp(c->cls, "SGD") == 0 ? "momentum_buffer"
                            : strcmp(c->cls, "RMSprop") == 0 ? "square_avg"
                            : strcmp(c->cls, "Adagrad") == 0 ? "sum" : "exp_avg";
        st = em_optimizer_state(o, 0, probe);
        if (strcmp(c->cls, "SGD") != 0 || strstr(c->defaults, "momentum")) {
            cr_assert(st, "%s: no %s state", c->name, probe);
            cr_assert_eq(em_tensor_category(st), EM_MEM_OPTIMIZER);
        }
        cr_assert_eq(em_optimizer_steps(o), OPT_STEPS);
        em_optimizer_free(o);
        em_scope_end();
    }
    /* Worst error as a fraction of the tolerance (printed for the report, not asserted). */
    cr_log_info("optimizer parity: worst |got - want| / (atol + rtol |want|) = %.3g", worst);
}

Test(optim, per_parameter_step_counts_skip_params_without_grad) {
    em_tensor *p[OPT_N_PARAMS];
    em_scope_begin();
    make_params(p);
    const opt_case *c = &opt_cases[0];
    for (size_t ci = 0; ci < sizeof opt_cases / sizeof opt_cases[0]; ci++)
        if (strcmp(opt_cases[ci].name, "adam") == 0) c = &opt_cases[ci];
    em_optimizer *o = make_opt(c, p);
    run_steps(o, p, 0, 10, NULL);
    /* Parameter 2 had no grad at step 3: 9 steps, the others 10. */
    cr_assert_float_eq(em_item(em_optimizer_state(o, 0, "step")), 10.0, 0);
    cr_assert_float_eq(em_item(em_optimizer_state(o, 2, "step")), 9.0, 0);
    em_optimizer_free(o);
    em_scope_end();
}

Test(optim, state_dict_round_trip_equals_straight_run) {
    for (size_t ci = 0; ci < sizeof opt_cases / sizeof opt_cases[0]; ci++) {
        const opt_case *c = &opt_cases[ci];
        em_scope_begin();
        /* Straight 50 steps. */
        em_tensor *a[OPT_N_PARAMS];
        make_params(a);
        em_optimizer *oa = make_opt(c, a);
        run_steps(oa, a, 0, OPT_STEPS, NULL);
        float straight[OPT_NUMEL];
        flat_params(a, straight);
        em_optimizer_free(oa);

        /* 20 steps, save, then a fresh optimizer over fresh parameters with those values. */
        em_tensor *b[OPT_N_PARAMS], *fresh[OPT_N_PARAMS];
        make_params(b);
        em_optimizer *ob = make_opt(c, b);
        run_steps(ob, b, 0, 20, NULL);
        em_dict *tensors = NULL;
        char *json = NULL;
        cr_assert_eq(em_optimizer_state_dict(ob, &tensors, &json), EM_OK, "%s", em_last_error());
        make_params(fresh);
        em_grad_mode_push(EM_GRAD_DISABLED);
        for (int i = 0; i < OPT_N_PARAMS; i++) cr_assert_eq(em_copy_(fresh[i], b[i]), EM_OK);
        em_grad_mode_pop();
        em_optimizer_free(ob);
        em_optimizer *oc = make_opt(c, fresh);
        cr_assert_eq(em_optimizer_load_state_dict(oc, tensors, json), EM_OK, "%s: %s", c->name,
                     em_last_error());
        /* The loaded state is a copy: freeing the saved dict leaves the optimizer whole. */
        em_dict_free(tensors);
        em_host_free(json);
        cr_assert_eq(em_optimizer_steps(oc), 20);
        run_steps(oc, fresh, 20, OPT_STEPS, NULL);
        float resumed[OPT_NUMEL];
        flat_params(fresh, resumed);
        cr_assert(memcmp(straight, resumed, sizeof straight) == 0,
                  "%s: resumed run differs from the straight one", c->name);
        em_optimizer_free(oc);
        em_scope_end();
    }
}

Test(optim, state_dict_json_names_groups_options_and_params) {
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    make_params(p);
    const opt_case *c = NULL;
    for (size_t ci = 0; ci < sizeof opt_cases / sizeof opt_cases[0]; ci++)
        if (strcmp(opt_cases[ci].name, "adam_groups") == 0) c = &opt_cases[ci];
    em_optimizer *o = make_opt(c, p);
    run_steps(o, p, 0, 3, NULL);
    em_dict *t = NULL;
    char *json = NULL;
    cr_assert_eq(em_optimizer_state_dict(o, &t, &json), EM_OK);
    cr_assert(strstr(json, "\"class\":\"Adam\""), "%s", json);
    cr_assert(strstr(json, "\"steps\":3"), "%s", json);
    cr_assert(strstr(json, "\"params\":[0,1]"), "%s", json);
    cr_assert(strstr(json, "\"params\":[2]"), "%s", json);
    cr_assert(strstr(json, "\"param_names\":[\"w\",\"b\"]"), "%s", json);
    cr_assert(strstr(json, "\"lr\":0.029999999999999999") || strstr(json, "\"lr\":0.03"), "%s",
              json);
    cr_assert(em_dict_get(t, "state.0.exp_avg") && em_dict_get(t, "state.2.exp_avg_sq") &&
              em_dict_get(t, "state.1.step"));
    em_dict_free(t);
    em_host_free(json);
    em_optimizer_free(o);
    em_scope_end();
}

Test(optim, zero_grad_lr_and_accessors) {
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    make_params(p);
    em_optimizer *o = make_opt(&opt_cases[0], p);
    set_grads(p, 0);
    em_optimizer_zero_grad(o);
    for (int i = 0; i < OPT_N_PARAMS; i++) cr_assert_null(em_tensor_grad(p[i]));
    cr_assert_float_eq(em_optimizer_lr(o, 0), 0.1, 0);
    cr_assert_eq(em_optimizer_set_lr(o, 0, 0.25), EM_OK);
    cr_assert_float_eq(em_optimizer_lr(o, 0), 0.25, 0);
    cr_assert_neq(em_optimizer_set_lr(o, 0, NAN), EM_OK);
    em_assert_error(EM_ERR_INVALID, "the learning rate is NaN");
    cr_assert(isnan(em_optimizer_lr(o, 3)));
    em_assert_error(EM_ERR_RANGE, "param group 3 is out of range");
    int idx;
    const char *name;
    cr_assert_eq(em_optimizer_param(o, 0, 2, &idx, &name), p[2]);
    cr_assert_eq(idx, 2);
    cr_assert_str_eq(name, "v");
    cr_assert_eq(em_optimizer_param_total(o), 3);
    cr_assert_str_eq(em_optimizer_class(o)->name, "SGD");
    /* A step with no grads at all changes nothing. */
    float before[OPT_NUMEL], after[OPT_NUMEL];
    flat_params(p, before);
    cr_assert_eq(em_optimizer_step(o), EM_OK);
    flat_params(p, after);
    cr_assert(memcmp(before, after, sizeof before) == 0);
    em_optimizer_free(o);
    em_scope_end();
}

/* ---- a class registered by the program itself ---------------------------------------------- */

static em_status halve_step(em_optimizer *o) {
    for (int g = 0; g < em_optimizer_group_count(o); g++)
        for (int i = 0; i < em_optimizer_param_count(o, g); i++) {
            em_tensor *p = em_optimizer_param(o, g, i, NULL, NULL);
            if (em_tensor_grad(p)) {
                em_status st = em_mul_scalar_(p, 0.5);
                if (st != EM_OK) return st;
            }
        }
    return EM_OK;
}

Test(optim, program_registers_its_own_optimizer) {
    static const em_option_spec spec[] = {{.name = "lr", .types = EM_OPT_FLOAT, .def = {.f = 1}}};
    em_optim_class cls = {.struct_size = sizeof cls, .name = "test.Halve", .options = spec,
                          .n_options = 1, .step = halve_step};
    cr_assert_eq(em_optim_class_register(em_registry_program(), &cls), EM_OK, "%s",
                 em_last_error());
    cr_assert_neq(em_optim_class_register(em_registry_program(), &cls), EM_OK);
    em_assert_error(EM_ERR_EXISTS, "an optimizer class named 'test.Halve' is already registered "
                    "(by <program>)");
    cr_assert_eq(em_registry_optim_class_count(em_registry_program()), 1);
    cr_assert_str_eq(em_registry_optim_class_name(em_registry_program(), 0), "test.Halve");
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    make_params(p);
    em_dict *d = em_dict_new();
    em_dict_set(d, "w", p[0]);
    em_optimizer *o = em_optimizer_new("test.Halve", d, NULL);
    cr_assert(o, "%s", em_last_error());
    set_grads(p, 0);
    cr_assert_eq(em_optimizer_step(o), EM_OK);
    cr_assert_float_eq(em_test_at(p[0], 0), opt_init[0] * 0.5, 1e-7);
    em_optimizer_free(o);
    em_dict_free(d);
    em_scope_end();
}

Test(optim, plugin_classes_are_attributed_and_withdrawn) {
    bool found = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        cr_assert_eq(em_plugin_get(i, &info), EM_OK);
        if (info.name && strcmp(info.name, "ember-optim") == 0) {
            found = info.status == EM_PLUGIN_LOADED;
            cr_assert_eq(em_registry_optim_class_count(info.registry), 5);
            cr_assert_eq(em_registry_sched_class_count(info.registry), 8);
            cr_assert_str_eq(em_registry_optim_class_name(info.registry, 0), "SGD");
            cr_assert_null(em_registry_optim_class_name(info.registry, 5));
        }
    }
    cr_assert(found, "ember-optim was not loaded");
    em_test_assert_clean_shutdown();
    setenv("EMBER_DISABLE_PLUGINS", "ember-optim", 1);
    cr_assert_eq(em_init(), EM_OK);
    unsetenv("EMBER_DISABLE_PLUGINS");
    cr_assert_null(em_optim_class_find("SGD"));
    cr_assert_null(em_sched_class_find("StepLR"));
    em_dict *d = em_dict_new();
    em_tensor *t = em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu());
    em_dict_set(d, "t", t);
    cr_assert_null(em_optimizer_new("SGD", d, NULL));
    em_assert_error(EM_ERR_NOTFOUND, "no optimizer class named 'SGD'");
    em_dict_free(d);
    em_tensor_release(t);
}

/* ---- errors ------------------------------------------------------------------------------- */

static em_optimizer *try_new(const char *cls, const char *opts) {
    em_tensor *p[OPT_N_PARAMS];
    make_params(p);
    em_dict *d = em_dict_new();
    for (int i = 0; i < OPT_N_PARAMS; i++) em_dict_set(d, pnames[i], p[i]);
    em_options *o = opts_from(opts, ';');
    em_optimizer *opt = em_optimizer_new(cls, d, o);
    em_options_free(o);
    em_dict_free(d);
    return opt;
}

Test(optim_errors, bad_options_name_class_group_and_option) {
    em_scope_begin();
    cr_assert_null(try_new("SGD", "momentum=0.9"));
    em_assert_error(EM_ERR_INVALID, "lr");
    cr_assert_null(try_new("SGD", "lr=0.1;momentun=0.9"));
    em_assert_error(EM_ERR_INVALID, "momentun");
    cr_assert(strstr(em_last_error(), "momentum"), "no did-you-mean: %s", em_last_error());
    cr_assert(strstr(em_last_error(), "SGD (param group 0)"), "%s", em_last_error());
    cr_assert_null(try_new("SGD", "lr=-0.1"));
    em_assert_error(EM_ERR_INVALID, "SGD (param group 0): invalid learning rate -0.1");
    cr_assert_null(try_new("SGD", "lr=0.1;nesterov=true"));
    em_assert_error(EM_ERR_INVALID, "nesterov momentum requires a momentum > 0");
    cr_assert_null(try_new("SGD", "lr=0.1;momentum=0.9;dampening=0.1;nesterov=true"));
    em_assert_error(EM_ERR_INVALID, "zero dampening");
    cr_assert_null(try_new("Adam", "betas=[0.9, 0.99, 0.9]"));
    em_assert_error(EM_ERR_INVALID, "'betas' needs 2 values");
    cr_assert_null(try_new("Adam", "betas=[0.9, 1.0]"));
    em_assert_error(EM_ERR_INVALID, "betas");
    cr_assert_null(try_new("RMSprop", "alpha=-1"));
    em_assert_error(EM_ERR_INVALID, "alpha");
    cr_assert_null(try_new("Adagrad", "lr_decay=true"));
    em_assert_error(EM_ERR_INVALID, "lr_decay");
    cr_assert_null(try_new("Adamm", NULL));
    em_assert_error(EM_ERR_NOTFOUND, "no optimizer class named 'Adamm' (did you mean 'Adam'?)");
    cr_assert(strstr(em_last_error(), "AdamW"), "registered list missing: %s", em_last_error());
    em_scope_end();
}

Test(optim_errors, bad_groups) {
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    make_params(p);
    em_dict *d0 = em_dict_new(), *d1 = em_dict_new(), *empty = em_dict_new();
    em_dict_set(d0, "w", p[0]);
    em_dict_set(d0, "b", p[1]);
    em_dict_set(d1, "again", p[1]);
    em_param_group g[2] = {{d0, NULL}, {d1, NULL}};
    em_options *def = opts_from("lr=0.1", ';');
    cr_assert_null(em_optimizer_new_groups_defaults("SGD", g, 2, def));
    em_assert_error(EM_ERR_INVALID, "parameter 'again' of group 1 is also in group 0 (as 'b')");
    em_param_group ge[1] = {{empty, NULL}};
    cr_assert_null(em_optimizer_new_groups_defaults("SGD", ge, 1, def));
    em_assert_error(EM_ERR_INVALID, "param group 0 is empty");
    cr_assert_null(em_optimizer_new_groups("SGD", g, 0));
    em_assert_error(EM_ERR_INVALID, "no parameter groups");
    /* A non-leaf and an integer tensor cannot be optimized. */
    em_dict *bad = em_dict_new();
    em_dict_set(bad, "twice", em_mul_scalar(p[0], 2));
    cr_assert_null(em_optimizer_new("SGD", bad, def));
    em_assert_error(EM_ERR_INVALID, "can't optimize a non-leaf tensor: parameter 'twice'");
    em_dict *ints = em_dict_new();
    em_dict_set(ints, "count", em_zeros(1, (int64_t[]){3}, EM_I64, em_cpu()));
    cr_assert_null(em_optimizer_new("SGD", ints, def));
    em_assert_error(EM_ERR_DTYPE, "parameter 'count'");
    em_options_free(def);
    em_dict_free(d0);
    em_dict_free(d1);
    em_dict_free(empty);
    em_dict_free(bad);
    em_dict_free(ints);
    em_scope_end();
}

Test(optim_errors, load_state_dict_mismatches_are_named) {
    em_scope_begin();
    em_optimizer *a = try_new("Adam", "lr=0.01"), *s = try_new("SGD", "lr=0.1;momentum=0.9");
    cr_assert(a && s);
    em_tensor *p[OPT_N_PARAMS];
    for (int i = 0; i < OPT_N_PARAMS; i++) p[i] = em_optimizer_param(a, 0, i, NULL, NULL);
    set_grads(p, 0);
    cr_assert_eq(em_optimizer_step(a), EM_OK);
    em_dict *t = NULL;
    char *json = NULL;
    cr_assert_eq(em_optimizer_state_dict(a, &t, &json), EM_OK);
    cr_assert_neq(em_optimizer_load_state_dict(s, t, json), EM_OK);
    em_assert_error(EM_ERR_INVALID, "the state dict is from a Adam optimizer, not SGD");
    /* Fewer parameters in the target. */
    em_dict *one = em_dict_new();
    em_dict_set(one, "w", p[0]);
    em_options *o = opts_from("lr=0.01", ';');
    em_optimizer *small = em_optimizer_new("Adam", one, o);
    cr_assert_neq(em_optimizer_load_state_dict(small, t, json), EM_OK);
    em_assert_error(EM_ERR_INVALID, "the loaded group has 3 parameters, this optimizer's group has 1");
    /* A bad key, a shape mismatch, malformed JSON, an unknown hyper-parameter. */
    em_dict *t2 = em_dict_new();
    em_dict_set(t2, "state.0.exp_avg.x", em_dict_get(t, "state.0.exp_avg"));
    em_optimizer *a2 = try_new("Adam", "lr=0.01");
    cr_assert_neq(em_optimizer_load_state_dict(a2, t2, json), EM_OK);
    em_assert_error(EM_ERR_INVALID, "key 'state.0.exp_avg.x' is not of the form");
    em_dict_free(t2);
    t2 = em_dict_new();
    em_dict_set(t2, "state.1.exp_avg", em_dict_get(t, "state.0.exp_avg"));
    cr_assert_neq(em_optimizer_load_state_dict(a2, t2, json), EM_OK);
    em_assert_error(EM_ERR_SHAPE, "'state.1.exp_avg' has shape [4, 3] but parameter 1 ('b') has "
                    "shape [3]");
    em_dict_free(t2);
    t2 = em_dict_new();
    em_dict_set(t2, "state.7.exp_avg", em_dict_get(t, "state.0.exp_avg"));
    cr_assert_neq(em_optimizer_load_state_dict(a2, t2, json), EM_OK);
    em_assert_error(EM_ERR_INVALID, "names parameter 7 but the optimizer has 3 parameters");
    cr_assert_neq(em_optimizer_load_state_dict(a2, t, "{\"class\": "), EM_OK);
    em_assert_error(EM_ERR_INVALID, "malformed");
    char *bad = strdup(json), *at = strstr(bad, "\"amsgrad\"");
    cr_assert(at);
    memcpy(at, "\"amsgrap\"", 9);
    cr_assert_neq(em_optimizer_load_state_dict(a2, t, bad), EM_OK);
    em_assert_error(EM_ERR_INVALID, "amsgrap");
    free(bad);
    /* Failed loads changed nothing: a2 has no state and no steps. */
    cr_assert_null(em_optimizer_state(a2, 0, "exp_avg"));
    cr_assert_eq(em_optimizer_steps(a2), 0);
    em_dict_free(t2);
    em_dict_free(t);
    em_dict_free(one);
    em_options_free(o);
    em_host_free(json);
    em_optimizer_free(a);
    em_optimizer_free(a2);
    em_optimizer_free(s);
    em_optimizer_free(small);
    em_scope_end();
}

/* ---- clipping ------------------------------------------------------------------------------ */

/* Three grads from the fixture (step 5), with a plain-loop total norm in double. */
static double ref_norm(int step, double p) {
    double acc = 0;
    for (int k = 0; k < OPT_NUMEL; k++) {
        double v = fabs(opt_grads[step][k]);
        if (isinf(p)) acc = v > acc ? v : acc;
        else acc += pow(v, p);
    }
    return isinf(p) ? acc : pow(acc, 1 / p);
}

static em_dict *grads_dict(em_tensor **p, int step) {
    make_params(p);
    set_grads(p, step == 3 ? 4 : step);
    em_dict *d = em_dict_new();
    for (int i = 0; i < OPT_N_PARAMS; i++) em_dict_set(d, pnames[i], p[i]);
    return d;
}

Test(clip, grad_norm_against_a_plain_loop) {
    const double norms[] = {2, 1, INFINITY, 3.5};
    for (size_t ni = 0; ni < sizeof norms / sizeof norms[0]; ni++) {
        for (int clipped = 0; clipped < 2; clipped++) {
            em_scope_begin();
            em_tensor *p[OPT_N_PARAMS];
            em_dict *d = grads_dict(p, 5);
            double want = ref_norm(5, norms[ni]);
            double max_norm = clipped ? want / 4 : want * 2, total = 0;
            cr_assert_eq(em_clip_grad_norm_(d, max_norm, norms[ni], true, &total), EM_OK, "%s",
                         em_last_error());
            cr_assert(fabs(total - want) <= 1e-5 * want, "p=%g: norm %.9g, loop %.9g",
                      norms[ni], total, want);
            double coef = clipped ? max_norm / (want + 1e-6) : 1.0;
            int64_t off = 0;
            for (int i = 0; i < OPT_N_PARAMS; i++) {
                const em_tensor *g = em_tensor_grad(p[i]);
                for (int64_t k = 0; k < em_tensor_numel(g); k++) {
                    double w = opt_grads[5][off + k] * coef, got = em_test_at(g, k);
                    cr_assert(fabs(got - w) <= 1e-6 + 1e-5 * fabs(w), "p=%g grad %d[%lld]: %.9g "
                              "vs %.9g", norms[ni], i, (long long)k, got, w);
                }
                off += em_tensor_numel(g);
            }
            if (clipped) {
                double after = 0;
                cr_assert_eq(em_clip_grad_norm_(d, 1e9, norms[ni], false, &after), EM_OK);
                cr_assert(fabs(after - max_norm) <= 1e-4 * max_norm, "p=%g: %.9g after clipping "
                          "to %.9g", norms[ni], after, max_norm);
            }
            em_dict_free(d);
            em_scope_end();
        }
    }
}

Test(clip, params_without_grad_are_skipped_and_none_gives_zero) {
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    em_dict *d = grads_dict(p, 3); /* step 4's grads on all three */
    cr_assert_eq(em_tensor_set_grad(p[2], NULL), EM_OK);
    double total = -1, acc = 0;
    for (int k = 0; k < 15; k++) acc += (double)opt_grads[4][k] * opt_grads[4][k];
    cr_assert_eq(em_clip_grad_norm_(d, 1e9, 2, false, &total), EM_OK);
    cr_assert(fabs(total - sqrt(acc)) <= 1e-5 * sqrt(acc));
    for (int i = 0; i < OPT_N_PARAMS; i++) em_tensor_set_grad(p[i], NULL);
    cr_assert_eq(em_clip_grad_norm_(d, 1.0, 2, true, &total), EM_OK);
    cr_assert_float_eq(total, 0.0, 0);
    em_dict_free(d);
    em_scope_end();
}

Test(clip, nonfinite_norm) {
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    em_dict *d = grads_dict(p, 5);
    em_tensor *g = em_tensor_grad(p[1]);
    float *data = em_tensor_data(g);
    data[1] = NAN;
    em_tensor_bump_version(g);
    double total = 0;
    cr_assert_eq(em_clip_grad_norm_(d, 1.0, 2, true, &total), EM_ERR_RANGE);
    em_assert_error(EM_ERR_RANGE, "non-finite");
    cr_assert(isnan(total));
    /* Grads untouched by the refusal. */
    cr_assert_float_eq(em_test_at(em_tensor_grad(p[0]), 0), opt_grads[5][0], 0);
    /* Without the check, PyTorch scales by the NaN coefficient. */
    cr_assert_eq(em_clip_grad_norm_(d, 1.0, 2, false, &total), EM_OK);
    cr_assert(isnan(em_test_at(em_tensor_grad(p[0]), 0)));
    cr_assert_neq(em_clip_grad_norm_(d, 1.0, 0, false, NULL), EM_OK);
    em_assert_error(EM_ERR_INVALID, "norm_type 0 is not supported");
    em_dict_free(d);
    em_scope_end();
}

/* The clipping arithmetic as the host computed it before it moved to device ops (and as
 * torch.nn.utils.clip_grad_norm_ does): each grad's norm (em_norm, read on the host) rounded
 * to float32, combined in double in the params' order, the total rounded to float32, the
 * coefficient float32(max_norm) / (total + 1e-6f) clamped to 1 in float, each element times
 * it (float32 and narrower in float, rounded once to the grad's dtype; float64 in double).
 * Plain C past the per-grad norms; want[i] gets grad i's expected values (malloc'ed). */
static float host_clip_ref(em_tensor **p, int n, double max_norm, double norm_type,
                           double **want) {
    double acc = 0;
    int seen = 0;
    for (int i = 0; i < n; i++) {
        em_scope_begin();
        double v = NAN;
        cr_assert_eq(em_tensor_item(em_norm(em_tensor_grad(p[i]), norm_type, 0, NULL, false),
                                    &v), EM_OK, "%s", em_last_error());
        em_scope_end();
        float fv = (float)v;
        if (isinf(norm_type)) acc = !seen ? fv : (fv > acc || isnan(fv) ? fv : acc);
        else if (norm_type == 2) acc += (double)fv * fv;
        else if (norm_type == 1) acc += fv;
        else acc += pow(fabs(fv), norm_type);
        seen++;
    }
    float total = isinf(norm_type) || norm_type == 1 ? (float)acc
                  : norm_type == 2 ? (float)sqrt(acc) : (float)pow(acc, 1.0 / norm_type);
    float coef = (float)max_norm / (total + 1e-6f);
    if (coef > 1.0f) coef = 1.0f;
    for (int i = 0; i < n; i++) {
        const em_tensor *g = em_tensor_grad(p[i]);
        em_dtype dt = em_tensor_dtype(g);
        want[i] = em_test_values(g);
        for (int64_t k = 0; k < em_tensor_numel(g); k++)
            want[i][k] = dt == EM_F64 ? want[i][k] * (double)coef
                                      : em_test_round_to(dt, (float)want[i][k] * coef);
    }
    return total;
}

/* Params of the given dtypes and numels with roughly N(0, 1.7) grads (seeded), owned by the
 * caller's scope; NaN at grad nan_at's element 3 when nan_at >= 0. */
static em_dict *typed_grads(em_tensor **p, int n, const em_dtype *dts, const int64_t *numel,
                            uint64_t seed, int nan_at) {
    em_dict *d = em_dict_new();
    for (int i = 0; i < n; i++) {
        double *v = malloc(sizeof(double) * (size_t)numel[i]);
        em_test_fill_random(v, numel[i], seed + (uint64_t)i);
        if (i == nan_at) v[3] = NAN;
        p[i] = em_test_tensor(dts[i], 1, &numel[i], v);
        em_tensor *g = em_test_tensor(dts[i], 1, &numel[i], v);
        free(v);
        cr_assert_eq(em_requires_grad_(p[i], true), EM_OK);
        cr_assert_eq(em_tensor_set_grad(p[i], g), EM_OK, "%s", em_last_error());
        char name[16]; /* room for any int: -Wformat-truncation at -O1 */
        snprintf(name, sizeof name, "p%d", i);
        cr_assert_eq(em_dict_set(d, name, p[i]), EM_OK);
    }
    return d;
}

/* Bit for bit: both NaN, or the same value (a zero's sign included). */
static bool same_bits(double a, double b) {
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

/* em_clip_grad_norm_ and em_clip_grad_norm_device_ (device ops, no host read) give the host
 * arithmetic's norm and grads bit for bit: every norm type, float32/64, float16 and bfloat16
 * grads and a mix of them, clipping or not, max_norm infinite, and a NaN grad. */
Test(clip, device_ops_equal_the_host_arithmetic_bit_for_bit) {
    const double norms[] = {2, 1, INFINITY, 3, 0.5, 3.5};
    const em_dtype sets[][3] = {{EM_F32, EM_F32, EM_F32}, {EM_F64, EM_F64, EM_F64},
                                {EM_F16, EM_F16, EM_F16}, {EM_BF16, EM_BF16, EM_BF16},
                                {EM_F32, EM_F16, EM_F64}};
    const int64_t numel[3] = {300, 35, 1};
    int clipped_cases = 0;
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++)
        for (size_t ni = 0; ni < sizeof norms / sizeof norms[0]; ni++)
            for (int mode = 0; mode < 4; mode++) /* clip, no clip, max_norm inf, a NaN grad */
                for (int dev = 0; dev < 2; dev++) {
                    em_scope_begin();
                    em_tensor *p[3];
                    em_dict *d = typed_grads(p, 3, sets[si], numel, 7 + si * 10 + ni,
                                             mode == 3 ? 1 : -1);
                    double *want[3];
                    /* the reference's norm first, for max_norm */
                    double ref_total = host_clip_ref(p, 3, INFINITY, norms[ni], want);
                    for (int i = 0; i < 3; i++) free(want[i]);
                    double max_norm = mode == 0 ? ref_total / 4
                                      : mode == 1 ? ref_total * 2 : mode == 2 ? INFINITY : 1.0;
                    float want_total = host_clip_ref(p, 3, max_norm, norms[ni], want);
                    clipped_cases += mode == 0 && (float)max_norm / (want_total + 1e-6f) < 1;
                    double total = -1;
                    if (dev) {
                        em_tensor *t = NULL;
                        cr_assert_eq(em_clip_grad_norm_device_(d, max_norm, norms[ni], &t), EM_OK,
                                     "%s", em_last_error());
                        cr_assert(t && em_tensor_ndim(t) == 0 && em_tensor_dtype(t) == EM_F32 &&
                                  em_device_equal(em_tensor_device(t), em_cpu()));
                        total = em_test_at(t, 0);
                        em_tensor_release(t);
                    } else {
                        cr_assert_eq(em_clip_grad_norm_(d, max_norm, norms[ni], false, &total),
                                     EM_OK, "%s", em_last_error());
                    }
                    cr_assert(same_bits(total, want_total), "set %zu p=%g mode %d dev %d: norm "
                              "%.9g, the host arithmetic's %.9g", si, norms[ni], mode, dev, total,
                              (double)want_total);
                    for (int i = 0; i < 3; i++) {
                        double *got = em_test_values(em_tensor_grad(p[i]));
                        for (int64_t k = 0; k < numel[i]; k++)
                            cr_assert(same_bits(got[k], want[i][k]), "set %zu p=%g mode %d dev "
                                      "%d: grad %d[%lld] %.17g, the host arithmetic's %.17g", si,
                                      norms[ni], mode, dev, i, (long long)k, got[k], want[i][k]);
                        free(got);
                        free(want[i]);
                    }
                    em_dict_free(d);
                    em_scope_end();
                }
    cr_assert_gt(clipped_cases, 0, "no case clipped");
}

Test(clip, device_norm_without_grads_and_errors) {
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    em_dict *d = grads_dict(p, 5);
    for (int i = 0; i < OPT_N_PARAMS; i++) em_tensor_set_grad(p[i], NULL);
    em_tensor *t = (em_tensor *)1;
    cr_assert_eq(em_clip_grad_norm_device_(d, 1.0, 2, &t), EM_OK, "%s", em_last_error());
    cr_assert_null(t, "no grads: no norm tensor");
    cr_assert_neq(em_clip_grad_norm_device_(d, 1.0, 2, NULL), EM_OK);
    em_assert_error(EM_ERR_INVALID, "clip_grad_norm_device_: NULL total_norm");
    cr_assert_neq(em_clip_grad_norm_device_(NULL, 1.0, 2, &t), EM_OK);
    em_assert_error(EM_ERR_INVALID, "NULL params");
    cr_assert_neq(em_clip_grad_norm_device_(d, 1.0, -1, &t), EM_OK);
    em_assert_error(EM_ERR_INVALID, "norm_type -1 is not supported");
    cr_assert_null(t);
    em_dict_free(d);
    em_scope_end();
}

Test(clip, grad_value) {
    em_scope_begin();
    em_tensor *p[OPT_N_PARAMS];
    em_dict *d = grads_dict(p, 7);
    cr_assert_eq(em_clip_grad_value_(d, 0.3), EM_OK);
    int64_t off = 0;
    for (int i = 0; i < OPT_N_PARAMS; i++) {
        const em_tensor *g = em_tensor_grad(p[i]);
        for (int64_t k = 0; k < em_tensor_numel(g); k++) {
            double w = fmin(fmax(opt_grads[7][off + k], -0.3), 0.3);
            cr_assert_float_eq(em_test_at(g, k), (float)w, 0);
        }
        off += em_tensor_numel(g);
    }
    cr_assert_neq(em_clip_grad_value_(d, -1), EM_OK);
    em_assert_error(EM_ERR_INVALID, "clip value -1 must be >= 0");
    em_dict_free(d);
    em_scope_end();
}

/* ---- state dicts from files: every count and state checked (issue 13, items 9 and 10) ---- */

/* A 0-dim state where the parameter's shape belongs loaded and failed the first step, far
 * from the file; a step count of any int64 overflowed when counted on. Each is refused at
 * load, naming the key, and the optimizer stays as it was. */
Test(optim_errors, loaded_state_and_counts_are_checked) {
    em_scope_begin();
    em_optimizer *a = try_new("Adam", "lr=0.01");
    em_tensor *p[OPT_N_PARAMS];
    for (int i = 0; i < OPT_N_PARAMS; i++) p[i] = em_optimizer_param(a, 0, i, NULL, NULL);
    set_grads(p, 0);
    cr_assert_eq(em_optimizer_step(a), EM_OK);
    em_dict *t = NULL;
    char *json = NULL;
    cr_assert_eq(em_optimizer_state_dict(a, &t, &json), EM_OK, "%s", em_last_error());
    em_optimizer *b = try_new("Adam", "lr=0.01");
    static const struct { const char *key; double value; int ndim; em_dtype dt; em_status st;
                          const char *needle; } cases[] = {
        {"state.0.exp_avg", 0.5, 0, EM_F32, EM_ERR_SHAPE,
         "Adam.load_state_dict: 'state.0.exp_avg' has shape [] but parameter 0 ('w') has shape [4, 3]"},
        {"state.1.exp_avg_sq", 0, 1, EM_I64, EM_ERR_DTYPE,
         "'state.1.exp_avg_sq' has dtype int64; the state of parameter 1 ('b', float32) must be floating"},
        {"state.0.step", 1, 1, EM_F64, EM_ERR_SHAPE, "'state.0.step' has shape [3]; a step count is 0-dim"},
        {"state.0.step", -1, 0, EM_F64, EM_ERR_INVALID, "'state.0.step' is -1 (float64); a step count is a whole number in [0, 9007199254740992]"},
        {"state.0.step", 1e300, 0, EM_F64, EM_ERR_INVALID, "'state.0.step' is 1e+300"},
        {"state.0.step", 2.5, 0, EM_F32, EM_ERR_INVALID, "'state.0.step' is 2.5 (float32)"},
        {"state.0.step", NAN, 0, EM_F64, EM_ERR_INVALID, "'state.0.step' is nan"},
        {"state.0.step", 1, 0, EM_BOOL, EM_ERR_INVALID, "'state.0.step' is nan (bool)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        em_dict *t2 = em_dict_new();
        for (size_t j = 0; j < em_dict_len(t); j++)
            em_dict_set(t2, em_dict_key(t, j), em_dict_value(t, j));
        int64_t shape[1] = {3};
        em_tensor *v = em_full(cases[i].ndim, shape, cases[i].value, cases[i].dt, em_cpu());
        cr_assert(v, "%s", em_last_error());
        em_dict_set(t2, cases[i].key, v);
        cr_assert_eq(em_optimizer_load_state_dict(b, t2, json), cases[i].st, "case %zu: %s", i,
                     em_last_error());
        cr_assert(strstr(em_last_error(), cases[i].needle), "case %zu: '%s' lacks '%s'", i,
                  em_last_error(), cases[i].needle);
        cr_assert_null(em_optimizer_state(b, 0, "exp_avg"), "case %zu changed the optimizer", i);
        em_dict_free(t2);
    }
    /* the optimizer's own count of steps */
    static const char *const steps[] = {"9223372036854775807", "-1", "9007199254740993"};
    for (size_t i = 0; i < 3; i++) {
        char *bad = malloc(strlen(json) + 32), *at = strstr(json, "\"steps\":");
        cr_assert(at, "%s", json);
        const char *rest = strchr(at, ',');
        snprintf(bad, strlen(json) + 32, "%.*s\"steps\":%s%s", (int)(at - json), json, steps[i], rest);
        cr_assert_eq(em_optimizer_load_state_dict(b, t, bad), EM_ERR_INVALID, "%s", bad);
        em_assert_error(EM_ERR_INVALID, "\"steps\" is ");
        cr_assert(strstr(em_last_error(), "expected an integer in [0, 9007199254740992]"), "%s",
                  em_last_error());
        free(bad);
    }
    cr_assert_eq(em_optimizer_steps(b), 0);
    /* the good state dict still loads */
    cr_assert_eq(em_optimizer_load_state_dict(b, t, json), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_optimizer_steps(b), 1);
    em_dict_free(t);
    em_host_free(json);
    em_optimizer_free(a);
    em_optimizer_free(b);
    em_scope_end();
}

/* The command line refused an infinite lr; the same from a config or a program was taken. */
Test(optim_errors, learning_rate_must_be_finite) {
    em_scope_begin();
    cr_assert_null(try_new("SGD", "lr=inf"));
    em_assert_error(EM_ERR_INVALID, "SGD (param group 0): invalid learning rate inf (must be a "
                    "finite number >= 0)");
    em_options *o = em_options_new();
    em_options_set_float(o, "lr", INFINITY);
    em_tensor *w = em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu());
    em_requires_grad_(w, true);
    em_dict *d = em_dict_new();
    em_dict_set(d, "w", w);
    cr_assert_null(em_optimizer_new("Adam", d, o));
    em_assert_error(EM_ERR_INVALID, "invalid learning rate inf");
    em_options_free(o);
    em_dict_free(d);
    em_scope_end();
}

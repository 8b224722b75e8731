/*
 * test_options.c — option bags: typed setters, text typed at resolve time, conversions,
 * defaults, required options, ranges, choices, unknown keys with a did-you-mean, and the
 * messages (owner, option, value, what is allowed, where).
 */
#include "common.h"

TestSuite(options, .init = em_test_setup, .fini = em_test_teardown);

static const char *const pad_modes[] = {"same", "valid", NULL};
static const char *const reductions[] = {"none", "mean", "sum", NULL};

static const em_option_spec conv_opts[] = {
    {.name = "in_channels", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e9, .help = "channels of the input"},
    {.name = "kernel_size", .types = EM_OPT_INTS, .required = true, .has_range = true,
     .min = 1, .max = 1e6},
    {.name = "padding", .types = EM_OPT_INTS | EM_OPT_STRING, .def_type = EM_OPT_INTS,
     .def = {.n = 1, .ints = {0}}, .choices = pad_modes, .has_range = true, .min = 0,
     .max = 1e6},
    {.name = "bias", .types = EM_OPT_BOOL, .def = {.b = true}},
    {.name = "momentum", .types = EM_OPT_FLOAT, .def = {.f = 0.1}, .has_range = true,
     .min = 0, .max = 1},
    {.name = "reduction", .types = EM_OPT_STRING, .def = {.s = "mean"}, .choices = reductions},
    {.name = "weights", .types = EM_OPT_FLOATS, .def = {.n = 0}},
};
#define NCONV ((int)(sizeof conv_opts / sizeof conv_opts[0]))

Test(options, typed_setters_and_defaults) {
    em_options *o = em_options_new();
    cr_assert(o);
    cr_assert_eq(em_options_set_int(o, "in_channels", 3), EM_OK);
    int64_t ks[2] = {3, 5};
    cr_assert_eq(em_options_set_ints(o, "kernel_size", 2, ks), EM_OK);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_options_int(o, "in_channels"), 3);
    int64_t got[8];
    cr_assert_eq(em_options_ints(o, "kernel_size", got, 8), 2);
    cr_assert_eq(got[0], 3);
    cr_assert_eq(got[1], 5);
    /* defaults */
    cr_assert_eq(em_options_type(o, "padding"), EM_OPT_INTS);
    cr_assert_eq(em_options_ints(o, "padding", got, 8), 1);
    cr_assert_eq(got[0], 0);
    cr_assert(em_options_bool(o, "bias"));
    cr_assert_float_eq(em_options_float(o, "momentum"), 0.1, 1e-15);
    cr_assert_str_eq(em_options_string(o, "reduction"), "mean");
    cr_assert_eq(em_options_floats(o, "weights", NULL, 0), 0);
    cr_assert(em_options_has(o, "weights"));
    cr_assert_eq(em_options_count(o), (size_t)NCONV);
    em_options_free(o);
}

Test(options, text_is_typed_at_resolve) {
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_text(o, "in_channels", " 16 ", "m.yaml:2:3"), EM_OK);
    cr_assert_eq(em_options_set_text(o, "kernel_size", "[3, 3]", "m.yaml:3:3"), EM_OK);
    cr_assert_eq(em_options_set_text(o, "padding", "same", NULL), EM_OK);
    cr_assert_eq(em_options_set_text(o, "bias", "false", NULL), EM_OK);
    cr_assert_eq(em_options_set_text(o, "momentum", "1e-3", NULL), EM_OK);
    cr_assert_eq(em_options_set_text(o, "reduction", "\"sum\"", NULL), EM_OK);
    cr_assert_eq(em_options_set_text(o, "weights", "[1, 2.5, -3e-1]", NULL), EM_OK);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_options_type(o, "in_channels"), EM_OPT_INT);
    cr_assert_eq(em_options_int(o, "in_channels"), 16);
    int64_t ks[8];
    cr_assert_eq(em_options_ints(o, "kernel_size", ks, 8), 2);
    cr_assert_eq(ks[0] * 10 + ks[1], 33);
    cr_assert_eq(em_options_type(o, "padding"), EM_OPT_STRING);
    cr_assert_str_eq(em_options_string(o, "padding"), "same");
    cr_assert_eq(em_options_bool(o, "bias"), false);
    cr_assert_eq(em_options_float(o, "momentum"), 1e-3);
    cr_assert_str_eq(em_options_string(o, "reduction"), "sum");
    double w[8];
    cr_assert_eq(em_options_floats(o, "weights", w, 8), 3);
    cr_assert_eq(w[0], 1.0);
    cr_assert_eq(w[1], 2.5);
    cr_assert_eq(w[2], -0.3);
    em_options_free(o);
}

Test(options, conversions) {
    em_options *o = em_options_new();
    /* a single int for a list option becomes [v]; an int for a float option a float */
    em_options_set_int(o, "in_channels", 1);
    em_options_set_int(o, "kernel_size", 7);
    em_options_set_int(o, "momentum", 1);
    int64_t wi[2] = {2, 4};
    em_options_set_ints(o, "weights", 2, wi);
    em_options_set_text(o, "padding", "2", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_options_type(o, "kernel_size"), EM_OPT_INTS);
    int64_t k[8];
    cr_assert_eq(em_options_ints(o, "kernel_size", k, 8), 1);
    cr_assert_eq(k[0], 7);
    cr_assert_eq(em_options_type(o, "momentum"), EM_OPT_FLOAT);
    cr_assert_eq(em_options_float(o, "momentum"), 1.0);
    cr_assert_eq(em_options_type(o, "weights"), EM_OPT_FLOATS);
    double w[2];
    cr_assert_eq(em_options_floats(o, "weights", w, 2), 2);
    cr_assert_eq(w[1], 4.0);
    cr_assert_eq(em_options_type(o, "padding"), EM_OPT_INTS);
    /* resolving a resolved bag again is a no-op */
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_options_count(o), (size_t)NCONV);
    em_options_free(o);
}

static em_options *base(void) {
    em_options *o = em_options_new();
    em_options_set_int(o, "in_channels", 3);
    em_options_set_int(o, "kernel_size", 3);
    return o;
}

Test(options, unknown_key_did_you_mean) {
    em_options *o = base();
    em_options_set_int(o, "kernel_sizes", 3);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "Conv2d: unknown option 'kernel_sizes'");
    em_assert_error(EM_ERR_INVALID, "did you mean 'kernel_size'?");
    em_assert_error(EM_ERR_INVALID, "in_channels, kernel_size, padding");
    em_options_free(o);

    /* nothing near: no hint, but the list; where in front */
    o = base();
    em_options_set_text(o, "zzzzqqq", "1", "net.yaml:7:9");
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "net.yaml:7:9: Conv2d: unknown option 'zzzzqqq'; Conv2d "
                    "takes: ");
    cr_assert_null(strstr(em_last_error(), "did you mean"));
    em_options_free(o);
}

Test(options, range_errors) {
    em_options *o = base();
    em_options_set_text(o, "momentum", "1.5", "cfg.yaml:4:13");
    cr_assert_eq(em_options_resolve(o, "BatchNorm2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "cfg.yaml:4:13: BatchNorm2d: option 'momentum' = 1.5: out "
                    "of range; expected a number in [0, 1]");
    em_options_free(o);

    o = base();
    em_options_set_int(o, "in_channels", 0);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "Conv2d: option 'in_channels' = 0: out of range; expected "
                    "an int in [1, 1000000000] (channels of the input)");
    em_options_free(o);

    o = base();
    int64_t k[2] = {3, 0};
    em_options_set_ints(o, "kernel_size", 2, k);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "option 'kernel_size' = [3, 0]: a list entry is out of range");
    em_options_free(o);

    o = base();
    em_options_set_float(o, "momentum", NAN);
    cr_assert_eq(em_options_resolve(o, "X", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "'momentum' = nan: out of range");
    em_options_free(o);
}

Test(options, type_and_choice_errors) {
    em_options *o = base();
    em_options_set_text(o, "bias", "maybe", "a.yaml:1:1");
    cr_assert_eq(em_options_resolve(o, "Linear", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "a.yaml:1:1: Linear: option 'bias' = 'maybe': wrong type; "
                    "expected true or false");
    em_options_free(o);

    o = base();
    em_options_set_text(o, "padding", "full", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "option 'padding' = 'full': not one of the choices; "
                    "expected one of 'same', 'valid', or a list of ints");
    em_options_free(o);

    o = base();
    em_options_set_float(o, "in_channels", 2.5);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "option 'in_channels' = 2.5: not an integer");
    em_options_free(o);

    o = base();
    em_options_set_text(o, "kernel_size", "[3, 2.5]", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "list entries must be integers");
    em_options_free(o);

    o = base();
    em_options_set_text(o, "kernel_size", "[1,2,3,4,5,6,7,8,9]", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "too many list entries");
    em_options_free(o);

    o = base();
    em_options_set_text(o, "kernel_size", "[3,,3]", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "an empty list entry");
    em_options_free(o);

    o = base();
    em_options_set_string(o, "momentum", "fast");
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "option 'momentum' = 'fast': wrong type");
    em_options_free(o);

    o = base();
    em_options_set_text(o, "momentum", "0x10", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_options_free(o);
}

Test(options, required_and_failed_resolve_leaves_bag) {
    em_options *o = em_options_new();
    em_options_set_int(o, "kernel_size", 3);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "Conv2d: option 'in_channels' is required: an int in [1, "
                    "1000000000] (channels of the input)");
    /* nothing was added or typed */
    cr_assert_eq(em_options_count(o), 1);
    cr_assert(!em_options_has(o, "bias"));

    em_options_set_text(o, "in_channels", "4", NULL);
    em_options_set_text(o, "bias", "nope", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_ERR_INVALID);
    cr_assert_eq(em_options_type(o, "in_channels"), 0, "still text after a failed resolve");
    em_options_set_text(o, "bias", "off", NULL);
    cr_assert_eq(em_options_resolve(o, "Conv2d", conv_opts, NCONV), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_options_int(o, "in_channels"), 4);
    cr_assert(!em_options_bool(o, "bias"));
    em_options_free(o);
}

Test(options, replace_copy_and_text) {
    em_options *o = base();
    em_options_set_text(o, "padding", "[1, 2]", NULL);
    em_options_set_float(o, "momentum", 0.25);
    em_options_set_int(o, "in_channels", 8); /* replaces, keeps position 0 */
    cr_assert_str_eq(em_options_name(o, 0), "in_channels");
    cr_assert_eq(em_options_count(o), 4);
    em_options *c = em_options_copy(o);
    cr_assert(c);
    em_options_set_int(o, "in_channels", 9); /* the copy is deep */
    cr_assert_eq(em_options_resolve(c, "Conv2d", conv_opts, NCONV), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_options_int(c, "in_channels"), 8);
    char buf[64];
    for (size_t i = 0; i < em_options_count(c); i++) {
        const char *name = em_options_name(c, i);
        em_options_text(c, i, buf, sizeof buf);
        if (!strcmp(name, "padding")) cr_assert_str_eq(buf, "[1, 2]");
        if (!strcmp(name, "momentum")) cr_assert_str_eq(buf, "0.25");
        if (!strcmp(name, "in_channels")) cr_assert_str_eq(buf, "8");
        if (!strcmp(name, "bias")) cr_assert_str_eq(buf, "true");
        if (!strcmp(name, "reduction")) cr_assert_str_eq(buf, "mean");
        if (!strcmp(name, "weights")) cr_assert_str_eq(buf, "[]");
    }
    /* text round trip: every value's text resolves to the same value */
    em_options *r = em_options_new();
    for (size_t i = 0; i < em_options_count(c); i++)
        em_options_set_text(r, em_options_name(c, i), em_options_text(c, i, buf, sizeof buf),
                            NULL);
    cr_assert_eq(em_options_resolve(r, "Conv2d", conv_opts, NCONV), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_options_float(r, "momentum"), 0.25);
    int64_t p[8];
    cr_assert_eq(em_options_ints(r, "padding", p, 8), 2);
    cr_assert_eq(p[1], 2);
    em_options_free(r);
    em_options_free(c);
    em_options_free(o);
}

Test(options, bad_arguments) {
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_int(o, "", 1), EM_ERR_INVALID);
    cr_assert_eq(em_options_set_int(o, "a b", 1), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "bad option name 'a b'");
    cr_assert_eq(em_options_set_string(o, "x", NULL), EM_ERR_INVALID);
    cr_assert_eq(em_options_set_text(o, "x", NULL, NULL), EM_ERR_INVALID);
    int64_t v[9] = {0};
    cr_assert_eq(em_options_set_ints(o, "x", 9, v), EM_ERR_INVALID);
    cr_assert_eq(em_options_set_int(NULL, "x", 1), EM_ERR_INVALID);
    cr_assert_eq(em_options_count(o), 0);
    /* readers on absent names */
    cr_assert_eq(em_options_int(o, "x"), 0);
    cr_assert_null(em_options_string(o, "x"));
    cr_assert_null(em_options_name(o, 0));
    em_options_free(o);
    em_options_free(NULL);
}

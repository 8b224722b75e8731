/*
 * ember/options.h — typed, validated options for everything created by name: module, loss,
 * optimizer, scheduler and dataset classes.
 *
 * A class declares its options as a table of em_option_spec (name, allowed types, default,
 * range or choices, help). A caller fills an em_options bag — typed setters from C, or text
 * from a config file — and em_options_resolve() checks it against the table: unknown keys
 * (with a did-you-mean), wrong types, out-of-range values and bad choices are errors that
 * name the class, the option and what is allowed; missing options get their defaults.
 *
 *     static const em_option_spec linear_opts[] = {
 *         {.name = "in_features", .types = EM_OPT_INT, .required = true, .min = 1,
 *          .max = 1e12, .has_range = true, .help = "size of each input sample"},
 *         {.name = "bias", .types = EM_OPT_BOOL, .def = {.b = true}},
 *     };
 *     em_options *o = em_options_new();
 *     em_options_set_int(o, "in_features", 784);
 *     em_options_set_text(o, "bias", "false");            // from a config file
 *     if (em_options_resolve(o, "Linear", linear_opts, 2) != EM_OK) puts(em_last_error());
 *     int64_t in = em_options_int(o, "in_features");
 *     em_options_free(o);
 */
#ifndef EMBER_OPTIONS_H
#define EMBER_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/error.h"
#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Option value types; a spec allows a set of them (bitwise or). */
enum {
    EM_OPT_INT = 1u << 0,
    EM_OPT_FLOAT = 1u << 1, /* an int given for a float option is converted */
    EM_OPT_BOOL = 1u << 2,
    EM_OPT_STRING = 1u << 3,
    EM_OPT_INTS = 1u << 4,  /* a list of up to 8 ints; a single int is accepted as [v] */
    EM_OPT_FLOATS = 1u << 5, /* a list of up to 8 floats */
};

#define EM_OPT_MAX_LIST 8

typedef struct em_option_value {
    int64_t i;
    double f;
    bool b;
    const char *s;                 /* borrowed (static) in a spec's default */
    int n;                         /* entries in ints/floats */
    int64_t ints[EM_OPT_MAX_LIST];
    double floats[EM_OPT_MAX_LIST];
} em_option_value;

typedef struct em_option_spec {
    const char *name;
    unsigned types;                /* EM_OPT_* allowed */
    bool required;                 /* no default: must be given */
    unsigned def_type;             /* which type the default is (0: types' lowest bit) */
    em_option_value def;           /* default when not required */
    bool has_range;                /* numeric values (and list entries) must lie in [min, max] */
    double min, max;
    const char *const *choices;    /* strings: NULL-terminated list of allowed values, or NULL */
    const char *help;              /* one line, for --help and error messages */
} em_option_spec;

typedef struct em_options em_options;

/* An empty bag; NULL on out of memory. */
EM_API em_options *em_options_new(void);
EM_API void em_options_free(em_options *o);
/* A deep copy; NULL on out of memory. */
EM_API em_options *em_options_copy(const em_options *o);

/* Set a value (replacing one of the same name). Names and strings are copied. */
EM_API em_status em_options_set_int(em_options *o, const char *name, int64_t v);
EM_API em_status em_options_set_float(em_options *o, const char *name, double v);
EM_API em_status em_options_set_bool(em_options *o, const char *name, bool v);
EM_API em_status em_options_set_string(em_options *o, const char *name, const char *v);
EM_API em_status em_options_set_ints(em_options *o, const char *name, int n, const int64_t *v);
EM_API em_status em_options_set_floats(em_options *o, const char *name, int n, const double *v);
/* A value as text, typed when resolved against a spec: "784", "0.1", "1e-3", "true"/"false",
 * "[3, 3]", "same". `where` (may be NULL) says where the text came from, e.g.
 * "model.yaml:12:5", and prefixes errors about this value. */
EM_API em_status em_options_set_text(em_options *o, const char *name, const char *text,
                                     const char *where);

/* Check o against specs (n of them) for `owner` (the class name used in errors): every key
 * known, every value of an allowed type, in range, among the choices; required options
 * present; defaults filled in. EM_ERR_INVALID with a message naming owner, option, the value
 * and what is allowed (and a did-you-mean for unknown keys). */
EM_API em_status em_options_resolve(em_options *o, const char *owner, const em_option_spec *specs,
                                    int n);

/* Read a resolved option (the class's own code, after em_options_resolve; a name the spec
 * does not have, or a type that does not match, is an Ember bug: 0/false/NULL). Readers
 * widen where it is lossless: em_options_float reads an INT, em_options_int the first entry
 * of INTS, em_options_ints an INT as one entry, em_options_floats an INT/FLOAT/INTS.
 * Text values are typed by resolve in this order: a list "[a, b]" (INTS when all entries are
 * integers and INTS is allowed, else FLOATS), an integer (INT, FLOAT, INTS [v], FLOATS [v],
 * then BOOL for 0/1), a number (FLOAT, FLOATS [v]), true/false/yes/no/on/off (BOOL), and
 * otherwise a string (surrounding quotes removed). A failed resolve leaves the bag as it was. */
EM_API bool em_options_has(const em_options *o, const char *name);
/* The type the value has after resolve (one EM_OPT_* bit), 0 when absent. */
EM_API unsigned em_options_type(const em_options *o, const char *name);
EM_API int64_t em_options_int(const em_options *o, const char *name);
EM_API double em_options_float(const em_options *o, const char *name);
EM_API bool em_options_bool(const em_options *o, const char *name);
/* Borrowed; valid while o lives. */
EM_API const char *em_options_string(const em_options *o, const char *name);
/* Copies up to cap entries into out and returns the count (0 when absent). */
EM_API int em_options_ints(const em_options *o, const char *name, int64_t *out, int cap);
EM_API int em_options_floats(const em_options *o, const char *name, double *out, int cap);

/* Iterate the options set (for printing and for saving configs into checkpoints). */
EM_API size_t em_options_count(const em_options *o);
EM_API const char *em_options_name(const em_options *o, size_t i);
/* The value of option i as text ("784", "0.1", "[3, 3]", "true", "same") into buf; returns buf. */
EM_API const char *em_options_text(const em_options *o, size_t i, char *buf, size_t cap);
/* A large bag finds names through a hashed index, so setting n options (a config map of n
 * keys) costs O(n). This counts the name comparisons the em_options_set_* calls on o have
 * made (0 for NULL): tests check that it grows linearly. */
EM_API uint64_t em_options_key_compares(const em_options *o);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OPTIONS_H */

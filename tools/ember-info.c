/*
 * ember-info — the installation doctor: what this Ember is, which plugins it found and why
 * any were refused, what each registered, the devices, and a self-test on every device.
 *
 *     ember-info             a report for people
 *     ember-info --json      the same report as one JSON document
 *     ember-info --verbose   also every op with its kernels by device and dtype, their names
 *                            and priorities (and the library's log)
 *
 * Exit status: 0 when em_init() succeeded and every self-test passed, 1 otherwise, 2 for a
 * bad command line. When em_init() fails (no CPU plugin) the plugin list is still reported,
 * since that is where the reason is.
 *
 * The report is gathered into one jansson object first; the text and JSON outputs are two
 * views of it, so they cannot disagree.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/data.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/init.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/optim.h"
#include "ember/plugin.h"
#include "ember/tensor.h"

typedef struct options {
    bool json, verbose;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ember-info [--json] [--verbose] [--help]\n"
            "\n"
            "Report Ember's version and build, the plugin search path, every candidate plugin\n"
            "with its status (loaded, refused, disabled) and reason, what each loaded plugin\n"
            "registered (device types, ops, how many kernels, its classes of every kind), the\n"
            "class kinds (declared by the core or a plugin), the devices with their\n"
            "properties and memory, and a self-test on every device.\n"
            "\n"
            "  --json       print the report as one JSON document\n"
            "  --verbose    list every op's kernels by device and dtype, each with its name\n"
            "               and priority, and show the library's log on stderr\n"
            "  --help       show this help\n"
            "\n"
            "Environment: EMBER_PLUGIN_PATH, EMBER_DISABLE_PLUGINS, EMBER_LOG (see ember.h).\n"
            "Exit status: 0 when Ember started and every self-test passed, 1 otherwise.\n");
}

/* Library log lines go to stderr only with --verbose: the report already says why a plugin
 * was refused, and stdout stays clean for --json. */
static void log_to_stderr(em_log_level level, const char *msg, void *user) {
    if (*(const bool *)user) fprintf(stderr, "ember: %s: %s\n", level == EM_LOG_ERROR ? "error"
                                     : level == EM_LOG_WARN ? "warn" : "info", msg);
}

static const char *status_name(em_plugin_status s) {
    switch (s) {
    case EM_PLUGIN_LOADED: return "loaded";
    case EM_PLUGIN_REFUSED: return "refused";
    case EM_PLUGIN_DISABLED: return "disabled";
    }
    return "unknown";
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

/* ---- the class registry, on this core or an older one ----------------------------------- */

/* The class-registry calls (em_class_kind_*, em_registry_class_*) are EMBER_1.1. The doctor
 * looks them up when it starts instead of linking them, so that it also runs on a libember
 * older than itself (an install where an old library shadows the new one is when it is needed
 * most) and can show what that core refuses, such as a plugin that needs EMBER_1.1. On a 1.0
 * core it lists that core's four kinds through their 1.0 calls, the same way. */
typedef struct class_api {
    size_t (*kind_count)(void);
    em_status (*kind_get)(size_t, em_class_kind_info *);
    size_t (*count)(const em_registry *, const char *);
    const char *(*name)(const em_registry *, const char *, size_t);
} class_api;

static class_api C;

/* The 1.0 core's kinds, by their own calls. */
static const struct {
    const char *name, *description;
    size_t record_size;
    size_t (*total)(void);
    size_t (*count)(const em_registry *);
    const char *(*name_at)(const em_registry *, size_t);
} kinds10[] = {
    {"module", "layers and losses (ember/module.h)", sizeof(em_module_class),
     em_module_class_count, em_registry_module_class_count, em_registry_module_class_name},
    {"optimizer", "optimizers (ember/optim.h)", sizeof(em_optim_class), em_optim_class_count,
     em_registry_optim_class_count, em_registry_optim_class_name},
    {"scheduler", "learning-rate schedulers (ember/optim.h)", sizeof(em_sched_class),
     em_sched_class_count, em_registry_sched_class_count, em_registry_sched_class_name},
    {"dataset", "datasets (ember/data.h)", sizeof(em_dataset_class_def), em_dataset_class_count,
     em_registry_dataset_count, em_registry_dataset_name},
};
#define N_KINDS10 (sizeof kinds10 / sizeof kinds10[0])

static void class_api_init(void) {
    *(void **)&C.kind_count = dlsym(RTLD_DEFAULT, "em_class_kind_count");
    *(void **)&C.kind_get = dlsym(RTLD_DEFAULT, "em_class_kind_get");
    *(void **)&C.count = dlsym(RTLD_DEFAULT, "em_registry_class_count");
    *(void **)&C.name = dlsym(RTLD_DEFAULT, "em_registry_class_name");
    if (!C.kind_count || !C.kind_get || !C.count || !C.name) C = (class_api){0};
}

static size_t kind_count(void) { return C.kind_count ? C.kind_count() : N_KINDS10; }

static bool kind_get(size_t k, em_class_kind_info *ki) {
    if (C.kind_get) return C.kind_get(k, ki) == EM_OK;
    if (k >= N_KINDS10) return false;
    *ki = (em_class_kind_info){.struct_size = sizeof *ki, .name = kinds10[k].name,
                               .description = kinds10[k].description,
                               .record_size = kinds10[k].record_size,
                               .min_record_size = kinds10[k].record_size,
                               .owner = "ember-core", .class_count = kinds10[k].total()};
    return true;
}

static size_t class_count(const em_registry *r, size_t k, const char *kind) {
    return C.count ? C.count(r, kind) : kinds10[k].count(r);
}

static const char *class_name(const em_registry *r, size_t k, const char *kind, size_t i) {
    return C.name ? C.name(r, kind, i) : kinds10[k].name_at(r, i);
}

/* ---- gathering: plugins ------------------------------------------------------------------ */

/* Add dtype to kernels[op][device_type] unless already listed. */
static void kernel_table_add(json_t *kernels, const em_kernel_info *k) {
    json_t *by_dev = json_object_get(kernels, k->op);
    if (!by_dev) json_object_set_new(kernels, k->op, by_dev = json_object());
    json_t *dts = json_object_get(by_dev, k->device_type);
    if (!dts) json_object_set_new(by_dev, k->device_type, dts = json_array());
    const char *name = em_dtype_name(k->dtype);
    size_t i;
    json_t *v;
    json_array_foreach(dts, i, v) if (strcmp(json_string_value(v), name) == 0) return;
    json_array_append_new(dts, json_string(name));
}

static json_t *registry_json(json_t *p, const em_registry *r, const options *o) {
    json_t *types = json_array(), *ops = json_array(), *kernels = json_object();
    json_t *fns = json_array(); /* each backend's named functions (em_backend_proc) */
    for (size_t i = 0; i < em_registry_device_type_count(r); i++) {
        const char *t = em_registry_device_type_name(r, i);
        json_array_append_new(types, json_string(t));
        size_t n = 0;
        /* A 1.1 call: looked up, so that ember-info still runs on a 1.0 core (none listed). */
        const em_backend_fn_def *(*backend_functions)(const char *, size_t *);
        *(void **)&backend_functions = dlsym(RTLD_DEFAULT, "em_backend_functions");
        const em_backend_fn_def *f = backend_functions ? backend_functions(t, &n) : NULL;
        for (size_t j = 0; j < n; j++)
            json_array_append_new(fns, json_pack("{s:s, s:s, s:s, s:s}", "device_type", t,
                                                 "name", f[j].name, "signature",
                                                 f[j].signature ? f[j].signature : "",
                                                 "doc", f[j].doc ? f[j].doc : ""));
    }
    json_object_set_new(p, "backend_functions", fns);
    for (size_t i = 0; i < em_registry_op_count(r); i++)
        json_array_append_new(ops, json_string(em_registry_op_name(r, i)));
    json_t *list = o->verbose ? json_array() : NULL;
    for (size_t i = 0; i < em_registry_kernel_count(r); i++) {
        em_kernel_info k;
        if (em_registry_kernel_get(r, i, &k) != EM_OK) continue;
        kernel_table_add(kernels, &k);
        if (list)
            json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:i, s:s}", "op", k.op,
                                                  "device_type", k.device_type, "dtype",
                                                  em_dtype_name(k.dtype), "priority",
                                                  k.priority, "name", k.name));
    }
    json_object_set_new(p, "device_types", types);
    json_object_set_new(p, "ops", ops);
    /* Every class kind the same way: {"module": [...], "optimizer": [...], ...}. */
    json_t *classes = json_object();
    for (size_t k = 0; k < kind_count(); k++) {
        em_class_kind_info ki = {.struct_size = sizeof ki};
        if (!kind_get(k, &ki)) continue;
        json_t *names = json_array();
        for (size_t i = 0; i < class_count(r, k, ki.name); i++)
            json_array_append_new(names, json_string(class_name(r, k, ki.name, i)));
        json_object_set_new(classes, ki.name, names);
    }
    json_object_set_new(p, "classes", classes);
    json_object_set_new(p, "kernel_count", json_integer((json_int_t)em_registry_kernel_count(r)));
    json_object_set_new(p, "kernels", kernels);
    if (list) json_object_set_new(p, "kernel_list", list);
    return p;
}

/* The class kinds: each with its record size, owner and how many classes it holds. */
static json_t *class_kinds_json(void) {
    json_t *arr = json_array();
    for (size_t k = 0; k < kind_count(); k++) {
        em_class_kind_info ki = {.struct_size = sizeof ki};
        if (!kind_get(k, &ki)) continue;
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:I, s:s, s:I}", "name", ki.name,
                                             "description", ki.description, "record_size",
                                             (json_int_t)ki.record_size, "min_record_size",
                                             (json_int_t)ki.min_record_size, "owner", ki.owner,
                                             "class_count", (json_int_t)ki.class_count));
    }
    return arr;
}

static json_t *plugins_json(const options *o) {
    json_t *arr = json_array();
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        if (em_plugin_get(i, &info) != EM_OK) continue;
        json_t *p = json_object();
        json_object_set_new(p, "path", str_or_null(info.path));
        json_object_set_new(p, "name", str_or_null(info.name));
        json_object_set_new(p, "version", str_or_null(info.version));
        json_object_set_new(p, "description", str_or_null(info.description));
        json_object_set_new(p, "status", json_string(status_name(info.status)));
        json_object_set_new(p, "reason", str_or_null(info.reason));
        json_object_set_new(p, "notes", str_or_null(em_plugin_describe(i)));
        if (info.status == EM_PLUGIN_LOADED && info.registry)
            registry_json(p, info.registry, o);
        json_array_append_new(arr, p);
    }
    return arr;
}

/* ---- gathering: devices ------------------------------------------------------------------- */

/* Every device of every device type a loaded plugin registered, in plugin order. */
static size_t list_devices(em_device *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        if (em_plugin_get(i, &info) != EM_OK || info.status != EM_PLUGIN_LOADED) continue;
        for (size_t t = 0; t < em_registry_device_type_count(info.registry); t++) {
            const char *type = em_registry_device_type_name(info.registry, t);
            for (int k = 0; k < em_device_count(type) && n < cap; k++) {
                char name[64];
                snprintf(name, sizeof name, "%s:%d", type, k);
                if (em_device_parse(name, &out[n]) == EM_OK) n++;
            }
        }
    }
    return n;
}

/* em_device_count_reason (EMBER_1.1), looked up so ember-info still runs on a 1.0 core. */
static const char *count_reason(const char *type) {
    static const char *(*fn)(const char *);
    static bool looked;
    if (!looked) *(void **)&fn = dlsym(RTLD_DEFAULT, "em_device_count_reason");
    looked = true;
    return fn ? fn(type) : NULL;
}

/* Every loaded device type with its device count and, when it has none, the backend's
 * reason (a CUDA plugin on a machine without a GPU: the driver's message). */
static json_t *device_types_json(void) {
    json_t *arr = json_array();
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        if (em_plugin_get(i, &info) != EM_OK || info.status != EM_PLUGIN_LOADED) continue;
        for (size_t t = 0; t < em_registry_device_type_count(info.registry); t++) {
            const char *type = em_registry_device_type_name(info.registry, t);
            json_array_append_new(arr, json_pack("{s:s, s:i, s:s?}", "type", type, "count",
                                                 em_device_count(type), "reason",
                                                 count_reason(type)));
        }
    }
    return arr;
}

static json_t *device_json(em_device dev) {
    char name[48];
    json_t *d = json_object();
    json_object_set_new(d, "device", json_string(em_device_str(dev, name, sizeof name)));
    em_device_props p = {.struct_size = sizeof p};
    if (em_device_properties(dev, &p) == EM_OK) {
        json_object_set_new(d, "name", json_string(p.name));
        json_object_set_new(d, "total_memory", json_integer((json_int_t)p.total_memory));
        json_object_set_new(d, "free_memory", json_integer((json_int_t)p.free_memory));
        json_object_set_new(d, "compute_units", json_integer(p.compute_units));
        if (p.arch[0]) json_object_set_new(d, "arch", json_string(p.arch));
    } else {
        json_object_set_new(d, "error", json_string(em_last_error()));
    }
    em_memory_stats ms;
    if (em_memory_stats_get(dev, &ms) == EM_OK) {
        size_t in_use = 0;
        for (int c = 0; c < EM_MEM_CACHED; c++) in_use += ms.current[c];
        json_object_set_new(d, "memory", json_pack("{s:I, s:I, s:I, s:I}", "in_use",
                                                   (json_int_t)in_use, "cached",
                                                   (json_int_t)ms.current[EM_MEM_CACHED],
                                                   "reserved", (json_int_t)ms.reserved,
                                                   "peak_reserved",
                                                   (json_int_t)ms.peak_reserved));
    }
    return d;
}

/* ---- the self-test ------------------------------------------------------------------------ */

typedef struct selftest {
    int checks;
    json_t *skipped; /* ops without a kernel on this device type */
    char error[1200];
} selftest;

/* True when any loaded registry has a kernel for (op, device type, dtype). */
static bool has_kernel(const char *op, const char *type, em_dtype dt) {
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        if (em_plugin_get(i, &info) != EM_OK || info.status != EM_PLUGIN_LOADED) continue;
        for (size_t k = 0; k < em_registry_kernel_count(info.registry); k++) {
            em_kernel_info ki;
            if (em_registry_kernel_get(info.registry, k, &ki) == EM_OK && ki.dtype == dt &&
                strcmp(ki.op, op) == 0 && strcmp(ki.device_type, type) == 0)
                return true;
        }
    }
    return false;
}

/* Compare t (taken over, released here) with want; records the failure. */
static bool expect(selftest *r, const char *what, em_tensor *t, const float *want, int n) {
    if (!t) {
        snprintf(r->error, sizeof r->error, "%s: %s", what, em_last_error());
        return false;
    }
    float got[8];
    em_status st = em_tensor_numel(t) == n && em_tensor_dtype(t) == EM_F32
                       ? em_tensor_to_host(t, got, sizeof(float) * (size_t)n)
                       : em_set_error(EM_ERR_SHAPE, "wrong shape or dtype");
    em_tensor_release(t);
    if (st != EM_OK) {
        snprintf(r->error, sizeof r->error, "%s: %s", what, em_last_error());
        return false;
    }
    for (int i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])))) {
            snprintf(r->error, sizeof r->error, "%s: element %d is %g, expected %g", what, i,
                     (double)got[i], (double)want[i]);
            return false;
        }
    r->checks++;
    return true;
}

/* Whether op has a float32 kernel on the device's type; notes it as skipped otherwise. */
static bool can_run(selftest *r, const char *op, const char *type) {
    if (has_kernel(op, type, EM_F32)) return true;
    json_array_append_new(r->skipped, json_string(op));
    return false;
}

/* Tiny computations with known answers: a host round trip, fill, add, arange, sum and a 2x2
 * matmul — each where the device type has a float32 kernel for it. */
static bool self_test_device(em_device dev, const char *type, selftest *r) {
    static const float x[4] = {0, 1, 2, 3}, two_x[4] = {0, 2, 4, 6}, fives[4] = {2.5f, 2.5f,
                                                                                  2.5f, 2.5f};
    static const float ma[4] = {1, 2, 3, 4}, mb[4] = {5, 6, 7, 8}, mab[4] = {19, 22, 43, 50};
    int64_t n = 4, sq[2] = {2, 2};
    em_tensor *t = em_from_data(x, 1, &n, EM_F32, dev);
    bool ok = expect(r, "host round trip", t ? em_tensor_retain(t) : NULL, x, 4);
    if (ok && can_run(r, "fill", type))
        ok = expect(r, "fill", em_full(1, &n, 2.5, EM_F32, dev), fives, 4);
    if (ok && can_run(r, "add", type)) ok = expect(r, "add", em_add(t, t), two_x, 4);
    if (ok && can_run(r, "arange", type))
        ok = expect(r, "arange", em_arange(0, 4, 1, EM_F32, dev), x, 4);
    if (ok && can_run(r, "sum", type)) {
        const float six = 6;
        ok = expect(r, "sum", em_sum(t, 0, NULL, false), &six, 1);
    }
    if (ok && can_run(r, "bmm", type)) {
        em_tensor *a = em_from_data(ma, 2, sq, EM_F32, dev), *b = em_from_data(mb, 2, sq,
                                                                              EM_F32, dev);
        ok = expect(r, "matmul", a && b ? em_matmul(a, b) : NULL, mab, 4);
        em_tensor_release(a);
        em_tensor_release(b);
    }
    em_tensor_release(t);
    return ok;
}

static json_t *self_tests_json(const em_device *devs, size_t n, bool *all_ok) {
    json_t *arr = json_array();
    em_fallback_policy saved = em_fallback_get();
    em_fallback_set(EM_FALLBACK_ERROR); /* test the device's own kernels */
    for (size_t i = 0; i < n; i++) {
        char name[48];
        em_device_str(devs[i], name, sizeof name);
        char type[48];
        snprintf(type, sizeof type, "%.*s", (int)strcspn(name, ":"), name);
        selftest r = {.skipped = json_array()};
        bool ok = self_test_device(devs[i], type, &r);
        if (!ok) *all_ok = false;
        json_array_append_new(arr, json_pack("{s:s, s:b, s:i, s:o, s:s?}", "device", name, "ok",
                                             ok, "checks", r.checks, "skipped", r.skipped,
                                             "error", ok ? NULL : r.error));
    }
    em_fallback_set(saved);
    return arr;
}

/* ---- the report ----------------------------------------------------------------------------- */

static json_t *gather(const options *o, em_status init, const char *init_error) {
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string(em_version()));
    json_object_set_new(root, "build_info", json_string(em_build_info()));
    json_object_set_new(root, "init", json_pack("{s:b, s:s?}", "ok", init == EM_OK, "error",
                                                init == EM_OK ? NULL : init_error));
    json_object_set_new(root, "threads", json_pack("{s:i, s:s}", "count", em_num_threads(),
                                                   "reason", em_num_threads_reason()));
    json_object_set_new(root, "search_path", json_string(em_plugin_search_path()));
    json_object_set_new(root, "plugins", plugins_json(o));
    json_object_set_new(root, "class_kinds", class_kinds_json());
    /* "EMBER_1.1": the class registry's calls; "EMBER_1.0": an older core, its four kinds */
    json_object_set_new(root, "class_api", json_string(C.kind_count ? "EMBER_1.1" : "EMBER_1.0"));
    bool ok = init == EM_OK;
    json_t *devices = json_array(), *tests = json_array();
    if (init == EM_OK) json_object_set_new(root, "device_types", device_types_json());
    if (init == EM_OK) {
        em_device devs[256];
        size_t n = list_devices(devs, sizeof devs / sizeof *devs);
        for (size_t i = 0; i < n; i++) json_array_append_new(devices, device_json(devs[i]));
        json_decref(tests);
        tests = self_tests_json(devs, n, &ok);
    }
    json_object_set_new(root, "devices", devices);
    json_object_set_new(root, "self_test", tests);
    json_object_set_new(root, "ok", json_boolean(ok));
    return root;
}

/* ---- text output -------------------------------------------------------------------------- */

static const char *get_s(const json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static const char *size_str(json_int_t bytes, char *buf, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

static void print_string_list(const char *label, const json_t *arr) {
    printf("    %s:", label);
    size_t i;
    json_t *v;
    if (json_array_size(arr) == 0) printf(" (none)");
    json_array_foreach(arr, i, v) printf("%s %s", i ? "," : "", json_string_value(v));
    printf("\n");
}

/* Without --verbose one line: how many kernels for how many ops, and on which device types.
 * With --verbose one line per op, "add: cpu[float32 float64] testdev[float32]", each followed
 * by its kernels with their names and priorities. */
static void print_kernels(const json_t *p, bool verbose) {
    const json_t *kernels = json_object_get(p, "kernels");
    const json_t *list = json_object_get(p, "kernel_list");
    long long count = (long long)json_integer_value(json_object_get(p, "kernel_count"));
    if (!verbose) {
        if (!json_object_size(kernels)) {
            printf("    kernels: (none)\n");
            return;
        }
        json_t *devs = json_object();
        const char *op, *dev;
        json_t *by_dev, *dts;
        json_object_foreach((json_t *)kernels, op, by_dev)
            json_object_foreach(by_dev, dev, dts) json_object_set_new(devs, dev, json_true());
        printf("    kernels: %lld for %zu ops on", count, json_object_size(kernels));
        size_t i = 0;
        json_object_foreach(devs, dev, dts) printf("%s %s", i++ ? "," : "", dev);
        printf(" (--verbose lists them)\n");
        json_decref(devs);
        return;
    }
    printf("    kernels (%lld):%s\n", count, json_object_size(kernels) ? "" : " (none)");
    const char *op;
    json_t *by_dev;
    json_object_foreach((json_t *)kernels, op, by_dev) {
        printf("      %s:", op);
        const char *dev;
        json_t *dts;
        json_object_foreach(by_dev, dev, dts) {
            printf(" %s[", dev);
            size_t i;
            json_t *v;
            json_array_foreach(dts, i, v) printf("%s%s", i ? " " : "", json_string_value(v));
            printf("]");
        }
        printf("\n");
        size_t i;
        json_t *k;
        json_array_foreach((json_t *)list, i, k)
            if (strcmp(get_s(k, "op"), op) == 0)
                printf("        %-32s %s %s, priority %lld\n", get_s(k, "name"),
                       get_s(k, "device_type"), get_s(k, "dtype"),
                       (long long)json_integer_value(json_object_get(k, "priority")));
    }
}

static void print_plugins(const json_t *plugins, bool verbose) {
    size_t n = json_array_size(plugins);
    printf("\nplugins (%zu candidate%s):\n", n, n == 1 ? "" : "s");
    size_t i;
    json_t *p;
    json_array_foreach((json_t *)plugins, i, p) {
        const char *status = get_s(p, "status"), *name = get_s(p, "name");
        printf("  %-8s  %s%s%s  %s\n", status, *name ? name : "(unnamed)",
               *get_s(p, "version") ? " " : "", get_s(p, "version"), get_s(p, "path"));
        if (*get_s(p, "description")) printf("    %s\n", get_s(p, "description"));
        if (*get_s(p, "notes")) printf("    notes: %s\n", get_s(p, "notes"));
        if (strcmp(status, "loaded") != 0) {
            printf("    reason: %s\n", get_s(p, "reason"));
            continue;
        }
        print_string_list("device types", json_object_get(p, "device_types"));
        size_t fi;
        json_t *fn;
        json_array_foreach(json_object_get(p, "backend_functions"), fi, fn)
            printf("    %s function %s: %s; %s\n", get_s(fn, "device_type"),
                   get_s(fn, "name"), get_s(fn, "signature"), get_s(fn, "doc"));
        print_string_list("ops declared", json_object_get(p, "ops"));
        const char *kind;
        json_t *names;
        json_object_foreach(json_object_get(p, "classes"), kind, names) {
            if (!json_array_size(names)) continue;
            char label[96];
            snprintf(label, sizeof label, "%s classes", kind);
            print_string_list(label, names);
        }
        print_kernels(p, verbose);
    }
}

static void print_class_kinds(const json_t *kinds, const char *api) {
    printf("\nclass kinds (%zu)%s:\n", json_array_size(kinds),
           strcmp(api, "EMBER_1.0") == 0 ? ", through the 1.0 calls of a libember without "
           "EMBER_1.1" : "");
    size_t i;
    json_t *k;
    json_array_foreach((json_t *)kinds, i, k) {
        long long n = (long long)json_integer_value(json_object_get(k, "class_count"));
        printf("  %-12s %lld class%s, declared by %s, %lld-byte records", get_s(k, "name"), n,
               n == 1 ? "" : "es", get_s(k, "owner"),
               (long long)json_integer_value(json_object_get(k, "record_size")));
        if (*get_s(k, "description")) printf(": %s", get_s(k, "description"));
        printf("\n");
    }
}

static void print_devices(const json_t *types, const json_t *devices) {
    size_t i;
    json_t *d;
    printf("\ndevice types:\n");
    json_array_foreach((json_t *)types, i, d) {
        long long n = (long long)json_integer_value(json_object_get(d, "count"));
        const char *why = get_s(d, "reason");
        printf("  %s: %lld device%s%s%s%s\n", get_s(d, "type"), n, n == 1 ? "" : "s",
               *why ? " (" : "", why, *why ? ")" : "");
    }
    printf("\ndevices (%zu):\n", json_array_size(devices));
    json_array_foreach((json_t *)devices, i, d) {
        char a[32], b[32], c[32], e[32];
        const json_t *m = json_object_get(d, "memory");
        printf("  %-12s %s%s%s%s\n", get_s(d, "device"),
               *get_s(d, "name") ? get_s(d, "name") : get_s(d, "error"),
               *get_s(d, "arch") ? " (" : "", get_s(d, "arch"), *get_s(d, "arch") ? ")" : "");
        long long units = (long long)json_integer_value(json_object_get(d, "compute_units"));
        printf("    memory %s total, %s free; %lld compute unit%s\n",
               size_str(json_integer_value(json_object_get(d, "total_memory")), a, sizeof a),
               size_str(json_integer_value(json_object_get(d, "free_memory")), b, sizeof b),
               units, units == 1 ? "" : "s");
        printf("    allocator: %s in use, %s cached, %s reserved\n",
               size_str(json_integer_value(json_object_get(m, "in_use")), c, sizeof c),
               size_str(json_integer_value(json_object_get(m, "cached")), e, sizeof e),
               size_str(json_integer_value(json_object_get(m, "reserved")), a, sizeof a));
    }
}

static void print_self_tests(const json_t *tests) {
    printf("\nself-test (float32, each op where the device has a kernel):\n");
    size_t i;
    json_t *t;
    json_array_foreach((json_t *)tests, i, t) {
        const char *dev = get_s(t, "device");
        if (!json_is_true(json_object_get(t, "ok"))) {
            printf("  self-test %s: FAILED: %s\n", dev, get_s(t, "error"));
            continue;
        }
        printf("  self-test %s: ok (%lld checks", dev,
               (long long)json_integer_value(json_object_get(t, "checks")));
        const json_t *sk = json_object_get(t, "skipped");
        size_t k;
        json_t *v;
        json_array_foreach((json_t *)sk, k, v)
            printf("%s%s", k ? ", " : "; no kernel for: ", json_string_value(v));
        printf(")\n");
    }
}

static void print_text(const json_t *r, bool verbose) {
    printf("Ember %s\n", get_s(r, "version"));
    printf("build: %s\n", get_s(r, "build_info"));
    const json_t *init = json_object_get(r, "init");
    if (json_is_true(json_object_get(init, "ok"))) printf("init: ok\n");
    else printf("init: FAILED: %s\n", get_s(init, "error"));
    const json_t *th = json_object_get(r, "threads");
    printf("CPU threads: %lld (%s)\n", (long long)json_integer_value(json_object_get(th, "count")),
           get_s(th, "reason"));
    printf("plugin search path: %s\n", get_s(r, "search_path"));
    print_plugins(json_object_get(r, "plugins"), verbose);
    print_class_kinds(json_object_get(r, "class_kinds"), get_s(r, "class_api"));
    if (!json_is_true(json_object_get(init, "ok"))) return;
    print_devices(json_object_get(r, "device_types"), json_object_get(r, "devices"));
    print_self_tests(json_object_get(r, "self_test"));
    printf("\n%s\n", json_is_true(json_object_get(r, "ok")) ? "all self-tests passed"
                                                            : "SOME SELF-TESTS FAILED");
}

/* ---- main ----------------------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) o->json = true;
        else if (strcmp(argv[i], "--verbose") == 0 || strcmp(argv[i], "-v") == 0) o->verbose = true;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 0;
        else {
            fprintf(stderr, "ember-info: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

int main(int argc, char **argv) {
    options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc == 0) usage(stdout);
    if (rc >= 0) return rc;

    em_log_set(log_to_stderr, &o.verbose);
    class_api_init();
    em_status init = em_init();
    char init_error[1024];
    snprintf(init_error, sizeof init_error, "%s", em_last_error());
    json_t *report = gather(&o, init, init_error);
    bool ok = json_is_true(json_object_get(report, "ok"));
    if (o.json) {
        json_dumpf(report, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("\n");
    } else {
        print_text(report, o.verbose);
    }
    json_decref(report);
    em_shutdown();
    em_log_set(NULL, NULL);
    return ok ? 0 : 1;
}

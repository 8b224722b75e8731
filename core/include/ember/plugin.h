/*
 * ember/plugin.h — writing and loading plugins.
 *
 * A plugin is a shared object that exports one symbol, `ember_plugin_entry`, returning a
 * static descriptor. The core calls the descriptor's register function with the plugin's
 * registry; everything the plugin adds (device types, ops, kernels, classes) is registered
 * from there and attributed to it. Never register from a constructor.
 *
 *     static em_status reg(em_registry *r) {
 *         em_kernel_def k = { .struct_size = sizeof k, .op = "add", .device_type = "cpu",
 *                             .dtype = EM_F32, .fn = my_add, .name = "my_add_f32" };
 *         return em_kernel_register(r, &k, NULL);
 *     }
 *     static const em_plugin_descriptor desc = {
 *         .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR,
 *         .name = "my-plugin", .version = "1.0", .description = "a faster add",
 *         .register_fn = reg,
 *     };
 *     EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
 *
 * Discovery, in order: em_plugin_load() calls made before em_init(); EMBER_PLUGIN_PATH
 * (colon-separated directories or .so files); then the installed plugin directory — or, when
 * libember runs uninstalled from its build tree, the build tree's plugins instead (so tests
 * never pick up stale installed plugins). Each file is dlopen()ed RTLD_NOW|RTLD_LOCAL (and
 * RTLD_NODELETE: em_shutdown() withdraws a plugin's registrations and closes it, but its code
 * stays mapped, because runtimes such as libgomp crash when unmapped under their threads).
 * A plugin is refused (and the rest still load) when: the file cannot be loaded (the full
 * dlerror() text is kept, e.g. a missing libcudnn.so.9), it has no entry symbol, its ABI major
 * differs from the core's, its descriptor is malformed, a plugin of the same name is already
 * loaded, or its register function fails (everything it registered is removed again).
 * EMBER_DISABLE_PLUGINS=name,... skips plugins by name.
 *
 * Sample inputs for the ops a plugin declares are case rows (ember/opcase.h): a static const
 * array of em_op_case registered from the register function with em_op_cases_register(reg,
 * rows, n). Rows, not a sample-input callback in the schema, because rows are data: the core,
 * its tests and ember-opcheck read every op's rows the same way through the registry (the
 * standard ops' rows are registered by the core), a row states its dtypes, layouts, expected
 * status and tolerance so a checker knows what to compare, and a row can describe an invalid
 * call. A plugin op with no rows is still checked by ember-opcheck with generic inputs derived
 * from its schema (same-shape floating tensors of several shapes and layouts, default
 * attributes), which its report says, with what it could not check (docs/opcheck.md).
 *
 * Compatibility. Every struct a plugin fills or reads starts with struct_size and is read by
 * the prefix rule: the core accepts a struct_size at least the oldest layout that holds the
 * fields it needs (a plugin built against older, smaller headers), reads only the bytes that
 * size covers and takes the rest as zero (NULL: the slot's documented default), and writes an
 * out-struct (em_device_props, em_class_kind_info) only as far as the caller's struct_size
 * goes. A smaller struct_size is EM_ERR_INVALID naming the function, the struct and both sizes.
 * Each exported function carries the version node of the release that introduced it
 * (core/libember.map: EMBER_1.0, EMBER_1.1 ...): a plugin that calls a newer function is
 * refused by the dynamic linker on an older core ("version `EMBER_1.1' not found"), and
 * em_plugins()/ember-info show that message.
 */
#ifndef EMBER_PLUGIN_H
#define EMBER_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The plugin ABI major this core implements; a plugin built for another is refused. */
#define EM_PLUGIN_ABI_MAJOR 1
/* The one symbol a plugin exports. */
#define EM_PLUGIN_ENTRY_SYMBOL "ember_plugin_entry"
#define EM_PLUGIN_EXPORT __attribute__((visibility("default")))

typedef struct em_plugin_descriptor {
    size_t struct_size;       /* sizeof(em_plugin_descriptor); at least through register_fn */
    int abi_major;            /* EM_PLUGIN_ABI_MAJOR at the plugin's build */
    const char *name;         /* unique, e.g. "ember-cpu" */
    const char *version;      /* e.g. "0.1.0" */
    const char *description;  /* one line */
    /* Register everything; return EM_OK, or an error with em_set_error() saying why. */
    em_status (*register_fn)(em_registry *reg);
    /* (optional) Called before the plugin is unloaded, after its registrations are removed;
     * frees what register_fn allocated. NULL: nothing to free. */
    void (*shutdown_fn)(void);
    void *ext;                /* reserved; NULL */
    /* (optional) Decisions the plugin made at registration that a user should see, e.g.
     * which GEMM library it routes f32 to and why; shown by ember-info. NULL: none. */
    const char *(*describe)(void);
} em_plugin_descriptor;

typedef const em_plugin_descriptor *(*em_plugin_entry_fn)(void);
/* The entry point every plugin defines (declared here so plugins get its prototype). */
EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void);

/* Register a device type (backends). The name must be unique; "cpu" takes the reserved slot
 * EM_DEVICE_CPU_TYPE. The table is copied. */
EM_API em_status em_device_type_register(em_registry *reg, const em_device_ops *ops);

/* Load one plugin file now. Before em_init() the path is queued and loaded first by
 * em_init(); after, it loads immediately. A refused plugin returns EM_ERR_PLUGIN with the
 * file and reason, and is listed by em_plugins() with that reason. */
EM_API em_status em_plugin_load(const char *path);

typedef enum em_plugin_status {
    EM_PLUGIN_LOADED = 0,
    EM_PLUGIN_REFUSED = 1,
    EM_PLUGIN_DISABLED = 2, /* skipped by EMBER_DISABLE_PLUGINS */
} em_plugin_status;

/* What em_plugins() reports for each candidate file (and for the program's own registry,
 * listed last as "<program>" when it registered anything). Strings are owned by the core and
 * valid until em_shutdown(). */
typedef struct em_plugin_info {
    const char *path;        /* the file */
    const char *name;        /* descriptor name, or NULL when it could not be read */
    const char *version;
    const char *description;
    em_plugin_status status;
    const char *reason;      /* why it was refused or disabled; NULL when loaded */
    const em_registry *registry; /* what it registered (NULL unless loaded) */
} em_plugin_info;

/* Number of candidate plugin files seen (loaded, refused or disabled). */
EM_API size_t em_plugin_count(void);
/* Info for candidate i (in discovery order); EM_ERR_RANGE past the end. */
EM_API em_status em_plugin_get(size_t i, em_plugin_info *out /* out */);
/* Plugin i's own description of the choices it made (its descriptor's describe()), or NULL. */
EM_API const char *em_plugin_describe(size_t i);
/* The directories searched, in order, as one colon-separated string (valid until
 * em_shutdown()). */
EM_API const char *em_plugin_search_path(void);

/* What a registry registered, for reports. */
typedef struct em_kernel_info {
    const char *op;
    const char *device_type;
    em_dtype dtype;
    int priority;
    const char *name;
} em_kernel_info;
EM_API size_t em_registry_kernel_count(const em_registry *reg);
EM_API em_status em_registry_kernel_get(const em_registry *reg, size_t i,
                                        em_kernel_info *out /* out */);
/* The core's own registry: the standard op set (ember/ops.h), declared at em_init(). */
EM_API const em_registry *em_registry_core(void);
EM_API size_t em_registry_op_count(const em_registry *reg);
EM_API const char *em_registry_op_name(const em_registry *reg, size_t i);
EM_API size_t em_registry_device_type_count(const em_registry *reg);
EM_API const char *em_registry_device_type_name(const em_registry *reg, size_t i);
/* ---- class kinds and classes -------------------------------------------------------------
 *
 * Every class a plugin or the program registers by name belongs to a *kind*: "module" (layers
 * and losses, ember/module.h), "optimizer" and "scheduler" (ember/optim.h), "dataset"
 * (ember/data.h), "transform" (ember/transform.h), "exporter" and "onnx_layer" (ember/onnx.h)
 * and "communicator" (ember/comm.h) are declared by the core; a plugin declares a new kind (a
 * codec, say) with em_class_kind_register and then it, other plugins and the program register
 * classes into it with em_class_register. The core keeps one registry for
 * every kind: the same copy of each record, the same duplicate and not-found messages, the
 * same removal when the owning plugin unloads, and ember-info lists every kind the same way.
 *
 *     typedef struct my_codec_class {         // a kind's record: starts with em_class_head's
 *         size_t struct_size;                 // three fields, in this order
 *         const char *name;
 *         const char *description;
 *         em_tensor *(*encode)(const em_tensor *x);
 *         void *ext;
 *     } my_codec_class;
 *     em_class_kind_def k = { .struct_size = sizeof k, .name = "codec",
 *                             .description = "tensor codecs",
 *                             .record_size = sizeof(my_codec_class) };
 *     em_class_kind_register(reg, &k);
 *     static const my_codec_class q8 = { .struct_size = sizeof q8, .name = "q8",
 *                                        .encode = my_q8 };
 *     em_class_register(reg, "codec", &q8);
 *     const my_codec_class *c = em_class_find("codec", "q8");
 *
 * The prefix rule (every record that crosses the ABI): a record built against older, smaller
 * headers has a smaller struct_size; the core accepts it when it is at least the kind's
 * min_record_size, copies the bytes it covers and zeroes the rest, so a newer core reads an
 * older plugin's record with its newer trailing slots NULL.
 *
 * The em_class_* and em_registry_class_* calls are new in EMBER_1.1 (a plugin calling them
 * needs a 1.1 core); the per-kind calls of module.h, optim.h and data.h are EMBER_1.0. */

/* The fields every class record of every kind begins with, in this order. */
typedef struct em_class_head {
    size_t struct_size;       /* sizeof the record's own struct */
    const char *name;         /* unique within the kind; the core keeps a copy */
    const char *description;  /* one line, or NULL */
} em_class_head;

typedef struct em_class_kind_def {
    size_t struct_size;       /* sizeof(em_class_kind_def) */
    const char *name;         /* unique, [a-z][a-z0-9_]*: "module", "transform" */
    const char *description;  /* one line, or NULL */
    /* The size of the kind's record struct at the declarer's build (>= sizeof(em_class_head)):
     * each registered record is copied into this many bytes. */
    size_t record_size;
    /* The smallest struct_size accepted (the oldest layout holding every field the kind
     * needs), sizeof(em_class_head) .. record_size; 0 means record_size. */
    size_t min_record_size;
    /* (optional) The kind's own checks of a record, called with the core's copy (record_size
     * bytes, the fields past the caller's struct_size zeroed) before it is added. `who` names
     * the registering function for messages. Return EM_OK or an error set with em_set_error
     * naming the class. NULL: no checks beyond the name. */
    em_status (*check)(const void *record, const char *who);
    void *ext;                /* reserved; NULL */
} em_class_kind_def;

/* Declare a class kind, owned by reg: removing reg (its plugin unloads, or em_shutdown()
 * for the program's) removes the kind with every class registered into it. The definition
 * is copied (its name too). EM_ERR_EXISTS when a kind of that name exists; EM_ERR_INVALID
 * for a bad name, struct_size or record size. */
EM_API em_status em_class_kind_register(em_registry *reg, const em_class_kind_def *def);

/* What em_class_kind_get reports about a kind. */
typedef struct em_class_kind_info {
    size_t struct_size;       /* set by the caller: sizeof(em_class_kind_info) */
    const char *name;
    const char *description;  /* "" when none */
    size_t record_size, min_record_size;
    const char *owner;        /* the declaring registry: "ember-core", a plugin's name */
    size_t class_count;       /* classes registered into it, by every registry */
    void *ext;                /* reserved */
} em_class_kind_info;

/* Number of declared class kinds; kind i (in declaration order: the core's own first) into
 * *out, whose struct_size the caller sets (only the fields it covers are written).
 * EM_ERR_RANGE past the end. Strings are valid while the kind is declared. */
EM_API size_t em_class_kind_count(void);
EM_API em_status em_class_kind_get(size_t i, em_class_kind_info *out /* out */);

/* Register a class into kind (the record starts with em_class_head's fields). The record is
 * copied (its name too); what its pointers point at must outlive the registration.
 * EM_ERR_NOTFOUND for an unknown kind (naming the declared ones), EM_ERR_EXISTS when the
 * kind has a class of that name (naming who registered it), EM_ERR_INVALID for a NULL or
 * too-small record, an empty name, or what the kind's check refuses. */
EM_API em_status em_class_register(em_registry *reg, const char *kind, const void *record);
/* Remove the class `name` that reg registered into kind; EM_ERR_NOTFOUND otherwise. */
EM_API em_status em_class_unregister(em_registry *reg, const char *kind, const char *name);
/* The core's copy of a class (cast to the kind's record type), valid until it is removed; NULL
 * with EM_ERR_NOTFOUND listing the kind's classes (and a near name) and the loaded plugins. */
EM_API const void *em_class_find(const char *kind, const char *name);
/* Classes of a kind (every registry), in registration order; NULL past the end. */
EM_API size_t em_class_count(const char *kind);
EM_API const void *em_class_get(const char *kind, size_t i);
/* The classes of a kind that reg registered, in registration order; NULL past the end. */
EM_API size_t em_registry_class_count(const em_registry *reg, const char *kind);
EM_API const char *em_registry_class_name(const em_registry *reg, const char *kind, size_t i);

/* The per-kind forms below are em_registry_class_count/name for the core's kinds. */
/* Module classes (ember/module.h) the registry registered, in registration order; the name is
 * NULL past the end. */
EM_API size_t em_registry_module_class_count(const em_registry *reg);
EM_API const char *em_registry_module_class_name(const em_registry *reg, size_t i);
/* Optimizer and scheduler classes a registry registered (ember/optim.h), in registration
 * order; names are NULL past the end. */
EM_API size_t em_registry_optim_class_count(const em_registry *reg);
EM_API const char *em_registry_optim_class_name(const em_registry *reg, size_t i);
EM_API size_t em_registry_sched_class_count(const em_registry *reg);
EM_API const char *em_registry_sched_class_name(const em_registry *reg, size_t i);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_PLUGIN_H */

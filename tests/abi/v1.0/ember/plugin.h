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
    size_t struct_size;       /* sizeof(em_plugin_descriptor) */
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

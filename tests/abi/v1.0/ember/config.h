/*
 * ember/config.h — YAML configuration files and the model builder: a model described as a
 * tree of layers by registry name, built without the trainer.
 *
 *     em_module *m = em_model_from_config("examples/digits.yaml", "digits.safetensors", true);
 *     if (!m) { fprintf(stderr, "%s\n", em_last_error()); return 1; }
 *     em_module_train(m, false);
 *     em_tensor *logits = em_module_forward(m, x);          // x: (B, 1, 8, 8)
 *     em_module_free(m);
 *
 * Files are YAML (parsed by libyaml; comments, anchors and aliases work). Every node keeps the
 * line and column it came from, and every error names them: "digits.yaml:7:9: ...".
 *
 * Limits, each an EM_ERR_FORMAT naming the file, line and column where it was passed:
 *   - one document per file; nesting at most EM_CONFIG_MAX_DEPTH (64) levels;
 *   - an alias (*name) is a copy of its anchored node, and the copies that aliases make —
 *     nested ones included — may add at most EM_CONFIG_MAX_ALIAS_NODES (100,000) nodes and
 *     EM_CONFIG_MAX_ALIAS_BYTES (64 MiB: node records, text, keys and paths) to the config,
 *     however the file nests them: a 550-byte "billion laughs" file stops there instead of
 *     filling the memory;
 *   - a key or a value holding a NUL character ("\0") is refused (it would read as shorter).
 * Parsing is linear in the file: lists and maps grow geometrically and keys (duplicates,
 * anchors, em_config_node_get) are found through a hashed index; em_config_get_stats counts
 * the work so that tests can check it.
 *
 * The model grammar (the value of the top-level key `model`):
 *   - a list                         a Sequential of its items (children "0", "1", ...)
 *   - a plain name                   a layer with its default options: `ReLU`
 *   - a one-key map NAME: VALUE      the registered module class NAME, where VALUE is
 *       nothing                          the default options,
 *       a map of options                 e.g. `Linear: {in_features: 64, out_features: 10}`;
 *                                        the reserved key `layers` gives children (a list,
 *                                        named by position, or a map of name: layer, e.g.
 *                                        a Residual's `shortcut`),
 *       a list                           children of a container: `Sequential: [...]`.
 * Class names are looked up in the module registry, so a layer from any loaded plugin works.
 * Options are handed to the class as text with their location (em_options_set_text), so an
 * unknown option, a wrong type or a value out of range names the file, line and column, the
 * class, the option and what is allowed, with a did-you-mean for near names.
 */
#ifndef EMBER_CONFIG_H
#define EMBER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/error.h"
#include "ember/export.h"
#include "ember/module.h"
#include "ember/options.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_config em_config;
typedef struct em_config_node em_config_node;

typedef enum em_config_kind {
    EM_CONFIG_SCALAR = 1, /* text (an empty value is an empty scalar) */
    EM_CONFIG_LIST = 2,
    EM_CONFIG_MAP = 3,    /* keys are scalars, unique, kept in file order */
} em_config_kind;

#define EM_CONFIG_MAX_DEPTH 64
#define EM_CONFIG_MAX_ALIAS_NODES 100000
#define EM_CONFIG_MAX_ALIAS_BYTES (64u << 20)

/* Parse a YAML file (one document). A new config (free with em_config_free) or NULL with
 * EM_ERR_NOTFOUND / EM_ERR_IO naming the file, or EM_ERR_FORMAT naming file:line:column and
 * libyaml's reason (also for a duplicate key, a non-scalar key, an unknown alias, or a limit
 * above passed). */
EM_API em_config *em_config_load(const char *path);
/* The same from len bytes of text; `name` (may be NULL: "<config>") stands for the file. */
EM_API em_config *em_config_parse(const char *text, size_t len, const char *name);
/* NULL is a no-op. Every node and string of the config is freed with it. */
EM_API void em_config_free(em_config *c);
/* The file name given to load/parse (borrowed). */
EM_API const char *em_config_name(const em_config *c);

/* What parsing the config cost: for tests and bench/, which check that it grows linearly
 * with the file. */
typedef struct em_config_stats {
    size_t nodes;          /* nodes in the tree, alias copies included */
    size_t alias_nodes;    /* of which copies made for aliases */
    size_t alias_bytes;    /* bytes those copies take (counted against the limit above) */
    uint64_t key_compares; /* key comparisons made finding duplicate keys and anchors */
} em_config_stats;
/* The counts of c (all zero for NULL). */
EM_API em_config_stats em_config_get_stats(const em_config *c);

/* The document's root node (borrowed; an empty document is an empty map). */
EM_API const em_config_node *em_config_root(const em_config *c);
EM_API em_config_kind em_config_node_kind(const em_config_node *n);
/* A scalar's text (borrowed); NULL for lists and maps. */
EM_API const char *em_config_node_text(const em_config_node *n);
/* Entries of a list or map (0 for a scalar). */
EM_API size_t em_config_node_len(const em_config_node *n);
/* Entry i of a list or map (borrowed), and its key for a map (NULL for a list) into *key
 * (may be NULL). NULL past the end. */
EM_API const em_config_node *em_config_node_at(const em_config_node *n, size_t i,
                                               const char **key /* out, may be NULL */);
/* The value of `key` in a map (borrowed); NULL when absent or n is not a map (no error). */
EM_API const em_config_node *em_config_node_get(const em_config_node *n, const char *key);
/* "file:line:column" of the node's value (1-based; borrowed, lives with the config). */
EM_API const char *em_config_node_where(const em_config_node *n);
/* "file:line:column" of the node's key when it is a map value, else of the value. */
EM_API const char *em_config_node_key_where(const em_config_node *n);
/* A scalar's path from the root, e.g. "optimizer.groups[1].params" (borrowed). */
EM_API const char *em_config_node_path(const em_config_node *n);

/* Check that every key of map n is one of allowed (NULL-terminated). EM_ERR_INVALID for a
 * node that is not a map ("<where>: <path>: expected a map of ..."), or for the first unknown
 * key: "<where of the key>: unknown key 'optimiser' in <path> (did you mean 'optimizer'?);
 * allowed: ...". */
EM_API em_status em_config_check_keys(const em_config_node *n, const char *const *allowed);

/* Copy the entries of map n into o as text with their locations (em_options_set_text), except
 * the keys in skip (NULL-terminated; may be NULL). Lists of scalars become "[a, b]". A nested
 * map, or a list holding anything but scalars, is EM_ERR_INVALID naming where and the key. */
EM_API em_status em_config_to_options(const em_config_node *n, const char *const *skip,
                                      em_options *o);

/* Build a module from a model node (the grammar at the top of this file). The caller owns the
 * result. Errors name where and what: "digits.yaml:9:7: model[2]: unknown module class
 * 'Linaer' (did you mean 'Linear'?) ...", or the class's own option error with its location. */
EM_API em_module *em_model_build(const em_config_node *spec);

/* Load a config file and build its `model`; when weights (may be NULL) names a safetensors
 * file, load its tensors into the model's state dict (strict: every key and shape must match;
 * not strict: mismatches are skipped and logged at warn level). A new module, or NULL with the
 * error of the step that failed. */
EM_API em_module *em_model_from_config(const char *path, const char *weights, bool strict);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_CONFIG_H */

/*
 * config.c — YAML configuration files (libyaml) as a small tree that remembers where each node
 * came from, and the model builder (config -> module tree, optionally with weights).
 *
 * libyaml's document API parses the file (anchors and aliases resolved); the tree is copied
 * into one arena-like set of nodes owned by the em_config, each with its "file:line:column"
 * and its path from the root ("optimizer.groups[1].params") for messages. Nothing here prints.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "ember/config.h"
#include "ember/serialize.h"

struct em_config_node {
    em_config_kind kind;
    char *text;                    /* scalars */
    size_t n;                      /* entries */
    struct em_config_node **items; /* entries */
    char **keys;                   /* maps: entry keys */
    char where[160];
    char key_where[160];
    char *path;
};

struct em_config {
    char *name;
    em_config_node *root;
};

static void node_free(em_config_node *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n; i++) {
        node_free(n->items[i]);
        if (n->keys) em__free(n->keys[i]);
    }
    em__free(n->items);
    em__free(n->keys);
    em__free(n->text);
    em__free(n->path);
    em__free(n);
}

void em_config_free(em_config *c) {
    if (!c) return;
    node_free(c->root);
    em__free(c->name);
    em__free(c);
}

static em_config_node *node_new(em_config_kind kind, const char *name, yaml_mark_t mark,
                                const char *path) {
    em_config_node *n = em__calloc(1, sizeof *n, "config");
    if (!n) return NULL;
    n->kind = kind;
    snprintf(n->where, sizeof n->where, "%s:%zu:%zu", name, (size_t)mark.line + 1,
             (size_t)mark.column + 1);
    memcpy(n->key_where, n->where, sizeof n->where);
    n->path = em__strdup(path, "config");
    if (!n->path) {
        em__free(n);
        return NULL;
    }
    return n;
}

static em_status node_push(em_config_node *n, em_config_node *item, const char *key) {
    em_config_node **items = em__realloc(n->items, n->n * sizeof *items,
                                         (n->n + 1) * sizeof *items, "config");
    if (!items) return EM_ERR_NOMEM;
    n->items = items;
    if (n->kind == EM_CONFIG_MAP) {
        char **keys = em__realloc(n->keys, n->n * sizeof *keys, (n->n + 1) * sizeof *keys,
                                  "config");
        if (!keys) return EM_ERR_NOMEM;
        n->keys = keys;
        if (!(n->keys[n->n] = em__strdup(key, "config"))) return EM_ERR_NOMEM;
    }
    n->items[n->n++] = item;
    return EM_OK;
}

/* Copy yaml node `id` (depth guards alias cycles, which YAML cannot express but a
 * hand-made document could). */
static em_config_node *copy_node(yaml_document_t *doc, int id, const char *name,
                                 const char *path, int depth) {
    yaml_node_t *y = yaml_document_get_node(doc, id);
    if (!y) {
        em_set_error(EM_ERR_FORMAT, "%s: %s: dangling node", name, path);
        return NULL;
    }
    if (depth > 64) {
        em_set_error(EM_ERR_FORMAT, "%s:%zu:%zu: %s: nested more than 64 levels deep", name,
                     (size_t)y->start_mark.line + 1, (size_t)y->start_mark.column + 1, path);
        return NULL;
    }
    em_config_node *n = NULL;
    char sub[512];
    switch (y->type) {
    case YAML_SCALAR_NODE:
        if (!(n = node_new(EM_CONFIG_SCALAR, name, y->start_mark, path))) return NULL;
        if (!(n->text = em__malloc(y->data.scalar.length + 1, "config"))) goto fail;
        memcpy(n->text, y->data.scalar.value, y->data.scalar.length);
        n->text[y->data.scalar.length] = '\0';
        /* A plain "~" or "null" or an empty plain scalar is YAML's null: an empty value. */
        if (y->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
            (!strcmp(n->text, "~") || !strcmp(n->text, "null") || !strcmp(n->text, "Null") ||
             !strcmp(n->text, "NULL")))
            n->text[0] = '\0';
        return n;
    case YAML_SEQUENCE_NODE: {
        if (!(n = node_new(EM_CONFIG_LIST, name, y->start_mark, path))) return NULL;
        size_t i = 0;
        for (yaml_node_item_t *it = y->data.sequence.items.start;
             it < y->data.sequence.items.top; it++, i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            em_config_node *c = copy_node(doc, *it, name, sub, depth + 1);
            if (!c || node_push(n, c, NULL) != EM_OK) {
                node_free(c);
                goto fail;
            }
        }
        return n;
    }
    case YAML_MAPPING_NODE: {
        if (!(n = node_new(EM_CONFIG_MAP, name, y->start_mark, path))) return NULL;
        for (yaml_node_pair_t *p = y->data.mapping.pairs.start; p < y->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = yaml_document_get_node(doc, p->key);
            if (!k || k->type != YAML_SCALAR_NODE) {
                em_set_error(EM_ERR_FORMAT, "%s:%zu:%zu: %s: a key must be plain text", name,
                             k ? (size_t)k->start_mark.line + 1 : 0,
                             k ? (size_t)k->start_mark.column + 1 : 0, path);
                goto fail;
            }
            const char *key = (const char *)k->data.scalar.value;
            for (size_t j = 0; j < n->n; j++)
                if (!strcmp(n->keys[j], key)) {
                    em_set_error(EM_ERR_FORMAT, "%s:%zu:%zu: duplicate key '%s' in %s (first at %s)",
                                 name, (size_t)k->start_mark.line + 1,
                                 (size_t)k->start_mark.column + 1, key,
                                 *path ? path : "the top level", n->items[j]->key_where);
                    goto fail;
                }
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", key);
            em_config_node *c = copy_node(doc, p->value, name, sub, depth + 1);
            if (!c) goto fail;
            snprintf(c->key_where, sizeof c->key_where, "%s:%zu:%zu", name,
                     (size_t)k->start_mark.line + 1, (size_t)k->start_mark.column + 1);
            if (node_push(n, c, key) != EM_OK) {
                node_free(c);
                goto fail;
            }
        }
        return n;
    }
    default:
        em_set_error(EM_ERR_FORMAT, "%s: %s: empty node", name, path);
        return NULL;
    }
fail:
    node_free(n);
    return NULL;
}

em_config *em_config_parse(const char *text, size_t len, const char *name) {
    if (!text) {
        em_set_error(EM_ERR_INVALID, "config: NULL text");
        return NULL;
    }
    if (!name) name = "<config>";
    em_config *c = em__calloc(1, sizeof *c, "config");
    if (!c) return NULL;
    if (!(c->name = em__strdup(name, "config"))) {
        em__free(c);
        return NULL;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        em_config_free(c);
        em_set_error(EM_ERR_NOMEM, "config: out of memory initialising the YAML parser");
        return NULL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        size_t line = parser.problem_mark.line + 1, col = parser.problem_mark.column + 1;
        em_set_error(EM_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", name, line, col,
                     parser.problem ? parser.problem : "unknown problem",
                     parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        em_config_free(c);
        return NULL;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        yaml_mark_t m = {0, 0, 0};
        c->root = node_new(EM_CONFIG_MAP, name, m, "");
    } else {
        c->root = copy_node(&doc, 1, name, "", 0);
    }
    yaml_document_delete(&doc);
    /* A config is one document: a second one ("---") would be silently ignored. */
    if (c->root && yaml_parser_load(&parser, &doc)) {
        yaml_node_t *more = yaml_document_get_root_node(&doc);
        if (more)
            em_set_error(EM_ERR_FORMAT, "%s:%zu:%zu: a second YAML document; a config file "
                         "holds one", name, (size_t)more->start_mark.line + 1,
                         (size_t)more->start_mark.column + 1);
        yaml_document_delete(&doc);
        if (more) node_free(c->root), c->root = NULL;
    } else if (c->root) {
        em_set_error(EM_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error after the document: %s", name,
                     (size_t)parser.problem_mark.line + 1, (size_t)parser.problem_mark.column + 1,
                     parser.problem ? parser.problem : "unknown problem");
        node_free(c->root);
        c->root = NULL;
    }
    yaml_parser_delete(&parser);
    if (!c->root) {
        em_config_free(c);
        return NULL;
    }
    return c;
}

em_config *em_config_load(const char *path) {
    if (!path) {
        em_set_error(EM_ERR_INVALID, "config: NULL path");
        return NULL;
    }
    /* Regular files only (a FIFO or /dev/zero would block or never end), read whole. */
    char *buf;
    size_t len;
    if (em__input_read_all("config", path, &buf, &len) != EM_OK) return NULL;
    em_config *c = em_config_parse(buf, len, path);
    em__free(buf);
    return c;
}

const char *em_config_name(const em_config *c) { return c ? c->name : NULL; }
const em_config_node *em_config_root(const em_config *c) { return c ? c->root : NULL; }
em_config_kind em_config_node_kind(const em_config_node *n) { return n ? n->kind : 0; }
const char *em_config_node_text(const em_config_node *n) {
    return n && n->kind == EM_CONFIG_SCALAR ? n->text : NULL;
}
size_t em_config_node_len(const em_config_node *n) { return n ? n->n : 0; }
const char *em_config_node_where(const em_config_node *n) { return n ? n->where : "?"; }
const char *em_config_node_key_where(const em_config_node *n) { return n ? n->key_where : "?"; }
const char *em_config_node_path(const em_config_node *n) { return n ? n->path : ""; }

const em_config_node *em_config_node_at(const em_config_node *n, size_t i, const char **key) {
    if (!n || i >= n->n) return NULL;
    if (key) *key = n->keys ? n->keys[i] : NULL;
    return n->items[i];
}

const em_config_node *em_config_node_get(const em_config_node *n, const char *key) {
    if (!n || n->kind != EM_CONFIG_MAP || !key) return NULL;
    for (size_t i = 0; i < n->n; i++)
        if (!strcmp(n->keys[i], key)) return n->items[i];
    return NULL;
}

static const char *path_or_top(const em_config_node *n) {
    return *n->path ? n->path : "the top level";
}

em_status em_config_check_keys(const em_config_node *n, const char *const *allowed) {
    if (!n || !allowed) return em_set_error(EM_ERR_INVALID, "config: NULL node or key list");
    char list[512] = "";
    size_t used = 0;
    for (const char *const *a = allowed; *a && used < sizeof list; a++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", a == allowed ? "" : ", ",
                                 *a);
    if (n->kind != EM_CONFIG_MAP)
        return em_set_error(EM_ERR_INVALID, "%s: %s: expected a map (keys: %s)", n->where,
                            path_or_top(n), list);
    for (size_t i = 0; i < n->n; i++) {
        bool ok = false;
        const char *best = NULL;
        int bd = 1000;
        for (const char *const *a = allowed; *a; a++) {
            if (!strcmp(*a, n->keys[i])) ok = true;
            int d = em__edit_distance(*a, n->keys[i]);
            if (d < bd) bd = d, best = *a;
        }
        if (ok) continue;
        char hint[128] = "";
        size_t kl = strlen(n->keys[i]);
        if (best && bd <= (kl > 5 ? 3 : 2)) snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
        return em_set_error(EM_ERR_INVALID, "%s: unknown key '%s' in %s%s; allowed: %s",
                            n->items[i]->key_where, n->keys[i], path_or_top(n), hint, list);
    }
    return EM_OK;
}

static bool in_list(const char *const *list, const char *s) {
    for (; list && *list; list++)
        if (!strcmp(*list, s)) return true;
    return false;
}

/* A scalar or a list of scalars as option text; false when it is neither. */
static bool option_text(const em_config_node *v, char *buf, size_t cap) {
    if (v->kind == EM_CONFIG_SCALAR) {
        snprintf(buf, cap, "%s", v->text);
        return true;
    }
    if (v->kind != EM_CONFIG_LIST) return false;
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < v->n; i++) {
        if (v->items[i]->kind != EM_CONFIG_SCALAR) return false;
        if (used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "",
                                     v->items[i]->text);
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return true;
}

em_status em_config_to_options(const em_config_node *n, const char *const *skip, em_options *o) {
    if (!n || !o) return em_set_error(EM_ERR_INVALID, "config: NULL node or options");
    if (n->kind == EM_CONFIG_SCALAR && !*n->text) return EM_OK; /* an empty value: no options */
    if (n->kind != EM_CONFIG_MAP)
        return em_set_error(EM_ERR_INVALID, "%s: %s: expected a map of options", n->where,
                            path_or_top(n));
    for (size_t i = 0; i < n->n; i++) {
        if (in_list(skip, n->keys[i])) continue;
        char text[1024];
        if (!option_text(n->items[i], text, sizeof text))
            return em_set_error(EM_ERR_INVALID, "%s: option '%s' (%s): expected a value or a "
                                "list of values, not a %s", n->items[i]->where, n->keys[i],
                                n->items[i]->path,
                                n->items[i]->kind == EM_CONFIG_MAP ? "map" : "nested list");
        em_status s = em_options_set_text(o, n->keys[i], text, n->items[i]->where);
        if (s != EM_OK && !strstr(em_last_error(), n->items[i]->where)) {
            char msg[1024]; /* e.g. a key that is no option name: say where it is */
            snprintf(msg, sizeof msg, "%s", em_last_error());
            return em_set_error(s, "%s: %s", n->items[i]->key_where, msg);
        }
        if (s != EM_OK) return s;
    }
    return EM_OK;
}

/* ---- the model builder ------------------------------------------------------------------ */

/* Prefix the pending error with where/path unless it already names the file. */
static void locate_error(const em_config_node *n, const char *file) {
    const char *msg = em_last_error();
    if (file && !strncmp(msg, file, strlen(file))) return;
    char copy[2048];
    snprintf(copy, sizeof copy, "%s", msg);
    em_set_error(em_last_status(), "%s: %s: %s", n->where, path_or_top(n), copy);
}

static const char *file_of(const em_config_node *n, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", n->where);
    char *c = strrchr(buf, ':');
    if (c) *c = '\0';
    c = strrchr(buf, ':');
    if (c) *c = '\0';
    return buf;
}

static em_module *build(const em_config_node *spec, int depth);

static em_status add_children(em_module *m, const em_config_node *kids, int depth) {
    if (kids->kind == EM_CONFIG_SCALAR && !*kids->text) return EM_OK;
    if (kids->kind == EM_CONFIG_SCALAR)
        return em_set_error(EM_ERR_INVALID, "%s: %s: expected a list or a map of layers",
                            kids->where, kids->path);
    for (size_t i = 0; i < kids->n; i++) {
        em_module *c = build(kids->items[i], depth + 1);
        if (!c) return em_last_status();
        em_status s = kids->kind == EM_CONFIG_LIST ? em_module_append_child(m, c)
                                                   : em_module_add_child(m, kids->keys[i], c);
        if (s != EM_OK) {
            char f[200];
            locate_error(kids->items[i], file_of(kids, f, sizeof f));
            return s;
        }
    }
    return EM_OK;
}

static em_module *build(const em_config_node *spec, int depth) {
    char file[200];
    file_of(spec, file, sizeof file);
    if (depth > 32) {
        em_set_error(EM_ERR_INVALID, "%s: %s: layers nested more than 32 deep", spec->where,
                     spec->path);
        return NULL;
    }
    const char *cls = NULL;
    const em_config_node *val = NULL;
    const em_config_node *at = spec;
    if (spec->kind == EM_CONFIG_LIST) {
        cls = "Sequential";
        val = spec;
    } else if (spec->kind == EM_CONFIG_SCALAR) {
        cls = spec->text;
        if (!*cls) {
            em_set_error(EM_ERR_INVALID, "%s: %s: expected a layer (a class name, a map "
                         "'Class: {options}' or a list of layers), found nothing", spec->where,
                         path_or_top(spec));
            return NULL;
        }
    } else {
        if (spec->n != 1) {
            em_set_error(EM_ERR_INVALID, "%s: %s: a layer is a map with one key, the class name "
                         "(e.g. 'Linear: {in_features: 64, out_features: 10}'); found %zu keys",
                         spec->where, path_or_top(spec), spec->n);
            return NULL;
        }
        cls = spec->keys[0];
        val = spec->items[0];
        at = val;
    }
    if (!em_module_class_find(cls)) {
        locate_error(spec, file);
        return NULL;
    }
    em_options *o = em_options_new();
    if (!o) return NULL;
    const em_config_node *kids = NULL;
    if (val && val->kind == EM_CONFIG_LIST) {
        kids = val;
    } else if (val && val->kind == EM_CONFIG_MAP) {
        static const char *const skip[] = {"layers", NULL};
        kids = em_config_node_get(val, "layers");
        if (em_config_to_options(val, skip, o) != EM_OK) {
            em_options_free(o);
            return NULL;
        }
    } else if (val && *val->text) {
        em_set_error(EM_ERR_INVALID, "%s: %s: expected a map of options for %s, found '%s'",
                     val->where, val->path, cls, val->text);
        em_options_free(o);
        return NULL;
    }
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    if (!m) {
        locate_error(at, file);
        return NULL;
    }
    if (kids && add_children(m, kids, depth) != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

em_module *em_model_build(const em_config_node *spec) {
    if (!spec) {
        em_set_error(EM_ERR_INVALID, "model: NULL config node");
        return NULL;
    }
    return build(spec, 0);
}

em_module *em_model_from_config(const char *path, const char *weights, bool strict) {
    em_config *c = em_config_load(path);
    if (!c) return NULL;
    const em_config_node *spec = em_config_node_get(c->root, "model");
    if (!spec) {
        em_set_error(EM_ERR_INVALID, "%s: no 'model' key at the top level", path);
        em_config_free(c);
        return NULL;
    }
    em_module *m = em_model_build(spec);
    em_config_free(c);
    if (!m || !weights) return m;
    em_dict *sd = NULL;
    em_load_report *rep = NULL;
    em_status s = (sd = em_module_state_dict(m)) ? em_load_into(weights, sd, strict, &rep, NULL)
                                                 : em_last_status();
    if (s == EM_OK && rep) {
        char text[1024];
        em_load_report_format(rep, text, sizeof text);
        if (em_load_report_count(rep, EM_LOAD_MISSING) ||
            em_load_report_count(rep, EM_LOAD_UNEXPECTED) ||
            em_load_report_count(rep, EM_LOAD_SHAPE_MISMATCH))
            em_log_write(EM_LOG_WARN, "%s: loaded non-strictly: %s", weights, text);
    }
    if (s != EM_OK && !strstr(em_last_error(), weights)) {
        char copy[2048];
        snprintf(copy, sizeof copy, "%s", em_last_error());
        em_set_error(s, "%s: %s", weights, copy);
    }
    em_load_report_free(rep);
    em_dict_free(sd);
    if (s != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

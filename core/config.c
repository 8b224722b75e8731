/*
 * config.c — YAML configuration files (libyaml) as a small tree that remembers where each node
 * came from, and the model builder (config -> module tree, optionally with weights).
 *
 * Parsing. libyaml's event parser drives a builder with an explicit stack of open lists and
 * maps (no recursion on the file's nesting). Each node carries its "file:line:column" and
 * its path from the root ("optimizer.groups[1].params") for messages. The work is linear in
 * the file: entry arrays grow geometrically, and every map keeps a hashed index of its keys
 * (strindex.c), so a duplicate key is found without scanning the keys before it; anchors are
 * found the same way. (libyaml's own document loader scans every anchor for each new anchor
 * and alias, which is why the events are used instead.)
 *
 * Aliases. An alias becomes a copy of its anchored node (with the paths of where the alias
 * is), and every node and byte those copies make, nested aliases included, counts against
 * EM_CONFIG_MAX_ALIAS_NODES and EM_CONFIG_MAX_ALIAS_BYTES, so a few hundred bytes of nested
 * aliases cannot expand into gigabytes. Nothing here prints.
 */
#include "ember/dict.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/options.h"
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
    size_t n, cap;                 /* entries, room */
    struct em_config_node **items; /* entries */
    char **keys;                   /* maps: entry keys */
    em__strindex index;            /* maps: keys -> position */
    char where[160];
    char key_where[160];
    char *path;
};

struct em_config {
    char *name;
    em_config_node *root;
    em_config_stats stats;
};

static void node_free(em_config_node *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n; i++) {
        node_free(n->items[i]);
        if (n->keys) em__free(n->keys[i]);
    }
    em__free(n->items);
    em__free(n->keys);
    em__strindex_free(&n->index);
    em__free(n->text);
    em__free(n->path);
    em__free(n);
}

void em_config_free(em_config *c) {
    if (!c) return;
    node_free(c->root);
    em__free(c->name);
    em__free(c);
    em__live_dec(EM__LIVE_CONFIG);
}

/* A node at `where` ("file:line:col") with its path. */
static em_config_node *node_new(em_config_kind kind, const char *where, const char *path) {
    em_config_node *n = em__calloc(1, sizeof *n, "config");
    if (!n) return NULL;
    n->kind = kind;
    snprintf(n->where, sizeof n->where, "%s", where);
    memcpy(n->key_where, n->where, sizeof n->where);
    n->path = em__strdup(path, "config");
    if (!n->path) {
        em__free(n);
        return NULL;
    }
    return n;
}

/* Append item (and its key, copied, for a map), growing the arrays geometrically. The key
 * must not be in the map yet (the caller checked). */
static em_status node_push(em_config_node *n, em_config_node *item, const char *key,
                           uint64_t *compares) {
    if (n->n == n->cap) {
        size_t cap = n->cap ? 2 * n->cap : 4;
        em_config_node **items = em__realloc(n->items, n->n * sizeof *items, cap * sizeof *items,
                                             "config");
        if (!items) return EM_ERR_NOMEM;
        n->items = items;
        if (n->kind == EM_CONFIG_MAP) {
            char **keys = em__realloc(n->keys, n->n * sizeof *keys, cap * sizeof *keys, "config");
            if (!keys) return EM_ERR_NOMEM;
            n->keys = keys;
        }
        n->cap = cap;
    }
    if (n->kind == EM_CONFIG_MAP) {
        if (!(n->keys[n->n] = em__strdup(key, "config"))) return EM_ERR_NOMEM;
        if (em__strindex_add(&n->index, n->keys, sizeof(char *), n->n, compares) != EM_OK) {
            em__free(n->keys[n->n]);
            return EM_ERR_NOMEM;
        }
    }
    n->items[n->n++] = item;
    return EM_OK;
}

/* ---- the builder: libyaml events -> nodes ---------------------------------------------------- */

typedef struct frame {
    em_config_node *n; /* the list or map being filled */
    char *anchor;      /* its anchor (owned), registered when it is complete */
    char *key;         /* maps: the key waiting for its value (owned), or NULL */
    char key_where[160];
} frame;

typedef struct builder {
    const char *name; /* the file */
    em_config_stats *stats;
    frame stack[EM_CONFIG_MAX_DEPTH + 1];
    int depth;                 /* open frames */
    em_config_node *root;
    /* anchors: names -> nodes (borrowed from the tree, or from `orphans` for anchored keys) */
    char **anchor_names;
    em_config_node **anchor_nodes;
    size_t n_anchors, cap_anchors;
    em__strindex anchor_index;
    em_config_node **orphans;
    size_t n_orphans, cap_orphans;
} builder;

static void builder_free(builder *b) {
    for (int i = 0; i < b->depth; i++) {
        node_free(b->stack[i].n);
        em__free(b->stack[i].anchor);
        em__free(b->stack[i].key);
    }
    node_free(b->root);
    for (size_t i = 0; i < b->n_anchors; i++) em__free(b->anchor_names[i]);
    em__free(b->anchor_names);
    em__free(b->anchor_nodes);
    em__strindex_free(&b->anchor_index);
    for (size_t i = 0; i < b->n_orphans; i++) node_free(b->orphans[i]);
    em__free(b->orphans);
}

static void mark_where(const builder *b, yaml_mark_t m, char *buf, size_t cap) {
    snprintf(buf, cap, "%s:%zu:%zu", b->name, (size_t)m.line + 1, (size_t)m.column + 1);
}

static const char *top_path(const char *path) { return *path ? path : "the top level"; }

/* Grow a pointer array (geometrically) so that it has room for one more. */
static bool room_for_one(void **arr, size_t n, size_t *cap, size_t elem) {
    if (n < *cap) return true;
    size_t c = *cap ? 2 * *cap : 8;
    void *a = em__realloc(*arr, n * elem, c * elem, "config");
    if (!a) return false;
    *arr = a;
    *cap = c;
    return true;
}

static em_status anchor_register(builder *b, const char *name, em_config_node *n) {
    ptrdiff_t at = em__strindex_find(&b->anchor_index, b->anchor_names, sizeof(char *), name,
                                     &b->stats->key_compares);
    if (at >= 0) { /* redefined: an alias refers to the latest node with that anchor */
        b->anchor_nodes[at] = n;
        return EM_OK;
    }
    if (b->n_anchors == b->cap_anchors) { /* both arrays grow together, geometrically */
        size_t cap = b->cap_anchors ? 2 * b->cap_anchors : 8;
        char **names = em__realloc(b->anchor_names, b->n_anchors * sizeof *names,
                                   cap * sizeof *names, "config");
        if (!names) return EM_ERR_NOMEM;
        b->anchor_names = names;
        em_config_node **nodes = em__realloc(b->anchor_nodes, b->n_anchors * sizeof *nodes,
                                             cap * sizeof *nodes, "config");
        if (!nodes) return EM_ERR_NOMEM;
        b->anchor_nodes = nodes;
        b->cap_anchors = cap;
    }
    if (!(b->anchor_names[b->n_anchors] = em__strdup(name, "config"))) return EM_ERR_NOMEM;
    if (em__strindex_add(&b->anchor_index, b->anchor_names, sizeof(char *), b->n_anchors,
                         &b->stats->key_compares) != EM_OK) {
        em__free(b->anchor_names[b->n_anchors]);
        return EM_ERR_NOMEM;
    }
    b->anchor_nodes[b->n_anchors++] = n;
    return EM_OK;
}

/* The path of the next entry of the innermost open frame (or "" for the root). */
static void child_path(const builder *b, char *buf, size_t cap) {
    if (!b->depth) {
        buf[0] = '\0';
        return;
    }
    const frame *f = &b->stack[b->depth - 1];
    if (f->n->kind == EM_CONFIG_LIST)
        snprintf(buf, cap, "%s[%zu]", f->n->path, f->n->n);
    else
        snprintf(buf, cap, "%s%s%s", f->n->path, *f->n->path ? "." : "", f->key ? f->key : "");
}

/* Attach a complete node to the innermost open frame, or make it the root. Takes n. */
static em_status attach(builder *b, em_config_node *n) {
    if (!b->depth) {
        b->root = n;
        return EM_OK;
    }
    frame *f = &b->stack[b->depth - 1];
    if (f->n->kind == EM_CONFIG_MAP) {
        memcpy(n->key_where, f->key_where, sizeof n->key_where);
        em_status st = node_push(f->n, n, f->key, &b->stats->key_compares);
        if (st != EM_OK) {
            node_free(n);
            return st;
        }
        em__free(f->key);
        f->key = NULL;
        return EM_OK;
    }
    em_status st = node_push(f->n, n, NULL, NULL);
    if (st != EM_OK) node_free(n);
    return st;
}

/* Whether the innermost open frame is a map waiting for a key. */
static bool wants_key(const builder *b) {
    return b->depth && b->stack[b->depth - 1].n->kind == EM_CONFIG_MAP && !b->stack[b->depth - 1].key;
}

/* Take `key` (at `where`) as the innermost map's next key: a duplicate is refused. */
static em_status take_key(builder *b, const char *key, size_t len, const char *where) {
    frame *f = &b->stack[b->depth - 1];
    if (strlen(key) != len)
        return em_set_error(EM_ERR_FORMAT, "%s: %s: a key holds a NUL character", where,
                            top_path(f->n->path));
    ptrdiff_t j = em__strindex_find(&f->n->index, f->n->keys, sizeof(char *), key,
                                    &b->stats->key_compares);
    if (j >= 0)
        return em_set_error(EM_ERR_FORMAT, "%s: duplicate key '%s' in %s (first at %s)", where, key,
                            top_path(f->n->path), f->n->items[j]->key_where);
    if (!(f->key = em__strdup(key, "config"))) return EM_ERR_NOMEM;
    snprintf(f->key_where, sizeof f->key_where, "%s", where);
    return EM_OK;
}

static em_status on_scalar(builder *b, const yaml_event_t *ev) {
    char where[160];
    mark_where(b, ev->start_mark, where, sizeof where);
    const char *v = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    const char *anchor = (const char *)ev->data.scalar.anchor;
    if (wants_key(b)) {
        em_status st = take_key(b, v, len, where);
        if (st != EM_OK || !anchor) return st;
        /* an anchored key: its text stays available to aliases */
        em_config_node *k = node_new(EM_CONFIG_SCALAR, where, "");
        if (!k || !(k->text = em__strdup(v, "config")) ||
            !room_for_one((void **)&b->orphans, b->n_orphans, &b->cap_orphans, sizeof *b->orphans)) {
            node_free(k);
            return EM_ERR_NOMEM;
        }
        b->orphans[b->n_orphans++] = k;
        b->stats->nodes++;
        return anchor_register(b, anchor, k);
    }
    char path[512];
    child_path(b, path, sizeof path);
    if (strlen(v) != len)
        return em_set_error(EM_ERR_FORMAT, "%s: %s: the value holds a NUL character", where,
                            top_path(path));
    em_config_node *n = node_new(EM_CONFIG_SCALAR, where, path);
    if (!n) return EM_ERR_NOMEM;
    if (!(n->text = em__malloc(len + 1, "config"))) {
        node_free(n);
        return EM_ERR_NOMEM;
    }
    memcpy(n->text, v, len + 1);
    /* A plain "~" or "null" or an empty plain scalar is YAML's null: an empty value. */
    if (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
        (!strcmp(n->text, "~") || !strcmp(n->text, "null") || !strcmp(n->text, "Null") ||
         !strcmp(n->text, "NULL")))
        n->text[0] = '\0';
    b->stats->nodes++;
    em_status st = anchor ? anchor_register(b, anchor, n) : EM_OK;
    if (st != EM_OK) {
        node_free(n);
        return st;
    }
    return attach(b, n);
}

static em_status on_start(builder *b, const yaml_event_t *ev, em_config_kind kind,
                          const yaml_char_t *anchor) {
    char where[160], path[512];
    mark_where(b, ev->start_mark, where, sizeof where);
    if (wants_key(b))
        return em_set_error(EM_ERR_FORMAT, "%s: %s: a key must be plain text, not a %s", where,
                            top_path(b->stack[b->depth - 1].n->path),
                            kind == EM_CONFIG_MAP ? "map" : "list");
    child_path(b, path, sizeof path);
    if (b->depth >= EM_CONFIG_MAX_DEPTH)
        return em_set_error(EM_ERR_FORMAT, "%s: %s: nested more than %d levels deep", where,
                            top_path(path), EM_CONFIG_MAX_DEPTH);
    em_config_node *n = node_new(kind, where, path);
    if (!n) return EM_ERR_NOMEM;
    char *a = anchor ? em__strdup((const char *)anchor, "config") : NULL;
    if (anchor && !a) {
        node_free(n);
        return EM_ERR_NOMEM;
    }
    b->stats->nodes++;
    b->stack[b->depth++] = (frame){.n = n, .anchor = a};
    return EM_OK;
}

static em_status on_end(builder *b) {
    frame f = b->stack[--b->depth];
    em__free(f.key); /* none: libyaml ends a map only after a value */
    em_status st = f.anchor ? anchor_register(b, f.anchor, f.n) : EM_OK;
    em__free(f.anchor);
    if (st != EM_OK) {
        node_free(f.n);
        return st;
    }
    return attach(b, f.n);
}

/* A copy of src at `path`, `depth` levels down; counted against the alias limits. */
static em_config_node *copy_tree(builder *b, const em_config_node *src, const char *path,
                                 int depth, const char *at, const char *alias) {
    if (depth > EM_CONFIG_MAX_DEPTH) {
        em_set_error(EM_ERR_FORMAT, "%s: %s: alias *%s nests the config more than %d levels "
                     "deep", at, top_path(path), alias, EM_CONFIG_MAX_DEPTH);
        return NULL;
    }
    size_t bytes = sizeof *src + strlen(path) + 1 + (src->text ? strlen(src->text) + 1 : 0) +
                   src->n * (sizeof *src->items + (src->keys ? sizeof *src->keys : 0));
    b->stats->alias_nodes++;
    b->stats->alias_bytes += bytes;
    if (b->stats->alias_nodes > EM_CONFIG_MAX_ALIAS_NODES ||
        b->stats->alias_bytes > EM_CONFIG_MAX_ALIAS_BYTES) {
        em_set_error(EM_ERR_FORMAT, "%s: %s: alias *%s expands the config past the limit of %d "
                     "nodes and %u MiB that aliases may add (each alias copies its anchored "
                     "node, and nested aliases multiply)", at, top_path(path), alias,
                     EM_CONFIG_MAX_ALIAS_NODES, EM_CONFIG_MAX_ALIAS_BYTES >> 20);
        return NULL;
    }
    em_config_node *n = node_new(src->kind, src->where, path);
    if (!n) return NULL;
    b->stats->nodes++;
    memcpy(n->key_where, src->key_where, sizeof n->key_where);
    if (src->text && !(n->text = em__strdup(src->text, "config"))) goto fail;
    char sub[512];
    for (size_t i = 0; i < src->n; i++) {
        if (src->kind == EM_CONFIG_LIST)
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
        else
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", src->keys[i]);
        if (src->keys) b->stats->alias_bytes += strlen(src->keys[i]) + 1;
        em_config_node *c = copy_tree(b, src->items[i], sub, depth + 1, at, alias);
        if (!c) goto fail;
        if (node_push(n, c, src->keys ? src->keys[i] : NULL, &b->stats->key_compares) != EM_OK) {
            node_free(c);
            goto fail;
        }
    }
    return n;
fail:
    node_free(n);
    return NULL;
}

static em_status on_alias(builder *b, const yaml_event_t *ev) {
    char where[160];
    mark_where(b, ev->start_mark, where, sizeof where);
    const char *name = (const char *)ev->data.alias.anchor;
    ptrdiff_t at = em__strindex_find(&b->anchor_index, b->anchor_names, sizeof(char *), name,
                                     &b->stats->key_compares);
    if (at < 0) {
        for (int i = 0; i < b->depth; i++)
            if (b->stack[i].anchor && !strcmp(b->stack[i].anchor, name))
                return em_set_error(EM_ERR_FORMAT, "%s: alias *%s refers to the node that "
                                    "contains it (&%s at %s): a config cannot hold itself",
                                    where, name, name, b->stack[i].n->where);
        return em_set_error(EM_ERR_FORMAT, "%s: alias *%s: no anchor &%s before it", where, name,
                            name);
    }
    const em_config_node *src = b->anchor_nodes[at];
    if (wants_key(b)) {
        if (src->kind != EM_CONFIG_SCALAR)
            return em_set_error(EM_ERR_FORMAT, "%s: %s: a key must be plain text; alias *%s is "
                                "a %s", where, top_path(b->stack[b->depth - 1].n->path), name,
                                src->kind == EM_CONFIG_MAP ? "map" : "list");
        return take_key(b, src->text, strlen(src->text), where);
    }
    char path[512];
    child_path(b, path, sizeof path);
    em_config_node *n = copy_tree(b, src, path, b->depth, where, name);
    return n ? attach(b, n) : em_last_status();
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
    em__live_inc(EM__LIVE_CONFIG);
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        em_config_free(c);
        em_set_error(EM_ERR_NOMEM, "config: out of memory initialising the YAML parser");
        return NULL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    builder b = {.name = c->name, .stats = &c->stats};
    em_status st = EM_OK;
    int documents = 0;
    for (bool done = false; !done && st == EM_OK;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            size_t line = parser.problem_mark.line + 1, col = parser.problem_mark.column + 1;
            st = em_set_error(EM_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", name, line,
                              col, parser.problem ? parser.problem : "unknown problem",
                              parser.context ? " " : "", parser.context ? parser.context : "");
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = true; break;
        case YAML_DOCUMENT_START_EVENT:
            if (documents++) {
                char where[160];
                mark_where(&b, ev.start_mark, where, sizeof where);
                st = em_set_error(EM_ERR_FORMAT, "%s: a second YAML document: a config file "
                                  "holds one", where);
            }
            break;
        case YAML_SCALAR_EVENT: st = on_scalar(&b, &ev); break;
        case YAML_SEQUENCE_START_EVENT:
            st = on_start(&b, &ev, EM_CONFIG_LIST, ev.data.sequence_start.anchor);
            break;
        case YAML_MAPPING_START_EVENT:
            st = on_start(&b, &ev, EM_CONFIG_MAP, ev.data.mapping_start.anchor);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: st = on_end(&b); break;
        case YAML_ALIAS_EVENT: st = on_alias(&b, &ev); break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    if (st == EM_OK && !b.root) { /* an empty file: an empty map */
        char where[200];
        snprintf(where, sizeof where, "%s:1:1", name);
        if ((b.root = node_new(EM_CONFIG_MAP, where, ""))) c->stats.nodes++;
        else st = EM_ERR_NOMEM;
    }
    if (st != EM_OK) {
        builder_free(&b);
        em_config_free(c);
        return NULL;
    }
    c->root = b.root;
    b.root = NULL;
    builder_free(&b);
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

em_config_stats em_config_get_stats(const em_config *c) {
    em_config_stats s = {0, 0, 0, 0};
    return c ? c->stats : s;
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
    ptrdiff_t i = em__strindex_find(&n->index, n->keys, sizeof(char *), key, NULL);
    return i >= 0 ? n->items[i] : NULL;
}

static const char *path_or_top(const em_config_node *n) {
    return *n->path ? n->path : "the top level";
}

static bool in_list(const char *const *list, const char *s) {
    for (; list && *list; list++)
        if (!strcmp(*list, s)) return true;
    return false;
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
        if (in_list(allowed, n->keys[i])) continue;
        const char *best = NULL;
        int bd = 1000;
        for (const char *const *a = allowed; *a; a++) { /* the suggestion: only for a misfit */
            int d = em__edit_distance(*a, n->keys[i]);
            if (d < bd) bd = d, best = *a;
        }
        char hint[128] = "";
        size_t kl = strlen(n->keys[i]);
        if (best && bd <= (kl > 5 ? 3 : 2)) snprintf(hint, sizeof hint, " (did you mean '%s'?)", best);
        return em_set_error(EM_ERR_INVALID, "%s: unknown key '%s' in %s%s; allowed: %s",
                            n->items[i]->key_where, n->keys[i], path_or_top(n), hint, list);
    }
    return EM_OK;
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
    if (em__module_set_where(m, spec->where) != EM_OK) {
        em_module_free(m);
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

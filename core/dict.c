/*
 * dict.c — the ordered dictionary of named tensors (ember/dict.h).
 *
 * Layout. Entries live in a dense array in insertion order (what em_dict_key(d, i) indexes);
 * a separate open-addressing table (linear probing, power-of-two size, load <= 1/2) maps a
 * key's hash to its entry's position + 1 (0 marks an empty slot).
 *
 * Removal shifts the later entries down one place, which keeps the order, and rebuilds the
 * index in place (no allocation, so it cannot fail). That makes a removal O(n), fine for state
 * dicts where removals are rare and lookups are what matters.
 *
 * Out of memory. em_dict_set obtains everything it may need (the key copy, a bigger entry
 * array, a bigger index) before changing anything, so a failure leaves the dict as it was.
 */
#include <string.h>

#include "ember/dict.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "internal.h"

typedef struct dict_entry {
    char *key;       /* owned copy */
    em_tensor *t;    /* one reference held by the dict */
    uint64_t hash;
} dict_entry;

struct em_dict {
    dict_entry *entries; /* [len], insertion order */
    size_t len, cap;
    size_t *index;       /* [nslots]: entry position + 1, or 0 for an empty slot */
    size_t nslots;       /* 0 or a power of two, always > 2 * len */
};

#define DICT_MIN_SLOTS 16
#define DICT_MIN_ENTRIES 8

/* FNV-1a, 64-bit. */
static uint64_t key_hash(const char *key) {
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    return h;
}

/* The index slot holding key, or the empty slot where it would go. nslots must be > 0. */
static size_t slot_find(const em_dict *d, const char *key, uint64_t hash) {
    size_t mask = d->nslots - 1;
    size_t s = (size_t)hash & mask;
    while (d->index[s] != 0) {
        const dict_entry *e = &d->entries[d->index[s] - 1];
        if (e->hash == hash && strcmp(e->key, key) == 0)
            return s;
        s = (s + 1) & mask;
    }
    return s;
}

/* Position of key in the entry array, or -1. */
static ptrdiff_t entry_find(const em_dict *d, const char *key) {
    if (!d || !key || d->len == 0)
        return -1;
    size_t s = slot_find(d, key, key_hash(key));
    return d->index[s] ? (ptrdiff_t)(d->index[s] - 1) : -1;
}

/* Fill an all-zero index of nslots slots from the entries. */
static void index_fill(size_t *index, size_t nslots, const dict_entry *entries, size_t len) {
    size_t mask = nslots - 1;
    for (size_t i = 0; i < len; i++) {
        size_t s = (size_t)entries[i].hash & mask;
        while (index[s] != 0)
            s = (s + 1) & mask;
        index[s] = i + 1;
    }
}

em_dict *em_dict_new(void) {
    em_dict *d = em__calloc(1, sizeof(em_dict), "dict");
    if (d) em__live_inc(EM__LIVE_DICT);
    return d;
}

void em_dict_free(em_dict *d) {
    if (!d)
        return;
    for (size_t i = 0; i < d->len; i++) {
        em__free(d->entries[i].key);
        em_tensor_release(d->entries[i].t);
    }
    em__free(d->entries);
    em__free(d->index);
    em__free(d);
    em__live_dec(EM__LIVE_DICT);
}

/* The room a new entry needs: a bigger entry array and/or index, allocated but not yet
 * installed. Either pointer stays NULL when the current one suffices. */
typedef struct dict_growth {
    dict_entry *entries;
    size_t cap;
    size_t *index;
    size_t nslots;
} dict_growth;

static em_status growth_prepare(const em_dict *d, dict_growth *g) {
    memset(g, 0, sizeof *g);
    if (d->len == d->cap) {
        g->cap = d->cap ? d->cap * 2 : DICT_MIN_ENTRIES;
        g->entries = em__malloc(g->cap * sizeof(dict_entry), "dict entries");
        if (!g->entries)
            return EM_ERR_NOMEM;
    }
    if (2 * (d->len + 1) >= d->nslots) {
        g->nslots = d->nslots ? d->nslots * 2 : DICT_MIN_SLOTS;
        g->index = em__calloc(g->nslots, sizeof(size_t), "dict index");
        if (!g->index) {
            em__free(g->entries);
            return EM_ERR_NOMEM;
        }
    }
    return EM_OK;
}

/* Install prepared storage; cannot fail. */
static void growth_commit(em_dict *d, dict_growth *g) {
    if (g->entries) {
        if (d->len)
            memcpy(g->entries, d->entries, d->len * sizeof(dict_entry));
        em__free(d->entries);
        d->entries = g->entries;
        d->cap = g->cap;
    }
    if (g->index) {
        index_fill(g->index, g->nslots, d->entries, d->len);
        em__free(d->index);
        d->index = g->index;
        d->nslots = g->nslots;
    }
}

static em_status check_key(const em_dict *d, const char *key, const char *who) {
    if (!d)
        return em_set_error(EM_ERR_INVALID, "%s: dict is NULL", who);
    if (!key)
        return em_set_error(EM_ERR_INVALID, "%s: key is NULL", who);
    if (!key[0])
        return em_set_error(EM_ERR_INVALID, "%s: key is empty", who);
    return EM_OK;
}

em_status em_dict_set(em_dict *d, const char *key, em_tensor *t) {
    em_status st = check_key(d, key, "dict_set");
    if (st != EM_OK)
        return st;
    if (!t)
        return em_set_error(EM_ERR_INVALID, "dict_set: tensor for key '%s' is NULL", key);

    ptrdiff_t pos = entry_find(d, key);
    if (pos >= 0) { /* replace in place: the position is kept */
        em_tensor *old = d->entries[pos].t;
        d->entries[pos].t = em_tensor_retain(t);
        em_tensor_release(old);
        return EM_OK;
    }

    char *copy = em__strdup(key, "dict key");
    if (!copy)
        return EM_ERR_NOMEM;
    dict_growth g;
    if (growth_prepare(d, &g) != EM_OK) {
        em__free(copy);
        return EM_ERR_NOMEM;
    }
    growth_commit(d, &g);

    uint64_t h = key_hash(key);
    d->entries[d->len] = (dict_entry){.key = copy, .t = em_tensor_retain(t), .hash = h};
    d->index[slot_find(d, key, h)] = d->len + 1;
    d->len++;
    return EM_OK;
}

em_tensor *em_dict_get(const em_dict *d, const char *key) {
    ptrdiff_t pos = entry_find(d, key);
    return pos >= 0 ? d->entries[pos].t : NULL;
}

bool em_dict_has(const em_dict *d, const char *key) {
    return entry_find(d, key) >= 0;
}

em_status em_dict_remove(em_dict *d, const char *key) {
    em_status st = check_key(d, key, "dict_remove");
    if (st != EM_OK)
        return st;
    ptrdiff_t pos = entry_find(d, key);
    if (pos < 0)
        return em_set_error(EM_ERR_NOTFOUND, "dict_remove: no key '%s' in the dict", key);

    em__free(d->entries[pos].key);
    em_tensor_release(d->entries[pos].t);
    memmove(&d->entries[pos], &d->entries[pos + 1],
            (d->len - (size_t)pos - 1) * sizeof(dict_entry));
    d->len--;
    memset(d->index, 0, d->nslots * sizeof(size_t));
    index_fill(d->index, d->nslots, d->entries, d->len);
    return EM_OK;
}

size_t em_dict_len(const em_dict *d) {
    return d ? d->len : 0;
}

const char *em_dict_key(const em_dict *d, size_t i) {
    return d && i < d->len ? d->entries[i].key : NULL;
}

em_tensor *em_dict_value(const em_dict *d, size_t i) {
    return d && i < d->len ? d->entries[i].t : NULL;
}

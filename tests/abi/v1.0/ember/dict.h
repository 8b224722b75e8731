/*
 * ember/dict.h — an ordered dictionary of named tensors: state dicts and checkpoints.
 *
 *     em_dict *d = em_dict_new();
 *     em_dict_set(d, "0.weight", w);           // the dict takes its own reference
 *     em_tensor *t = em_dict_get(d, "0.weight");   // borrowed
 *     for (size_t i = 0; i < em_dict_len(d); i++)
 *         printf("%s\n", em_dict_key(d, i));        // insertion order
 *     em_dict_free(d);
 *
 * Keys are copied; lookups are hashed. Replacing a key keeps its position.
 */
#ifndef EMBER_DICT_H
#define EMBER_DICT_H

#include <stdbool.h>
#include <stddef.h>

#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_dict em_dict;

/* NULL on out of memory. */
EM_API em_dict *em_dict_new(void);
/* Releases every tensor reference the dict holds. NULL is a no-op. */
EM_API void em_dict_free(em_dict *d);
/* Insert or replace; the dict retains t. EM_ERR_INVALID for a NULL or empty key or NULL t. */
EM_API em_status em_dict_set(em_dict *d, const char *key, em_tensor *t);
/* Borrowed tensor for key, or NULL (without setting an error) when absent. */
EM_API em_tensor *em_dict_get(const em_dict *d, const char *key);
EM_API bool em_dict_has(const em_dict *d, const char *key);
/* Remove key (releasing its tensor); EM_ERR_NOTFOUND when absent. Order of the rest is kept. */
EM_API em_status em_dict_remove(em_dict *d, const char *key);
EM_API size_t em_dict_len(const em_dict *d);
/* The i-th key and tensor in insertion order (borrowed); NULL when i is out of range. */
EM_API const char *em_dict_key(const em_dict *d, size_t i);
EM_API em_tensor *em_dict_value(const em_dict *d, size_t i);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_DICT_H */

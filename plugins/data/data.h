/*
 * data.h — shared by the ember-data plugin's formats: whole-file reading (raw or gzip),
 * and each format's registration function.
 */
#ifndef EMBER_PLUGIN_DATA_H
#define EMBER_PLUGIN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ember/ember.h>

/* An open file read through zlib (gzip or plain, told apart by zlib). */
typedef struct dt_file dt_file;

/* Open path for reading; NULL and an EM_ERR_IO error "<who>: cannot open <path>: <reason>". */
dt_file *dt_open(const char *who, const char *path);
/* Read exactly n bytes. EM_ERR_FORMAT "truncated" (naming the file, `what`, and how many
 * bytes were missing) when the file ends early; EM_ERR_IO for a read or gzip error. */
em_status dt_read(dt_file *f, void *buf, size_t n, const char *what);
/* Read up to n bytes (fewer only at the end of the file); *got says how many. */
em_status dt_read_upto(dt_file *f, void *buf, size_t n, size_t *got /* out */);
/* True when the file has no more bytes (reads one byte to find out). */
bool dt_at_end(dt_file *f);
/* Bytes consumed so far (uncompressed). */
uint64_t dt_offset(const dt_file *f);
const char *dt_path(const dt_file *f);
void dt_close(dt_file *f);

em_status dt_register_idx(em_registry *r);
em_status dt_register_cifar(em_registry *r);
em_status dt_register_csv(em_registry *r);
em_status dt_register_synthetic(em_registry *r);

#endif /* EMBER_PLUGIN_DATA_H */

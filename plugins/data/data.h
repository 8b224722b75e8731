/*
 * data.h — shared by the ember-data plugin's formats: whole-file reading (raw or gzip), the
 * items every format declares (the named fields "input" and "target"), the in-memory table
 * that the file formats read from, and each format's registration function.
 */
#ifndef EMBER_PLUGIN_DATA_H
#define EMBER_PLUGIN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/data.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"

/* An open file: a gzip file of one member inflated whole at open (libdeflate), anything else
 * (plain, several members, damaged) read through zlib's stream, which tells gzip and plain
 * apart by content; the bytes and the errors are the stream's either way. */
typedef struct dt_file dt_file;

/* Open path for reading as a dataset file: anything but a regular file (a FIFO, /dev/zero or
 * another device, a socket, a directory) is refused without blocking and without reading
 * (reading one can block forever or never end). Returns the descriptor (O_RDONLY, O_CLOEXEC)
 * or -1 and an EM_ERR_IO error "<who>: cannot open <path>: <reason>" or "<who>: <path> is a
 * FIFO (named pipe), not a regular file ...". The plugin's one way to open a file (the core's
 * readers have the same check in em__input_open, which a plugin cannot call). */
int dt_open_input(const char *who, const char *path);
/* Open path (dt_open_input) for reading (inflating a single-member gzip file at once: memory
 * of the size its trailer gives, believed only up to DEFLATE's 1032:1 to the file's size and
 * freed when the inflation does not deliver it); NULL and its error. */
dt_file *dt_open(const char *who, const char *path);
/* Read exactly n bytes. EM_ERR_FORMAT "truncated" (naming the file, `what`, and how many
 * bytes were missing) when the file ends early; EM_ERR_IO for a read or gzip error. */
em_status dt_read(dt_file *f, void *buf, size_t n, const char *what);
/* Read exactly n bytes into new memory: the bytes at *out, in the allocation *block (what
 * to free(); *out may lie inside it). Memory grows geometrically with what the file (or its
 * decompression) actually delivers, so a header that claims more than the file holds costs
 * at most twice what is there, never the claim; the rest of a file inflated at open is that
 * buffer itself, handed over (*out then starts after the bytes read before). dt_read's
 * errors, and both NULL. */
em_status dt_read_alloc(dt_file *f, size_t n, const char *what, void **out /* out */,
                        void **block /* out */);
/* Read up to n bytes (fewer only at the clean end of the file); *got says how many. A gzip
 * stream that ends without its end marker (a cut file) is EM_ERR_FORMAT "truncated", corrupt
 * gzip data EM_ERR_FORMAT, a read error EM_ERR_IO. */
em_status dt_read_upto(dt_file *f, void *buf, size_t n, size_t *got /* out */);
/* EM_OK when the file has no more bytes (it reads one to find out); EM_ERR_FORMAT
 * "unexpected bytes after the N the header accounts for" or dt_read_upto's errors. */
em_status dt_expect_end(dt_file *f);
const char *dt_path(const dt_file *f);
void dt_close(dt_file *f);

/* ---- items: the fields "input" and "target" ------------------------------------------------ */

/* Declare a format's item as the two named fields of ember/data.h's open_fields: "input", of
 * `dtype` and shape[0..ndim), and "target": one int64 class label in [0, classes) when
 * classes > 0, else (values) float32 regression targets. Fills f[0..2) and *lay (length
 * items, fields f). The core reads f after open_fields returns: keep it in the state. */
void dt_declare_io(em_dataset_layout *lay, em_field f[2], int64_t length, em_dtype dtype,
                   int ndim, const int64_t *shape, int64_t classes, int64_t values);

/* A format read into memory at open: n items whose inputs lie in col[0] and targets in col[1]
 * (malloc'd, item i at i * bytes[k]), the fields declared in fields. Reads are memcpy, safe
 * from any number of threads. */
typedef struct dt_table {
    em_field fields[2]; /* "input", "target" */
    void *col[2];
    void *block[2];     /* the allocation col[k] lies in, where it does not start it; or NULL */
    size_t bytes[2];    /* one item's bytes of each field */
    int64_t n;
} dt_table;

/* A new empty table (calloc); NULL and EM_ERR_NOMEM naming `who`. */
dt_table *dt_table_new(const char *who);
/* dt_declare_io over the table's fields and n; sets bytes from them. */
void dt_table_declare(dt_table *t, em_dataset_layout *lay, em_dtype dtype, int ndim,
                      const int64_t *shape, int64_t classes, int64_t values);
/* The read_fields and close of a table (close frees both columns, block[k] for col[k] where
 * set; NULL is a no-op). */
em_status dt_table_read(void *state, const int64_t *indices, int64_t n, void *const *data,
                        int64_t *const *lengths);
void dt_table_close(void *state);

em_status dt_register_idx(em_registry *r);
em_status dt_register_cifar(em_registry *r);
em_status dt_register_csv(em_registry *r);
em_status dt_register_synthetic(em_registry *r);
em_status dt_register_text(em_registry *r);

#endif /* EMBER_PLUGIN_DATA_H */

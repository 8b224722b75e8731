/*
 * data.h — shared by the ember-data plugin's formats: whole-file reading (raw or gzip),
 * and each format's registration function.
 */
#ifndef EMBER_PLUGIN_DATA_H
#define EMBER_PLUGIN_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/dispatch.h"
#include "ember/error.h"

/* An open file read through zlib (gzip or plain, told apart by zlib). */
typedef struct dt_file dt_file;

/* Open path for reading as a dataset file: anything but a regular file (a FIFO, /dev/zero or
 * another device, a socket, a directory) is refused without blocking and without reading
 * (reading one can block forever or never end). Returns the descriptor (O_RDONLY, O_CLOEXEC)
 * or -1 and an EM_ERR_IO error "<who>: cannot open <path>: <reason>" or "<who>: <path> is a
 * FIFO (named pipe), not a regular file ...". The plugin's one way to open a file (the core's
 * readers have the same check in em__input_open, which a plugin cannot call). */
int dt_open_input(const char *who, const char *path);
/* Open path (dt_open_input) for reading through zlib; NULL and its error. */
dt_file *dt_open(const char *who, const char *path);
/* Read exactly n bytes. EM_ERR_FORMAT "truncated" (naming the file, `what`, and how many
 * bytes were missing) when the file ends early; EM_ERR_IO for a read or gzip error. */
em_status dt_read(dt_file *f, void *buf, size_t n, const char *what);
/* Read exactly n bytes into a new buffer (*out, free()): memory grows geometrically with what
 * the file (or its decompression) actually delivers, so a header that claims more than the
 * file holds costs at most twice what is there, never the claim. dt_read's errors. */
em_status dt_read_alloc(dt_file *f, size_t n, const char *what, void **out /* out */);
/* Read up to n bytes (fewer only at the clean end of the file); *got says how many. A gzip
 * stream that ends without its end marker (a cut file) is EM_ERR_FORMAT "truncated", corrupt
 * gzip data EM_ERR_FORMAT, a read error EM_ERR_IO. */
em_status dt_read_upto(dt_file *f, void *buf, size_t n, size_t *got /* out */);
/* EM_OK when the file has no more bytes (it reads one to find out); EM_ERR_FORMAT
 * "unexpected bytes after the N the header accounts for" or dt_read_upto's errors. */
em_status dt_expect_end(dt_file *f);
const char *dt_path(const dt_file *f);
void dt_close(dt_file *f);

em_status dt_register_idx(em_registry *r);
em_status dt_register_cifar(em_registry *r);
em_status dt_register_csv(em_registry *r);
em_status dt_register_synthetic(em_registry *r);

#endif /* EMBER_PLUGIN_DATA_H */

/*
 * ember/serialize.h — saving and loading tensor dicts as safetensors files, crash-safely;
 * string metadata; copying a loaded dict into existing tensors with a report; checkpoint files
 * numbered by step, listed by the run that wrote them, and rotated per run.
 *
 *     em_metadata *meta = em_metadata_new();
 *     em_metadata_set(meta, "epoch", "3");
 *     if (em_save(state, "model.safetensors", meta, NULL) != EM_OK)
 *         fprintf(stderr, "%s\n", em_last_error());
 *
 *     em_load_options lo = EM_LOAD_OPTIONS_INIT;
 *     em_device_parse("cpu", &lo.device);             // map_location
 *     em_dict *loaded; em_metadata *m;
 *     if (em_load("model.safetensors", &lo, &loaded, &m) != EM_OK)
 *         fprintf(stderr, "%s\n", em_last_error());
 *         // load: 'model.safetensors': data_offsets [0, 24] of 'fc.bias' run past the end of
 *         //  the data (16 bytes)
 *
 *     em_load_report *rep;
 *     if (em_dict_load_into(model_state, loaded, true, &rep) != EM_OK)
 *         fprintf(stderr, "%s\n", em_last_error());
 *         // load: 1 missing key (fc2.bias), 1 unexpected key (head.weight), 1 shape mismatch
 *         //  (fc1.weight: [4, 3] in the model, [3, 4] in the source)
 *     em_load_report_free(rep);
 *
 * The format (the safetensors specification, "Format" in the README of Hugging Face's
 * safetensors project): an unsigned 64-bit
 * little-endian header length N; N bytes of UTF-8 JSON, an object mapping each tensor's name
 * to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} plus an optional
 * "__metadata__" object of string to string; then the data section, every tensor's raw
 * little-endian bytes in C order at [begin, end) relative to the data section's start. Ember
 * writes exactly what Python's safetensors library writes: compact JSON ("," and ":" without
 * spaces), "__metadata__" first, each entry's fields in the order dtype, shape, data_offsets,
 * the header padded with spaces to a multiple of 8 bytes, the data packed without holes in
 * header order. Files open in Python with safetensors.torch.load_file / safetensors.numpy.
 *
 * Dtypes: F32, F64, F16, BF16, I64, I32, U8, BOOL (Ember's eight). A file holding any other
 * (I8, U16, F8_E4M3, ...) is refused with EM_ERR_DTYPE naming the key and dtype.
 *
 * Nothing in a file is device-specific: em_load places every tensor on the device the options
 * name, whatever machine wrote the file.
 *
 * Crash safety. em_save writes to a temporary file in the target's directory
 * (".NAME.tmp-HOST-PID-N": this host's name, at most 32 characters of [A-Za-z0-9_-] with any
 * other written '_', and the writer's pid), fsyncs it, renames it over the target and fsyncs
 * the directory. A process killed at any moment leaves either the previous file or the new
 * one, never a mix; a failed save (disk full, the file-size limit, permission denied) removes
 * its temporary file and leaves the previous file untouched. A process killed mid-save leaves
 * its temporary file behind: em_save_remove_stale deletes those whose writer is gone.
 *
 * What a save replaces. A path that is a symbolic link is written through: the file the link
 * (or the chain of links) names is replaced, and the link stays a link — as open() for writing,
 * Python's safetensors and torch.save would. A path naming a directory, a device, a FIFO or a
 * socket is refused (EM_ERR_INVALID), since a rename would replace it by a regular file.
 *
 * The file-size limit (RLIMIT_FSIZE, `ulimit -f`) fails the write with EFBIG and raises
 * SIGXFSZ, which kills a process by default; em_save blocks SIGXFSZ in the calling thread
 * while it writes and discards the signal its own writes raised, so a save past the limit is
 * an EM_ERR_IO naming the file ("File too large"), whatever the program does with the signal.
 *
 * Test-only: when the environment variable EMBER_TEST_SAVE_KILL is set, em_save sends itself
 * SIGKILL at the point it names — a decimal byte count ("1234": after exactly that many bytes
 * of the file are written), or a step: "created" (the temporary file exists, empty),
 * "written" (all bytes written, not yet fsync'd), "synced" (fsync'd, not yet renamed),
 * "renamed" (renamed, directory not yet fsync'd). The crash-safety tests fork a child that
 * saves with it set. Never set it otherwise.
 */
#ifndef EMBER_SERIALIZE_H
#define EMBER_SERIALIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest JSON header em_load accepts (Python's safetensors has the same limit). */
#define EM_SAFETENSORS_MAX_HEADER 100000000ull

/* ---- metadata: an ordered map of UTF-8 strings ------------------------------------------- */

typedef struct em_metadata em_metadata;

/* NULL on out of memory. */
EM_API em_metadata *em_metadata_new(void);
/* NULL is a no-op. */
EM_API void em_metadata_free(em_metadata *m);
/* Insert or replace (a replaced key keeps its position); key and value are copied. Both must
 * be non-NULL valid UTF-8 and the key non-empty: EM_ERR_INVALID otherwise, naming the key. */
EM_API em_status em_metadata_set(em_metadata *m, const char *key, const char *value);
/* The value for key (borrowed, valid until the key is replaced or m freed), or NULL without an
 * error when absent. */
EM_API const char *em_metadata_get(const em_metadata *m, const char *key);
EM_API size_t em_metadata_len(const em_metadata *m);
/* The i-th key / value in insertion order (borrowed); NULL when i is out of range. */
EM_API const char *em_metadata_key(const em_metadata *m, size_t i);
EM_API const char *em_metadata_value(const em_metadata *m, size_t i);
/* Keys are found through a hashed index, so n em_metadata_set calls (a header with n
 * metadata entries) cost O(n). This counts the key comparisons every em_metadata_set on m
 * has made (0 for NULL): tests check that it grows linearly. */
EM_API uint64_t em_metadata_key_compares(const em_metadata *m);

/* ---- saving ------------------------------------------------------------------------------- */

typedef enum em_save_order {
    /* The dict's insertion order (the default): a state dict reads back in model order. */
    EM_SAVE_ORDER_DICT = 0,
    /* Python safetensors' order: dtypes ranked I64, F64, F32, I32, BF16, F16, U8, BOOL, then
     * keys in byte order. Wider elements come first, so every tensor's bytes are aligned to
     * its element size in the file; and with at most one metadata entry (Python orders
     * several by hash) the file is byte-for-byte the one Python's save_file writes. */
    EM_SAVE_ORDER_PYTHON = 1,
} em_save_order;

typedef struct em_save_options {
    size_t struct_size;    /* sizeof(em_save_options) */
    em_save_order order;
    void *ext;             /* reserved; NULL */
} em_save_options;
#define EM_SAVE_OPTIONS_INIT { .struct_size = sizeof(em_save_options) }

/*
 * Write every tensor of d (any device, any layout; each is written as its C-order bytes) and
 * the metadata (may be NULL) to path, crash-safely (see the top of this file). opt may be NULL
 * (defaults). Streams one tensor at a time: a CPU tensor's bytes are written from its memory,
 * another device's through a bounded staging buffer, a non-contiguous tensor's through one
 * contiguous copy of that tensor.
 *
 * Errors: EM_ERR_INVALID for a NULL d or path, a key "__metadata__", a key or metadata string
 * that is not valid UTF-8, bad options, or a path that names a directory, a device, a FIFO or
 * a socket; EM_ERR_IO naming the file and the system's reason (no space left, file too large,
 * permission denied, no such directory); EM_ERR_NOMEM; a device copy's error. On any error
 * the previous file at path, if any, is untouched.
 */
EM_API em_status em_save(const em_dict *d, const char *path, const em_metadata *metadata,
                         const em_save_options *opt);

/* Check, before there is anything to save, that em_save to path would get past creating its
 * temporary file: path is not a directory or a non-regular file, and a file can be created in
 * its directory (symbolic links followed, as em_save does). Creates and removes an empty
 * temporary file; writes nothing else. Errors as em_save's (EM_ERR_IO naming the directory
 * and the reason: it does not exist, permission denied, a read-only file system, ...). A
 * full disk is only found by writing. */
EM_API em_status em_save_check(const char *path);

/* Delete the temporary files that saves to path killed before they finished left behind:
 * ".NAME.tmp-HOST-PID-N" in path's directory (a symbolic link's target's) whose HOST is this
 * host and whose PID no longer exists. A file of a live process, of another host (a shared
 * file system), or of another naming scheme is never touched. path may be a checkpoint
 * pattern: its "{step}" then matches any step. *removed (may be NULL) receives how many were
 * deleted. A missing directory is not an error (nothing to delete); EM_ERR_IO when the
 * directory cannot be read or a file cannot be deleted (naming it). Processes in another pid
 * namespace sharing this host name and directory look dead: do not share a checkpoint
 * directory between containers that have the same host name. */
EM_API em_status em_save_remove_stale(const char *path, size_t *removed /* out, may be NULL */);

/* ---- loading ------------------------------------------------------------------------------ */

typedef struct em_load_options {
    size_t struct_size;  /* sizeof(em_load_options) */
    em_device device;    /* map_location: every tensor is placed here (zero: the CPU) */
    /* When true, floating tensors (F32, F64, F16, BF16) are converted to float_dtype, which
     * must be floating (model.half() on load); integer and bool tensors keep their dtype.
     * When false (the default) every tensor keeps the file's dtype. */
    bool convert_floats;
    em_dtype float_dtype;
    void *ext;           /* reserved; NULL */
} em_load_options;
#define EM_LOAD_OPTIONS_INIT { .struct_size = sizeof(em_load_options) }

/*
 * Read a safetensors file: reads and validates the whole header before creating any tensor,
 * then reads each tensor's bytes onto opt->device (converting as opt says). The file is read
 * (never mapped), so a file that another process truncates or rewrites meanwhile (cp over it,
 * rsync --inplace) is an EM_ERR_IO naming it, never a crash. opt may be NULL
 * (defaults: the CPU, the file's dtypes). On success *out is a new dict the caller frees with
 * em_dict_free (its tensors are held by the dict only, never by a scope), in the header's
 * order; *metadata_out (when metadata_out is not NULL) is a new em_metadata (empty when the
 * file has none) that the caller frees.
 *
 * Errors, each naming the file and the reason: EM_ERR_NOTFOUND (no such file), EM_ERR_IO
 * (cannot open or read it; not a regular file: a FIFO, a device such as /dev/zero or a
 * directory is refused without reading it; it was truncated or changed while being read);
 * EM_ERR_FORMAT for a malformed file: shorter than 8 bytes, a header
 * length past the end of the file or over EM_SAFETENSORS_MAX_HEADER, invalid JSON or UTF-8, a
 * duplicate key, an entry without a valid dtype/shape/data_offsets, data_offsets out of range,
 * overlapping, leaving holes or not covering the data section, a shape whose byte size
 * disagrees with its offsets, more than EM_MAX_DIMS dims, metadata that is not string to
 * string; EM_ERR_DTYPE for a dtype Ember does not support (naming key and dtype);
 * EM_ERR_INVALID for bad options; EM_ERR_DEVICE / EM_ERR_NOMEM from the target device. On
 * error *out and *metadata_out are NULL. Never reads outside the file, whatever it holds.
 */
EM_API em_status em_load(const char *path, const em_load_options *opt, em_dict **out /* out */,
                         em_metadata **metadata_out /* out, may be NULL */);

/* em_load from a buffer of len bytes already in host memory (a file's contents); `name`
 * (may be NULL: "<buffer>") stands for the file in messages. Same results and errors. */
EM_API em_status em_load_buffer(const void *buf, size_t len, const char *name,
                                const em_load_options *opt, em_dict **out /* out */,
                                em_metadata **metadata_out /* out, may be NULL */);

/* ---- copying a loaded dict into existing tensors: load_state_dict's engine ----------------- */

typedef enum em_load_issue_kind {
    EM_LOAD_MISSING = 0,         /* in the target, not in the source */
    EM_LOAD_UNEXPECTED = 1,      /* in the source, not in the target */
    EM_LOAD_SHAPE_MISMATCH = 2,  /* in both with different shapes */
    EM_LOAD_DTYPE_CONVERTED = 3, /* in both, same shape, different dtypes: converted on copy */
    EM_LOAD_ISSUE_KIND_COUNT
} em_load_issue_kind;

/* One finding. `key` is borrowed from the report. The target fields are unset (ndim -1) for an
 * unexpected key, the source fields for a missing key. */
typedef struct em_load_issue {
    em_load_issue_kind kind;
    const char *key;
    int target_ndim;
    int64_t target_shape[EM_MAX_DIMS];
    em_dtype target_dtype;
    int source_ndim;
    int64_t source_shape[EM_MAX_DIMS];
    em_dtype source_dtype;
} em_load_issue;

typedef struct em_load_report em_load_report;

/* Number of findings of one kind; 0 for a NULL report or a bad kind. */
EM_API size_t em_load_report_count(const em_load_report *r, em_load_issue_kind kind);
/* The i-th finding of a kind (target order for missing and mismatched keys, source order for
 * unexpected ones), borrowed; NULL when out of range. */
EM_API const em_load_issue *em_load_report_get(const em_load_report *r, em_load_issue_kind kind,
                                               size_t i);
/* Number of target tensors that were written. */
EM_API size_t em_load_report_loaded(const em_load_report *r);
/* Every finding in one line, e.g. "2 missing keys (fc2.weight, fc2.bias), 1 unexpected key
 * (head.weight), 1 dtype conversion (fc1.weight: float64 -> float32)"; "no problems" when
 * there are none. Into buf like snprintf: returns the length the whole text needs. */
EM_API size_t em_load_report_format(const em_load_report *r, char *buf, size_t cap);
/* NULL is a no-op. */
EM_API void em_load_report_free(em_load_report *r);

/*
 * Copy each tensor of source into the target tensor of the same key, in place (em_copy_
 * semantics: across devices, converting dtypes; recorded by no autograd graph, as under
 * no_grad; each target's version is bumped). Everything is checked before anything is
 * copied. Missing keys, unexpected keys and shape mismatches are listed all at once:
 *   strict:     any of them fails with EM_ERR_INVALID and a message naming every one (the
 *               report's text), and no tensor is written;
 *   non-strict: the tensors whose keys and shapes match are copied, the rest are skipped and
 *               listed in the report (PyTorch fails on a shape mismatch even then; Ember skips
 *               it, so a model with a new head loads its backbone).
 * Dtype conversions never fail; they are listed. *report_out (may be NULL) receives the report
 * on success and on those failures (the caller frees it); NULL on other errors (NULL
 * arguments: EM_ERR_INVALID; a failing copy: its error, naming the key, after which the
 * tensors copied before it keep their new values).
 */
EM_API em_status em_dict_load_into(em_dict *target, const em_dict *source, bool strict,
                                   em_load_report **report_out /* out, may be NULL */);

/*
 * em_load and em_dict_load_into in one, for loading weights into a model (load_state_dict
 * from a file): reads path's header and checks its keys and shapes against target first,
 * then reads only the tensors target takes, each straight onto its target tensor's device and
 * copied in. The report and the strict / non-strict rules are em_dict_load_into's; a strict
 * refusal reads no tensor data at all, and a tensor the target has no place for (an
 * unexpected key, a shape mismatch) is never read, so a file cannot make the process commit
 * memory the model does not justify. Memory: target plus the largest tensor read.
 *
 * Errors: em_load's (naming the file); em_dict_load_into's, naming the file too. When a
 * read or copy fails after some tensors were written, those keep their new values.
 * *metadata_out (may be NULL) receives the file's metadata on success.
 */
EM_API em_status em_load_into(const char *path, em_dict *target, bool strict,
                              em_load_report **report_out /* out, may be NULL */,
                              em_metadata **metadata_out /* out, may be NULL */);

/* ---- checkpoint files: numbered by step, one run's files rotated --------------------------- */

/* The default of em_checkpoint_rotate's keep. */
#define EM_CHECKPOINT_KEEP_DEFAULT 3

/* Run identity. Every checkpoint em_checkpoint_save writes names the run that wrote it in its
 * metadata entry "ember.run" (ember/checkpoint.h: em_checkpoint.run_id): 1 to 63 characters of
 * A-Z a-z 0-9 . _ : + @ -. A resumed run keeps its identity, a new run gets a new one. Rotation
 * deletes only the writing run's files, and em_checkpoint_latest refuses to choose between
 * runs, so a new run in a directory where an older run left higher-numbered files neither
 * loses its checkpoints nor gets resumed as the older run. */
#define EM_CHECKPOINT_RUN_KEY "ember.run"
#define EM_CHECKPOINT_RUN_ID_MAX 64 /* bytes, with the terminating NUL */

/* The file name for a step: pattern with its one "{step}" replaced by the decimal step
 * (>= 0), e.g. "ckpt/model-{step}.safetensors" -> "ckpt/model-1200.safetensors". Into buf of
 * cap bytes. EM_ERR_INVALID when the pattern has no "{step}", two of them, or one in a
 * directory part, or the step is negative; EM_ERR_RANGE when buf is too small. */
EM_API em_status em_checkpoint_path(const char *pattern, int64_t step, char *buf, size_t cap);

/* One file of a pattern's directory that matches it ("{step}" = 1 to 18 decimal digits). */
typedef struct em_checkpoint_file {
    int64_t step;
    const char *path;        /* the pattern's directory, '/', the file's name */
    char run_id[EM_CHECKPOINT_RUN_ID_MAX]; /* its "ember.run"; "" when it records none */
    bool is_checkpoint;      /* its metadata has "ember.checkpoint" (em_checkpoint_save's) */
    int64_t mtime;           /* last modified, seconds since 1970 */
    em_status status;        /* EM_OK when its header was read; else why not (EM_ERR_FORMAT: a
                              * damaged header, EM_ERR_IO: unreadable or not a regular file) */
    const char *error;       /* when status is not EM_OK: the reason, naming the file; else NULL */
} em_checkpoint_file;

typedef struct em_checkpoint_files em_checkpoint_files;

/* Every file matching pattern, highest step first (then by name), each with the run its
 * header names — only headers are read; a FIFO is never opened for long. A pattern without
 * "{step}" names one file: the list holds it (step -1) when it exists. *out is a new list
 * (em_checkpoint_files_free), empty when nothing matches. EM_ERR_INVALID for a bad pattern;
 * EM_ERR_NOTFOUND when the directory does not exist, EM_ERR_IO when it cannot be read. */
EM_API em_status em_checkpoint_list(const char *pattern, em_checkpoint_files **out /* out */);
EM_API size_t em_checkpoint_files_len(const em_checkpoint_files *l);
/* The i-th file (borrowed, valid until the list is freed); NULL when out of range. */
EM_API const em_checkpoint_file *em_checkpoint_files_get(const em_checkpoint_files *l, size_t i);
/* NULL is a no-op. */
EM_API void em_checkpoint_files_free(em_checkpoint_files *l);

/* The highest step among the matching files whose header reads, into *step (and its path into
 * buf when buf is not NULL). Those files must all belong to one run (or all record none):
 * EM_ERR_STATE otherwise, naming each run with its steps and newest file — which run to
 * continue is then the caller's choice (em_checkpoint_list, or a file name). EM_ERR_NOTFOUND
 * when nothing matches (or the directory does not exist); EM_ERR_FORMAT when no matching
 * file's header reads; EM_ERR_IO when the directory cannot be read; EM_ERR_RANGE when buf is
 * too small. It does not load the file: a damaged data section is em_checkpoint_load's to
 * find (ember-train then tries the next newest). */
EM_API em_status em_checkpoint_latest(const char *pattern, int64_t *step /* out */, char *buf,
                                      size_t cap);

typedef struct em_checkpoint_rotation {
    size_t removed;             /* the run's files deleted */
    size_t others;              /* matching files left alone as not the run's: another run's,
                                 * no recorded run's, or unreadable */
    int64_t others_newest_step; /* the highest step among those; -1 when there are none */
} em_checkpoint_rotation;

/*
 * After a save: delete the older files of the run that wrote `written` (the file just saved,
 * which must match the pattern and name its run in "ember.run"), keeping the `keep` highest
 * steps of that run (keep 0 means EM_CHECKPOINT_KEEP_DEFAULT; negative is EM_ERR_INVALID).
 * `written` itself is never deleted, even when that run has `keep` higher steps (a run
 * resumed from an older checkpoint). Files of other runs, files recording no run, files
 * whose header cannot be read and other names (temporary files included) are left alone and
 * counted in out->others (out may be NULL), so a caller can warn about them.
 * Errors: EM_ERR_INVALID for a bad pattern or keep, a NULL written, a written file that does
 * not match the pattern or records no run; EM_ERR_NOTFOUND when written does not exist; its
 * header's error when it cannot be read; EM_ERR_IO naming the file that cannot be deleted.
 * Since every save is atomic, a crash during a save or a rotation never leaves fewer than the
 * previous good files.
 */
EM_API em_status em_checkpoint_rotate(const char *pattern, const char *written, int keep,
                                      em_checkpoint_rotation *out /* out, may be NULL */);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_SERIALIZE_H */

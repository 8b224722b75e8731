/*
 * ember/error.h — status codes, the thread-local last error, and logging.
 *
 * Every fallible Ember function returns an em_status or a pointer that is NULL on failure. On
 * failure it also leaves a message for the calling thread that names what went wrong — the op,
 * the shapes, dtypes, devices, file or key at fault:
 *
 *     em_tensor *y = em_matmul(x, w);
 *     if (!y) fprintf(stderr, "%s\n", em_last_error());
 *         // matmul: shapes [32, 784] and [512, 256] cannot be multiplied (784 != 512)
 *
 * Ops accept NULL inputs and then return NULL without replacing the message already set, so a
 * chain of calls can be checked once, at the end. Library code never exits or aborts on user
 * input, and never prints on its own: it logs through a callback that the program may replace.
 */
#ifndef EMBER_ERROR_H
#define EMBER_ERROR_H

#include <stdarg.h>
#include <stdio.h>

#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The single list of status codes: X(NAME, value, message). Values are stable ABI. */
#define EM_STATUS_MAP(X)                                                                     \
    X(OK,         0,  "success")                                                             \
    X(ERR_INVALID, 1, "invalid argument")                                                    \
    X(ERR_SHAPE,   2, "shape mismatch")                                                      \
    X(ERR_DTYPE,   3, "unsupported or mismatched dtype")                                     \
    X(ERR_DEVICE,  4, "device error")                                                        \
    X(ERR_NOMEM,   5, "out of memory")                                                       \
    X(ERR_NOKERNEL, 6, "no kernel registered")                                               \
    X(ERR_PLUGIN,  7, "plugin error")                                                        \
    X(ERR_IO,      8, "input/output error")                                                  \
    X(ERR_FORMAT,  9, "malformed data")                                                      \
    X(ERR_STATE,  10, "operation not valid in the current state")                            \
    X(ERR_RANGE,  11, "index or value out of range")                                         \
    X(ERR_NOTFOUND, 12, "not found")                                                         \
    X(ERR_EXISTS, 13, "already exists")                                                      \
    X(ERR_INTERNAL, 14, "internal error (an Ember bug)")                                     \
    X(ERR_BUSY,   15, "objects are still alive")

typedef enum em_status {
#define EM__STATUS_ENUM(name, value, msg) EM_##name = value,
    EM_STATUS_MAP(EM__STATUS_ENUM)
#undef EM__STATUS_ENUM
} em_status;

/* "EM_ERR_SHAPE" etc.; "EM_UNKNOWN" for a value outside the map. Never NULL. */
EM_API const char *em_status_name(em_status s);
/* The generic message for a status ("shape mismatch"). Never NULL. */
EM_API const char *em_status_str(em_status s);

/* The calling thread's last error message ("" when none). Valid until the thread's next Ember
 * call that fails. Never NULL. */
EM_API const char *em_last_error(void);
/* The status that went with em_last_error() (EM_OK when none). */
EM_API em_status em_last_status(void);
/* Forget the calling thread's last error. */
EM_API void em_clear_error(void);

/* Set the calling thread's last error (printf-style) and return `s`. For plugins and for
 * programs that register their own ops or classes: a kernel that rejects its input says why
 * here. Messages longer than 1 KiB are truncated. */
EM_API em_status em_set_error(em_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
EM_API em_status em_set_errorv(em_status s, const char *fmt, va_list ap);

/* ---- logging ---------------------------------------------------------------------------- */

typedef enum em_log_level {
    EM_LOG_ERROR = 0,
    EM_LOG_WARN = 1,
    EM_LOG_INFO = 2,
    EM_LOG_DEBUG = 3,
} em_log_level;

/* Receives every log line at or above the current level; `msg` has no trailing newline. */
typedef void (*em_log_fn)(em_log_level level, const char *msg, void *user);

/* Replace the log callback (NULL restores the default, which writes "ember: warn: ..." lines
 * to stderr). The level starts from EMBER_LOG=error|warn|info|debug (default warn). */
EM_API void em_log_set(em_log_fn fn, void *user);
EM_API void em_log_set_level(em_log_level level);
EM_API em_log_level em_log_get_level(void);
/* Log a line through the callback (plugins use this too). */
EM_API void em_log_write(em_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif /* EMBER_ERROR_H */

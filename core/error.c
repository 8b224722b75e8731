/*
 * error.c — status names and messages (from the one X-macro in ember/error.h), the
 * thread-local last error, and logging through a replaceable callback.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/error.h"
#include "internal.h"

typedef struct em__error_state {
    em_status status;
    char msg[1024];
} em__error_state;

static _Thread_local em__error_state tls_error;

const char *em_status_name(em_status s) {
    switch (s) {
#define EM__NAME_CASE(name, value, msg) case EM_##name: return "EM_" #name;
        EM_STATUS_MAP(EM__NAME_CASE)
#undef EM__NAME_CASE
    }
    return "EM_UNKNOWN";
}

const char *em_status_str(em_status s) {
    switch (s) {
#define EM__STR_CASE(name, value, msg) case EM_##name: return msg;
        EM_STATUS_MAP(EM__STR_CASE)
#undef EM__STR_CASE
    }
    return "unknown status";
}

const char *em_last_error(void) { return tls_error.msg; }
em_status em_last_status(void) { return tls_error.status; }
bool em__error_pending(void) { return tls_error.status != EM_OK; }

void em_clear_error(void) {
    tls_error.status = EM_OK;
    tls_error.msg[0] = '\0';
}

em_status em_set_errorv(em_status s, const char *fmt, va_list ap) {
    /* Format into a temporary first: fmt's arguments may point into tls_error.msg. */
    char buf[sizeof tls_error.msg];
    vsnprintf(buf, sizeof buf, fmt, ap);
    memcpy(tls_error.msg, buf, sizeof buf);
    tls_error.status = s;
    return s;
}

em_status em_set_error(em_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    em_set_errorv(s, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- logging -------------------------------------------------------------------------------- */

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static void default_log(em_log_level level, const char *msg, void *user) {
    (void)user;
    fprintf(stderr, "ember: %s: %s\n", level_names[level], msg);
}

static struct {
    em_log_fn fn;
    void *user;
    _Atomic int level;
} log_state = {default_log, NULL, EM_LOG_WARN};

void em__log_init(void) {
    const char *env = getenv("EMBER_LOG");
    if (!env || !*env) return;
    for (int i = 0; i < (int)EM_ARRAY_LEN(level_names); i++) {
        if (strcmp(env, level_names[i]) == 0) {
            log_state.level = i;
            return;
        }
    }
    em_log_write(EM_LOG_WARN, "EMBER_LOG='%s' is not one of error, warn, info, debug; using warn", env);
}

void em_log_set(em_log_fn fn, void *user) {
    log_state.fn = fn ? fn : default_log;
    log_state.user = fn ? user : NULL;
}

void em_log_set_level(em_log_level level) {
    if (level >= EM_LOG_ERROR && level <= EM_LOG_DEBUG) log_state.level = level;
}

em_log_level em_log_get_level(void) { return (em_log_level)log_state.level; }

void em_log_write(em_log_level level, const char *fmt, ...) {
    if ((int)level > log_state.level || level < EM_LOG_ERROR) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_state.fn(level, buf, log_state.user);
}

/*
 * fuzz.h — what the fuzz targets (tests/fuzz/fuzz_*.c) share: a scratch directory for the
 * readers that take a path, writing an input there, and reporting a finding.
 *
 * Each target defines LLVMFuzzerInitialize and LLVMFuzzerTestOneInput. tests/fuzz/run.sh
 * links a target with libFuzzer (clang -fsanitize=fuzzer) to fuzz it; `make check` links
 * the same file with tests/fuzz/replay.c, a main() that runs every file of the target's
 * corpus and crashes directories through it, so both apply the same oracle. A finding is an
 * abort() with a line on stderr saying what was wrong.
 */
#ifndef EMBER_FUZZ_H
#define EMBER_FUZZ_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ember/ember.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_FINDING(...)                                                                      \
    do {                                                                                       \
        fprintf(stderr, "fuzz finding: " __VA_ARGS__);                                         \
        fputc('\n', stderr);                                                                   \
        abort();                                                                               \
    } while (0)

/* Set by the replay (tests/fuzz/replay.c) from an input's file name: +1 for valid_*, which
 * must be accepted, -1 for bad_*, which must be refused, 0 otherwise (and when fuzzing).
 * Weak: the target's and the replay's objects share one. */
extern int fuzz_expect;
__attribute__((weak)) int fuzz_expect = 0;

/* Each target reports whether it accepted the input. */
static inline void fuzz_result(const char *who, bool accepted) {
    if (getenv("FUZZ_VERBOSE")) /* what each input gave, for whoever edits a corpus */
        fprintf(stderr, "%s: %s%s\n", who, accepted ? "accepted" : "refused: ",
                accepted ? "" : em_last_error());
    if (fuzz_expect > 0 && !accepted)
        FUZZ_FINDING("%s: a valid_ input was refused: %s", who, em_last_error());
    if (fuzz_expect < 0 && accepted) FUZZ_FINDING("%s: a bad_ input was accepted", who);
}

static char fuzz_dir[256];
static char fuzz_files[8][320];
static int fuzz_nfiles;

static void fuzz_cleanup(void) {
    for (int i = 0; i < fuzz_nfiles; i++) unlink(fuzz_files[i]);
    if (fuzz_dir[0]) rmdir(fuzz_dir);
}

/* em_init, and a scratch directory (in /dev/shm when there is one: the targets that read
 * files write each input there) removed at exit. */
static inline void fuzz_init(const char *who) {
    if (em_init() != EM_OK) FUZZ_FINDING("%s: em_init: %s", who, em_last_error());
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm"
                       : getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/ember-fuzz-XXXXXX", base);
    if (!mkdtemp(fuzz_dir)) FUZZ_FINDING("%s: mkdtemp %s: %s", who, fuzz_dir, strerror(errno));
    atexit(fuzz_cleanup);
}

/* The path of file `name` in the scratch directory (remembered for the clean-up). */
static inline const char *fuzz_path(const char *name) {
    for (int i = 0; i < fuzz_nfiles; i++)
        if (!strcmp(strrchr(fuzz_files[i], '/') + 1, name)) return fuzz_files[i];
    if (fuzz_nfiles == 8) FUZZ_FINDING("fuzz_path: too many files");
    snprintf(fuzz_files[fuzz_nfiles], sizeof fuzz_files[0], "%s/%s", fuzz_dir, name);
    return fuzz_files[fuzz_nfiles++];
}

/* Write n bytes to the scratch file `name`; returns its path. */
static inline const char *fuzz_write(const char *name, const void *data, size_t n) {
    const char *path = fuzz_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0)
        FUZZ_FINDING("cannot write %s: %s", path, strerror(errno));
    return path;
}

/* A refusal must be one of the allowed statuses (a list ending with EM_OK) and name `name`
 * (when not NULL) in its message. */
static inline void fuzz_check_refusal(const char *who, em_status st, const char *name, ...) {
    va_list ap;
    va_start(ap, name);
    bool allowed = false;
    for (em_status a; (a = (em_status)va_arg(ap, int)) != EM_OK;) allowed |= a == st;
    va_end(ap);
    if (!allowed)
        FUZZ_FINDING("%s: unexpected status %s: %s", who, em_status_name(st), em_last_error());
    if (name && !strstr(em_last_error(), name))
        FUZZ_FINDING("%s: the message does not name '%s': %s", who, name, em_last_error());
}

#endif /* EMBER_FUZZ_H */

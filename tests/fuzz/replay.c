/*
 * replay.c — the `make check` side of a fuzz target: a main() that runs every file of the
 * target's corpus and crashes directories through its LLVMFuzzerTestOneInput, with the
 * target's own oracle (a finding aborts, which fails the test). Built once per target
 * (tests/fuzz/replay_<target>, see Makefile.am) with FUZZ_TARGET naming it and FUZZ_SRCDIR
 * the source tree; run.sh links the same targets with libFuzzer instead.
 *
 *     tests/fuzz/replay_<target> [FILE_OR_DIR...]
 *
 * Without arguments it replays tests/fuzz/corpus/<target>/ (which must hold at least one
 * input) and tests/fuzz/crashes/<target>/ (which may be absent or empty). An input named
 * valid_* must be accepted and one named bad_* refused (fuzz_result), on top of the target's
 * oracle.
 */
#include <dirent.h>

#include "fuzz.h"

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) FUZZ_FINDING("replay: cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += k;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) FUZZ_FINDING("replay: out of memory reading %s", path);
    /* libFuzzer hands the target a buffer of exactly the input's size */
    unsigned char *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    fuzz_expect = !strncmp(base, "valid_", 6) ? 1 : !strncmp(base, "bad_", 4) ? -1 : 0;
    if (getenv("FUZZ_VERBOSE")) fprintf(stderr, "%s\n  ", base);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
}

/* Every file of dir, in name order; returns how many (-1: no such directory). */
static int run_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return -1;
        FUZZ_FINDING("replay: cannot read %s: %s", dir, strerror(errno));
    }
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "README.md")) continue;
        names = realloc(names, (n + 1) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_name);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        run_file(path);
        free(names[i]);
    }
    free(names);
    return (int)n;
}

/* The replay ends like every test: a shutdown that finds nothing left alive (an input that
 * made the target leak a tensor, dict, ... fails it). */
static int clean_shutdown(void) {
    if (em_shutdown_checked() != EM_OK) {
        fprintf(stderr, "replay_%s: %s\n", FUZZ_TARGET, em_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    LLVMFuzzerInitialize(&argc, &argv);
    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            struct stat sb;
            if (stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode)) run_dir(argv[i]);
            else run_file(argv[i]);
        }
        return clean_shutdown();
    }
    char corpus[1024], crashes[1024];
    snprintf(corpus, sizeof corpus, "%s/tests/fuzz/corpus/%s", FUZZ_SRCDIR, FUZZ_TARGET);
    snprintf(crashes, sizeof crashes, "%s/tests/fuzz/crashes/%s", FUZZ_SRCDIR, FUZZ_TARGET);
    int nc = run_dir(corpus), nx = run_dir(crashes);
    if (nc < 1) {
        fprintf(stderr, "replay_%s: no inputs in %s\n", FUZZ_TARGET, corpus);
        return 1;
    }
    printf("replay_%s: %d corpus inputs, %d crash reproducers: no finding\n", FUZZ_TARGET, nc,
           nx < 0 ? 0 : nx);
    return clean_shutdown();
}

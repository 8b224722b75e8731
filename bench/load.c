/*
 * bench/load — what reading a safetensors file costs now that em_load reads it (pread into
 * each tensor's memory) instead of mapping it (issue 13: a mapped file that another process
 * truncates kills the reader with SIGBUS). A 100 MiB file of 25 float32 tensors of 4 MiB
 * (a small model's weights) is written once, then each row is timed `reps` times from the page
 * cache (after one untimed warm-up read of the file):
 *
 *   em_load       em_load onto the CPU (this build: header read and checked, then one pread
 *                 per tensor straight into its freshly allocated memory)
 *   mmap+memcpy   the previous mechanism without Ember around it: map the file, allocate
 *                 each tensor's memory, memcpy its bytes out of the mapping, unmap
 *   pread         the new mechanism without Ember around it: allocate, pread each tensor
 *
 *     bench/load [reps] [path]
 *
 * reps defaults to 3, path to $TMPDIR/ember-bench-load.safetensors (removed at the end).
 * Cold-cache reads (the disk) are not measured: dropping the page cache needs root.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ember/ember.h>

#define N_TENSORS 25
#define N_FLOATS ((int64_t)1 << 20) /* 4 MiB each */
#define ALIGN 64

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The data section's offset and each tensor's [begin, end) from the file's header, as Ember
 * wrote it (25 equal tensors, header order = data order). */
static size_t data_offset(const char *path) {
    FILE *f = fopen(path, "rb");
    unsigned char b[8];
    if (!f || fread(b, 1, 8, f) != 8) {
        fprintf(stderr, "bench/load: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    size_t h = 0;
    for (int i = 0; i < 8; i++) h |= (size_t)b[i] << (8 * i);
    return 8 + h;
}

static void *alloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, n) != 0) {
        fprintf(stderr, "bench/load: out of memory\n");
        exit(1);
    }
    return p;
}

/* One read of the file by each mechanism; returns seconds. */
static double run_em_load(const char *path) {
    double t0 = now();
    em_dict *d = NULL;
    if (em_load(path, NULL, &d, NULL) != EM_OK) {
        fprintf(stderr, "bench/load: %s\n", em_last_error());
        exit(1);
    }
    double t = now() - t0;
    em_dict_free(d);
    em_empty_cache(); /* every repetition allocates fresh memory, like the raw rows */
    return t;
}

static double run_mmap(const char *path, size_t off, size_t each) {
    double t0 = now();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) exit(1);
    unsigned char *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) exit(1);
    void *buf[N_TENSORS];
    for (int i = 0; i < N_TENSORS; i++) {
        buf[i] = alloc(each);
        memcpy(buf[i], map + off + (size_t)i * each, each);
    }
    munmap(map, (size_t)sb.st_size);
    double t = now() - t0;
    for (int i = 0; i < N_TENSORS; i++) free(buf[i]);
    return t;
}

static double run_pread(const char *path, size_t off, size_t each) {
    double t0 = now();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) exit(1);
    void *buf[N_TENSORS];
    for (int i = 0; i < N_TENSORS; i++) {
        buf[i] = alloc(each);
        size_t got = 0;
        while (got < each) {
            ssize_t r = pread(fd, (char *)buf[i] + got, each - got,
                              (off_t)(off + (size_t)i * each + got));
            if (r <= 0) exit(1);
            got += (size_t)r;
        }
    }
    close(fd);
    double t = now() - t0;
    for (int i = 0; i < N_TENSORS; i++) free(buf[i]);
    return t;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    if (reps < 1) reps = 1;
    char path[4096];
    const char *tmp = getenv("TMPDIR");
    if (argc > 2) snprintf(path, sizeof path, "%s", argv[2]);
    else snprintf(path, sizeof path, "%s/ember-bench-load.safetensors", tmp && *tmp ? tmp : "/tmp");
    if (em_init() != EM_OK) {
        fprintf(stderr, "bench/load: em_init: %s\n", em_last_error());
        return 1;
    }
    em_dict *d = em_dict_new();
    for (int i = 0; i < N_TENSORS; i++) {
        char key[32];
        snprintf(key, sizeof key, "layer%02d.weight", i);
        em_tensor *t = em_full(1, (int64_t[]){N_FLOATS}, (double)i, EM_F32, em_cpu());
        if (!t || em_dict_set(d, key, t) != EM_OK) return 1;
        em_tensor_release(t);
    }
    if (em_save(d, path, NULL, NULL) != EM_OK) {
        fprintf(stderr, "bench/load: %s\n", em_last_error());
        return 1;
    }
    em_dict_free(d);
    size_t each = (size_t)N_FLOATS * sizeof(float), off = data_offset(path);
    double mib = (double)N_TENSORS * (double)each / (1 << 20);
    run_pread(path, off, each); /* warm the page cache */

    static const char *names[3] = {"em_load", "mmap+memcpy", "pread"};
    double t[3][64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) { /* interleaved, so drift hits every row alike */
        t[0][r] = run_em_load(path);
        t[1][r] = run_mmap(path, off, each);
        t[2][r] = run_pread(path, off, each);
    }
    printf("ember %s — reading a %.0f MiB safetensors file (%d float32 tensors of 4 MiB), "
           "page cache warm\n", em_version(), mib, N_TENSORS);
    printf("%-12s %9s %9s   %s\n", "row", "median ms", "GiB/s", "each run (ms)");
    for (int k = 0; k < 3; k++) {
        double s[64];
        memcpy(s, t[k], sizeof(double) * (size_t)reps);
        qsort(s, (size_t)reps, sizeof *s, cmp_double);
        double med = s[reps / 2];
        printf("%-12s %9.1f %9.2f  ", names[k], 1e3 * med, mib / 1024 / med);
        for (int r = 0; r < reps; r++) printf(" %.1f", 1e3 * t[k][r]);
        printf("\n");
    }
    unlink(path);
    em_shutdown();
    return 0;
}

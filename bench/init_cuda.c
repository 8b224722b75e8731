/*
 * bench/init_cuda — what the CUDA plugin adds to em_init() on a machine without a GPU (issue
 * 20: at most 10 ms). Each measurement is a fresh process that dlopen()s a copy of libember
 * made outside the build tree (preloaded; so only EMBER_PLUGIN_PATH's plugins load, not the
 * build tree's) and times em_init() alone:
 *
 *   without   the CPU, data, layers and optim plugins
 *   with      the same plus ember-cuda (cudaGetDeviceCount; no cuBLAS without a device)
 *
 *     bench/init_cuda [runs]       runs per row (default 21), alternating the two rows
 *
 * Prints each row's median and minimum and the difference of the medians. The first process
 * of each row pays the cold page cache; the median does not.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The child: load libember from `lib`, time em_init, print milliseconds. */
static int child(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "init_cuda: %s\n", dlerror());
        return 1;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "em_init");
    void (*fini)(void) = (void (*)(void))dlsym(h, "em_shutdown");
    void *(*proc)(const char *, const char *) =
        (void *(*)(const char *, const char *))dlsym(h, "em_backend_proc");
    if (!init || !fini || !proc) return 1;
    double t0 = now();
    int st = init();
    double ms = (now() - t0) * 1e3;
    if (st != 0) return 1;
    /* whether the cuda backend is loaded: the parent checks the row is what it says */
    printf("%.3f %d\n", ms, proc("cuda", "driver_version") != NULL);
    fini();
    return 0;
}

/* One child run with EMBER_PLUGIN_PATH=path; its em_init time in ms, or -1 (also when the
 * cuda backend's presence is not `cuda`). */
static double run_child(const char *self, const char *lib, const char *path, int cuda) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        setenv("EMBER_PLUGIN_PATH", path, 1);
        setenv("LD_PRELOAD", lib, 1); /* preloaded: its initial-exec TLS fits */
        setenv("EMBER_LOG", "error", 1); /* the installed plugin dir, absent, is searched too */
        execl(self, self, "--child", lib, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[64] = "";
    ssize_t n = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
    buf[n] = '\0';
    double ms;
    int has;
    if (sscanf(buf, "%lf %d", &ms, &has) != 2 || has != cuda) return -1;
    return ms;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--child") == 0) return child(argv[2]);
    int runs = argc > 1 ? atoi(argv[1]) : 21;
    if (runs < 1) runs = 1;
    const char *build = EM_BENCH_BUILD_DIR;
    char dir[] = "/tmp/ember-bench-init-XXXXXX", lib[512], cmd[2048];
    if (!mkdtemp(dir)) return 1;
    snprintf(lib, sizeof lib, "%s/libember.so.1", dir);
    snprintf(cmd, sizeof cmd, "cp '%s/core/.libs/libember.so.1' '%s'", build, lib);
    if (system(cmd) != 0) return 1;
    char without[2048], with[2600];
    snprintf(without, sizeof without, "%s/plugins/backend-cpu/.libs:%s/plugins/data/.libs:"
             "%s/plugins/layers/.libs:%s/plugins/optim/.libs", build, build, build, build);
    snprintf(with, sizeof with, "%s:%s/plugins/backend-cuda/.libs", without, build);
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    double *t[2] = {calloc((size_t)runs, sizeof(double)), calloc((size_t)runs, sizeof(double))};
    for (int i = 0; i < runs; i++)
        for (int k = 0; k < 2; k++)
            if ((t[k][i] = run_child(self, lib, k ? with : without, k)) < 0) {
                fprintf(stderr, "init_cuda: a child failed (row %s)\n", k ? "with" : "without");
                return 1;
            }
    const char *names[2] = {"without ember-cuda", "with ember-cuda"};
    double med[2];
    printf("em_init() in a fresh process, %d runs each (ms)\n", runs);
    for (int k = 0; k < 2; k++) {
        qsort(t[k], (size_t)runs, sizeof(double), cmp_double);
        med[k] = t[k][runs / 2];
        printf("  %-20s median %8.3f   min %8.3f\n", names[k], med[k], t[k][0]);
    }
    printf("  the plugin adds %.3f ms (median; the issue's bound: 10 ms)\n", med[1] - med[0]);
    unlink(lib);
    rmdir(dir);
    free(t[0]);
    free(t[1]);
    return 0;
}

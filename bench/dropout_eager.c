/*
 * dropout_eager.c — em_dropout's eager cost: CPU time per call (forward, no grad, p 0.1, the
 * default generator), after a warm-up of a tenth as many calls.
 *
 *     dropout_eager ROWS COLS CALLS      prints microseconds of CPU time per call
 *
 * For A/B runs of two builds (bench/README.md, "Dropout under graph capture"): build it
 * against each and run them alternately with OMP_NUM_THREADS=1; under callgrind the
 * difference of two call counts gives the instructions per call, which load does not move.
 */
#include <ember/ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
static double cpu_s(void) {
    struct rusage r; getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}
int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: dropout_eager ROWS COLS CALLS\n");
        return 2;
    }
    int64_t rows = atoll(argv[1]), cols = atoll(argv[2]); int n = atoi(argv[3]);
    em_init();
    const int64_t sh[2] = {rows, cols};
    em_scope_begin();
    em_tensor *x = em_keep(em_zeros(2, sh, EM_F32, em_cpu()));
    em_scope_end();
    for (int i = 0; i < n / 10; i++) { em_scope_begin(); em_dropout(x, 0.1, true, NULL, NULL); em_scope_end(); }
    double t0 = cpu_s();
    for (int i = 0; i < n; i++) { em_scope_begin(); if (!em_dropout(x, 0.1, true, NULL, NULL)) return 1; em_scope_end(); }
    double t = cpu_s() - t0;
    printf("%.3f\n", t / n * 1e6);
    em_tensor_release(x);
    em_shutdown();
    return 0;
}

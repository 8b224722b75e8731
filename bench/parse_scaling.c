/*
 * parse_scaling.c — wall-clock scaling of the config and safetensors-header parsers: a YAML
 * list of n items, a map of n keys with n anchors and n/8 aliases, and a safetensors header
 * with n metadata entries, each at n and 4n. Linear parsing takes about 4 times as long for
 * 4n; the quadratic parsers this replaced took about 16 times. The counted form of the same
 * check (bytes allocated, key comparisons) is in make check: tests/test_trainer.c
 * (config_parse) and tests/test_serialize.c (metadata_parse_cost_grows_linearly).
 *
 *     bench/parse_scaling [n]        (default 100000; the sizes: 400k items, 80k entries)
 *
 * Each figure is the best of 3 runs (CLOCK_MONOTONIC). The bench prints; it asserts nothing.
 */
#include <ember/ember.h>
#include <ember/config.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *yaml_list(int n) {
    size_t cap = (size_t)n * 16 + 16, used = 0;
    char *t = malloc(cap);
    used += (size_t)snprintf(t, cap, "list:\n");
    for (int i = 0; i < n; i++) used += (size_t)snprintf(t + used, cap - used, "  - %d\n", i);
    return t;
}

static char *yaml_map(int n) {
    size_t cap = (size_t)n * 48 + 32, used = 0;
    char *t = malloc(cap);
    used += (size_t)snprintf(t, cap, "map:\n");
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(t + used, cap - used, "  k%d: &a%d %d\n", i, i, i);
    /* one alias per 8 anchors: 4n aliases of n = 100,000 would pass the alias limit */
    used += (size_t)snprintf(t + used, cap - used, "aliases:\n");
    for (int i = 0; i < n; i += 8) used += (size_t)snprintf(t + used, cap - used, "  - *a%d\n", i);
    return t;
}

static char *st_header(int n, size_t *len) {
    size_t cap = (size_t)n * 40 + 64;
    char *b = malloc(cap + 8);
    size_t h = (size_t)snprintf(b + 8, cap, "{\"__metadata__\":{");
    for (int i = 0; i < n; i++)
        h += (size_t)snprintf(b + 8 + h, cap - h, "%s\"key%d\":\"v%d\"", i ? "," : "", i, i);
    h += (size_t)snprintf(b + 8 + h, cap - h, "}}");
    for (int i = 0; i < 8; i++) b[i] = (char)((unsigned long long)h >> (8 * i));
    *len = 8 + h;
    return b;
}

/* Best of 3 parses of what make(n) builds; -1 on error. */
static double time_yaml(char *(*make)(int), int n) {
    char *t = make(n);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        em_config *c = em_config_parse(t, strlen(t), "bench.yaml");
        double dt = now() - t0;
        if (!c) {
            fprintf(stderr, "parse_scaling: %s\n", em_last_error());
            free(t);
            return -1;
        }
        em_config_free(c);
        if (dt < best) best = dt;
    }
    free(t);
    return best;
}

static double time_header(int n) {
    size_t len;
    char *b = st_header(n, &len);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        em_dict *d;
        em_metadata *m;
        double t0 = now();
        em_status st = em_load_buffer(b, len, "bench.safetensors", NULL, &d, &m);
        double dt = now() - t0;
        if (st != EM_OK) {
            fprintf(stderr, "parse_scaling: %s\n", em_last_error());
            free(b);
            return -1;
        }
        em_metadata_free(m);
        em_dict_free(d);
        if (dt < best) best = dt;
    }
    free(b);
    return best;
}

static void row(const char *what, int n, double a, double b) {
    printf("%-36s %8d %10.3f %8d %10.3f   x%.2f\n", what, n, a * 1e3, 4 * n, b * 1e3, b / a);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    if (n < 1) n = 100000;
    if (em_init() != EM_OK) {
        fprintf(stderr, "parse_scaling: %s\n", em_last_error());
        return 1;
    }
    printf("%-36s %8s %10s %8s %10s   %s\n", "parser", "n", "ms", "4n", "ms", "ratio (linear: x4)");
    row("YAML list of n items", n, time_yaml(yaml_list, n), time_yaml(yaml_list, 4 * n));
    row("YAML map, n keys + anchors, n/8 aliases", n, time_yaml(yaml_map, n), time_yaml(yaml_map, 4 * n));
    row("safetensors header, n metadata", n, time_header(n), time_header(4 * n));
    em_shutdown();
    return 0;
}

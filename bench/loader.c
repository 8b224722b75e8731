/*
 * bench/loader — DataLoader throughput: samples per second of Fashion-MNIST-format data
 * (60000 x 28 x 28 u8, IDX) at batch 128, for num_workers 0, 1, 2, with and without shuffle
 * and transforms. The consumer only touches each batch, so this is the loader's ceiling.
 *
 *     bench/loader [dir] [epochs]
 *
 * dir defaults to /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist);
 * when it is absent, a 60000-image IDX file of random pixels is generated in
 * /tmp/ember-bench-fmnist. Target (issue 6): >= 300,000 samples/s with one worker and no
 * transforms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <ember/ember.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void put32(FILE *f, unsigned v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};
    fwrite(b, 1, 4, f);
}

/* A Fashion-MNIST-shaped training split of random pixels. */
static const char *generate(void) {
    static const char *dir = "/tmp/ember-bench-fmnist";
    char path[256];
    struct stat sb;
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", dir);
    if (stat(path, &sb) == 0 && sb.st_size == 16 + 60000L * 784) return dir;
    mkdir(dir, 0755);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    put32(f, 0x803), put32(f, 60000), put32(f, 28), put32(f, 28);
    unsigned char *buf = malloc(784);
    unsigned s = 12345;
    for (int i = 0; i < 60000; i++) {
        for (int k = 0; k < 784; k++) buf[k] = (unsigned char)((s = s * 1103515245u + 12345u) >> 24);
        fwrite(buf, 1, 784, f);
    }
    free(buf);
    fclose(f);
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte", dir);
    f = fopen(path, "wb");
    put32(f, 0x801), put32(f, 60000);
    for (int i = 0; i < 60000; i++) fputc(i % 10, f);
    fclose(f);
    return dir;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    int epochs = argc > 2 ? atoi(argv[2]) : 3;
    struct stat sb;
    const char *source = "Fashion-MNIST (gzip IDX)";
    if (stat(dir, &sb) != 0) {
        dir = generate();
        source = "generated random 60000x28x28 (raw IDX)";
    }
    if (!dir || em_init() != EM_OK) {
        fprintf(stderr, "bench/loader: %s\n", dir ? em_last_error() : "cannot write /tmp");
        return 1;
    }
    double t0 = now();
    em_options *dso = em_options_new();
    if (!dso || em_options_set_string(dso, "path", dir) != EM_OK) return 1;
    em_dataset *ds = em_dataset_open("mnist", dso);
    em_options_free(dso);
    if (!ds) {
        fprintf(stderr, "bench/loader: %s\n", em_last_error());
        return 1;
    }
    printf("data: %s in %s: %lld items, opened in %.2f s\n", source, dir,
           (long long)em_dataset_length(ds), now() - t0);
    printf("batch 128, %d epochs per row; median wait per batch from the loader's wait record "
           "(em_loader_wait_quantile), the first batch excluded\n\n", epochs);
    printf("%-8s %-8s %-28s %14s %16s\n", "workers", "shuffle", "transforms", "samples/s",
           "median wait us");
    static const float mean[1] = {0.2860f}, std[1] = {0.3530f};
    for (int tr = 0; tr < 2; tr++)
        for (int sh = 0; sh < 2; sh++)
            for (int w = 0; w <= 2; w++) {
                em_loader_options o = {.struct_size = sizeof o, .batch_size = 128,
                                       .shuffle = sh, .seed = 1, .num_workers = w};
                if (tr)
                    o.transforms = (em_transforms){.to_float = true, .mean = mean, .std = std,
                                                   .n_channels = 1, .crop_padding = 2,
                                                   .hflip = true};
                em_loader *l = em_loader_new(ds, &o);
                if (!l) {
                    fprintf(stderr, "bench/loader: %s\n", em_last_error());
                    return 1;
                }
                em_tensor *x, *y;
                int64_t items = 0;
                volatile unsigned sink = 0;
                double start = now();
                for (int e = 0; e < epochs; e++) {
                    while (em_loader_next(l, &x, &y) == EM_OK && x) {
                        items += em_tensor_size(x, 0);
                        sink += *(const unsigned char *)em_tensor_data(x);
                        if (items == em_tensor_size(x, 0)) em_loader_reset_stats(l); /* first */
                    }
                    if (em_last_status() != EM_OK) {
                        fprintf(stderr, "bench/loader: %s\n", em_last_error());
                        return 1;
                    }
                }
                double secs = now() - start;
                printf("%-8d %-8s %-28s %14.0f %16.1f\n", w, sh ? "yes" : "no",
                       tr ? "float+normalize+crop+flip" : "none", (double)items / secs,
                       (double)em_loader_wait_quantile(l, 0.5) / 1e3);
                em_loader_free(l);
            }
    em_dataset_free(ds);
    em_shutdown();
    return 0;
}

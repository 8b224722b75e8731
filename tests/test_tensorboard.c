/*
 * test_tensorboard.c — the --tensorboard sink's encoding (trainer/tensorboard.c, compiled in):
 *   - CRC-32C against RFC 3720's test vectors and "123456789", and a plain bitwise loop;
 *   - TFRecord framing of a record: little-endian length, masked CRCs of the length and of
 *     the payload (the masking as the format defines it, and against the value TensorBoard's
 *     own masked_crc32c gives for "123456789");
 *   - protobuf varints against the protobuf documentation's examples;
 *   - a whole events file written through the sink interface, decoded here field by field:
 *     the brain.Event:2 header, scalars with their tags, steps and values, NaN left out, a
 *     histogram's min/max/num/sum/sum_squares/buckets against plain loops, and that an
 *     epoch row and a flush are on disk before close;
 *   - errors: a directory that is a file, one that cannot be made, named in the message.
 * TensorBoard's own reader reads the same files in tests/test_tensorboard.sh.
 */
#include "common.h"

#include "../trainer/tensorboard.h"

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

TestSuite(tensorboard, .init = em_test_setup, .fini = em_test_teardown);

/* The definition, bit by bit: the reference for the table-driven one. */
static uint32_t crc_bitwise(const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

Test(tensorboard, crc32c_vectors) {
    cr_assert_eq(tb_crc32c(0, "123456789", 9), 0xE3069283u);
    uint8_t buf[32];
    memset(buf, 0, 32); /* RFC 3720, B.4 */
    cr_assert_eq(tb_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, 32);
    cr_assert_eq(tb_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
    cr_assert_eq(tb_crc32c(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
    cr_assert_eq(tb_crc32c(0, buf, 32), 0x113FDB5Cu);
    cr_assert_eq(tb_crc32c(0, "", 0), 0u);
    /* continuing from a partial CRC is the CRC of the whole */
    cr_assert_eq(tb_crc32c(tb_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    uint8_t r[1000];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof r; i++) r[i] = (uint8_t)((x = x * 1103515245u + 12345u) >> 16);
    for (size_t n = 0; n <= sizeof r; n += 37)
        cr_assert_eq(tb_crc32c(0, r, n), crc_bitwise(r, n), "n = %zu", n);
}

static uint32_t rd_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd_le64(const uint8_t *p) { return rd_le32(p) | (uint64_t)rd_le32(p + 4) << 32; }
static uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

Test(tensorboard, framing) {
    /* TensorBoard's pywrap_tensorflow.masked_crc32c(b"123456789") */
    cr_assert_eq(tb_masked_crc32c("123456789", 9), 0xC78AB0E5u);
    const char *payloads[] = {"", "abc", "a longer payload of several dozen bytes, to cross words"};
    for (int k = 0; k < 3; k++) {
        char *mem = NULL;
        size_t len = 0, n = strlen(payloads[k]);
        FILE *f = open_memstream(&mem, &len);
        cr_assert(f);
        cr_assert(tb_write_record(f, payloads[k], n));
        cr_assert_eq(fclose(f), 0);
        const uint8_t *p = (const uint8_t *)mem;
        cr_assert_eq(len, 16 + n);
        cr_assert_eq(rd_le64(p), n);
        cr_assert_eq(rd_le32(p + 8), masked(crc_bitwise(p, 8)));
        cr_assert_eq(memcmp(p + 12, payloads[k], n), 0);
        cr_assert_eq(rd_le32(p + 12 + n), masked(crc_bitwise(payloads[k], n)));
        free(mem);
    }
}

Test(tensorboard, varints) {
    struct { uint64_t v; size_t n; uint8_t b[10]; } cases[] = {
        {0, 1, {0}}, {1, 1, {1}}, {127, 1, {0x7f}}, {128, 2, {0x80, 0x01}},
        {150, 2, {0x96, 0x01}}, {300, 2, {0xac, 0x02}},
        {UINT64_MAX, 10, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t out[10];
        cr_assert_eq(tb_varint(out, cases[i].v), cases[i].n, "%llu", (unsigned long long)cases[i].v);
        cr_assert_eq(memcmp(out, cases[i].b, cases[i].n), 0);
    }
}

/* ---- a small protobuf reader, for the files the sink writes -------------------------------- */

typedef struct field {
    int num, wire;
    uint64_t u;           /* varint, fixed64, fixed32 */
    const uint8_t *p;     /* length-delimited */
    size_t n;
} field;

static uint64_t rd_varint(const uint8_t **p, const uint8_t *end) {
    uint64_t v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    cr_assert_fail("a truncated varint");
    return 0;
}

/* The fields of message [p, p+n) into f (at most cap); returns how many. */
static int rd_fields(const uint8_t *p, size_t n, field *f, int cap) {
    const uint8_t *end = p + n;
    int k = 0;
    while (p < end) {
        cr_assert_lt(k, cap);
        uint64_t key = rd_varint(&p, end);
        field *x = &f[k++];
        *x = (field){.num = (int)(key >> 3), .wire = (int)(key & 7)};
        switch (x->wire) {
        case 0: x->u = rd_varint(&p, end); break;
        case 1: cr_assert_leq(p + 8, end); x->u = rd_le64(p); p += 8; break;
        case 5: cr_assert_leq(p + 4, end); x->u = rd_le32(p); p += 4; break;
        case 2:
            x->n = (size_t)rd_varint(&p, end);
            cr_assert_leq(p + x->n, end);
            x->p = p;
            p += x->n;
            break;
        default: cr_assert_fail("wire type %d", x->wire);
        }
    }
    return k;
}

static double as_double(const field *f) {
    cr_assert_eq(f->wire, 1);
    double d;
    memcpy(&d, &f->u, 8);
    return d;
}

/* The file's records (their payloads, pointing into *buf, which the caller frees). */
static int read_records(const char *path, uint8_t **buf, field *rec, int cap) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)len + 1);
    cr_assert_eq(fread(*buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    const uint8_t *p = *buf, *end = *buf + len;
    int k = 0;
    while (p < end) {
        cr_assert_lt(k, cap);
        cr_assert_leq(p + 12, end);
        uint64_t n = rd_le64(p);
        cr_assert_eq(rd_le32(p + 8), masked(crc_bitwise(p, 8)));
        cr_assert_leq(p + 16 + n, end);
        cr_assert_eq(rd_le32(p + 12 + n), masked(crc_bitwise(p + 12, n)));
        rec[k++] = (field){.p = p + 12, .n = n};
        p += 16 + n;
    }
    return k;
}

/* An event's step and its summary's values: tags into tags[], the value fields into vals[]. */
static int64_t event_values(const field *rec, char tags[][64], field *vals, int *nv) {
    field ev[8], sv[64];
    int ne = rd_fields(rec->p, rec->n, ev, 8);
    int64_t step = -1;
    *nv = 0;
    for (int i = 0; i < ne; i++) {
        if (ev[i].num == 2) step = (int64_t)ev[i].u;
        if (ev[i].num != 5) continue;
        int ns = rd_fields(ev[i].p, ev[i].n, sv, 64);
        for (int j = 0; j < ns; j++) {
            cr_assert_eq(sv[j].num, 1);
            field v[4];
            int nf = rd_fields(sv[j].p, sv[j].n, v, 4);
            cr_assert_eq(nf, 2);
            cr_assert_eq(v[0].num, 1);
            snprintf(tags[*nv], 64, "%.*s", (int)v[0].n, (const char *)v[0].p);
            vals[(*nv)++] = v[1];
        }
    }
    return step;
}

static float as_float(const field *f) {
    cr_assert_eq(f->num, 2);
    cr_assert_eq(f->wire, 5);
    uint32_t u = (uint32_t)f->u;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* The one events file in dir. */
static void events_file(const char *dir, char *path, size_t cap) {
    DIR *d = opendir(dir);
    cr_assert(d, "%s", dir);
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20)) continue;
        snprintf(path, cap, "%s/%s", dir, e->d_name);
        found++;
    }
    closedir(d);
    cr_assert_eq(found, 1);
}

Test(tensorboard, events_file) {
    char tmp[] = "/tmp/ember-tb-test-XXXXXX", dir[128], path[512];
    cr_assert(mkdtemp(tmp));
    snprintf(dir, sizeof dir, "%s/runs/exp", tmp); /* parents are made */
    metrics_sink s;
    cr_assert(tensorboard_sink_open(&s, dir, true, "accuracy", -1), "%s", s.err);
    cr_assert_str_eq(s.option, "--tensorboard");
    events_file(dir, path, sizeof path);
    cr_assert_str_eq(tensorboard_sink_path(&s), path);

    step_row r = {.step = 7, .epoch = 1, .loss = 0.625, .n_groups = 2, .lr = {0.1, 0.01},
                  .grad_norm = NAN, .samples_s = 1234.5, .data_wait_s = 0.25};
    cr_assert(s.step(&s, &r), "%s", s.err);
    epoch_row e = {.epoch = 1, .step = 9, .lr = 0.1, .train_loss = 0.5, .grad_norm = 2.5,
                   .val_loss = 0.75, .val_metric = 0.875, .samples_s = 1000, .wait_pct = 3,
                   .peak = 4096, .train_metric = 0.8125, .test_loss = NAN, .test_metric = NAN,
                   .skipped_steps = 0, .loss_scale = NAN};
    cr_assert(s.epoch(&s, &e), "%s", s.err);
    uint8_t *early;
    field recs[16];
    cr_assert_eq(read_records(path, &early, recs, 16), 3, "an epoch row is on disk at once");
    free(early);

    /* a parameter with a .grad, one without; one whose values are all equal */
    double wv[] = {-1.5, 0.25, 3.0, 0.25, -0.75, 2.0, 1.0, NAN}, gv[] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    em_tensor *w = em_test_tensor(EM_F32, 1, (int64_t[]){8}, wv);
    em_tensor *g = em_test_tensor(EM_F32, 1, (int64_t[]){8}, gv);
    double bv[31]; /* 0..30: 30 buckets of width 1, every value but the ends on an edge */
    for (int i = 0; i < 31; i++) bv[i] = i;
    em_tensor *b = em_test_tensor(EM_F64, 1, (int64_t[]){31}, bv);
    cr_assert_eq(em_requires_grad_(w, true), EM_OK);
    cr_assert_eq(em_tensor_set_grad(w, g), EM_OK, "%s", em_last_error());
    em_dict *params = em_dict_new();
    cr_assert_eq(em_dict_set(params, "0.weight", w), EM_OK);
    cr_assert_eq(em_dict_set(params, "0.bias", b), EM_OK);
    cr_assert(s.params(&s, 1, 9, params), "%s", s.err);
    cr_assert(s.flush(&s), "%s", s.err);
    cr_assert_eq(read_records(path, &early, recs, 16), 5, "flush writes out what is buffered");
    free(early);
    cr_assert(s.close(&s), "%s", s.err);
    em_dict_free(params);
    em_tensor_release(w);
    em_tensor_release(g);
    em_tensor_release(b);

    uint8_t *buf;
    field rec[16];
    int nr = read_records(path, &buf, rec, 16);
    cr_assert_eq(nr, 5); /* header, a step, an epoch, two parameters */
    /* the header: wall_time, step 0, file_version */
    field ev[8];
    int ne = rd_fields(rec[0].p, rec[0].n, ev, 8);
    cr_assert_eq(ne, 3);
    cr_assert_eq(ev[0].num, 1);
    double wall = as_double(&ev[0]);
    cr_assert(fabs(wall - (double)time(NULL)) < 600, "wall_time %f", wall);
    cr_assert_eq(ev[1].num, 2);
    cr_assert_eq(ev[1].u, 0);
    cr_assert_eq(ev[2].num, 3);
    cr_assert_eq(ev[2].n, 13);
    cr_assert_eq(memcmp(ev[2].p, "brain.Event:2", 13), 0);

    char tags[64][64];
    field vals[64];
    int nv;
    cr_assert_eq(event_values(&rec[1], tags, vals, &nv), 7);
    const char *step_tags[] = {"train/loss", "train/lr/group0", "train/lr/group1",
                               "train/samples_per_s", "train/data_wait_s"}; /* no grad_norm: NaN */
    double step_vals[] = {0.625, 0.1, 0.01, 1234.5, 0.25};
    cr_assert_eq(nv, 5);
    for (int i = 0; i < nv; i++) {
        cr_assert_str_eq(tags[i], step_tags[i]);
        cr_assert_eq(as_float(&vals[i]), (float)step_vals[i], "%s", tags[i]);
    }
    cr_assert_eq(event_values(&rec[2], tags, vals, &nv), 9);
    const char *ep_tags[] = {"epoch/epoch", "epoch/train_loss", "epoch/train_accuracy", "epoch/lr",
                             "epoch/grad_norm", "epoch/samples_per_s", "epoch/data_wait_pct",
                             "epoch/peak_memory", "val/loss", "val/accuracy"};
    double ep_vals[] = {1, 0.5, 0.8125, 0.1, 2.5, 1000, 3, 4096, 0.75, 0.875};
    cr_assert_eq(nv, 10); /* no test set, no --amp */
    for (int i = 0; i < nv; i++) {
        cr_assert_str_eq(tags[i], ep_tags[i]);
        cr_assert_eq(as_float(&vals[i]), (float)ep_vals[i], "%s", tags[i]);
    }

    /* weights/0.weight: the finite values, 30 equal buckets from min to max */
    cr_assert_eq(event_values(&rec[3], tags, vals, &nv), 9);
    cr_assert_eq(nv, 2);
    cr_assert_str_eq(tags[0], "weights/0.weight");
    cr_assert_str_eq(tags[1], "gradients/0.weight");
    for (int h = 0; h < 3; h++) {
        const double *v = h == 0 ? wv : h == 1 ? gv : bv;
        int n = h == 2 ? 31 : 8;
        field hf[8];
        if (h == 2) cr_assert_eq(event_values(&rec[4], tags, vals, &nv), 9);
        if (h == 2) cr_assert_str_eq(tags[0], "weights/0.bias");
        const field *hv = &vals[h == 2 ? 0 : h];
        cr_assert_eq(hv->num, 5);
        cr_assert_eq(rd_fields(hv->p, hv->n, hf, 8), 7);
        double mn = INFINITY, mx = -INFINITY, sum = 0, sum2 = 0, num = 0;
        for (int i = 0; i < n; i++) {
            if (isnan(v[i])) continue;
            mn = fmin(mn, v[i]);
            mx = fmax(mx, v[i]);
            sum += v[i];
            sum2 += v[i] * v[i];
            num++;
        }
        cr_assert_eq(as_double(&hf[0]), mn);
        cr_assert_eq(as_double(&hf[1]), mx);
        cr_assert_eq(as_double(&hf[2]), num);
        cr_assert_eq(as_double(&hf[3]), sum);
        cr_assert_eq(as_double(&hf[4]), sum2);
        int nb = mx > mn ? 30 : 1;
        cr_assert_eq(hf[5].num, 6);
        cr_assert_eq(hf[6].num, 7);
        cr_assert_eq(hf[5].n, 8 * (size_t)nb);
        cr_assert_eq(hf[6].n, 8 * (size_t)nb);
        double total = 0;
        for (int k = 0; k < nb; k++) {
            double lim, cnt, expect_cnt = 0;
            uint64_t u = rd_le64(hf[5].p + 8 * k);
            memcpy(&lim, &u, 8);
            u = rd_le64(hf[6].p + 8 * k);
            memcpy(&cnt, &u, 8);
            cr_assert(fabs(lim - (mn + (mx - mn) * (k + 1) / nb)) <= 1e-12 * fabs(mx), "limit %d", k);
            double lo = mn + (mx - mn) * k / nb; /* the bucket [lo, lim), the last one closed */
            for (int i = 0; i < n; i++)
                if (!isnan(v[i]) && v[i] >= lo && (v[i] < lim || k == nb - 1)) expect_cnt++;
            cr_assert_eq(cnt, expect_cnt, "histogram %d bucket %d", h, k);
            if (h == 2) cr_assert_eq(cnt, k == nb - 1 ? 2 : 1, "bucket %d of 0..30", k);
            total += cnt;
        }
        cr_assert_eq(total, num);
    }
    free(buf);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

Test(tensorboard, errors) {
    char tmp[] = "/tmp/ember-tb-test-XXXXXX", file[128], dir[160];
    cr_assert(mkdtemp(tmp));
    snprintf(file, sizeof file, "%s/plain", tmp);
    FILE *f = fopen(file, "w");
    cr_assert(f);
    fclose(f);
    metrics_sink s;
    cr_assert_not(tensorboard_sink_open(&s, file, false, "accuracy", -1));
    cr_assert(strstr(s.err, file) && strstr(s.err, "not a directory"), "%s", s.err);
    cr_assert_null(s.ctx);
    snprintf(dir, sizeof dir, "%s/sub", file); /* under a file: cannot be made */
    cr_assert_not(tensorboard_sink_open(&s, dir, false, "accuracy", -1));
    cr_assert(strstr(s.err, dir) && strstr(s.err, "cannot create the directory"), "%s", s.err);
    cr_assert_not(tensorboard_sink_open(&s, "", false, "accuracy", -1));
    cr_assert(strstr(s.err, "empty"), "%s", s.err);
    /* without histograms the sink takes no parameters */
    cr_assert(tensorboard_sink_open(&s, tmp, false, "mae", -1), "%s", s.err);
    cr_assert_null(s.params);
    cr_assert(s.close(&s), "%s", s.err);
    /* a new file's name sorts after those already there (TensorBoard reads them in name
     * order), even one stamped ahead of the clock */
    long long ahead = (long long)time(NULL) + 100;
    char fake[256], want[64];
    snprintf(fake, sizeof fake, "%s/events.out.tfevents.%lld.otherhost.1.0", tmp, ahead);
    cr_assert(f = fopen(fake, "w"));
    fclose(f);
    cr_assert(tensorboard_sink_open(&s, tmp, false, "mae", -1), "%s", s.err);
    snprintf(want, sizeof want, "/events.out.tfevents.%lld.", ahead + 1);
    cr_assert(strstr(tensorboard_sink_path(&s), want), "%s", tensorboard_sink_path(&s));
    cr_assert(s.close(&s), "%s", s.err);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

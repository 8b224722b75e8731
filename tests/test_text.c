/*
 * test_text.c — the "text" dataset class (next-token windows of a text file): its windows
 * and targets, the split by position, the vocabulary and the unknown id, byte level, gzip,
 * the metadata it carries (and that subsets keep), and bad input. References are plain loops
 * over the text decoded here by the C library (mbrtowc in a UTF-8 locale), not by Ember.
 */
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <wchar.h>
#include <zlib.h>

#include "common.h"
#include "ember/serialize.h"

TestSuite(text, .init = em_test_setup, .fini = em_test_teardown);

static char tmpdir[256];
static const char *fresh_dir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ember-test-text-XXXXXX");
    cr_assert(mkdtemp(tmpdir), "mkdtemp");
    return tmpdir;
}
static void cleanup(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

static const char *write_text(const char *name, const char *text, size_t n, bool gz) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        cr_assert(f);
        cr_assert_eq(gzwrite(f, text, (unsigned)n), (int)n);
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        cr_assert(f);
        cr_assert_eq(fwrite(text, 1, n, f), n);
        fclose(f);
    }
    return path;
}

/* Open class "text" on path with more options: key, value, ..., NULL. */
static em_dataset *open_text(const char *path, ...) {
    em_options *o = em_options_new();
    cr_assert(o);
    cr_assert_eq(em_options_set_string(o, "path", path), EM_OK);
    va_list ap;
    va_start(ap, path);
    for (const char *k; (k = va_arg(ap, const char *));)
        cr_assert_eq(em_options_set_text(o, k, va_arg(ap, const char *), NULL), EM_OK, "%s: %s",
                     k, em_last_error());
    va_end(ap);
    em_dataset *ds = em_dataset_open("text", o);
    em_options_free(o);
    return ds;
}

/* The text's characters by the C library's UTF-8 decoder. */
static int64_t decode(const char *text, wchar_t *out, int64_t cap) {
    cr_assert(setlocale(LC_CTYPE, "C.UTF-8") || setlocale(LC_CTYPE, "en_US.UTF-8"),
              "no UTF-8 locale");
    mbstate_t st = {0};
    int64_t n = 0;
    size_t len = strlen(text);
    for (size_t i = 0; i < len;) {
        size_t k = mbrtowc(&out[n], text + i, len - i, &st);
        cr_assert(k != (size_t)-1 && k != (size_t)-2 && k > 0);
        cr_assert_lt(n, cap);
        n++;
        i += k;
    }
    setlocale(LC_CTYPE, "C");
    return n;
}

/* Check every item of ds against the windows of tokens ref[0..n) (seq_len L, stride S). */
static void check_windows(em_dataset *ds, const int64_t *ref, int64_t n, int64_t L, int64_t S) {
    int64_t items = 0;
    for (int64_t s = 0; s + L + 1 <= n; s += S) items++;
    cr_assert_eq(em_dataset_length(ds), items, "length %lld, want %lld",
                 (long long)em_dataset_length(ds), (long long)items);
    int64_t *in = malloc(sizeof(int64_t) * (size_t)(L * items));
    int64_t *tg = malloc(sizeof(int64_t) * (size_t)(L * items));
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)items);
    for (int64_t i = 0; i < items; i++) idx[i] = items - 1 - i; /* any order */
    void *data[2] = {in, tg};
    cr_assert_eq(em_dataset_read_fields(ds, idx, items, data, (int64_t *[2]){NULL, NULL}),
                 EM_OK, "%s", em_last_error());
    for (int64_t j = 0; j < items; j++)
        for (int64_t t = 0; t < L; t++) {
            int64_t s = idx[j] * S;
            cr_assert_eq(in[j * L + t], ref[s + t], "item %lld input %lld", (long long)idx[j],
                         (long long)t);
            cr_assert_eq(tg[j * L + t], ref[s + t + 1], "item %lld target %lld",
                         (long long)idx[j], (long long)t);
        }
    free(in);
    free(tg);
    free(idx);
}

static const char *meta(const em_dataset *ds, const char *k) {
    return em_metadata_get(em_dataset_metadata(ds), k);
}

/* Text with a two-byte (é), a three-byte (€) and a four-byte (𝄞) character; the validation
 * part (the last 25%) holds '€' and 'Z', which the training part lacks. */
static const char TEXT[] = "h\xc3\xa9llo world\nthe quick brown fox \xf0\x9d\x84\x9e jumps "
                           "over the lazy dog\nhello again \xc3\xa9t\xc3\xa9 \xe2\x82\xac Z end";

Test(text, char_windows_split_vocab) {
    fresh_dir();
    const char *p = write_text("t.txt", TEXT, sizeof TEXT - 1, false);
    wchar_t w[256];
    int64_t n = decode(TEXT, w, 256);
    int64_t n_val = (int64_t)(0.25 * (double)n), n_train = n - n_val;
    /* the reference vocabulary: the training part's distinct characters by code point */
    wchar_t voc[256];
    int64_t V = 0;
    for (wchar_t c = 1; c < 0x20000; c++)
        for (int64_t i = 0; i < n_train; i++)
            if (w[i] == c) {
                voc[V++] = c;
                break;
            }
    int64_t ref[256];
    for (int64_t i = 0; i < n; i++) {
        ref[i] = V; /* the unknown id */
        for (int64_t k = 0; k < V; k++)
            if (voc[k] == w[i]) ref[i] = k;
    }
    for (int64_t i = 0; i < n_train; i++) cr_assert_lt(ref[i], V);
    int unknown = 0;
    for (int64_t i = n_train; i < n; i++) unknown += ref[i] == V;
    cr_assert_eq(unknown, 2, "the text's validation part has '\u20ac' and 'Z' unseen");

    const int64_t L = 7;
    for (int stride = 0; stride <= 3; stride++) {
        char sl[24], st[24];
        snprintf(sl, sizeof sl, "%lld", (long long)L);
        snprintf(st, sizeof st, "%d", stride);
        int64_t S = stride ? stride : L;
        em_dataset *tr = open_text(p, "seq_len", sl, "stride", st, "val_fraction", "0.25", NULL);
        cr_assert(tr, "%s", em_last_error());
        em_dataset *va = open_text(p, "seq_len", sl, "stride", st, "val_fraction", "0.25",
                                   "split", "validation", NULL);
        cr_assert(va, "%s", em_last_error());
        check_windows(tr, ref, n_train, L, S);
        check_windows(va, ref + n_train, n_val, L, S);
        for (int k = 0; k < 2; k++) {
            const em_field *f = em_dataset_field(tr, k);
            cr_assert_str_eq(f->name, k ? "target" : "input");
            cr_assert_eq(f->dtype, EM_I64);
            cr_assert_eq(f->ndim, 1);
            cr_assert_eq(f->shape[0], L);
            cr_assert_eq(f->num_classes, V + 1);
            cr_assert_eq(em_dataset_field(va, k)->num_classes, V + 1);
        }
        /* the metadata: both splits carry the training part's vocabulary */
        char vocab[1024];
        size_t at = 0;
        for (int64_t k = 0; k < V; k++) {
            char mb[8];
            mbstate_t ms = {0};
            setlocale(LC_CTYPE, "C.UTF-8");
            size_t m = wcrtomb(mb, voc[k], &ms);
            setlocale(LC_CTYPE, "C");
            memcpy(vocab + at, mb, m);
            at += m;
        }
        vocab[at] = '\0';
        char num[32];
        for (int d = 0; d < 2; d++) {
            em_dataset *ds = d ? va : tr;
            cr_assert_str_eq(meta(ds, "text.level"), "char");
            cr_assert_str_eq(meta(ds, "text.vocab"), vocab);
            snprintf(num, sizeof num, "%lld", (long long)V + 1);
            cr_assert_str_eq(meta(ds, "text.vocab_size"), num);
            snprintf(num, sizeof num, "%lld", (long long)V);
            cr_assert_str_eq(meta(ds, "text.unknown"), num);
            cr_assert_str_eq(meta(ds, "text.seq_len"), "7");
        }
        /* a random_split piece keeps its parent's metadata */
        em_dataset *parts[2];
        int64_t len = em_dataset_length(tr), lens[2] = {len - 1, 1};
        cr_assert_eq(em_random_split(tr, lens, 2, 3, parts), EM_OK);
        cr_assert_str_eq(meta(parts[1], "text.vocab"), vocab);
        em_dataset_free(parts[0]);
        em_dataset_free(parts[1]);
        em_dataset_free(tr);
        em_dataset_free(va);
    }

    /* unknown: error names the line and the character */
    cr_assert_null(open_text(p, "val_fraction", "0.25", "seq_len", "7", "unknown", "error",
                             NULL));
    em_assert_error(EM_ERR_FORMAT, "line 3: character '\xe2\x82\xac' (U+20AC) of the "
                    "validation part is not in the training part's vocabulary");
    /* without unseen characters there is no unknown id */
    em_dataset *all = open_text(p, "val_fraction", "0", "seq_len", "7", NULL);
    cr_assert(all, "%s", em_last_error());
    cr_assert_null(meta(all, "text.unknown"));
    cr_assert_eq(em_dataset_field(all, 0)->num_classes, V + 2); /* the whole text's chars */
    em_dataset_free(all);
    cleanup();
}

Test(text, bytes_and_gzip) {
    fresh_dir();
    const char *p = write_text("t.txt.gz", TEXT, sizeof TEXT - 1, true);
    int64_t n = (int64_t)sizeof TEXT - 1, n_val = (int64_t)(0.1 * (double)n);
    int64_t ref[256];
    for (int64_t i = 0; i < n; i++) ref[i] = (unsigned char)TEXT[i];
    em_dataset *tr = open_text(p, "level", "byte", "seq_len", "16", "stride", "5", NULL);
    cr_assert(tr, "%s", em_last_error());
    em_dataset *va = open_text(p, "level", "byte", "seq_len", "5", "split", "validation", NULL);
    cr_assert(va, "%s", em_last_error());
    check_windows(tr, ref, n - n_val, 16, 5);
    check_windows(va, ref + n - n_val, n_val, 5, 5);
    cr_assert_eq(em_dataset_field(tr, 1)->num_classes, 256);
    cr_assert_str_eq(meta(tr, "text.level"), "byte");
    cr_assert_str_eq(meta(tr, "text.vocab_size"), "256");
    cr_assert_null(meta(tr, "text.vocab"));
    em_dataset_free(tr);
    em_dataset_free(va);
    cleanup();
}

Test(text, bad_input) {
    fresh_dir();
    /* invalid UTF-8 on line 2: named, with the way out */
    static const char bad[] = "abc\nde\xff" "fgh\n";
    const char *p = write_text("bad.txt", bad, sizeof bad - 1, false);
    cr_assert_null(open_text(p, "seq_len", "2", NULL));
    em_assert_error(EM_ERR_FORMAT, "bad.txt line 2 (byte 6): not valid UTF-8; read it with "
                    "level: byte");
    em_dataset *b = open_text(p, "seq_len", "2", "level", "byte", NULL);
    cr_assert(b, "%s", em_last_error());
    em_dataset_free(b);
    p = write_text("nul.txt", "ab\0cd", 5, false);
    cr_assert_null(open_text(p, "seq_len", "2", NULL));
    em_assert_error(EM_ERR_FORMAT, "line 1 (byte 2): a NUL character");
    /* an overlong encoding of '/' is not UTF-8 */
    p = write_text("over.txt", "ab\xc0\xaf", 4, false);
    cr_assert_null(open_text(p, "seq_len", "1", NULL));
    em_assert_error(EM_ERR_FORMAT, "not valid UTF-8");
    /* too short for one window */
    p = write_text("short.txt", "abcdefghij", 10, false);
    cr_assert_null(open_text(p, "seq_len", "9", NULL)); /* 9 training tokens */
    em_assert_error(EM_ERR_FORMAT, "the training part of");
    em_assert_error(EM_ERR_FORMAT, "holds 9 tokens (of 10), fewer than seq_len + 1 = 10");
    cr_assert_null(open_text(p, "seq_len", "1", "split", "validation", NULL)); /* 1 token */
    em_assert_error(EM_ERR_FORMAT, "the validation part");
    cr_assert_null(open_text(p, "split", "validation", "val_fraction", "0", NULL));
    em_assert_error(EM_ERR_INVALID, "split 'validation' needs val_fraction > 0");
    cr_assert_null(open_text(p, "level", "word", NULL));
    em_assert_error(EM_ERR_INVALID, "option 'level' = 'word'");
    cr_assert_null(open_text(p, "seq_len", "0", NULL));
    em_assert_error(EM_ERR_INVALID, "option 'seq_len' = 0: out of range");
    p = write_text("empty.txt", "", 0, false);
    cr_assert_null(open_text(p, "seq_len", "1", NULL));
    em_assert_error(EM_ERR_FORMAT, "holds 0 tokens");
    cr_assert_null(open_text(tmpdir, NULL));
    em_assert_error(EM_ERR_IO, "is a directory");
    cleanup();
}

/* The Debian text of the examples, when installed: it opens, and its vocabulary is printable. */
Test(text, jargon_file) {
    const char *p = "/usr/share/doc/jargon-text/jargon.txt.gz";
    if (access(p, R_OK) != 0) cr_skip_test("jargon-text is not installed (%s)", p);
    em_dataset *ds = open_text(p, "seq_len", "128", NULL);
    cr_assert(ds, "%s", em_last_error());
    int64_t V = em_dataset_field(ds, 0)->num_classes;
    cr_assert(V > 60 && V < 400, "vocabulary of %lld", (long long)V);
    cr_assert_gt(em_dataset_length(ds), 10000);
    em_dataset_free(ds);
}

/*
 * text.c — dataset class "text": next-token prediction over a text file (raw or gzip), for
 * character-level language models (char-rnn, nanoGPT's shakespeare_char).
 *
 * The file becomes a sequence of tokens: its UTF-8 characters (level "char") or its bytes
 * (level "byte", ids 0..255). The last val_fraction of the tokens (floor(n * val_fraction))
 * is the validation part, the rest the training part: a split by position, the same at every
 * open, so that validation text is text the model never saw. The vocabulary of level "char"
 * is the training part's distinct characters sorted by code point, id = rank; characters of
 * the validation part that the training part lacks map to one extra last id ("unknown"),
 * present only when such characters exist (unknown: token), or are an error naming the line
 * (unknown: error). Every open reads the whole file, so the two splits agree on the ids.
 *
 * Item i of a part of n tokens t[0..n) is the window starting at s = i * stride:
 *     input  (seq_len) int64 = t[s .. s + seq_len)
 *     target (seq_len) int64 = t[s + 1 .. s + seq_len + 1)      (the next token of each)
 * for i in [0, (n - seq_len - 1) / stride]: every window lies inside its part. Both fields
 * are declared with num_classes = the vocabulary size.
 *
 * The dataset's metadata (em_dataset_metadata; ember-train saves it in the weights files it
 * writes, and generation reads it back from there):
 *     text.level       "char" or "byte"
 *     text.vocab_size  the number of ids, unknown included
 *     text.vocab       (char) the vocabulary's characters in id order, concatenated (UTF-8;
 *                      the unknown id has none)
 *     text.unknown     (char, when present) the unknown id
 *     text.seq_len     the window length
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/data.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/options.h"
#include "data.h"
#include "../common/utf8.h"

static const char *const text_levels[] = {"char", "byte", NULL};
static const char *const text_splits[] = {"train", "validation", NULL};
static const char *const text_unknown[] = {"token", "error", NULL};
static const em_option_spec text_options[] = {
    {.name = "path", .types = EM_OPT_STRING, .required = true,
     .help = "the text file (plain or gzip)"},
    {.name = "level", .types = EM_OPT_STRING, .def = {.s = "char"}, .choices = text_levels,
     .help = "tokens: UTF-8 characters (vocabulary from the training part) or bytes (256)"},
    {.name = "seq_len", .types = EM_OPT_INT, .def = {.i = 128}, .has_range = true, .min = 1,
     .max = 1 << 20, .help = "tokens per window (input and target)"},
    {.name = "stride", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true, .min = 0,
     .max = 1 << 20, .help = "tokens between window starts; 0: seq_len (windows do not overlap)"},
    {.name = "split", .types = EM_OPT_STRING, .def = {.s = "train"}, .choices = text_splits,
     .help = "the training part, or the validation part (the end of the text)"},
    {.name = "val_fraction", .types = EM_OPT_FLOAT, .def = {.f = 0.1}, .has_range = true,
     .min = 0, .max = 0.9, .help = "the share of the tokens, at the end, held out for validation"},
    {.name = "unknown", .types = EM_OPT_STRING, .def = {.s = "token"}, .choices = text_unknown,
     .help = "validation characters missing from the training part: one extra id, or an error"},
};

typedef struct text_state {
    em_field fields[2];  /* "input", "target" (read by the core after open) */
    int64_t *tok;        /* the part's tokens */
    int64_t n, seq_len, stride;
    char *vocab;         /* text.vocab (char level) */
    char num[3][24];     /* text.vocab_size, text.unknown, text.seq_len */
    const char *mkeys[5], *mvals[5];
} text_state;

static void text_close(void *state) {
    text_state *s = state;
    if (!s) return;
    free(s->tok);
    free(s->vocab);
    free(s);
}

static size_t utf8_encode(uint32_t c, char *out) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* The line (1-based) of byte offset `at` of buf. */
static long long line_of(const unsigned char *buf, size_t at) {
    long long line = 1;
    for (size_t i = 0; i < at; i++) line += buf[i] == '\n';
    return line;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The whole file into *buf (*len bytes), through zlib (plain or gzip). */
static em_status read_all(const char *path, unsigned char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    dt_file *f = dt_open("text", path);
    if (!f) return em_last_status();
    size_t cap = 1 << 16;
    unsigned char *b = malloc(cap);
    em_status st = b ? EM_OK : em_set_error(EM_ERR_NOMEM, "text: out of memory reading %s", path);
    while (st == EM_OK) {
        if (*len == cap) {
            unsigned char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(b, cap * 2);
            if (!nb) {
                st = em_set_error(EM_ERR_NOMEM, "text: out of memory reading %s (%zu bytes)",
                                  path, cap * 2);
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t got;
        st = dt_read_upto(f, b + *len, cap - *len, &got);
        if (st != EM_OK || got == 0) break;
        *len += got;
    }
    dt_close(f);
    if (st != EM_OK) {
        free(b);
        *len = 0;
        return st;
    }
    *buf = b;
    return EM_OK;
}

static em_status text_open(const em_options *o, em_dataset_layout *lay, void **out) {
    const char *path = em_options_string(o, "path");
    bool bytes = strcmp(em_options_string(o, "level"), "byte") == 0;
    bool val = strcmp(em_options_string(o, "split"), "validation") == 0;
    bool unk_error = strcmp(em_options_string(o, "unknown"), "error") == 0;
    double frac = em_options_float(o, "val_fraction");
    int64_t L = em_options_int(o, "seq_len"), stride = em_options_int(o, "stride");
    if (stride == 0) stride = L;
    if (val && frac <= 0)
        return em_set_error(EM_ERR_INVALID, "dataset 'text': split 'validation' needs "
                            "val_fraction > 0 (it is 0: the whole text is the training part)");
    unsigned char *buf;
    size_t nbytes;
    em_status st = read_all(path, &buf, &nbytes);
    if (st != EM_OK) return st;

    /* the tokens of the whole text: code points (char) or bytes */
    uint32_t *cps = malloc(sizeof(uint32_t) * (nbytes ? nbytes : 1));
    size_t *offs = bytes ? NULL : malloc(sizeof(size_t) * (nbytes ? nbytes : 1));
    text_state *s = calloc(1, sizeof *s);
    if (!cps || (!bytes && !offs) || !s) {
        st = em_set_error(EM_ERR_NOMEM, "text: out of memory for the tokens of %s", path);
        goto done;
    }
    int64_t n = 0;
    for (size_t i = 0; i < nbytes;) {
        if (bytes) {
            cps[n++] = buf[i++];
            continue;
        }
        uint32_t c;
        size_t k = em_utf8_decode(buf + i, nbytes - i, &c);
        if (!k || c == 0) {
            st = em_set_error(EM_ERR_FORMAT, "text: %s line %lld (byte %zu): %s; read it with "
                              "level: byte", path, line_of(buf, i), i,
                              k ? "a NUL character" : "not valid UTF-8");
            goto done;
        }
        offs[n] = i;
        cps[n++] = c;
        i += k;
    }
    int64_t n_val = (int64_t)(frac * (double)n), n_train = n - n_val;
    int64_t lo = val ? n_train : 0, len = val ? n_val : n_train;
    if (len < L + 1) {
        st = em_set_error(EM_ERR_FORMAT, "text: the %s part of %s holds %lld tokens (of %lld), "
                          "fewer than seq_len + 1 = %lld: no window fits", val ? "validation" :
                          "training", path, (long long)len, (long long)n, (long long)L + 1);
        goto done;
    }

    /* the vocabulary: the training part's distinct code points, sorted */
    int64_t V = 256, unk = -1;
    uint32_t *voc = NULL;
    if (!bytes) {
        voc = malloc(sizeof(uint32_t) * (size_t)(n_train ? n_train : 1));
        if (!voc) {
            st = em_set_error(EM_ERR_NOMEM, "text: out of memory for the vocabulary of %s", path);
            goto done;
        }
        memcpy(voc, cps, sizeof(uint32_t) * (size_t)n_train);
        qsort(voc, (size_t)n_train, sizeof *voc, cmp_u32);
        V = 0;
        for (int64_t i = 0; i < n_train; i++)
            if (V == 0 || voc[V - 1] != voc[i]) voc[V++] = voc[i];
        for (int64_t i = n_train; i < n && unk < 0; i++)
            if (!bsearch(&cps[i], voc, (size_t)V, sizeof *voc, cmp_u32)) {
                if (unk_error) {
                    char ch[5] = {0};
                    utf8_encode(cps[i], ch);
                    st = em_set_error(EM_ERR_FORMAT, "text: %s line %lld: character '%s' "
                                      "(U+%04X) of the validation part is not in the training "
                                      "part's vocabulary (unknown: token maps it to an extra id)",
                                      path, line_of(buf, offs[i]), cps[i] < 0x20 ? "?" : ch,
                                      (unsigned)cps[i]);
                    free(voc);
                    goto done;
                }
                unk = V;
            }
        s->vocab = malloc((size_t)V * 4 + 1);
        if (!s->vocab) {
            free(voc);
            st = em_set_error(EM_ERR_NOMEM, "text: out of memory for the vocabulary of %s", path);
            goto done;
        }
        size_t at = 0;
        for (int64_t i = 0; i < V; i++) at += utf8_encode(voc[i], s->vocab + at);
        s->vocab[at] = '\0';
    }
    s->tok = malloc(sizeof(int64_t) * (size_t)len);
    if (!s->tok) {
        free(voc);
        st = em_set_error(EM_ERR_NOMEM, "text: out of memory for the tokens of %s", path);
        goto done;
    }
    for (int64_t i = 0; i < len; i++) {
        uint32_t c = cps[lo + i];
        if (bytes) {
            s->tok[i] = c;
        } else {
            const uint32_t *hit = bsearch(&c, voc, (size_t)V, sizeof *voc, cmp_u32);
            s->tok[i] = hit ? hit - voc : unk;
        }
    }
    free(voc);
    s->n = len;
    s->seq_len = L;
    s->stride = stride;
    int64_t vocab_size = V + (unk >= 0);
    for (int k = 0; k < 2; k++)
        s->fields[k] = (em_field){.struct_size = sizeof(em_field), .name = k ? "target" : "input",
                                  .dtype = EM_I64, .ndim = 1, .shape = {L},
                                  .num_classes = vocab_size};
    snprintf(s->num[0], sizeof s->num[0], "%lld", (long long)vocab_size);
    snprintf(s->num[1], sizeof s->num[1], "%lld", (long long)unk);
    snprintf(s->num[2], sizeof s->num[2], "%lld", (long long)L);
    int m = 0;
    s->mkeys[m] = "text.level", s->mvals[m++] = bytes ? "byte" : "char";
    s->mkeys[m] = "text.vocab_size", s->mvals[m++] = s->num[0];
    if (!bytes) s->mkeys[m] = "text.vocab", s->mvals[m++] = s->vocab;
    if (unk >= 0) s->mkeys[m] = "text.unknown", s->mvals[m++] = s->num[1];
    s->mkeys[m] = "text.seq_len", s->mvals[m++] = s->num[2];
    lay->length = (len - L - 1) / stride + 1;
    lay->fields = s->fields;
    lay->n_fields = 2;
    if (lay->struct_size >= offsetof(em_dataset_layout, n_meta) + sizeof(int)) {
        lay->meta_keys = s->mkeys;
        lay->meta_values = s->mvals;
        lay->n_meta = m;
    }
    *out = s;
    s = NULL;
done:
    free(buf);
    free(cps);
    free(offs);
    text_close(s);
    return st;
}

static em_status text_read(void *state, const int64_t *idx, int64_t n, void *const *data,
                           int64_t *const *lengths) {
    (void)lengths; /* both fields are fixed */
    const text_state *s = state;
    size_t row = sizeof(int64_t) * (size_t)s->seq_len;
    for (int64_t j = 0; j < n; j++) {
        const int64_t *w = s->tok + idx[j] * s->stride;
        memcpy((char *)data[0] + (size_t)j * row, w, row);
        memcpy((char *)data[1] + (size_t)j * row, w + 1, row);
    }
    return EM_OK;
}

em_status dt_register_text(em_registry *r) {
    em_dataset_class_def d = {
        .struct_size = sizeof d, .name = "text",
        .description = "next-token windows of a text file (UTF-8 characters or bytes), "
                       "train/validation split by position",
        .options = text_options, .n_options = (int)(sizeof text_options / sizeof text_options[0]),
        .open_fields = text_open, .read_fields = text_read, .close = text_close};
    return em_dataset_class_register(r, &d);
}

/*
 * generate.c — ember-train --generate N: text from a trained language model.
 *
 * The vocabulary comes from the --init-weights file's metadata (the text.* entries that the
 * "text" dataset class gives and ember-train saves with the weights; docs/data.md). The
 * prompt is encoded with it (characters, or bytes for level "byte"); then, N times, the model
 * runs in eval mode without gradients on the last min(n, text.seq_len) tokens, (1, n) int64,
 * its (1, n, V) output's last position gives the next token's logits, and the token is drawn
 * from softmax(logits / temperature) restricted to the top_k largest (ties by the lower id),
 * with the uniform u_i = em_philox_uniform_f64(seed, 0, i) of step i: the first token whose
 * cumulative probability (in id order among those kept, in double) exceeds u. So the same
 * weights, prompt, seed, temperature and top-k give the same text on any machine whose model
 * outputs are the same. The prompt and the generated text go to stdout.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "ember/serialize.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "trainer.h"
#include "../plugins/common/utf8.h"

typedef struct vocab {
    bool bytes;
    int64_t size, unknown, seq_len;
    const char *text;     /* text.vocab (char level): the characters in id order */
    size_t *off, *len;    /* each id's bytes in text */
    uint32_t *cp;         /* each id's code point */
} vocab;

static bool meta_int(const em_metadata *m, const char *file, const char *key, int64_t lo,
                     int64_t *out, bool required) {
    const char *t = em_metadata_get(m, key);
    if (!t && !required) return true;
    char *end;
    long long v = t ? strtoll(t, &end, 10) : 0;
    if (!t || end == t || *end || v < lo) {
        fprintf(stderr, "ember-train: --generate: %s: metadata '%s' is %s%s%s; expected an "
                "integer >= %lld\n", file, key, t ? "'" : "missing", t ? t : "", t ? "'" : "",
                (long long)lo);
        return false;
    }
    *out = v;
    return true;
}

/* The vocabulary of the weights file's metadata m; false after a message. */
static bool vocab_read(const em_metadata *m, const char *file, vocab *v) {
    const char *level = em_metadata_get(m, "text.level");
    if (!level) {
        fprintf(stderr, "ember-train: --generate: %s has no vocabulary (metadata text.level, "
                "text.vocab): weights that ember-train saves from a 'text' dataset carry it\n",
                file);
        return false;
    }
    if (strcmp(level, "char") && strcmp(level, "byte")) {
        fprintf(stderr, "ember-train: --generate: %s: metadata text.level is '%s'; expected "
                "char or byte\n", file, level);
        return false;
    }
    v->bytes = !strcmp(level, "byte");
    v->unknown = -1;
    if (!meta_int(m, file, "text.vocab_size", 1, &v->size, true) ||
        !meta_int(m, file, "text.seq_len", 1, &v->seq_len, true) ||
        !meta_int(m, file, "text.unknown", 0, &v->unknown, false))
        return false;
    if (v->bytes) return true;
    v->text = em_metadata_get(m, "text.vocab");
    int64_t chars = v->size - (v->unknown >= 0);
    v->off = calloc((size_t)v->size, sizeof *v->off);
    v->len = calloc((size_t)v->size, sizeof *v->len);
    v->cp = calloc((size_t)v->size, sizeof *v->cp);
    if (!v->off || !v->len || !v->cp) {
        fprintf(stderr, "ember-train: --generate: out of memory for the vocabulary\n");
        return false;
    }
    size_t at = 0, n = v->text ? strlen(v->text) : 0;
    int64_t id = 0;
    while (v->text && at < n && id < chars) {
        size_t k = em_utf8_decode((const unsigned char *)v->text + at, n - at, &v->cp[id]);
        if (!k) break;
        v->off[id] = at;
        v->len[id++] = k;
        at += k;
    }
    if (!v->text || id != chars || at != n || (v->unknown >= 0 && v->unknown != chars)) {
        fprintf(stderr, "ember-train: --generate: %s: metadata text.vocab does not hold the "
                "%lld characters text.vocab_size and text.unknown say\n", file,
                (long long)chars);
        return false;
    }
    return true;
}

/* The prompt's token ids into ids (at most cap); their count, or -1 after a message. */
static int64_t encode(const vocab *v, const char *prompt, int64_t *ids, int64_t cap) {
    size_t n = strlen(prompt);
    int64_t k = 0;
    for (size_t at = 0; at < n && k < cap;) {
        if (v->bytes) {
            ids[k++] = (unsigned char)prompt[at++];
            continue;
        }
        uint32_t c;
        size_t len = em_utf8_decode((const unsigned char *)prompt + at, n - at, &c);
        if (!len) {
            fprintf(stderr, "ember-train: --prompt: byte %zu is not valid UTF-8\n", at);
            return -1;
        }
        int64_t id = v->unknown, chars = v->size - (v->unknown >= 0);
        for (int64_t j = 0; j < chars; j++)
            if (v->cp[j] == c) id = j;
        if (id < 0) {
            fprintf(stderr, "ember-train: --prompt: character '%.*s' (U+%04X) is not in the "
                    "model's vocabulary (%lld characters) and the vocabulary has no unknown "
                    "id\n", (int)len, prompt + at, (unsigned)c, (long long)chars);
            return -1;
        }
        ids[k++] = id;
        at += len;
    }
    return k;
}

static void put_token(const vocab *v, int64_t id) {
    if (v->bytes) putchar((int)id);
    else if (id == v->unknown) fputs("\xef\xbf\xbd", stdout); /* U+FFFD for the unknown id */
    else fwrite(v->text + v->off[id], 1, v->len[id], stdout);
}

/* The next token from logits[0..V) (double): temperature, top-k, the uniform u. */
static int64_t sample(double *p, int64_t V, double temperature, int64_t top_k, double u,
                      int64_t *order) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) mx = fmax(mx, p[i]);
    if (top_k > 0 && top_k < V) {
        /* the k-th largest logit; those below it are dropped (ties: lower ids kept first) */
        for (int64_t i = 0; i < V; i++) order[i] = i;
        for (int64_t i = 0; i < top_k; i++) { /* partial selection sort: k is small */
            int64_t best = i;
            for (int64_t j = i + 1; j < V; j++)
                if (p[order[j]] > p[order[best]]) best = j;
            int64_t t = order[i];
            order[i] = order[best];
            order[best] = t;
        }
        for (int64_t i = top_k; i < V; i++) p[order[i]] = -INFINITY;
    }
    double z = 0;
    for (int64_t i = 0; i < V; i++) z += p[i] = isinf(p[i]) && p[i] < 0 ? 0 : exp((p[i] - mx) / temperature);
    double c = 0, target = u * z;
    int64_t last = 0;
    for (int64_t i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        last = i;
        c += p[i];
        if (c > target) return i;
    }
    return last; /* rounding left u * z just past the sum */
}

int generate_text(run *r) {
    const char *file = r->s.init_weights;
    em_dict *d = NULL;
    em_metadata *m = NULL;
    if (em_load(file, NULL, &d, &m) != EM_OK) {
        fprintf(stderr, "ember-train: --generate: %s: %s\n", file, em_last_error());
        return EXIT_USAGE;
    }
    em_dict_free(d);
    vocab v = {0};
    int rc = EXIT_USAGE;
    int64_t N = r->s.generate, cap = (int64_t)strlen(r->s.prompt) + N;
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(cap > 0 ? cap : 1));
    double *p = NULL;
    int64_t *order = NULL;
    if (!ids || !vocab_read(m, file, &v)) goto done;
    if (r->s.top_k > v.size) {
        fprintf(stderr, "ember-train: --top-k %lld is larger than the vocabulary (%lld tokens)\n",
                (long long)r->s.top_k, (long long)v.size);
        goto done;
    }
    int64_t n = encode(&v, r->s.prompt, ids, cap);
    if (n < 0) goto done;
    if (n == 0) {
        fprintf(stderr, "ember-train: --generate needs a --prompt of at least one character\n");
        goto done;
    }
    p = malloc(sizeof(double) * (size_t)v.size);
    order = malloc(sizeof(int64_t) * (size_t)v.size);
    if (!p || !order) {
        fprintf(stderr, "ember-train: --generate: out of memory\n");
        goto done;
    }
    fputs(r->s.prompt, stdout);
    em_module_train(r->model, false);
    em_grad_mode_push(EM_GRAD_DISABLED);
    rc = EXIT_OK;
    for (int64_t i = 0; i < N && rc == EXIT_OK; i++) {
        int64_t ctx = n < v.seq_len ? n : v.seq_len;
        em_scope_begin();
        int64_t shape[2] = {1, ctx};
        em_tensor *x = em_from_data(ids + n - ctx, 2, shape, EM_I64, r->dev);
        em_tensor *out = x ? em_module_forward(r->model, x) : NULL;
        em_tensor *last = NULL;
        if (out && (em_tensor_ndim(out) != 3 || em_tensor_shape(out)[2] != v.size)) {
            char s[64];
            em_shape_str(em_tensor_ndim(out), em_tensor_shape(out), s, sizeof s);
            fprintf(stderr, "\nember-train: --generate: the model's output for (1, %lld) tokens "
                    "is %s; expected (1, %lld, %lld), logits over the vocabulary at each "
                    "position\n", (long long)ctx, s, (long long)ctx, (long long)v.size);
            rc = EXIT_USAGE;
        } else if (out) {
            em_tensor *row = em_select(out, 1, em_tensor_shape(out)[1] - 1); /* (1, V) */
            last = row ? em_contiguous(em_to_device(em_to_dtype(row, EM_F64), em_cpu())) : NULL;
        }
        if (rc == EXIT_OK && !last) {
            fprintf(stderr, "\nember-train: --generate: %s\n", em_last_error());
            rc = EXIT_TRAIN;
        }
        if (rc == EXIT_OK) {
            memcpy(p, em_tensor_data(last), sizeof(double) * (size_t)v.size);
            int64_t t = sample(p, v.size, r->s.temperature, r->s.top_k,
                               em_philox_uniform_f64(r->s.seed, 0, (uint64_t)i), order);
            ids[n++] = t;
            put_token(&v, t);
        }
        em_scope_end();
    }
    em_grad_mode_pop();
    putchar('\n');
    fflush(stdout);
done:
    free(ids);
    free(p);
    free(order);
    free(v.off);
    free(v.len);
    free(v.cp);
    em_metadata_free(m);
    return rc;
}

/*
 * test_trainer_text.c — ember-train on the "text" dataset class: a character-level language
 * model (Embedding -> Linear, a real model trained a few steps) whose loss is over every
 * token of (B, L, V) logits against (B, L) targets, the perplexity and the targets' unigram
 * perplexity it reports, and the vocabulary it saves in the weights file's metadata. The
 * references are plain loops here in double over the text and the saved weights.
 */
#include "common.h"

#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ember/serialize.h"

extern char **environ;

static char tmpdir[256];

static void setup(void) {
    em_test_setup();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ember-train-text-XXXXXX");
    cr_assert(mkdtemp(tmpdir));
}

static void teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
    em_test_teardown();
}

TestSuite(trainer_text, .init = setup, .fini = teardown, .timeout = 300);

static const char *path(const char *name) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static char *read_all(const char *name, size_t *len) {
    FILE *f = fopen(name, "rb");
    cr_assert(f, "%s", name);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, (size_t)n + 1);
    cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    if (len) *len = (size_t)n;
    return text;
}

/* Run the trainer with args (NULL-terminated); its stdout+stderr into *out (malloc'd). */
static int train(char **out, const char *const *args) {
    const char *argv[64] = {EM_TRAINER};
    int n = 1;
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    const char *log = path("out.txt");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, EM_TRAINER, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    *out = read_all(log, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void write_file(const char *name, const char *text) {
    FILE *f = fopen(path(name), "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

/* A text of words drawn by a fixed LCG from a small list, in lines of 8 words. */
static char *make_text(size_t words) {
    static const char *const list[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy",
                                       "dog", "hacker", "kludge", "foo", "bar", "baz", "grok",
                                       "cruft", "frob", "jargon", "file", "zero", "wizard"};
    char *t = malloc(words * 8 + 1);
    size_t at = 0;
    uint32_t s = 12345;
    for (size_t i = 0; i < words; i++) {
        s = s * 1664525u + 1013904223u;
        const char *w = list[(s >> 16) % (sizeof list / sizeof list[0])];
        at += (size_t)sprintf(t + at, "%s%c", w, i % 8 == 7 ? '\n' : ' ');
    }
    t[at] = '\0';
    return t;
}

/* The sorted distinct bytes of t[0..n) (an ASCII text) into voc; their count. */
static int vocab_of(const char *t, size_t n, char *voc) {
    int V = 0;
    for (int c = 1; c < 128; c++)
        if (memchr(t, c, n)) voc[V++] = (char)c;
    voc[V] = '\0';
    return V;
}

static double number_after(const char *out, const char *key) {
    const char *p = strstr(out, key);
    cr_assert(p, "'%s' not in:\n%s", key, out);
    return strtod(p + strlen(key), NULL);
}

Test(trainer_text, sequence_loss_perplexity_and_vocabulary) {
    char *text = make_text(3000);
    size_t n = strlen(text);
    write_file("t.txt", text);
    size_t n_train = n - (size_t)(0.1 * (double)n);
    char voc[128];
    int V = vocab_of(text, n_train, voc);
    char vall[128];
    cr_assert_eq(vocab_of(text, n, vall), V, "the validation part has no unseen characters");
    const int L = 16, E = 8;
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "model:\n"
             "  - Embedding: {num_embeddings: %d, embedding_dim: %d}\n"
             "  - Linear: {in_features: %d, out_features: %d}\n"
             "data:\n"
             "  class: text\n"
             "  options: {path: %s, seq_len: %d}\n"
             "  validation: {split: validation}\n"
             "optimizer: {class: Adam, lr: 0.02}\n"
             "loop: {epochs: 2, batch_size: 16, clip_grad_norm: 1.0}\n",
             V, E, E, V, path("t.txt"), L);
    write_file("lm.yaml", cfg);
    char *out;
    int rc = train(&out, (const char *[]){path("lm.yaml"), "--seed", "1", "--save-weights",
                                          path("w.safetensors"), "--metrics", path("m.csv"),
                                          NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    /* --metrics: the perplexities as the last columns, exp of the losses of the same row */
    char *csv = read_all(path("m.csv"), NULL);
    const char *hdr = "epoch,step,lr,train_loss,grad_norm,val_loss,val_accuracy,samples_per_s,"
                      "data_wait_pct,peak_memory,train_accuracy,test_loss,test_accuracy,"
                      "train_ppl,val_ppl,val_unigram_ppl\n";
    cr_assert(!strncmp(csv, hdr, strlen(hdr)), "%s", csv);
    for (const char *row = strchr(csv, '\n') + 1; *row; row = strchr(row, '\n') + 1) {
        double col[16];
        const char *q = row;
        for (int c = 0; c < 16; c++) {
            col[c] = strtod(q, NULL);
            q += strcspn(q, ",\n") + (c < 15);
        }
        cr_assert(fabs(col[13] - exp(col[3])) < 1e-6 * col[13], "train_ppl %g, loss %g", col[13],
                  col[3]);
        cr_assert(fabs(col[14] - exp(col[5])) < 1e-6 * col[14], "val_ppl %g, loss %g", col[14],
                  col[5]);
        cr_assert(col[15] > col[14], "unigram %g > val_ppl %g", col[15], col[14]);
    }
    free(csv);
    /* each epoch reports the perplexity, exp of the mean token loss */
    const char *e2 = strstr(out, "epoch 2/2: train loss ");
    cr_assert(e2, "%s", out);
    double tl = number_after(e2, "epoch 2/2: train loss "), tp = number_after(e2, " ppl ");
    cr_assert(fabs(tp - exp(tl)) < 1e-3 * tp + 2e-3, "ppl %g vs exp(loss %g)", tp, tl);
    free(out);

    /* the vocabulary is in the weights file's metadata */
    em_dict *sd;
    em_metadata *md;
    cr_assert_eq(em_load(path("w.safetensors"), NULL, &sd, &md), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(em_metadata_get(md, "text.level"), "char");
    cr_assert_str_eq(em_metadata_get(md, "text.vocab"), voc);
    char num[16];
    snprintf(num, sizeof num, "%d", V);
    cr_assert_str_eq(em_metadata_get(md, "text.vocab_size"), num);
    snprintf(num, sizeof num, "%d", L);
    cr_assert_str_eq(em_metadata_get(md, "text.seq_len"), num);
    cr_assert_null(em_metadata_get(md, "text.unknown"));

    /* --eval-only on those weights: the validation loss over every token, by plain loops */
    rc = train(&out, (const char *[]){path("lm.yaml"), "--eval-only", "--init-weights",
                                      path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    double loss = number_after(out, "validation: loss "), ppl = number_after(out, "perplexity ");
    double uni = number_after(out, "(unigram ");
    em_tensor *emb = em_dict_get(sd, "0.weight"), *w = em_dict_get(sd, "1.weight"),
              *b = em_dict_get(sd, "1.bias");
    cr_assert(emb && w && b);
    const float *Ed = em_tensor_data(emb), *Wd = em_tensor_data(w), *bd = em_tensor_data(b);
    int id[128];
    for (int k = 0; k < V; k++) id[(unsigned char)voc[k]] = k;
    const char *val = text + n_train;
    size_t nv = n - n_train;
    double sum = 0;
    int64_t tokens = 0, counts[128] = {0};
    for (size_t s = 0; s + (size_t)L + 1 <= nv; s += (size_t)L)
        for (int t = 0; t < L; t++) {
            int x = id[(unsigned char)val[s + (size_t)t]], y = id[(unsigned char)val[s + (size_t)t + 1]];
            double logit[128], mx = -INFINITY, z = 0;
            for (int v = 0; v < V; v++) {
                logit[v] = bd[v];
                for (int e = 0; e < E; e++) logit[v] += (double)Wd[v * E + e] * Ed[x * E + e];
                mx = fmax(mx, logit[v]);
            }
            for (int v = 0; v < V; v++) z += exp(logit[v] - mx);
            sum += -(logit[y] - mx - log(z));
            tokens++;
            counts[y]++;
        }
    double ref = sum / (double)tokens, h = 0;
    for (int v = 0; v < V; v++)
        if (counts[v]) h -= (double)counts[v] / (double)tokens * log((double)counts[v] / (double)tokens);
    cr_assert(fabs(loss - ref) < 1e-5 * ref + 1e-6, "validation loss %.9g, plain loops %.9g",
              loss, ref);
    cr_assert(fabs(ppl - exp(ref)) < 1e-4 * exp(ref), "perplexity %.9g, exp(loss) %.9g", ppl,
              exp(ref));
    cr_assert(fabs(uni - exp(h)) < 1e-4 * exp(h), "unigram perplexity %.9g, plain loops %.9g",
              uni, exp(h));
    cr_assert_lt(ppl, uni, "the trained model beats the unigram baseline");
    free(out);
    em_dict_free(sd);
    em_metadata_free(md);

    /* outputs that do not fit per-position targets are named */
    snprintf(cfg, sizeof cfg,
             "model:\n"
             "  - Embedding: {num_embeddings: %d, embedding_dim: %d}\n"
             "  - Flatten\n"
             "  - Linear: {in_features: %d, out_features: %d}\n"
             "data:\n"
             "  class: text\n"
             "  options: {path: %s, seq_len: %d}\n"
             "optimizer: {class: Adam}\n",
             V, E, E * L, V, path("t.txt"), L);
    write_file("bad.yaml", cfg);
    rc = train(&out, (const char *[]){path("bad.yaml"), NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "does not fit the sequence targets [2, 16]: per-position class "
                          "targets (B, L) need (B, L, classes) outputs"), "%s", out);
    free(out);
    free(text);
}

/* The line of out that starts with prefix (the generated text on stdout), as a new string. */
static char *line_from(const char *out, const char *prefix) {
    const char *p = out;
    while (p && strncmp(p, prefix, strlen(prefix))) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    cr_assert(p, "no line starting with '%s' in:\n%s", prefix, out);
    size_t n = strcspn(p, "\n");
    char *l = strndup(p, n);
    cr_assert(l);
    return l;
}

static char *generate(const char *const *extra, int want_rc) {
    const char *args[32] = {path("lm.yaml"), "--quiet", "--init-weights", path("w.safetensors")};
    int n = 4;
    for (; *extra; extra++) args[n++] = *extra;
    args[n] = NULL;
    char *out;
    int rc = train(&out, args);
    cr_assert_eq(rc, want_rc, "exit %d:\n%s", rc, out);
    return out;
}

/* Words with no letter in common, so a model that sees one character (Embedding -> Linear: a
 * bigram model) can learn to spell them. */
Test(trainer_text, generate_from_a_trained_model) {
    static const char *const words[] = {"the", "fox", "dump", "big", "ask", "wry"};
    char *text = malloc(3000 * 6);
    size_t at = 0;
    uint32_t s = 777;
    for (int i = 0; i < 3000; i++) {
        s = s * 1664525u + 1013904223u;
        at += (size_t)sprintf(text + at, "%s%s", i ? " " : "", words[(s >> 16) % 6]);
    }
    write_file("t.txt", text);
    char voc[128];
    int V = vocab_of(text, at - (size_t)(0.1 * (double)at), voc);
    const int E = 16;
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "model:\n"
             "  - Embedding: {num_embeddings: %d, embedding_dim: %d}\n"
             "  - Linear: {in_features: %d, out_features: %d}\n"
             "data:\n"
             "  class: text\n"
             "  options: {path: %s, seq_len: 32}\n"
             "  validation: {split: validation}\n"
             "optimizer: {class: Adam, lr: 0.05}\n"
             "loop: {epochs: 3, batch_size: 16, clip_grad_norm: 1.0}\n",
             V, E, E, V, path("t.txt"));
    write_file("lm.yaml", cfg);
    char *out;
    int rc = train(&out, (const char *[]){path("lm.yaml"), "--quiet", "--seed", "2",
                                          "--save-weights", path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    free(out);

    /* sampled text: >= 80% of its space-separated tokens are words of the training text */
    out = generate((const char *[]){"--generate", "400", "--prompt", "the ", "--seed", "5", NULL}, 0);
    char *a = line_from(out, "the ");
    free(out);
    cr_assert_eq(strlen(a), 404, "the prompt and 400 characters: '%s'", a);
    int tokens = 0, known = 0;
    char *copy = strdup(a), *save = NULL;
    for (char *t = strtok_r(copy, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        tokens++;
        for (int w = 0; w < 6; w++) known += !strcmp(t, words[w]);
    }
    free(copy);
    cr_assert_geq(known * 5, tokens * 4, "%d of %d tokens are words: '%s'", known, tokens, a);
    /* the same seed gives the same text; another seed another */
    out = generate((const char *[]){"--generate", "400", "--prompt", "the ", "--seed", "5", NULL}, 0);
    char *b = line_from(out, "the ");
    free(out);
    cr_assert_str_eq(a, b);
    free(b);
    out = generate((const char *[]){"--generate", "400", "--prompt", "the ", "--seed", "6", NULL}, 0);
    b = line_from(out, "the ");
    free(out);
    cr_assert_str_neq(a, b);
    free(b);
    free(a);

    /* --top-k 1 is greedy: the argmax of the bigram model by plain loops over the weights */
    em_dict *sd;
    cr_assert_eq(em_load(path("w.safetensors"), NULL, &sd, NULL), EM_OK, "%s", em_last_error());
    const float *Ed = em_tensor_data(em_dict_get(sd, "0.weight")),
                *Wd = em_tensor_data(em_dict_get(sd, "1.weight")),
                *bd = em_tensor_data(em_dict_get(sd, "1.bias"));
    char ref[64] = "wry";
    int id[128] = {0};
    for (int k = 0; k < V; k++) id[(unsigned char)voc[k]] = k;
    for (int i = 3; i < 43; i++) {
        int x = id[(unsigned char)ref[i - 1]], best = 0;
        double bestv = -INFINITY;
        for (int v = 0; v < V; v++) {
            double l = bd[v];
            for (int e = 0; e < E; e++) l += (double)Wd[v * E + e] * Ed[x * E + e];
            if (l > bestv) bestv = l, best = v;
        }
        ref[i] = voc[best];
        ref[i + 1] = '\0';
    }
    em_dict_free(sd);
    for (int seed = 1; seed <= 2; seed++) {
        char sd_[24];
        snprintf(sd_, sizeof sd_, "%d", seed);
        out = generate((const char *[]){"--generate", "40", "--prompt", "wry", "--top-k", "1",
                                        "--temperature", "0.7", "--seed", sd_, NULL}, 0);
        a = line_from(out, "wry");
        free(out);
        cr_assert_str_eq(a, ref, "greedy text '%s', plain loops '%s'", a, ref);
        free(a);
    }

    /* bad settings are usage errors that say why */
    struct { const char *args[8]; const char *msg; } bad[] = {
        {{"--generate", "5", "--prompt", "the", "--temperature", "0", NULL},
         "--temperature: '0' is not a finite number > 0"},
        {{"--generate", "5", "--prompt", "the", "--temperature", "nan", NULL},
         "--temperature: 'nan' is not a finite number > 0"},
        {{"--generate", "5", "--prompt", "the", "--top-k", "0", NULL},
         "--top-k: '0' is not an integer in [1, "},
        {{"--generate", "5", "--prompt", "the", "--top-k", "1000", NULL},
         "--top-k 1000 is larger than the vocabulary"},
        {{"--generate", "5", "--prompt", "Qt", NULL},
         "--prompt: character 'Q' (U+0051) is not in the model's vocabulary"},
        {{"--generate", "5", NULL}, "--generate needs --prompt TEXT"},
        {{"--generate", "5", "--prompt", "", NULL}, "needs a --prompt of at least one character"},
        {{"--top-k", "3", NULL}, "--prompt, --temperature and --top-k need --generate N"},
        {{"--generate", "0", "--prompt", "the", NULL}, "--generate: '0' is not an integer in [1, "},
        {{"--predict", path("p.csv"), NULL}, "this data has a class per position"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = generate(bad[i].args, 2);
        cr_assert(strstr(out, bad[i].msg), "'%s' not in:\n%s", bad[i].msg, out);
        free(out);
    }
    rc = train(&out, (const char *[]){path("lm.yaml"), "--generate", "5", "--prompt", "t", NULL});
    cr_assert_eq(rc, 2);
    cr_assert(strstr(out, "--generate needs --init-weights"), "%s", out);
    free(out);
    /* weights without the vocabulary */
    cr_assert_eq(em_load(path("w.safetensors"), NULL, &sd, NULL), EM_OK);
    cr_assert_eq(em_save(sd, path("plain.safetensors"), NULL, NULL), EM_OK);
    em_dict_free(sd);
    rc = train(&out, (const char *[]){path("lm.yaml"), "--init-weights", path("plain.safetensors"),
                                      "--generate", "5", "--prompt", "t", NULL});
    cr_assert_eq(rc, 2);
    cr_assert(strstr(out, "has no vocabulary (metadata text.level, text.vocab)"), "%s", out);
    free(out);
    free(text);
}

/* examples/charlm-mlp.yaml, charlm-lstm.yaml and charlm-transformer.yaml build, fit the Jargon
 * File and take a step (--dry-run). */
Test(trainer_text, charlm_example_dry_runs) {
    if (access("/usr/share/doc/jargon-text/jargon.txt.gz", R_OK) != 0)
        cr_skip_test("jargon-text is not installed (/usr/share/doc/jargon-text/jargon.txt.gz)");
    char *out;
    int rc = train(&out, (const char *[]){EM_TEST_SRCDIR "/examples/charlm-mlp.yaml", "--dry-run",
                                          NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "dry run ok: input [64, 128] -> output [64, 128, 155]"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){EM_TEST_SRCDIR "/examples/charlm-lstm.yaml", "--dry-run",
                                      NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "dry run ok: input [32, 64] -> output [32, 64, 155]"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){EM_TEST_SRCDIR "/examples/charlm-transformer.yaml",
                                      "--dry-run", NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "dry run ok: input [32, 64] -> output [32, 64, 155]"), "%s", out);
    free(out);
}

/* A model sized for another vocabulary is refused before the first step, naming the data's
 * vocabulary: an Embedding with fewer rows than the text has ids (which a zeros forward
 * would pass, failing only at the first batch holding a high id), and a last layer with
 * another number of outputs. */
Test(trainer_text, vocabulary_size_mismatch_named_before_training) {
    char *text = make_text(600);
    size_t n = strlen(text);
    write_file("t.txt", text);
    char voc[128];
    int V = vocab_of(text, n - (size_t)(0.1 * (double)n), voc);
    cr_assert_eq(vocab_of(text, n, voc), V, "the validation part has no unseen characters");
    const struct {
        int emb, out;
    } cases[] = {{V - 1, V}, {V, V - 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "model:\n"
                 "  - Embedding: {num_embeddings: %d, embedding_dim: 4}\n"
                 "  - Linear: {in_features: 4, out_features: %d}\n"
                 "data:\n"
                 "  class: text\n"
                 "  options: {path: %s, seq_len: 8}\n"
                 "  validation: {split: validation}\n"
                 "loop: {epochs: 1, batch_size: 4}\n",
                 cases[i].emb, cases[i].out, path("t.txt"));
        write_file("bad.yaml", cfg);
        char *out;
        int rc = train(&out, (const char *[]){path("bad.yaml"), NULL});
        cr_assert_eq(rc, 2, "case %zu: exit %d:\n%s", i, rc, out);
        char want[3][128];
        if (i == 0) {
            snprintf(want[0], sizeof want[0], "bad.yaml:2:5: Embedding: index %d is out of range "
                     "for a weight of V = %d rows", V - 1, V - 1);
            snprintf(want[1], sizeof want[1], "the data's field 'input' holds ids 0..%d (%d "
                     "classes: its vocabulary)", V - 1, V);
            snprintf(want[2], sizeof want[2], "needs num_embeddings >= %d", V);
        } else {
            snprintf(want[0], sizeof want[0], "the model gives %d outputs per position but the "
                     "data has %d classes", V - 3, V);
            snprintf(want[1], sizeof want[1], "its vocabulary");
            snprintf(want[2], sizeof want[2], "its last layer needs %d outputs", V);
        }
        for (int k = 0; k < 3; k++)
            cr_assert(strstr(out, want[k]), "case %zu: '%s' not in:\n%s", i, want[k], out);
        cr_assert(!strstr(out, "epoch 1/1"), "case %zu: it trained:\n%s", i, out);
        free(out);
    }
    free(text);
}

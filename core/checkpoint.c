/*
 * checkpoint.c — em_checkpoint_save / em_checkpoint_load: a model, an optimizer, a scheduler,
 * a DataLoader's position, the default generator, the loop state and the run's identity in one
 * safetensors file (the layout is documented in ember/checkpoint.h).
 *
 * Saving gathers the tensors (model.*, optim.*) into one dict of live tensors and the rest into
 * metadata, then hands both to em_save, which writes crash-safely. Loading reads the whole
 * file with em_load onto the model's device — through a plan that checks the model's keys and
 * shapes and the optimizer's tensors from the header before any tensor data is read (ck_plan)
 * — checks the format version, the parts asked for, every metadata entry it will need
 * (counts within EM_STEP_MAX, the loader's position within its epoch), the optimizer's and
 * scheduler's state whole (optim.c's load_prepare) and the model's keys and shapes before
 * restoring anything; then puts the parts in place. A file that fails any check changes
 * nothing.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "ember/data.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/error.h"
#include "ember/init.h"
#include "ember/module.h"
#include "ember/optim.h"
#include "ember/random.h"
#include "ember/serialize.h"
#include "ember/tensor.h"
#include "internal.h"
#include "ember/checkpoint.h"

#define CK_FORMAT_VERSION "1"

/* Metadata keys (documented in checkpoint.h). */
#define K_FORMAT "ember.checkpoint"
#define K_VERSION "ember.version"
#define K_PARTS "ember.parts"
#define K_OPTIM "optim.param_groups"
#define K_SCHED "sched.state"
#define K_SCALER "amp.scaler"
#define K_LOADER "loader.state"
#define K_RNG "rng.default"
#define K_LOOP "loop"
#define K_CONFIG "config"
#define K_RUN EM_CHECKPOINT_RUN_KEY

static const char *const reserved_prefixes[] = {"ember.", "model.", "optim.", "sched.",
                                                "loader.", "rng.", "amp."};

static bool reserved_key(const char *k) {
    if (!strcmp(k, K_LOOP) || !strcmp(k, K_CONFIG)) return true;
    for (size_t i = 0; i < sizeof reserved_prefixes / sizeof *reserved_prefixes; i++)
        if (!strncmp(k, reserved_prefixes[i], strlen(reserved_prefixes[i]))) return true;
    return false;
}

/* Re-set the current error with "checkpoint 'PATH': WHAT: " before its message (WHAT may be
 * NULL). Returns the status. */
static em_status prefix_error(const char *path, const char *what) {
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    em_status st = em_last_status();
    if (st == EM_OK) st = EM_ERR_INVALID;
    if (what)
        return em_set_error(st, "checkpoint '%s': %s: %s", path, what, msg);
    return em_set_error(st, "checkpoint '%s': %s", path, msg);
}

/* Compact JSON text of root (a new string, em__free), consuming root. NULL + EM_ERR_NOMEM. */
static char *json_take_text(json_t *root) {
    char *s = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(root);
    if (!s) {
        em_set_error(EM_ERR_NOMEM, "checkpoint: out of memory writing JSON");
        return NULL;
    }
    char *r = em__strdup(s, "checkpoint JSON");
    free(s);
    return r;
}

/* Set key to the JSON text of root (consumed). */
static em_status meta_set_json(em_metadata *m, const char *key, json_t *root) {
    char *text = json_take_text(root);
    if (!text) return em_last_status();
    em_status st = em_metadata_set(m, key, text);
    em__free(text);
    return st;
}

static json_t *u64_json(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return json_string(buf);
}

static json_t *metric_json(double v) {
    if (isnan(v)) return json_string("nan");
    if (isinf(v)) return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
}

/* Add every tensor of src to dst under prefix + key. */
static em_status add_prefixed(em_dict *dst, const em_dict *src, const char *prefix) {
    for (size_t i = 0; i < em_dict_len(src); i++) {
        const char *k = em_dict_key(src, i);
        size_t n = strlen(prefix) + strlen(k) + 1;
        char *key = em__malloc(n, "checkpoint key");
        if (!key) return EM_ERR_NOMEM;
        snprintf(key, n, "%s%s", prefix, k);
        em_status st = em_dict_set(dst, key, em_dict_value(src, i));
        em__free(key);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* ---- run identity ---------------------------------------------------------------------------- */

em_status em_checkpoint_run_id_new(char *buf, size_t cap) {
    if (!buf || cap < EM_CHECKPOINT_RUN_ID_MAX)
        return em_set_error(buf ? EM_ERR_RANGE : EM_ERR_INVALID, "checkpoint_run_id_new: %s",
                            buf ? "the buffer is smaller than EM_CHECKPOINT_RUN_ID_MAX"
                                : "buf is NULL");
    char host[40], when[32] = "00000000T000000";
    em__host_tag(host, sizeof host);
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y%m%dT%H%M%S", &tm);
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts; /* no entropy yet (early boot): the clock, mixed with the pid */
        clock_gettime(CLOCK_REALTIME, &ts);
        r = (uint32_t)ts.tv_nsec * 2654435761u ^ (uint32_t)getpid();
    }
    snprintf(buf, cap, "%s-%s-%ld-%08x", host, when, (long)getpid(), (unsigned)r);
    return EM_OK;
}

/* This process's run: the identity of saves whose em_checkpoint.run_id is empty. */
static char process_run[EM_CHECKPOINT_RUN_ID_MAX];
static pthread_once_t process_run_once = PTHREAD_ONCE_INIT;
static void process_run_make(void) {
    em_checkpoint_run_id_new(process_run, sizeof process_run);
}

/* ---- saving ------------------------------------------------------------------------------------ */

em_status em_checkpoint_save(const char *path, const em_checkpoint *ck_in,
                             const em_metadata *metadata) {
    if (!path || !ck_in)
        return em_set_error(EM_ERR_INVALID, "checkpoint_save: NULL %s", path ? "checkpoint" : "path");
    em_checkpoint full; /* the caller's by the prefix rule */
    em_status rd = EM__STRUCT_READ(em_checkpoint, &full, ck_in, offsetof(em_checkpoint, ext),
                                   "checkpoint_save");
    if (rd != EM_OK) return rd;
    const em_checkpoint *ck = &full;
    const char *run = ck->run_id;
    if (!memchr(ck->run_id, '\0', sizeof ck->run_id))
        return em_set_error(EM_ERR_INVALID, "checkpoint_save: '%s': run_id is not terminated "
                            "within its %d bytes", path, EM_CHECKPOINT_RUN_ID_MAX);
    if (!run[0]) {
        pthread_once(&process_run_once, process_run_make);
        run = process_run;
    } else if (!em__checkpoint_run_id_valid(run)) {
        return em_set_error(EM_ERR_INVALID, "checkpoint_save: '%s': run_id '%s' is not a run "
                            "identity (1 to %d characters of A-Z a-z 0-9 . _ : + @ -)", path,
                            run, EM_CHECKPOINT_RUN_ID_MAX - 1);
    }
    for (size_t i = 0; metadata && i < em_metadata_len(metadata); i++)
        if (reserved_key(em_metadata_key(metadata, i)))
            return em_set_error(EM_ERR_INVALID, "checkpoint_save: '%s': metadata key '%s' is "
                                "reserved for the checkpoint's own entries (\"loop\", \"config\", "
                                "\"ember.*\", \"model.*\", \"optim.*\", \"sched.*\", \"loader.*\", "
                                "\"amp.*\", \"rng.*\"); rename it", path, em_metadata_key(metadata, i));

    em_status st = EM_OK;
    em_dict *all = em_dict_new(), *sd = NULL, *ot = NULL;
    em_metadata *m = em_metadata_new();
    char *groups = NULL, *sched = NULL, *scaler = NULL;
    char parts[80] = "";
    if (!all || !m) {
        st = em_set_error(EM_ERR_NOMEM, "checkpoint_save: out of memory");
        goto done;
    }
    if (ck->model) {
        if (!(sd = em_module_state_dict(ck->model)) ||
            (st = add_prefixed(all, sd, "model.")) != EM_OK) {
            st = prefix_error(path, "model");
            goto done;
        }
        strcat(parts, "model");
    }
    if (ck->optimizer) {
        if ((st = em_optimizer_state_dict(ck->optimizer, &ot, &groups)) != EM_OK ||
            (st = add_prefixed(all, ot, "optim.")) != EM_OK) {
            st = prefix_error(path, "optimizer");
            goto done;
        }
        strcat(parts, *parts ? ",optimizer" : "optimizer");
    }
    if (ck->scheduler) {
        if ((st = em_scheduler_state_dict(ck->scheduler, &sched)) != EM_OK) {
            st = prefix_error(path, "scheduler");
            goto done;
        }
        strcat(parts, *parts ? ",scheduler" : "scheduler");
    }
    if (ck->loader) strcat(parts, *parts ? ",loader" : "loader");
    if (ck->scaler) {
        if ((st = em_grad_scaler_state_dict(ck->scaler, &scaler)) != EM_OK) {
            st = prefix_error(path, "scaler");
            goto done;
        }
        strcat(parts, *parts ? ",scaler" : "scaler");
    }

    if ((st = em_metadata_set(m, K_FORMAT, CK_FORMAT_VERSION)) != EM_OK ||
        (st = em_metadata_set(m, K_VERSION, em_version())) != EM_OK ||
        (st = em_metadata_set(m, K_PARTS, parts)) != EM_OK ||
        (st = em_metadata_set(m, K_RUN, run)) != EM_OK)
        goto done;
    if (groups && (st = em_metadata_set(m, K_OPTIM, groups)) != EM_OK) goto done;
    if (sched && (st = em_metadata_set(m, K_SCHED, sched)) != EM_OK) goto done;
    if (scaler && (st = em_metadata_set(m, K_SCALER, scaler)) != EM_OK) goto done;
    if (ck->loader) {
        em_loader_state ls = em_loader_get_state(ck->loader);
        json_t *j = json_object();
        if (j) {
            json_object_set_new(j, "seed", u64_json(ls.seed));
            json_object_set_new(j, "epoch", json_integer(ls.epoch));
            json_object_set_new(j, "batch", json_integer(ls.batch));
        }
        if ((st = meta_set_json(m, K_LOADER, j)) != EM_OK) goto done;
    }
    em_rng_state rs = em_generator_get_state(NULL);
    json_t *jr = json_object();
    if (jr) {
        json_object_set_new(jr, "seed", u64_json(rs.seed));
        json_object_set_new(jr, "offset", u64_json(rs.offset));
    }
    if ((st = meta_set_json(m, K_RNG, jr)) != EM_OK) goto done;
    json_t *jl = json_object();
    if (jl) {
        json_object_set_new(jl, "epoch", json_integer(ck->epoch));
        json_object_set_new(jl, "step", json_integer(ck->step));
        json_object_set_new(jl, "best_metric", metric_json(ck->best_metric));
    }
    if ((st = meta_set_json(m, K_LOOP, jl)) != EM_OK) goto done;
    if (ck->config && (st = em_metadata_set(m, K_CONFIG, ck->config)) != EM_OK) {
        st = prefix_error(path, "config");
        goto done;
    }
    for (size_t i = 0; metadata && i < em_metadata_len(metadata); i++)
        if ((st = em_metadata_set(m, em_metadata_key(metadata, i),
                                  em_metadata_value(metadata, i))) != EM_OK)
            goto done;
    st = em_save(all, path, m, NULL);
done:
    em_dict_free(all);
    em_dict_free(sd);
    em_dict_free(ot);
    em_metadata_free(m);
    em__free(groups);
    em__free(sched);
    em__free(scaler);
    return st;
}

/* ---- loading ------------------------------------------------------------------------------- */

/* Whether the comma-separated list holds name. */
static bool list_has(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* A required metadata entry parsed as a JSON object; NULL with EM_ERR_FORMAT naming the key. */
static json_t *meta_json(const em_metadata *m, const char *key, const char *path) {
    const char *v = em_metadata_get(m, key);
    if (!v) {
        em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is missing", path, key);
        return NULL;
    }
    json_error_t jerr;
    json_t *j = json_loads(v, 0, &jerr);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        if (!j)
            em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is not valid JSON "
                         "(column %d: %s)", path, key, jerr.column, jerr.text);
        else
            em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is not a JSON "
                         "object", path, key);
        return NULL;
    }
    return j;
}

/* Field `name` of j (from metadata `key`) as an unsigned 64-bit decimal string. */
static bool field_u64(const json_t *j, const char *name, uint64_t *out, const char *path,
                      const char *key) {
    const json_t *v = json_object_get(j, name);
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    char *end = NULL;
    errno = 0;
    if (s && *s >= '0' && *s <= '9') *out = strtoull(s, &end, 10);
    if (!s || !end || *end || errno) {
        em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s': \"%s\" is %s; "
                     "expected an unsigned 64-bit integer as a decimal string", path, key, name,
                     v ? "malformed" : "missing");
        return false;
    }
    return true;
}

/* Field `name` of j (from metadata `key`) as an integer in [lo, hi]. */
static bool field_i64(const json_t *j, const char *name, int64_t lo, int64_t hi, int64_t *out,
                      const char *path, const char *key) {
    const json_t *v = json_object_get(j, name);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        char what[40];
        if (json_is_integer(v))
            snprintf(what, sizeof what, "%lld", (long long)json_integer_value(v));
        else
            snprintf(what, sizeof what, "%s", v ? "malformed" : "missing");
        em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s': \"%s\" is %s; "
                     "expected an integer in [%lld, %lld]", path, key, name, what, (long long)lo,
                     (long long)hi);
        return false;
    }
    *out = (int64_t)json_integer_value(v);
    return true;
}

/* What the file holds, for the "lacks" message. */
static void describe_parts(const char *parts, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%sthe default generator, the loop state", parts, *parts ? ", " : "");
}

/* What em_checkpoint_load reads, decided from the file's header before any tensor data is
 * read (em__load_planned): the parts not asked for are not read; the model's keys and shapes
 * must match the model (the strict rule, every problem listed) and each optimizer tensor must
 * name a parameter and have its shape (or be a 0-dim counter), so a file cannot make the
 * process commit memory that the model and the optimizer do not justify. A file that is not
 * a checkpoint of this format, or lacks a part asked for, is read no further: the checks
 * after the header say what is wrong. */
typedef struct ck_plan {
    const char *path;
    const em_dict *target;      /* the model's state dict, or NULL */
    const em_tensor **params;   /* the optimizer's parameters by global index, or NULL */
    int n_params;
} ck_plan;

static em_status ck_plan_optim(const ck_plan *p, const em__st_entry *e) {
    const char *k = e->key + 6; /* state.<index>.<name> */
    char *end = NULL;
    long idx = -1;
    if (!strncmp(k, "state.", 6) && k[6] >= '0' && k[6] <= '9') idx = strtol(k + 6, &end, 10);
    if (idx < 0 || *end != '.' || !end[1] || strchr(end + 1, '.'))
        return em_set_error(EM_ERR_FORMAT, "checkpoint '%s': optimizer tensor '%s' is not of the "
                            "form optim.state.<index>.<name>", p->path, e->key);
    if (idx >= p->n_params || !p->params[idx])
        return em_set_error(EM_ERR_FORMAT, "checkpoint '%s': optimizer tensor '%s' names "
                            "parameter %ld but the optimizer has %d", p->path, e->key, idx,
                            p->n_params);
    const em_tensor *w = p->params[idx];
    int nd = em_tensor_ndim(w);
    if (e->ndim > 0 && (e->ndim != nd || memcmp(e->shape, em_tensor_shape(w),
                                                sizeof(int64_t) * (size_t)nd) != 0)) {
        char a[128], b[128];
        return em_set_error(EM_ERR_SHAPE, "checkpoint '%s': optimizer tensor '%s' has shape %s "
                            "but parameter %ld has shape %s", p->path, e->key,
                            em__shape_str(e->ndim, e->shape, a, sizeof a), idx,
                            em__shape_str(nd, em_tensor_shape(w), b, sizeof b));
    }
    return EM_OK;
}

static em_status ck_plan_check(void *user, const em__st_entry *e, size_t n,
                               const em_metadata *meta, bool *load) {
    const ck_plan *p = user;
    const char *fmt = em_metadata_get(meta, K_FORMAT), *parts = em_metadata_get(meta, K_PARTS);
    if (!fmt || strcmp(fmt, CK_FORMAT_VERSION) != 0 || !parts ||
        (p->target && !list_has(parts, "model")) || (p->params && !list_has(parts, "optimizer"))) {
        for (size_t i = 0; i < n; i++) load[i] = false;
        return EM_OK;
    }
    for (size_t i = 0; i < n; i++) {
        bool model = !strncmp(e[i].key, "model.", 6) && e[i].key[6];
        bool optim = !strncmp(e[i].key, "optim.", 6) && e[i].key[6];
        if (!model && !optim)
            return em_set_error(EM_ERR_FORMAT, "checkpoint '%s': tensor '%s' is not part of a "
                                "checkpoint (its tensors are model.* and optim.*)", p->path,
                                e[i].key);
        load[i] = model ? p->target != NULL : p->params != NULL;
        em_status st = optim && p->params ? ck_plan_optim(p, &e[i]) : EM_OK;
        if (st != EM_OK) return st;
    }
    if (!p->target) return EM_OK;
    em_load_report *rep = NULL;
    em_status st = em__load_report_entries(p->target, e, n, "model.", &rep);
    if (st == EM_OK && (em_load_report_count(rep, EM_LOAD_MISSING) ||
                        em_load_report_count(rep, EM_LOAD_UNEXPECTED) ||
                        em_load_report_count(rep, EM_LOAD_SHAPE_MISMATCH))) {
        char text[900];
        em_load_report_format(rep, text, sizeof text);
        st = em_set_error(EM_ERR_INVALID, "checkpoint '%s': model: %s", p->path, text);
    }
    em_load_report_free(rep);
    return st;
}

/* em_checkpoint_load on the core's own full copies of the caller's structs. */
static em_status checkpoint_load(const char *path, em_checkpoint *ck,
                                 const em_checkpoint_load_options *opt) {
    ck->config_out = NULL;
    if (opt && opt->metadata_out) *opt->metadata_out = NULL;

    em_status st = EM_OK;
    em_dict *file = NULL, *target = NULL, *model_sd = NULL, *optim_sd = NULL;
    em_metadata *meta = NULL;
    em_load_report *rep = NULL;
    json_t *jloader = NULL, *jrng = NULL, *jloop = NULL;
    char *config = NULL;
    em__optim_load *optim_load = NULL;
    em__sched_load *sched_load = NULL;

    /* map_location: read onto the model's device. */
    em_load_options lo = EM_LOAD_OPTIONS_INIT;
    lo.device = em_cpu();
    if (ck->model) {
        if (!(target = em_module_state_dict(ck->model))) return prefix_error(path, "model");
        if (em_dict_len(target)) lo.device = em_tensor_device(em_dict_value(target, 0));
    }
    ck_plan plan = {.path = path, .target = target};
    if (ck->optimizer) {
        plan.n_params = em_optimizer_param_total(ck->optimizer);
        if (!(plan.params = em__calloc((size_t)plan.n_params + 1, sizeof *plan.params,
                                       "checkpoint"))) {
            st = em_set_error(EM_ERR_NOMEM, "checkpoint_load: out of memory");
            goto done;
        }
        for (int g = 0; g < em_optimizer_group_count(ck->optimizer); g++)
            for (int i = 0, idx; i < em_optimizer_param_count(ck->optimizer, g); i++) {
                const em_tensor *w = em_optimizer_param(ck->optimizer, g, i, &idx, NULL);
                if (idx >= 0 && idx < plan.n_params) plan.params[idx] = w;
            }
    }
    st = em__load_planned(path, &lo, ck_plan_check, &plan, &file, &meta);
    em__free(plan.params);
    if (st != EM_OK) {
        if (!strstr(em_last_error(), "checkpoint '")) st = prefix_error(path, NULL);
        goto done;
    }

    /* The kind and version. */
    const char *fmt = em_metadata_get(meta, K_FORMAT);
    if (!fmt) {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': not an Ember checkpoint: its metadata "
                          "has no '%s' entry (a plain safetensors file: read it with em_load, "
                          "or a model's weights with em_module_load_state_dict)", path, K_FORMAT);
        goto done;
    }
    if (strcmp(fmt, CK_FORMAT_VERSION) != 0) {
        const char *by = em_metadata_get(meta, K_VERSION);
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': format version '%s' (written by Ember "
                          "%s) is not one this Ember (%s) reads (%s)", path, fmt,
                          by ? by : "of an unknown version", em_version(), CK_FORMAT_VERSION);
        goto done;
    }
    const char *parts = em_metadata_get(meta, K_PARTS);
    if (!parts) {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is missing", path,
                          K_PARTS);
        goto done;
    }

    /* The parts asked for must all be there. */
    char lacks[160] = "";
    const struct { const void *obj; const char *name; } want[] = {
        {ck->model, "model"}, {ck->optimizer, "optimizer"}, {ck->scheduler, "scheduler"},
        {ck->loader, "loader"}, {ck->scaler, "scaler"}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (want[i].obj && !list_has(parts, want[i].name)) {
            size_t len = strlen(lacks);
            snprintf(lacks + len, sizeof lacks - len, "%s%s", len ? ", " : "", want[i].name);
        }
    if (*lacks) {
        char holds[200];
        describe_parts(parts, holds, sizeof holds);
        st = em_set_error(EM_ERR_NOTFOUND, "checkpoint '%s' lacks the state asked for: %s (it "
                          "holds: %s)", path, lacks, holds);
        goto done;
    }

    /* Split the tensors; anything else is not ours. */
    if (!(model_sd = em_dict_new()) || !(optim_sd = em_dict_new())) {
        st = em_set_error(EM_ERR_NOMEM, "checkpoint_load: out of memory");
        goto done;
    }
    for (size_t i = 0; i < em_dict_len(file); i++) {
        const char *k = em_dict_key(file, i);
        if (!strncmp(k, "model.", 6) && k[6]) {
            st = em_dict_set(model_sd, k + 6, em_dict_value(file, i));
        } else if (!strncmp(k, "optim.", 6) && k[6]) {
            st = em_dict_set(optim_sd, k + 6, em_dict_value(file, i));
        } else {
            st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': tensor '%s' is not part of a "
                              "checkpoint (its tensors are model.* and optim.*)", path, k);
        }
        if (st != EM_OK) goto done;
    }

    /* Parse every metadata entry about to be used. */
    em_loader_state ls = {0, 0, 0};
    em_rng_state rs = {0, 0};
    int64_t epoch = 0, step = 0;
    double best = NAN;
    if (ck->optimizer && !em_metadata_get(meta, K_OPTIM)) {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is missing", path,
                          K_OPTIM);
        goto done;
    }
    if (ck->scheduler && !em_metadata_get(meta, K_SCHED)) {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is missing", path,
                          K_SCHED);
        goto done;
    }
    if (ck->scaler && !em_metadata_get(meta, K_SCALER)) {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is missing", path,
                          K_SCALER);
        goto done;
    }
    /* The scaler's state is checked on a copy before anything is restored. */
    if (ck->scaler) {
        em_grad_scaler_options so = EM_GRAD_SCALER_OPTIONS_INIT;
        em_grad_scaler *scaler_copy = em_grad_scaler_new(&so);
        if (!scaler_copy ||
            em_grad_scaler_load_state_dict(scaler_copy, em_metadata_get(meta, K_SCALER)) != EM_OK) {
            em_grad_scaler_free(scaler_copy);
            st = prefix_error(path, "scaler ('" K_SCALER "')");
            goto done;
        }
        em_grad_scaler_free(scaler_copy);
    }
    if (ck->loader) {
        /* the position must be one of this loader's: a batch past the end would train
         * nothing, a negative one fail mid-epoch */
        if (!(jloader = meta_json(meta, K_LOADER, path)) ||
            !field_u64(jloader, "seed", &ls.seed, path, K_LOADER) ||
            !field_i64(jloader, "epoch", 0, EM_STEP_MAX, &ls.epoch, path, K_LOADER) ||
            !field_i64(jloader, "batch", 0, em_loader_num_batches(ck->loader), &ls.batch, path,
                       K_LOADER)) {
            st = em_last_status();
            goto done;
        }
    }
    /* counts the caller goes on counting from: bounded far below INT64_MAX */
    if (!(jrng = meta_json(meta, K_RNG, path)) ||
        !field_u64(jrng, "seed", &rs.seed, path, K_RNG) ||
        !field_u64(jrng, "offset", &rs.offset, path, K_RNG) ||
        !(jloop = meta_json(meta, K_LOOP, path)) ||
        !field_i64(jloop, "epoch", 0, EM_STEP_MAX, &epoch, path, K_LOOP) ||
        !field_i64(jloop, "step", 0, EM_STEP_MAX, &step, path, K_LOOP)) {
        st = em_last_status();
        goto done;
    }
    const json_t *jb = json_object_get(jloop, "best_metric");
    if (json_is_number(jb)) {
        best = json_number_value(jb);
    } else if (json_is_string(jb) && (!strcmp(json_string_value(jb), "nan") ||
                                      !strcmp(json_string_value(jb), "inf") ||
                                      !strcmp(json_string_value(jb), "-inf"))) {
        best = strtod(json_string_value(jb), NULL);
    } else {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s': \"best_metric\" is "
                          "%s; expected a number, \"inf\", \"-inf\" or \"nan\"", path, K_LOOP,
                          jb ? "malformed" : "missing");
        goto done;
    }
    const char *run = em_metadata_get(meta, K_RUN);
    if (run && !em__checkpoint_run_id_valid(run)) {
        st = em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata entry '%s' is not a run "
                          "identity (1 to %d characters of A-Z a-z 0-9 . _ : + @ -)", path, K_RUN,
                          EM_CHECKPOINT_RUN_ID_MAX - 1);
        goto done;
    }
    const char *cfg = em_metadata_get(meta, K_CONFIG);
    if (cfg && !(config = em__strdup(cfg, "checkpoint config"))) {
        st = EM_ERR_NOMEM;
        goto done;
    }

    /* Check the optimizer's and the scheduler's state whole, then the model's (checked whole
     * before its copy), and only then put anything in place: a bad part leaves every object
     * as it was. */
    if (ck->optimizer &&
        (st = em__optimizer_load_prepare(ck->optimizer, optim_sd, em_metadata_get(meta, K_OPTIM),
                                         &optim_load)) != EM_OK) {
        st = prefix_error(path, "optimizer ('" K_OPTIM "')");
        goto done;
    }
    if (ck->scheduler &&
        (st = em__scheduler_load_prepare(ck->scheduler, em_metadata_get(meta, K_SCHED),
                                         &sched_load)) != EM_OK) {
        st = prefix_error(path, "scheduler ('" K_SCHED "')");
        goto done;
    }
    if (ck->model) {
        st = em_dict_load_into(target, model_sd, true, &rep);
        if (st != EM_OK) {
            if (rep) {
                char text[900];
                em_load_report_format(rep, text, sizeof text);
                st = em_set_error(EM_ERR_INVALID, "checkpoint '%s': model: %s", path, text);
            } else {
                st = prefix_error(path, "model");
            }
            goto done;
        }
    }
    if (optim_load) em__optimizer_load_commit(ck->optimizer, optim_load);
    if (sched_load) em__scheduler_load_commit(ck->scheduler, sched_load);
    if (ck->scaler) /* checked above on a copy */
        (void)em_grad_scaler_load_state_dict(ck->scaler, em_metadata_get(meta, K_SCALER));
    optim_load = NULL;
    sched_load = NULL;
    if (ck->loader && (st = em_loader_set_state(ck->loader, ls)) != EM_OK) {
        /* checked above: only the loader's own failure can bring this */
        st = prefix_error(path, "loader ('" K_LOADER "')");
        goto done;
    }
    em_generator_set_state(NULL, rs);
    ck->epoch = epoch;
    ck->step = step;
    ck->best_metric = best;
    snprintf(ck->run_id, sizeof ck->run_id, "%s", run ? run : "");
    ck->config_out = config;
    config = NULL;
    if (opt && opt->metadata_out) {
        *opt->metadata_out = meta;
        meta = NULL;
    }
done:
    if (ck->optimizer) em__optimizer_load_discard(ck->optimizer, optim_load);
    if (ck->scheduler) em__scheduler_load_discard(ck->scheduler, sched_load);
    em_load_report_free(rep);
    json_decref(jloader);
    json_decref(jrng);
    json_decref(jloop);
    em__free(config);
    em_dict_free(model_sd);
    em_dict_free(optim_sd);
    em_dict_free(target);
    em_dict_free(file);
    em_metadata_free(meta);
    return st;
}

em_status em_checkpoint_load(const char *path, em_checkpoint *ck_in,
                             const em_checkpoint_load_options *opt_in) {
    if (!path || !ck_in)
        return em_set_error(EM_ERR_INVALID, "checkpoint_load: NULL %s", path ? "checkpoint" : "path");
    /* The prefix rule: read the caller's structs as far as their struct_size goes, load into
     * full copies, and write back only what the caller's checkpoint covers. */
    em_checkpoint ck;
    em_checkpoint_load_options opt;
    em_status st = EM__STRUCT_READ(em_checkpoint, &ck, ck_in, offsetof(em_checkpoint, ext),
                                   "checkpoint_load");
    if (st == EM_OK && opt_in)
        st = EM__STRUCT_READ(em_checkpoint_load_options, &opt, opt_in,
                             EM__SIZE_THROUGH(em_checkpoint_load_options, metadata_out),
                             "checkpoint_load");
    if (st != EM_OK) return st;
    st = checkpoint_load(path, &ck, opt_in ? &opt : NULL);
    EM__STRUCT_WRITE(em_checkpoint, ck_in, &ck, offsetof(em_checkpoint, ext), "checkpoint_load");
    return st;
}

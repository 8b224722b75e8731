/*
 * ddp.c — data-parallel modules (ember/ddp.h): the wrap-time checks and broadcasts, gradient
 * buckets filled by post-accumulation hooks and reduced in a fixed order while backward runs,
 * no_sync, unused parameters, buffers from rank 0, and the SyncBatchNorm conversion.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/autograd.h"
#include "ember/comm.h"
#include "ember/ddp.h"
#include "ember/dict.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

typedef struct ddp_param {
    em_ddp *d;
    em_tensor *p;      /* retained */
    char *name;
    int bucket;
    int64_t offset, numel;
    bool ready;
} ddp_param;

typedef struct bucket {
    em_tensor *flat;   /* (numel) the gradients of its parameters, in the parameters' order */
    int *members;      /* indices into d->params */
    int n, n_ready;
    int64_t numel;
    em_comm_work *work;
    bool launched, done;
    double t_launch, t_done;
} bucket;

struct em_ddp {
    em_module *m;
    em_comm *c;
    em_ddp_options o;
    ddp_param *params;
    int n_params;
    bucket *buckets;
    int n_buckets;
    int next_launch;   /* buckets before it are launched */
    bool no_sync;
    bool dirty;        /* a hook fired since the last wait */
    double t0;         /* the last forward's start */
    double wait_begin, wait_blocked;
};

static _Thread_local em_comm *current_comm;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

em_comm *em_ddp_current_comm(void) { return current_comm; }
em_module *em_ddp_module(const em_ddp *d) { return d ? d->m : NULL; }
em_comm *em_ddp_comm(const em_ddp *d) { return d ? d->c : NULL; }

/* ---- checks at wrap ---------------------------------------------------------------------- */

/* "name shape dtype" lines for every parameter, then every persistent buffer. */
static char *describe(const em_dict *sd, const em_dict *params, size_t *len) {
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = '\0';
    for (int pass = 0; pass < 2; pass++) {
        const em_dict *dd = pass ? sd : params;
        for (size_t i = 0; i < em_dict_len(dd); i++) {
            const char *k = em_dict_key(dd, i);
            if (pass && em_dict_has(params, k)) continue;
            const em_tensor *t = em_dict_value(dd, i);
            char shape[160], line[512];
            em_shape_str(em_tensor_ndim(t), em_tensor_shape(t), shape, sizeof shape);
            int l = snprintf(line, sizeof line, "%s '%s' %s %s\n", pass ? "buffer" : "parameter",
                             k, shape, em_dtype_name(em_tensor_dtype(t)));
            if (l < 0) l = 0;
            if (n + (size_t)l + 1 > cap) {
                while (n + (size_t)l + 1 > cap) cap *= 2;
                char *ns = realloc(s, cap);
                if (!ns) {
                    free(s);
                    return NULL;
                }
                s = ns;
            }
            memcpy(s + n, line, (size_t)l + 1);
            n += (size_t)l;
        }
    }
    *len = n;
    return s;
}

/* The i-th line of s (without its newline) into out, or "" past the end. */
static void line_at(const char *s, size_t len, size_t i, char *out, size_t cap) {
    const char *p = s, *end = s + len;
    for (; i && p < end; i--) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl + 1 : end;
    }
    const char *nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
    size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
    if (l >= cap) l = cap - 1;
    memcpy(out, p, l);
    out[l] = '\0';
}

/* Every rank compares its description with every other rank's; all find the same first
 * difference, so all fail together. The descriptions travel on dev, the model's device, which
 * the communicator takes (a CPU model on "mpi", a CUDA one on "nccl"), and are read on the
 * host. */
static em_status check_same_model(em_comm *c, em_device dev, const char *mine, size_t len) {
    int size = em_comm_size(c), rank = em_comm_rank(c);
    em_status st = EM_OK;
    em_scope_begin();
    em_tensor *l = em_to_device(em_full(1, (int64_t[]){1}, (double)len, EM_I64, em_cpu()), dev);
    em_tensor *ls = em_empty(1, (int64_t[]){size}, EM_I64, dev);
    if ((st = em_comm_wait(em_comm_allgather(c, ls, l))) != EM_OK) goto out;
    em_tensor *lh = em_to_device(ls, em_cpu());
    if (!lh) {
        st = em_last_status();
        goto out;
    }
    int64_t maxlen = 1;
    const int64_t *lv = em_tensor_data(lh);
    for (int r = 0; r < size; r++) maxlen = lv[r] > maxlen ? lv[r] : maxlen;
    em_tensor *mh = em_zeros(1, (int64_t[]){maxlen}, EM_U8, em_cpu());
    if (mh) memcpy(em_tensor_data(mh), mine, len);
    em_tensor *mb = mh ? em_to_device(mh, dev) : NULL;
    em_tensor *all = em_empty(1, (int64_t[]){maxlen * size}, EM_U8, dev);
    if (!mb || !all) {
        st = em_last_status();
        goto out;
    }
    if ((st = em_comm_wait(em_comm_allgather(c, all, mb))) != EM_OK) goto out;
    em_tensor *allh = em_to_device(all, em_cpu());
    if (!allh) {
        st = em_last_status();
        goto out;
    }
    const char *base = em_tensor_data(allh);
    for (int r = 1; r < size; r++) {
        const char *a = base, *b = base + (size_t)r * (size_t)maxlen;
        size_t la = (size_t)lv[0], lb = (size_t)lv[r];
        if (la == lb && memcmp(a, b, la) == 0) continue;
        size_t i = 0; /* the first differing line */
        for (;; i++) {
            char x[512], y[512];
            line_at(a, la, i, x, sizeof x);
            line_at(b, lb, i, y, sizeof y);
            if (strcmp(x, y) != 0) {
                st = em_set_error(EM_ERR_INVALID, "ddp_wrap (rank %d): the ranks' models differ: "
                                  "rank 0 has %s where rank %d has %s (entry %zu); every rank "
                                  "must build the same model", rank, *x ? x : "no more entries",
                                  r, *y ? y : "no more entries", i);
                goto out;
            }
        }
    }
out:
    em_scope_end();
    return st;
}

/* ---- buckets ------------------------------------------------------------------------------ */

static void progress(em_ddp *d) {
    for (int i = 0; i < d->next_launch; i++) {
        bucket *b = &d->buckets[i];
        bool done = false;
        if (b->work && !b->done && em_comm_test(b->work, &done) == EM_OK && done) {
            b->done = true;
            b->t_done = em__comm_work_done_s(b->work) - d->t0;
        }
    }
}

/* Start every full bucket whose predecessors started (the fixed order). */
static em_status launch_ready(em_ddp *d, bool all) {
    while (d->next_launch < d->n_buckets) {
        bucket *b = &d->buckets[d->next_launch];
        if (!all && b->n_ready < b->n) break;
        /* Stamped before the call: the communicator's progress thread may complete (and
         * stamp) a small bucket before em_comm_allreduce returns. */
        double t_launch = now_s() - d->t0;
        b->work = em_comm_allreduce(d->c, b->flat, EM_REDUCE_AVG);
        if (!b->work) return em_last_status();
        b->launched = true;
        b->done = false;
        b->t_launch = t_launch;
        b->t_done = -1;
        d->next_launch++;
    }
    return EM_OK;
}

/* Copy p's gradient (or zeros) into its place in its bucket. */
static em_status fill_slot(ddp_param *dp) {
    bucket *b = &dp->d->buckets[dp->bucket];
    em_tensor *slot = em_narrow(b->flat, 0, dp->offset, dp->numel);
    em_tensor *g = em_tensor_grad(dp->p);
    if (!g) return em_fill_(slot, 0.0);
    em_tensor *gf = em_reshape(g, 1, (int64_t[]){dp->numel});
    return em_copy_(slot, gf);
}

static em_status on_grad(em_tensor *t, void *user) {
    (void)t;
    ddp_param *dp = user;
    em_ddp *d = dp->d;
    if (d->no_sync) return EM_OK;
    if (dp->ready)
        return em_set_error(EM_ERR_STATE, "ddp (rank %d): parameter '%s' got a second gradient "
                            "before em_ddp_wait: call em_ddp_wait after every backward, or "
                            "accumulate inside em_ddp_no_sync_begin/end", em_comm_rank(d->c),
                            dp->name);
    em_status st = fill_slot(dp);
    if (st != EM_OK) return st;
    dp->ready = true;
    d->dirty = true;
    d->buckets[dp->bucket].n_ready++;
    st = launch_ready(d, false);
    progress(d);
    return st;
}

static void reset_round(em_ddp *d) {
    for (int i = 0; i < d->n_params; i++) d->params[i].ready = false;
    for (int i = 0; i < d->n_buckets; i++) {
        d->buckets[i].n_ready = 0;
        d->buckets[i].work = NULL;
    }
    d->next_launch = 0;
    d->dirty = false;
}

em_status em_ddp_wait(em_ddp *d) {
    if (!d) return em_set_error(EM_ERR_INVALID, "ddp_wait: NULL wrapper");
    if (d->no_sync || !d->dirty) return EM_OK;
    double t_begin = now_s();
    d->wait_begin = t_begin - d->t0;
    int rank = em_comm_rank(d->c);
    em_status st = EM_OK;
    int unused = 0, first = -1;
    for (int i = 0; i < d->n_params; i++)
        if (!d->params[i].ready) {
            unused++;
            if (first < 0) first = i;
        }
    em_scope_begin();
    if (unused && !d->o.find_unused_parameters) {
        char more[64] = "";
        if (unused > 1) snprintf(more, sizeof more, " (and %d more)", unused - 1);
        st = em_set_error(EM_ERR_STATE, "ddp (rank %d): parameter '%s'%s received no gradient "
                          "in this backward: it took no part in computing the loss. Pass "
                          "find_unused_parameters to count it as zero, or leave it out of the "
                          "model (or freeze it)", rank, d->params[first].name, more);
    } else {
        for (int i = 0; i < d->n_params && st == EM_OK; i++) {
            ddp_param *dp = &d->params[i];
            if (dp->ready) continue;
            st = fill_slot(dp);
            dp->ready = true;
            d->buckets[dp->bucket].n_ready++;
        }
        if (st == EM_OK) st = launch_ready(d, true);
    }
    /* Wait for every started bucket, also on error: the collectives are in flight on every
     * rank and must complete in order. */
    char first_err[1024] = "";
    em_status est = st;
    if (st != EM_OK) snprintf(first_err, sizeof first_err, "%s", em_last_error());
    for (int i = 0; i < d->next_launch; i++) {
        bucket *b = &d->buckets[i];
        if (!b->work) continue;
        double done_at = -1;
        em_status ws = em__comm_wait_at(b->work, &done_at);
        b->work = NULL;
        if (!b->done) b->t_done = (done_at >= 0 ? done_at : now_s()) - d->t0;
        b->done = true;
        if (ws != EM_OK && est == EM_OK) {
            est = ws;
            snprintf(first_err, sizeof first_err, "%s", em_last_error());
        }
    }
    d->wait_blocked = now_s() - t_begin;
    /* The averages go back into the .grad tensors. */
    for (int i = 0; i < d->n_params && est == EM_OK; i++) {
        ddp_param *dp = &d->params[i];
        bucket *b = &d->buckets[dp->bucket];
        em_tensor *slot = em_narrow(b->flat, 0, dp->offset, dp->numel);
        em_tensor *g = em_tensor_grad(dp->p);
        if (!g) {
            em_tensor *z = em_zeros_like(dp->p);
            if (!z || (est = em_tensor_set_grad(dp->p, z)) != EM_OK) {
                est = em_last_status();
                snprintf(first_err, sizeof first_err, "%s", em_last_error());
                break;
            }
            g = em_tensor_grad(dp->p);
        }
        em_tensor *gv = em_reshape(g, 1, (int64_t[]){dp->numel});
        if (!gv || (est = em_copy_(gv, slot)) != EM_OK) {
            est = em_last_status();
            snprintf(first_err, sizeof first_err, "%s", em_last_error());
        }
        if (em_tensor_data(gv) != em_tensor_data(g)) { /* reshape copied: write it back */
            em_tensor *gs = em_reshape(slot, em_tensor_ndim(g), em_tensor_shape(g));
            if (!gs || (est = em_copy_(g, gs)) != EM_OK) est = em_last_status();
        }
    }
    em_scope_end();
    reset_round(d);
    if (est != EM_OK) return em_set_error(est, "%s", first_err);
    return EM_OK;
}

/* ---- wrap, forward, free ---------------------------------------------------------------------- */

static em_status broadcast_dict(em_comm *c, const em_dict *dd, const em_dict *skip) {
    for (size_t i = 0; i < em_dict_len(dd); i++) {
        if (skip && em_dict_has(skip, em_dict_key(dd, i))) continue;
        em_tensor *t = em_dict_value(dd, i);
        em_status st = em_comm_wait(em_comm_broadcast(c, t, 0));
        if (st != EM_OK)
            return em_set_error(st, "ddp: broadcasting '%s' from rank 0: %s", em_dict_key(dd, i),
                                em_last_error());
    }
    return EM_OK;
}

em_status em_ddp_broadcast_buffers(em_ddp *d) {
    if (!d) return em_set_error(EM_ERR_INVALID, "ddp_broadcast_buffers: NULL wrapper");
    em_dict *sd = em_module_state_dict(d->m);
    em_dict *ps = em_module_named_parameters(d->m, false);
    em_status st = sd && ps ? broadcast_dict(d->c, sd, ps) : em_last_status();
    em_dict_free(sd);
    em_dict_free(ps);
    return st;
}

void em_ddp_free(em_ddp *d) {
    if (!d) return;
    for (int i = 0; i < d->n_buckets; i++) {
        if (d->buckets[i].work) (void)em_comm_wait(d->buckets[i].work);
        em_tensor_release(d->buckets[i].flat);
        free(d->buckets[i].members);
    }
    for (int i = 0; i < d->n_params; i++) {
        if (d->params[i].p) {
            (void)em_tensor_remove_post_accumulate_hook(d->params[i].p, on_grad, &d->params[i]);
            em_tensor_release(d->params[i].p);
        }
        free(d->params[i].name);
    }
    em_clear_error();
    free(d->params);
    free(d->buckets);
    free(d);
}

em_ddp *em_ddp_wrap(em_module *m, em_comm *c, const em_ddp_options *opts) {
    if (!m || !c) {
        em_set_error(EM_ERR_INVALID, "ddp_wrap: NULL %s", m ? "communicator" : "module");
        return NULL;
    }
    em_ddp_options o = {.struct_size = sizeof o};
    if (opts && EM__STRUCT_READ(em_ddp_options, &o, opts, offsetof(em_ddp_options, ext),
                                "ddp_wrap") != EM_OK)
        return NULL;
    if (o.bucket_bytes < 0 || o.first_bucket_bytes < 0) {
        em_set_error(EM_ERR_INVALID, "ddp_wrap: bucket sizes %lld and %lld: they must be > 0 "
                     "(0: the defaults)", (long long)o.bucket_bytes,
                     (long long)o.first_bucket_bytes);
        return NULL;
    }
    /* PyTorch's DistributedDataParallel (2.x): the first bucket (the first gradients ready:
     * the last layers) holds up to _DEFAULT_FIRST_BUCKET_BYTES (1 MiB) when bucket_cap_mb is
     * left at its default (25 MiB), and bucket_cap_mb like the others when it is set. */
    if (!o.first_bucket_bytes) o.first_bucket_bytes = o.bucket_bytes ? o.bucket_bytes : 1 << 20;
    if (!o.bucket_bytes) o.bucket_bytes = 25 << 20;
    if (o.first_bucket_bytes > o.bucket_bytes) o.first_bucket_bytes = o.bucket_bytes;
    em_ddp *d = calloc(1, sizeof *d);
    em_dict *all = em_module_named_parameters(m, false);
    em_dict *sd = em_module_state_dict(m);
    em_status st = d && all && sd ? EM_OK : EM_ERR_NOMEM;
    if (st != EM_OK) {
        if (!em__error_pending()) em_set_error(st, "ddp_wrap: out of memory");
        goto fail;
    }
    d->m = m;
    d->c = c;
    d->o = o;
    /* Same model everywhere, then rank 0's values everywhere. */
    size_t len = 0;
    char *desc = describe(sd, all, &len);
    if (!desc) {
        st = em_set_error(EM_ERR_NOMEM, "ddp_wrap: out of memory");
        goto fail;
    }
    em_device dev = em_dict_len(all) ? em_tensor_device(em_dict_value(all, 0))
                    : em_dict_len(sd) ? em_tensor_device(em_dict_value(sd, 0)) : em_cpu();
    st = check_same_model(c, dev, desc, len);
    free(desc);
    if (st != EM_OK) goto fail;
    if ((st = broadcast_dict(c, all, NULL)) != EM_OK || (st = broadcast_dict(c, sd, all)) != EM_OK)
        goto fail;
    /* Trainable parameters, in reverse order, into buckets. */
    int n = 0;
    for (size_t i = 0; i < em_dict_len(all); i++) n += em_tensor_requires_grad(em_dict_value(all, i));
    d->params = calloc((size_t)(n ? n : 1), sizeof *d->params);
    d->buckets = calloc((size_t)(n ? n : 1), sizeof *d->buckets);
    if (!d->params || !d->buckets) {
        st = em_set_error(EM_ERR_NOMEM, "ddp_wrap: out of memory");
        goto fail;
    }
    int k = 0;
    for (size_t j = em_dict_len(all); j-- > 0;) {
        em_tensor *p = em_dict_value(all, j);
        if (!em_tensor_requires_grad(p)) continue;
        ddp_param *dp = &d->params[k];
        dp->d = d;
        dp->p = em_tensor_retain(p);
        dp->numel = em_tensor_numel(p);
        if (!(dp->name = strdup(em_dict_key(all, j)))) {
            st = em_set_error(EM_ERR_NOMEM, "ddp_wrap: out of memory");
            goto fail;
        }
        k++;
        d->n_params = k;
    }
    int64_t cap = o.first_bucket_bytes, bytes = 0;
    for (int i = 0; i < d->n_params; i++) {
        ddp_param *dp = &d->params[i];
        em_dtype dt = em_tensor_dtype(dp->p);
        bucket *b = d->n_buckets ? &d->buckets[d->n_buckets - 1] : NULL;
        bool new_bucket = !b || bytes >= cap ||
                          em_tensor_dtype(d->params[b->members[0]].p) != dt ||
                          em_tensor_device(d->params[b->members[0]].p).type !=
                              em_tensor_device(dp->p).type;
        if (new_bucket) {
            if (b) cap = o.bucket_bytes;
            b = &d->buckets[d->n_buckets++];
            b->members = calloc((size_t)d->n_params, sizeof *b->members);
            if (!b->members) {
                st = em_set_error(EM_ERR_NOMEM, "ddp_wrap: out of memory");
                goto fail;
            }
            bytes = 0;
        }
        dp->bucket = d->n_buckets - 1;
        dp->offset = b->numel;
        b->members[b->n++] = i;
        b->numel += dp->numel;
        bytes += dp->numel * (int64_t)em_dtype_size(dt);
    }
    em_scope_begin();
    for (int i = 0; i < d->n_buckets && st == EM_OK; i++) {
        bucket *b = &d->buckets[i];
        const em_tensor *p0 = d->params[b->members[0]].p;
        b->flat = em_zeros(1, (int64_t[]){b->numel}, em_tensor_dtype(p0), em_tensor_device(p0));
        if (!b->flat) st = em_last_status();
        else em_tensor_retain(b->flat);
        b->t_launch = b->t_done = -1;
    }
    em_scope_end();
    for (int i = 0; i < d->n_params && st == EM_OK; i++)
        st = em_tensor_register_post_accumulate_hook(d->params[i].p, on_grad, &d->params[i]);
    if (st != EM_OK) goto fail;
    em_dict_free(all);
    em_dict_free(sd);
    d->wait_begin = d->wait_blocked = -1;
    return d;
fail:
    if (d && em__error_pending()) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_ddp_free(d);
        em_set_error(st, "%s", msg);
    } else {
        em_ddp_free(d);
    }
    em_dict_free(all);
    em_dict_free(sd);
    return NULL;
}

em_tensor *em_ddp_forward_n(em_ddp *d, em_tensor *const *in, int n_in) {
    return em_ddp_forward_masked(d, in, n_in, NULL);
}

em_tensor *em_ddp_forward_masked(em_ddp *d, em_tensor *const *in, int n_in, em_tensor *mask) {
    if (!d) {
        em_set_error(EM_ERR_INVALID, "ddp_forward: NULL wrapper");
        return NULL;
    }
    if (d->dirty) {
        em_set_error(EM_ERR_STATE, "ddp_forward (rank %d): the gradients of the last backward "
                     "were not synchronised: call em_ddp_wait after backward (accumulating "
                     "micro-batches goes inside em_ddp_no_sync_begin/end)", em_comm_rank(d->c));
        return NULL;
    }
    d->t0 = now_s();
    if (em_module_training(d->m) && em_ddp_broadcast_buffers(d) != EM_OK) return NULL;
    em_comm *saved = current_comm;
    current_comm = d->c;
    em_tensor *y = em_module_forward_masked(d->m, in, n_in, mask);
    current_comm = saved;
    return y;
}

em_tensor *em_ddp_forward(em_ddp *d, const em_tensor *x) {
    em_tensor *in[1] = {(em_tensor *)x};
    return em_ddp_forward_n(d, in, 1);
}

em_status em_ddp_no_sync_begin(em_ddp *d) {
    if (!d) return em_set_error(EM_ERR_INVALID, "ddp_no_sync_begin: NULL wrapper");
    if (d->no_sync) return em_set_error(EM_ERR_STATE, "ddp_no_sync_begin: already in a no_sync "
                                        "region (they do not nest)");
    if (d->dirty) return em_set_error(EM_ERR_STATE, "ddp_no_sync_begin: call em_ddp_wait for "
                                      "the last backward first");
    d->no_sync = true;
    return EM_OK;
}

em_status em_ddp_no_sync_end(em_ddp *d) {
    if (!d) return em_set_error(EM_ERR_INVALID, "ddp_no_sync_end: NULL wrapper");
    if (!d->no_sync) return em_set_error(EM_ERR_STATE, "ddp_no_sync_end: not in a no_sync region");
    d->no_sync = false;
    return EM_OK;
}

int em_ddp_bucket_count(const em_ddp *d) { return d ? d->n_buckets : 0; }

em_status em_ddp_bucket_get(const em_ddp *d, int i, em_ddp_bucket_info *out) {
    if (!d || !out) return em_set_error(EM_ERR_INVALID, "ddp_bucket_get: NULL argument");
    if (i < 0 || i >= d->n_buckets)
        return em_set_error(EM_ERR_RANGE, "ddp_bucket_get: bucket %d of %d", i, d->n_buckets);
    const bucket *b = &d->buckets[i];
    em_ddp_bucket_info info = {.struct_size = sizeof info, .n_params = b->n,
                               .bytes = b->numel * (int64_t)em_dtype_size(
                                            em_tensor_dtype(b->flat)),
                               .launch_s = b->t_launch, .done_s = b->t_done};
    return EM__STRUCT_WRITE(em_ddp_bucket_info, out, &info,
                            offsetof(em_ddp_bucket_info, ext), "ddp_bucket_get");
}

em_status em_ddp_last_wait(const em_ddp *d, double *begin_s, double *blocked_s) {
    if (!d) return em_set_error(EM_ERR_INVALID, "ddp_last_wait: NULL wrapper");
    if (begin_s) *begin_s = d->wait_begin;
    if (blocked_s) *blocked_s = d->wait_blocked;
    return EM_OK;
}

/* ---- SyncBatchNorm conversion ---------------------------------------------------------------- */

static em_status convert(em_module *m, int *count) {
    for (size_t i = 0; i < em_module_child_count(m); i++) {
        const char *name = NULL;
        em_module *ch = em_module_child_at(m, i, &name);
        const char *cls = em_module_class_of(ch)->name;
        if (strcmp(cls, "BatchNorm1d") != 0 && strcmp(cls, "BatchNorm2d") != 0) {
            em_status st = convert(ch, count);
            if (st != EM_OK) return st;
            continue;
        }
        em_module *s = em_module_new("SyncBatchNorm", em_module_options(ch));
        if (!s) return em_last_status();
        em_dict *sd = em_module_state_dict(ch);
        em_status st = sd ? em_module_load_state_dict(s, sd, true, NULL) : em_last_status();
        em_dict_free(sd);
        if (st == EM_OK) {
            em_module_train(s, em_module_training(ch));
            char nm[256];
            snprintf(nm, sizeof nm, "%s", name);
            st = em__module_replace_child(m, nm, s);
        } else {
            em_module_free(s);
        }
        if (st != EM_OK) return st;
        (*count)++;
    }
    return EM_OK;
}

em_status em_ddp_convert_sync_batchnorm(em_module *m, int *count) {
    if (!m) return em_set_error(EM_ERR_INVALID, "ddp_convert_sync_batchnorm: NULL module");
    int n = 0;
    em_scope_begin();
    em_status st = convert(m, &n);
    em_scope_end();
    if (count) *count = n;
    return st;
}

/*
 * observe.c — the per-thread observer point every op passes (ember/trace.h): the observer
 * stack, the chain of calls in progress (for nesting) and the begin/end notifications the
 * dispatcher, the view functions and the copies send.
 *
 * The hot path reads one initial-exec thread-local int (em__observed: the thread's observer
 * count, 0 while none is pushed or while a callback runs) and branches on it; only when it is
 * set does a call build an event (em__obs_begin / em__obs_end around the call).
 */
#include <string.h>

#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "internal.h"
#include "observe.h"

#define MAX_OBSERVERS 16

__attribute__((tls_model("initial-exec"))) _Thread_local int em__observed;

static _Thread_local struct {
    em_observer obs[MAX_OBSERVERS];
    int n;
    int in_callback;
    em__obs_frame *top;   /* innermost call in progress that was observed */
    uint64_t next_id;
    uint64_t fallbacks;   /* ops of this thread that ran on the CPU fallback */
} O;

static void sync_flag(void) {
    em__observed = (em__observed & EM__OBS_AUTOCAST) | (O.in_callback ? 0 : O.n);
}

em_status em_observer_push(const em_observer *obs) {
    if (!obs || obs->struct_size < offsetof(em_observer, ext))
        return em_set_error(EM_ERR_INVALID, "observer_push: NULL observer or struct_size %zu too "
                            "small", obs ? obs->struct_size : (size_t)0);
    if (O.in_callback)
        return em_set_error(EM_ERR_STATE, "observer_push: called from inside an observer's "
                            "callback");
    if (O.n == MAX_OBSERVERS)
        return em_set_error(EM_ERR_RANGE, "observer_push: this thread has %d observers already "
                            "(a push without its pop in a loop?)", MAX_OBSERVERS);
    em_observer *o = &O.obs[O.n++];
    memset(o, 0, sizeof *o);
    memcpy(o, obs, EM_MIN(obs->struct_size, sizeof *o));
    o->struct_size = sizeof *o;
    sync_flag();
    return EM_OK;
}

em_status em_observer_pop(const em_observer *obs) {
    if (!obs) return em_set_error(EM_ERR_INVALID, "observer_pop: NULL observer");
    if (O.in_callback)
        return em_set_error(EM_ERR_STATE, "observer_pop: called from inside an observer's "
                            "callback");
    for (int i = O.n - 1; i >= 0; i--) {
        em_observer *o = &O.obs[i];
        if (o->begin != obs->begin || o->end != obs->end || o->user != obs->user) continue;
        memmove(o, o + 1, sizeof *o * (size_t)(O.n - 1 - i));
        O.n--;
        sync_flag();
        return EM_OK;
    }
    return em_set_error(EM_ERR_NOTFOUND, "observer_pop: no such observer is pushed on this "
                        "thread (%d are)", O.n);
}

int em_observer_count(void) { return O.n; }

void em__obs_note_fallback(void) { O.fallbacks++; }

/* Run the callbacks with observation suspended, keeping the thread's last error as the call
 * left it (a callback's own failures must not replace the op's message). */
static void notify(const em_op_event *ev, bool begin) {
    em_status saved = em_last_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    O.in_callback++;
    sync_flag();
    if (begin) {
        for (int i = 0; i < O.n; i++)
            if (O.obs[i].begin) O.obs[i].begin(O.obs[i].user, ev);
    } else {
        for (int i = O.n - 1; i >= 0; i--)
            if (O.obs[i].end) O.obs[i].end(O.obs[i].user, ev);
    }
    O.in_callback--;
    sync_flag();
    if (em_last_status() != saved || strcmp(em_last_error(), msg) != 0) {
        if (saved == EM_OK) em_clear_error();
        else em_set_error(saved, "%s", msg);
    }
}

static const em_attr no_attrs[8];

void em__obs_begin(em__obs_frame *f, em_op_event_kind kind, const char *name, const em_op *op,
                   const em_tensor *const *in, int n_in, const em_attr *attrs,
                   em_tensor *const *out, int n_out) {
    const em_op_schema *s = op ? em_op_schema_of(op) : NULL;
    int n_attrs = s ? s->n_attrs : 0;
    em__obs_begin_attrs(f, kind, name, op, in, n_in, n_attrs,
                        s ? (const char *const *)s->attr_names : NULL,
                        attrs ? attrs : no_attrs, out, n_out);
}

void em__obs_begin_attrs(em__obs_frame *f, em_op_event_kind kind, const char *name,
                         const em_op *op, const em_tensor *const *in, int n_in, int n_attrs,
                         const char *const *attr_names, const em_attr *attrs,
                         em_tensor *const *out, int n_out) {
    em_op_event *ev = &f->ev;
    *ev = (em_op_event){.struct_size = sizeof *ev, .kind = kind, .name = name, .op = op,
                        .id = ++O.next_id, .parent = O.top ? O.top->ev.id : 0,
                        .depth = O.top ? O.top->ev.depth + 1 : 0,
                        .n_in = n_in < 0 ? 0 : n_in, .in = in, .n_attrs = n_attrs,
                        .attr_names = attr_names, .attrs = attrs,
                        .n_out = out ? n_out : 0, .out = out};
    if (ev->n_in > 0 && !in) ev->n_in = 0;
    f->up = O.top;
    f->fallbacks = O.fallbacks;
    O.top = f;
    notify(ev, true);
}

em_status em__obs_end(em__obs_frame *f, em_status st, em_tensor *const *out, int n_out) {
    /* Frames close in call order; a frame left open by an observer popped mid-call is not
     * possible (frames live on the stack of the calls they describe). */
    O.top = f->up;
    if (!O.n) return st; /* every observer was popped while the call ran */
    em_op_event *ev = &f->ev;
    ev->status = st;
    ev->out = st == EM_OK ? out : NULL;
    ev->n_out = st == EM_OK && out ? n_out : 0;
    ev->fell_back = O.fallbacks != f->fallbacks;
    notify(ev, false);
    return st;
}

em_tensor *em__obs_end1(em__obs_frame *f, em_tensor *r) {
    em_tensor *out[1] = {r};
    em__obs_end(f, r ? EM_OK : em_last_status(), out, 1);
    return r;
}

size_t em__obs_new_bytes(const em_op_event *ev, int j) {
    const em__storage *s = ev->out[j]->storage;
    for (int i = 0; i < ev->n_in; i++)
        if (ev->in[i] && ev->in[i]->storage == s) return 0;
    for (int k = 0; k < j; k++)
        if (ev->out[k] && ev->out[k]->storage == s) return 0;
    return s->nbytes;
}

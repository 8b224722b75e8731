/*
 * observe.c — the per-thread observer point every op passes (ember/trace.h): the observer
 * stack, the chain of calls in progress (for nesting) and the begin/end notifications the
 * dispatcher, the view functions and the copies send.
 *
 * The hot path reads one initial-exec thread-local int (em__observed: the thread's observer
 * count, the process-wide profiling session's bit, the not-yet-registered bit; observe.h) and
 * branches on it; only when it is set does a call build an event (em__obs_begin / em__obs_end
 * around the call).
 *
 * Also the list of the threads that run ops: a thread's first observed-path call (every
 * thread makes one: its word starts with EM__OBS_NEW set) links its TLS record in, so that a
 * profiling session begun on any thread can set its bit on all of them (em__obs_session).
 */
#define _GNU_SOURCE /* syscall */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "internal.h"
#include "observe.h"

#define MAX_OBSERVERS 16

__attribute__((tls_model("initial-exec"))) _Thread_local _Atomic int em__observed = EM__OBS_NEW;
_Thread_local em__thread em__self; /* slow paths only: the default TLS model */

static _Thread_local struct {
    em_observer obs[MAX_OBSERVERS];
    int n;
    int in_callback;
    em__obs_frame *top;   /* innermost call in progress that was observed */
    uint64_t next_id;
    uint64_t fallbacks;   /* ops of this thread that ran on the CPU fallback */
} O;

/* The thread's observer count into its word (the other bits are others' or autocast's). */
static void sync_flag(void) {
    int w = atomic_load_explicit(&em__observed, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&em__observed, &w,
                                                  (w & ~EM__OBS_COUNT) | O.n,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

/* ---- the threads that run ops ------------------------------------------------------------- */

static pthread_mutex_t threads_mu = PTHREAD_MUTEX_INITIALIZER;
static em__thread *threads;       /* the registered threads (threads_mu) */
static bool session_on;           /* (threads_mu) */
static pthread_key_t thread_key;  /* its destructor unlinks an exiting thread */
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;

static void unlink_locked(em__thread *t) {
    if (!t->linked) return;
    if (t->prev) t->prev->next = t->next;
    else threads = t->next;
    if (t->next) t->next->prev = t->prev;
    t->prev = t->next = NULL;
    t->linked = false;
}

static void thread_exit(void *arg) {
    em__thread *t = arg;
    pthread_mutex_lock(&threads_mu);
    unlink_locked(t);
    pthread_mutex_unlock(&threads_mu);
}

/* fork: only the calling thread goes on in the child (the others' records are stale). */
static void fork_prepare(void) { pthread_mutex_lock(&threads_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&threads_mu); }
static void fork_child(void) {
    threads = NULL;
    if (em__self.linked) {
        em__self.prev = em__self.next = NULL;
        em__self.tid = (long)syscall(SYS_gettid);
        threads = &em__self;
    }
    pthread_mutex_unlock(&threads_mu);
}

static void thread_init_once(void) {
    if (pthread_key_create(&thread_key, thread_exit) != 0) thread_key = (pthread_key_t)-1;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void em__thread_register(void) {
    em__thread *t = &em__self;
    if (t->linked || !(atomic_load_explicit(&em__observed, memory_order_relaxed) & EM__OBS_NEW))
        return;
    pthread_once(&thread_once, thread_init_once);
    t->word = &em__observed;
    t->tid = (long)syscall(SYS_gettid);
    /* Without the key (none left) the thread is not listed: it is profiled only while it
     * runs ops with an observer of its own; its word still loses the bit. */
    bool listed = thread_key != (pthread_key_t)-1 && pthread_setspecific(thread_key, t) == 0;
    pthread_mutex_lock(&threads_mu);
    if (listed) {
        t->prev = NULL;
        t->next = threads;
        if (threads) threads->prev = t;
        threads = t;
        t->linked = true;
    }
    int set = listed && session_on ? EM__OBS_SESSION : 0;
    int w = atomic_load_explicit(&em__observed, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&em__observed, &w, (w & ~EM__OBS_NEW) | set,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    pthread_mutex_unlock(&threads_mu);
}

void em__thread_set_name(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(em__self.name, sizeof em__self.name, fmt, ap);
    va_end(ap);
}

void em__obs_session(bool on) {
    pthread_mutex_lock(&threads_mu);
    session_on = on;
    for (em__thread *t = threads; t; t = t->next) {
        if (on) atomic_fetch_or_explicit(t->word, EM__OBS_SESSION, memory_order_relaxed);
        else atomic_fetch_and_explicit(t->word, ~EM__OBS_SESSION, memory_order_relaxed);
    }
    pthread_mutex_unlock(&threads_mu);
}

void em__obs_quiesce(void) {
    pthread_mutex_lock(&threads_mu);
    for (em__thread *t = threads; t; t = t->next)
        while (atomic_load_explicit(&t->busy, memory_order_seq_cst)) sched_yield();
    pthread_mutex_unlock(&threads_mu);
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
static void notify(const em_op_event *ev, bool begin, bool session) {
    em_status saved = em_last_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    O.in_callback++;
    if (begin) {
        for (int i = 0; i < O.n; i++)
            if (O.obs[i].begin) O.obs[i].begin(O.obs[i].user, ev);
        if (session) em__prof_begin(ev); /* last: the others' work is not in its time */
    } else {
        if (session) em__prof_end(ev);
        for (int i = O.n - 1; i >= 0; i--)
            if (O.obs[i].end) O.obs[i].end(O.obs[i].user, ev);
    }
    O.in_callback--;
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
    int w = em__obs_word();
    if (w & EM__OBS_NEW) {
        em__thread_register();
        w = em__obs_word();
    }
    /* Calls made by a callback are not reported (nor were they before: the word was 0). */
    f->session = (w & EM__OBS_SESSION) != 0;
    f->live = !O.in_callback && (O.n || f->session);
    if (!f->live) return;
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
    notify(ev, true, f->session);
}

em_status em__obs_end(em__obs_frame *f, em_status st, em_tensor *const *out, int n_out) {
    if (!f->live) return st;
    /* Frames close in call order; a frame left open by an observer popped mid-call is not
     * possible (frames live on the stack of the calls they describe). */
    O.top = f->up;
    /* The session's end sees the calls its begin saw (it drops those begun before it). */
    bool session = f->session || (em__obs_word() & EM__OBS_SESSION);
    if (!O.n && !session) return st; /* every observer was popped while the call ran */
    em_op_event *ev = &f->ev;
    ev->status = st;
    ev->out = st == EM_OK ? out : NULL;
    ev->n_out = st == EM_OK && out ? n_out : 0;
    ev->fell_back = O.fallbacks != f->fallbacks;
    notify(ev, false, session);
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

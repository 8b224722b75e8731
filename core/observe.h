/*
 * core/observe.h — the observer internals (observe.c) the calls that report to observers use
 * (dispatch.c, tensor.c): apart from internal.h so that the library's other objects do not
 * depend on ember/trace.h (and the module.h it includes).
 */
#ifndef EMBER_CORE_OBSERVE_H
#define EMBER_CORE_OBSERVE_H

#include <stdatomic.h>

#include "ember/trace.h"
#include "internal.h"

/* ---- observers (observe.c) ---------------------------------------------------------------- */

/* The hot word every op tests: one initial-exec thread-local int per thread, read with a
 * relaxed load (a plain load: no call, no fence) and one predictable branch. Its bits:
 *   EM__OBS_COUNT     the thread's observer count (em_observer_push), written by the thread;
 *   EM__OBS_NEW       set until the thread's first observed-path call registers it (below):
 *                     each thread takes the slow path once, whatever else is set;
 *   EM__OBS_SESSION   a process-wide profiling session is on (profile.c): written by the
 *                     thread that begins or ends it, on every registered thread;
 *   EM__OBS_AUTOCAST  an enabled autocast region applies to the thread's op calls
 *                     (autocast.c), written by the thread.
 * Other threads write it, so every write is an atomic read-modify-write. em__observing()
 * tests everything but the autocast bit; em__op_hooked() (the op-call entry points' one test)
 * everything. */
extern __attribute__((tls_model("initial-exec"))) _Thread_local _Atomic int em__observed;
#define EM__OBS_COUNT 0xffff
#define EM__OBS_NEW (1 << 28)
#define EM__OBS_SESSION (1 << 29)
#define EM__OBS_AUTOCAST (1 << 30)
#define em__obs_word() atomic_load_explicit(&em__observed, memory_order_relaxed)
#define em__observing() __builtin_expect((em__obs_word() & (EM__OBS_AUTOCAST - 1)) != 0, 0)
#define em__op_hooked() __builtin_expect(em__obs_word() != 0, 0)

/* ---- the threads that run ops (observe.c) -------------------------------------------------- */

/* One per thread that has made an observed-path call (its first op call registers it), in the
 * process-wide list a profiling session walks to set and clear EM__OBS_SESSION; unlinked when
 * the thread exits (a pthread key's destructor). Lives in the thread's TLS. */
typedef struct em__thread {
    _Atomic int *word;         /* the thread's em__observed */
    long tid;                  /* gettid() */
    char name[32];             /* em__thread_set_name's, or "" */
    /* profile.c's: set while the thread records into a session's buffer (em_profiler_end
     * waits for it to clear), the buffer and the session it belongs to. */
    _Atomic int busy;
    void *lane;
    uint64_t lane_gen;
    struct em__thread *prev, *next;
    bool linked;
} em__thread;
extern _Thread_local em__thread em__self;
/* Register the calling thread if it is not yet (takes the list's lock once per thread). */
void em__thread_register(void);
/* em__thread_set_name (the thread's name in a trace) is in internal.h. */
/* Set (on) or clear EM__OBS_SESSION on every registered thread, and on the threads that
 * register from now on, under the list's lock. */
void em__obs_session(bool on);
/* Wait, under the list's lock, until no registered thread is busy (em__thread.busy). */
void em__obs_quiesce(void);
/* The process-wide session's callbacks (profile.c), run after (begin) or before (end) the
 * thread's own observers, with observation suspended. */
void em__prof_begin(const em_op_event *ev);
void em__prof_end(const em_op_event *ev);

/* One observed call in progress, on the stack of the call it describes. */
typedef struct em__obs_frame {
    em_op_event ev;
    bool live;             /* begin notified someone: end does too */
    bool session;          /* and the profiling session was on at the begin */
    struct em__obs_frame *up;
    uint64_t fallbacks;
    em_attr attrs[4];      /* a view's or a copy's attributes */
    em_tensor *io[2];      /* a copy_'s destination as its output */
} em__obs_frame;
/* Tell the observers a call begins (op's schema names the attributes; attrs may be NULL) and
 * ends (outputs on success); em__obs_end returns st. Calls pair up, innermost first. */
void em__obs_begin(em__obs_frame *f, em_op_event_kind kind, const char *name, const em_op *op,
                   const em_tensor *const *in, int n_in, const em_attr *attrs,
                   em_tensor *const *out, int n_out);
void em__obs_begin_attrs(em__obs_frame *f, em_op_event_kind kind, const char *name,
                         const em_op *op, const em_tensor *const *in, int n_in, int n_attrs,
                         const char *const *attr_names, const em_attr *attrs,
                         em_tensor *const *out, int n_out);
em_status em__obs_end(em__obs_frame *f, em_status st, em_tensor *const *out, int n_out);
/* The end of a call returning one tensor (NULL: failed); returns r. */
em_tensor *em__obs_end1(em__obs_frame *f, em_tensor *r);
/* The CPU fallback ran an op for this thread (em_op_event.fell_back). */
void em__obs_note_fallback(void);

/* Bytes of the storage output j of ev holds that no input (nor an earlier output) shares: what
 * the call allocated for it (the tracer's and the profiler's memory figures). */
size_t em__obs_new_bytes(const em_op_event *ev, int j);

#endif /* EMBER_CORE_OBSERVE_H */

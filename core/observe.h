/*
 * core/observe.h — the observer internals (observe.c) the calls that report to observers use
 * (dispatch.c, tensor.c): apart from internal.h so that the library's other objects do not
 * depend on ember/trace.h (and the module.h it includes).
 */
#ifndef EMBER_CORE_OBSERVE_H
#define EMBER_CORE_OBSERVE_H

#include "ember/trace.h"
#include "internal.h"

/* ---- observers (observe.c) ---------------------------------------------------------------- */

/* The thread's observer count (0 also while one of its callbacks runs) in the low bits, and
 * EM__OBS_AUTOCAST while an enabled autocast region applies to the thread's op calls
 * (autocast.c): the one thread-local load (initial-exec: no call) and branch an op pays when
 * nothing observes it and no region is open. em__observing() tests the count alone (one
 * instruction as before: a test against a mask instead of a compare with 0). */
extern __attribute__((tls_model("initial-exec"))) _Thread_local int em__observed;
#define EM__OBS_AUTOCAST (1 << 30)
#define em__observing() __builtin_expect((em__observed & (EM__OBS_AUTOCAST - 1)) != 0, 0)
/* Either an observer or an autocast region: the op-call entry points' one test. */
#define em__op_hooked() __builtin_expect(em__observed != 0, 0)
/* One observed call in progress, on the stack of the call it describes. */
typedef struct em__obs_frame {
    em_op_event ev;
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

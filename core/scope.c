/*
 * scope.c — per-thread scopes: each scope owns the tensor references handed to the user
 * while it is the innermost one, and drops them when it ends (except those em_keep() moved
 * out). A thread's scopes are a stack of growable arrays.
 */
#include <string.h>

#include "ember/error.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

typedef struct scope {
    em_tensor **refs;
    size_t n, cap;
} scope;

static _Thread_local struct {
    scope *s;
    int depth, cap;
} S;

int em_scope_depth(void) { return S.depth; }

em_status em_scope_begin(void) {
    if (S.depth == S.cap) {
        int nc = S.cap ? S.cap * 2 : 8;
        scope *p = em__realloc(S.s, sizeof *S.s * (size_t)S.cap, sizeof *S.s * (size_t)nc,
                               "scope stack");
        if (!p) return EM_ERR_NOMEM;
        memset(p + S.cap, 0, sizeof *p * (size_t)(nc - S.cap));
        S.s = p;
        S.cap = nc;
    }
    S.s[S.depth++].n = 0;
    return EM_OK;
}

/* Append t to scope sc; false when the array cannot grow. */
static bool scope_push(scope *sc, em_tensor *t) {
    if (sc->n == sc->cap) {
        size_t nc = sc->cap ? sc->cap * 2 : 64;
        em_tensor **p = em__realloc(sc->refs, sizeof *p * sc->cap, sizeof *p * nc, "scope");
        if (!p) return false;
        sc->refs = p;
        sc->cap = nc;
    }
    sc->refs[sc->n++] = t;
    return true;
}

em_tensor *em__scope_track(em_tensor *t) {
    if (!t || S.depth == 0) return t;
    if (!scope_push(&S.s[S.depth - 1], t)) {
        /* The reference cannot be tracked: drop it rather than leak it, and fail the call. */
        em_tensor_release(t);
        return NULL;
    }
    return t;
}

em_status em_scope_end(void) {
    if (S.depth == 0)
        return em_set_error(EM_ERR_STATE, "scope_end: no scope is open on this thread "
                            "(em_scope_begin/em_scope_end calls do not pair up)");
    scope *sc = &S.s[--S.depth];
    for (size_t i = sc->n; i-- > 0;) em_tensor_release(sc->refs[i]);
    sc->n = 0;
    if (S.depth == 0) em__scope_shutdown();
    return EM_OK;
}

em_tensor *em_keep(em_tensor *t) {
    if (!t || S.depth == 0) return t;
    scope *sc = &S.s[S.depth - 1];
    for (size_t i = sc->n; i-- > 0;) {
        if (sc->refs[i] != t) continue;
        memmove(&sc->refs[i], &sc->refs[i + 1], (sc->n - i - 1) * sizeof *sc->refs);
        sc->n--;
        if (S.depth >= 2 && !scope_push(&S.s[S.depth - 2], t)) {
            sc->refs[sc->n++] = t; /* cannot move it: leave it where it was */
            return NULL;
        }
        return t;
    }
    return t;
}

void em__scope_untrack(em_tensor *t) {
    if (!t || S.depth == 0) return;
    scope *sc = &S.s[S.depth - 1];
    for (size_t i = sc->n; i-- > 0;)
        if (sc->refs[i] == t) {
            memmove(&sc->refs[i], &sc->refs[i + 1], (sc->n - i - 1) * sizeof *sc->refs);
            sc->n--;
            return;
        }
}

/* Free this thread's scope arrays once no scope is open (at the outermost em_scope_end and at
 * em_shutdown), so nothing stays allocated between training runs. */
void em__scope_shutdown(void) {
    if (S.depth > 0) return;
    for (int i = 0; i < S.cap; i++) em__free(S.s[i].refs);
    em__free(S.s);
    memset(&S, 0, sizeof S);
}

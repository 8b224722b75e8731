/*
 * scope.c — per-thread scopes: each scope owns the tensor references handed to the user
 * while it is the innermost one, and drops them when it ends (except those em_keep() moved
 * out). A thread's scopes are a stack of growable arrays.
 *
 * Each scope remembers where it was opened (em_scope_begin is a macro passing __FILE__ and
 * __LINE__), and each tensor counts the references scopes hold on it (scope_refs), so that
 * em_tensor_release can tell a release of a reference a scope owns (tensor.c) and name the
 * scope.
 */
#include <string.h>

#include "ember/error.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

typedef struct scope {
    em_tensor **refs;
    size_t n, cap;
    const char *file; /* where em_scope_begin was called */
    int line;
} scope;

static _Thread_local struct {
    scope *s;
    int depth, cap;
} S;

int em_scope_depth(void) { return S.depth; }

/* Binaries built before em_scope_begin became a macro call the function. */
em_status(em_scope_begin)(void) {
    return em_scope_begin_at("(a caller built before em_scope_begin_at)", 0);
}

em_status em_scope_begin_at(const char *file, int line) {
    if (S.depth == S.cap) {
        int nc = S.cap ? S.cap * 2 : 8;
        scope *p = em__realloc(S.s, sizeof *S.s * (size_t)S.cap, sizeof *S.s * (size_t)nc,
                               "scope stack");
        if (!p) return EM_ERR_NOMEM;
        memset(p + S.cap, 0, sizeof *p * (size_t)(nc - S.cap));
        S.s = p;
        S.cap = nc;
    }
    scope *sc = &S.s[S.depth++];
    sc->n = 0;
    sc->file = file ? file : "(unknown file)";
    sc->line = line;
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
    t->site_file = sc->file;
    t->site_line = sc->line;
    return true;
}

/* Remove entry i of scope sc (the reference goes to the caller). */
static void scope_remove(scope *sc, size_t i) {
    memmove(&sc->refs[i], &sc->refs[i + 1], (sc->n - i - 1) * sizeof *sc->refs);
    sc->n--;
}

em_tensor *em__scope_track(em_tensor *t) {
    if (!t || S.depth == 0) return t;
    if (!scope_push(&S.s[S.depth - 1], t)) {
        /* The reference cannot be tracked: drop it rather than leak it, and fail the call. */
        em_tensor_release(t);
        return NULL;
    }
    atomic_fetch_add_explicit(&t->scope_refs, 1, memory_order_relaxed);
    return t;
}

em_status em_scope_end(void) {
    if (S.depth == 0)
        return em_set_error(EM_ERR_STATE, "scope_end: no scope is open on this thread "
                            "(em_scope_begin/em_scope_end calls do not pair up)");
    scope *sc = &S.s[--S.depth];
    for (size_t i = sc->n; i-- > 0;) em__tensor_release_scoped(sc->refs[i], sc->file, sc->line);
    sc->n = 0;
    if (S.depth == 0) em__scope_shutdown();
    return EM_OK;
}

em_tensor *em_keep(em_tensor *t) {
    if (!t || S.depth == 0) return t;
    scope *sc = &S.s[S.depth - 1];
    for (size_t i = sc->n; i-- > 0;) {
        if (sc->refs[i] != t) continue;
        scope_remove(sc, i);
        if (S.depth < 2) {
            atomic_fetch_sub_explicit(&t->scope_refs, 1, memory_order_relaxed);
            return t;
        }
        if (!scope_push(&S.s[S.depth - 2], t)) {
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
            scope_remove(sc, i);
            atomic_fetch_sub_explicit(&t->scope_refs, 1, memory_order_relaxed);
            return;
        }
}

bool em__scope_disown(em_tensor *t, const char **file, int *line) {
    for (int d = S.depth; d-- > 0;) {
        scope *sc = &S.s[d];
        for (size_t i = sc->n; i-- > 0;)
            if (sc->refs[i] == t) {
                scope_remove(sc, i);
                atomic_fetch_sub_explicit(&t->scope_refs, 1, memory_order_relaxed);
                *file = sc->file;
                *line = sc->line;
                return true;
            }
    }
    return false;
}

int em__scope_open(const char **file, int *line) {
    if (S.depth > 0) {
        *file = S.s[S.depth - 1].file;
        *line = S.s[S.depth - 1].line;
    }
    return S.depth;
}

/* Free this thread's scope arrays once no scope is open (at the outermost em_scope_end and at
 * em_shutdown), so nothing stays allocated between training runs. */
void em__scope_shutdown(void) {
    if (S.depth > 0) return;
    for (int i = 0; i < S.cap; i++) em__free(S.s[i].refs);
    em__free(S.s);
    memset(&S, 0, sizeof S);
}

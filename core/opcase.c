/*
 * core/opcase.c — the op-case rows in the registry (ember/opcase.h): registration, lookup,
 * removal with the owning registry, and the helpers that build a row's inputs.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/ops.h"
#include "ember/opcase.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "internal.h"

/* One em_op_cases_register call: its rows (referenced, or a copy when older). */
typedef struct case_set {
    em_registry *owner;
    const em_op_case *rows;
    em_op_case *copy; /* owned, when the rows were older than this core */
    size_t n;
    struct case_set *next;
} case_set;

static pthread_mutex_t case_lock = PTHREAD_MUTEX_INITIALIZER;
static case_set *sets_head, **sets_tail = &sets_head;
static size_t case_total;

/* The first layout: through ext. */
#define CASE_MIN_SIZE (offsetof(em_op_case, ext) + sizeof(void *))

static em_status check_row(const em_op_case *c, size_t i) {
    if (!c->op)
        return em_set_error(EM_ERR_INVALID, "op_cases_register: row %zu names no op", i);
    if (!em_op_find(c->op))
        return em_set_error(EM_ERR_NOTFOUND, "op_cases_register: row %zu (%s) names op '%s', "
                            "which is not declared (declare it before its cases)", i,
                            c->variant ? c->variant : "", c->op);
    if (c->n_in < 0 || c->n_in > EM_CASE_MAX_IN)
        return em_set_error(EM_ERR_INVALID, "op_cases_register: row %zu (%s, %s) has %d inputs "
                            "(0 to %d)", i, c->op, c->variant ? c->variant : "", c->n_in,
                            EM_CASE_MAX_IN);
    if (!c->dtypes || (c->dtypes >> EM_DTYPE_COUNT))
        return em_set_error(EM_ERR_INVALID, "op_cases_register: row %zu (%s, %s) lists no "
                            "valid dtype (dtypes 0x%x)", i, c->op, c->variant ? c->variant : "",
                            c->dtypes);
    return EM_OK;
}

em_status em_op_cases_register(em_registry *reg, const em_op_case *rows, size_t n) {
    if (!reg || (!rows && n))
        return em_set_error(EM_ERR_INVALID, "op_cases_register: NULL registry or rows");
    if (n == 0) return EM_OK;
    size_t size = rows[0].struct_size;
    if (size < CASE_MIN_SIZE)
        return em_set_error(EM_ERR_INVALID, "op_cases_register: em_op_case struct_size %zu is "
                            "below the first layout's %zu", size, (size_t)CASE_MIN_SIZE);
    case_set *s = em__calloc(1, sizeof *s, "op cases");
    if (!s) return EM_ERR_NOMEM;
    s->owner = reg;
    s->n = n;
    if (size < sizeof(em_op_case)) {
        /* Older rows: copied by the prefix rule, the missing tail zero. */
        if (!(s->copy = em__calloc(n, sizeof *s->copy, "op cases"))) {
            em__free(s);
            return EM_ERR_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            memcpy(&s->copy[i], (const char *)rows + i * size, size);
            s->copy[i].struct_size = size;
        }
        s->rows = s->copy;
    } else {
        s->rows = rows; /* a newer row's stride is its own struct_size */
        if (size > sizeof(em_op_case)) {
            if (!(s->copy = em__calloc(n, sizeof *s->copy, "op cases"))) {
                em__free(s);
                return EM_ERR_NOMEM;
            }
            for (size_t i = 0; i < n; i++)
                memcpy(&s->copy[i], (const char *)rows + i * size, sizeof(em_op_case));
            s->rows = s->copy;
        }
    }
    for (size_t i = 0; i < n; i++) {
        em_status st = check_row(&s->rows[i], i);
        if (st != EM_OK) {
            em__free(s->copy);
            em__free(s);
            return st;
        }
    }
    pthread_mutex_lock(&case_lock);
    *sets_tail = s;
    sets_tail = &s->next;
    case_total += n;
    pthread_mutex_unlock(&case_lock);
    return EM_OK;
}

static const case_set *set_of(size_t *i) {
    for (const case_set *s = sets_head; s; s = s->next) {
        if (*i < s->n) return s;
        *i -= s->n;
    }
    return NULL;
}

size_t em_op_case_count(void) {
    pthread_mutex_lock(&case_lock);
    size_t n = case_total;
    pthread_mutex_unlock(&case_lock);
    return n;
}

const em_op_case *em_op_case_get(size_t i) {
    pthread_mutex_lock(&case_lock);
    const case_set *s = set_of(&i);
    pthread_mutex_unlock(&case_lock);
    return s ? &s->rows[i] : NULL;
}

const em_registry *em_op_case_owner(size_t i) {
    pthread_mutex_lock(&case_lock);
    const case_set *s = set_of(&i);
    pthread_mutex_unlock(&case_lock);
    return s ? s->owner : NULL;
}

void em__op_cases_remove_owner(const em_registry *owner) {
    pthread_mutex_lock(&case_lock);
    case_set **p = &sets_head;
    while (*p) {
        case_set *s = *p;
        if (owner && s->owner != owner) {
            p = &s->next;
            continue;
        }
        *p = s->next;
        case_total -= s->n;
        em__free(s->copy);
        em__free(s);
    }
    sets_tail = p;
    while (*sets_tail) sets_tail = &(*sets_tail)->next;
    pthread_mutex_unlock(&case_lock);
}

/* ---- generators ------------------------------------------------------------------------- */

static double lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) * 0x1p-53; /* [0, 1) */
}

em_tensor *em_case_make(const em_case_input *spec, em_dtype row_dtype, uint64_t seed) {
    if (!spec) {
        em_set_error(EM_ERR_INVALID, "case_make: NULL input description");
        return NULL;
    }
    if (spec->absent) return NULL;
    if (spec->ndim < 0 || spec->ndim > 4) {
        em_set_error(EM_ERR_INVALID, "case_make: an input of %d dims (0 to 4)", spec->ndim);
        return NULL;
    }
    em_dtype dt = spec->dtype >= 0 ? (em_dtype)spec->dtype : row_dtype;
    /* The base tensor the view is taken of. */
    int nd = spec->ndim;
    int64_t base[4];
    memcpy(base, spec->shape, sizeof base);
    em_case_layout lay = spec->layout;
    if (lay == EM_CASE_TRANSPOSED && nd < 2) lay = EM_CASE_CONTIG;
    if ((lay == EM_CASE_SLICED || lay == EM_CASE_EXPANDED) && nd < 1) lay = EM_CASE_CONTIG;
    if (lay == EM_CASE_CHANNELS_LAST && nd != 4) lay = EM_CASE_CONTIG;
    if (lay == EM_CASE_BLOCKED && !(nd == 4 && spec->shape[1] > 0 && spec->shape[1] % 16 == 0))
        lay = EM_CASE_CONTIG;
    if (lay == EM_CASE_TRANSPOSED) base[nd - 2] = spec->shape[nd - 1], base[nd - 1] = spec->shape[nd - 2];
    if (lay == EM_CASE_SLICED) base[nd - 1] = spec->shape[nd - 1] + 2;
    if (lay == EM_CASE_EXPANDED) base[0] = 1;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= base[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!v) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
    bool integral = !em_dtype_is_floating(dt);
    for (int64_t i = 0; i < n; i++) {
        double u = lcg(&s), r;
        switch (spec->values) {
        case EM_CASE_POS: r = 0.25 + 2 * u; break;
        case EM_CASE_INDEX: r = floor(u * (double)(spec->bound > 0 ? spec->bound : 1)); break;
        case EM_CASE_BOOLS: r = u < 0.5; break;
        case EM_CASE_PROB: r = 0.05 + 0.9 * u; break;
        case EM_CASE_ONES: r = 1; break;
        default: r = 4 * u - 2; break;
        }
        if (integral && spec->values == EM_CASE_RANDN) r = dt == EM_U8 ? floor(u * 7) : round(r * 3);
        if (integral && spec->values == EM_CASE_POS) r = 1 + floor(u * 4);
        if (dt == EM_BOOL && spec->values != EM_CASE_BOOLS) r = r != 0;
        v[i] = r;
    }
    em_tensor *src = em_from_data(v, nd, base, EM_F64, em_cpu());
    free(v);
    em_tensor *t = src ? em_to_dtype(src, dt) : NULL;
    if (!t) return NULL;
    switch (lay) {
    case EM_CASE_TRANSPOSED: return em_transpose(t, nd - 2, nd - 1);
    case EM_CASE_SLICED: return em_narrow(t, nd - 1, 1, spec->shape[nd - 1]);
    case EM_CASE_EXPANDED: return em_expand(t, nd, spec->shape);
    case EM_CASE_CHANNELS_LAST: return em_channels_last(t);
    case EM_CASE_BLOCKED: return em_to_layout(t, EM_LAYOUT_NCHW16C);
    default: return t;
    }
}

em_status em_case_inputs(const em_op_case *c, em_dtype dt, uint64_t seed, em_tensor **in) {
    if (!c || !in) return em_set_error(EM_ERR_INVALID, "case_inputs: NULL row or in");
    for (int i = 0; i < c->n_in; i++) {
        in[i] = em_case_make(&c->in[i], dt, seed * 31 + (uint64_t)i);
        if (!in[i] && !c->in[i].absent) return em_last_status();
    }
    return EM_OK;
}

int em_case_grad_setup(const em_op_case *c, em_dtype dt, uint64_t seed, em_case_grad *g,
                       em_tensor **vary) {
    if (!c || !g || !vary || g->struct_size != sizeof *g) {
        em_set_error(EM_ERR_INVALID, "case_grad_setup: NULL argument, or an em_case_grad whose "
                     "struct_size is %zu (expected %zu)", g ? g->struct_size : 0, sizeof *g);
        return -1;
    }
    *g = (em_case_grad){.struct_size = sizeof *g, .c = c};
    for (int i = 0; i < c->n_in; i++) {
        em_tensor *t = em_case_make(&c->in[i], dt, seed * 131 + (uint64_t)i);
        g->all[i] = t;
        if (!t || c->in[i].dtype >= 0 || c->in[i].values == EM_CASE_INDEX ||
            (c->no_grad >> i & 1u))
            continue;
        em_tensor *leaf = em_clone(t);
        if (!leaf || em_requires_grad_(leaf, true) != EM_OK) continue;
        g->which[g->n] = i;
        vary[g->n++] = leaf;
    }
    return g->n;
}

em_tensor *em_case_grad_fn(em_tensor *const *inputs, int n, void *user) {
    em_case_grad *g = user;
    em_tensor *in[EM_CASE_MAX_IN];
    memcpy(in, g->all, sizeof in);
    for (int k = 0; k < n; k++) in[g->which[k]] = inputs[k];
    em_tensor *out[16] = {0};
    int no = 0;
    const em_op *op = em_op_find(g->c->op);
    if (!op) return NULL;
    em_status st = g->c->typed
                       ? g->c->typed((const em_tensor *const *)in, g->c->attrs, out, &no)
                       : em_op_call_n(op, (const em_tensor *const *)in, g->c->n_in, g->c->attrs,
                                      out, 16, &no);
    if (st != EM_OK) return NULL;
    const em_op_schema *sch = em_op_schema_of(op);
    if (!(sch->flags & EM_OP_VARIADIC_OUTPUTS)) no = no > 0;
    em_tensor *acc = NULL;
    for (int k = 0; k < no; k++) {
        if (!em_dtype_is_floating(em_tensor_dtype(out[k]))) continue;
        em_tensor *s;
        int nd = em_tensor_ndim(out[k]);
        if (nd <= 4) {
            em_case_input dir = {.ndim = nd, .dtype = -1};
            memcpy(dir.shape, em_tensor_shape(out[k]), sizeof(int64_t) * (size_t)nd);
            em_tensor *w = em_case_make(&dir, em_tensor_dtype(out[k]), 977 + (uint64_t)k);
            em_device dev = em_tensor_device(out[k]);
            if (w && !em_device_equal(dev, em_cpu())) w = em_to_device(w, dev);
            s = em_sum(em_mul(out[k], w), 0, NULL, false);
        } else {
            s = em_sum(out[k], 0, NULL, false);
        }
        acc = acc ? em_add(acc, s) : s;
    }
    return acc;
}

unsigned em_case_dtypes_of(const char *op) {
    unsigned dts = 0;
    size_t n = em_op_case_count();
    for (size_t r = 0; op && r < n; r++) {
        const em_op_case *c = em_op_case_get(r);
        if (c->expect == EM_OK && strcmp(c->op, op) == 0) dts |= c->dtypes;
    }
    return dts;
}

double em_case_tolerance(em_dtype dt) {
    switch (dt) {
    case EM_F32: return 1e-5;
    case EM_F64: return 1e-12;
    case EM_F16: return 2e-3;
    case EM_BF16: return 1.6e-2;
    default: return 0;
    }
}


/*
 * ops_fill.c — the standard op set, the fills (ops without inputs that write a tensor): fill,
 * arange, uniform, normal, bernoulli, randperm: schemas, the checks they run on the tensor
 * they write (em_op_call_out runs their prepare hook with the outputs), and the typed public
 * functions of ember/ops.h, which draw the random streams' seed and offset from a generator.
 *
 * Kernel contracts (what a backend may assume, per op):
 *   fill() -> y           attrs: value (float). In place on y.
 *   arange() -> y         attrs: start, step, end (floats; end absent: any length);
 *                         y[i] = start + i * step.
 *   uniform/normal/bernoulli() -> y   see ember/random.h for the attributes and streams;
 *                                     seed absent with offset given marks a call recorded in
 *                                     a graph capture: the stream starts at block
 *                                     base + offset, with (seed, base) read when the work runs
 *                                     from em_kernel_generator_state (ember/dispatch.h).
 *   randperm() -> y                   attrs: seed, offset. y (n) i64 or i32, any strides: the
 *                                     permutation ember/random.h defines.
 */
#include <math.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/random.h"
#include "ember/tensor.h"
#include "internal.h"

const em_op *em__op_fill;
static const em_op *op_arange, *op_uniform, *op_normal, *op_bernoulli, *op_randperm;

/* The elements of arange(start, end, step), or -1 with an error. */
static int64_t arange_len(double start, double end, double step) {
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step) ||
        (step > 0 && end < start) || (step < 0 && end > start)) {
        em_set_error(EM_ERR_INVALID, "arange: invalid range [%g, %g) with step %g (step must "
                     "be non-zero and point from start to end)", start, end, step);
        return -1;
    }
    double len = ceil((end - start) / step);
    if (len > 1e15) {
        em_set_error(EM_ERR_INVALID, "arange: %g elements are too many", len);
        return -1;
    }
    return (int64_t)len;
}

static em_status randperm_check(int64_t n, em_dtype dt) {
    if (dt != EM_I64 && dt != EM_I32)
        return em_set_error(EM_ERR_DTYPE, "randperm: dtype %s is not supported; it gives int64 "
                            "(the index dtype) or int32", em_dtype_name(dt));
    int64_t max = dt == EM_I32 ? INT64_C(1) << 31 : INT64_C(1) << 32;
    if (n < 0 || n > max)
        return em_set_error(EM_ERR_INVALID, "randperm: n must be between 0 and %lld for %s, got "
                            "%lld", (long long)max, em_dtype_name(dt), (long long)n);
    return EM_OK;
}

/* The fills (no inputs): em_op_call_out runs these on the output (dts is NULL). */
static em_status prep_fill(const em_op *op, const em_tensor *const *out, int n_out,
                           const em_attr *a, em_dtype *dts) {
    (void)n_out, (void)dts;
    const em_tensor *t = out[0];
    if (op == em__op_fill)
        return a[0].type == EM_ATTR_FLOAT ? EM_OK
                                          : em_set_error(EM_ERR_INVALID, "fill: attribute "
                                                         "'value' is required");
    if (op == op_arange) {
        if (a[2].type == EM_ATTR_NONE) return EM_OK; /* no end: any length */
        int64_t n = arange_len(a[0].v.f, a[2].v.f, a[1].v.f);
        if (n < 0) return em_last_status();
        if (t->ndim != 1 || t->numel != n)
            return em_set_error(EM_ERR_SHAPE, "arange: [%g, %g) in steps of %g has %lld "
                                "elements; the output has %lld", a[0].v.f, a[2].v.f, a[1].v.f,
                                (long long)n, (long long)t->numel);
        return EM_OK;
    }
    if (op == op_randperm) return t->ndim == 1 ? randperm_check(t->numel, t->dtype)
                                               : em_set_error(EM_ERR_SHAPE, "randperm: the "
                                                              "output must be 1-D");
    if ((op == op_uniform || op == op_normal) && !em_dtype_is_floating(t->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s_: expected a floating tensor, got %s",
                            em_op_name(op), em_dtype_name(t->dtype));
    double p0 = a[2].v.f, p1 = op == op_bernoulli ? 0 : a[3].v.f; /* bernoulli has 3 attrs */
    if (op == op_uniform && (!(p0 <= p1) || !isfinite(p0) || !isfinite(p1)))
        return em_set_error(EM_ERR_INVALID, "uniform_: expects lo <= hi, both finite; got "
                            "[%g, %g)", p0, p1);
    if (op == op_normal && (!(p1 >= 0) || !isfinite(p0) || !isfinite(p1)))
        return em_set_error(EM_ERR_INVALID, "normal_: expects std >= 0 and finite mean; got "
                            "mean %g, std %g", p0, p1);
    if (op == op_bernoulli && !(p0 >= 0 && p0 <= 1))
        return em_set_error(EM_ERR_INVALID, "bernoulli_: expects 0 <= p <= 1, got %g", p0);
    return EM_OK;
}

static em_status op_check_fill(const em_op *op, em_tensor *const *t, int n, const em_attr *a) {
    return prep_fill(op, (const em_tensor *const *)t, n, a, NULL);
}

em_status em__ops_declare_fill(em_registry *core) {
    static const char *const value[] = {"value"}, *const arange[] = {"start", "step", "end"},
                             *const uniform[] = {"seed", "offset", "lo", "hi"},
                             *const normal[] = {"seed", "offset", "mean", "std"},
                             *const bernoulli[] = {"seed", "offset", "p"},
                             *const randperm[] = {"seed", "offset"};
    static const em_attr_type tf[] = {EM_ATTR_FLOAT},
                              tfff[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT, EM_ATTR_FLOAT},
                              tiiff[] = {EM_ATTR_INT, EM_ATTR_INT, EM_ATTR_FLOAT, EM_ATTR_FLOAT},
                              tiif[] = {EM_ATTR_INT, EM_ATTR_INT, EM_ATTR_FLOAT},
                              tii[] = {EM_ATTR_INT, EM_ATTR_INT};
    const unsigned nd = EM_OP_NONDIFF;
    em_status st = EM_OK;
#define DECLS(var, ...)                                                                         \
    if (st == EM_OK)                                                                            \
        st = em__declare(core, &var, (em_op_schema){__VA_ARGS__, .dispatch_arg = -1,            \
                         .flags = nd, .category = "fill"})
    DECLS(em__op_fill, .name = "fill", .n_attrs = 1, .attr_names = value, .attr_types = tf,
          .prepare = prep_fill);
    DECLS(op_arange, .name = "arange", .n_attrs = 3, .attr_names = arange, .attr_types = tfff,
          .prepare = prep_fill);
    DECLS(op_uniform, .name = "uniform", .n_attrs = 4, .attr_names = uniform,
          .attr_types = tiiff, .prepare = prep_fill);
    DECLS(op_normal, .name = "normal", .n_attrs = 4, .attr_names = normal, .attr_types = tiiff,
          .prepare = prep_fill);
    DECLS(op_bernoulli, .name = "bernoulli", .n_attrs = 3, .attr_names = bernoulli,
          .attr_types = tiif, .prepare = prep_fill);
    DECLS(op_randperm, .name = "randperm", .n_attrs = 2, .attr_names = randperm,
          .attr_types = tii, .prepare = prep_fill);
#undef DECLS
    return st;
}

/* ---- public functions ------------------------------------------------------------------------------ */

em_status em_fill_(em_tensor *t, double value) {
    if (!em__check_inputs("fill_", (const em_tensor *const *)&t, 1)) return em_last_status();
    return em_op_call_out(em__op_fill, NULL, 0, EM__ATTRS(EM__A_FLOAT(value)), &t, 1);
}

em_tensor *em_arange(double start, double end, double step, em_dtype dt, em_device dev) {
    int64_t n = arange_len(start, end, step);
    em_tensor *t = n >= 0 ? em__empty(1, &n, dt, dev) : NULL;
    if (t && em_op_call_out(op_arange, NULL, 0, EM__ATTRS(EM__A_FLOAT(start), EM__A_FLOAT(step),
                                                          EM__A_FLOAT(end)), &t, 1) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    return em__scope_track(t);
}

/* A fill op's attributes from gen: seed and offset of the blocks reserved for t (while this
 * thread captures on t's device: no seed, the offset relative to the capture's state). */
static em_status random_fill(const em_op *op, em_tensor *t, em_generator *gen, int per_block,
                             double p0, double p1) {
    if (!em__check_inputs(em_op_name(op), (const em_tensor *const *)&t, 1)) return em_last_status();
    em_attr attrs[4] = {{0}, {0}, EM__A_FLOAT(p0), EM__A_FLOAT(p1)};
    /* Checked before the generator advances: a refused call draws nothing. */
    if (op_check_fill(op, &t, 1, attrs) != EM_OK) return em_last_status();
    uint64_t blocks = ((uint64_t)t->numel + (uint64_t)per_block - 1) / (uint64_t)per_block;
    em_rng_state s;
    bool graph;
    em_status st = em__rng_draw(gen, blocks, t->storage->device, em_op_name(op), true, &s,
                                &graph);
    if (st != EM_OK) return st;
    attrs[0] = em__rng_seed_attr(s, graph);
    attrs[1] = EM__A_INT((int64_t)s.offset);
    return em_op_call_out(op, NULL, 0, attrs, &t, 1);
}

em_status em_uniform_(em_tensor *t, double lo, double hi, em_generator *gen) {
    return random_fill(op_uniform, t, gen, t && t->dtype == EM_F64 ? 2 : 4, lo, hi);
}
em_status em_normal_(em_tensor *t, double mean, double std, em_generator *gen) {
    return random_fill(op_normal, t, gen, 2, mean, std);
}
em_status em_bernoulli_(em_tensor *t, double p, em_generator *gen) {
    return random_fill(op_bernoulli, t, gen, 4, p, 0);
}

em_tensor *em_randperm(int64_t n, em_dtype dt, em_device dev, em_generator *gen) {
    if (randperm_check(n, dt) != EM_OK) return NULL;
    em_tensor *t = em__empty(1, &n, dt, dev);
    if (!t) return NULL;
    /* k = 0 .. n-2 draws word k: ceil((n - 1) / 4) blocks (ember/random.h). Not in a graph
     * capture: its kernels take the offset as an argument (em__rng_draw refuses). */
    em_rng_state s;
    bool graph;
    if (em__rng_draw(gen, n > 1 ? ((uint64_t)n + 2) / 4 : 0, dev, "randperm", false, &s,
                     &graph) != EM_OK ||
        em_op_call_out(op_randperm, NULL, 0, EM__ATTRS(EM__A_INT((int64_t)s.seed),
                                                       EM__A_INT((int64_t)s.offset)),
                       &t, 1) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    return em__scope_track(t);
}


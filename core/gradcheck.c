/*
 * gradcheck.c — em_gradcheck: analytical gradients against central finite differences.
 *
 * For a fixed random direction v (Philox, seed 0), the analytical side is the gradient of
 * sum(v * f(x)) with respect to each input (one backward); the numerical side perturbs one
 * input element at a time by +-eps and differentiates the same projection. One backward and
 * two forwards per input element: cheap enough for the small shapes tests use.
 *
 * The inputs may live on any device: fn runs there, v is drawn on the CPU and copied, and an
 * input off the CPU is read through em_tensor_to_host and perturbed through em_copy_ of one
 * element, never through its data pointer (device memory is not host memory).
 */
#include <math.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

/* sum(v * f(inputs)) as a double, with f's output kept in *out when out is non-NULL. */
static em_status projected(em_gradcheck_fn fn, int n, em_tensor *const *inputs, void *user,
                           em_tensor **v, double *value, em_tensor **out) {
    em_tensor *y = fn(inputs, n, user);
    if (!y) return em__error_pending() ? em_last_status()
                                       : em_set_error(EM_ERR_INVALID, "gradcheck: the function "
                                                      "returned NULL");
    if (!*v) { /* the direction: fixed random values in [-1, 1) of y's shape */
        em_generator *g = em_generator_new(0);
        /* Drawn on the CPU (the same values on every device), then copied to y's device. */
        em_tensor *d = g ? em_empty(em_tensor_ndim(y), em_tensor_shape(y), em_tensor_dtype(y),
                                    em_cpu()) : NULL;
        if (!d || em_uniform_(d, -1, 1, g) != EM_OK) {
            em_generator_free(g);
            return em_last_status();
        }
        em_generator_free(g);
        if (!em_device_equal(em_tensor_device(y), em_cpu()) &&
            !(d = em_to_device(d, em_tensor_device(y))))
            return em_last_status();
        *v = d; /* first call: made in em_gradcheck's own scope */
    }
    em_tensor *p = em_sum(em_mul(y, *v), 0, NULL, false);
    if (!p) return em_last_status();
    if (out) *out = p;
    return em_tensor_item(p, value);
}

/* Element e of the float64 input x set to value: at ptr on the CPU, else through flat (x viewed
 * as one dimension) with em_copy_ from a CPU scalar. */
static em_status set_element(em_tensor *x, em_tensor *flat, char *ptr, int64_t e, double value) {
    if (ptr) {
        em_dtype_store(EM_F64, ptr, 0, value);
        em_tensor_bump_version(x);
        return EM_OK;
    }
    em_status st = em_scope_begin();
    if (st != EM_OK) return st;
    int64_t one = 1;
    em_tensor *dst = em_narrow(flat, 0, e, 1);
    em_tensor *src = dst ? em_from_data(&value, 1, &one, EM_F64, em_cpu()) : NULL;
    st = src ? em_copy_(dst, src) : em_last_status();
    em_scope_end();
    return st;
}

em_status em_gradcheck(em_gradcheck_fn fn, int n, em_tensor *const *inputs, void *user,
                       double eps, double atol, double rtol) {
    if (!fn || n < 1 || !inputs)
        return em_set_error(EM_ERR_INVALID, "gradcheck: a function and at least one input are "
                            "required");
    if (eps <= 0) eps = 1e-6;
    if (atol <= 0) atol = 1e-5;
    if (rtol <= 0) rtol = 1e-3;
    em_status st = em_scope_begin();
    if (st != EM_OK) return st;
    em_tensor *v = NULL, *p = NULL;
    double base;
    em_tensor *grads[16] = {0};
    em_tensor *wrt[16];
    int wrt_index[16], n_wrt = 0; /* messages name the input by its place in inputs[] */
    for (int i = 0; i < n && n_wrt < 16; i++)
        if (inputs[i] && em_tensor_requires_grad(inputs[i])) {
            wrt_index[n_wrt] = i;
            wrt[n_wrt++] = inputs[i];
        }
    if (n_wrt == 0) st = em_set_error(EM_ERR_INVALID, "gradcheck: no input requires grad");
    /* A step of eps = 1e-6 is below float32's resolution at 1 (1.2e-7 is its epsilon, so
     * x + eps and x - eps differ by a few ulps at best) and far below half's: the numerical
     * side would be rounding noise, and a correct backward would "fail". Refuse, and say how. */
    for (int w = 0; w < n_wrt && st == EM_OK; w++) {
        em_dtype dt = em_tensor_dtype(wrt[w]);
        if (dt != EM_F64)
            st = em_set_error(EM_ERR_DTYPE, "gradcheck: input %d is %s: finite differences need "
                              "float64 (a step of %g is lost in %s rounding); pass "
                              "em_to_dtype(x, EM_F64) with requires_grad set, and convert "
                              "inside the function if the op must run in %s", wrt_index[w],
                              em_dtype_name(dt), eps, em_dtype_name(dt), em_dtype_name(dt));
    }
    if (st == EM_OK) st = projected(fn, n, inputs, user, &v, &base, &p);
    if (st == EM_OK) st = em_grad(1, &p, NULL, n_wrt, wrt, grads, NULL);
    /* Numerical side, element by element, with recording off. */
    em_grad_mode_push(EM_GRAD_DISABLED);
    for (int w = 0; w < n_wrt && st == EM_OK; w++) {
        em_tensor *x = wrt[w];
        int64_t numel = em_tensor_numel(x);
        em_dtype dt = em_tensor_dtype(x);
        if (!em_tensor_is_contiguous(x)) { /* x itself is perturbed: it must be dense */
            st = em_set_error(EM_ERR_INVALID, "gradcheck: input %d is not contiguous; pass "
                              "contiguous inputs and make non-contiguous views inside the "
                              "function", wrt_index[w]);
            break;
        }
        em_tensor *g64 = grads[w] ? em_to_dtype(grads[w], EM_F64) : NULL;
        double *ga = em__malloc(sizeof(double) * (size_t)(numel ? numel : 1), "gradcheck");
        if (!ga) st = EM_ERR_NOMEM;
        if (st == EM_OK && g64) st = em_tensor_to_host(g64, ga, sizeof(double) * (size_t)numel);
        else if (st == EM_OK) memset(ga, 0, sizeof(double) * (size_t)numel);
        /* On the CPU the element is perturbed in place; elsewhere through a one-element view
         * of x, written with em_copy_ from a CPU scalar (x's values read once to the host). */
        bool host = em_tensor_device(x).type == EM_DEVICE_CPU_TYPE;
        double *x0s = host ? NULL : em__malloc(sizeof(double) * (size_t)(numel ? numel : 1),
                                               "gradcheck");
        em_tensor *flat = host ? NULL : em_view(x, 1, &numel);
        if (!host && st == EM_OK && (!x0s || !flat)) st = x0s ? em_last_status() : EM_ERR_NOMEM;
        if (!host && st == EM_OK) st = em_tensor_to_host(x, x0s, sizeof(double) * (size_t)numel);
        for (int64_t e = 0; e < numel && st == EM_OK; e++) {
            char *ptr = host ? (char *)em_tensor_data(x) + (size_t)e * em_dtype_size(dt) : NULL;
            double x0 = host ? em_dtype_load(dt, ptr, 0) : x0s[e], fp, fm;
            st = set_element(x, flat, ptr, e, x0 + eps);
            if (st == EM_OK) {
                em_scope_begin();
                st = projected(fn, n, inputs, user, &v, &fp, NULL);
                em_scope_end();
            }
            if (st == EM_OK) st = set_element(x, flat, ptr, e, x0 - eps);
            if (st == EM_OK) {
                em_scope_begin();
                st = projected(fn, n, inputs, user, &v, &fm, NULL);
                em_scope_end();
            }
            em_status rs = set_element(x, flat, ptr, e, x0); /* restored even after an error */
            if (st == EM_OK) st = rs;
            if (st != EM_OK) break;
            double num = (fp - fm) / (2 * eps);
            if (!(fabs(ga[e] - num) <= atol + rtol * fabs(num)))
                st = em_set_error(EM_ERR_INVALID, "gradcheck: input %d, element %lld: analytical "
                                  "%.10g vs numerical %.10g (|difference| %.3g > atol %g + rtol "
                                  "%g * |numerical|)", wrt_index[w], (long long)e, ga[e], num,
                                  fabs(ga[e] - num), atol, rtol);
        }
        em__free(ga);
        em__free(x0s);
    }
    em_grad_mode_pop();
    em_scope_end();
    return st;
}

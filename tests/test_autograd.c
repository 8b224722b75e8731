/* Autograd: PyTorch's semantics (accumulation, retain_grad, freed graphs, version counters,
 * grad modes, detach, hooks, em_grad), gradients checked against finite differences in f64,
 * f32 backward against f64 backward, anomaly mode, the graph dump, and a long training-like
 * loop that must hold memory flat. */
#include "common.h"

TestSuite(autograd, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(gradcheck, .init = em_test_setup, .fini = em_test_teardown);

/* A leaf of the given shape with values from a fixed Philox stream, requiring grad. */
static em_tensor *leaf(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed, double lo,
                       double hi) {
    em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
    em_generator *g = em_generator_new(seed);
    cr_assert_eq(em_uniform_(t, lo, hi, g), EM_OK, "%s", em_last_error());
    em_generator_free(g);
    cr_assert_eq(em_requires_grad_(t, true), EM_OK, "%s", em_last_error());
    return t;
}

static double grad_at(const em_tensor *t, int64_t i) {
    em_tensor *g = em_tensor_grad(t);
    cr_assert_not_null(g, "no .grad");
    return em_test_at(g, i);
}

Test(autograd, gradients_of_a_small_expression) {
    /* y = sum((a * b + a) / b), d/da = (b + 1) / b, d/db = -a / b^2 */
    em_tensor *a = em_test_tensor(EM_F64, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    em_tensor *b = em_test_tensor(EM_F64, 1, (int64_t[]){3}, (double[]){4, 5, 6});
    em_requires_grad_(a, true);
    em_requires_grad_(b, true);
    em_scope_begin();
    em_tensor *y = em_sum(em_div(em_add(em_mul(a, b), a), b), 0, NULL, false);
    cr_assert_not_null(y, "%s", em_last_error());
    cr_assert_str_eq(em_tensor_grad_fn_name(em_mul(a, b)), "mul");
    cr_assert_null(em_tensor_grad_fn_name(a), "a leaf has no grad_fn");
    cr_assert_eq(em_backward(y), EM_OK, "%s", em_last_error());
    em_scope_end();
    double av[3] = {1, 2, 3}, bv[3] = {4, 5, 6};
    for (int i = 0; i < 3; i++) {
        cr_assert_float_eq(grad_at(a, i), (bv[i] + 1) / bv[i], 1e-12);
        cr_assert_float_eq(grad_at(b, i), -av[i] / (bv[i] * bv[i]), 1e-12);
    }
    em_tensor_release(a);
    em_tensor_release(b);
}

/* A reduction that drops its dims is one node named after the op (PyTorch's SumBackward),
 * keepdim or not, and its grad still lands with the input's shape (mean is composite: its
 * node is the scaling). */
Test(autograd, reductions_name_their_node_with_or_without_keepdim) {
    em_tensor *x = em_test_tensor(EM_F64, 2, (int64_t[]){2, 3}, (double[]){1, 2, 3, 4, 5, 9});
    em_tensor *w = em_test_tensor(EM_F64, 1, (int64_t[]){2}, (double[]){1, 2});
    em_requires_grad_(x, true);
    em_scope_begin();
    for (int keep = 0; keep < 2; keep++) {
        cr_expect_str_eq(em_tensor_grad_fn_name(em_sum(x, 1, (int[]){1}, keep)), "sum");
        cr_expect_str_eq(em_tensor_grad_fn_name(em_sum(x, 0, NULL, keep)), "sum");
        cr_expect_str_eq(em_tensor_grad_fn_name(em_amax(x, 1, (int[]){1}, keep)), "amax");
        cr_expect_str_eq(em_tensor_grad_fn_name(em_var(x, 1, (int[]){1}, 1, keep)), "var");
    }
    /* d/dx sum(mean(x, dim 1) * [1, 2]) = [1/3, 1/3, 1/3, 2/3, 2/3, 2/3] */
    em_tensor *m = em_mean(x, 1, (int[]){1}, false);
    cr_assert_eq(em_backward(em_sum(em_mul(m, w), 0, NULL, false)), EM_OK, "%s", em_last_error());
    em_scope_end();
    for (int i = 0; i < 6; i++)
        cr_expect_float_eq(grad_at(x, i), (i < 3 ? 1.0 : 2.0) / 3, 1e-12, "element %d", i);
    em_tensor_release(w);
    em_tensor_release(x);
}

Test(autograd, grads_accumulate_over_backward_calls_until_cleared) {
    em_tensor *w = em_test_tensor(EM_F32, 1, (int64_t[]){2}, (double[]){1, -2});
    em_requires_grad_(w, true);
    for (int k = 0; k < 2; k++) { /* the seeds' accumulation recipe: loss / 2, two micro-batches */
        em_scope_begin();
        em_tensor *loss = em_div(em_sum(em_mul(w, w), 0, NULL, false), em_scalar(2, EM_F32));
        cr_assert_eq(em_backward(loss), EM_OK, "%s", em_last_error());
        em_scope_end();
    }
    cr_assert_float_eq(grad_at(w, 0), 2.0, 1e-6, "2 * (w / 2 * 2) over two calls");
    cr_assert_float_eq(grad_at(w, 1), -4.0, 1e-6);
    cr_assert_eq(em_tensor_set_grad(w, NULL), EM_OK);
    cr_assert_null(em_tensor_grad(w), "set_grad(NULL) is zero_grad(set_to_none)");
    em_tensor_release(w);
}

Test(autograd, broadcasting_reduces_grads_to_each_input_shape) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){4, 3}, 1, -1, 1);
    em_tensor *b = leaf(EM_F64, 1, (int64_t[]){3}, 2, -1, 1);
    em_tensor *s = leaf(EM_F64, 0, NULL, 3, 1, 2);
    em_scope_begin();
    cr_assert_eq(em_backward(em_sum(em_mul(em_add(x, b), s), 0, NULL, false)), EM_OK, "%s",
                 em_last_error());
    em_scope_end();
    cr_assert_eq(em_tensor_ndim(em_tensor_grad(b)), 1);
    cr_assert_eq(em_tensor_ndim(em_tensor_grad(s)), 0);
    double sv = em_item(s);
    for (int j = 0; j < 3; j++) cr_assert_float_eq(grad_at(b, j), 4 * sv, 1e-12);
    double expect = 0; /* d/ds sum((x + b) * s) = sum(x + b) */
    for (int i = 0; i < 12; i++) expect += em_test_at(x, i) + em_test_at(b, i % 3);
    cr_assert_float_eq(grad_at(s, 0), expect, 1e-10);
    em_tensor *all[] = {x, b, s};
    for (int i = 0; i < 3; i++) em_tensor_release(all[i]);
}

Test(autograd, grads_flow_through_views_into_their_base) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){3, 4}, 4, -1, 1);
    em_scope_begin();
    /* sum of x^T[1:3, ::2] * 3 + x.select(0, 2).sum() */
    em_tensor *v = em_slice(em_narrow(em_transpose(x, 0, 1), 0, 1, 2), 1, 0, 3, 2);
    em_tensor *y = em_add(em_sum(em_mul(v, em_scalar(3, EM_F64)), 0, NULL, false),
                          em_sum(em_select(x, 0, 2), 0, NULL, false));
    cr_assert_eq(em_backward(y), EM_OK, "%s", em_last_error());
    em_scope_end();
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            double e = (j >= 1 && j < 3 && (i == 0 || i == 2) ? 3 : 0) + (i == 2 ? 1 : 0);
            cr_assert_float_eq(grad_at(x, i * 4 + j), e, 0, "x[%d][%d]", i, j);
        }
    em_tensor_release(x);
}

Test(autograd, retain_grad_keeps_a_non_leaf_grad) {
    em_tensor *x = leaf(EM_F64, 1, (int64_t[]){3}, 5, 0, 1);
    em_scope_begin();
    em_tensor *h = em_mul(x, em_scalar(2, EM_F64));
    em_tensor *h2 = em_exp(x);
    cr_assert_eq(em_retain_grad(h), EM_OK);
    cr_assert_eq(em_backward(em_sum(em_mul(h, h2), 0, NULL, false)), EM_OK, "%s", em_last_error());
    cr_assert_not_null(em_tensor_grad(h), "retained");
    cr_assert_null(em_tensor_grad(h2), "non-leaf grads are not kept unless asked");
    for (int i = 0; i < 3; i++)
        cr_assert_float_eq(em_test_at(em_tensor_grad(h), i), exp(em_test_at(x, i)), 1e-12);
    em_scope_end();
    em_tensor_release(x);
}

Test(autograd, a_second_backward_through_a_freed_graph_is_an_error) {
    em_tensor *x = leaf(EM_F64, 1, (int64_t[]){3}, 6, 0, 1);
    em_scope_begin();
    em_tensor *y = em_sum(em_mul(x, x), 0, NULL, false);
    cr_assert_eq(em_backward(y), EM_OK);
    cr_assert_eq(em_backward(y), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "backward through the graph a second time");
    cr_assert(strstr(em_last_error(), "'mul'"), "%s", em_last_error());
    /* With retain_graph the second one works and accumulates. */
    em_tensor_set_grad(x, NULL);
    em_tensor *y2 = em_sum(em_mul(x, x), 0, NULL, false);
    em_backward_options keep = {.struct_size = sizeof keep, .retain_graph = true};
    cr_assert_eq(em_backward_with(y2, NULL, &keep), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_backward_with(y2, NULL, NULL), EM_OK, "%s", em_last_error());
    cr_assert_float_eq(grad_at(x, 1), 4 * em_test_at(x, 1), 1e-12);
    em_backward_options hi = {.struct_size = sizeof hi, .create_graph = true};
    cr_assert_eq(em_backward_with(em_sum(x, 0, NULL, false), NULL, &hi), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "create_graph");
    em_scope_end();
    em_tensor_release(x);
}

Test(autograd, modifying_a_saved_tensor_in_place_fails_backward) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){2, 3}, 7, 0, 1);
    em_scope_begin();
    em_tensor *h = em_add(x, x);                  /* a non-leaf */
    em_tensor *y = em_sum(em_mul(h, h), 0, NULL, false); /* mul saves h */
    cr_assert_eq(em_add_(h, em_scalar(1, EM_F64)), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_backward(y), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "modified by an in-place operation");
    cr_assert(strstr(em_last_error(), "'mul'") && strstr(em_last_error(), "shape [2, 3]") &&
              strstr(em_last_error(), "version 2") && strstr(em_last_error(), "saved version 1"),
              "%s", em_last_error());
    em_scope_end();
    em_tensor_release(x);
}

Test(autograd, in_place_ops_on_non_leaves_rewrite_history) {
    /* h = x * 2; h.mul_(w); h.relu_(); y = sum(h): with w > 0, dy/dx = 2w (x > 0),
     * dy/dw = 2x (x > 0). (relu_ then mul_ would fail, as in PyTorch: relu saves its output.) */
    em_tensor *x = em_test_tensor(EM_F64, 1, (int64_t[]){4}, (double[]){-1, 2, -3, 4});
    em_tensor *w = em_test_tensor(EM_F64, 1, (int64_t[]){4}, (double[]){5, 6, 7, 8});
    em_requires_grad_(x, true);
    em_requires_grad_(w, true);
    em_scope_begin();
    em_tensor *h = em_mul(x, em_scalar(2, EM_F64));
    cr_assert_eq(em_mul_(h, w), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(em_tensor_grad_fn_name(h), "mul");
    cr_assert_eq(em_relu_(h), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(em_tensor_grad_fn_name(h), "relu");
    cr_assert_eq(em_backward(em_sum(h, 0, NULL, false)), EM_OK, "%s", em_last_error());
    em_scope_end();
    double xv[4] = {-1, 2, -3, 4}, wv[4] = {5, 6, 7, 8};
    for (int i = 0; i < 4; i++) {
        cr_assert_float_eq(grad_at(x, i), xv[i] > 0 ? 2 * wv[i] : 0, 0);
        cr_assert_float_eq(grad_at(w, i), xv[i] > 0 ? 2 * xv[i] : 0, 0);
    }
    /* In place on a leaf that requires grad, or on a view of one: clear errors. */
    em_scope_begin();
    cr_assert_eq(em_add_(x, em_scalar(1, EM_F64)), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "leaf tensor that requires grad");
    cr_assert_eq(em_relu_(em_narrow(x, 0, 0, 2)), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "relu: a view (shape [2]) of a leaf tensor that requires grad");
    em_scope_end();
    em_tensor_release(x);
    em_tensor_release(w);
}

#define OK_(call) cr_assert_eq((call), EM_OK, "%s", em_last_error())

/* The gradient a leaf receives becomes its .grad without a copy when nothing else holds it:
 * linear's weight (used as a transposed view) and bias included. A hook records where the
 * incoming grad's data lives. */
static em_tensor *note_data(const em_tensor *grad, void *user, bool *failed) {
    (void)failed;
    *(void **)user = em_tensor_data(grad);
    return NULL;
}
Test(autograd, a_leaf_takes_its_gradient_without_a_copy) {
    em_tensor *x = leaf(EM_F32, 2, (int64_t[]){16, 32}, 21, -1, 1);
    em_tensor *w = leaf(EM_F32, 2, (int64_t[]){8, 32}, 22, -1, 1);
    em_tensor *b = leaf(EM_F32, 1, (int64_t[]){8}, 23, -1, 1);
    void *seen[3] = {0};
    em_tensor *ps[3] = {x, w, b};
    for (int i = 0; i < 3; i++) OK_(em_tensor_register_hook(ps[i], note_data, &seen[i]));
    em_scope_begin();
    OK_(em_backward(em_sum(em_relu(em_linear(x, w, b)), 0, NULL, false)));
    em_scope_end();
    for (int i = 0; i < 3; i++) {
        em_tensor *g = em_tensor_grad(ps[i]);
        cr_assert(g && em_tensor_is_contiguous(g), "input %d: a contiguous .grad", i);
        cr_assert_eq(em_tensor_data(g), seen[i], "input %d: the .grad is a copy", i);
    }
    for (int i = 0; i < 3; i++) em_tensor_release(ps[i]);
}

/* ---- in-place ops on views (PyTorch's CopySlices) ------------------------------------------ */

/* h = 1.5 x (2, 4); a = h[:, 1:3] taken first; h[:, 2] *= w; h[0, :] += 1; h[1, 0:2] = 0;
 * returns h * h + sum(a * a) (a sees the change: it is brought up to date). */
static em_tensor *f_view_inplace(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    em_tensor *h = em_mul_scalar(in[0], 1.5);
    em_tensor *a = em_narrow(h, 1, 1, 2);
    OK_(em_mul_(em_select(h, 1, 2), in[1]));
    OK_(em_add_scalar_(em_select(h, 0, 0), 1));
    OK_(em_fill_(em_narrow(em_select(h, 0, 1), 0, 0, 2), 0));
    return em_add(em_mul(h, h), em_sum(em_mul(a, a), 0, NULL, false));
}

/* A buffer that needs no grad gets rows written from x (3) in place: buf[1] = x,
 * buf[0] = 2 x; buf (2, 3) then requires grad. Returns buf * buf. */
static em_tensor *f_copy_into_buffer(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    em_tensor *buf = em_zeros(2, (int64_t[]){2, 3}, EM_F64, em_cpu());
    OK_(em_copy_(em_select(buf, 0, 1), in[0]));
    em_tensor *row0 = em_select(buf, 0, 0);
    OK_(em_copy_(row0, in[0]));
    OK_(em_mul_scalar_(row0, 2));
    return em_mul(buf, buf);
}

Test(autograd, in_place_ops_on_views_update_the_base_history) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){2, 4}, 11, -1, 1);
    em_tensor *w = leaf(EM_F64, 1, (int64_t[]){2}, 12, 0.5, 2);
    em_tensor *in[2] = {x, w};
    cr_assert_eq(em_gradcheck(f_view_inplace, 2, in, NULL, 0, 0, 0), EM_OK, "%s",
                 em_last_error());
    /* A hand-computed case: y = sum(h) with h = 1.5 x, h[:, 2] *= w: dy/dx = 1.5 (1.5 w in
     * column 2), dy/dw = 1.5 x[:, 2]. */
    em_scope_begin();
    em_tensor *h = em_mul_scalar(x, 1.5);
    OK_(em_mul_(em_select(h, 1, 2), w));
    cr_assert_str_eq(em_tensor_grad_fn_name(h), "copy_slices");
    OK_(em_backward(em_sum(h, 0, NULL, false)));
    em_scope_end();
    for (int i = 0; i < 8; i++)
        cr_assert_float_eq(grad_at(x, i), i % 4 == 2 ? 1.5 * em_test_at(w, i / 4) : 1.5, 1e-15);
    for (int i = 0; i < 2; i++)
        cr_assert_float_eq(grad_at(w, i), 1.5 * em_test_at(x, 4 * i + 2), 1e-15);
    em_tensor *v = leaf(EM_F64, 1, (int64_t[]){3}, 13, -1, 1);
    cr_assert_eq(em_gradcheck(f_copy_into_buffer, 1, &v, NULL, 0, 0, 0), EM_OK, "%s",
                 em_last_error());
    em_scope_begin();
    em_tensor *buf = em_zeros(1, (int64_t[]){6}, EM_F64, em_cpu());
    OK_(em_copy_(em_narrow(buf, 0, 1, 3), v));
    cr_assert(em_tensor_requires_grad(buf), "a buffer written from v in place requires grad");
    cr_assert_str_eq(em_tensor_grad_fn_name(buf), "copy_slices");
    em_scope_end();
    em_tensor_release(x);
    em_tensor_release(w);
    em_tensor_release(v);
}

/* Overwriting a non-leaf with a constant (fill_, copy_ of a tensor that needs no grad) cuts its
 * history: no gradient flows to what it was computed from. */
Test(autograd, overwriting_a_non_leaf_with_a_constant_cuts_its_history) {
    em_tensor *x = leaf(EM_F64, 1, (int64_t[]){3}, 14, -1, 1);
    em_scope_begin();
    em_tensor *h = em_mul_scalar(x, 3), *k = em_mul_scalar(x, 2);
    OK_(em_fill_(h, 5));
    OK_(em_copy_(k, em_ones(1, (int64_t[]){3}, EM_F64, em_cpu())));
    em_tensor *y = em_add(em_sum(em_mul(h, x), 0, NULL, false), em_sum(k, 0, NULL, false));
    OK_(em_backward(y));
    em_scope_end();
    for (int i = 0; i < 3; i++) cr_assert_float_eq(grad_at(x, i), 5.0, 1e-15); /* d(h x)/dx = h */
    em_tensor_release(x);
}

Test(autograd, in_place_on_views_errors) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){2, 3}, 15, -1, 1);
    em_scope_begin();
    em_tensor *h = em_mul_scalar(x, 2);
    /* A view made with gradients off, changed in place with them on. */
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_tensor *row = em_select(h, 0, 0);
    em_grad_mode_pop();
    cr_assert_eq(em_mul_scalar_(row, 2), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "mul_scalar: the view (shape [3]) was made with gradients off");
    /* An expanded view cannot be brought up to date after its base changed in place. */
    em_tensor *col = em_narrow(h, 1, 0, 1), *e = em_expand(col, 2, (int64_t[]){2, 4});
    OK_(em_add_scalar_(em_select(h, 0, 0), 1));
    cr_assert_null(em_mul(e, e));
    em_assert_error(EM_ERR_STATE, "an expanded view");
    em_scope_end();
    em_tensor_release(x);
}

Test(autograd, no_grad_detach_and_requires_grad_rules) {
    em_tensor *x = leaf(EM_F32, 1, (int64_t[]){3}, 8, 0, 1);
    em_scope_begin();
    cr_assert_eq(em_grad_mode_push(EM_GRAD_DISABLED), EM_OK);
    em_tensor *y = em_mul(x, x);
    cr_assert(!em_tensor_requires_grad(y) && em_tensor_is_leaf(y), "nothing recorded under no_grad");
    cr_assert_eq(em_grad_mode_push(EM_GRAD_ENABLED), EM_OK);
    cr_assert(em_tensor_requires_grad(em_mul(x, x)), "enable_grad nests inside no_grad");
    cr_assert_eq(em_grad_mode_pop(), EM_OK);
    cr_assert_eq(em_grad_mode_pop(), EM_OK);
    cr_assert_eq(em_grad_mode_pop(), EM_ERR_STATE);
    cr_assert_eq(em_backward(y), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "does not require grad");
    em_tensor *z = em_mul(x, x);
    em_tensor *d = em_detach(z);
    cr_assert(!em_tensor_requires_grad(d) && em_tensor_shares_storage(d, z));
    cr_assert_eq(em_requires_grad_(z, false), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "only leaf tensors can change requires_grad");
    cr_assert_eq(em_requires_grad_(em_arange(0, 3, 1, EM_I64, em_cpu()), true), EM_ERR_DTYPE);
    cr_assert_eq(em_backward(z), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "only for a one-element tensor, this one has shape [3]");
    /* em_backward_with a grad for the non-scalar */
    cr_assert_eq(em_backward_with(z, em_ones(1, (int64_t[]){3}, EM_F32, em_cpu()), NULL), EM_OK,
                 "%s", em_last_error());
    cr_assert_float_eq(grad_at(x, 0), 2 * em_test_at(x, 0), 1e-6);
    /* Inference mode: results can never be saved for backward. */
    em_grad_mode_push(EM_GRAD_INFERENCE);
    em_tensor *inf = em_mul(x, x);
    em_grad_mode_pop();
    cr_assert_null(em_mul(inf, x));
    em_assert_error(EM_ERR_STATE, "EM_GRAD_INFERENCE");
    em_scope_end();
    em_tensor_release(x);
}

Test(autograd, em_grad_returns_grads_without_touching_dot_grad) {
    em_tensor *x = leaf(EM_F64, 1, (int64_t[]){3}, 9, 0, 1);
    em_tensor *w = leaf(EM_F64, 1, (int64_t[]){3}, 10, 0, 1);
    em_scope_begin();
    em_tensor *h = em_mul(x, w);
    em_tensor *y = em_sum(em_mul(h, h), 0, NULL, false);
    em_tensor *ins[2] = {x, h}, *gs[2];
    cr_assert_eq(em_grad(1, &y, NULL, 2, ins, gs, NULL), EM_OK, "%s", em_last_error());
    cr_assert_null(em_tensor_grad(x));
    cr_assert_null(em_tensor_grad(w));
    for (int i = 0; i < 3; i++) {
        double hv = em_test_at(h, i), wv = em_test_at(w, i);
        cr_assert_float_eq(em_test_at(gs[0], i), 2 * hv * wv, 1e-12);
        cr_assert_float_eq(em_test_at(gs[1], i), 2 * hv, 1e-12);
    }
    em_scope_end();
    em_tensor_release(x);
    em_tensor_release(w);
}

static em_tensor *halve(const em_tensor *g, void *user, bool *failed) {
    (void)failed;
    (*(int *)user)++;
    return em_mul(g, em_scalar(0.5, em_tensor_dtype(g)));
}

Test(autograd, hooks_inspect_and_replace_grads) {
    em_tensor *x = leaf(EM_F64, 1, (int64_t[]){2}, 11, 1, 2);
    int calls = 0;
    cr_assert_eq(em_tensor_register_hook(x, halve, &calls), EM_OK);
    em_scope_begin();
    em_tensor *h = em_mul(x, em_scalar(4, EM_F64));
    cr_assert_eq(em_tensor_register_hook(h, halve, &calls), EM_OK);
    cr_assert_eq(em_backward(em_sum(h, 0, NULL, false)), EM_OK, "%s", em_last_error());
    em_scope_end();
    cr_assert_eq(calls, 2);
    cr_assert_float_eq(grad_at(x, 0), 4 * 0.5 * 0.5, 0, "both hooks halved the grad");
    em_tensor_release(x);
}

/* What a post-accumulation hook saw: how often it ran and the .grad at that moment. */
typedef struct post_seen {
    int calls;
    double grad0;
    em_tensor *t;
} post_seen;

static em_status note_post(em_tensor *t, void *user) {
    post_seen *p = user;
    p->calls++;
    p->t = t;
    p->grad0 = em_test_at(em_tensor_grad(t), 0);
    return EM_OK;
}

static em_status failing_post(em_tensor *t, void *user) {
    (void)t, (void)user;
    return em_set_error(EM_ERR_IO, "post hook says no");
}

/* The post-accumulation hook runs once per backward, after every contribution: w is used
 * three times (twice through one mul, once more through a separate path), and the hook sees
 * the finished sum; a leaf the loss does not reach gets no call; em_grad calls none. */
Test(autograd, post_accumulate_hooks_run_once_after_every_contribution) {
    em_tensor *w = leaf(EM_F64, 1, (int64_t[]){2}, 12, 3, 5);
    em_tensor *unused = leaf(EM_F64, 1, (int64_t[]){2}, 13, 1, 1);
    post_seen pw = {0}, pu = {0};
    cr_assert_eq(em_tensor_register_post_accumulate_hook(w, note_post, &pw), EM_OK);
    cr_assert_eq(em_tensor_register_post_accumulate_hook(unused, note_post, &pu), EM_OK);
    em_scope_begin();
    double w0 = em_test_at(w, 0);
    /* loss = sum(w * w) + sum(3 w): d/dw0 = 2 w0 + 3, from three contributions */
    em_tensor *loss = em_add(em_sum(em_mul(w, w), 0, NULL, false),
                             em_sum(em_mul(w, em_scalar(3, EM_F64)), 0, NULL, false));
    cr_assert_eq(em_backward(loss), EM_OK, "%s", em_last_error());
    cr_assert_eq(pw.calls, 1, "the hook ran %d times", pw.calls);
    cr_assert_eq(pw.t, w);
    cr_assert_float_eq(pw.grad0, 2 * w0 + 3, 1e-12, "the hook saw a partial gradient");
    cr_assert_eq(pu.calls, 0, "a leaf outside the graph got a call");
    /* a second backward: once more, with the accumulated .grad */
    em_tensor *l2 = em_sum(em_mul(w, em_scalar(2, EM_F64)), 0, NULL, false);
    cr_assert_eq(em_backward(l2), EM_OK, "%s", em_last_error());
    cr_assert_eq(pw.calls, 2);
    cr_assert_float_eq(pw.grad0, 2 * w0 + 3 + 2, 1e-12);
    /* em_grad accumulates nothing: no call */
    em_tensor *g = NULL;
    em_tensor *l3 = em_sum(em_mul(w, w), 0, NULL, false);
    cr_assert_eq(em_grad(1, &l3, NULL, 1, &w, &g, NULL), EM_OK, "%s", em_last_error());
    em_tensor_release(g);
    cr_assert_eq(pw.calls, 2);
    /* removal, and a failing hook fails the backward with its message */
    cr_assert_eq(em_tensor_remove_post_accumulate_hook(w, note_post, &pw), EM_OK);
    cr_assert_eq(em_tensor_remove_post_accumulate_hook(w, note_post, &pw), EM_ERR_NOTFOUND);
    cr_assert_eq(em_tensor_register_post_accumulate_hook(w, failing_post, NULL), EM_OK);
    cr_assert_eq(em_backward(em_sum(em_mul(w, w), 0, NULL, false)), EM_ERR_IO);
    cr_assert(strstr(em_last_error(), "post hook says no"), "%s", em_last_error());
    cr_assert_eq(pw.calls, 2);
    /* only leaves that require grad */
    cr_assert_eq(em_tensor_register_post_accumulate_hook(loss, note_post, &pw), EM_ERR_STATE);
    em_scope_end();
    em_tensor_release(w);
    em_tensor_release(unused);
}

/* A program's op declared without a derivative (and without EM_OP_NONDIFF): y = 2x, f64. */
static em_status twice_kernel(const em_kernel_ctx *k) {
    const double *x = k->in[0].data;
    double *y = k->out[0].data;
    for (int64_t i = 0; i < k->out[0].numel; i++) y[i] = 2 * x[i];
    return EM_OK;
}
static bool twice_supports(const em_kernel_ctx *k) { return k->in[0].contiguous; }

Test(autograd, an_op_without_a_derivative_is_a_hard_error) {
    em_op_schema s = {.struct_size = sizeof s, .name = "test.twice", .n_inputs = 1,
                      .n_outputs = 1, .dispatch_arg = 0, .infer = em_test_infer_same};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    em_kernel_def k = {.struct_size = sizeof k, .op = "test.twice", .device_type = "cpu",
                       .dtype = EM_F64, .fn = twice_kernel, .supports = twice_supports,
                       .name = "test_twice_f64"};
    cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                 em_last_error());
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){3, 2}, 12, 0, 1);
    em_scope_begin();
    em_tensor *y = NULL;
    const em_tensor *in[1] = {x};
    cr_assert_eq(em_op_call(op, in, 1, NULL, &y), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(em_tensor_grad_fn_name(y), "test.twice", "it runs forward and records");
    cr_assert_eq(em_backward(em_sum(y, 0, NULL, false)), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "op 'test.twice' declares no derivative");
    em_scope_end();
    em_tensor_release(x);
}

Test(autograd, anomaly_mode_names_the_op_that_made_the_nan) {
    em_set_anomaly(true);
    em_tensor *x = em_test_tensor(EM_F64, 1, (int64_t[]){3}, (double[]){1, -1, 2});
    em_tensor *z = em_test_tensor(EM_F64, 1, (int64_t[]){2}, (double[]){0.5, 0});
    em_requires_grad_(x, true);
    em_requires_grad_(z, true);
    em_scope_begin();
    em_tensor *y = em_log(em_mul(x, em_scalar(2, EM_F64)));
    cr_assert_null(y);
    em_assert_error(EM_ERR_RANGE, "anomaly: log produced NaN at element 1");
    cr_assert(strstr(em_last_error(), "forward") && strstr(em_last_error(), "mul"), "%s",
              em_last_error());
    /* float32 too (the check converts to f64 through an op, which must not be the one
     * blamed), and an infinity in the forward pass is no anomaly (a -inf mask). */
    em_tensor *inf = em_full(1, (int64_t[]){2}, INFINITY, EM_F32, em_cpu());
    cr_assert_not_null(inf, "%s", em_last_error());
    em_tensor *mask = em_test_tensor(EM_BOOL, 1, (int64_t[]){2}, (double[]){1, 0});
    em_tensor *masked = em_masked_fill(em_ones(1, (int64_t[]){2}, EM_F32, em_cpu()), mask,
                                       -INFINITY);
    cr_assert_not_null(masked, "%s", em_last_error());
    cr_assert_null(em_sub(inf, inf));
    em_assert_error(EM_ERR_RANGE, "anomaly: sub produced NaN at element 0");
    /* Backward: sqrt-free way to a NaN gradient: d/dx log(x) at x = 0 is inf. */
    em_set_anomaly(false);
    em_tensor *l = em_sum(em_mul(em_log(z), em_scalar(0, EM_F64)), 0, NULL, false);
    em_set_anomaly(true);
    cr_assert_eq(em_backward(l), EM_ERR_RANGE);
    em_assert_error(EM_ERR_RANGE, "the backward of 'log' produced");
    em_scope_end();
    em_set_anomaly(false);
    em_tensor_release(x);
    em_tensor_release(z);
}

Test(autograd, graph_dump_writes_dot) {
    em_tensor *x = leaf(EM_F32, 2, (int64_t[]){2, 3}, 13, 0, 1);
    em_scope_begin();
    em_tensor *y = em_sum(em_exp(em_matmul(x, em_transpose(x, 0, 1))), 0, NULL, false);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(em_graph_dump(y, f), EM_OK, "%s", em_last_error());
    fclose(f);
    cr_assert(strstr(text, "digraph") && strstr(text, "bmm") && strstr(text, "exp") &&
              strstr(text, "permute") && strstr(text, "leaf [2, 3] float32"), "%s", text);
    cr_assert(strstr(text, "saved 16 bytes"), "exp saves its [2, 2] f32 output: %s", text);
    free(text);
    em_scope_end();
    em_tensor_release(x);
}

/* ---- finite differences ---------------------------------------------------------------------- */

typedef em_tensor *(*fn2)(em_tensor *const *in, int n, void *user);

static em_tensor *f_arith(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* broadcast (3,1) with (4); non-contiguous via transpose */
    em_tensor *a = in[0], *b = in[1];
    em_tensor *t = em_add(em_mul(a, b), em_div(a, em_add(b, em_scalar(3, EM_F64))));
    return em_sub(em_exp(em_neg(t)), em_log(em_add(em_mul(b, b), em_scalar(1, EM_F64))));
}
static em_tensor *f_matmul(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    em_tensor *a = in[0], *b = in[1]; /* (2,3,4) x (4,5)^T-ish via transpose of (5,4) */
    return em_relu(em_matmul(a, em_transpose(b, 0, 1)));
}
static em_tensor *f_reduce(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_mean(em_sum(em_mul(in[0], in[0]), 1, (int[]){1}, true), 1, (int[]){0}, false);
}
static em_tensor *f_views(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    em_tensor *x = in[0]; /* (3, 4, 2) */
    em_tensor *v = em_reshape(em_permute(x, 3, (int[]){2, 0, 1}), 2, (int64_t[]){2, 12});
    em_tensor *s = em_slice(em_select(x, 1, 1), 0, 0, 3, 2); /* (2, 2) */
    em_tensor *e = em_expand(em_unsqueeze(em_squeeze_all(em_narrow(x, 0, 1, 1)), 0),
                             3, (int64_t[]){2, 4, 2});
    return em_add(em_sum(em_mul(v, v), 0, NULL, false),
                  em_add(em_sum(s, 0, NULL, false), em_sum(em_mul(e, e), 0, NULL, false)));
}
static em_tensor *f_dtype(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user; /* through f32 and back: gradients convert too */
    return em_to_dtype(em_mul(em_to_dtype(in[0], EM_F32), em_scalar(2, EM_F32)), EM_F64);
}

Test(gradcheck, elementwise_with_broadcasting) {
    em_tensor *a = leaf(EM_F64, 2, (int64_t[]){3, 1}, 20, -1, 1);
    em_tensor *b = leaf(EM_F64, 1, (int64_t[]){4}, 21, 0.5, 1.5);
    em_tensor *in[2] = {a, b};
    cr_assert_eq(em_gradcheck(f_arith, 2, in, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    em_tensor_release(a);
    em_tensor_release(b);
}

Test(gradcheck, batched_matmul_with_a_transposed_operand) {
    em_tensor *a = leaf(EM_F64, 3, (int64_t[]){2, 3, 4}, 22, -1, 1);
    em_tensor *b = leaf(EM_F64, 2, (int64_t[]){5, 4}, 23, -1, 1);
    em_tensor *in[2] = {a, b};
    cr_assert_eq(em_gradcheck(f_matmul, 2, in, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    em_tensor_release(a);
    em_tensor_release(b);
}

Test(gradcheck, reductions_views_and_dtype_conversion) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){3, 4}, 24, -1, 1);
    cr_assert_eq(em_gradcheck(f_reduce, 1, &x, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    em_tensor *y = leaf(EM_F64, 3, (int64_t[]){3, 4, 2}, 25, -1, 1);
    cr_assert_eq(em_gradcheck(f_views, 1, &y, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_gradcheck(f_dtype, 1, &x, NULL, 1e-3, 1e-4, 1e-3), EM_OK, "%s",
                 em_last_error());
    em_tensor_release(x);
    em_tensor_release(y);
}

static em_tensor *f_relu(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_relu(in[0]);
}

/* Finite differences in float32 or half are rounding noise: em_gradcheck refuses such inputs
 * and names the conversion to make; an input that needs no grad may keep its dtype. */
Test(gradcheck, low_precision_inputs_are_refused_with_the_fix) {
    const em_dtype dts[] = {EM_F32, EM_F16, EM_BF16};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        em_tensor *x = em_full(1, (int64_t[]){3}, 0.5, dts[k], em_cpu());
        em_tensor *c = em_ones(1, (int64_t[]){3}, EM_F64, em_cpu());
        cr_assert(x && c, "%s", em_last_error());
        cr_assert_eq(em_requires_grad_(x, true), EM_OK, "%s", em_last_error());
        em_tensor *in[2] = {c, x};
        cr_assert_eq(em_gradcheck(f_arith, 2, in, NULL, 0, 0, 0), EM_ERR_DTYPE, "%s",
                     em_dtype_name(dts[k]));
        char want[96];
        snprintf(want, sizeof want, "gradcheck: input 1 is %s: finite differences need float64",
                 em_dtype_name(dts[k]));
        cr_assert(strstr(em_last_error(), want) && strstr(em_last_error(),
                  "em_to_dtype(x, EM_F64)"), "%s", em_last_error());
        em_tensor_release(x);
        em_tensor_release(c);
    }
    /* a float32 input that requires no grad is fine next to a float64 one that does */
    em_tensor *a = leaf(EM_F64, 2, (int64_t[]){3, 1}, 41, -1, 1);
    em_tensor *b = em_full(1, (int64_t[]){4}, 0.75, EM_F32, em_cpu());
    cr_assert(b, "%s", em_last_error());
    em_tensor *in[2] = {a, b};
    cr_assert_eq(em_gradcheck(f_arith, 2, in, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    em_tensor_release(a);
    em_tensor_release(b);
}

Test(gradcheck, a_wrong_gradient_is_reported) {
    /* At x = 0 relu's backward gives 0 while the central difference gives 0.5: the check must
     * fail and say where. */
    em_tensor *z = em_zeros(1, (int64_t[]){2}, EM_F64, em_cpu());
    em_requires_grad_(z, true);
    cr_assert_eq(em_gradcheck(f_relu, 1, &z, NULL, 0, 0, 0), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "gradcheck: input 0, element 0: analytical 0 vs numerical");
    em_tensor_release(z);
}

/* ---- f32 backward agrees with f64 backward --------------------------------------------------- */

static void grads_of(em_dtype dt, em_tensor **ga, em_tensor **gb) {
    em_tensor *a = leaf(EM_F64, 2, (int64_t[]){3, 1}, 30, -1, 1);
    em_tensor *b = leaf(EM_F64, 1, (int64_t[]){4}, 31, 0.5, 1.5);
    em_tensor *m1 = leaf(EM_F64, 3, (int64_t[]){2, 3, 4}, 32, -1, 1);
    em_tensor *m2 = leaf(EM_F64, 2, (int64_t[]){5, 4}, 33, -1, 1);
    em_scope_begin();
    em_tensor *ca = em_detach(em_to_dtype(a, dt)), *cb = em_detach(em_to_dtype(b, dt));
    em_tensor *c1 = em_detach(em_to_dtype(m1, dt)), *c2 = em_detach(em_to_dtype(m2, dt));
    em_tensor *all[4] = {ca, cb, c1, c2};
    for (int i = 0; i < 4; i++) em_requires_grad_(all[i], true);
    em_tensor *in[2] = {ca, cb}, *min[2] = {c1, c2};
    em_tensor *y = em_add(em_sum(f_arith(in, 2, NULL), 0, NULL, false),
                          em_sum(f_matmul(min, 2, NULL), 0, NULL, false));
    cr_assert_eq(em_backward(y), EM_OK, "%s", em_last_error());
    *ga = em_keep(em_to_dtype(em_tensor_grad(ca), EM_F64));
    *gb = em_keep(em_to_dtype(em_tensor_grad(c1), EM_F64));
    em_scope_end();
    em_tensor *l[4] = {a, b, m1, m2};
    for (int i = 0; i < 4; i++) em_tensor_release(l[i]);
}

Test(gradcheck, f32_backward_matches_f64_backward) {
    em_tensor *a32, *m32, *a64, *m64;
    grads_of(EM_F32, &a32, &m32);
    grads_of(EM_F64, &a64, &m64);
    for (int64_t i = 0; i < em_tensor_numel(a64); i++) {
        double x = em_test_at(a32, i), r = em_test_at(a64, i);
        cr_assert(fabs(x - r) <= 1e-5 + 1e-4 * fabs(r), "a[%lld]: %g vs %g", (long long)i, x, r);
    }
    for (int64_t i = 0; i < em_tensor_numel(m64); i++) {
        double x = em_test_at(m32, i), r = em_test_at(m64, i);
        cr_assert(fabs(x - r) <= 1e-5 + 1e-4 * fabs(r), "m[%lld]: %g vs %g", (long long)i, x, r);
    }
    em_tensor *l[4] = {a32, m32, a64, m64};
    for (int i = 0; i < 4; i++) em_tensor_release(l[i]);
}

/* ---- a long loop holds memory flat ------------------------------------------------------------- */

Test(autograd, ten_thousand_steps_of_an_mlp_hold_memory_flat) {
    /* 64-32-10, batch 16, squared error, plain SGD; allocator stats after step 10 and 10,000
     * must be equal. */
    em_tensor *w1 = leaf(EM_F32, 2, (int64_t[]){64, 32}, 40, -0.1, 0.1);
    em_tensor *b1 = leaf(EM_F32, 1, (int64_t[]){32}, 41, -0.1, 0.1);
    em_tensor *w2 = leaf(EM_F32, 2, (int64_t[]){32, 10}, 42, -0.1, 0.1);
    em_tensor *x = leaf(EM_F32, 2, (int64_t[]){16, 64}, 43, -1, 1);
    em_requires_grad_(x, false);
    em_tensor *t = leaf(EM_F32, 2, (int64_t[]){16, 10}, 44, -1, 1);
    em_requires_grad_(t, false);
    em_tensor *params[3] = {w1, b1, w2};
    em_tensor *lr = em_scalar(0.01, EM_F32);
    em_memory_stats at10 = {0}, end;
    double first = 0, last = 0;
    for (int step = 1; step <= 10000; step++) {
        em_scope_begin();
        em_tensor *h = em_relu(em_add(em_matmul(x, w1), b1));
        em_tensor *d = em_sub(em_matmul(h, w2), t);
        em_tensor *loss = em_mean(em_mul(d, d), 0, NULL, false);
        cr_assert_eq(em_backward(loss), EM_OK, "step %d: %s", step, em_last_error());
        double v = em_item(loss);
        if (step == 1) first = v;
        last = v;
        em_grad_mode_push(EM_GRAD_DISABLED);
        for (int p = 0; p < 3; p++) {
            cr_assert_eq(em_sub_(params[p], em_mul(em_tensor_grad(params[p]), lr)), EM_OK);
            em_tensor_set_grad(params[p], NULL);
        }
        em_grad_mode_pop();
        em_scope_end();
        if (step == 10) em_memory_stats_get(em_cpu(), &at10);
    }
    em_memory_stats_get(em_cpu(), &end);
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
        cr_assert_eq(end.current[c], at10.current[c], "category %s: %zu at step 10, %zu at the end",
                     em_mem_category_name(c), at10.current[c], end.current[c]);
    cr_assert_eq(end.reserved, at10.reserved);
    cr_assert_lt(last, first * 0.5, "the loss went down: %g -> %g", first, last);
    em_tensor *l[6] = {w1, b1, w2, x, t, lr};
    for (int i = 0; i < 6; i++) em_tensor_release(l[i]);
}

Test(autograd, ten_thousand_steps_with_cross_entropy_hold_memory_flat) {
    /* The same loop as a classifier is trained: linear 64->32, ReLU, linear 32->10,
     * cross_entropy (mean) against int64 labels, plain SGD; allocator stats after step 10 and
     * 10,000 must be equal. */
    em_tensor *w1 = leaf(EM_F32, 2, (int64_t[]){32, 64}, 60, -0.125, 0.125);
    em_tensor *b1 = leaf(EM_F32, 1, (int64_t[]){32}, 61, -0.125, 0.125);
    em_tensor *w2 = leaf(EM_F32, 2, (int64_t[]){10, 32}, 62, -0.18, 0.18);
    em_tensor *b2 = leaf(EM_F32, 1, (int64_t[]){10}, 63, -0.18, 0.18);
    em_tensor *x = leaf(EM_F32, 2, (int64_t[]){16, 64}, 64, -1, 1);
    em_requires_grad_(x, false);
    em_tensor *y = em_test_tensor(EM_I64, 1, (int64_t[]){16},
                                  (double[]){3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3});
    em_tensor *params[4] = {w1, b1, w2, b2};
    em_tensor *lr = em_scalar(0.05, EM_F32);
    em_memory_stats at10 = {0}, end;
    double first = 0, last = 0;
    for (int step = 1; step <= 10000; step++) {
        em_scope_begin();
        em_tensor *h = em_relu(em_linear(x, w1, b1));
        em_tensor *loss = em_cross_entropy(em_linear(h, w2, b2), y, NULL, EM_REDUCTION_MEAN, -100,
                                           0);
        cr_assert_eq(em_backward(loss), EM_OK, "step %d: %s", step, em_last_error());
        double v = em_item(loss);
        if (step == 1) first = v;
        last = v;
        em_grad_mode_push(EM_GRAD_DISABLED);
        for (int p = 0; p < 4; p++) {
            cr_assert_eq(em_sub_(params[p], em_mul(em_tensor_grad(params[p]), lr)), EM_OK);
            em_tensor_set_grad(params[p], NULL);
        }
        em_grad_mode_pop();
        em_scope_end();
        if (step == 10) em_memory_stats_get(em_cpu(), &at10);
    }
    em_memory_stats_get(em_cpu(), &end);
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
        cr_assert_eq(end.current[c], at10.current[c], "category %s: %zu at step 10, %zu at the end",
                     em_mem_category_name(c), at10.current[c], end.current[c]);
    cr_assert_eq(end.reserved, at10.reserved);
    /* 16 samples and 2,000+ parameters: the net memorises the batch. */
    cr_assert_lt(last, 0.01, "the loss went down: %g -> %g", first, last);
    em_tensor *l[7] = {w1, b1, w2, b2, x, y, lr};
    for (int i = 0; i < 7; i++) em_tensor_release(l[i]);
}

/* ---- losses ----------------------------------------------------------------------------------- */

typedef struct loss_case {
    em_tensor *target, *weight, *pos_weight;
    int which;
} loss_case;

static em_tensor *f_loss(em_tensor *const *in, int n, void *user) {
    (void)n;
    const loss_case *c = user;
    em_tensor *x = em_transpose(in[0], 0, 1); /* a non-contiguous input: (4, 3) */
    switch (c->which) {
    case 0: return em_cross_entropy(x, c->target, c->weight, EM_REDUCTION_MEAN, 2, 0.1);
    case 1: return em_cross_entropy(x, c->target, NULL, EM_REDUCTION_SUM, -100, 0);
    case 2: return em_nll_loss(em_neg(em_exp(x)), c->target, c->weight, EM_REDUCTION_MEAN, -100);
    case 3: return em_mse_loss(x, c->target, EM_REDUCTION_MEAN);
    case 4: return em_l1_loss(x, c->target, EM_REDUCTION_SUM);
    case 5: return em_smooth_l1_loss(x, c->target, EM_REDUCTION_MEAN, 0.5);
    default: return em_binary_cross_entropy_with_logits(x, c->target, c->weight, c->pos_weight,
                                                        EM_REDUCTION_MEAN);
    }
}

Test(gradcheck, every_loss_through_its_backward_op) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){3, 4}, 50, -2, 2); /* used as (4, 3) */
    em_tensor *idx = em_test_tensor(EM_I64, 1, (int64_t[]){4}, (double[]){0, 2, 1, 2});
    em_tensor *w = em_test_tensor(EM_F64, 1, (int64_t[]){3}, (double[]){0.5, 2, 1});
    em_tensor *probs = em_test_tensor(EM_F64, 2, (int64_t[]){4, 3},
                                      (double[]){0.2, 0.3, 0.5, 1, 0, 0, 0.1, 0.1, 0.8, 0, 0.5, 0.5});
    em_tensor *real = leaf(EM_F64, 2, (int64_t[]){4, 3}, 51, -2, 2);
    em_requires_grad_(real, false);
    em_tensor *bin = em_test_tensor(EM_F64, 2, (int64_t[]){4, 3},
                                    (double[]){1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0});
    em_tensor *pw = em_test_tensor(EM_F64, 1, (int64_t[]){3}, (double[]){1.5, 0.5, 3});
    loss_case cases[] = {{idx, w, NULL, 0},  {probs, NULL, NULL, 1}, {idx, w, NULL, 2},
                         {real, NULL, NULL, 3}, {real, NULL, NULL, 4}, {real, NULL, NULL, 5},
                         {bin, NULL, pw, 6}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        cr_assert_eq(em_gradcheck(f_loss, 1, &x, &cases[k], 0, 0, 0), EM_OK, "loss case %zu: %s",
                     k, em_last_error());
    em_tensor *all[] = {x, idx, w, probs, real, bin, pw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

static em_tensor *f_linear(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    /* y = linear(x (2, 3, 4), w (5, 4), b (5)) -> (2, 3, 5);
     * z = addmm(c (4), y[1] (3, 5), w (5, 4), beta 0.5, alpha 2) -> (3, 4) */
    em_tensor *y = em_linear(in[0], in[1], in[2]);
    return em_addmm(in[3], em_select(y, 0, 1), in[1], 0.5, 2.0);
}

Test(gradcheck, linear_and_addmm) {
    em_tensor *x = leaf(EM_F64, 3, (int64_t[]){2, 3, 4}, 60, -1, 1);
    em_tensor *w = leaf(EM_F64, 2, (int64_t[]){5, 4}, 61, -1, 1);
    em_tensor *b = leaf(EM_F64, 1, (int64_t[]){5}, 62, -1, 1);
    em_tensor *c = leaf(EM_F64, 1, (int64_t[]){4}, 63, -1, 1);
    em_tensor *in[4] = {x, w, b, c};
    cr_assert_eq(em_gradcheck(f_linear, 4, in, NULL, 0, 0, 0), EM_OK, "%s", em_last_error());
    for (int i = 0; i < 4; i++) em_tensor_release(in[i]);
}

/* ---- reductions -------------------------------------------------------------------------------- */

static em_tensor *f_reductions(em_tensor *const *in, int n, void *user) {
    (void)n;
    int which = *(const int *)user;
    em_tensor *x = em_transpose(in[0], 0, 1); /* (4, 3), non-contiguous */
    int d1[1] = {1}, d0[1] = {0};
    em_tensor *v = NULL, *i = NULL;
    switch (which) {
    case 0: return em_amax(x, 1, d1, false);
    case 1: return em_amin(x, 0, NULL, true);
    case 2: em_max_dim(x, 0, false, &v, &i); return v;
    case 3: em_min_dim(x, 1, true, &v, &i); return v;
    case 4: return em_var(x, 1, d0, 1, false);
    case 5: return em_std(x, 0, NULL, 0, true);
    case 6: return em_logsumexp(x, 1, d1, false);
    case 7: return em_norm(x, 2, 1, d1, false);
    case 8: return em_norm(x, 1, 0, NULL, false);
    case 9: return em_norm(x, 3, 1, d0, true);
    case 10: return em_norm(x, INFINITY, 1, d1, false);
    default: return em_prod(x, 1, d1, false);
    }
}

Test(gradcheck, reductions_with_indices_norms_and_products) {
    /* Distinct values (no ties), away from 0 except where zeros are the point. */
    double vals[12] = {0.3, -1.2, 0.7, 1.9, -0.4, 1.1, -1.6, 0.5, 1.4, -0.9, 0.2, -1.3};
    em_tensor *x = em_test_tensor(EM_F64, 2, (int64_t[]){3, 4}, vals);
    em_requires_grad_(x, true);
    for (int k = 0; k <= 11; k++)
        cr_assert_eq(em_gradcheck(f_reductions, 1, &x, &k, 0, 0, 0), EM_OK, "reduction %d: %s", k,
                     em_last_error());
    em_tensor_release(x);
    /* prod with one zero and with two zeros in a row: the exact subgradients. */
    double z[12] = {0.3, 0, 0.7, 1.9, -0.4, 0, 1.1, 0, 1.4, -0.9, 0.2, -1.3};
    em_tensor *xz = em_test_tensor(EM_F64, 2, (int64_t[]){3, 4}, z);
    em_requires_grad_(xz, true);
    int k = 11;
    cr_assert_eq(em_gradcheck(f_reductions, 1, &xz, &k, 0, 0, 0), EM_OK, "prod with zeros: %s",
                 em_last_error());
    em_tensor_release(xz);
}

Test(autograd, amax_shares_the_grad_among_ties_like_pytorch) {
    em_tensor *x = em_test_tensor(EM_F64, 1, (int64_t[]){4}, (double[]){2, 5, 5, 1});
    em_requires_grad_(x, true);
    em_scope_begin();
    cr_assert_eq(em_backward(em_amax(x, 0, NULL, false)), EM_OK, "%s", em_last_error());
    em_scope_end();
    double want[4] = {0, 0.5, 0.5, 0};
    for (int i = 0; i < 4; i++) cr_assert_float_eq(grad_at(x, i), want[i], 0);
    em_tensor_release(x);
}

/* ---- f32 backward agrees with f64 backward: losses and reductions ------------------------------- */

/* Gradient of sum(fn(x)) for x converted to dt, returned as f64 (kept out of any scope). */
static em_tensor *grad_in_dtype(em_gradcheck_fn fn, void *user, const em_tensor *x64, em_dtype dt) {
    em_scope_begin();
    em_tensor *x = em_detach(em_to_dtype(x64, dt));
    em_requires_grad_(x, true);
    em_tensor *y = fn(&x, 1, user);
    cr_assert_not_null(y, "%s", em_last_error());
    cr_assert_eq(em_backward(em_sum(em_to_dtype(y, EM_F64), 0, NULL, false)), EM_OK, "%s",
                 em_last_error());
    em_tensor *g = em_keep(em_to_dtype(em_tensor_grad(x), EM_F64));
    em_scope_end();
    return g;
}

static void expect_f32_matches_f64(em_gradcheck_fn fn, void *user, const em_tensor *x64,
                                   const char *what) {
    em_tensor *g32 = grad_in_dtype(fn, user, x64, EM_F32), *g64 = grad_in_dtype(fn, user, x64, EM_F64);
    for (int64_t i = 0; i < em_tensor_numel(g64); i++) {
        double a = em_test_at(g32, i), b = em_test_at(g64, i);
        cr_assert(fabs(a - b) <= 1e-5 + 1e-4 * fabs(b), "%s: element %lld: f32 %g vs f64 %g", what,
                  (long long)i, a, b);
    }
    em_tensor_release(g32);
    em_tensor_release(g64);
}

Test(gradcheck, f32_backward_matches_f64_for_losses_and_reductions) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){3, 4}, 70, -2, 2);
    em_tensor *idx = em_test_tensor(EM_I64, 1, (int64_t[]){4}, (double[]){0, 2, 1, 2});
    em_tensor *w = em_test_tensor(EM_F64, 1, (int64_t[]){3}, (double[]){0.5, 2, 1});
    em_tensor *real = leaf(EM_F64, 2, (int64_t[]){4, 3}, 71, -2, 2);
    em_requires_grad_(real, false);
    em_tensor *bin = em_test_tensor(EM_F64, 2, (int64_t[]){4, 3},
                                    (double[]){1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0});
    em_tensor *pw = em_test_tensor(EM_F64, 1, (int64_t[]){3}, (double[]){1.5, 0.5, 3});
    /* The f32 run needs f32 weights and targets: one case set per dtype. */
    for (int k = 0; k <= 6; k++) {
        if (k == 1) continue; /* probability targets: covered by gradcheck above */
        char what[32];
        snprintf(what, sizeof what, "loss case %d", k);
        em_scope_begin();
        loss_case c32 = {k == 6 ? em_to_dtype(bin, EM_F32) : k >= 3 ? em_to_dtype(real, EM_F32) : idx,
                         k == 0 || k == 2 ? em_to_dtype(w, EM_F32) : NULL,
                         k == 6 ? em_to_dtype(pw, EM_F32) : NULL, k};
        loss_case c64 = {k == 6 ? bin : k >= 3 ? real : idx, k == 0 || k == 2 ? w : NULL,
                         k == 6 ? pw : NULL, k};
        em_tensor *g32 = grad_in_dtype(f_loss, &c32, x, EM_F32);
        em_tensor *g64 = grad_in_dtype(f_loss, &c64, x, EM_F64);
        for (int64_t i = 0; i < em_tensor_numel(g64); i++) {
            double a = em_test_at(g32, i), b = em_test_at(g64, i);
            cr_assert(fabs(a - b) <= 1e-5 + 1e-4 * fabs(b), "%s: element %lld: f32 %g vs f64 %g",
                      what, (long long)i, a, b);
        }
        em_scope_end(); /* g32, g64 were kept into this scope */
    }
    double vals[12] = {0.3, -1.2, 0.7, 1.9, -0.4, 1.1, -1.6, 0.5, 1.4, -0.9, 0.2, -1.3};
    em_tensor *xr = em_test_tensor(EM_F64, 2, (int64_t[]){3, 4}, vals);
    for (int k = 0; k <= 11; k++) {
        char what[32];
        snprintf(what, sizeof what, "reduction %d", k);
        expect_f32_matches_f64(f_reductions, &k, xr, what);
    }
    em_tensor *all[] = {x, idx, w, real, bin, pw, xr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

typedef struct data_case {
    em_tensor *idx2, *idx1, *mask, *emb_idx;
    int which;
} data_case;

/* Data-movement ops on x (3, 4), weighted by a fixed non-uniform factor so every position's
 * grad differs. */
static em_tensor *f_data(em_tensor *const *in, int n, void *user) {
    (void)n;
    const data_case *c = user;
    em_tensor *x = in[0];
    em_dtype dt = em_tensor_dtype(x);
    em_tensor *y = NULL;
    switch (c->which) {
    case 0: y = em_gather(x, 1, c->idx2); break;
    case 1: y = em_scatter_add(x, 1, c->idx2, em_mul_scalar(em_gather(x, 1, c->idx2), 2)); break;
    case 2: y = em_index_add(x, 0, c->idx1, em_narrow(x, 0, 0, 2), 1.5); break;
    case 3: y = em_embedding(x, c->emb_idx, EM_PADDING_IDX_NONE); break; /* a padding row gets no grad by design */
    case 4: y = em_masked_fill(x, c->mask, 0.25); break;
    case 5: y = em_tril(x, 1); break;
    case 6: y = em_flip(x, 2, (int[]){0, 1}); break;
    case 7: y = em_cat(2, (const em_tensor *const[]){x, em_transpose(em_narrow(x, 1, 0, 3), 0, 1)}, 1); break;
    case 8: y = em_pad(x, 2, (int64_t[]){1, 2}, 0.5); break;
    default: y = em_index_select(x, 1, c->idx1); break;
    }
    if (!y) return NULL;
    em_tensor *wgt = em_arange(1, 1 + (double)em_tensor_numel(y), 1, dt, em_cpu());
    return em_mul(y, em_reshape(em_sqrt(wgt), em_tensor_ndim(y), em_tensor_shape(y)));
}

Test(gradcheck, data_movement_in_f64_and_f32_agrees_with_f64) {
    em_tensor *x = leaf(EM_F64, 2, (int64_t[]){3, 4}, 80, -1, 1);
    data_case c = {
        .idx2 = em_test_tensor(EM_I64, 2, (int64_t[]){3, 2}, (double[]){0, 3, 1, 1, 2, 0}),
        .idx1 = em_test_tensor(EM_I64, 1, (int64_t[]){2}, (double[]){2, 0}),
        .mask = em_test_tensor(EM_BOOL, 2, (int64_t[]){3, 4},
                               (double[]){1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0}),
        .emb_idx = em_test_tensor(EM_I64, 2, (int64_t[]){2, 2}, (double[]){0, 2, 1, 2}),
    };
    for (c.which = 0; c.which <= 9; c.which++) {
        cr_assert_eq(em_gradcheck(f_data, 1, &x, &c, 0, 0, 0), EM_OK, "data op %d: %s", c.which,
                     em_last_error());
        char what[32];
        snprintf(what, sizeof what, "data op %d", c.which);
        expect_f32_matches_f64(f_data, &c, x, what);
    }
    em_tensor *all[] = {x, c.idx2, c.idx1, c.mask, c.emb_idx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

/* linear and addmm with fixed weights: the input's f32 grad against its f64 grad. */
static em_tensor *f_linear_x(em_tensor *const *in, int n, void *user) {
    (void)n;
    em_tensor *const *p = user; /* w, b, c in f64; converted to the input's dtype */
    em_dtype dt = em_tensor_dtype(in[0]);
    em_tensor *all[4] = {in[0], em_to_dtype(p[0], dt), em_to_dtype(p[1], dt), em_to_dtype(p[2], dt)};
    return f_linear(all, 4, NULL);
}

Test(gradcheck, f32_backward_matches_f64_for_linear_and_addmm) {
    em_tensor *x = leaf(EM_F64, 3, (int64_t[]){2, 3, 4}, 90, -1, 1);
    em_tensor *p[3] = {leaf(EM_F64, 2, (int64_t[]){5, 4}, 91, -1, 1),
                       leaf(EM_F64, 1, (int64_t[]){5}, 92, -1, 1),
                       leaf(EM_F64, 1, (int64_t[]){4}, 93, -1, 1)};
    for (int i = 0; i < 3; i++) em_requires_grad_(p[i], false);
    expect_f32_matches_f64(f_linear_x, p, x, "linear + addmm");
    em_tensor_release(x);
    for (int i = 0; i < 3; i++) em_tensor_release(p[i]);
}

/* Scopes: references created inside are dropped at the end, em_keep moves them out, objects
 * held elsewhere survive, and a loop inside scopes holds memory flat. */
#include "common.h"

TestSuite(scope, .init = em_test_setup, .fini = em_test_teardown);

static size_t activation_bytes(void) {
    em_memory_stats s;
    cr_assert_eq(em_memory_stats_get(em_cpu(), &s), EM_OK, "%s", em_last_error());
    return s.current[EM_MEM_ACTIVATION];
}

Test(scope, end_drops_what_was_created_inside) {
    size_t before = activation_bytes();
    cr_assert_eq(em_scope_begin(), EM_OK);
    cr_assert_eq(em_scope_depth(), 1);
    em_tensor *a = em_ones(1, (int64_t[]){1000}, EM_F32, em_cpu());
    em_tensor *b = em_add(a, a);
    cr_assert_not_null(b);
    cr_assert_gt(activation_bytes(), before);
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_eq(em_scope_depth(), 0);
    cr_assert_eq(activation_bytes(), before, "every tensor made in the scope is freed");
}

Test(scope, keep_moves_a_reference_out) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *a = em_full(1, (int64_t[]){4}, 2.0, EM_F32, em_cpu());
    em_tensor *s = em_keep(em_sum(em_mul(a, a), 0, NULL, false));
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_float_eq(em_item(s), 16.0, 0);
    em_tensor_release(s); /* kept at the outermost scope: the caller owns it */
}

Test(scope, nested_scopes_and_keep_to_the_parent) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *outer = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *inner = em_keep(em_add(outer, outer)); /* moves to the outer scope */
    em_tensor *dropped = em_mul(outer, outer);
    (void)dropped;
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_float_eq(em_test_at(inner, 0), 2.0, 0, "inner survives the inner scope");
    cr_assert_eq(em_scope_end(), EM_OK); /* frees outer and inner */
    cr_assert_eq(em_scope_end(), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "no scope is open");
}

Test(scope, objects_held_elsewhere_live_on) {
    /* A "parameter" created outside any scope and retained by the program survives scopes that
     * use it and views of it. */
    em_tensor *w = em_ones(2, (int64_t[]){2, 2}, EM_F32, em_cpu());
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *wt = em_transpose(w, 0, 1);
    em_tensor *held = em_tensor_retain(wt); /* a reference of the program's own */
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_float_eq(em_test_at(held, 3), 1.0, 0);
    em_tensor_release(held);
    cr_assert_float_eq(em_test_at(w, 0), 1.0, 0);
    em_tensor_release(w);
}

Test(scope, a_training_like_loop_holds_memory_flat) {
    em_tensor *w = em_ones(2, (int64_t[]){16, 8}, EM_F32, em_cpu());
    em_tensor *x = em_ones(2, (int64_t[]){4, 16}, EM_F32, em_cpu());
    size_t after_first = 0;
    for (int step = 0; step < 200; step++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *loss = em_sum(em_relu(em_matmul(x, w)), 0, NULL, false);
        cr_assert_float_eq(em_item(loss), 4 * 8 * 16.0, 0);
        cr_assert_eq(em_scope_end(), EM_OK);
        if (step == 0) after_first = activation_bytes();
        cr_assert_eq(activation_bytes(), after_first, "step %d", step);
    }
    em_memory_stats s;
    em_memory_stats_get(em_cpu(), &s);
    cr_assert_gt(s.cache_hits, 100, "steady-state steps reuse cached blocks");
    em_tensor_release(w);
    em_tensor_release(x);
}

/*
 * examples/tensor_basics.c — a first Ember program: start the library, make tensors, see what
 * is a view and what is a copy, broadcast, multiply, reduce, and run a loop whose temporaries
 * are freed by a scope.
 *
 * Build it against an installed Ember:
 *     cc tensor_basics.c $(pkg-config --cflags --libs ember) -o tensor_basics
 * or, in the source tree, `make` builds examples/tensor_basics.
 *
 * Conventions used throughout:
 *   - every function that returns an em_tensor * returns a NEW reference, released with
 *     em_tensor_release() (or by the enclosing scope, see step 7);
 *   - a failing call returns NULL (or a status other than EM_OK) and leaves a message for
 *     this thread in em_last_error(); ops given a NULL input return NULL without replacing
 *     that message, so a chain of calls can be checked once, at the end.
 */
#include <stdio.h>
#include <stdlib.h>

#include <ember/ember.h>

/* An example may exit on error; library code never does. */
static em_tensor *must(em_tensor *t, const char *what) {
    if (!t) {
        fprintf(stderr, "%s failed: %s\n", what, em_last_error());
        exit(1);
    }
    return t;
}

static void show(const char *title, const em_tensor *t) {
    printf("%s\n", title);
    em_tensor_print(stdout, t);
    printf("\n");
}

/* Step 1 — verify the install first: which Ember, which plugins, which device, and one tiny
 * op on that device. If this fails, nothing later will work either. */
static void verify_install(void) {
    printf("ember %s\n%s\n", em_version(), em_build_info());
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info p;
        if (em_plugin_get(i, &p) != EM_OK) continue;
        printf("plugin %-12s %s%s\n", p.name ? p.name : p.path,
               p.status == EM_PLUGIN_LOADED ? "loaded" : "not loaded: ",
               p.reason ? p.reason : "");
    }
    /* Use a GPU when a backend for it is installed, the CPU otherwise. */
    em_device dev = em_cpu();
    if (em_device_count("cuda") > 0 && em_device_parse("cuda:0", &dev) != EM_OK) dev = em_cpu();
    char name[32];
    printf("device: %s (%d thread%s for CPU kernels)\n", em_device_str(dev, name, sizeof name),
           em_num_threads(), em_num_threads() == 1 ? "" : "s");
    em_tensor *probe = must(em_ones(1, (int64_t[]){3}, EM_F32, dev), "a tensor on the device");
    em_tensor *twice = must(em_add(probe, probe), "an add on the device");
    show("ones(3) + ones(3) on the device:", twice);
    em_tensor_release(twice);
    em_tensor_release(probe);
}

/* Step 2 and 3 — creating tensors; views share memory, copies do not. */
static void views_and_copies(void) {
    const float values[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *a = must(em_from_data(values, 2, (int64_t[]){2, 3}, EM_F32, em_cpu()),
                        "from_data"); /* (2, 3), a copy of `values` */
    show("a = from_data([[1, 2, 3], [4, 5, 6]]):", a);

    /* A transpose is a view: same storage, swapped strides, no copy. */
    em_tensor *at = must(em_transpose(a, 0, 1), "transpose"); /* (3, 2) */
    printf("transpose(a) shares a's memory: %s; contiguous: %s\n",
           em_tensor_shares_storage(a, at) ? "yes" : "no",
           em_tensor_is_contiguous(at) ? "yes" : "no");

    /* em_view never copies, so it refuses a layout it cannot express — with a message that
     * says what to do instead. This is PyTorch's view/reshape rule. */
    em_tensor *flat = em_view(at, 1, (int64_t[]){6});
    if (!flat) printf("view(transpose(a), [6]) refused, as expected:\n  %s\n", em_last_error());
    em_tensor_release(flat); /* NULL: a no-op */

    /* em_reshape copies when it must: the result is a new, contiguous tensor. */
    em_tensor *r = must(em_reshape(at, 1, (int64_t[]){6}), "reshape");
    printf("reshape(transpose(a), [6]) shares a's memory: %s\n",
           em_tensor_shares_storage(a, r) ? "yes" : "no");
    show("reshape(transpose(a), [6]):", r);

    em_tensor_release(r);
    em_tensor_release(at);
    em_tensor_release(a);
}

/* Step 4 to 6 — broadcasting, matrix products and reductions. */
static void arithmetic(void) {
    em_tensor *x = must(em_arange(0, 6, 1, EM_F32, em_cpu()), "arange"); /* (6) */
    em_tensor *m = must(em_view(x, 2, (int64_t[]){2, 3}), "view");      /* (2, 3) */
    em_tensor *row = must(em_full(1, (int64_t[]){3}, 10, EM_F32, em_cpu()), "full"); /* (3) */

    /* Shapes align from the last dim: (2, 3) + (3) -> (2, 3). */
    em_tensor *sum = must(em_add(m, row), "add");
    show("m + [10, 10, 10] (broadcast):", sum);

    em_tensor *w = must(em_ones(2, (int64_t[]){3, 2}, EM_F32, em_cpu()), "ones"); /* (3, 2) */
    em_tensor *prod = must(em_matmul(m, w), "matmul"); /* (2, 3) @ (3, 2) -> (2, 2) */
    show("m @ ones(3, 2):", prod);

    /* Mismatched shapes are an error naming both shapes, never a crash. */
    em_tensor *bad = em_matmul(m, m);
    if (!bad) printf("m @ m refused, as expected:\n  %s\n\n", em_last_error());

    em_tensor *total = must(em_sum(m, 0, NULL, false), "sum");               /* () */
    em_tensor *cols = must(em_sum(m, 1, (int[]){0}, false), "sum over dim 0"); /* (3) */
    printf("sum(m) = %g\n", em_item(total));
    show("sum(m, dim 0):", cols);

    em_tensor *all[] = {x, m, row, sum, w, prod, bad, total, cols};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

/* Step 7 — a loop with a scope: every temporary made between em_scope_begin() and
 * em_scope_end() is released by em_scope_end(); em_keep() lets one result out. No release
 * per intermediate, and memory stays flat however many steps run. */
static void scope_loop(void) {
    em_tensor *x = must(em_ones(2, (int64_t[]){4, 8}, EM_F32, em_cpu()), "x"); /* (4, 8) */
    em_tensor *w = must(em_full(2, (int64_t[]){8, 3}, 0.25, EM_F32, em_cpu()), "w"); /* (8, 3) */
    em_tensor *b = must(em_full(1, (int64_t[]){3}, -1, EM_F32, em_cpu()), "b"); /* (3) */
    for (int step = 0; step < 3; step++) {
        em_scope_begin();
        em_tensor *h = em_relu(em_add(em_matmul(x, w), b)); /* (4, 3); 3 temporaries */
        em_tensor *loss = em_keep(em_sum(em_mul(h, h), 0, NULL, false)); /* () */
        em_scope_end();
        must(loss, "the step"); /* one check for the whole chain */
        em_memory_stats ms;
        em_memory_stats_get(em_cpu(), &ms);
        printf("step %d: loss = %g; activation memory in use after the scope: %zu bytes\n",
               step, em_item(loss), ms.current[EM_MEM_ACTIVATION]);
        em_tensor_release(loss); /* kept, so it is ours to release */
        if (em_fill_(w, 0.25 * (step + 2)) != EM_OK) must(NULL, "fill_");
    }
    em_tensor_release(b);
    em_tensor_release(w);
    em_tensor_release(x);
}

int main(void) {
    if (em_init() != EM_OK) {
        fprintf(stderr, "em_init failed: %s\n", em_last_error());
        return 1;
    }
    verify_install();
    views_and_copies();
    arithmetic();
    scope_loop();
    /* Step 8 — what holds the memory: every tensor above is released, so the bytes are
     * "cached" (kept by the caching allocator for reuse), not in use. */
    printf("\n");
    em_memory_summary(stdout);
    em_shutdown();
    return 0;
}

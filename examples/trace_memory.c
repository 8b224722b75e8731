/*
 * trace_memory.c — what holds the memory of a training step: the memory summary says how much
 * each category holds; a trace of the forward pass says which op made each activation, how
 * big it is and whether autograd keeps it for backward (docs/tracing.md walks through it).
 *
 * It builds a small CNN (Conv2d, BatchNorm2d, ReLU, MaxPool2d, Flatten, Linear) by name,
 * traces one forward + loss with gradients on, prints the top-level ops with the bytes their
 * outputs hold and their backward op, the activation memory the step holds until backward,
 * and writes the trace as Graphviz dot and JSON:
 *
 *     examples/trace_memory [trace.dot [trace.json]]
 *     dot -Tsvg trace.dot > trace.svg
 *
 * Exit status 0 when the trace names the model's parameters and its ops allocated memory
 * (`make check` runs it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

static em_module *layer(const char *cls, const char *opts) {
    em_options *o = em_options_new();
    /* "key=value key=value" */
    char buf[256];
    snprintf(buf, sizeof buf, "%s", opts);
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = '\0';
        em_options_set_text(o, tok, eq + 1, NULL);
    }
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    return m;
}

int main(int argc, char **argv) {
    if (em_init() != EM_OK) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    int rc = 1;
    em_module *model = em_module_new("Sequential", NULL);
    const char *spec[][2] = {{"Conv2d", "in_channels=1 out_channels=8 kernel_size=3 padding=1"},
                             {"BatchNorm2d", "num_features=8"},
                             {"ReLU", ""},
                             {"MaxPool2d", "kernel_size=2"},
                             {"Flatten", ""},
                             {"Linear", "in_features=512 out_features=10"}};
    for (size_t i = 0; model && i < sizeof spec / sizeof spec[0]; i++) {
        em_module *l = layer(spec[i][0], spec[i][1]);
        if (!l || em_module_append_child(model, l) != EM_OK) {
            fprintf(stderr, "%s\n", em_last_error());
            em_module_free(model);
            em_shutdown();
            return 1;
        }
    }
    em_scope_begin();
    em_tensor *x = em_empty(4, (int64_t[]){32, 1, 16, 16}, EM_F32, em_cpu()); /* (N, C, H, W) */
    em_tensor *target = em_zeros(1, (int64_t[]){32}, EM_I64, em_cpu());       /* (N) */
    em_normal_(x, 0, 1, NULL);

    em_memory_stats before, after;
    em_memory_stats_get(em_cpu(), &before);
    em_trace_options o = {.struct_size = sizeof o, .module = model};
    em_trace *tr = NULL;
    em_tensor *loss = NULL;
    if (em_trace_begin(&o) == EM_OK) {
        loss = em_cross_entropy(em_module_forward(model, x), target, NULL, EM_REDUCTION_MEAN,
                                -100, 0.0);
        tr = em_trace_end();
    }
    if (!loss || !tr) {
        fprintf(stderr, "%s\n", em_last_error());
        goto done;
    }
    em_memory_stats_get(em_cpu(), &after);
    /* What the step holds until backward: the activations the graph saved, and the outputs
     * still referenced (here by the scope). */
    printf("activation memory held after the forward: %zu bytes\n",
           after.current[EM_MEM_ACTIVATION] - before.current[EM_MEM_ACTIVATION]);
    printf("%-14s %-22s %10s  %s\n", "op", "output", "bytes", "backward op (keeps its inputs)");
    bool weight_named = false;
    size_t total = 0;
    for (size_t i = 0; i < em_trace_node_count(tr); i++) {
        const em_trace_node *n = em_trace_node_at(tr, i);
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k].source == EM_TRACE_FROM_PARAMETER && !strcmp(n->in[k].name, "0.weight"))
                weight_named = true;
        if (n->parent >= 0) continue; /* a composite's sub-ops: in its own bytes */
        char shape[64] = "-";
        if (n->n_out) em_shape_str(n->out[0].ndim, n->out[0].shape, shape, sizeof shape);
        printf("%-14s %-22s %10zu  %s\n", n->op, shape, n->bytes, n->grad_fn ? n->grad_fn : "-");
        total += n->bytes;
    }
    printf("the top-level ops allocated %zu bytes in all\n", total);
    FILE *f = argc > 1 ? fopen(argv[1], "w") : NULL;
    if (f) {
        em_graph_dump_trace(tr, f);
        fclose(f);
    }
    f = argc > 2 ? fopen(argv[2], "w") : NULL;
    if (f) {
        em_trace_write_json(tr, f);
        fclose(f);
    }
    rc = weight_named && total > 0 ? 0 : 1;
    if (rc) fprintf(stderr, "trace_memory: the trace is missing the parameter names or sizes\n");
done:
    em_trace_free(tr);
    em_scope_end();
    em_module_free(model);
    em_shutdown();
    return rc;
}

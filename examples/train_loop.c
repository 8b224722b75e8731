/*
 * train_loop.c — the training loop written by hand against Ember's public API, for programs
 * that do not want the trainer: device selection, a model from the layer registry, a
 * DataLoader, an optimizer with a scheduler, train/eval switching, validation under no_grad,
 * gradient clipping and a checkpoint — in scopes, with no release per intermediate.
 *
 *     cc train_loop.c $(pkg-config --cflags --libs ember) -o train_loop
 *     ./train_loop [DIGITS_DIR] [CHECKPOINT.safetensors]
 *
 * It trains an MLP on the bundled digits (data/digits) for 5 epochs and prints the validation
 * accuracy per epoch; tests/test_trainer.c runs it and expects exit 0 (accuracy >= 90%).
 */
#include <ember/ember.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                              \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "train_loop: %s (line %d)\n", em_last_error(), __LINE__);          \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static em_module *layer(const char *cls, const char *k1, int64_t v1, const char *k2, int64_t v2) {
    em_options *o = em_options_new();
    if (k1) em_options_set_int(o, k1, v1);
    if (k2) em_options_set_int(o, k2, v2);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    CHECK(m);
    return m;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "data/digits";
    const char *ckpt = argc > 2 ? argv[2] : "train_loop.safetensors";
    CHECK(em_init() == EM_OK);
    em_seed(0);

    /* Device: a GPU when a backend finds one, else the CPU. */
    em_device dev = em_cpu();
    if (em_device_count("cuda") > 0) CHECK(em_device_parse("cuda", &dev) == EM_OK);

    /* Model: Sequential(Flatten, Linear(64, 64), ReLU, Linear(64, 10)) from the registry. */
    em_module *model = em_module_new("Sequential", NULL);
    CHECK(model);
    CHECK(em_module_append_child(model, layer("Flatten", NULL, 0, NULL, 0)) == EM_OK);
    CHECK(em_module_append_child(model, layer("Linear", "in_features", 64, "out_features", 64)) == EM_OK);
    CHECK(em_module_append_child(model, layer("ReLU", NULL, 0, NULL, 0)) == EM_OK);
    CHECK(em_module_append_child(model, layer("Linear", "in_features", 64, "out_features", 10)) == EM_OK);
    CHECK(em_module_to_device(model, dev) == EM_OK);
    em_module *loss_fn = layer("CrossEntropyLoss", NULL, 0, NULL, 0);

    /* Data: the train split, 10% held out for validation; uint8 pixels become floats. */
    em_options *dso = em_options_new();
    CHECK(dso && em_options_set_string(dso, "path", dir) == EM_OK);
    em_dataset *all = em_dataset_open("mnist", dso); /* checks the options against the class */
    em_options_free(dso);
    CHECK(all);
    int64_t n = em_dataset_length(all), n_val = n / 10;
    em_dataset *parts[2];
    CHECK(em_random_split(all, (int64_t[]){n - n_val, n_val}, 2, 0, parts) == EM_OK);
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 32, .shuffle = true,
                            .seed = 0, .device = dev, .transforms = {.to_float = true}};
    em_loader *train = em_loader_new(parts[0], &lo);
    lo.shuffle = false;
    em_loader *val = em_loader_new(parts[1], &lo);
    CHECK(train && val);

    /* Optimizer and a per-epoch schedule. */
    em_dict *params = em_module_named_parameters(model, true);
    em_options *oo = em_options_new();
    em_options_set_float(oo, "lr", 0.05);
    em_options_set_float(oo, "momentum", 0.9);
    em_optimizer *opt = em_optimizer_new("SGD", params, oo);
    em_options_free(oo);
    CHECK(opt);
    em_options *so = em_options_new();
    em_options_set_int(so, "T_max", 5);
    em_scheduler *sched = em_scheduler_new("CosineAnnealingLR", opt, so);
    em_options_free(so);
    CHECK(sched);

    double acc = 0;
    for (int epoch = 0; epoch < 5; epoch++) {
        em_module_train(model, true);
        em_tensor *x, *y; /* borrowed from the loader */
        em_status st;
        while ((st = em_loader_next(train, &x, &y)) == EM_OK && x) {
            em_scope_begin();
            em_tensor *loss = em_module_forward_n(loss_fn, (em_tensor *[]){em_module_forward(model, x), y}, 2);
            CHECK(loss);
            em_optimizer_zero_grad(opt);
            CHECK(em_backward(loss) == EM_OK);
            CHECK(em_clip_grad_norm_(params, 5.0, 2.0, false, NULL) == EM_OK);
            CHECK(em_optimizer_step(opt) == EM_OK);
            em_scope_end(); /* frees the batch's intermediates and graph */
        }
        CHECK(st == EM_OK); /* a loader error (a bad file, an item) ends the loop too */
        CHECK(em_scheduler_step(sched, NAN) == EM_OK);

        /* Validation: eval mode, no graph. */
        em_module_train(model, false);
        em_grad_mode_push(EM_GRAD_DISABLED);
        double right = 0, seen = 0;
        while ((st = em_loader_next(val, &x, &y)) == EM_OK && x) {
            em_scope_begin();
            int dim = 1;
            em_tensor *hits = em_sum(em_to_dtype(em_eq(em_argmax(em_module_forward(model, x), &dim, false), y),
                                                 EM_F32), 0, NULL, false);
            CHECK(hits);
            right += em_item(hits);
            seen += (double)em_tensor_shape(x)[0];
            em_scope_end();
        }
        em_grad_mode_pop();
        CHECK(st == EM_OK);
        acc = right / seen;
        printf("epoch %d: lr %.4f validation accuracy %.2f%%\n", epoch + 1,
               em_optimizer_lr(opt, 0), 100 * acc);
    }

    /* Checkpoint: the model's state dict, crash-safely. */
    em_dict *sd = em_module_state_dict(model);
    em_metadata *meta = em_metadata_new();
    em_metadata_set(meta, "epochs", "5");
    CHECK(em_save(sd, ckpt, meta, NULL) == EM_OK);
    printf("saved %s\n", ckpt);

    em_metadata_free(meta);
    em_dict_free(sd);
    em_scheduler_free(sched);
    em_optimizer_free(opt);
    em_dict_free(params);
    em_loader_free(train);
    em_loader_free(val);
    em_dataset_free(parts[0]);
    em_dataset_free(parts[1]);
    em_dataset_free(all);
    em_module_free(loss_fn);
    em_module_free(model);
    em_shutdown();
    return acc >= 0.90 ? 0 : 1;
}

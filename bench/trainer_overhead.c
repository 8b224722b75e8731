/*
 * trainer_overhead.c — the baseline of bench/trainer_overhead.sh: the seeds' training loop
 * written by hand against the public API (zero_grad, forward, loss, backward, step; the
 * scheduler once per epoch), on the model, data, optimizer and batches an ember-train config
 * describes, so that ember-train's per-step time can be compared with it.
 *
 *     bench/trainer_overhead CONFIG STEPS WEIGHTS_OUT.safetensors
 *
 * It reads the config sections it needs through ember/config.h and builds everything in the
 * order ember-train does (seed, model, data split, loader, optimizer with its parameter groups,
 * scheduler), then runs STEPS optimizer steps and saves the model's state dict: the script
 * checks that it is byte-identical to `ember-train CONFIG --max-steps STEPS --save-weights`,
 * which is the proof that both trained the same thing. Keys it does not handle are an error
 * (it is a benchmark for the example configs, not a second trainer). It times nothing itself:
 * bench/steptimes.so, preloaded, timestamps every em_optimizer_step in both programs.
 */
#include <ember/ember.h>
#include <fnmatch.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what) {
    fprintf(stderr, "trainer_overhead: %s: %s\n", what, em_last_error());
    exit(1);
}

static const char *text_of(const em_config_node *map, const char *key, const char *def) {
    const em_config_node *n = map ? em_config_node_get(map, key) : NULL;
    return n && em_config_node_text(n) ? em_config_node_text(n) : def;
}

static void check_keys(const em_config_node *n, const char *const *keys) {
    if (n && em_config_check_keys(n, keys) != EM_OK) die("unsupported by this benchmark");
}

/* data.options then data.train as dataset options (a relative path against the config's dir),
 * as ember-train merges them. */
static em_options *data_options(const em_config_node *maps[2], const char *dir) {
    em_options *o = em_options_new();
    const em_config_node *pathv = NULL;
    for (int m = 0; m < 2; m++) {
        if (!maps[m]) continue;
        if (em_config_to_options(maps[m], NULL, o) != EM_OK) die("data options");
        if (em_config_node_get(maps[m], "path")) pathv = em_config_node_get(maps[m], "path");
    }
    const char *t = pathv ? em_config_node_text(pathv) : NULL;
    if (t && t[0] != '/') {
        char full[PATH_MAX];
        snprintf(full, sizeof full, "%.2047s/%.2047s", dir, t);
        if (em_options_set_string(o, "path", full) != EM_OK) die("data path");
    }
    return o;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bench/trainer_overhead CONFIG STEPS WEIGHTS_OUT.safetensors\n");
        return 2;
    }
    const char *config = argv[1], *weights = argv[3];
    long steps = strtol(argv[2], NULL, 10);
    if (em_init() != EM_OK) die("init");
    em_config *cfg = em_config_load(config);
    if (!cfg) die("config");
    char tmp[PATH_MAX], dir[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", config);
    snprintf(dir, sizeof dir, "%s", dirname(tmp));
    const em_config_node *root = em_config_root(cfg);
    check_keys(root, (const char *const[]){"model", "data", "loss", "optimizer", "scheduler",
                                           "loop", NULL});
    const em_config_node *loop = em_config_node_get(root, "loop");
    check_keys(loop, (const char *const[]){"epochs", "batch_size", "seed", "workers", NULL});
    int64_t batch = strtoll(text_of(loop, "batch_size", "64"), NULL, 10);
    uint64_t seed = strtoull(text_of(loop, "seed", "0"), NULL, 10);
    int workers = atoi(text_of(loop, "workers", "0"));

    /* seed, then the model: ember-train's order, so the initial weights are the same */
    em_seed(seed);
    em_module *model = em_model_build(em_config_node_get(root, "model"));
    if (!model) die("model");

    /* data: the training split, less the validation count ember-train holds out */
    const em_config_node *d = em_config_node_get(root, "data");
    check_keys(d, (const char *const[]){"class", "options", "train", "validation", "test",
                                        "transforms", NULL});
    em_options *dopts = data_options((const em_config_node *[2]){em_config_node_get(d, "options"),
                                                                 em_config_node_get(d, "train")}, dir);
    em_dataset *full = em_dataset_open(text_of(d, "class", "mnist"), dopts), *train = full, *parts[2];
    em_options_free(dopts);
    if (!full) die("dataset");
    const char *val = text_of(d, "validation", NULL);
    if (val) {
        int64_t len = em_dataset_length(full), count = strtoll(val, NULL, 10);
        if (strchr(val, '.')) count = (int64_t)llround(strtod(val, NULL) * (double)len);
        if (em_random_split(full, (int64_t[]){len - count, count}, 2, seed, parts) != EM_OK)
            die("validation split");
        train = parts[0];
    }
    em_transforms tf = {0};
    if (em_dataset_get_info(train)->input_dtype == EM_U8) tf.to_float = true;
    const em_config_node *tfn = em_config_node_get(d, "transforms");
    check_keys(tfn, (const char *const[]){"crop_padding", "hflip", NULL});
    tf.crop_padding = atoi(text_of(tfn, "crop_padding", "0"));
    tf.hflip = !strcmp(text_of(tfn, "hflip", "false"), "true");
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = batch, .shuffle = true,
                            .seed = seed, .num_workers = workers, .device = em_cpu(),
                            .transforms = tf};
    em_loader *loader = em_loader_new(train, &lo);
    if (!loader) die("loader");

    const em_config_node *ln = em_config_node_get(root, "loss");
    em_module *loss_fn = ln ? em_model_build(ln) : em_module_new("CrossEntropyLoss", NULL);
    if (!loss_fn) die("loss");

    /* the optimizer: its options, then groups chosen by parameter-name patterns, the rest last */
    const em_config_node *on = em_config_node_get(root, "optimizer");
    em_options *defaults = em_options_new();
    if (on && em_config_to_options(on, (const char *const[]){"class", "groups", NULL},
                                   defaults) != EM_OK)
        die("optimizer options");
    const em_config_node *groups = on ? em_config_node_get(on, "groups") : NULL;
    size_t ng = groups ? em_config_node_len(groups) : 0;
    em_dict *all = em_module_named_parameters(model, true);
    em_dict *gd[9];
    em_options *go[9] = {0};
    em_param_group pg[9];
    if (ng > 8) die("more than 8 parameter groups");
    for (size_t g = 0; g <= ng; g++) gd[g] = em_dict_new();
    for (size_t g = 0; g < ng; g++) {
        const em_config_node *gn = em_config_node_at(groups, g, NULL);
        check_keys(gn, (const char *const[]){"params", "weight_decay", "lr", "momentum", NULL});
        go[g] = em_options_new();
        if (em_config_to_options(gn, (const char *const[]){"params", NULL}, go[g]) != EM_OK)
            die("group options");
    }
    for (size_t i = 0; i < em_dict_len(all); i++) {
        size_t g = 0;
        for (; g < ng; g++) {
            const em_config_node *p = em_config_node_get(em_config_node_at(groups, g, NULL), "params");
            bool hit = false;
            for (size_t j = 0; p && j < em_config_node_len(p); j++)
                hit |= fnmatch(em_config_node_text(em_config_node_at(p, j, NULL)),
                               em_dict_key(all, i), 0) == 0;
            if (hit) break;
        }
        em_dict_set(gd[g], em_dict_key(all, i), em_dict_value(all, i));
    }
    int n_pg = 0;
    for (size_t g = 0; g < ng; g++) pg[n_pg++] = (em_param_group){gd[g], go[g]};
    if (em_dict_len(gd[ng])) pg[n_pg++] = (em_param_group){gd[ng], NULL};
    em_optimizer *opt = em_optimizer_new_groups_defaults(text_of(on, "class", "SGD"), pg, n_pg,
                                                         defaults);
    if (!opt) die("optimizer");

    const em_config_node *sn = em_config_node_get(root, "scheduler");
    em_scheduler *sched = NULL;
    if (sn) {
        if (strcmp(text_of(sn, "interval", "epoch"), "epoch")) {
            fprintf(stderr, "trainer_overhead: only per-epoch schedulers are handled\n");
            return 1;
        }
        em_options *so = em_options_new();
        if (em_config_to_options(sn, (const char *const[]){"class", "interval", NULL}, so) != EM_OK)
            die("scheduler options");
        if (!(sched = em_scheduler_new(text_of(sn, "class", ""), opt, so))) die("scheduler");
        em_options_free(so);
    }

    /* the loop: the seeds' skeleton, nothing else */
    long done = 0;
    em_module_train(model, true);
    while (done < steps) {
        em_tensor *x, *y;
        em_status st = EM_OK;
        while (done < steps && (st = em_loader_next(loader, &x, &y)) == EM_OK && x) {
            em_scope_begin();
            em_optimizer_zero_grad(opt);
            em_tensor *out = em_module_forward(model, x);
            em_tensor *loss = out ? em_module_forward_n(loss_fn, (em_tensor *[]){out, y}, 2) : NULL;
            if (!loss || em_backward(loss) != EM_OK || em_optimizer_step(opt) != EM_OK) die("step");
            em_scope_end();
            done++;
        }
        if (done < steps) {
            if (st != EM_OK) die("data");
            if (sched && em_scheduler_step(sched, NAN) != EM_OK) die("scheduler step");
        }
    }

    em_dict *sd = em_module_state_dict(model);
    if (!sd || em_save(sd, weights, NULL, NULL) != EM_OK) die(weights);
    em_dict_free(sd);
    em_scheduler_free(sched);
    em_optimizer_free(opt);
    for (size_t g = 0; g <= ng; g++) {
        em_dict_free(gd[g]);
        em_options_free(go[g]);
    }
    em_options_free(defaults);
    em_dict_free(all);
    em_module_free(loss_fn);
    em_loader_free(loader);
    if (train != full) {
        em_dataset_free(parts[0]);
        em_dataset_free(parts[1]);
    }
    em_dataset_free(full);
    em_module_free(model);
    em_config_free(cfg);
    em_shutdown();
    return 0;
}

/*
 * layers_containers.c — modules made of children: Sequential, Residual, Parallel.
 *
 * Children are added after creation with em_module_add_child (or em_module_append_child,
 * which names them "0", "1", ... as torch.nn.Sequential does), so state-dict keys follow the
 * PyTorch tree: Sequential(Linear, ReLU, Linear) has 0.weight, 0.bias, 2.weight, 2.bias.
 *
 *   Sequential  children applied in order; none: the input itself.
 *   Residual    y = shortcut(x) + f(x): f applies the children in order, except the child
 *               named by the option `shortcut` (default "shortcut"; "downsample" gives
 *               torchvision's BasicBlock keys), the optional projection of x (identity when
 *               absent). ReLU after the sum, as in ResNet, goes in the enclosing Sequential.
 *   Parallel    every child sees the input; their outputs are concatenated along `dim`
 *               (mode "cat") or summed (mode "sum").
 * Errors name the child at fault: "Sequential: layer 2 (Linear): linear: shapes ...".
 */
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/tensor.h"
#include "layers.h"

static em_tensor *child_forward(em_module *m, size_t i, const em_tensor *x, const char *what) {
    const char *name;
    em_module *c = em_module_child_at(m, i, &name);
    em_tensor *y = em_module_forward(c, x);
    if (!y) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_set_error(em_last_status(), "%s %s (%s): %s", what, name, em_module_class_of(c)->name,
                     msg);
    }
    return y;
}

/* ---- Sequential -------------------------------------------------------------------------------- */

static em_tensor *seq_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    em_tensor *x = in[0];
    size_t k = em_module_child_count(m);
    if (k == 0)
        return em_tensor_retain(x);
    for (size_t i = 0; i < k && x; i++)
        x = child_forward(m, i, x, "layer");
    return x;
}

static const em_module_class seq_class = {
    .struct_size = sizeof(em_module_class), .name = "Sequential",
    .description = "children applied in order (torch.nn.Sequential)", .forward = seq_forward,
    .n_inputs = 1,
};

/* ---- Residual ---------------------------------------------------------------------------------- */

static const em_option_spec res_opts[] = {
    {.name = "shortcut", .types = EM_OPT_STRING, .def = {.s = "shortcut"},
     .help = "name of the child that projects x (absent: identity)"},
};

static em_tensor *res_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const char *sc = em_options_string(em_module_options(m), "shortcut");
    em_tensor *x = in[0], *f = x, *s = x;
    size_t k = em_module_child_count(m);
    for (size_t i = 0; i < k; i++) {
        const char *name;
        em_module_child_at(m, i, &name);
        if (strcmp(name, sc) == 0) {
            if (!(s = child_forward(m, i, x, "shortcut")))
                return NULL;
        } else if (!(f = child_forward(m, i, f, "layer"))) {
            return NULL;
        }
    }
    em_tensor *y = em_add(s, f);
    if (!y && em_last_status() == EM_ERR_SHAPE) {
        char a[128], b[128], msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_shape_str(em_tensor_ndim(s), em_tensor_shape(s), a, sizeof a);
        em_shape_str(em_tensor_ndim(f), em_tensor_shape(f), b, sizeof b);
        em_set_error(EM_ERR_SHAPE, "the shortcut gives %s but the residual branch %s; add a "
                     "'%s' child that projects x (%s)", a, b, sc, msg);
    }
    return y;
}

static const em_module_class res_class = {
    .struct_size = sizeof(em_module_class), .name = "Residual",
    .description = "shortcut(x) + f(x), f the children in order (ResNet blocks)",
    .options = res_opts, .n_options = NOPTS(res_opts), .forward = res_forward, .n_inputs = 1,
};

/* ---- Parallel ---------------------------------------------------------------------------------- */

static const char *const par_modes[] = {"cat", "sum", NULL};
static const em_option_spec par_opts[] = {
    OPT_CHOICE("mode", "cat", par_modes, "join the branches by concatenation or sum"),
    OPT_INT("dim", 1, -8, 7, "concatenation dim (mode 'cat')"),
};

static em_tensor *par_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_options *o = em_module_options(m);
    size_t k = em_module_child_count(m);
    if (k == 0) {
        em_set_error(EM_ERR_STATE, "has no branches (add children)");
        return NULL;
    }
    if (k > 64) {
        em_set_error(EM_ERR_RANGE, "has %zu branches; at most 64", k);
        return NULL;
    }
    em_tensor *outs[64];
    for (size_t i = 0; i < k; i++)
        if (!(outs[i] = child_forward(m, i, in[0], "branch")))
            return NULL;
    if (strcmp(em_options_string(o, "mode"), "cat") == 0)
        return em_cat((int)k, (const em_tensor *const *)outs, (int)em_options_int(o, "dim"));
    em_tensor *acc = outs[0];
    if (k == 1)
        return em_tensor_retain(acc);
    for (size_t i = 1; i < k && acc; i++)
        acc = em_add(acc, outs[i]);
    return acc;
}

static const em_module_class par_class = {
    .struct_size = sizeof(em_module_class), .name = "Parallel",
    .description = "branches on the same input, concatenated along dim or summed",
    .options = par_opts, .n_options = NOPTS(par_opts), .forward = par_forward, .n_inputs = 1,
};

const em_module_class *const layers_containers[] = {&seq_class, &res_class, &par_class, NULL};

/*
 * broken_kernel.c — a test plugin ("ember-test-broken-kernel") that registers a CPU float32
 * kernel for the standard op "neg" above the CPU backend's (priority 100). It is right for
 * contiguous tensors and skips the last element of a non-contiguous input (that output
 * element is never written). tests/test_sdk_install.sh runs `ember-opcheck --plugin` on it:
 * the eval mode must catch it with neg's own case rows (transposed, sliced, expanded) against
 * the kernel below it, naming the op. Never installed.
 */
#include <ember/ember.h>

static em_status neg_f32(const em_kernel_ctx *ctx) {
    const em_ktensor *x = &ctx->in[0], *y = &ctx->out[0];
    const float *xp = (const float *)x->data;
    float *yp = (float *)y->data;
    if (x->contiguous && y->contiguous) {
        for (int64_t i = 0; i < x->numel; i++) yp[i] = -xp[i];
        return EM_OK;
    }
    const em_ktensor *ts[2] = {y, x};
    em_kiter it;
    int64_t n = 0;
    for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it))
        if (++n < x->numel) yp[it.off[0]] = -xp[it.off[1]]; /* wrong: the last one is skipped */
    return EM_OK;
}

static em_status reg(em_registry *r) {
    em_kernel_def k = {.struct_size = sizeof k, .op = "neg", .device_type = "cpu",
                       .dtype = EM_F32, .priority = 100, .fn = neg_f32,
                       .name = "broken_kernel_neg_f32"};
    return em_kernel_register(r, &k, NULL);
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-test-broken-kernel", .version = "1.0",
    .description = "a neg kernel that skips the last element of non-contiguous inputs "
                   "(ember-opcheck must say so)",
    .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }

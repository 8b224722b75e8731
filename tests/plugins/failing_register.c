/*
 * failing_register.c — a test plugin whose register function registers things and then
 * fails. The core must refuse it with "registration failed: <its message>" and withdraw all
 * it registered: the op "failing.op" with its kernel, the device type "failingdev", and a
 * float32 "add" kernel stacked on the standard op at a high priority (which, were it left
 * behind, would make every CPU float32 add return -777).
 */
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

/* ---- a minimal device type (host memory, one device) ------------------------------------ */

static int fd_count(void) { return 1; }
static em_status fd_alloc(int index, size_t nbytes, void **out) {
    (void)index;
    *out = aligned_alloc(64, (nbytes + 63) / 64 * 64);
    return *out ? EM_OK : EM_ERR_NOMEM;
}
static void fd_free(int index, void *ptr) {
    (void)index;
    free(ptr);
}
static em_status fd_copy(em_device dd, void *dst, em_device sd, const void *src, size_t n,
                         em_stream *s) {
    (void)dd, (void)sd, (void)s;
    memmove(dst, src, n);
    return EM_OK;
}
static em_status fd_synchronize(int index) {
    (void)index;
    return EM_OK;
}

static const em_device_ops fd_device = {
    .struct_size = sizeof(em_device_ops),
    .name = "failingdev",
    .count = fd_count,
    .alloc = fd_alloc,
    .free = fd_free,
    .copy = fd_copy,
    .synchronize = fd_synchronize,
};

/* ---- an op and kernels ---------------------------------------------------------------------- */

static em_status failing_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                               em_tensor_meta *out) {
    (void)op, (void)attrs;
    out->dtype = em_tensor_dtype(in[0]);
    out->ndim = em_tensor_ndim(in[0]);
    memcpy(out->shape, em_tensor_shape(in[0]), sizeof(int64_t) * (size_t)out->ndim);
    return EM_OK;
}

/* Writes -777 everywhere: recognisable if it is ever left registered and run. */
static em_status failing_kernel(const em_kernel_ctx *ctx) {
    const em_ktensor *y = &ctx->out[0];
    float *p = y->data;
    for (int64_t i = 0; i < y->numel; i++) p[i] = -777.0f;
    return EM_OK;
}

static em_status failing_register(em_registry *r) {
    em_op_schema s = {.struct_size = sizeof s, .name = "failing.op", .n_inputs = 1,
                      .n_outputs = 1, .dispatch_arg = 0, .infer = failing_infer};
    em_status st = em_op_declare(r, &s, NULL);
    if (st == EM_OK) st = em_device_type_register(r, &fd_device);
    if (st == EM_OK && em_device_count("cpu") > 0) {
        em_kernel_def k = {.struct_size = sizeof k, .op = "failing.op", .device_type = "cpu",
                           .dtype = EM_F32, .fn = failing_kernel, .name = "failing_op_f32"};
        st = em_kernel_register(r, &k, NULL);
        em_kernel_def add = {.struct_size = sizeof add, .op = "add", .device_type = "cpu",
                             .dtype = EM_F32, .priority = 1000, .fn = failing_kernel,
                             .name = "failing_add_f32"};
        if (st == EM_OK) st = em_kernel_register(r, &add, NULL);
    }
    if (st != EM_OK) return st;
    return em_set_error(EM_ERR_INVALID, "failing_register: refusing on purpose after "
                        "registering op 'failing.op'");
}

static const em_plugin_descriptor failing_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-test-failing-register",
    .version = "0.0.1",
    .description = "test plugin whose registration fails halfway",
    .register_fn = failing_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &failing_plugin; }

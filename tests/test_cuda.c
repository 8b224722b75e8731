/*
 * test_cuda.c — the CUDA plugin where there is no GPU (this machine, CI): it loads, registers
 * the "cuda" device type with 0 devices and the driver's reason, which every consumer shows
 * (em_device_parse, ember-info and its --json, ember-train --device cuda, which exits 2 and
 * trains nothing); and a plugin whose cuBLAS cannot be loaded is refused with the loader's
 * full message. EMBER_CUDA_LOAD_LIBRARIES=1 makes the plugin load cuBLAS/cuBLASLt and cuDNN
 * without a device (what it does when cudaGetDeviceCount finds one), so that path runs here:
 * once with the real libraries, once for each library with a copy of the plugin whose dlopen()
 * target is renamed to a soname that exists nowhere. The CNN kernels (cuDNN convolutions over
 * the plugin's direct ones, pooling, batch norm) are registered without a device, and the
 * cuDNN ones decline every call while cuDNN is not loaded.
 *
 * The reference for the driver's reason is the CUDA runtime itself, asked independently:
 * the shared libcudart of the same toolkit, dlopen()ed here.
 */
#define _GNU_SOURCE /* memmem */
#include <dlfcn.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_api.h>       /* CUBLAS_VER_MAJOR/MINOR/PATCH: what the plugin must report */
#include <cuda_runtime_api.h> /* CUDART_VERSION: the runtime the plugin links */
#include <cudnn_version.h>    /* CUDNN_MAJOR/MINOR/PATCHLEVEL */

#include "common.h"

#define EM_TEST_XSTR(x) #x
#define EM_TEST_STR(x) EM_TEST_XSTR(x)
#define EM_TEST_CUDA_MAJOR (CUDART_VERSION / 1000)

TestSuite(cuda, .init = em_test_setup, .fini = em_test_teardown);

/* What the CUDA runtime says about the devices: the error string of cudaGetDeviceCount
 * (NULL when it succeeds), from the toolkit's shared libcudart. */
static const char *runtime_reason(int *count) {
    void *h = dlopen(EM_TEST_CUDA_LIBDIR "/libcudart.so", RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "dlopen libcudart: %s", dlerror());
    int (*get_count)(int *);
    const char *(*err_str)(int);
    *(void **)&get_count = dlsym(h, "cudaGetDeviceCount");
    *(void **)&err_str = dlsym(h, "cudaGetErrorString");
    cr_assert(get_count && err_str);
    *count = 0;
    int e = get_count(count);
    return e ? err_str(e) : NULL; /* libcudart stays loaded: the string stays valid */
}

/* Run a command line; its stdout and stderr into a new string; the exit status in *code. */
static char *run(const char *cmd, int *code) {
    char full[8200];
    snprintf(full, sizeof full, "%.8000s 2>&1", cmd);
    return em_test_run(full, code);
}

static const char *tools(void) {
    const char *t = getenv("EMBER_TEST_TOOLS_DIR");
    cr_assert(t && *t, "EMBER_TEST_TOOLS_DIR is not set (run through `make check`)");
    return t;
}

/* The index of the plugin named `name` in em_plugins(), its info in *info. */
static void find_plugin(const char *name, em_plugin_info *info) {
    for (size_t i = 0; i < em_plugin_count(); i++)
        if (em_plugin_get(i, info) == EM_OK && info->name && strcmp(info->name, name) == 0)
            return;
    cr_assert_fail("plugin %s was not found (is the CUDA plugin built?)", name);
}

Test(cuda, plugin_loads_with_no_device_and_the_drivers_reason) {
    int n_rt;
    const char *why_rt = runtime_reason(&n_rt);
    cr_assert_eq(n_rt, 0, "this test is for a machine without a GPU; the runtime finds %d", n_rt);
    cr_assert(why_rt, "cudaGetDeviceCount succeeded with 0 devices");
    em_plugin_info info;
    find_plugin("ember-cuda", &info);
    cr_assert_eq(info.status, EM_PLUGIN_LOADED, "%s", info.reason ? info.reason : "");
    cr_assert_eq(em_device_count("cuda"), 0);
    const char *why = em_device_count_reason("cuda");
    cr_assert(why && strstr(why, why_rt), "reason '%s' lacks the runtime's '%s'", why, why_rt);
    cr_assert_null(em_device_count_reason("cpu"), "the CPU has a device: no reason");
    cr_assert_null(em_device_count_reason("xpu"), "an unknown type: no reason");
    /* the kernels are registered all the same (ember-info lists them, opcheck covers them) */
    size_t nk = em_registry_kernel_count(info.registry);
    cr_assert_geq(nk, 16, "copy and fill for the 8 dtypes: %zu kernels", nk);
    /* cuBLAS and cuDNN were not loaded: there is no device */
    cr_assert_null(dlopen("libcublas.so." EM_TEST_STR(CUBLAS_VER_MAJOR), RTLD_NOW | RTLD_NOLOAD),
                   "cuBLAS was loaded without a device");
    cr_assert_null(dlopen("libcudnn.so." EM_TEST_STR(CUDNN_MAJOR), RTLD_NOW | RTLD_NOLOAD),
                   "cuDNN was loaded without a device");
    em_device d;
    for (int k = 0; k < 2; k++) {
        em_clear_error();
        cr_assert_eq(em_device_parse(k ? "cuda:1" : "cuda", &d), EM_ERR_DEVICE);
        cr_assert(strstr(em_last_error(), "no cuda device is present: "), "%s", em_last_error());
        cr_assert(strstr(em_last_error(), why_rt), "%s", em_last_error());
    }
}

/* The cuda type registers the graph capture slots (ember/device.h); without a device a capture
 * fails with the driver's reason, like every other use of cuda:0. */
Test(cuda, graph_capture_is_offered_and_refused_with_the_reason_without_a_device) {
    int n_rt;
    const char *why_rt = runtime_reason(&n_rt);
    cr_assert(why_rt);
    em_device d = {.type = -1};
    for (int t = 1; t < EM_MAX_DEVICE_TYPES && d.type < 0; t++) {
        char b[48];
        if (!strcmp(em_device_str((em_device){.type = (int16_t)t}, b, sizeof b), "cuda:0"))
            d.type = (int16_t)t;
    }
    cr_assert_geq(d.type, 1, "the cuda device type is not registered");
    cr_assert(em_graph_capture_supported(d), "the cuda backend registers the graph slots");
    cr_assert(!em_graph_capture_supported(em_cpu()));
    cr_assert_eq(em_graph_capture_begin(d, NULL), EM_ERR_DEVICE);
    cr_assert(strstr(em_last_error(), "graph_capture_begin") &&
              strstr(em_last_error(), "no cuda device is present: ") &&
              strstr(em_last_error(), why_rt), "%s", em_last_error());
}

Test(cuda, ember_info_reports_0_devices_with_the_reason_and_the_versions) {
    int n_rt, code;
    const char *why_rt = runtime_reason(&n_rt);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s/ember-info'", tools());
    char *out = run(cmd, &code);
    cr_assert_eq(code, 0, "%s", out);
    const char *line = strstr(out, "\n  cuda: 0 devices (");
    cr_assert(line, "%s", out);
    const char *eol = strchr(line + 1, '\n');
    cr_assert(strstr(line, why_rt) && strstr(line, why_rt) < eol, "%s", out);
    char rt[64];
    snprintf(rt, sizeof rt, "CUDA runtime %d.%d (linked statically), driver none",
             CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    cr_assert(strstr(out, rt), "no '%s' in:\n%s", rt, out);
    cr_assert(strstr(out, "cuBLAS/cuBLASLt/cuDNN not loaded (no device"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s/ember-info' --json", tools());
    out = run(cmd, &code);
    cr_assert_eq(code, 0, "%s", out);
    const char *cu = strstr(out, "\"type\": \"cuda\"");
    cr_assert(cu && strstr(cu, "\"count\": 0") && strstr(cu, why_rt), "%s", out);
    free(out);
}

Test(cuda, ember_train_device_cuda_exits_2_with_the_reason_and_trains_nothing) {
    int n_rt, code;
    const char *why_rt = runtime_reason(&n_rt);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' --device cuda --epochs 1", EM_TEST_SRCDIR,
             EM_TRAINER);
    char *out = run(cmd, &code);
    cr_assert_eq(code, 2, "%s", out);
    cr_assert(strstr(out, "--device") && strstr(out, why_rt), "%s", out);
    cr_assert_null(strstr(out, "epoch"), "it trained: %s", out);
    cr_assert_null(strstr(out, "loss"), "it trained: %s", out);
    free(out);
}

/* Replace every NUL-terminated `from` in b (n bytes) by `to` (same length); how many. */
static size_t patch(char *b, size_t n, const char *from, const char *to) {
    size_t len = strlen(from) + 1, hits = 0;
    cr_assert_eq(strlen(to) + 1, len);
    for (char *p = b; (p = memmem(p, (size_t)(b + n - p), from, len)); p += len, hits++)
        memcpy(p, to, len);
    return hits;
}

/* Copy the plugin, with its dlopen() target `soname` ("libcublas.so.N") renamed `missing`
 * ("libcublaX.so.N") and its descriptor name "ember-cuda" renamed "ember-cudx" (so the build
 * tree's own plugin does not refuse it as a duplicate first); same lengths: the file stays a
 * valid shared object. */
static void copy_with_missing_soname(const char *from, const char *to, const char *soname,
                                     const char *missing) {
    FILE *f = fopen(from, "rb");
    cr_assert(f, "%s", from);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    cr_assert_eq(patch(b, (size_t)n, soname, missing), 1);
    cr_assert_eq(patch(b, (size_t)n, "ember-cuda", "ember-cudx"), 1);
    f = fopen(to, "wb");
    cr_assert(f, "%s", to);
    cr_assert_eq(fwrite(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    free(b);
}

/* A copy of the plugin whose dlopen() target `soname` is renamed `missing` is refused with the
 * loader's message; then the build tree's plugin loads every real library. */
static void refused_without(const char *soname, const char *missing) {
    char dir[] = "/tmp/ember-cuda-test-XXXXXX", so[512], cmd[8192];
    cr_assert(mkdtemp(dir));
    snprintf(so, sizeof so, "%s/ember-cuda.so", dir);
    copy_with_missing_soname(EM_TEST_CUDA_PLUGIN, so, soname, missing);
    /* The copy comes first (EMBER_PLUGIN_PATH) and is refused; then the build tree's plugin
     * loads the real libraries. */
    snprintf(cmd, sizeof cmd, "EMBER_CUDA_LOAD_LIBRARIES=1 EMBER_PLUGIN_PATH='%s' '%s/ember-info'",
             so, tools());
    int code;
    char *out = run(cmd, &code);
    char want[512];
    snprintf(want, sizeof want, "ember-cuda: EMBER_CUDA_LOAD_LIBRARIES=1 is set, but %s cannot "
             "be loaded: %s: cannot open shared object file: No such file or directory", missing,
             missing);
    char line[600];
    snprintf(line, sizeof line, "refused   ember-cudx %s  %s", EM_VERSION_STRING, so);
    cr_assert(strstr(out, line), "the copy was not refused:\n%s", out);
    cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    char ver[128];
    snprintf(ver, sizeof ver, "cuBLAS %d.%d.%d, cuBLASLt ", CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
             CUBLAS_VER_PATCH);
    cr_assert(strstr(out, ver), "the real plugin did not report '%s':\n%s", ver, out);
    snprintf(ver, sizeof ver, " and cuDNN %d.%d.%d loaded", CUDNN_MAJOR, CUDNN_MINOR,
             CUDNN_PATCHLEVEL);
    cr_assert(strstr(out, ver), "the real plugin did not report '%s':\n%s", ver, out);
    cr_assert(strstr(out, "\n  cuda: 0 devices ("), "%s", out);
    free(out);
    unlink(so);
    rmdir(dir);
}

Test(cuda, missing_cublas_refuses_the_plugin_with_the_loaders_message) {
    refused_without("libcublas.so." EM_TEST_STR(CUBLAS_VER_MAJOR),
                    "libcublaX.so." EM_TEST_STR(CUBLAS_VER_MAJOR));
}

Test(cuda, missing_cudnn_refuses_the_plugin_with_the_loaders_message) {
    refused_without("libcudnn.so." EM_TEST_STR(CUDNN_MAJOR),
                    "libcudnX.so." EM_TEST_STR(CUDNN_MAJOR));
}

/* The "cuda" device type's device 0 (there need be no such device: kernel stacks are kept by
 * type). */
static em_device cuda_type(void) {
    em_device d = {0, 0};
    for (int i = 1; i < EM_MAX_DEVICE_TYPES; i++) {
        char name[48];
        d.type = (int16_t)i;
        if (strcmp(em_device_str(d, name, sizeof name), "cuda:0") == 0) return d;
    }
    cr_assert_fail("no cuda device type");
    return d;
}

/* The CNN ops' kernels: every floating dtype has the plugin's own kernel; conv2d and its
 * backward ops have cuDNN's above it for f32, f16 and bf16 (f64: the direct kernel alone), and
 * without a device (cuDNN not loaded) the cuDNN kernel declines, so a call would reach the
 * direct one. */
Test(cuda, cnn_kernels_are_registered_and_cudnn_declines_without_cudnn) {
    em_device d = cuda_type();
    static const char *const nn[] = {"conv2d", "conv2d_backward_data", "conv2d_backward_weight",
                                     "max_pool2d", "max_pool2d_backward", "avg_pool2d",
                                     "avg_pool2d_backward", "adaptive_avg_pool2d",
                                     "adaptive_avg_pool2d_backward", "batch_norm",
                                     "batch_norm_backward"};
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (size_t i = 0; i < sizeof nn / sizeof *nn; i++)
        for (size_t j = 0; j < 4; j++) {
            const em_op *op = em_op_find(nn[i]);
            cr_assert(op, "%s", nn[i]);
            bool conv = i < 3, cudnn = conv && dts[j] != EM_F64;
            size_t n = em_op_kernel_count(op, d, dts[j]);
            cr_assert_eq(n, cudnn ? 2u : 1u, "%s %s: %zu kernels", nn[i], em_dtype_name(dts[j]), n);
            const em_kernel_def *top = em_kernel_def_of(em_op_kernel_get(op, d, dts[j], 0));
            const em_kernel_def *low = em_kernel_def_of(em_op_kernel_get(op, d, dts[j], n - 1));
            char want[96];
            snprintf(want, sizeof want, "cuda_%s%s_%s", nn[i], conv ? "_direct" : "",
                     em_dtype_name(dts[j]));
            cr_assert_str_eq(low->name, want);
            cr_assert_eq(low->priority, 0);
            if (!cudnn) continue;
            snprintf(want, sizeof want, "cuda_%s_cudnn_%s", nn[i], em_dtype_name(dts[j]));
            cr_assert_str_eq(top->name, want);
            cr_assert_gt(top->priority, low->priority);
            cr_assert(top->supports, "%s", want);
            em_kernel_ctx k = {.struct_size = sizeof k, .op = op, .device = d};
            cr_assert_not(top->supports(&k), "%s accepts a call without cuDNN", want);
        }
    /* no convolution plan was built */
    const char *(*plans)(void) = (const char *(*)(void))em_backend_proc("cuda", "conv_plans");
    cr_assert(plans, "%s", em_last_error());
    cr_assert_str_eq(plans(), "0 on cuDNN engines, 0 on the direct kernels");
}

Test(cuda, settings_read_at_load_are_checked_and_shown) {
    char cmd[4096];
    int code;
    snprintf(cmd, sizeof cmd, "EMBER_CUDA_WORKSPACE_MB=lots '%s/ember-info'", tools());
    char *out = run(cmd, &code);
    cr_assert(strstr(out, "EMBER_CUDA_WORKSPACE_MB='lots' is not a size in MiB from 1 to 4096"),
              "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "EMBER_CUDA_SYNC=1 EMBER_CUDA_WORKSPACE_MB=8 '%s/ember-info'",
             tools());
    out = run(cmd, &code);
    cr_assert_eq(code, 0, "%s", out);
    cr_assert(strstr(out, "EMBER_CUDA_SYNC=1; cuBLAS workspace 8 MiB per stream"), "%s", out);
    free(out);
    /* the TF32 setting, by name */
    em_status (*set)(const char *) =
        (em_status(*)(const char *))em_backend_proc("cuda", "set_float32_matmul_precision");
    const char *(*get)(void) =
        (const char *(*)(void))em_backend_proc("cuda", "float32_matmul_precision");
    cr_assert(set && get, "%s", em_last_error());
    cr_assert_str_eq(get(), "highest");
    cr_assert_eq(set("high"), EM_OK);
    cr_assert_str_eq(get(), "high");
    cr_assert_eq(set("fast"), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "'fast' is not a precision"), "%s", em_last_error());
    cr_assert_eq(set("highest"), EM_OK);
    int (*drv)(void) = (int (*)(void))em_backend_proc("cuda", "driver_version");
    int (*rt)(void) = (int (*)(void))em_backend_proc("cuda", "runtime_version");
    cr_assert(drv && rt);
    cr_assert_eq(drv(), 0, "no driver here");
    cr_assert_eq(rt() / 1000, EM_TEST_CUDA_MAJOR);
}

/* Issue 26 item 2: every (op, dtype) the CPU backend has a kernel for has a CUDA kernel,
 * checked on the plugins' registrations (no device needed; the same set ember-opcheck's
 * support mode shows on a GPU machine). The convolution, pooling and batch-norm ops are the
 * cuDNN part's (listed here until it lands). */
static const em_registry *plugin_registry(const char *name) {
    em_plugin_info info;
    find_plugin(name, &info);
    cr_assert(info.registry, "plugin %s registered nothing", name);
    return info.registry;
}

static bool has_kernel(const em_registry *r, const char *op, const char *devtype, em_dtype dt) {
    for (size_t i = 0; i < em_registry_kernel_count(r); i++) {
        em_kernel_info ki;
        if (em_registry_kernel_get(r, i, &ki) == EM_OK && strcmp(ki.op, op) == 0 &&
            strcmp(ki.device_type, devtype) == 0 && ki.dtype == dt)
            return true;
    }
    return false;
}

/* The fused ops (docs/performance.md, "Design: fused ops"): a device without the op's own
 * kernel runs its composite, the ops it fuses, on the device; such an op counts as covered
 * when CUDA has a kernel for each of those ops in that dtype. */
static bool composed_on(const em_registry *cuda, const char *op, em_dtype dt) {
    static const struct {
        const char *op, *parts[2];
    } fused[] = {{"conv2d_relu", {"conv2d", "relu"}}, {"max_pool2d_relu", {"max_pool2d", "relu"}}};
    for (size_t i = 0; i < sizeof fused / sizeof fused[0]; i++)
        if (strcmp(op, fused[i].op) == 0)
            return has_kernel(cuda, fused[i].parts[0], "cuda", dt) &&
                   has_kernel(cuda, fused[i].parts[1], "cuda", dt);
    return false;
}

Test(cuda, every_op_the_cpu_has_a_kernel_for_has_a_cuda_kernel) {
    const em_registry *cpu = plugin_registry("ember-cpu"), *cuda = plugin_registry("ember-cuda");
    char missing[4096] = "";
    size_t used = 0, checked = 0;
    for (size_t i = 0; i < em_registry_kernel_count(cpu); i++) {
        em_kernel_info ki;
        cr_assert_eq(em_registry_kernel_get(cpu, i, &ki), EM_OK);
        if (strcmp(ki.device_type, "cpu") != 0) continue;
        checked++;
        if (has_kernel(cuda, ki.op, "cuda", ki.dtype) || composed_on(cuda, ki.op, ki.dtype))
            continue;
        if (used + 64 < sizeof missing)
            used += (size_t)snprintf(missing + used, sizeof missing - used, " %s/%s", ki.op,
                                     em_dtype_name(ki.dtype));
    }
    cr_assert_gt(checked, 300, "only %zu CPU kernels found", checked);
    cr_assert_str_eq(missing, "", "CPU kernels without a CUDA kernel:%s", missing);
}

/*
 * test_plugin.c — the plugin loader, the device-type registry and dispatch across devices,
 * driven through the test plugins in tests/plugins/:
 *   testdev.so           "ember-testdev": a second device type, 2 devices in tagged host
 *                        memory, kernels for copy and fill (every dtype) and add (float32)
 *   bad_abi.so           built for plugin ABI EM_PLUGIN_ABI_MAJOR + 1
 *   no_entry.so          a shared object without ember_plugin_entry
 *   bad_dep.so           needs libember_test_gone.so, which is not on any search path
 *   failing_register.so  registers an op, a device type and kernels, then fails
 *   dup_cpu.so           calls itself "ember-cpu"
 *   kind_plugin.so       "ember-testkind": declares the class kind "codec" and registers
 *                        two classes into it (kind_plugin.h)
 *   short_desc.so        a descriptor from older headers (it ends at register_fn), followed
 *                        by slots that abort if the core reads past its struct_size
 * and the tool tools/ember-info, run on the same plugins.
 *
 * The plugins are found through EMBER_TEST_PLUGIN_DIR (set by `make check`). The real CPU
 * plugin is put first on EMBER_PLUGIN_PATH: the path is searched in order and the first
 * plugin of a name wins, so with the test directory alone dup_cpu.so would be taken as
 * "ember-cpu" and the real one refused as the duplicate.
 *
 * Every expected value is computed here with plain loops.
 */
#define _GNU_SOURCE /* open_memstream, setenv */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <ember/ember.h>

#include "common.h" /* em_test_run; clean_shutdown.h: every Test() ends with a clean shutdown */
#include "plugins/kind_plugin.h"

/* ---- paths and set-up ---------------------------------------------------------------------- */

static const char *test_plugin_dir(void) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    return d;
}

/* The build tree's CPU plugin directory, from EMBER_TEST_PLUGIN_DIR =
 * <build>/tests/plugins/.libs. */
static const char *cpu_plugin_dir(void) {
    static char buf[4096];
    const char *d = test_plugin_dir(), *suffix = "/tests/plugins/.libs";
    size_t n = strlen(d), s = strlen(suffix);
    cr_assert(n > s && strcmp(d + n - s, suffix) == 0, "unexpected EMBER_TEST_PLUGIN_DIR %s", d);
    snprintf(buf, sizeof buf, "%.*s/plugins/backend-cpu/.libs", (int)(n - s), d);
    return buf;
}

static const char *test_plugin_file(const char *base) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", test_plugin_dir(), base);
    return buf;
}

static void set_plugin_path(void) {
    char path[8192];
    snprintf(path, sizeof path, "%s:%s", cpu_plugin_dir(), test_plugin_dir());
    setenv("EMBER_PLUGIN_PATH", path, 1);
}

static void init_with_test_plugins(void) {
    set_plugin_path();
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
}

static void teardown(void) {
    em_log_set(NULL, NULL);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    unsetenv("EMBER_PLUGIN_PATH");
    unsetenv("EMBER_DISABLE_PLUGINS");
}

/* No set-up: the test sets the environment and calls em_init() itself. */
static void no_setup(void) {}

#define assert_error(status, needle)                                                           \
    do {                                                                                       \
        cr_assert_eq(em_last_status(), (status), "status %s, message: %s",                     \
                     em_status_name(em_last_status()), em_last_error());                       \
        cr_assert(strstr(em_last_error(), (needle)), "message '%s' lacks '%s'",                \
                  em_last_error(), (needle));                                                  \
    } while (0)

/* The candidate whose file is <dir>/<base> (or whose path is exactly base, for the program's
 * own entry); fails the test when there is none. */
static em_plugin_info plugin_by_file(const char *base) {
    size_t n = em_plugin_count(), blen = strlen(base);
    for (size_t i = 0; i < n; i++) {
        em_plugin_info info;
        cr_assert_eq(em_plugin_get(i, &info), EM_OK, "%s", em_last_error());
        size_t plen = strlen(info.path);
        if (strcmp(info.path, base) == 0) return info;
        if (plen > blen && info.path[plen - blen - 1] == '/' &&
            strcmp(info.path + plen - blen, base) == 0)
            return info;
    }
    cr_assert_fail("no plugin candidate %s (of %zu)", base, n);
    return (em_plugin_info){0};
}

static void assert_refused(const char *base, const char *needle) {
    em_plugin_info p = plugin_by_file(base);
    cr_assert_eq(p.status, EM_PLUGIN_REFUSED, "%s has status %d", base, (int)p.status);
    cr_assert_not_null(p.reason, "%s has no reason", base);
    cr_assert(strstr(p.reason, needle), "%s: reason '%s' lacks '%s'", base, p.reason, needle);
    cr_assert_null(p.registry, "%s was refused but has a registry", base);
}

static em_device dev_of(const char *s) {
    em_device d;
    cr_assert_eq(em_device_parse(s, &d), EM_OK, "%s: %s", s, em_last_error());
    return d;
}

/* A float32 tensor on dev with values v[i]. */
static em_tensor *f32_on(em_device dev, int ndim, const int64_t *shape, const float *v) {
    em_tensor *t = em_from_data(v, ndim, shape, EM_F32, dev);
    cr_assert_not_null(t, "from_data: %s", em_last_error());
    return t;
}

/* All elements of t, as float32, into out (numel entries). */
static void read_f32(const em_tensor *t, float *out, size_t n) {
    cr_assert_eq(em_tensor_dtype(t), EM_F32);
    cr_assert_eq((size_t)em_tensor_numel(t), n);
    cr_assert_eq(em_tensor_to_host(t, out, n * sizeof *out), EM_OK, "%s", em_last_error());
}

/* ---- discovery and refusal ------------------------------------------------------------------ */

TestSuite(plugin, .init = init_with_test_plugins, .fini = teardown);
TestSuite(plugin_env, .init = no_setup, .fini = teardown);

Test(plugin, search_path_lists_the_environment_first) {
    const char *sp = em_plugin_search_path();
    cr_assert(strncmp(sp, cpu_plugin_dir(), strlen(cpu_plugin_dir())) == 0, "search path %s", sp);
    cr_assert(strstr(sp, test_plugin_dir()), "search path %s lacks %s", sp, test_plugin_dir());
}

Test(plugin, cpu_and_testdev_load) {
    em_plugin_info cpu = plugin_by_file("ember-cpu.so");
    cr_assert_eq(cpu.status, EM_PLUGIN_LOADED, "ember-cpu: %s", cpu.reason ? cpu.reason : "");
    cr_assert_str_eq(cpu.name, "ember-cpu");
    cr_assert(strstr(cpu.path, "backend-cpu"), "ember-cpu from %s", cpu.path);
    cr_assert_null(cpu.reason);
    cr_assert_geq(em_registry_kernel_count(cpu.registry), 20);

    em_plugin_info td = plugin_by_file("testdev.so");
    cr_assert_eq(td.status, EM_PLUGIN_LOADED, "testdev: %s", td.reason ? td.reason : "");
    cr_assert_str_eq(td.name, "ember-testdev");
    cr_assert_str_eq(td.version, EM_VERSION_STRING);
    cr_assert_eq(em_registry_device_type_count(td.registry), 1);
    cr_assert_str_eq(em_registry_device_type_name(td.registry, 0), "testdev");
    cr_assert_eq(em_registry_op_count(td.registry), 0);
    /* copy and fill for each of the 8 dtypes, add for float32. */
    cr_assert_eq(em_registry_kernel_count(td.registry), 2 * EM_DTYPE_COUNT + 1);
    int adds = 0;
    for (size_t i = 0; i < em_registry_kernel_count(td.registry); i++) {
        em_kernel_info k;
        cr_assert_eq(em_registry_kernel_get(td.registry, i, &k), EM_OK);
        cr_assert_str_eq(k.device_type, "testdev");
        cr_assert_eq(k.priority, 0);
        if (strcmp(k.op, "add") == 0) {
            adds++;
            cr_assert_eq(k.dtype, EM_F32);
            cr_assert_str_eq(k.name, "testdev_add_float32");
        }
    }
    cr_assert_eq(adds, 1);
    cr_assert_eq(em_device_count("testdev"), 2);
    cr_assert_eq(em_device_count("cpu"), 1);
}

/* Every test of this suite also unloads short_desc.so at em_shutdown(): reading its
 * shutdown_fn past the descriptor's struct_size aborts there. */
Test(plugin, an_older_shorter_descriptor_is_read_within_its_size) {
    em_plugin_info p = plugin_by_file("short_desc.so");
    cr_assert_eq(p.status, EM_PLUGIN_LOADED, "%s", p.reason ? p.reason : "");
    cr_assert_str_eq(p.version, "0.9");
    size_t n = em_plugin_count(), i = 0;
    for (; i < n; i++) {
        em_plugin_info q;
        cr_assert_eq(em_plugin_get(i, &q), EM_OK);
        if (q.path == p.path) break;
    }
    cr_assert_lt(i, n);
    cr_assert_null(em_plugin_describe(i), "describe read past the descriptor's struct_size");
    em_shutdown(); /* would call the shutdown_fn past its struct_size */
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
}

Test(plugin, bad_abi_is_refused) {
    char want[64];
    snprintf(want, sizeof want, "built for plugin ABI %d", EM_PLUGIN_ABI_MAJOR + 1);
    assert_refused("bad_abi.so", want);
}

Test(plugin, no_entry_is_refused) {
    assert_refused("no_entry.so", "no entry symbol 'ember_plugin_entry'");
    cr_assert_null(plugin_by_file("no_entry.so").name);
}

Test(plugin, missing_dependency_keeps_the_loader_message) {
    assert_refused("bad_dep.so", "libember_test_gone.so");
    assert_refused("bad_dep.so", "cannot open shared object file");
}

Test(plugin, failing_registration_is_withdrawn) {
    assert_refused("failing_register.so", "registration failed");
    assert_refused("failing_register.so", "refusing on purpose after registering op "
                   "'failing.op'");
    cr_assert_null(em_op_find("failing.op"));
    assert_error(EM_ERR_NOTFOUND, "failing.op");
    cr_assert_eq(em_device_count("failingdev"), 0);
    em_device d;
    cr_assert_neq(em_device_parse("failingdev", &d), EM_OK);
    assert_error(EM_ERR_DEVICE, "'failingdev'");
    /* Its high-priority float32 add kernel on the CPU went with it. */
    const float av[3] = {1, 2, 3}, bv[3] = {10, 20, 30};
    int64_t n = 3;
    em_tensor *a = f32_on(em_cpu(), 1, &n, av), *b = f32_on(em_cpu(), 1, &n, bv);
    em_tensor *c = em_add(a, b);
    cr_assert_not_null(c, "%s", em_last_error());
    float got[3];
    read_f32(c, got, 3);
    for (int i = 0; i < 3; i++) cr_assert_float_eq(got[i], av[i] + bv[i], 0, "element %d", i);
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(c);
}

Test(plugin, duplicate_name_is_refused) {
    assert_refused("dup_cpu.so", "already loaded");
    assert_refused("dup_cpu.so", "ember-cpu");
    /* The real one is the one that runs. */
    cr_assert_eq(plugin_by_file("ember-cpu.so").status, EM_PLUGIN_LOADED);
}

Test(plugin_env, disabled_plugin_is_listed_as_disabled) {
    setenv("EMBER_DISABLE_PLUGINS", "ember-test-bad-dep,ember-testdev", 1);
    init_with_test_plugins();
    em_plugin_info p = plugin_by_file("testdev.so");
    cr_assert_eq(p.status, EM_PLUGIN_DISABLED);
    cr_assert_str_eq(p.name, "ember-testdev");
    cr_assert(p.reason && strstr(p.reason, "EMBER_DISABLE_PLUGINS"), "reason %s", p.reason);
    cr_assert_null(p.registry);
    cr_assert_eq(em_device_count("testdev"), 0);
    em_device d;
    cr_assert_neq(em_device_parse("testdev:0", &d), EM_OK);
    assert_error(EM_ERR_DEVICE, "no backend for device type 'testdev' is loaded");
    /* bad_dep cannot even be opened, so its name is unknown and it stays refused. */
    cr_assert_eq(plugin_by_file("bad_dep.so").status, EM_PLUGIN_REFUSED);
    cr_assert_eq(plugin_by_file("ember-cpu.so").status, EM_PLUGIN_LOADED);
}

Test(plugin_env, load_after_init) {
    /* The build tree's plugins only: the CPU. */
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_device_count("testdev"), 0);
    size_t before = em_plugin_count();

    cr_assert_eq(em_plugin_load(test_plugin_file("bad_abi.so")), EM_ERR_PLUGIN);
    assert_error(EM_ERR_PLUGIN, "built for plugin ABI");
    assert_error(EM_ERR_PLUGIN, "bad_abi.so");
    cr_assert_eq(em_plugin_load(test_plugin_file("no_entry.so")), EM_ERR_PLUGIN);
    assert_error(EM_ERR_PLUGIN, "no entry symbol 'ember_plugin_entry'");
    cr_assert_eq(em_plugin_load(test_plugin_file("failing_register.so")), EM_ERR_PLUGIN);
    assert_error(EM_ERR_PLUGIN, "registration failed");
    cr_assert_null(em_op_find("failing.op"));
    cr_assert_eq(em_plugin_load(test_plugin_file("no_such_plugin.so")), EM_ERR_PLUGIN);
    assert_error(EM_ERR_PLUGIN, "no_such_plugin.so");

    cr_assert_eq(em_plugin_load(test_plugin_file("testdev.so")), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_device_count("testdev"), 2);
    cr_assert_eq(plugin_by_file("testdev.so").status, EM_PLUGIN_LOADED);
    cr_assert_eq(em_plugin_count(), before + 5);
    /* A file already seen is not loaded twice. */
    cr_assert_eq(em_plugin_load(test_plugin_file("testdev.so")), EM_OK);
    cr_assert_eq(em_plugin_count(), before + 5);
}

/* ---- devices -------------------------------------------------------------------------------- */

Test(plugin, device_parse) {
    em_device d = dev_of("testdev:1");
    cr_assert_neq(d.type, EM_DEVICE_CPU_TYPE);
    cr_assert_eq(d.index, 1);
    char buf[32];
    cr_assert_str_eq(em_device_str(d, buf, sizeof buf), "testdev:1");
    em_device d0 = dev_of("testdev");
    cr_assert_eq(d0.type, d.type);
    cr_assert_eq(d0.index, 0);
    cr_assert(!em_device_equal(d0, d));

    em_device bad;
    cr_assert_eq(em_device_parse("testdev:5", &bad), EM_ERR_DEVICE);
    assert_error(EM_ERR_DEVICE, "testdev:5");
    assert_error(EM_ERR_DEVICE, "2 testdev devices");
    /* the one CPU device: the message says so and names both spellings (issue 13) */
    cr_assert_eq(em_device_parse("cpu:1", &bad), EM_ERR_DEVICE);
    assert_error(EM_ERR_DEVICE, "device cpu:1 does not exist: only 1 cpu device is present, "
                 "'cpu' or 'cpu:0'");
    cr_assert_eq(em_device_parse("xpu", &bad), EM_ERR_DEVICE); /* a type no plugin registers */
    assert_error(EM_ERR_DEVICE, "no backend for device type 'xpu' is loaded; installed "
                 "plugins: ");
    assert_error(EM_ERR_DEVICE, "ember-cpu");
    assert_error(EM_ERR_DEVICE, "ember-testdev");
}

Test(plugin, device_properties) {
    em_device_props p = {.struct_size = sizeof p};
    cr_assert_eq(em_device_properties(dev_of("testdev:1"), &p), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(p.name, "Ember test device 1 (host memory)");
    cr_assert_eq(p.total_memory, (size_t)256 << 20);
    cr_assert_eq(p.compute_units, 1);

    int64_t n = 1000;
    em_tensor *t = em_zeros(1, &n, EM_F64, dev_of("testdev:1"));
    cr_assert_not_null(t, "%s", em_last_error());
    em_device_props q = {.struct_size = sizeof q};
    cr_assert_eq(em_device_properties(dev_of("testdev:1"), &q), EM_OK);
    cr_assert_leq(q.free_memory, q.total_memory - 8000, "free %zu of %zu", q.free_memory,
                  q.total_memory);
    em_memory_stats ms;
    cr_assert_eq(em_memory_stats_get(dev_of("testdev:1"), &ms), EM_OK, "%s", em_last_error());
    cr_assert_geq(ms.current[EM_MEM_ACTIVATION], 8000);
    em_tensor_release(t);

    em_device_props c = {.struct_size = sizeof c};
    cr_assert_eq(em_device_properties(em_cpu(), &c), EM_OK, "%s", em_last_error());
    cr_assert_neq(c.name[0], '\0');
    cr_assert_geq(c.compute_units, 1);

    /* Everything released and the cache emptied: the device has all its memory back. */
    em_empty_cache();
    cr_assert_eq(em_device_properties(dev_of("testdev:1"), &q), EM_OK);
    cr_assert_eq(q.free_memory, q.total_memory);

    /* the prefix rule: a caller's struct that ends at compute_units (no trailing padding) is
     * filled as far as it goes and not a byte further */
    unsigned char buf[sizeof(em_device_props) + 8];
    memset(buf, 0xAB, sizeof buf);
    em_device_props *pre = (em_device_props *)(void *)buf;
    const size_t pre_size = offsetof(em_device_props, compute_units) + sizeof(int);
    pre->struct_size = pre_size;
    cr_assert_eq(em_device_properties(em_cpu(), pre), EM_OK, "%s", em_last_error());
    cr_assert_eq(pre->struct_size, pre_size);
    cr_assert_str_eq(pre->name, c.name);
    cr_assert_eq(pre->compute_units, c.compute_units);
    for (size_t i = pre_size; i < sizeof buf; i++)
        cr_assert_eq(buf[i], 0xAB, "byte %zu past the caller's struct_size written", i);
    em_device_props small = {.struct_size = 8};
    cr_assert_eq(em_device_properties(em_cpu(), &small), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "struct_size");
}

Test(plugin, host_memory_wrapped_as_device_memory_is_caught) {
    /* testdev checks every address it is given: host memory is not testdev memory. */
    float host[4] = {1, 2, 3, 4};
    int64_t n = 4;
    em_tensor *w = em_tensor_wrap(host, 1, &n, NULL, EM_F32, dev_of("testdev:0"), NULL, NULL);
    cr_assert_not_null(w, "%s", em_last_error());
    cr_assert_null(em_to_device(w, em_cpu()));
    assert_error(EM_ERR_DEVICE, "is not testdev:0 memory");
    float out[4];
    cr_assert_eq(em_tensor_to_host(w, out, sizeof out), EM_ERR_DEVICE);
    assert_error(EM_ERR_DEVICE, "testdev");
    em_tensor_release(w);
}

/* cpu -> testdev:0 -> testdev:1 -> cpu keeps the bytes of n elements of size es. */
static void round_trip(em_dtype dt, const void *data, int64_t n, size_t es) {
    em_tensor *c = em_from_data(data, 1, &n, dt, em_cpu());
    cr_assert_not_null(c, "%s", em_last_error());
    em_tensor *t0 = em_to_device(c, dev_of("testdev:0"));
    cr_assert_not_null(t0, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(t0), dev_of("testdev:0")));
    em_tensor *t1 = em_to_device(t0, dev_of("testdev:1"));
    cr_assert_not_null(t1, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(t1), dev_of("testdev:1")));
    em_tensor *back = em_to_device(t1, em_cpu());
    cr_assert_not_null(back, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(back), em_cpu()));
    cr_assert_eq(em_tensor_dtype(back), dt);
    cr_assert_eq(memcmp(em_tensor_data(back), data, (size_t)n * es), 0, "%s changed on the way",
                 em_dtype_name(dt));
    em_tensor_release(c);
    em_tensor_release(t0);
    em_tensor_release(t1);
    em_tensor_release(back);
}

Test(plugin, round_trip_keeps_values) {
    const float f[5] = {0.0f, -1.5f, 3.14159274f, 1e-30f, 6.5e30f};
    round_trip(EM_F32, f, 5, sizeof *f);
    /* Beyond 2^53: a copy through double would lose these. */
    const int64_t i[4] = {9007199254740993LL, -1, INT64_MAX, INT64_MIN};
    round_trip(EM_I64, i, 4, sizeof *i);
    uint16_t b[4];
    const float bv[4] = {1.5f, -2.25f, 3.0f, 0.0078125f};
    for (int k = 0; k < 4; k++) b[k] = em_f32_to_bf16(bv[k]);
    round_trip(EM_BF16, b, 4, sizeof *b);
}

Test(plugin, strided_views_cross_devices) {
    /* x (3, 4) = 10 * r + c; its transpose (4, 3) is strided. */
    float x[12];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) x[r * 4 + c] = (float)(10 * r + c);
    int64_t shape[2] = {3, 4};
    em_tensor *cpu = f32_on(em_cpu(), 2, shape, x);
    em_tensor *cpu_t = em_transpose(cpu, 0, 1);
    /* A strided CPU view to the device... */
    em_tensor *dev_t = em_to_device(cpu_t, dev_of("testdev:0"));
    cr_assert_not_null(dev_t, "%s", em_last_error());
    float got[12];
    read_f32(dev_t, got, 12);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 3; c++)
            cr_assert_float_eq(got[r * 3 + c], x[c * 4 + r], 0, "[%d, %d]", r, c);
    /* ...and a strided device view (the testdev copy kernel makes it contiguous) to another
     * device and back. */
    em_tensor *dev = em_to_device(cpu, dev_of("testdev:1"));
    em_tensor *dev_tr = em_transpose(dev, 0, 1);
    em_tensor *view = em_slice(dev_tr, 0, 1, 4, 2); /* rows 1 and 3: (2, 3) */
    cr_assert_not_null(view, "%s", em_last_error());
    cr_assert(!em_tensor_is_contiguous(view));
    em_tensor *moved = em_to_device(view, dev_of("testdev:0"));
    em_tensor *home = em_to_device(moved, em_cpu());
    cr_assert_not_null(home, "%s", em_last_error());
    read_f32(home, got, 6);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++)
            cr_assert_float_eq(got[r * 3 + c], x[c * 4 + (1 + 2 * r)], 0, "[%d, %d]", r, c);
    em_tensor_release(cpu);
    em_tensor_release(cpu_t);
    em_tensor_release(dev_t);
    em_tensor_release(dev);
    em_tensor_release(dev_tr);
    em_tensor_release(view);
    em_tensor_release(moved);
    em_tensor_release(home);
}

Test(plugin, copied_bytes_are_counted) {
    int64_t n = 256;
    const size_t nbytes = 256 * sizeof(float);
    em_tensor *c = em_zeros(1, &n, EM_F32, em_cpu());
    em_placement_reset();
    em_tensor *t0 = em_to_device(c, dev_of("testdev:0"));
    em_tensor *t1 = em_to_device(t0, dev_of("testdev:1"));
    em_tensor *back = em_to_device(t1, em_cpu());
    cr_assert_not_null(back, "%s", em_last_error());
    em_placement_stats td, cpu;
    cr_assert_eq(em_placement_get("testdev", &td), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_placement_get("cpu", &cpu), EM_OK, "%s", em_last_error());
    /* cpu -> td:0 (in), td:0 -> td:1 (out and in), td:1 -> cpu (out). */
    cr_assert_eq(td.bytes_in, 2 * nbytes, "testdev bytes_in %llu",
                 (unsigned long long)td.bytes_in);
    cr_assert_eq(td.bytes_out, 2 * nbytes, "testdev bytes_out %llu",
                 (unsigned long long)td.bytes_out);
    cr_assert_eq(cpu.bytes_out, nbytes);
    cr_assert_eq(cpu.bytes_in, nbytes);
    cr_assert_eq(td.fallbacks, 0);
    cr_assert_eq(em_placement_get("xpu", &td), EM_ERR_NOTFOUND);
    assert_error(EM_ERR_NOTFOUND, "'xpu'");
    em_tensor_release(c);
    em_tensor_release(t0);
    em_tensor_release(t1);
    em_tensor_release(back);
}

Test(plugin, streams_and_events) {
    em_device d0 = dev_of("testdev:0"), d1 = dev_of("testdev:1");
    em_stream *s = NULL, *s2 = NULL;
    em_event *e = NULL, *never = NULL;
    cr_assert_eq(em_stream_create(d0, &s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_create(d0, &s2), EM_OK, "%s", em_last_error());
    cr_assert_not_null(s);
    cr_assert_neq(s, s2);
    cr_assert_eq(em_event_create(d0, &e), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_event_create(d0, &never), EM_OK, "%s", em_last_error());

    cr_assert_eq(em_event_record(d0, e, s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_event_wait(d0, s2, e), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_event_wait(d0, NULL, e), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_event_synchronize(d0, e), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_synchronize(d0, s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_synchronize(d0, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_device_synchronize(d1), EM_OK, "%s", em_last_error());

    /* Ordering: an event never recorded cannot be waited for. */
    cr_assert_eq(em_event_synchronize(d0, never), EM_ERR_STATE);
    assert_error(EM_ERR_STATE, "never recorded");
    cr_assert_eq(em_event_wait(d0, s, never), EM_ERR_STATE);
    assert_error(EM_ERR_STATE, "never recorded");
    /* The core passes the device's ordinal: handles of testdev:0 are foreign on testdev:1. */
    cr_assert_eq(em_event_record(d1, e, NULL), EM_ERR_DEVICE);
    assert_error(EM_ERR_DEVICE, "belongs to testdev:0, not testdev:1");
    cr_assert_eq(em_stream_synchronize(d1, s), EM_ERR_DEVICE);
    assert_error(EM_ERR_DEVICE, "belongs to testdev:0");

    em_event_free(d0, e);
    em_event_free(d0, never);
    em_stream_free(d0, s);
    em_stream_free(d0, s2);

    /* The CPU is synchronous: its streams are the default one. */
    em_stream *cs = (em_stream *)1;
    cr_assert_eq(em_stream_create(em_cpu(), &cs), EM_OK);
    cr_assert_null(cs);
}

static void *current_stream_of_other_thread(void *dev) {
    return em_stream_current(*(em_device *)dev);
}

Test(plugin, current_stream_per_thread_and_device) {
    em_device d0 = dev_of("testdev:0"), d1 = dev_of("testdev:1");
    em_stream *s = NULL, *s2 = NULL;
    cr_assert_eq(em_stream_create(d0, &s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_create(d1, &s2), EM_OK, "%s", em_last_error());
    cr_assert_null(em_stream_current(d0));
    cr_assert_eq(em_stream_set_current(d0, s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(d1, s2), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_current(d0), s);
    cr_assert_eq(em_stream_current(d1), s2);
    cr_assert_null(em_stream_current(em_cpu()));

    /* Another thread has its own current streams: the default. */
    pthread_t th;
    void *seen = (void *)1;
    cr_assert_eq(pthread_create(&th, NULL, current_stream_of_other_thread, &d0), 0);
    cr_assert_eq(pthread_join(th, &seen), 0);
    cr_assert_null(seen);

    /* NULL restores the default; freeing the current stream does too. */
    cr_assert_eq(em_stream_set_current(d1, NULL), EM_OK);
    cr_assert_null(em_stream_current(d1));
    cr_assert_eq(em_stream_current(d0), s);
    em_stream_free(d0, s);
    cr_assert_null(em_stream_current(d0));

    /* The CPU has only its default stream; unknown devices are refused. */
    cr_assert_eq(em_stream_set_current(em_cpu(), NULL), EM_OK);
    cr_assert_eq(em_stream_set_current(em_cpu(), s2), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "has no streams");
    em_device bogus = {.type = EM_MAX_DEVICE_TYPES - 1, .index = 0};
    cr_assert_eq(em_stream_set_current(bogus, NULL), EM_ERR_DEVICE);
    em_stream_free(d1, s2);
}

/* ---- dispatch across devices ---------------------------------------------------------------- */

Test(plugin, ops_refuse_mixed_devices) {
    const float v[2] = {1, 2};
    int64_t n = 2;
    em_tensor *a = f32_on(em_cpu(), 1, &n, v), *b = f32_on(dev_of("testdev:0"), 1, &n, v);
    cr_assert_null(em_add(a, b));
    assert_error(EM_ERR_DEVICE, "add");
    assert_error(EM_ERR_DEVICE, "cpu");
    assert_error(EM_ERR_DEVICE, "testdev:0");
    em_tensor *c = f32_on(dev_of("testdev:1"), 1, &n, v);
    cr_assert_null(em_add(b, c));
    assert_error(EM_ERR_DEVICE, "testdev:1");
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(c);
}

/* a (3, 4) and b (4,) with distinct values; y = a + b broadcast, computed by a loop. */
static void add_inputs(float *a, float *b, float *want) {
    for (int i = 0; i < 12; i++) a[i] = 0.25f * (float)i - 1.0f;
    for (int j = 0; j < 4; j++) b[j] = 100.0f * (float)(j + 1);
    for (int i = 0; i < 12; i++) want[i] = a[i] + b[i % 4];
}

Test(plugin, testdev_add_matches_the_cpu) {
    em_fallback_set(EM_FALLBACK_ERROR);
    float av[12], bv[4], want[12], got_dev[12], got_cpu[12];
    add_inputs(av, bv, want);
    int64_t sa[2] = {3, 4}, sb = 4;
    em_device d = dev_of("testdev:1");
    em_tensor *a = f32_on(d, 2, sa, av), *b = f32_on(d, 1, &sb, bv);
    em_tensor *ca = f32_on(em_cpu(), 2, sa, av), *cb = f32_on(em_cpu(), 1, &sb, bv);
    em_placement_reset();
    em_tensor *y = em_add(a, b), *cy = em_add(ca, cb);
    cr_assert_not_null(y, "%s", em_last_error());
    cr_assert_not_null(cy, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(y), d));
    read_f32(y, got_dev, 12);
    read_f32(cy, got_cpu, 12);
    for (int i = 0; i < 12; i++) {
        cr_assert_float_eq(got_dev[i], want[i], 0, "testdev [%d]", i);
        cr_assert_float_eq(got_dev[i], got_cpu[i], 0, "testdev vs cpu [%d]", i);
    }
    em_placement_stats st;
    cr_assert_eq(em_placement_get("testdev", &st), EM_OK);
    cr_assert_geq(st.ops, 1);
    cr_assert_eq(st.fallbacks, 0);
    /* In place, with a strided (transposed) operand of the same shape. */
    int64_t s44[2] = {4, 4};
    float m[16];
    for (int i = 0; i < 16; i++) m[i] = (float)(i * i);
    em_tensor *dm = f32_on(d, 2, s44, m);
    em_tensor *dmt = em_transpose(dm, 0, 1);
    em_tensor *acc = em_zeros(2, s44, EM_F32, d);
    cr_assert_eq(em_add_(acc, dmt), EM_OK, "%s", em_last_error());
    float got[16];
    read_f32(acc, got, 16);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) cr_assert_float_eq(got[r * 4 + c], m[c * 4 + r], 0);
    em_tensor *parts[] = {a, b, ca, cb, y, cy, dm, dmt, acc};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) em_tensor_release(parts[i]);
}

Test(plugin, fallback_error_names_op_device_and_dtype) {
    em_fallback_set(EM_FALLBACK_ERROR);
    const float v[3] = {1, 2, 3};
    int64_t n = 3;
    em_device d = dev_of("testdev:0");
    em_tensor *a = f32_on(d, 1, &n, v);
    cr_assert_null(em_mul(a, a));
    assert_error(EM_ERR_NOKERNEL, "mul: no kernel for device 'testdev' and dtype float32");
    assert_error(EM_ERR_NOKERNEL, "registered: cpu (float32");
    assert_error(EM_ERR_NOKERNEL, "EMBER_FALLBACK=allow");

    em_tensor *a64 = em_to_dtype(a, EM_F64); /* the testdev copy kernel converts */
    cr_assert_not_null(a64, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(a64), d));
    cr_assert_null(em_add(a64, a64));
    assert_error(EM_ERR_NOKERNEL, "add: no kernel for device 'testdev' and dtype float64");
    assert_error(EM_ERR_NOKERNEL, "testdev (float32)");
    em_placement_stats st;
    cr_assert_eq(em_placement_get("testdev", &st), EM_OK);
    cr_assert_eq(st.fallbacks, 0);
    em_tensor_release(a);
    em_tensor_release(a64);
}

Test(plugin, fallback_allow_runs_on_the_cpu) {
    em_fallback_set(EM_FALLBACK_ALLOW);
    float av[12], bv[4], unused[12];
    add_inputs(av, bv, unused);
    int64_t sa[2] = {3, 4}, sb = 4;
    em_device d = dev_of("testdev:0");
    em_tensor *a = f32_on(d, 2, sa, av), *b = f32_on(d, 1, &sb, bv);
    em_placement_reset();
    em_tensor *y = em_mul(a, b);
    cr_assert_not_null(y, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(y), d), "the result stays on testdev:0");
    float got[12];
    read_f32(y, got, 12);
    for (int i = 0; i < 12; i++) cr_assert_float_eq(got[i], av[i] * bv[i % 4], 0, "[%d]", i);

    /* float64 add: no testdev kernel either. */
    double x[3] = {0.1, 1e300, -7.0}, z[3];
    int64_t n = 3;
    em_tensor *dx = em_from_data(x, 1, &n, EM_F64, d);
    em_tensor *s = em_add(dx, dx);
    cr_assert_not_null(s, "%s", em_last_error());
    cr_assert_eq(em_tensor_to_host(s, z, sizeof z), EM_OK, "%s", em_last_error());
    for (int i = 0; i < 3; i++) cr_assert_eq(z[i], x[i] + x[i], "[%d]", i);

    em_placement_stats st;
    cr_assert_eq(em_placement_get("testdev", &st), EM_OK);
    cr_assert_eq(st.fallbacks, 2, "fallbacks %llu", (unsigned long long)st.fallbacks);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    em_placement_report(f);
    fclose(f);
    cr_assert(strstr(text, "ops that fell back to the CPU"), "report:\n%s", text);
    const char *mul = strstr(text, "  mul ");
    cr_assert(mul && strstr(mul, "from testdev") && strstr(mul, "1 time"), "report:\n%s", text);
    const char *line = strstr(text, "\ntestdev ");
    cr_assert(line, "report:\n%s", text);
    char dev[32];
    unsigned long long ops, in, out, fb;
    char ms[32];
    cr_assert_eq(sscanf(line + 1, "%31s %llu %31s %llu %llu %llu", dev, &ops, ms, &in, &out, &fb),
                 6, "report:\n%s", text);
    cr_assert_eq(fb, 2);
    cr_assert_gt(out, 0);
    free(text);
    em_tensor *parts[] = {a, b, y, dx, s};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) em_tensor_release(parts[i]);
}

typedef struct captured {
    int warnings;
    int about_mul;
} captured;

static void capture(em_log_level level, const char *msg, void *user) {
    captured *c = user;
    if (level == EM_LOG_WARN) c->warnings++;
    if (strstr(msg, "mul") && strstr(msg, "testdev")) c->about_mul++;
}

Test(plugin, fallback_warn_logs_once) {
    captured cap = {0};
    em_log_set(capture, &cap);
    em_fallback_set(EM_FALLBACK_WARN);
    const float v[2] = {3, -4};
    int64_t n = 2;
    em_tensor *a = f32_on(dev_of("testdev:0"), 1, &n, v);
    for (int k = 0; k < 3; k++) {
        em_tensor *y = em_mul(a, a);
        cr_assert_not_null(y, "%s", em_last_error());
        float got[2];
        read_f32(y, got, 2);
        cr_assert_float_eq(got[0], 9.0f, 0);
        cr_assert_float_eq(got[1], 16.0f, 0);
        em_tensor_release(y);
    }
    cr_assert_eq(cap.about_mul, 1, "%d warnings about mul", cap.about_mul);
    cr_assert_eq(cap.warnings, 1);
    em_placement_stats st;
    cr_assert_eq(em_placement_get("testdev", &st), EM_OK);
    cr_assert_geq(st.fallbacks, 3);
    em_tensor_release(a);
}

/* ---- kernel stacks and program registrations (em_registry_program) ------------------------- */

/* Kernels that write a constant: which one ran shows in the result. */
static em_status write_const(const em_kernel_ctx *ctx) {
    const em_ktensor *y = &ctx->out[0];
    if (!y->contiguous) return em_set_error(EM_ERR_INVALID, "write_const: strided output");
    float v = (float)(intptr_t)ctx->user;
    for (int64_t i = 0; i < y->numel; i++) ((float *)y->data)[i] = v;
    return EM_OK;
}

static bool only_large(const em_kernel_ctx *ctx) { return ctx->out[0].numel >= 100; }

static em_kernel *push(int priority, int value, em_kernel_supports_fn supports) {
    char name[32];
    snprintf(name, sizeof name, "const_%d", value);
    em_kernel_def def = {.struct_size = sizeof def, .op = "add", .device_type = "cpu",
                         .dtype = EM_F32, .priority = priority, .fn = write_const,
                         .supports = supports, .name = name, .user = (void *)(intptr_t)value};
    em_kernel *k = NULL;
    cr_assert_eq(em_kernel_register(em_registry_program(), &def, &k), EM_OK, "%s",
                 em_last_error());
    cr_assert_not_null(k);
    return k;
}

/* add(a, a) on n elements of 1.0: 2.0 from the real kernel, the constant from the others. */
static float add_result(int64_t n) {
    em_tensor *a = em_ones(1, &n, EM_F32, em_cpu());
    em_tensor *y = em_add(a, a);
    cr_assert_not_null(y, "%s", em_last_error());
    float *v = malloc(sizeof(float) * (size_t)n);
    read_f32(y, v, (size_t)n);
    float first = v[0];
    for (int64_t i = 1; i < n; i++) cr_assert_float_eq(v[i], first, 0);
    free(v);
    em_tensor_release(a);
    em_tensor_release(y);
    return first;
}

Test(plugin, kernel_priorities_stack) {
    cr_assert_float_eq(add_result(4), 2.0f, 0);
    em_kernel *a = push(5, 42, NULL);
    cr_assert_float_eq(add_result(4), 42.0f, 0, "higher priority wins");
    em_kernel *b = push(5, 43, NULL);
    cr_assert_float_eq(add_result(4), 43.0f, 0, "later at equal priority wins");
    em_kernel *c = push(3, 44, NULL);
    cr_assert_float_eq(add_result(4), 43.0f, 0, "lower priority does not win");

    em_plugin_info prog = plugin_by_file("(registered by the program)");
    cr_assert_str_eq(prog.name, "<program>");
    cr_assert_eq(em_registry_kernel_count(prog.registry), 3);

    cr_assert_eq(em_kernel_unregister(b), EM_OK, "%s", em_last_error());
    cr_assert_float_eq(add_result(4), 42.0f, 0, "unregistering restores the one below");
    cr_assert_eq(em_kernel_unregister(a), EM_OK);
    cr_assert_float_eq(add_result(4), 44.0f, 0);
    cr_assert_eq(em_kernel_unregister(c), EM_OK);
    cr_assert_float_eq(add_result(4), 2.0f, 0, "the built-in kernel again");
    cr_assert_eq(em_registry_kernel_count(prog.registry), 0);
    /* A NULL handle is an error, not a crash. */
    cr_assert_eq(em_kernel_unregister(NULL), EM_ERR_INVALID);
}

Test(plugin, supports_predicate_passes_down) {
    em_kernel *low = push(1, 7, NULL);
    em_kernel *picky = push(10, 8, only_large);
    cr_assert_float_eq(add_result(4), 7.0f, 0, "the picky kernel declines small tensors");
    cr_assert_float_eq(add_result(200), 8.0f, 0, "and takes large ones");
    cr_assert_eq(em_kernel_unregister(low), EM_OK);
    cr_assert_float_eq(add_result(4), 2.0f, 0, "declined down to the built-in kernel");
    cr_assert_eq(em_kernel_unregister(picky), EM_OK);
}

/* test.axpb(x; alpha) = alpha * x + 1, a program-declared op. */
static em_status axpb_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    (void)attrs;
    if (em_tensor_dtype(in[0]) != EM_F32)
        return em_set_error(EM_ERR_DTYPE, "%s: float32 only, got %s", em_op_name(op),
                            em_dtype_name(em_tensor_dtype(in[0])));
    out->dtype = EM_F32;
    out->ndim = em_tensor_ndim(in[0]);
    memcpy(out->shape, em_tensor_shape(in[0]), sizeof(int64_t) * (size_t)out->ndim);
    return EM_OK;
}

static em_status axpb_kernel(const em_kernel_ctx *ctx) {
    const em_ktensor *x = &ctx->in[0], *y = &ctx->out[0];
    double alpha = ctx->attrs[0].type == EM_ATTR_FLOAT ? ctx->attrs[0].v.f : 1.0;
    if (!x->contiguous || !y->contiguous)
        return em_set_error(EM_ERR_INVALID, "axpb: contiguous tensors only");
    for (int64_t i = 0; i < y->numel; i++)
        ((float *)y->data)[i] = (float)(alpha * ((const float *)x->data)[i] + 1.0);
    return EM_OK;
}

Test(plugin, program_declared_op) {
    static const char *const attr_names[] = {"alpha"};
    static const em_attr_type attr_types[] = {EM_ATTR_FLOAT};
    em_op_schema s = {.struct_size = sizeof s, .name = "test.axpb", .n_inputs = 1,
                      .n_outputs = 1, .n_attrs = 1, .attr_names = attr_names,
                      .attr_types = attr_types, .dispatch_arg = 0, .infer = axpb_infer};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_op_find("test.axpb"), op);
    cr_assert_eq(em_op_declare(em_registry_program(), &s, NULL), EM_ERR_EXISTS);
    assert_error(EM_ERR_EXISTS, "test.axpb");
    s.name = "add";
    cr_assert_eq(em_op_declare(em_registry_program(), &s, NULL), EM_ERR_EXISTS);
    assert_error(EM_ERR_EXISTS, "'add'");

    em_kernel_def def = {.struct_size = sizeof def, .op = "test.axpb", .device_type = "cpu",
                         .dtype = EM_F32, .fn = axpb_kernel, .name = "axpb_f32"};
    cr_assert_eq(em_kernel_register(em_registry_program(), &def, NULL), EM_OK, "%s",
                 em_last_error());
    float xv[5] = {0, 1, -2, 0.5f, 1000};
    int64_t n = 5;
    em_tensor *x = f32_on(em_cpu(), 1, &n, xv);
    em_attr alpha = {.type = EM_ATTR_FLOAT, .v.f = 3.0};
    em_tensor *y = NULL;
    const em_tensor *in[1] = {x};
    cr_assert_eq(em_op_call(op, in, 1, &alpha, &y), EM_OK, "%s", em_last_error());
    float got[5];
    read_f32(y, got, 5);
    for (int i = 0; i < 5; i++) cr_assert_float_eq(got[i], 3.0f * xv[i] + 1.0f, 0, "[%d]", i);

    /* On testdev there is no kernel, and no fallback under the default policy. */
    em_fallback_set(EM_FALLBACK_ERROR);
    em_tensor *dx = em_to_device(x, dev_of("testdev:1"));
    em_tensor *dy = NULL;
    const em_tensor *din[1] = {dx};
    cr_assert_eq(em_op_call(op, din, 1, &alpha, &dy), EM_ERR_NOKERNEL);
    assert_error(EM_ERR_NOKERNEL, "test.axpb: no kernel for device 'testdev'");
    /* The wrong attribute type is refused by name. */
    em_attr wrong = {.type = EM_ATTR_INT, .v.i = 3};
    cr_assert_eq(em_op_call(op, in, 1, &wrong, &dy), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "'alpha'");

    em_plugin_info prog = plugin_by_file("(registered by the program)");
    cr_assert_eq(em_registry_op_count(prog.registry), 1);
    cr_assert_str_eq(em_registry_op_name(prog.registry, 0), "test.axpb");
    em_tensor_release(x);
    em_tensor_release(y);
    em_tensor_release(dx);
}

/* ---- class kinds ------------------------------------------------------------------------- */

/* The kind named `name` (fails the test when it is not declared). */
static em_class_kind_info kind_info(const char *name) {
    for (size_t i = 0; i < em_class_kind_count(); i++) {
        em_class_kind_info ki = {.struct_size = sizeof ki};
        cr_assert_eq(em_class_kind_get(i, &ki), EM_OK, "%s", em_last_error());
        if (strcmp(ki.name, name) == 0) return ki;
    }
    cr_assert_fail("no class kind '%s' (of %zu)", name, em_class_kind_count());
    return (em_class_kind_info){0};
}

static em_tensor *halve(const em_tensor *x) { return em_mul_scalar(x, 0.5); }

Test(plugin, a_plugin_declares_a_class_kind_and_registers_into_it) {
    /* the core's kinds first, then the plugin's, each with its record size and owner */
    static const char *const core_kinds[] = {"module", "optimizer", "scheduler", "dataset",
                                             "transform", "exporter", "onnx_layer",
                                             "communicator"};
    cr_assert_eq(em_class_kind_count(), 9, "%zu kinds", em_class_kind_count());
    for (size_t i = 0; i < 8; i++) {
        em_class_kind_info ki = {.struct_size = sizeof ki};
        cr_assert_eq(em_class_kind_get(i, &ki), EM_OK);
        cr_assert_str_eq(ki.name, core_kinds[i]);
        cr_assert_str_eq(ki.owner, "ember-core");
    }
    cr_assert_eq(kind_info("module").record_size, sizeof(em_module_class));
    cr_assert_eq(kind_info("dataset").record_size, sizeof(em_dataset_class_def));
    em_class_kind_info t = kind_info(TEST_TRANSFORM_KIND);
    cr_assert_str_eq(t.owner, "ember-testkind");
    cr_assert_eq(t.record_size, sizeof(test_transform_class));
    cr_assert_eq(t.min_record_size, offsetof(test_transform_class, inverse));
    cr_assert_eq(t.class_count, 2);
    em_class_kind_info small = {.struct_size = 4};
    cr_assert_eq(em_class_kind_get(0, &small), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "em_class_kind_info struct_size 4 is smaller");
    cr_assert_eq(em_class_kind_get(99, &t), EM_ERR_RANGE);

    /* the plugin's classes: found by kind and name, listed under its registry */
    const em_registry *r = plugin_by_file("kind_plugin.so").registry;
    cr_assert_eq(em_registry_class_count(r, TEST_TRANSFORM_KIND), 2);
    cr_assert_str_eq(em_registry_class_name(r, TEST_TRANSFORM_KIND, 0), "negate");
    cr_assert_str_eq(em_registry_class_name(r, TEST_TRANSFORM_KIND, 1), "double");
    cr_assert_null(em_registry_class_name(r, TEST_TRANSFORM_KIND, 2));
    cr_assert_eq(em_class_count(TEST_TRANSFORM_KIND), 2);
    const test_transform_class *neg = em_class_find(TEST_TRANSFORM_KIND, "negate");
    cr_assert_not_null(neg, "%s", em_last_error());
    cr_assert_eq(neg, em_class_get(TEST_TRANSFORM_KIND, 0));
    cr_assert_eq(neg->struct_size, sizeof *neg);
    cr_assert_str_eq(neg->description, "y = -x");
    cr_assert_not_null(neg->inverse);
    float x[3] = {1, -2, 3}, y[3];
    int64_t n = 3;
    em_tensor *xt = f32_on(dev_of("cpu"), 1, &n, x);
    em_tensor *yt = neg->apply(xt);
    cr_assert_not_null(yt, "%s", em_last_error());
    read_f32(yt, y, 3);
    for (int i = 0; i < 3; i++) cr_assert_eq(y[i], -x[i]);
    em_tensor_release(yt);

    /* the program registers into the plugin's kind; errors are the registry's, for any kind */
    em_registry *prog = em_registry_program();
    test_transform_class h = {.struct_size = sizeof h, .name = "halve", .apply = halve};
    cr_assert_eq(em_class_register(prog, TEST_TRANSFORM_KIND, &h), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_registry_class_count(prog, TEST_TRANSFORM_KIND), 1);
    cr_assert_eq(em_class_register(prog, TEST_TRANSFORM_KIND, &h), EM_ERR_EXISTS);
    assert_error(EM_ERR_EXISTS, "a codec class named 'halve' is already registered (by "
                 "<program>)");
    h.name = "negate";
    cr_assert_eq(em_class_register(prog, TEST_TRANSFORM_KIND, &h), EM_ERR_EXISTS);
    assert_error(EM_ERR_EXISTS, "(by ember-testkind)");
    cr_assert_eq(em_class_register(prog, "transfrom", &h), EM_ERR_NOTFOUND);
    assert_error(EM_ERR_NOTFOUND, "no class kind named 'transfrom' is declared; declared: module, "
                 "optimizer, scheduler, dataset, transform, exporter, onnx_layer, communicator, "
                 "codec");
    h.name = "noapply";
    h.apply = NULL;
    cr_assert_eq(em_class_register(prog, TEST_TRANSFORM_KIND, &h), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "class_register: codec class 'noapply' has no apply");
    h.name = "";
    h.apply = halve;
    cr_assert_eq(em_class_register(prog, TEST_TRANSFORM_KIND, &h), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "a codec class needs a name");
    cr_assert_null(em_class_find(TEST_TRANSFORM_KIND, "negat"));
    assert_error(EM_ERR_NOTFOUND, "no codec class named 'negat' (did you mean 'negate'?)");

    /* the prefix rule: a record of an older layout (struct_size through apply) is read only as
     * far as it goes — the bytes past it (inverse, set here) are not read — and one smaller
     * than the kind's oldest layout is refused */
    test_transform_class old = {.struct_size = offsetof(test_transform_class, inverse),
                                .name = "old", .apply = halve, .inverse = halve};
    cr_assert_eq(em_class_register(prog, TEST_TRANSFORM_KIND, &old), EM_OK, "%s", em_last_error());
    const test_transform_class *oc = em_class_find(TEST_TRANSFORM_KIND, "old");
    cr_assert_not_null(oc);
    cr_assert_eq(oc->apply, halve);
    cr_assert_null(oc->inverse, "inverse read past the record's struct_size");
    cr_assert_eq(oc->struct_size, sizeof *oc);
    old.struct_size = offsetof(test_transform_class, apply);
    old.name = "older";
    cr_assert_eq(em_class_register(prog, TEST_TRANSFORM_KIND, &old), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "struct_size 24 is smaller than the oldest layout");
    cr_assert_eq(em_class_unregister(prog, TEST_TRANSFORM_KIND, "old"), EM_OK);
    cr_assert_eq(em_class_unregister(prog, TEST_TRANSFORM_KIND, "negate"), EM_ERR_NOTFOUND);
    assert_error(EM_ERR_NOTFOUND, "this registry registered no codec class named 'negate'");
    cr_assert_eq(kind_info(TEST_TRANSFORM_KIND).class_count, 3);

    /* kinds: unique names, the prefix rule on their definitions too */
    em_class_kind_def k = {.struct_size = sizeof k, .name = "module",
                           .record_size = sizeof(em_class_head)};
    cr_assert_eq(em_class_kind_register(prog, &k), EM_ERR_EXISTS);
    assert_error(EM_ERR_EXISTS, "a class kind named 'module' is already declared (by ember-core)");
    k.name = "Bad Name";
    cr_assert_eq(em_class_kind_register(prog, &k), EM_ERR_INVALID);
    k.name = "tiny";
    k.record_size = 8;
    cr_assert_eq(em_class_kind_register(prog, &k), EM_ERR_INVALID);
    assert_error(EM_ERR_INVALID, "record_size 8");
    em_tensor_release(xt);
}

/* The program's own kind goes at em_shutdown(), and a plugin's kind with its plugin: the
 * classes other registries put into it go too. */
Test(plugin_env, a_kind_goes_with_its_owner) {
    set_plugin_path();
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    em_class_kind_def k = {.struct_size = sizeof k, .name = "archiver",
                           .record_size = sizeof(em_class_head)};
    cr_assert_eq(em_class_kind_register(em_registry_program(), &k), EM_OK, "%s", em_last_error());
    em_class_head e = {.struct_size = sizeof e, .name = "zip"};
    cr_assert_eq(em_class_register(em_registry_program(), "archiver", &e), EM_OK);
    test_transform_class h = {.struct_size = sizeof h, .name = "halve", .apply = halve};
    cr_assert_eq(em_class_register(em_registry_program(), TEST_TRANSFORM_KIND, &h), EM_OK);
    cr_assert_eq(em_class_kind_count(), 10);
    em_shutdown();
    setenv("EMBER_DISABLE_PLUGINS", "ember-testkind", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_class_kind_count(), 8, "%zu kinds after a restart without the plugin",
                 em_class_kind_count());
    cr_assert_null(em_class_find(TEST_TRANSFORM_KIND, "halve"));
    assert_error(EM_ERR_NOTFOUND, "no class kind named 'codec'");
    cr_assert_null(em_class_find("archiver", "zip"));
}

/* ---- ember-info ----------------------------------------------------------------------------- */

/* Run tools/ember-info with args; its stdout into a new string; the exit status in *code. */
static char *run_ember_info(const char *args, int *code) {
    const char *tools = getenv("EMBER_TEST_TOOLS_DIR");
    cr_assert(tools && *tools, "EMBER_TEST_TOOLS_DIR is not set (run through `make check`)");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/ember-info' %s 2>/dev/null", tools, args);
    return em_test_run(cmd, code);
}

/* The line of text that contains `what`, checked to contain every needle too. */
static void assert_line(const char *text, const char *what, const char *needle) {
    const char *p = strstr(text, what);
    cr_assert(p, "no line with '%s' in:\n%s", what, text);
    const char *start = p, *end = strchr(p, '\n');
    while (start > text && start[-1] != '\n') start--;
    size_t n = end ? (size_t)(end - start) : strlen(start);
    char line[2048];
    snprintf(line, sizeof line, "%.*s", (int)n, start);
    cr_assert(strstr(line, needle), "line '%s' lacks '%s'", line, needle);
}

Test(plugin_env, ember_info_reports_plugins_and_self_tests) {
    set_plugin_path();
    int code = -1;
    char *out = run_ember_info("", &code);
    cr_assert_eq(code, 0, "exit %d; output:\n%s", code, out);
    cr_assert(strstr(out, em_version()), "no version in:\n%s", out);
    assert_line(out, "ember-cpu.so", "loaded");
    assert_line(out, "testdev.so", "loaded");
    assert_line(out, "bad_abi.so", "refused");
    char abi[64];
    snprintf(abi, sizeof abi, "built for plugin ABI %d", EM_PLUGIN_ABI_MAJOR + 1);
    cr_assert(strstr(out, abi), "no '%s' in:\n%s", abi, out);
    assert_line(out, "no_entry.so", "refused");
    cr_assert(strstr(out, "no entry symbol 'ember_plugin_entry'"), "%s", out);
    assert_line(out, "bad_dep.so", "refused");
    cr_assert(strstr(out, "libember_test_gone.so: cannot open shared object file"), "%s", out);
    assert_line(out, "failing_register.so", "refused");
    cr_assert(strstr(out, "registration failed"), "%s", out);
    assert_line(out, "dup_cpu.so", "refused");
    cr_assert(strstr(out, "already loaded"), "%s", out);
    /* classes of a core kind and of a plugin's kind listed the same way, and every kind */
    assert_line(out, "module classes:", "testplug.Affine");
    assert_line(out, "codec classes:", "negate, double");
    assert_line(out, "class kinds (9):", "");
    assert_line(out, "  exporter     ", "1 class, declared by ember-core");
    assert_line(out, "  module       ", "classes, declared by ember-core");
    assert_line(out, "  dataset      ", "classes, declared by ember-core");
    assert_line(out, "  transform    ", "classes, declared by ember-core");
    assert_line(out, "(ember/comm.h)", "declared by ember-core");
    assert_line(out, "  codec        ", "2 classes, declared by ember-testkind");
    /* the kernels as a count; the per-op listing is --verbose's (below) */
    cr_assert(!strstr(out, "add: cpu["), "per-op kernel lines without --verbose:\n%s", out);
    assert_line(out, "kernels:", "--verbose lists them");
    assert_line(out, "self-test cpu:", "ok");
    assert_line(out, "self-test testdev:0:", "ok");
    assert_line(out, "self-test testdev:1:", "ok");
    char threads[64];
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error()); /* the same count in this process */
    snprintf(threads, sizeof threads, "CPU threads: %d (", em_num_threads());
    assert_line(out, threads, "affinity mask"); /* how many, and why */
    /* each backend's named functions (em_backend_proc) */
    assert_line(out, "cpu function set_num_threads:", "void (int n)");
    free(out);
}

Test(plugin_env, ember_info_verbose_lists_every_kernel) {
    set_plugin_path();
    int code = -1;
    char *out = run_ember_info("--verbose", &code);
    cr_assert_eq(code, 0, "exit %d; output:\n%s", code, out);
    assert_line(out, "add:", "cpu[float32");
    cr_assert(strstr(out, ", priority "), "no kernel lines with priorities in:\n%s", out);
    free(out);
}

/* The plugin object named `name` in the JSON report; fails when absent. */
static json_t *json_plugin(json_t *root, const char *file) {
    json_t *plugins = json_object_get(root, "plugins"), *p;
    size_t i;
    cr_assert(json_is_array(plugins), "no plugins array");
    json_array_foreach(plugins, i, p) {
        const char *path = json_string_value(json_object_get(p, "path"));
        if (path && strstr(path, file)) return p;
    }
    cr_assert_fail("no plugin %s in the JSON report", file);
    return NULL;
}

Test(plugin_env, ember_info_json_parses) {
    set_plugin_path();
    int code = -1;
    char *out = run_ember_info("--json --verbose", &code);
    cr_assert_eq(code, 0, "exit %d; output:\n%s", code, out);
    json_error_t err;
    json_t *root = json_loads(out, 0, &err);
    cr_assert_not_null(root, "JSON error at line %d: %s\n%s", err.line, err.text, out);
    cr_assert_str_eq(json_string_value(json_object_get(root, "version")), em_version());
    cr_assert(json_is_true(json_object_get(root, "ok")));
    json_t *th = json_object_get(root, "threads");
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(json_integer_value(json_object_get(th, "count")), em_num_threads());
    cr_assert_str_eq(json_string_value(json_object_get(th, "reason")), em_num_threads_reason());
    json_t *cpu = json_plugin(root, "ember-cpu.so");
    cr_assert_str_eq(json_string_value(json_object_get(cpu, "status")), "loaded");
    cr_assert_str_eq(json_string_value(json_object_get(cpu, "name")), "ember-cpu");
    json_t *kernels = json_object_get(cpu, "kernels");
    json_t *add_cpu = json_object_get(json_object_get(kernels, "add"), "cpu");
    cr_assert(json_is_array(add_cpu) && json_array_size(add_cpu) >= 2, "add kernels");
    json_t *fns = json_object_get(cpu, "backend_functions");
    cr_assert_eq(json_array_size(fns), 3, "the CPU backend's named functions");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(fns, 1), "name")),
                     "set_num_threads");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(fns, 1), "device_type")),
                     "cpu");
    json_t *abi = json_plugin(root, "bad_abi.so");
    cr_assert_str_eq(json_string_value(json_object_get(abi, "status")), "refused");
    cr_assert(strstr(json_string_value(json_object_get(abi, "reason")), "built for plugin ABI"));
    json_t *td = json_plugin(root, "testdev.so");
    json_t *types = json_object_get(td, "device_types");
    cr_assert_str_eq(json_string_value(json_array_get(types, 0)), "testdev");
    json_t *list = json_object_get(td, "kernel_list");
    cr_assert_eq(json_array_size(list), 2 * EM_DTYPE_COUNT + 1, "--verbose lists kernels");
    /* every plugin lists its classes of every kind under "classes", the same way */
    json_t *kp = json_plugin(root, "kind_plugin.so"), *lp = json_plugin(root, "layer_plugin.so");
    cr_assert_str_eq(json_string_value(json_object_get(root, "class_api")), "EMBER_1.1");
    json_t *kinds = json_object_get(root, "class_kinds"), *kd;
    cr_assert_eq(json_array_size(kinds), 9);
    size_t ki;
    json_array_foreach(kinds, ki, kd) {
        const char *kn = json_string_value(json_object_get(kd, "name"));
        for (size_t j = 0; j < json_array_size(json_object_get(root, "plugins")); j++) {
            json_t *pj = json_array_get(json_object_get(root, "plugins"), j);
            if (json_is_string(json_object_get(pj, "status")) &&
                strcmp(json_string_value(json_object_get(pj, "status")), "loaded") == 0)
                cr_assert(json_is_array(json_object_get(json_object_get(pj, "classes"), kn)),
                          "plugin %s lacks classes.%s",
                          json_string_value(json_object_get(pj, "name")), kn);
        }
    }
    json_t *tk = json_array_get(kinds, 8); /* after the core's eight */
    cr_assert_str_eq(json_string_value(json_object_get(tk, "name")), "codec");
    cr_assert_str_eq(json_string_value(json_object_get(tk, "owner")), "ember-testkind");
    cr_assert_eq(json_integer_value(json_object_get(tk, "record_size")),
                 (json_int_t)sizeof(test_transform_class));
    cr_assert_eq(json_integer_value(json_object_get(tk, "class_count")), 2);
    json_t *tr = json_object_get(json_object_get(kp, "classes"), "codec");
    cr_assert_eq(json_array_size(tr), 2);
    cr_assert_str_eq(json_string_value(json_array_get(tr, 0)), "negate");
    json_t *mods = json_object_get(json_object_get(lp, "classes"), "module");
    cr_assert_str_eq(json_string_value(json_array_get(mods, 0)), "testplug.Affine");
    cr_assert_eq(json_array_size(json_object_get(json_object_get(kp, "classes"), "module")), 0);

    json_t *tests = json_object_get(root, "self_test"), *t;
    size_t i, seen = 0;
    cr_assert(json_is_array(tests));
    json_array_foreach(tests, i, t) {
        const char *dev = json_string_value(json_object_get(t, "device"));
        cr_assert(json_is_true(json_object_get(t, "ok")), "self-test %s failed", dev);
        if (strcmp(dev, "cpu") == 0 || strncmp(dev, "testdev:", 8) == 0) seen++;
    }
    cr_assert_eq(seen, 3, "cpu, testdev:0 and testdev:1 self-tested");
    json_t *devices = json_object_get(root, "devices");
    cr_assert(json_is_array(devices) && json_array_size(devices) >= 3);
    json_decref(root);
    free(out);
}

Test(plugin_env, ember_info_without_cpu_fails_but_lists_plugins) {
    set_plugin_path();
    setenv("EMBER_DISABLE_PLUGINS", "ember-cpu", 1);
    int code = -1;
    char *out = run_ember_info("", &code);
    cr_assert_eq(code, 1, "exit %d; output:\n%s", code, out);
    assert_line(out, "ember-cpu.so", "disabled");
    assert_line(out, "bad_abi.so", "refused");
    cr_assert(strstr(out, "CPU device"), "no init error in:\n%s", out);
    free(out);
}

Test(plugin_env, ember_info_help) {
    int code = -1;
    char *out = run_ember_info("--help", &code);
    cr_assert_eq(code, 0);
    cr_assert(strstr(out, "--json") && strstr(out, "--verbose"), "help:\n%s", out);
    free(out);
    out = run_ember_info("--no-such-option", &code);
    cr_assert_eq(code, 2, "a bad option exits 2");
    free(out);
}

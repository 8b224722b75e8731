/*
 * test_cpus.c — the default thread count: core/cpus.c (built into this program) against fake
 * cgroup trees — v2 cpu.max and v1 cpu.cfs_quota_us/cfs_period_us, nested limits, a
 * container's view of its own subtree, no limit, unreadable and malformed files — and, through
 * the library, em_num_threads() and its reason under a narrowed affinity mask,
 * EMBER_NUM_THREADS and em_set_num_threads.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ember/ember.h>

#include "core/cpus.h"

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

/* ---- a fake cgroup filesystem ---------------------------------------------------------------- */

static char root[256];

static void make_root(void) {
    snprintf(root, sizeof root, "/tmp/ember-cpus-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
}

static void remove_root(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    cr_expect_eq(system(cmd), 0);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

/* Write text to root/rel, creating the directories on the way. */
static void put(const char *rel, const char *fmt, ...) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

/* em__cpu_quota with root/proc_cgroup as /proc/self/cgroup and root/fs as the mount point. */
static int quota(void) {
    char proc[300], fs[300];
    snprintf(proc, sizeof proc, "%s/proc_cgroup", root);
    snprintf(fs, sizeof fs, "%s/fs", root);
    return em__cpu_quota(proc, fs);
}

TestSuite(cgroup, .init = make_root, .fini = remove_root);

Test(cgroup, v2_quota_rounds_up_and_max_is_no_limit) {
    put("proc_cgroup", "0::/\n");
    put("fs/cpu.max", "max 100000\n");
    cr_expect_eq(quota(), 0, "max: no limit");
    put("fs/cpu.max", "150000 100000\n");
    cr_expect_eq(quota(), 2, "1.5 CPUs of time need 2 threads");
    put("fs/cpu.max", "100000 100000\n");
    cr_expect_eq(quota(), 1);
    put("fs/cpu.max", "50000 100000\n");
    cr_expect_eq(quota(), 1, "half a CPU still runs one thread");
    put("fs/cpu.max", "400000 50000\n");
    cr_expect_eq(quota(), 8);
}

Test(cgroup, v2_the_smallest_limit_on_the_way_up_binds) {
    put("proc_cgroup", "0::/job/step\n");
    put("fs/cpu.max", "max 100000\n");
    put("fs/job/cpu.max", "300000 100000\n");
    put("fs/job/step/cpu.max", "max 100000\n");
    cr_expect_eq(quota(), 3, "the parent's limit holds for its child");
    put("fs/job/step/cpu.max", "200000 100000\n");
    cr_expect_eq(quota(), 2);
    put("fs/cpu.max", "100000 100000\n");
    cr_expect_eq(quota(), 1, "and the root's");
}

Test(cgroup, v2_container_sees_its_subtree_at_the_mount) {
    /* the path is the host's, the mount shows only the container's own cgroup */
    put("proc_cgroup", "0::/kubepods/pod1/abc\n");
    put("fs/cpu.max", "250000 100000\n");
    cr_expect_eq(quota(), 3);
}

Test(cgroup, v1_cpu_controller_in_either_mount) {
    put("proc_cgroup", "5:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n1:name=systemd:/\n");
    put("fs/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "250000\n");
    put("fs/cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000\n");
    put("fs/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("fs/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    cr_expect_eq(quota(), 3);
    put("fs/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "-1\n");
    cr_expect_eq(quota(), 0, "-1: no limit");
}

Test(cgroup, v1_separate_cpu_mount) {
    put("proc_cgroup", "3:cpu:/\n2:cpuacct:/\n");
    put("fs/cpu/cpu.cfs_quota_us", "100000\n");
    put("fs/cpu/cpu.cfs_period_us", "100000\n");
    cr_expect_eq(quota(), 1);
}

Test(cgroup, nothing_readable_is_no_limit) {
    cr_expect_eq(quota(), 0, "no /proc/self/cgroup");
    put("proc_cgroup", "0::/\n");
    cr_expect_eq(quota(), 0, "no cpu.max");
    put("fs/cpu.max", "lots\n");
    cr_expect_eq(quota(), 0, "malformed cpu.max");
    put("fs/cpu.max", "-5 100000\n");
    cr_expect_eq(quota(), 0, "negative quota");
    put("proc_cgroup", "garbage without colons\n");
    cr_expect_eq(quota(), 0, "malformed /proc/self/cgroup");
}

/* ---- through the library --------------------------------------------------------------------- */

static void shutdown_clean(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}
TestSuite(threads, .fini = shutdown_clean);

Test(threads, default_follows_the_affinity_mask) {
    unsetenv("EMBER_NUM_THREADS");
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &set)) first = c;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    cr_assert_eq(sched_setaffinity(0, sizeof set, &set), 0, "this process may narrow its mask");
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_num_threads(), 1, "bound to one CPU: one thread, whatever the machine has");
    cr_expect(strstr(em_num_threads_reason(), "1 of ") != NULL, "%s", em_num_threads_reason());
    cr_expect(strstr(em_num_threads_reason(), "affinity mask") != NULL, "%s",
              em_num_threads_reason());
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

Test(threads, environment_and_setter_say_so) {
    setenv("EMBER_NUM_THREADS", "3", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_num_threads(), 3);
    cr_expect_str_eq(em_num_threads_reason(), "EMBER_NUM_THREADS");
    em_set_num_threads(5);
    cr_expect_eq(em_num_threads(), 5);
    cr_expect_str_eq(em_num_threads_reason(), "em_set_num_threads");
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    unsetenv("EMBER_NUM_THREADS");
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int want = CPU_COUNT(&set), q = em__cpu_quota("/proc/self/cgroup", "/sys/fs/cgroup");
    if (q > 0 && q < want) want = q;
    cr_expect_eq(em_num_threads(), want, "the default once the variable is gone");
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

/*
 * cpus.c — how many CPUs this process may use: the default thread count of CPU kernels.
 *
 * The online core count is the wrong default wherever the process is confined: `taskset`,
 * a cpuset (docker --cpuset-cpus, Slurm's CPU binding on an HPC node) restrict the affinity
 * mask, and a CPU quota (docker --cpus, a Kubernetes limit: cgroup v2 `cpu.max`, v1
 * `cpu.cfs_quota_us` / `cpu.cfs_period_us`) caps the time. Sixty-four threads on a job bound
 * to four cores of a 64-core node spend most of the step waiting for each other. So the count
 * is the affinity mask's, capped by the quota rounded up, like the JVM's and Go's.
 *
 * Self-contained (libc only), so a test can build it against fake cgroup trees.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpus.h"

int em__cpu_affinity_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    return CPU_COUNT(&set);
}

/* The first line of `path` into buf; false when it cannot be read. */
static bool read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

/* CPUs allowed by quota/period, rounded up; 0 for no limit. */
static int quota_cpus(long long quota, long long period) {
    if (quota <= 0 || period <= 0) return 0;
    long long n = (quota + period - 1) / period;
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* The quota of one cgroup directory (v2: cpu.max "max 100000" or "150000 100000"; v1:
 * cpu.cfs_quota_us, -1 for none, and cpu.cfs_period_us); 0 for none or unreadable. */
static int dir_quota(const char *dir, bool v2) {
    char path[PATH_MAX], line[128];
    if (v2) {
        if (snprintf(path, sizeof path, "%s/cpu.max", dir) >= (int)sizeof path) return 0;
        if (!read_line(path, line, sizeof line)) return 0;
        char q[32];
        long long period = 0;
        if (sscanf(line, "%31s %lld", q, &period) != 2 || strcmp(q, "max") == 0) return 0;
        return quota_cpus(atoll(q), period);
    }
    long long quota, period;
    if (snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir) >= (int)sizeof path) return 0;
    if (!read_line(path, line, sizeof line) || sscanf(line, "%lld", &quota) != 1) return 0;
    if (snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir) >= (int)sizeof path) return 0;
    if (!read_line(path, line, sizeof line) || sscanf(line, "%lld", &period) != 1) return 0;
    return quota_cpus(quota, period);
}

/* The smallest quota on the way from mount/rel up to mount (a parent's limit binds its
 * children); when mount/rel does not exist (a container that sees only its own subtree at
 * the mount point, under a host path), the mount point's own. */
static int tree_quota(const char *mount, const char *rel, bool v2) {
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s%s", mount, strcmp(rel, "/") == 0 ? "" : rel) >=
        (int)sizeof dir)
        return 0;
    if (access(dir, F_OK) != 0) return dir_quota(mount, v2);
    size_t base = strlen(mount);
    int best = 0;
    for (;;) {
        int q = dir_quota(dir, v2);
        if (q > 0 && (best == 0 || q < best)) best = q;
        char *slash = strrchr(dir + base, '/');
        if (!slash) break;
        *slash = 0;
    }
    return best;
}

int em__cpu_quota(const char *proc_cgroup, const char *root) {
    FILE *f = fopen(proc_cgroup, "r");
    if (!f) return 0;
    char line[PATH_MAX + 64];
    int best = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        /* "hierarchy-id:controllers:path"; v2 is "0::path" */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *ctrls = c1 + 1, *rel = c2 + 1;
        char mount[PATH_MAX];
        int q = 0;
        if (strcmp(line, "0") == 0 && *ctrls == 0) {
            q = tree_quota(root, rel, true);
        } else {
            /* v1: the cpu controller, mounted as "cpu" or "cpu,cpuacct" */
            char list[256];
            snprintf(list, sizeof list, ",%s,", ctrls);
            if (!strstr(list, ",cpu,")) continue;
            if (snprintf(mount, sizeof mount, "%s/%s", root, ctrls) >= (int)sizeof mount)
                continue;
            if (access(mount, F_OK) != 0 &&
                snprintf(mount, sizeof mount, "%s/cpu", root) >= (int)sizeof mount)
                continue;
            q = tree_quota(mount, rel, false);
        }
        if (q > 0 && (best == 0 || q < best)) best = q;
    }
    fclose(f);
    return best;
}

int em__ncpu_explain(char *why, size_t cap) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = em__cpu_affinity_count();
    if (n <= 0) n = online > 0 ? (int)online : 1;
    int quota = em__cpu_quota("/proc/self/cgroup", "/sys/fs/cgroup");
    int used = quota > 0 && quota < n ? quota : n;
    if (why && cap) {
        int k = snprintf(why, cap, "%d of %ld online CPUs in this process's affinity mask", n,
                         online);
        if (quota > 0 && k >= 0 && (size_t)k < cap)
            snprintf(why + k, cap - (size_t)k, ", CPU quota %d%s", quota,
                     quota < n ? " (the cap)" : "");
    }
    return used;
}

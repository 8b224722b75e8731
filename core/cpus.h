/*
 * cpus.h — the CPUs this process may use (cpus.c).
 */
#ifndef EMBER_CPUS_H
#define EMBER_CPUS_H

#include <stdbool.h>
#include <stddef.h>

/* CPUs in this thread's affinity mask; 0 when it cannot be read. */
int em__cpu_affinity_count(void);
/* The CPU quota of the process's cgroups (proc_cgroup: a /proc/self/cgroup file; root: where
 * the cgroup filesystems are mounted), in whole CPUs rounded up, the smallest along each
 * hierarchy; 0 when there is none. */
int em__cpu_quota(const char *proc_cgroup, const char *root);
/* The default thread count: the affinity mask's CPUs, capped by the quota; why (may be NULL)
 * receives the reason in words. */
int em__ncpu_explain(char *why, size_t cap);

#endif

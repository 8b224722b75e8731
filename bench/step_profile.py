#!/usr/bin/env python3
"""step_profile.py — a training step op by op and thread by thread, each GEMM beside itself
timed alone (issue 27).

    cd build && ../bench/step_profile.py [--cpu-time] [--steps N] [--rounds R] [workload]
                                                        (default train_mlp_b128, 200, 1)

Runs `bench/train_step --calls WORKLOAD N` (every kernel call of the step per call site: wall
and CPU per call, how many threads ran during it, the calling thread's CPU and the other
threads' CPU) and `bench/step_floor WORKLOAD` (each GEMM of the step timed alone straight
into oneDNN and OpenBLAS), both with OMP_WAIT_POLICY=passive (what em_init sets, and what
compare-pytorch.py gives step_floor), R times alternated, and prints per call site the medians
over the rounds: for a GEMM the library and thread count the CPU plugin's autotuner chose for
it in that process (em_plugin_describe's text), the floor row's candidate of that same choice
timed alone (dnnl-Nt, dnnl-1t, or blas-1t for products up to 64^3), the ratio in-step / alone,
and the best candidate alone. Wall times: the machine should be idle; the load is printed.
--cpu-time sets each call's CPU time of the process (every thread's: the --calls "cpu med"
column) beside `bench/step_floor --cpu-time`'s row instead: what a call costs on a machine
shared with other jobs rather than how long it waited for a core.
"""
import os
import re
import statistics
import subprocess
import sys

SMALL_GEMM = 64 ** 3


def run(cmd):
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout


def dims(tok):
    """'1x128x10(1280,10,1)' -> ([1, 128, 10], [1280, 10, 1])"""
    m = re.match(r"([\dx]+)\(([\d,]+)\)", tok)
    return [int(v) for v in m.group(1).split("x")], [int(v) for v in m.group(2).split(",")]


def gemm_of(site):
    """The floor's shape text ('MxNxK', ' A^T'/' B^T') of a GEMM call site, or None."""
    parts = site.split()
    if parts[0] == "addmm" and len(parts) == 4:
        (a, sa), (b, sb) = dims(parts[2]), dims(parts[3])
    elif parts[0] == "bmm" and len(parts) == 3:
        (a, sa), (b, sb) = dims(parts[1]), dims(parts[2])
        if a[0] != 1:
            return None
        a, sa, b, sb = a[1:], sa[1:], b[1:], sb[1:]
    else:
        return None
    m, k, n = a[0], a[1], b[1]
    ta = sa[1] != 1
    tb = sb[1] != 1
    return f"{m}x{n}x{k}" + (" A^T" if ta else "") + (" B^T" if tb else ""), (m, n, k, ta, tb)


def parse_calls(out):
    rows, step, describe = {}, None, ""
    for line in out.splitlines():
        m = re.match(r"\S+: \d+ steps, ([\d.]+) ms wall and ([\d.]+) ms CPU", line)
        if m:
            step = (float(m.group(1)), float(m.group(2)))
            continue
        if line.startswith("ember-cpu:"):
            describe = line
            continue
        f = line.split()
        if len(f) >= 8 and re.match(r"^[\d.]+$", f[-1]) and not line.startswith("  all"):
            site = " ".join(f[:-7])
            rows[site] = [float(v) for v in f[-7:]]
    return step, rows, describe


def parse_floor(out):
    """{shape text: {candidate: ms}}"""
    res, cols = {}, None
    for line in out.splitlines():
        if line.strip().startswith("what") and "dnnl-Nt" in line:
            cols = line.split()[4:-2]
            continue
        m = re.match(r"\s+(\S.*?\S)\s{2,}(\d+x\d+x\d+(?: [AB]\^T)*)\s+(\d+)\s+([\d.]+)\s+(.*)", line)
        if m and cols:
            vals = m.group(5).split()
            cand = {}
            for c, v in zip(cols, vals):
                v = v.rstrip("*")
                if v != "-":
                    cand[c] = float(v)
            res[m.group(2)] = (m.group(1), cand)
    return res


def choice(describe, shape):
    """The autotuner's candidate for a floor shape, from em_plugin_describe's text."""
    mnk, *t = shape.split()
    m = re.search(re.escape(mnk) + r" \(([^)]*)\): oneDNN on (all threads|1 thread)", describe)
    if not m:
        return None
    return "dnnl-Nt" if m.group(2) == "all threads" else "dnnl-1t"


def main():
    args = sys.argv[1:]
    steps, rounds, cpu = 200, 1, False
    while args and args[0].startswith("--"):
        if args[0] == "--cpu-time":
            cpu = True
            args = args[1:]
            continue
        if args[0] == "--steps":
            steps = int(args[1])
        elif args[0] == "--rounds":
            rounds = int(args[1])
        else:
            sys.exit(f"step_profile.py: unknown option {args[0]}")
        args = args[2:]
    w = args[0] if args else "train_mlp_b128"
    calls, floors, steps_seen, describes = [], [], [], []
    load0 = os.getloadavg()[0]
    for _ in range(rounds):
        step, rows, describe = parse_calls(run(["bench/train_step", "--calls", w, str(steps)]))
        calls.append(rows), steps_seen.append(step), describes.append(describe)
        floors.append(parse_floor(run(["bench/step_floor"] + (["--cpu-time"] if cpu else []) + [w])))
    load1 = os.getloadavg()[0]
    med = statistics.median
    print(f"{w}: {rounds} round(s) of bench/train_step --calls {w} {steps} and bench/step_floor "
          f"{w}{' (both --cpu-time)' if cpu else ''} (OMP_WAIT_POLICY=passive), load average "
          f"{load0:.2f} -> {load1:.2f}")
    print(f"step (observer on): {med(s[0] for s in steps_seen):.4f} ms wall, "
          f"{med(s[1] for s in steps_seen):.4f} ms CPU; medians over rounds, ms per call "
          f"({'CPU of the process' if cpu else 'wall'})")
    hdr = (f"  {'call site':<60} {'/step':>5} {'cpu' if cpu else 'wall':>8} {'thr':>3} {'caller':>8} {'others':>8}"
           f"  {'path':<8} {'alone':>8} {'ratio':>6} {'best alone':>17}")
    print(hdr)
    sum_step = sum_alone = sum_best = 0.0
    for site in calls[0]:
        vals = [r[site] for r in calls if site in r]
        per, thr = med(v[0] for v in vals), med(v[4] for v in vals)
        wall = med(v[3 if cpu else 1] for v in vals)
        own, others = med(v[5] for v in vals), med(v[6] for v in vals)
        line = f"  {site[:60]:<60} {per:5.2f} {wall:8.4f} {thr:3.0f} {own:8.4f} {others:8.4f}"
        g = gemm_of(site)
        if g:
            shape, (m, n, k, _, _) = g
            paths = []
            for d in describes:
                paths.append("blas-1t" if m * n * k <= SMALL_GEMM else choice(d, shape))
            path = max(set(paths), key=paths.count)
            alone = [f[shape][1].get(path) for f in floors if shape in f and path]
            alone = [a for a in alone if a is not None]
            best = [min(f[shape][1].items(), key=lambda kv: kv[1]) for f in floors if shape in f]
            if alone:
                a = med(alone)
                b = med(v for _, v in best)
                bc = max(set(c for c, _ in best), key=[c for c, _ in best].count)
                line += f"  {path:<8} {a:8.4f} {wall / a:6.2f} {b:8.4f} {bc:>8}"
                sum_step += wall * per
                sum_alone += a * per
                sum_best += b * per
        print(line)
    if sum_alone:
        print(f"  the GEMMs: {sum_step:.4f} ms in the step, {sum_alone:.4f} alone on the same paths "
              f"({sum_step / sum_alone:.2f}x), {sum_best:.4f} at the best candidate alone (the floor)")
    print(describes[-1][:2000])


if __name__ == "__main__":
    main()

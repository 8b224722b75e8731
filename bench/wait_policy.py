#!/usr/bin/python3
"""bench/wait_policy.py — OpenMP wait policies against each other, interleaved (issue 27).

    cd build && ../bench/wait_policy.py [--busy] [--cpu-time] WORKLOAD ROUNDS [VARIANT...]

WORKLOAD: train_mlp_b128 or train_cnn_b64 (bench/train_step: 12 or 6 requests of 10 steps,
the median of the requests after the first, ms per step), or epoch (one ember-train process,
trainer/.libs/ember-train examples/fashion-mnist-mlp.yaml --epochs 1 --quiet with this build's
libember, as bench/epoch.sh runs it: wall seconds from fork to exit). VARIANT (default
default passive spin1000 spin10000 active):
  default     neither variable set: what em_init chooses
  passive     OMP_WAIT_POLICY=PASSIVE
  active      OMP_WAIT_POLICY=ACTIVE
  spinN       GOMP_SPINCOUNT=N (OMP_WAIT_POLICY unset; libgomp spins N times, then sleeps)
Each round runs every variant once, the order reversed on every other round; the table gives
per variant the median over the rounds, the range, and the median CPU time of the process
(user + system, every thread, from getrusage of the children; a spinning wait counts as work). --busy keeps one
CPU-bound process (a shell loop) running beside them for the whole run; --cpu-time times the
training steps in CPU time (bench/train_step --cpu-time). Results: bench/README.md, "The
OpenMP wait policy".
"""
import os
import resource
import statistics
import subprocess
import sys
import time

args = sys.argv[1:]
busy = "--busy" in args
cpu_time = "--cpu-time" in args
args = [a for a in args if a not in ("--busy", "--cpu-time")]
if len(args) < 2 or args[0] not in ("train_mlp_b128", "train_cnn_b64", "epoch"):
    sys.exit(__doc__.strip().split("\n\n")[1])
workload, rounds = args[0], int(args[1])
variants = args[2:] or ["default", "passive", "spin1000", "spin10000", "active"]
build = os.getcwd()
here = os.path.dirname(os.path.abspath(__file__))


def env_for(v):
    e = dict(os.environ)
    e.pop("OMP_WAIT_POLICY", None)
    e.pop("GOMP_SPINCOUNT", None)
    lib = os.path.join(build, "core/.libs")
    e["LD_LIBRARY_PATH"] = lib + (":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
    if v == "passive":
        e["OMP_WAIT_POLICY"] = "PASSIVE"
    elif v == "active":
        e["OMP_WAIT_POLICY"] = "ACTIVE"
    elif v.startswith("spin") and v[4:].isdigit():
        e["GOMP_SPINCOUNT"] = v[4:]
    elif v != "default":
        sys.exit("wait_policy: unknown variant %s (default, passive, active, spinN)" % v)
    return e


def run(cmd, env, stdin_text=""):
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    out, _ = p.communicate(stdin_text.encode())
    wall = time.time() - t0
    return wall, out.decode(), p.returncode


def one(v):
    e = env_for(v)
    if workload == "epoch":
        exe = os.path.join(build, "trainer/.libs/ember-train")
        config = os.path.join(here, "..", "examples", "fashion-mnist-mlp.yaml")
        cmd = [exe, config, "--epochs", "1", "--quiet"]
        text = ""
    else:
        cmd = [os.path.join(build, "bench/train_step")] + (["--cpu-time"] if cpu_time else [])
        text = (workload + "\n") * (12 if workload == "train_mlp_b128" else 6)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, out, rc = run(cmd, e, text)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if rc != 0:
        sys.exit("wait_policy: %s failed (exit %d) under %s" % (" ".join(cmd), rc, v))
    if workload == "epoch":
        return wall, cpu
    ms = [float(line.split()[1]) for line in out.splitlines() if line.startswith(workload + " ")]
    return statistics.median(ms[1:]), cpu


spinner = subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"]) if busy else None
res = {v: [] for v in variants}
try:
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            res[v].append(one(v))
finally:
    if spinner:
        spinner.kill()
        spinner.wait()
unit = "s wall" if workload == "epoch" else "CPU ms/step" if cpu_time else "ms/step"
print("%s, %d rounds%s; median (min-max) %s, median CPU s of the process" %
      (workload, rounds, ", one CPU-bound process beside" if busy else "", unit))
for v in variants:
    a = [x[0] for x in res[v]]
    c = [x[1] for x in res[v]]
    print("  %-10s %9.3f (%.3f-%.3f)  CPU %.3f s" % (v, statistics.median(a), min(a), max(a),
                                                    statistics.median(c)))

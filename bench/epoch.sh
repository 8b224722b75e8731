#!/bin/sh
# bench/epoch.sh — one whole training process, Ember against PyTorch (issue 27's target: "one
# Fashion-MNIST MLP epoch through ember-train including start-up and evaluation, at most 0.15x
# a PyTorch script that reads the same IDX files, trains the same model with the same
# settings and evaluates the same sets, timed from process start to exit").
#
#   bench/epoch.sh [--baseline BUILD_DIR] [--threads N] [repetitions [config [epochs]]]
#                  default 5 repetitions, examples/fashion-mnist-mlp.yaml, 1 epoch
#
# Run it from the build tree after `make` (it needs Debian's dataset-fashion-mnist, or a
# config whose data.options.path holds the IDX files). Each repetition runs every process
# once, back to back, each repetition starting with the next one (a fixed order would always
# charge the same process for what the one before it left behind), and a pause between them:
#   ember        trainer/.libs/ember-train CONFIG --epochs E --quiet, with the build's libember
#                on LD_LIBRARY_PATH (what the libtool wrapper trainer/ember-train does, less
#                the wrapper's shell, which an installed ember-train has not got); the
#                environment as it is (EMBER_NUM_THREADS if set; --threads sets it)
#   ember-base   with --baseline BUILD_DIR: that build's ember-train the same way (the before
#                figures of a change, from the same run)
#   torchV/CONF  bench/epoch_torch.py CONFIG --epochs E (the config's twin in PyTorch) under
#                each interpreter in PYTHON (colon-separated; default /usr/bin/python3, Debian's
#                1.13, and ~/torchenv/bin/python, the newest from PyPI, where they import
#                torch), in compare-pytorch.py's three configurations:
#                  as-is    the environment as it is, torch's default thread count
#                  passive  OMP_WAIT_POLICY=passive, --threads N, and on a CPU with
#                           AVX-512 OPENBLAS_CORETYPE=SkylakeX (Debian's OpenBLAS kernels;
#                           elsewhere they are illegal instructions)
#                  threads  the environment as it is, --threads N
#                (N = --threads, else EMBER_NUM_THREADS, else 2). EMBER_BENCH_TORCH_CONFIGS=
#                as-is,passive picks fewer; PYTHON=none runs Ember alone.
# Each process is timed from its fork to its exit (wall), with its CPU time (user + system,
# every thread, from wait4) and its peak RSS. The table gives the medians; for each PyTorch
# its configuration with the lowest median wall time is the denominator of Ember's ratios
# (named beside it), in wall time and in CPU time. On a machine whose cores other jobs keep
# busy the wall time is mostly waiting for a core: the CPU time is the work done (but counts a
# spinning OpenMP wait as work). The last run's output lines of each process end the report
# (the same loss and accuracy figures, the same sets). Results and commands: bench/README.md,
# "A whole training process".
here=$(cd "$(dirname "$0")" && pwd)
exec /usr/bin/python3 - "$here" "$@" <<'EOF'
import os
import statistics
import subprocess
import sys
import time

here, args = sys.argv[1], sys.argv[2:]
baseline, threads = None, None
while args and args[0].startswith("--"):
    a = args.pop(0)
    if a in ("--baseline", "--threads") and args:
        v = args.pop(0)
    elif "=" in a:
        a, v = a.split("=", 1)
    else:
        sys.exit("epoch.sh: unknown option %s (--baseline BUILD_DIR, --threads N)" % a)
    if a == "--baseline":
        baseline = v
    elif a == "--threads":
        threads = v
    else:
        sys.exit("epoch.sh: unknown option %s" % a)
if len(args) > 3:
    sys.exit("usage: bench/epoch.sh [--baseline BUILD_DIR] [--threads N] "
             "[repetitions [config [epochs]]]")
try:
    reps = int(args[0]) if args else 5
    epochs = int(args[2]) if len(args) > 2 else 1
except ValueError:
    sys.exit("epoch.sh: repetitions and epochs are whole numbers")
if reps < 1 or epochs < 1:
    sys.exit("epoch.sh: at least 1 repetition and 1 epoch")
config = args[1] if len(args) > 1 else os.path.join(os.path.dirname(here),
                                                   "examples/fashion-mnist-mlp.yaml")
if not os.path.isfile(config):
    sys.exit("epoch.sh: no config %s" % config)
SETTLE_S = float(os.environ.get("EMBER_BENCH_SETTLE_S", "1.0"))


def ember_cmd(build):
    exe = os.path.join(build, "trainer/.libs/ember-train")
    lib = os.path.join(build, "core/.libs")
    if not os.access(exe, os.X_OK):
        sys.exit("epoch.sh: no %s: run it from a build tree after make (or give --baseline a "
                 "build tree)" % exe)
    env = dict(os.environ, LD_LIBRARY_PATH=lib + (":" + os.environ["LD_LIBRARY_PATH"]
                                                  if os.environ.get("LD_LIBRARY_PATH") else ""))
    if threads:
        env["EMBER_NUM_THREADS"] = threads
    return [exe, config, "--epochs", str(epochs), "--quiet"], env


procs = []  # (label, argv, env)
argv, env = ember_cmd(os.getcwd())
procs.append(("ember", argv, env))
if baseline:
    argv, env = ember_cmd(baseline)
    procs.append(("ember-base", argv, env))
n = threads or os.environ.get("EMBER_NUM_THREADS") or "2"
pythons = os.environ.get("PYTHON", "/usr/bin/python3:" +
                         os.path.expanduser("~/torchenv/bin/python"))
configs = [c for c in os.environ.get("EMBER_BENCH_TORCH_CONFIGS",
                                     "as-is,passive,threads").split(",") if c]
bad = [c for c in configs if c not in ("as-is", "passive", "threads")]
if bad:
    sys.exit("epoch.sh: EMBER_BENCH_TORCH_CONFIGS: unknown %s (as-is, passive, threads)"
             % ",".join(bad))
twin = [os.path.join(here, "epoch_torch.py"), config, "--epochs", str(epochs)]
torches = []
avx512 = any(l.startswith("flags") and " avx512f" in l for l in open("/proc/cpuinfo"))
for py in ([] if pythons == "none" else [p for p in pythons.split(":") if p]):
    probe = subprocess.run([py, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True) if os.access(py, os.X_OK) else None
    if not probe or probe.returncode:
        print("(PyTorch is not installed for %s: left out)" % py)
        continue
    tag = "torch" + probe.stdout.strip().split("+")[0]
    torches.append(tag)
    base = dict(os.environ)
    passive = dict(base, OMP_WAIT_POLICY="passive")
    if avx512:
        passive["OPENBLAS_CORETYPE"] = "SkylakeX"
    envs = {"as-is": (base, []),
            "passive": (passive, ["--threads", n]),
            "threads": (base, ["--threads", n])}
    for c in configs:
        e, extra = envs[c]
        procs.append(("%s/%s" % (tag, c), [py] + twin + extra, e))
    print("%s: %s" % (tag, py))

print("config %s, %d epoch(s), %d repetitions; cpu: %s, %d cores; load average at start: %s"
      % (config, epochs, reps,
         next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
               if l.startswith("model name")), "?"), os.cpu_count(),
         " ".join(open("/proc/loadavg").read().split()[:3])), flush=True)

wall, cpu, rss, last = {}, {}, {}, {}
started = time.perf_counter()
for rep in range(reps):
    turn = procs[rep % len(procs):] + procs[:rep % len(procs)]
    for label, argv, env in turn:
        time.sleep(SETTLE_S)  # the previous process's threads and page cache writes settle
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        t = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode:
            sys.stdout.write(out.decode(errors="replace"))
            sys.exit("epoch.sh: %s exited with %d: %s" % (label, p.returncode, " ".join(argv)))
        wall.setdefault(label, []).append(t)
        cpu.setdefault(label, []).append(ru.ru_utime + ru.ru_stime)
        rss.setdefault(label, []).append(ru.ru_maxrss / 1024.0)
        last[label] = out.decode(errors="replace")
        print("  %-22s %8.3f s wall %8.3f s CPU %7.1f MiB" % (label, t, cpu[label][-1],
                                                          rss[label][-1]),
              file=sys.stderr, flush=True)
    print("(repetition %d of %d, %.0f s so far)" % (rep + 1, reps, time.perf_counter() - started),
          file=sys.stderr, flush=True)

med = lambda v: statistics.median(v)
print("\n%-22s %9s %9s %9s %9s %11s   (medians of %d; min..max wall)"
      % ("process", "wall s", "min", "max", "CPU s", "peak RSS", reps))
for label, _, _ in procs:
    print("%-22s %9.3f %9.3f %9.3f %9.3f %7.1f MiB" % (label, med(wall[label]), min(wall[label]),
                                                       max(wall[label]), med(cpu[label]),
                                                       med(rss[label])))
for e in [l for l, _, _ in procs if l.startswith("ember")]:
    for tag in torches:
        cands = [l for l, _, _ in procs if l.startswith(tag + "/")]
        best = min(cands, key=lambda l: med(wall[l]))
        bcpu = min(cands, key=lambda l: med(cpu[l]))
        print("%s / %s: wall %.3f (against %s), CPU %.3f (against %s), peak RSS %.3f"
              % (e, tag, med(wall[e]) / med(wall[best]), best, med(cpu[e]) / med(cpu[bcpu]),
                 bcpu, med(rss[e]) / med(rss[best])))
if baseline:
    pairs = [a / b for a, b in zip(wall["ember"], wall["ember-base"])]
    cp = [a / b for a, b in zip(cpu["ember"], cpu["ember-base"])]
    print("ember / ember-base per repetition: wall %s; CPU %s"
          % (" ".join("%.3f" % x for x in pairs), " ".join("%.3f" % x for x in cp)))
print("load average at the end: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
for label, _, _ in procs:
    print("\n== %s (last run):\n%s" % (label, last[label].rstrip()))
EOF

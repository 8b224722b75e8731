#!/usr/bin/python3
"""Two builds' training steps interleaved, with PyTorch's in the same run: before/after figures
on a shared machine.

    bench/ab-train-step.py BEFORE/bench/train_step AFTER/bench/train_step [reps] [workload]

(default 7 repetitions of train_transformer_b32). Each repetition asks every worker for one
timed batch of the workload, in turn (as bench/compare-pytorch.py does): the two Ember builds
(EMBER_NUM_THREADS=2, OMP_WAIT_POLICY=passive) and, when PYTHON (default /usr/bin/python3) has
torch, PyTorch's worker of bench/compare-pytorch.py in its best configuration (2 threads,
OPENBLAS_CORETYPE=SkylakeX, OMP_WAIT_POLICY=passive) and as is. Prints per repetition the wall
ms per step of each, then the medians, the ratios after/before and each to the faster PyTorch,
and the CPU time per step of each (user + system of the worker process over the batch, from
/proc): on a loaded machine the CPU time is the steadier measure of the work a step does.
"""
import importlib.util
import os
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("compare_pytorch",
                                              os.path.join(here, "compare-pytorch.py"))
cp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cp)
if not hasattr(cp, "Worker") or not hasattr(cp, "TORCH_WORKER"):
    sys.exit("ab-train-step: bench/compare-pytorch.py no longer has Worker and TORCH_WORKER")
if len(sys.argv) < 3:
    sys.exit(__doc__)
before, after = sys.argv[1], sys.argv[2]
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 7
name = sys.argv[4] if len(sys.argv) > 4 else "train_transformer_b32"
env = dict(os.environ, EMBER_NUM_THREADS="2", OMP_WAIT_POLICY="passive")
W = {"before": cp.Worker("before", [before], env), "after": cp.Worker("after", [after], env)}
python = os.environ.get("PYTHON", "/usr/bin/python3")
if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
    best = dict(os.environ, OPENBLAS_CORETYPE="SkylakeX", OMP_WAIT_POLICY="passive",
                EMBER_BENCH_TORCH_THREADS="2")
    for label, e in (("torch", best), ("torch-as-is", dict(os.environ))):
        W[label] = cp.Worker(label, [python, "-c", cp.TORCH_WORKER], e)
        print(label, W[label].p.stdout.readline().strip())


def cpu_ms(w):
    f = open("/proc/%d/stat" % w.p.pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


for w in W.values():
    if w.ask(name)[0] is None:
        sys.exit("ab-train-step: %s does not know workload %s" % (w.label, name))
wall = {k: [] for k in W}
cpu = {k: [] for k in W}
for r in range(reps):
    for k, w in W.items():
        time.sleep(0.2)
        c0 = cpu_ms(w)
        ms, steps = w.ask(name)
        wall[k].append(ms)
        cpu[k].append((cpu_ms(w) - c0) / max(len(steps), 1))
    print("rep %d  " % r + "  ".join("%s %.1f" % (k, v[-1]) for k, v in wall.items()), flush=True)
med = {k: statistics.median(v) for k, v in wall.items()}
cmed = {k: statistics.median(v) for k, v in cpu.items()}
print("wall ms per step, medians: " + "  ".join("%s %.1f" % kv for kv in med.items()))
print("after / before: %.3f (per repetition %s)" % (
    med["after"] / med["before"],
    " ".join("%.2f" % (a / b) for a, b in zip(wall["after"], wall["before"]))))
if "torch" in W:
    faster = [min(t, a) for t, a in zip(wall["torch"], wall["torch-as-is"])]
    tf = min(med["torch"], med["torch-as-is"])
    for k in ("before", "after"):
        print("%s / faster PyTorch: %.3f (per repetition %s)" % (
            k, med[k] / tf, " ".join("%.2f" % (e / t) for e, t in zip(wall[k], faster))))
print("CPU ms per step, medians: " + "  ".join("%s %.1f" % kv for kv in cmed.items()))
print("CPU after / before: %.3f (per repetition %s)" % (
    cmed["after"] / cmed["before"],
    " ".join("%.2f" % (a / b) for a, b in zip(cpu["after"], cpu["before"]))))
for w in W.values():
    w.close()

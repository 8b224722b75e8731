#!/usr/bin/python3
"""Ember against PyTorch on the same workloads, in one invocation, interleaved.

Run from the build tree after `make`:   bench/compare-pytorch.py [repetitions]
(in a separate build directory: cd build && ../bench/compare-pytorch.py)

Workers stay alive and are driven line by line, so every repetition runs each workload once
in each, back to back:
  ember        bench/compare (EMBER_NUM_THREADS=2)
  ember-sx     bench/compare with OPENBLAS_CORETYPE=SkylakeX, for raw OpenBLAS's best kernels
  torch        PyTorch in its best configuration here: torch.set_num_threads(2),
               OPENBLAS_CORETYPE=SkylakeX, OMP_WAIT_POLICY=passive
  torch-as-is  PyTorch with the environment as it is (for reference)
PYTHON=/path/to/python3 picks the interpreter with torch (default /usr/bin/python3); without
torch only Ember's columns are printed. Prints `name ember_ms torch_ms ratio` (medians,
ratio = ember / torch), then the means, then derived figures (GFLOP/s, bandwidth).
"""
import os
import statistics
import subprocess
import sys

WORKLOADS = ["sgemm_1024", "sgemm_2048", "bf16_mm_2048", "add_16M", "memcpy_64MB", "add_1elem"]
RAW = ["raw_onednn_1024", "raw_openblas_1024"]

TORCH_WORKER = r'''
import sys, time, os
import torch
if os.environ.get("EMBER_BENCH_TORCH_THREADS"):
    torch.set_num_threads(int(os.environ["EMBER_BENCH_TORCH_THREADS"]))
torch.manual_seed(0)
def mm(n, dt):
    a = torch.rand(n, n, dtype=dt) * 2 - 1; b = torch.rand(n, n, dtype=dt) * 2 - 1
    return lambda: torch.matmul(a, b)
def add(n):
    a = torch.rand(n); b = torch.rand(n)
    return lambda: torch.add(a, b)
def cp(n):
    a = torch.rand(n); b = torch.empty(n)
    return lambda: b.copy_(a)
make = {"sgemm_1024": (lambda: mm(1024, torch.float32), 10),
        "sgemm_2048": (lambda: mm(2048, torch.float32), 2),
        "bf16_mm_2048": (lambda: mm(2048, torch.bfloat16), 4),
        "add_16M": (lambda: add(1 << 24), 10),
        "memcpy_64MB": (lambda: cp(1 << 24), 10),
        "add_1elem": (lambda: add(1), 200000)}
ready = {}
print("ready torch %s threads %d" % (torch.__version__, torch.get_num_threads()), flush=True)
for line in sys.stdin:
    name = line.strip()
    if name not in make:
        print(name, "unknown", flush=True); continue
    if name not in ready:
        f = make[name][0](); f(); ready[name] = f
    f, iters = ready[name], make[name][1]
    t0 = time.perf_counter()
    for _ in range(iters): f()
    print(name, "%.6f" % ((time.perf_counter() - t0) * 1e3 / iters), flush=True)
'''


class Worker:
    def __init__(self, label, argv, env):
        self.label = label
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True, bufsize=1)
        self.banner = None

    def ask(self, name):
        self.p.stdin.write(name + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().split()
        if len(out) != 2 or out[1] == "unknown":
            return None
        return float(out[1])

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def find_compare():
    here = os.path.dirname(os.path.abspath(__file__))
    for c in ("bench/compare", os.path.join(here, "compare")):
        if os.access(c, os.X_OK):
            return c
    sys.exit("compare-pytorch: bench/compare not found; run `make` and start from the build tree")


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    compare = find_compare()
    base = dict(os.environ)
    base.setdefault("EMBER_NUM_THREADS", "2")
    describe = subprocess.run([compare, "--describe"], env=base, capture_output=True, text=True)
    print(describe.stdout.strip())
    workers = {"ember": Worker("ember", [compare], base)}
    sx = dict(base, OPENBLAS_CORETYPE="SkylakeX")
    workers["ember-sx"] = Worker("ember-sx", [compare], sx)
    python = os.environ.get("PYTHON", "/usr/bin/python3")
    have_torch = subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
    if have_torch:
        best = dict(base, OPENBLAS_CORETYPE="SkylakeX", OMP_WAIT_POLICY="passive",
                    EMBER_BENCH_TORCH_THREADS="2")
        for label, env in (("torch", best), ("torch-as-is", dict(os.environ))):
            w = Worker(label, [python, "-c", TORCH_WORKER], env)
            w.banner = w.p.stdout.readline().strip()
            print("%s: %s" % (label, w.banner))
            workers[label] = w
    else:
        print("(PyTorch is not installed for %s: Ember's figures only)" % python)

    times = {}  # (worker, workload) -> [ms]
    for _ in range(reps):
        for name in WORKLOADS + RAW:
            for label, w in workers.items():
                if name in RAW and not label.startswith("ember"):
                    continue
                if label == "ember-sx" and name != "raw_openblas_1024":
                    continue
                t = w.ask(name)
                if t is not None:
                    times.setdefault((label, name), []).append(t)
    for w in workers.values():
        w.close()

    med = lambda l, n: statistics.median(times[(l, n)]) if (l, n) in times else float("nan")
    mean = lambda l, n: statistics.fmean(times[(l, n)]) if (l, n) in times else float("nan")
    print("\n%d repetitions, interleaved; ms per op; ratio = ember / torch (best config)" % reps)
    print("%-14s %10s %10s %7s   %10s %10s %7s   %12s" % ("name", "ember_ms", "torch_ms", "ratio",
          "ember_mean", "torch_mean", "ratio", "torch_as_is"))
    for n in WORKLOADS:
        e, t = med("ember", n), med("torch", n)
        em, tm = mean("ember", n), mean("torch", n)
        print("%-14s %10.4f %10.4f %7.2f   %10.4f %10.4f %7.2f   %12.4f" % (
            n, e, t, e / t, em, tm, em / tm, med("torch-as-is", n)))
    print("\nraw libraries, 1024^3 f32 (medians): oneDNN %.3f ms, OpenBLAS default %.3f ms, "
          "OpenBLAS SkylakeX %.3f ms" % (med("ember", "raw_onednn_1024"),
                                         med("ember", "raw_openblas_1024"),
                                         med("ember-sx", "raw_openblas_1024")))
    gf = lambda n, ms: 2.0 * n ** 3 / (ms * 1e-3) / 1e9
    e1024 = gf(1024, med("ember", "sgemm_1024"))
    best_raw = max(gf(1024, med("ember", "raw_onednn_1024")),
                   gf(1024, med("ember", "raw_openblas_1024")),
                   gf(1024, med("ember-sx", "raw_openblas_1024")))
    print("sgemm 1024^3 through em_matmul: %.1f GFLOP/s = %.0f%% of the best raw library "
          "(%.1f GFLOP/s)" % (e1024, 100 * e1024 / best_raw, best_raw))
    f32_2048 = gf(2048, med("ember", "sgemm_2048"))
    bf16_2048 = gf(2048, med("ember", "bf16_mm_2048"))
    print("2048^3: f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s (%.2fx f32)" % (f32_2048, bf16_2048,
                                                                       bf16_2048 / f32_2048))
    mib = 4.0 * (1 << 24) / 1e9
    add_gbs = 3 * mib / (med("ember", "add_16M") * 1e-3)
    cp_gbs = 2 * mib / (med("ember", "memcpy_64MB") * 1e-3)
    print("add 16M f32: %.1f GB/s (2 reads + 1 write) vs memcpy %.1f GB/s (1 read + 1 write): "
          "%.0f%%" % (add_gbs, cp_gbs, 100 * add_gbs / cp_gbs))
    print("tiny op (1-element em_add + release): %.3f us; torch.add: %.3f us" % (
        med("ember", "add_1elem") * 1e3, med("torch", "add_1elem") * 1e3))


if __name__ == "__main__":
    main()

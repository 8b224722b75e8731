#!/usr/bin/python3
"""Ember against PyTorch on the same workloads, in one invocation, interleaved.

Run from the build tree after `make`:   bench/compare-pytorch.py [repetitions] [workload...]
(in a separate build directory: cd build && ../bench/compare-pytorch.py); naming workloads
runs only those (e.g. `bench/compare-pytorch.py 7 train_mlp_b128 train_cnn_b64`).

Workers stay alive and are driven line by line, so every repetition runs each workload once
in each, back to back:
  ember        bench/compare (EMBER_NUM_THREADS=2)
  ember-sx     bench/compare with OPENBLAS_CORETYPE=SkylakeX, for raw OpenBLAS's best kernels
  ember-train  bench/train_step (EMBER_NUM_THREADS=2, OMP_WAIT_POLICY=passive like PyTorch's
               best configuration: both run on GNU OpenMP): issue 3's training steps, forward
               + backward + Adam update of an MLP 784-512-256-10 (batch 128) and the CNN
               (batch 64), and issue 25's LSTM step (nn.LSTM(256, 256) over 64 steps of a
               batch of 32, a Linear(256, 64) head at every step, cross_entropy), Ember's
               "Adam" optimizer from the registry (its fused kernel);
               PyTorch runs the same networks with torch.optim.Adam (default arguments:
               foreach, lr 1e-3)
  ember-train-as-is  the same with OMP_WAIT_POLICY as it is (printed after the table: on a
               machine whose cores other processes keep busy, libgomp's default spinning at
               every parallel region's barrier costs Ember many times its compute)
  torch        PyTorch in its best configuration here: torch.set_num_threads(2),
               OPENBLAS_CORETYPE=SkylakeX, OMP_WAIT_POLICY=passive
  torch-as-is  PyTorch with the environment as it is (for reference)
PYTHON=/path/to/python3 picks the interpreter with torch (default /usr/bin/python3); without
torch only Ember's columns are printed. Prints `name ember_ms torch_ms ratio` (medians,
ratio = ember / torch), then the means, then derived figures (GFLOP/s, bandwidth). For the
training steps every single step is timed too: the mean step against the median step (issue
3: mean <= 1.2x median) and the slowest step, for Ember and PyTorch.
"""
import os
import statistics
import time
import subprocess
import sys

WORKLOADS = ["sgemm_1024", "sgemm_2048", "bf16_mm_2048", "add_16M", "memcpy_64MB", "add_1elem"]
TRAIN = ["train_mlp_b128", "train_cnn_b64", "train_lstm_h256"]
SETTLE_S = float(os.environ.get("EMBER_BENCH_SETTLE_S", "0.2"))  # pause before each timed batch
WARM_S = float(os.environ.get("EMBER_BENCH_WARM_S", "0.3"))  # untimed work after the pause
RAW = ["raw_onednn_1024", "raw_openblas_1024"]

TORCH_WORKER = r'''
import sys, time, os
import torch
import torch.nn as nn
import torch.nn.functional as F
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
def train(cnn, batch):
    if cnn:
        net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
        x = torch.rand(batch, 1, 28, 28)
    else:
        net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                            nn.Linear(256, 10))
        x = torch.rand(batch, 784)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.Adam(net.parameters())
    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return step
def train_lstm(batch):
    lstm, head = nn.LSTM(256, 256), nn.Linear(256, 64)
    x = torch.rand(64, batch, 256)
    y = torch.randint(0, 64, (64 * batch,))
    opt = torch.optim.Adam(list(lstm.parameters()) + list(head.parameters()))
    net = lambda x: head(lstm(x)[0].reshape(-1, 256))
    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return step
make = {"sgemm_1024": (lambda: mm(1024, torch.float32), 10),
        "sgemm_2048": (lambda: mm(2048, torch.float32), 2),
        "bf16_mm_2048": (lambda: mm(2048, torch.bfloat16), 4),
        "add_16M": (lambda: add(1 << 24), 10),
        "memcpy_64MB": (lambda: cp(1 << 24), 10),
        "add_1elem": (lambda: add(1), 200000),
        "train_mlp_b128": (lambda: train(False, 128), 10),
        "train_cnn_b64": (lambda: train(True, 64), 3),
        "train_lstm_h256": (lambda: train_lstm(32), 3)}
ready = {}
print("ready torch %s threads %d" % (torch.__version__, torch.get_num_threads()), flush=True)
for line in sys.stdin:
    name = line.strip()
    if name not in make:
        print(name, "unknown", flush=True); continue
    if name not in ready:
        f = make[name][0](); f(); ready[name] = f
    f, iters = ready[name], make[name][1]
    each = []
    t0 = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter(); f(); each.append((time.perf_counter() - t) * 1e3)
    total = (time.perf_counter() - t0) * 1e3 / iters
    steps = " ".join("%.6f" % e for e in each) if name.startswith("train") else ""
    print(name, "%.6f" % total, steps, flush=True)
'''


class Worker:
    def __init__(self, label, argv, env):
        self.label = label
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True, bufsize=1)
        self.banner = None

    def ask(self, name):
        """ms per op (or step), and the single steps' times when the worker gives them."""
        self.p.stdin.write(name + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline().split()
        if len(out) < 2 or out[1] == "unknown":
            return None, []
        return float(out[1]), [float(x) for x in out[2:]]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def find_program(name):
    here = os.path.dirname(os.path.abspath(__file__))
    for c in ("bench/" + name, os.path.join(here, name)):
        if os.access(c, os.X_OK):
            return c
    sys.exit("compare-pytorch: bench/%s not found; run `make` and start from the build tree"
             % name)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    chosen = sys.argv[2:] or WORKLOADS + TRAIN
    unknown = [n for n in chosen if n not in WORKLOADS + TRAIN]
    if unknown:
        sys.exit("compare-pytorch: unknown workload %s; the workloads: %s"
                 % (", ".join(unknown), " ".join(WORKLOADS + TRAIN)))
    names = [n for n in WORKLOADS + TRAIN if n in chosen]
    raw = RAW if "sgemm_1024" in names else []
    compare = find_program("compare")
    base = dict(os.environ)
    base.setdefault("EMBER_NUM_THREADS", "2")
    describe = subprocess.run([compare, "--describe"], env=base, capture_output=True, text=True)
    print(describe.stdout.strip())
    workers = {"ember": Worker("ember", [compare], base)}
    sx = dict(base, OPENBLAS_CORETYPE="SkylakeX")
    workers["ember-sx"] = Worker("ember-sx", [compare], sx)
    if any(n in TRAIN for n in names):
        train_step = find_program("train_step")
        workers["ember-train"] = Worker("ember-train", [train_step],
                                        dict(base, OMP_WAIT_POLICY="passive"))
        workers["ember-train-as-is"] = Worker("ember-train-as-is", [train_step], base)
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

    times = {}  # (worker, workload) -> [ms]; the training worker's figures count as ember's
    single = {}  # (worker, workload) -> [ms of each single training step]
    order = list(workers.items())
    for rep in range(reps):
        # Each repetition starts with the next worker: a worker that runs right after another
        # can pay for what that one left behind (threads still winding down, caches), and a
        # fixed order would always charge it to the same one.
        turn = order[rep % len(order):] + order[:rep % len(order)]
        for name in names + raw:
            for label, w in turn:
                if name in RAW and not label.startswith("ember"):
                    continue
                if label == "ember-sx" and name != "raw_openblas_1024":
                    continue
                if label.startswith("ember") and label.startswith("ember-train") != (name in TRAIN):
                    continue
                # Let the previous worker's threads go quiet first: PyTorch's OpenBLAS workers
                # spin ~0.1 s after a call and libgomp's default ~3 ms after a region, and on 2
                # cores they would take the next worker's turn.
                time.sleep(SETTLE_S)
                # Then untimed batches of the same workload for at least WARM_S (one at least):
                # on this VM a core that was idle runs slow for the next 50-100 ms, and a fixed
                # number of untimed batches would leave more of that in the faster worker's
                # timed batch than in the slower one's.
                t0 = time.perf_counter()
                while True:
                    w.ask(name)
                    if time.perf_counter() - t0 >= WARM_S:
                        break
                t, each = w.ask(name)
                if t is not None:
                    key = "ember" if label == "ember-train" else label
                    times.setdefault((key, name), []).append(t)
                    single.setdefault((key, name), []).extend(each)
    for w in workers.values():
        w.close()

    med = lambda l, n: statistics.median(times[(l, n)]) if (l, n) in times else float("nan")
    mean = lambda l, n: statistics.fmean(times[(l, n)]) if (l, n) in times else float("nan")
    print("\n%d repetitions, interleaved; ms per op; ratio = ember / torch (best config)" % reps)
    print("%-14s %10s %10s %7s   %10s %10s %7s   %12s" % ("name", "ember_ms", "torch_ms", "ratio",
          "ember_mean", "torch_mean", "ratio", "torch_as_is"))
    for n in names:
        e, t = med("ember", n), med("torch", n)
        em, tm = mean("ember", n), mean("torch", n)
        print("%-14s %10.4f %10.4f %7.2f   %10.4f %10.4f %7.2f   %12.4f" % (
            n, e, t, e / t, em, tm, em / tm, med("torch-as-is", n)))
    steps = [n for n in names if n in TRAIN]
    for n in steps:
        r = [e / t for e, t in zip(times.get(("ember", n), []), times.get(("torch", n), []))]
        if r:
            print("%s: Ember / PyTorch per repetition: median %.2f, mean %.2f, range %.2f-%.2f"
                  % (n, statistics.median(r), statistics.fmean(r), min(r), max(r)))
        print("%s: Ember with OMP_WAIT_POLICY as it is: median %.4f ms (%.2fx PyTorch's best)"
              % (n, med("ember-train-as-is", n), med("ember-train-as-is", n) / med("torch", n)))
        for label in ("ember", "torch"):
            s = single.get((label, n), [])
            if s:
                m, md = statistics.fmean(s), statistics.median(s)
                print("%s: %s single steps (%d): median %.4f ms, mean %.4f ms = %.2fx the "
                      "median, slowest %.4f ms" % (n, label, len(s), md, m, m / md, max(s)))
    if "add_1elem" in names:  # the ms column rounds it away
        print("tiny op (1-element em_add + release): %.3f us; torch.add: %.3f us" % (
            med("ember", "add_1elem") * 1e3, med("torch", "add_1elem") * 1e3))
    if not all(n in names for n in WORKLOADS):
        return
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


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""CPU time per training step, Ember against PyTorch, interleaved: the companion of
compare-pytorch.py's wall-clock rows for a machine whose cores other processes keep busy.

Run from the build tree after `make`:   ../bench/cpu-time-pytorch.py [repetitions] [workload...]
Workloads: train_lstm_h256 (compare-pytorch.py's: nn.LSTM(256, 256) over 64 steps of a batch
of 32, Linear(256, 64) at every step, cross_entropy, Adam) and train_gru_h256 (the same with
nn.GRU(256, 256)); Ember's side is bench/train_step's workload of the same name.

On a loaded machine a step's wall time is mostly the wait for a core; the CPU time a worker's
threads spend (the sum over /proc/PID/task/*/schedstat, in ns) is its work. Both workers run
on one thread (EMBER_NUM_THREADS=1; torch.set_num_threads(1)) with OMP_WAIT_POLICY=passive
(no spinning at barriers counted as work) and OPENBLAS_CORETYPE=SkylakeX for PyTorch; each
repetition runs one batch of 3 steps in each worker, back to back, alternating which goes
first. The CPU time of one thread is what an idle core would take, cache effects of the other
processes aside. Prints per-step CPU ms (medians over the repetitions) and the ratio
ember / torch. PYTHON=/path/to/python3 picks the interpreter with torch (default
/usr/bin/python3).
"""
import glob
import os
import statistics
import subprocess
import sys

TRAIN = ["train_lstm_h256", "train_gru_h256"]
ITERS = 3

TORCH_WORKER = r'''
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)
def train_rnn(cls, batch):
    rnn, head = cls(256, 256), nn.Linear(256, 64)
    x = torch.rand(64, batch, 256)
    y = torch.randint(0, 64, (64 * batch,))
    opt = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()))
    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(head(rnn(x)[0].reshape(-1, 256)), y).backward()
        opt.step()
    return step
make = {"train_lstm_h256": lambda: train_rnn(nn.LSTM, 32),
        "train_gru_h256": lambda: train_rnn(nn.GRU, 32)}
ready = {}
print("ready torch %s threads %d" % (torch.__version__, torch.get_num_threads()), flush=True)
for line in sys.stdin:
    name = line.strip()
    if name not in ready:
        ready[name] = make[name](); ready[name]()
    for _ in range(ITERS_):
        ready[name]()
    print(name, "done", flush=True)
'''.replace("ITERS_", str(ITERS))


def cpu_ns(pid):
    total = 0
    for f in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            with open(f) as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


class Worker:
    def __init__(self, label, argv, env):
        self.label = label
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True, bufsize=1)

    def run(self, name):
        """CPU ms per step of one batch of the workload."""
        t0 = cpu_ns(self.p.pid)
        self.p.stdin.write(name + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line.startswith(name) or "unknown" in line:
            sys.exit("cpu-time-pytorch: %s answered %r to %s" % (self.label, line.strip(), name))
        return (cpu_ns(self.p.pid) - t0) / 1e6 / ITERS

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    names = sys.argv[2:] or TRAIN
    unknown = [n for n in names if n not in TRAIN]
    if unknown:
        sys.exit("cpu-time-pytorch: unknown workload %s; the workloads: %s"
                 % (", ".join(unknown), " ".join(TRAIN)))
    here = os.path.dirname(os.path.abspath(__file__))
    prog = next((c for c in ("bench/train_step", os.path.join(here, "train_step"))
                 if os.access(c, os.X_OK)), None)
    if not prog:
        sys.exit("cpu-time-pytorch: bench/train_step not found; run `make` and start from the "
                 "build tree")
    python = os.environ.get("PYTHON", "/usr/bin/python3")
    base = dict(os.environ, OMP_WAIT_POLICY="passive")
    ember = Worker("ember", [prog], dict(base, EMBER_NUM_THREADS="1"))
    torch = Worker("torch", [python, "-c", TORCH_WORKER],
                   dict(base, OPENBLAS_CORETYPE="SkylakeX", OMP_NUM_THREADS="1"))
    print("torch: %s" % torch.p.stdout.readline().strip())
    for name in names:  # warm-up: the first request builds the workload
        ember.run(name)
        torch.run(name)
    times = {(w, n): [] for w in ("ember", "torch") for n in names}
    for rep in range(reps):
        for name in names:
            for w in ((ember, torch) if rep % 2 == 0 else (torch, ember)):
                times[(w.label, name)].append(w.run(name))
    ember.close()
    torch.close()
    print("%d repetitions, interleaved; CPU ms per step (one thread each), medians" % reps)
    print("%-18s %10s %10s %7s   per-repetition ratio median (range)" %
          ("name", "ember", "torch", "ratio"))
    for name in names:
        e, t = times[("ember", name)], times[("torch", name)]
        r = [a / b for a, b in zip(e, t)]
        print("%-18s %10.2f %10.2f %7.2f   %.2f (%.2f-%.2f)" %
              (name, statistics.median(e), statistics.median(t),
               statistics.median(e) / statistics.median(t), statistics.median(r), min(r), max(r)))


if __name__ == "__main__":
    main()

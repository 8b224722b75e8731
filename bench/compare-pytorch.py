#!/usr/bin/python3
"""Ember against PyTorch on the same workloads, in one invocation, interleaved.

Run from the build tree after `make`:
    bench/compare-pytorch.py [--baseline BUILD_DIR] [--cpu-time] [--threads N]
                             [repetitions] [workload...]
(in a separate build directory: cd build && ../bench/compare-pytorch.py); naming workloads
runs only those (e.g. `bench/compare-pytorch.py 7 train_mlp_b128 train_cnn_b64`).
bench/steps.sh is this script over the training steps only (the before/after table).

  --baseline BUILD_DIR  also run BUILD_DIR's bench/train_step, interleaved (ember-base below):
                the before/after figures of two builds from the same run
  --cpu-time    time the training steps in CPU time instead of wall time: bench/train_step
                --cpu-time (CLOCK_PROCESS_CPUTIME_ID, every thread of the process) and
                PyTorch's worker on time.process_time() (the same clock), per step; on a
                machine whose cores other jobs keep busy a step's wall time is mostly the wait
                for a core, its CPU time the work it did. Training workloads only (default:
                every one); no FMA ceiling (a wall-time figure), and the floor is
                bench/step_floor --cpu-time's (each GEMM's and convolution's CPU time alone,
                the same clock), so /floor is the step's CPU time over its floor's. In the first
                repetition each worker's CPU time per batch is checked against the sum over its
                threads in /proc/PID/task/*/schedstat: a --baseline build older than
                train_step's --cpu-time (which would time wall clock) is refused
  --threads N   Ember's and PyTorch's thread count (EMBER_NUM_THREADS for Ember,
                torch.set_num_threads for PyTorch's passive and threads configurations; the
                as-is one keeps torch's default): `--cpu-time --threads 1` compares one
                thread's work, what an idle core would take (cache effects of the other
                processes aside)
  train_gru_h256  a workload run only when named: train_lstm_h256 with nn.GRU(256, 256)
                (Ember: the gru op), no floor in bench/step_floor
  train_cnn_b64_blocked  train_cnn_b64 with Ember's activations in the nChw16c storage
                layout (Conv2d memory_format: blocked); PyTorch runs train_cnn_b64's model
                (its faster configuration), the floor is train_cnn_b64's

PyTorch: every interpreter in PYTHON (colon-separated; default /usr/bin/python3, Debian's
1.13, and ~/torchenv/bin/python, the newest from PyPI, where it exists) that imports torch,
each in three configurations, all interleaved with Ember:
  as-is      the environment as it is, torch's default thread count
  passive    OMP_WAIT_POLICY=passive, OPENBLAS_CORETYPE=SkylakeX (on a CPU with AVX-512;
             elsewhere those kernels are illegal instructions), torch.set_num_threads(N)
  threads    the environment as it is (libgomp spins), torch.set_num_threads(N)
  channels-last  threads, with the CNN's model and input in channels_last
             (.to(memory_format=torch.channels_last), the layout Ember's CNN runs in); CNN
             steps only
(N = --threads, else EMBER_NUM_THREADS, default 2). For each PyTorch and each workload the
configuration with the lowest median is the denominator of the ratios, and its name is printed
beside it.
EMBER_BENCH_TORCH_CONFIGS=as-is,passive picks fewer. PYTHON=none runs Ember alone.

Workers stay alive and are driven line by line, in turns: every repetition runs each workload
once in each. A worker's turn is a pause (EMBER_BENCH_SETTLE_S, 0.2 s), untimed batches of the
workload for at least EMBER_BENCH_WARM_S (0.3 s), the last of them sent together with the timed
one so that the worker runs that straight after. Every other worker is stopped (SIGSTOP) for the
whole turn (fma_peak runs with all of them stopped, step_floor after they exited), so nothing a
worker left running (spinning OpenMP or OpenBLAS threads) can take a core from the timed one;
EMBER_BENCH_STOP_OTHERS=0 leaves them running, idle. After the tables a section gives, for each
worker and workload, what else ran while its timed batch did (medians over the repetitions): the
worker's CPU time and its threads' time runnable but waiting for a CPU (/proc/PID/task/*/
schedstat), the other workers' CPU time (during the batch, its maximum, and earlier in the turn),
every other process's (/proc/stat), the hypervisor's steal; and the load average. The workers:
  ember        bench/compare (EMBER_NUM_THREADS=N)
  ember-sx     bench/compare with OPENBLAS_CORETYPE=SkylakeX, for raw OpenBLAS's best kernels
               (on a CPU with AVX-512; elsewhere OpenBLAS's own choice)
  ember-train  bench/train_step (EMBER_NUM_THREADS=N, OMP_WAIT_POLICY=passive, Ember's own
               default): issue 3's training steps, forward + backward + Adam update of an MLP
               784-512-256-10 (batch 128) and the CNN (batch 64), and issue 25's LSTM step
               (nn.LSTM(256, 256) over 64 steps of a batch of 32, a Linear(256, 64) head at
               every step, cross_entropy), Ember's "Adam" optimizer from the registry (its
               fused kernel); PyTorch runs the same networks with torch.optim.Adam (default
               arguments: foreach, lr 1e-3); issue 25's 2-layer TransformerEncoder (d_model
               256, 4 heads, feed-forward 1024, dropout 0.1, batch_first) on (32, 128, 256)
               with an mse loss: Ember's layer class against nn.TransformerEncoder in
               training mode; train_cnn_b64_bf16 is the CNN step with forward and loss under
               bf16 autocast (Ember's em_autocast_begin("cpu", EM_BF16), PyTorch's
               torch.autocast("cpu", torch.bfloat16)), compare it with train_cnn_b64
  ember-train-as-is  the same with OMP_WAIT_POLICY as it is (printed after the table)
  ember-base   with --baseline BUILD_DIR: BUILD_DIR's bench/train_step, the same way as
               ember-train (a developer's "before" build: the table gets its medians and
               this build's over them, from the same run)
  fma_peak     bench/fma_peak, once per repetition in its turn and once before the floor:
               the measured f32 FMA ceiling of the run is the best of its runs (issue 27; on
               an AVX-512 CPU the better of its zmm and ymm runs)
After the repetitions bench/step_floor (OMP_WAIT_POLICY=passive) times each chosen training
step's GEMMs and convolutions alone at the best library choice for each shape (for a
convolution, activations in oneDNN's preferred layout or in nhwc) and prints its table; the
training table then gives each step's GEMM+convolution GFLOP, its floor, Ember's
median step over the floor, and the fractions of the FMA ceiling for Ember and each PyTorch.
Prints `name ember_ms torch_ms ratio` (medians, ratio = ember / torch) per PyTorch, then the
means, then derived figures (GFLOP/s, bandwidth). For the training steps every single step is
timed too: the mean step against the median step (issue 3: mean <= 1.2x median) and the
slowest step, for Ember and each PyTorch; with --baseline, this build over the baseline per
repetition.
"""
import glob
import os
import signal
import statistics
import time
import subprocess
import sys

WORKLOADS = ["sgemm_1024", "sgemm_2048", "bf16_mm_2048", "add_16M", "memcpy_64MB", "add_1elem"]
TRAIN = ["train_mlp_b128", "train_cnn_b64", "train_cnn_b64_blocked", "train_cnn_b64_bf16",
         "train_lstm_h256", "train_transformer_b32"]
EXTRA_TRAIN = ["train_gru_h256"]  # run only when named
ALL_TRAIN = TRAIN + EXTRA_TRAIN
SETTLE_S = float(os.environ.get("EMBER_BENCH_SETTLE_S", "0.2"))  # pause before each timed batch
WARM_S = float(os.environ.get("EMBER_BENCH_WARM_S", "0.3"))  # untimed work after the pause
# Every worker but the one whose turn it is stays stopped (SIGSTOP) so that nothing another
# worker left running (spinning OpenMP or OpenBLAS threads, a garbage collection) can take a
# core from the timed one; EMBER_BENCH_STOP_OTHERS=0 leaves them running (idle).
STOP_OTHERS = os.environ.get("EMBER_BENCH_STOP_OTHERS", "1") != "0"
RAW = ["raw_onednn_1024", "raw_openblas_1024"]
# OpenBLAS's SkylakeX kernels, where the CPU has AVX-512 (elsewhere they raise SIGILL)
SKYLAKEX = ({"OPENBLAS_CORETYPE": "SkylakeX"}
            if any(l.startswith("flags") and " avx512f" in l for l in open("/proc/cpuinfo"))
            else {})

TORCH_WORKER = r'''
import sys, time, os
import torch
import torch.nn as nn
import torch.nn.functional as F
if os.environ.get("EMBER_BENCH_TORCH_THREADS"):
    torch.set_num_threads(int(os.environ["EMBER_BENCH_TORCH_THREADS"]))
torch.manual_seed(0)
# --cpu-time: the process's CPU time (all threads), bench/train_step --cpu-time's clock
clock = time.process_time if os.environ.get("EMBER_BENCH_CPU_TIME") else time.perf_counter
def mm(n, dt):
    a = torch.rand(n, n, dtype=dt) * 2 - 1; b = torch.rand(n, n, dtype=dt) * 2 - 1
    return lambda: torch.matmul(a, b)
def add(n):
    a = torch.rand(n); b = torch.rand(n)
    return lambda: torch.add(a, b)
def cp(n):
    a = torch.rand(n); b = torch.empty(n)
    return lambda: b.copy_(a)
def train(cnn, batch, amp=False):
    if cnn:
        net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
        x = torch.rand(batch, 1, 28, 28)
        if os.environ.get("EMBER_BENCH_TORCH_CHANNELS_LAST"):  # the channels-last config
            net = net.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
    else:
        net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                            nn.Linear(256, 10))
        x = torch.rand(batch, 784)
    y = torch.randint(0, 10, (batch,))
    opt = torch.optim.Adam(net.parameters())
    def step():
        opt.zero_grad(set_to_none=True)
        if amp:  # issue 21: forward and loss under bf16 autocast, backward outside
            with torch.autocast("cpu", torch.bfloat16):
                loss = F.cross_entropy(net(x), y)
        else:
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    return step
def train_transformer(batch):
    layer = nn.TransformerEncoderLayer(256, 4, 1024, 0.1, batch_first=True)
    net = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    net.train()
    x = torch.rand(batch, 128, 256); y = torch.randn(batch, 128, 256)
    opt = torch.optim.Adam(net.parameters())
    def step():
        opt.zero_grad(set_to_none=True)
        F.mse_loss(net(x), y).backward()
        opt.step()
    return step
def train_rnn(cls, batch):
    rnn, head = cls(256, 256), nn.Linear(256, 64)
    x = torch.rand(64, batch, 256)
    y = torch.randint(0, 64, (64 * batch,))
    opt = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()))
    net = lambda x: head(rnn(x)[0].reshape(-1, 256))
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
        "train_cnn_b64_blocked": (lambda: train(True, 64), 3),
        "train_cnn_b64_bf16": (lambda: train(True, 64, True), 3),
        "train_lstm_h256": (lambda: train_rnn(nn.LSTM, 32), 3),
        "train_gru_h256": (lambda: train_rnn(nn.GRU, 32), 3),
        "train_transformer_b32": (lambda: train_transformer(32), 2)}
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
    t0 = clock()
    for _ in range(iters):
        t = clock(); f(); each.append((clock() - t) * 1e3)
    total = (clock() - t0) * 1e3 / iters
    steps = " ".join("%.6f" % e for e in each) if name.startswith("train") else ""
    print(name, "%.6f" % total, steps, flush=True)
'''


class Worker:
    def __init__(self, label, argv, env):
        self.label = label
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env=env, text=True, bufsize=1)
        self.banner = None
        self.stopped = False

    def ask(self, name):
        """ms per op (or step), and the single steps' times when the worker gives them."""
        self.send(name)
        return self.answer()

    def send(self, name):
        self.p.stdin.write(name + "\n")
        self.p.stdin.flush()

    def answer(self):
        """The reply to the oldest request sent and not yet answered."""
        out = self.p.stdout.readline().split()
        if len(out) < 2 or out[1] == "unknown":
            return None, []
        return float(out[1]), [float(x) for x in out[2:]]

    def stop(self):
        """Freeze every thread of the worker (SIGSTOP) until cont()."""
        if not self.stopped and self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGSTOP)
            self.stopped = True

    def cont(self):
        if self.stopped:
            os.kill(self.p.pid, signal.SIGCONT)
            self.stopped = False

    def close(self):
        self.cont()
        self.p.stdin.close()
        self.p.wait()


def find_program(name, build=None):
    here = os.path.dirname(os.path.abspath(__file__))
    places = [os.path.join(build, "bench", name)] if build else ["bench/" + name,
                                                                  os.path.join(here, name)]
    for c in places:
        if os.access(c, os.X_OK):
            return c
    sys.exit("compare-pytorch: %s not found; run `make` and start from the build tree"
             % (places[0] if build else "bench/" + name))


TORCH_CONFIGS = ("as-is", "passive", "threads", "channels-last")
CNN = ("train_cnn_b64", "train_cnn_b64_bf16", "train_cnn_b64_blocked")  # the channels-last
# configuration's workloads (train_cnn_b64_blocked: Ember's nChw16c activations; PyTorch's
# side is train_cnn_b64's model)


def torch_pythons():
    """The interpreters named by PYTHON (colon-separated; 'none': no PyTorch)."""
    default = "/usr/bin/python3"
    newest = os.path.expanduser("~/torchenv/bin/python")
    if os.access(newest, os.X_OK):
        default += ":" + newest
    spec = os.environ.get("PYTHON", default)
    if spec in ("", "none"):
        return []
    return [p for p in spec.split(":") if p]


def run_fma_peak(fma):
    """Best GFLOP/s of one bench/fma_peak invocation (None when it failed)."""
    r = subprocess.run([fma], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] == "fma_peak":
            return float(f[1])
    return None


def proc_sched_ms(pid):
    """(CPU ms, ms waiting on a run queue) so far, summed over every thread of process pid
    (/proc/PID/task/*/schedstat: time on a CPU, time runnable but waiting for one)."""
    cpu = wait = 0
    for f in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            with open(f) as fh:
                v = fh.read().split()
            cpu, wait = cpu + int(v[0]), wait + int(v[1])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return cpu / 1e6, wait / 1e6


TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def machine_ms():
    """(busy, steal): CPU time of all CPUs so far in user, nice, system, irq and softirq, and
    the time the hypervisor gave them to another guest (/proc/stat), in ms."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6]) * TICK_MS, f[7] * TICK_MS


def parse_args(args):
    """(baseline, cpu_time, threads, reps, chosen workloads) from the command line."""
    baseline, cpu_time, threads = None, False, None
    while args and args[0].startswith("-"):
        opt, eq, val = args.pop(0).partition("=")
        if opt in ("-h", "--help"):
            print(__doc__.strip())
            sys.exit(0)
        if opt == "--cpu-time" and not eq:
            cpu_time = True
            continue
        if opt not in ("--baseline", "--threads"):
            sys.exit("compare-pytorch: unknown option %s (--baseline BUILD_DIR, --cpu-time, "
                     "--threads N; --help)" % opt)
        if not eq:
            if not args:
                sys.exit("compare-pytorch: %s needs %s" % (
                    opt, "a build directory" if opt == "--baseline" else "a thread count"))
            val = args.pop(0)
        if opt == "--baseline":
            baseline = val
        elif not val.isdigit() or int(val) < 1:
            sys.exit("compare-pytorch: --threads %s: not a positive thread count" % val)
        else:
            threads = val
    if args and not args[0].isdigit():
        if args[0] not in WORKLOADS + ALL_TRAIN:
            sys.exit("compare-pytorch: %s: neither a repetition count nor a workload" % args[0])
        args.insert(0, "7")
    reps = int(args[0]) if args else 7
    if reps < 1:
        sys.exit("compare-pytorch: %d repetitions: at least 1" % reps)
    chosen = args[1:] or (TRAIN if cpu_time else WORKLOADS + TRAIN)
    unknown = [n for n in chosen if n not in WORKLOADS + ALL_TRAIN]
    if unknown:
        sys.exit("compare-pytorch: unknown workload %s; the workloads: %s"
                 % (", ".join(unknown), " ".join(WORKLOADS + ALL_TRAIN)))
    if cpu_time and any(n not in ALL_TRAIN for n in chosen):
        sys.exit("compare-pytorch: --cpu-time times the training steps only, not %s"
                 % ", ".join(n for n in chosen if n not in ALL_TRAIN))
    return baseline, cpu_time, threads, reps, chosen


def main():
    baseline, cpu_time, threads, reps, chosen = parse_args(sys.argv[1:])
    names = [n for n in WORKLOADS + ALL_TRAIN if n in chosen]
    steps = [n for n in names if n in ALL_TRAIN]
    raw = RAW if "sgemm_1024" in names else []
    base = dict(os.environ)
    if threads:
        base["EMBER_NUM_THREADS"] = threads
    base.setdefault("EMBER_NUM_THREADS", "2")
    nthreads = base["EMBER_NUM_THREADS"]
    passive = dict(base, OMP_WAIT_POLICY="passive")
    workers = {}
    if any(n not in ALL_TRAIN for n in names):
        compare = find_program("compare")
        describe = subprocess.run([compare, "--describe"], env=base, capture_output=True,
                                  text=True)
        print(describe.stdout.strip())
        workers["ember"] = Worker("ember", [compare], base)
        workers["ember-sx"] = Worker("ember-sx", [compare],
                                     dict(base, **SKYLAKEX))
    fma = floor = None
    if steps:
        flags = ["--cpu-time"] if cpu_time else []
        train_step = find_program("train_step")
        workers["ember-train"] = Worker("ember-train", [train_step] + flags, passive)
        workers["ember-train-as-is"] = Worker("ember-train-as-is", [train_step] + flags, base)
        if baseline:
            workers["ember-base"] = Worker("ember-base",
                                           [find_program("train_step", baseline)] + flags,
                                           passive)
    if steps:  # the ceiling is a wall-time figure; the floor is timed on the steps' clock
        fma = None if cpu_time else find_program("fma_peak")
        here = os.path.dirname(os.path.abspath(__file__))
        floor = next((c for c in ("bench/step_floor", os.path.join(here, "step_floor"))
                      if os.access(c, os.X_OK)), None)
    configs = [c for c in os.environ.get("EMBER_BENCH_TORCH_CONFIGS",
                                         ",".join(TORCH_CONFIGS)).split(",") if c]
    bad = [c for c in configs if c not in TORCH_CONFIGS]
    if bad:
        sys.exit("compare-pytorch: EMBER_BENCH_TORCH_CONFIGS: unknown %s (known: %s)"
                 % (",".join(bad), ",".join(TORCH_CONFIGS)))
    torches = []  # [(tag, python)] in PYTHON's order
    for python in torch_pythons():
        probe = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            print("(PyTorch is not installed for %s: left out)" % python)
            continue
        tag = "torch" + probe.stdout.strip().split("+")[0]
        if any(t == tag for t, _ in torches):
            tag += "#%d" % (len(torches) + 1)
        torches.append((tag, python))
        env = dict(os.environ, EMBER_BENCH_CPU_TIME="1") if cpu_time else dict(os.environ)
        envs = {"as-is": env,
                "passive": dict(env, **SKYLAKEX,
                                OMP_WAIT_POLICY="passive",
                                EMBER_BENCH_TORCH_THREADS=nthreads),
                "threads": dict(env, EMBER_BENCH_TORCH_THREADS=nthreads),
                "channels-last": dict(env, EMBER_BENCH_TORCH_THREADS=nthreads,
                                      EMBER_BENCH_TORCH_CHANNELS_LAST="1")}
        for c in configs:
            label = "%s/%s" % (tag, c)
            w = Worker(label, [python, "-c", TORCH_WORKER], envs[c])
            w.banner = w.p.stdout.readline().strip()
            print("%s (%s): %s" % (label, python, w.banner))
            workers[label] = w
    if not torches:
        print("(no PyTorch: Ember's figures only)")

    times = {}  # (worker, workload) -> [ms]; the training worker's figures count as ember's
    single = {}  # (worker, workload) -> [ms of each single training step]
    # (worker, workload) -> [(its CPU ms, its threads' ms waiting for a CPU, the other workers'
    # CPU ms, other processes' CPU ms, steal ms) during each timed batch]
    interference = {}
    peaks = []  # best GFLOP/s of each repetition's fma_peak
    order = list(workers.items()) + ([("fma_peak", None)] if fma else [])
    started = time.perf_counter()
    loads = [os.getloadavg()[0]]  # the 1-minute load average at each repetition's start, the end
    if STOP_OTHERS:
        for w in workers.values():
            w.stop()
    try:
        for rep in range(reps):
            if rep:
                print("(repetition %d of %d, %.0f s so far)" % (rep + 1, reps,
                                                              time.perf_counter() - started),
                      file=sys.stderr, flush=True)
            # Each repetition starts with the next worker: a worker that runs right after another
            # can pay for what that one left behind (threads still winding down, caches), and a
            # fixed order would always charge it to the same one.
            turn = order[rep % len(order):] + order[:rep % len(order)]
            if rep:
                loads.append(os.getloadavg()[0])
            for label, w in turn:
                if w is None:  # the FMA ceiling, once per repetition, in its turn
                    time.sleep(SETTLE_S)
                    p = run_fma_peak(fma)
                    if p:
                        peaks.append(p)
            for name in names + raw:
                for label, w in turn:
                    if w is None:
                        continue
                    if name in RAW and not label.startswith("ember"):
                        continue
                    if label == "ember-sx" and name != "raw_openblas_1024":
                        continue
                    if label.endswith("/channels-last") and name not in CNN:
                        continue  # the threads configuration for every other workload
                    is_train_worker = label.startswith("ember-train") or label == "ember-base"
                    if label.startswith("ember") and is_train_worker != (name in ALL_TRAIN):
                        continue
                    # This worker's turn: it alone runs (the others stopped), after a pause in
                    # which what it left running at the end of its last turn winds down (OpenBLAS
                    # threads spin ~0.1 s after a call, libgomp's ~3 ms after a region) and, with
                    # EMBER_BENCH_STOP_OTHERS=0, the previous worker's.
                    w.cont()
                    others = [x.p.pid for x in workers.values() if x is not w]
                    turn0 = sum(proc_sched_ms(p)[0] for p in others)
                    time.sleep(SETTLE_S)
                    # Then untimed batches of the same workload for at least WARM_S (one at least):
                    # on this VM a core that was idle runs slow for the next 50-100 ms, and a fixed
                    # number of untimed batches would leave more of that in the faster worker's
                    # timed batch than in the slower one's.
                    # The timed request goes out with the last untimed one (the one that will end
                    # past WARM_S, judged by the previous one's length), so that the worker runs it
                    # straight after, with no pause for the driver in between.

                    def snapshot():  # read while the worker waits for its next request
                        return (proc_sched_ms(w.p.pid), sum(proc_sched_ms(p)[0] for p in others),
                                machine_ms(), time.process_time() * 1e3, time.perf_counter())
                    # (not in --cpu-time's first repetition: its check below needs the timed
                    # batch's CPU time alone)
                    check = cpu_time and rep == 0
                    t0, last = time.perf_counter(), 0.0
                    while True:
                        t1 = time.perf_counter()
                        if t1 - t0 >= WARM_S:  # the previous batch ended past it: timed next
                            s0 = snapshot()
                            w.send(name)
                            break
                        if t1 - t0 + last >= WARM_S and not check:  # the last untimed batch
                            s0 = snapshot()
                            w.send(name), w.send(name)
                            w.answer()
                            break
                        w.ask(name)
                        last = time.perf_counter() - t1
                    t, each = w.answer()
                    s1 = snapshot()
                    if STOP_OTHERS:
                        w.stop()
                    # From s0 to s1 (the timed batch, and the untimed one sent with it): the
                    # worker's CPU ms and its threads' ms waiting for a CPU, the other workers' CPU
                    # ms, every other process's (/proc/stat's 10 ms ticks, less the driver's own),
                    # the hypervisor's steal, the wall ms.
                    cpu_w, wait_w = s1[0][0] - s0[0][0], s1[0][1] - s0[0][1]
                    oth = s1[1] - s0[1]
                    outside = max(0.0, (s1[2][0] - s0[2][0]) - cpu_w - oth - (s1[3] - s0[3]))
                    interference.setdefault((label, name), []).append(
                        (cpu_w, wait_w, oth, outside, s1[2][1] - s0[2][1], (s1[4] - s0[4]) * 1e3,
                         s0[1] - turn0))
                    c0 = s0[0][0] if check else None
                    if t is not None and c0 is not None:
                        # what the worker reports against its threads' CPU time from outside
                        # (which also holds the request's reading and printing: ~0)
                        told, seen = t * max(len(each), 1), s1[0][0] - c0
                        if abs(told - seen) > 0.25 * seen + 2.0:
                            sys.exit("compare-pytorch: --cpu-time: %s (%s) reported %.1f ms for a "
                                     "batch of %s whose threads ran %.1f ms (/proc): it does not "
                                     "time CPU (a bench/train_step older than its --cpu-time?)"
                                     % (label, " ".join(w.p.args[:1]), told, name, seen))
                    if t is not None:
                        key = "ember" if label == "ember-train" else label
                        times.setdefault((key, name), []).append(t)
                        single.setdefault((key, name), []).extend(each)
    finally:
        for w in workers.values():
            w.cont()
    loads.append(os.getloadavg()[0])
    for w in workers.values():
        w.close()

    print("(%d repetitions in %.0f s)" % (reps, time.perf_counter() - started), file=sys.stderr,
          flush=True)
    floors = {}  # workload -> (floor ms, GFLOP)
    floor_text = ""
    if fma:  # once more before the floor, which is measured next
        p = run_fma_peak(fma)
        if p:
            peaks.append(p)
    if steps and floor:
        env = dict(passive, OMP_NUM_THREADS=nthreads)
        known = subprocess.run([floor, "--list"], capture_output=True, text=True).stdout.split()
        r = subprocess.run([floor] + (["--cpu-time"] if cpu_time else []) +
                           [n for n in steps if n in known], env=env,
                           capture_output=True, text=True)
        floor_text = r.stdout
        for line in r.stdout.splitlines():
            f = line.split()
            if len(f) == 4 and f[0] == "floor":
                floors[f[1]] = (float(f[2]), float(f[3]))
        if r.returncode != 0:
            print("(bench/step_floor failed: %s)" % r.stderr.strip())
    elif steps:
        print("(bench/step_floor is not built here (no oneDNN): no floors)")

    nan = float("nan")
    med = lambda l, n: statistics.median(times[(l, n)]) if (l, n) in times else nan
    mean = lambda l, n: statistics.fmean(times[(l, n)]) if (l, n) in times else nan

    def best(tag, n):
        """The configuration of PyTorch `tag` with the lowest median for n, and its label."""
        cands = [("%s/%s" % (tag, c), c) for c in configs if ("%s/%s" % (tag, c), n) in times]
        if not cands:
            return None, None
        label, c = min(cands, key=lambda lc: med(lc[0], n))
        return label, c

    if cpu_time:
        print("\n%d repetitions, interleaved; CPU ms per step (medians; the process's CPU "
              "time, all threads; EMBER_NUM_THREADS=%s); ratio = ember / torch, each PyTorch "
              "in its least-CPU configuration for that workload (named)" % (reps, nthreads))
    else:
        print("\n%d repetitions, interleaved; ms per op (medians); ratio = ember / torch, each "
              "PyTorch in its fastest configuration for that workload (named)" % reps)
    hdr = "%-22s %10s %10s" % ("name", "ember_ms", "ember_mean")
    for tag, _ in torches:
        hdr += "   %10s %-13s %6s" % (tag, "config", "ratio")
    print(hdr)
    for n in names:
        row = "%-22s %10.4f %10.4f" % (n, med("ember", n), mean("ember", n))
        for tag, _ in torches:
            label, c = best(tag, n)
            t = med(label, n) if label else nan
            row += "   %10.4f %-13s %6.2f" % (t, c or "-", med("ember", n) / t)
        print(row)
    if torches:
        print("every configuration's median (ms):")
        for n in names:
            print("  %-22s " % n + "  ".join(
                "%s/%s %.4f" % (tag, c, med("%s/%s" % (tag, c), n))
                for tag, _ in torches for c in configs
                if ("%s/%s" % (tag, c), n) in times))

    if steps and cpu_time:
        print("\ntraining steps, CPU ms per step; floor = bench/step_floor --cpu-time's sum of "
              "the step's GEMMs and convolutions, each timed alone in CPU ms;\nmean/med = mean "
              "single step over the median single step")
        hdr = "%-22s %9s %9s %7s %8s" % ("name", "floor_ms", "ember_ms", "/floor", "mean/med")
        if baseline:
            hdr += " %9s %6s" % ("base_ms", "/base")
        for tag, _ in torches:
            hdr += "  %10s %-13s %6s %8s" % (tag, "config", "ratio", "mean/med")
        print(hdr)
        for n in steps:
            e = med("ember", n)
            s = single.get(("ember", n), [])
            fl = floors.get(n, (nan, nan))[0]
            row = "%-22s %9.3f %9.3f %7.2f %8.2f" % (
                n, fl, e, e / fl, statistics.fmean(s) / statistics.median(s) if s else nan)
            if baseline:
                b = med("ember-base", n)
                row += " %9.3f %6.2f" % (b, e / b)
            for tag, _ in torches:
                label, c = best(tag, n)
                t = med(label, n) if label else nan
                ts = single.get((label, n), [])
                tmm = statistics.fmean(ts) / statistics.median(ts) if ts else nan
                row += "  %10.3f %-13s %6.2f %8.2f" % (t, c or "-", e / t, tmm)
            print(row)
        print()
    elif steps:
        peak = max(peaks) if peaks else nan
        print("\nFMA ceiling: %.1f GFLOP/s (best of %d bench/fma_peak invocations in this run; "
              "their median %.1f)" % (peak, len(peaks), statistics.median(peaks) if peaks else nan))
        print("training steps: GFLOP = the step's GEMMs and convolutions (2 per multiply-add); "
              "floor = bench/step_floor's sum of them timed alone;\n%FMA = GFLOP / median step "
              "/ FMA ceiling; mean/med = mean single step over the median single step")
        hdr = "%-22s %7s %9s %6s %9s %8s %7s %6s" % ("name", "GFLOP", "floor_ms", "%FMA",
                                                     "ember_ms", "mean/med", "/floor", "%FMA")
        if baseline:
            hdr += " %9s %6s" % ("base_ms", "/base")
        for tag, _ in torches:
            hdr += "  %10s %-13s %6s %6s %8s" % (tag, "config", "ratio", "%FMA", "mean/med")
        print(hdr)
        for n in steps:
            fl, g = floors.get(n, (nan, nan))
            frac = lambda ms: 100.0 * g / (ms * 1e-3) / peak
            e = med("ember", n)
            s = single.get(("ember", n), [])
            mm = statistics.fmean(s) / statistics.median(s) if s else nan
            row = "%-22s %7.3f %9.3f %6.1f %9.3f %8.2f %7.2f %6.1f" % (
                n, g, fl, frac(fl), e, mm, e / fl, frac(e))
            if baseline:
                b = med("ember-base", n)
                row += " %9.3f %6.2f" % (b, e / b)
            for tag, _ in torches:
                label, c = best(tag, n)
                t = med(label, n) if label else nan
                ts = single.get((label, n), [])
                tmm = statistics.fmean(ts) / statistics.median(ts) if ts else nan
                row += "  %10.3f %-13s %6.2f %6.1f %8.2f" % (t, c or "-", e / t, frac(t), tmm)
            print(row)
        if any(n.endswith("_bf16") for n in steps):
            print("(the bf16 rows' %FMA is against the f32 FMA ceiling: bf16 products run on "
                  "AVX512_BF16 or AMX where the CPU has them, above it)")
        over = [n for n in steps if n in floors and not n.endswith("_bf16") and
                100.0 * floors[n][1] / (floors[n][0] * 1e-3) / peak > 100.0]
        if over:
            print("(%s: the floor runs above the FMA ceiling measured in this run: the ceiling "
                  "was measured while other processes held the cores; rerun on quiet cores)"
                  % ", ".join(over))
        print()
    for n in steps:
        for tag, _ in torches:
            label, c = best(tag, n)
            r = [e / t for e, t in zip(times.get(("ember", n), []), times.get((label, n), []))]
            if r:
                print("%s: Ember / %s (%s) per repetition: median %.2f, mean %.2f, range "
                      "%.2f-%.2f" % (n, tag, c, statistics.median(r), statistics.fmean(r),
                                     min(r), max(r)))
        r = [e / b for e, b in zip(times.get(("ember", n), []), times.get(("ember-base", n), []))]
        if r:
            print("%s: Ember / baseline (%s) per repetition: median %.2f, mean %.2f, range "
                  "%.2f-%.2f" % (n, baseline, statistics.median(r), statistics.fmean(r),
                                 min(r), max(r)))
        print("%s: Ember with OMP_WAIT_POLICY as it is: median %.4f ms" % (
            n, med("ember-train-as-is", n)))
        for label in ["ember"] + ["%s/%s" % (tag, best(tag, n)[1]) for tag, _ in torches
                                  if best(tag, n)[0]]:
            s = single.get((label, n), [])
            if s:
                m, md = statistics.fmean(s), statistics.median(s)
                print("%s: %s single steps (%d): median %.4f ms, mean %.4f ms = %.2fx the "
                      "median, slowest %.4f ms" % (n, label, len(s), md, m, m / md, max(s)))
    if interference:
        print("\nwhile each worker ran its timed batch (and the untimed one sent with it), per "
              "repetition, medians (ms):\n  cpu = its threads' CPU time, wait = their time "
              "runnable but waiting for a CPU, workers = the other workers' CPU time (idle ones "
              "should be ~0; max: the most in one repetition), outside = every other process "
              "(/proc/stat's %.0f ms ticks), steal = the hypervisor's;\n  before = the other "
              "workers' CPU time earlier in the turn (the pause and the untimed batches before)"
              % TICK_MS)
        print("  (other workers %s during each turn; 1-minute load average %s at the "
              "repetitions' starts and the end)" % (
                  "stopped (SIGSTOP)" if STOP_OTHERS else "idle, not stopped",
                  " ".join("%.1f" % x for x in loads)))
        print("  %-22s %-28s %8s %8s %8s %8s %8s %8s %8s %8s" % (
            "name", "worker", "wall", "cpu", "wait", "workers", "(max)", "outside", "steal",
            "before"))
        for n in names + raw:
            for label in workers:
                v = interference.get((label, n))
                if v:
                    m = [statistics.median(x[i] for x in v) for i in range(7)]
                    print("  %-22s %-28s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f"
                          % (n, label, m[5], m[0], m[1], m[2], max(x[2] for x in v), m[3],
                             m[4], m[6]))
    if floor_text:
        print("\nbench/step_floor%s (after the repetitions, OMP_WAIT_POLICY=passive):"
              % (" --cpu-time" if cpu_time else ""))
        print(floor_text.rstrip())
    if "add_1elem" in names:  # the ms column rounds it away
        print("tiny op (1-element em_add + release): %.3f us; %s" % (
            med("ember", "add_1elem") * 1e3, "; ".join(
                "%s torch.add: %.3f us" % (tag, med(best(tag, "add_1elem")[0], "add_1elem") * 1e3)
                for tag, _ in torches if best(tag, "add_1elem")[0])))
    if not all(n in names for n in WORKLOADS):
        return
    print("\nraw libraries, 1024^3 f32 (medians): oneDNN %.3f ms, OpenBLAS default %.3f ms, "
          "OpenBLAS %s %.3f ms" % (med("ember", "raw_onednn_1024"),
                                   med("ember", "raw_openblas_1024"),
                                   "SkylakeX" if SKYLAKEX else "again (no AVX-512)",
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

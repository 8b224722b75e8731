#!/usr/bin/env python3
"""gpu_torch.py — PyTorch's side of issue 20's speed rows (tests/gpu/run.sh bench), run with the
GPU machine's own python3 (the one that holds PyTorch with CUDA):

    python3 bench/gpu_torch.py [--quick] [--device cuda]

The same workloads, shapes and timing as bench/gpu_step.c, in PyTorch eager mode:
  mlp          MLP 784-512-256-10 (Linear, ReLU, Linear, ReLU, Linear), batch 128:
               forward, F.cross_entropy (mean), backward, torch.optim.Adam (defaults: lr 1e-3,
               betas 0.9/0.999, eps 1e-8; PyTorch picks its foreach implementation on CUDA),
               zero_grad(set_to_none=True)
  cnn          bench/gpu_step.c's CNN (Conv2d 1->32 3x3 pad 1, ReLU, MaxPool2d 2, Conv2d 32->64,
               ReLU, MaxPool2d 2, Flatten, Linear 3136->128, ReLU, Linear 128->10), batch 64 of
               1x28x28, the same step with Adam (cuDNN's default choices: benchmark off,
               convolutions in TF32 as PyTorch's default allows, unless --no-tf32)
  mlp_sgd, cnn_sgd   the same steps with torch.optim.SGD(lr=0.01, momentum=0.9)
  mlp_graph, cnn_graph   the SGD steps captured into one torch.cuda.CUDAGraph (the documented
               whole-network capture: 3 warm-up steps on a side stream, then capture of
               zero_grad + forward + backward + step) and replayed (CUDA only)
  mlp_adam_graph, cnn_adam_graph   the Adam steps (defaults) captured and replayed the same
               way, with torch.optim.Adam(capturable=True) (CUDA only)
  gemm_bf16    torch.matmul of two bf16 (8192, 8192) tensors (1024 with --quick)
  linear_MxKxN F.linear forward and backward (x, weight and bias require grad; backward with a
               fixed grad_out), grads set to None after each call
  add          a + b of two contiguous f32 tensors of 256M elements (3 GiB moved)
  copy         dst.copy_(src) of 1 GiB device to device (GBps counts read + write)
float32 matmuls without TF32 (torch.backends.cuda.matmul.allow_tf32 = False, PyTorch's default,
set explicitly). Each number: the median of 7 batches (3 with --quick) of N calls after warm-up,
each batch ended by torch.cuda.synchronize(), timed on the host clock.
Output lines: "torch WORKLOAD ms=... [TFLOPs=...|GBps=...]", after a "torch version=..." line.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


QUICK = False


def timed(fn, warm, n, reps, sync):
    if QUICK:  # a rehearsal: a tenth of the calls
        warm, n = max(1, warm // 10), max(2, n // 10)
    for _ in range(warm):
        fn()
    sync()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        t.append((time.perf_counter() - t0) * 1e3 / n)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-tf32", action="store_true",
                    help="cuDNN convolutions in full f32 (Ember's default) instead of PyTorch's TF32")
    a = ap.parse_args()
    global QUICK
    QUICK = a.quick
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_torch: torch.cuda.is_available() is False")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.no_tf32:
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    reps = 3 if a.quick else 7
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"torch version={torch.__version__} cuda={torch.version.cuda} "
          f"cudnn={torch.backends.cudnn.version()} python={sys.version.split()[0]} device=\"{name}\"",
          flush=True)

    # mlp
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters())
    x = torch.rand(128, 784, device=dev)
    y = (torch.rand(128, device=dev) * 10).long()

    def mlp_step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    print(f"torch mlp ms={timed(mlp_step, 20, 100, reps, sync):.6f}", flush=True)

    # cnn, and the SGD steps eager and from a CUDA graph
    def net(cnn):
        torch.manual_seed(0)
        if cnn:
            m = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Flatten(), torch.nn.Linear(3136, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10)).to(dev)
            xx = torch.rand(64, 1, 28, 28, device=dev)
            yy = (torch.rand(64, device=dev) * 10).long()
        else:
            m = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                    torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
            xx = torch.rand(128, 784, device=dev)
            yy = (torch.rand(128, device=dev) * 10).long()
        return m, xx, yy

    def stepper(m, o, xx, yy):
        def step():
            o.zero_grad(set_to_none=True)
            F.cross_entropy(m(xx), yy).backward()
            o.step()
        return step

    for cnn in (False, True):
        warm, calls = (5, 20) if cnn else (20, 100)
        kind = "cnn" if cnn else "mlp"
        if cnn:
            m, xx, yy = net(True)
            print(f"torch cnn ms={timed(stepper(m, torch.optim.Adam(m.parameters()), xx, yy), warm, calls, reps, sync):.6f}",
                  flush=True)
        m, xx, yy = net(cnn)
        step = stepper(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), xx, yy)
        print(f"torch {kind}_sgd ms={timed(step, warm, calls, reps, sync):.6f}", flush=True)
        for adam in (False, True) if dev.type == "cuda" else ():
            m, xx, yy = net(cnn)
            o = (torch.optim.Adam(m.parameters(), capturable=True) if adam
                 else torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
            step = stepper(m, o, xx, yy)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            name = f"{kind}_adam_graph" if adam else f"{kind}_graph"
            print(f"torch {name} ms={timed(graph.replay, warm, calls, reps, sync):.6f}", flush=True)
            del graph

    # bf16 GEMM
    nn_ = 1024 if a.quick else 8192
    ga = (torch.rand(nn_, nn_, device=dev) * 2 - 1).bfloat16()
    gb = (torch.rand(nn_, nn_, device=dev) * 2 - 1).bfloat16()
    ms = timed(lambda: torch.matmul(ga, gb), 3, 20, reps, sync)
    print(f"torch gemm_bf16_{nn_} ms={ms:.6f} TFLOPs={2.0 * nn_ ** 3 / (ms * 1e-3) / 1e12:.2f}", flush=True)
    del ga, gb

    # linear
    big = 1024 if a.quick else 8192
    for m, k, n in ((128, 784, 512), (128, 512, 256), (128, 256, 10), (big, big, big)):
        xx = torch.rand(m, k, device=dev, requires_grad=True)
        bound = 1 / k ** 0.5
        w = ((torch.rand(n, k, device=dev) * 2 - 1) * bound).requires_grad_()
        b = ((torch.rand(n, device=dev) * 2 - 1) * bound).requires_grad_()
        g = torch.rand(m, n, device=dev) * 2 - 1

        def lin_step():
            F.linear(xx, w, b).backward(g)
            xx.grad = None
            w.grad = None
            b.grad = None

        flop = 3 * 2.0 * m * k * n
        calls = 5 if flop > 1e10 else 200
        ms = timed(lin_step, 20 if calls > 5 else 2, calls, reps, sync)
        print(f"torch linear_{m}x{k}x{n} ms={ms:.6f} TFLOPs={flop / (ms * 1e-3) / 1e12:.2f}", flush=True)
        del xx, w, b, g

    # add and copy
    numel = (1 << 24) if a.quick else (1 << 28)
    p = torch.rand(numel, device=dev) * 2 - 1
    q = torch.rand(numel, device=dev) * 2 - 1
    ms = timed(lambda: p + q, 3, 20, reps, sync)
    print(f"torch add_{numel >> 20}M ms={ms:.6f} GBps={3 * 4 * numel / (ms * 1e-3) / 1e9:.1f}", flush=True)
    dst = torch.empty_like(p)
    ms = timed(lambda: dst.copy_(p), 3, 20, reps, sync)
    print(f"torch copy_{numel >> 20}M ms={ms:.6f} GBps={2 * 4 * numel / (ms * 1e-3) / 1e9:.1f}", flush=True)


if __name__ == "__main__":
    main()

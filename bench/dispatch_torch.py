#!/usr/bin/env python3
"""PyTorch's per-op overhead on 1-element float32 CPU tensors, for bench/run.sh.

The same table format as bench/dispatch (median of 5 repeats, ns per call). torch is called
from Python, so its figures include the interpreter's call overhead: that is the cost a
PyTorch user pays per op, which is the comparison that matters.

    /usr/bin/python3 bench/dispatch_torch.py [iterations]
"""
import sys
import timeit

import torch

REPEATS = 5


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 500000
    torch.set_num_threads(1)
    env = {"torch": torch, "a": torch.ones(1), "b": torch.ones(1), "c": torch.empty(1)}
    rows = [("torch_add_out", "torch.add(a, b, out=c)"), ("torch_add", "torch.add(a, b)")]
    print(f"torch {torch.__version__} — per-op overhead (median of {REPEATS} repeats), "
          f"threads: {torch.get_num_threads()}")
    print(f"{'name':<16} {'ns/call':>10} {'calls':>10}")
    for name, stmt in rows:
        timeit.timeit(stmt, globals=env, number=iters // 10 + 1)  # warm-up
        times = sorted(timeit.repeat(stmt, globals=env, number=iters, repeat=REPEATS))
        print(f"{name:<16} {times[REPEATS // 2] / iters * 1e9:10.1f} {iters:10d}")


if __name__ == "__main__":
    main()

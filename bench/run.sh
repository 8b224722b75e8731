#!/bin/sh
# Run the dispatch benchmark and, when PyTorch is installed, the same per-op measurement in
# PyTorch, both single-threaded, then print PyTorch's time over Ember's for the matching rows.
# Run from the build tree after `make`:   bench/run.sh [iterations]
# (in a separate build directory: cd build && ../bench/run.sh)
set -eu
here=$(dirname "$0")
bench=bench/dispatch
[ -x "$bench" ] || bench="$here/dispatch"
iters=${1:-2000000}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

EMBER_NUM_THREADS=1 "$bench" "$iters" | tee "$out"
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "(PyTorch is not installed for $python: no comparison)"
    exit 0
fi
echo
"$python" "$here/dispatch_torch.py" $((iters / 4)) | tee -a "$out"
echo
awk '
    $1 == "add_out_1elem" { e_out = $2 }  $1 == "add_1elem" { e_add = $2 }
    $1 == "torch_add_out" { t_out = $2 }  $1 == "torch_add" { t_add = $2 }
    END {
        printf "%-30s %10s %10s %12s\n", "comparison", "ember ns", "torch ns", "torch/ember"
        if (e_out && t_out)
            printf "%-30s %10.1f %10.1f %11.2fx\n", "add into preallocated (out=)", e_out, t_out, t_out / e_out
        if (e_add && t_add)
            printf "%-30s %10.1f %10.1f %11.2fx\n", "add allocating its result", e_add, t_add, t_add / e_add
    }' "$out"

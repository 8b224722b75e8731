#!/usr/bin/env bash
# tests/gpu/train-cpu.sh — the CPU side of `tests/gpu/run.sh train`, here:
#
#   tests/gpu/train-cpu.sh [--update] BUILD_DIR        (make gpu-train-check / gpu-train-ref)
#
# Makes the Fashion-MNIST subset the bundle carries (tests/gpu/config.sh) in
# BUILD_DIR/tests/gpu/fashion-mnist, trains the three recipes of tests/gpu/train_ref on the CPU and
# compares them with the committed reference tests/gpu/ref/{digits,fmnist,cnn}.{losses,preds}
# (the comparator run.sh applies to the GPU's runs); --update writes the reference instead.
# Needs /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist) or
# FASHION_MNIST.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/config.sh"
update=no
if [ "${1:-}" = --update ]; then update=yes; shift; fi
build=${1:?usage: train-cpu.sh [--update] BUILD_DIR}
[ -d "$build" ] || { echo "train-cpu.sh: no build directory $build" >&2; exit 2; }
build=$(cd "$build" && pwd) # the comparisons run in $out
tr=$build/tests/gpu/train_ref
[ -x "$tr" ] || { echo "train-cpu.sh: $tr is not built (make tests/gpu/train_ref)" >&2; exit 2; }
fm_src=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -d "$fm_src" ] || { echo "train-cpu.sh: no Fashion-MNIST in $fm_src (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
fm=$build/tests/gpu/fashion-mnist
"$here/fmnist_subset.py" "$fm_src" "$fm" "$FM_TRAIN" "$FM_TEST"
out=$build/tests/gpu/out
mkdir -p "$out"
rc=0
for r in digits fmnist cnn; do
    if [ $r = digits ]; then data=$here/../../data/digits; else data=$fm; fi
    "$tr" train $r --device cpu --data "$data" --out "$out/$r.cpu"
    if [ $update = yes ]; then
        cp "$out/$r.cpu.losses" "$here/ref/$r.losses"
        cp "$out/$r.cpu.preds" "$here/ref/$r.preds"
        echo "train-cpu.sh: wrote tests/gpu/ref/$r.losses and .preds"
    else
        (cd "$out" && "$tr" compare "$here/ref/$r" "$r.cpu") || rc=1
    fi
done
exit $rc

#!/bin/sh
# tests/test_graph_capture.sh — ember-train --graph-capture (trainer/loop.c) without a GPU, on
# the test device built with host kernels (tests/plugins/host/testdev_host.so: testdev.c with
# TD_HOST), which queues a small MLP's whole training step on its streams and records and
# replays graphs as CUDA does (a host read or copy during a capture breaks it):
#   - an MLP (Linear, ReLU, Linear, cross entropy) trained 3 epochs with SGD, momentum, weight
#     decay and a per-epoch StepLR, with --graph-capture and without, ends with the same weights
#     bit for bit and the same per-epoch train loss and accuracy in --metrics; the run with it
#     says it replayed steps from 3 captures (one per epoch's lr) and the epochs' last, shorter
#     batches ran as usual; a run with another seed ends elsewhere (the comparison can fail);
#   - the refusals, each naming the option and the reason: the CPU, Adam, a per-step schedule,
#     --clip-grad-norm, --accum-steps 2, amp fp16, a config's bad loop.graph_capture value, a step
#     that draws random numbers (dropout, caught at the capture), and an op without a kernel on
#     the device (its CPU fallback copies to the host, which breaks the capture).
# Run from the build directory (make check does).
set -u
srcdir=${srcdir:-.}
train=./trainer/ember-train
host=./tests/plugins/host/.libs/testdev_host.so
[ -x "$train" ] && [ -f "$host" ] || { echo "ember-train or $host not built"; exit 99; }
data=$(cd "$srcdir/data/digits" && pwd) || exit 99
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# cfg NAME LAYERS OPTIMIZER SCHEDULER: a config over the digits
cfg() {
    cat > "$tmp/$1.yaml" <<EOF
model:
  - Flatten
$2
data:
  class: mnist
  options: {path: $data}
  train: {split: train}
  validation: 150
loss: CrossEntropyLoss
optimizer: $3
scheduler: $4
EOF
}
mlp='  - Linear: {in_features: 64, out_features: 32}
  - ReLU
  - Linear: {in_features: 32, out_features: 10}'
sgd='{class: SGD, lr: 0.05, momentum: 0.9, weight_decay: 1.0e-4}'
step='{class: StepLR, interval: epoch, step_size: 1, gamma: 0.5}'
cfg mlp "$mlp" "$sgd" "$step"
# 1350 training samples in batches of 64: 21 full ones and one of 6 per epoch
run() { # run NAME EXTRA...: 3 epochs on testdev:0
    name=$1
    shift
    "$train" "$tmp/mlp.yaml" --plugin "$host" --device testdev:0 --epochs 3 --batch-size 64 \
        --quiet --save-weights "$tmp/$name.safetensors" --metrics "$tmp/$name.csv" "$@" \
        > "$tmp/$name.out" 2>&1
}
run eager || { bad "the eager run on testdev"; cat "$tmp/eager.out"; }
run graph --graph-capture || { bad "the --graph-capture run"; cat "$tmp/graph.out"; }
cmp -s "$tmp/eager.safetensors" "$tmp/graph.safetensors" ||
    bad "--graph-capture changed the weights after 3 epochs"
# the epoch rows' train loss and accuracy (the columns before the times)
cols() { head -1 "$1" | tr ',' '\n' | grep -n -x -e train_loss -e train_accuracy -e lr |
         cut -d: -f1 | paste -sd, -; }
c=$(cols "$tmp/eager.csv")
[ -n "$c" ] && [ "$c" = "$(cols "$tmp/graph.csv")" ] || bad "the metrics files' columns ($c)"
cut -d, -f"$c" "$tmp/eager.csv" > "$tmp/eager.cols"
cut -d, -f"$c" "$tmp/graph.csv" > "$tmp/graph.cols"
[ "$(wc -l < "$tmp/eager.cols")" -eq 4 ] || bad "3 epoch rows in the eager metrics"
cmp -s "$tmp/eager.cols" "$tmp/graph.cols" ||
    { bad "the epochs' train loss or accuracy differ with --graph-capture"; diff "$tmp/eager.cols" "$tmp/graph.cols"; }
# 3 epochs x 21 full batches, less the first 3 (eager warm-up); a capture per epoch's lr
grep -q -- "--graph-capture: 60 steps replayed from 3 captures" "$tmp/graph.out" ||
    { bad "the summary's replay count"; cat "$tmp/graph.out"; }
grep -q -- "--graph-capture" "$tmp/eager.out" && bad "the eager run mentions --graph-capture"
run seed1 --graph-capture --seed 1 || bad "the --seed 1 run"
cmp -s "$tmp/seed1.safetensors" "$tmp/graph.safetensors" &&
    bad "another seed gave the same weights: the comparison cannot fail"

"$train" --help 2>&1 | grep -q -- "--graph-capture          (loop.graph_capture)" ||
    bad "--help does not describe --graph-capture"

# refusals: exit 2 before training, naming the option and why
expect() { # expect RC NEEDLE CMD...
    want=$1 needle=$2
    shift 2
    out=$("$@" 2>&1)
    got=$?
    [ "$got" -eq "$want" ] || bad "exit $got (not $want): $*: $out"
    case $out in
    *"$needle"*) case $out in *"--graph-capture: --graph-capture"*) bad "said twice: $out" ;; esac ;;
    *) bad "no '$needle' in: $out" ;;
    esac
}
opt="--graph-capture (loop.graph_capture)"
expect 2 "$opt: device cpu cannot capture graphs (a CUDA device can)" \
    "$train" "$tmp/mlp.yaml" --device cpu --epochs 1 --graph-capture
cfg adam "$mlp" '{class: Adam, lr: 0.001}' "$step"
expect 2 "$opt: the Adam optimizer's step uses values the host changes every step (the step count of its bias corrections)" \
    "$train" "$tmp/adam.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
cfg perstep "$mlp" "$sgd" '{class: StepLR, interval: step, step_size: 5, gamma: 0.5}'
expect 2 "$opt: a per-step schedule (scheduler interval: step)" \
    "$train" "$tmp/perstep.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
expect 2 "$opt: --clip-grad-norm (loop.clip_grad_norm) reads the gradient norm on the host" \
    "$train" "$tmp/mlp.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture \
    --clip-grad-norm 1
expect 2 "$opt: --accum-steps (loop.accum_steps) > 1" \
    "$train" "$tmp/mlp.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture \
    --accum-steps 2
expect 2 "$opt: --amp fp16's gradient scaler" \
    "$train" "$tmp/mlp.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture \
    --amp fp16
cp "$tmp/mlp.yaml" "$tmp/key.yaml"
printf 'loop: {graph_capture: yes please}\n' >> "$tmp/key.yaml"
expect 2 "expected true or false, found 'yes please'" \
    "$train" "$tmp/key.yaml" --plugin "$host" --device testdev:0 --epochs 1
printf 'loop: {graph_capture: true}\n' >> "$tmp/mlp.yaml"
expect 2 "$opt: device cpu cannot capture graphs" "$train" "$tmp/mlp.yaml" --device cpu --epochs 1
# at the capture (after the warm-up steps): exit 1 with the reason
cfg drop '  - Linear: {in_features: 64, out_features: 32}
  - ReLU
  - Dropout: {p: 0.1}
  - Linear: {in_features: 32, out_features: 10}' "$sgd" "$step"
expect 1 "$opt: the training step draws random numbers (dropout?)" \
    "$train" "$tmp/drop.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
cfg tanh '  - Linear: {in_features: 64, out_features: 32}
  - Tanh
  - Linear: {in_features: 32, out_features: 10}' "$sgd" "$step"
EMBER_FALLBACK=allow expect 1 "$opt: the training step cannot be captured on testdev:0: " \
    "$train" "$tmp/tanh.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
EMBER_FALLBACK=allow expect 1 "layer 2 (Tanh): $tmp/tanh.yaml:4:5: Tanh: testdev: a copy to or from host memory on a stream that records a graph" \
    "$train" "$tmp/tanh.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
exit $fail

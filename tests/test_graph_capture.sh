#!/bin/sh
# tests/test_graph_capture.sh — ember-train --graph-capture (trainer/loop.c) without a GPU, on
# the test device built with host kernels (tests/plugins/host/testdev_host.so: testdev.c with
# TD_HOST), which queues a small MLP's whole training step on its streams and records and
# replays graphs as CUDA does (a host read or copy during a capture breaks it):
#   - an MLP (Linear, ReLU, Linear, cross entropy) trained 3 epochs with SGD, momentum, weight
#     decay and a per-epoch StepLR, with --graph-capture and without, ends with the same weights
#     bit for bit, the same checkpoint tensors (the model and the optimizer's state) and
#     scheduler state, the same optimizer groups (lr included; less the option capturable,
#     which --graph-capture sets) and the same per-epoch train loss, accuracy and lr in
#     --metrics; the run with it says it replayed steps from 1 capture (the lr is read on the
#     device: a new epoch's lr needs no new capture) and the epochs' last, shorter batches ran
#     as usual; a run with another seed ends elsewhere (the comparison can fail);
#   - the same comparisons, 2 epochs each, for the steps whose scalars change every step, now
#     device tensors their capturable kernels read (plugins/optim/optimizers.c): Adam with a
#     per-step StepLR (its step count and bias corrections, and the lr), AdamW with weight
#     decay and a per-step CosineAnnealingLR, SGD with a per-step LinearLR;
#   - --clip-grad-norm 0.5 (em_clip_grad_norm_device_ in the captured step: the norm and the
#     clip coefficient stay device tensors), 3 epochs of the SGD run: the same comparisons
#     (weights, checkpoint, losses, and the epochs' mean gradient norm, now measured for the
#     replayed steps too), the norm above 0.5 in some epoch (clipping happened) and weights
#     other than the run without clipping's (the comparison can fail); every run's epoch
#     rows compare the mean gradient norm too (--metrics makes every step measure it);
#   - Adam with amsgrad (capturable: op by op with the step count, the bias corrections and
#     the lr on the device) and a per-step StepLR, 2 epochs: the same comparisons (the plain
#     run takes the fused amsgrad kernel), and weights other than plain Adam's;
#   - --amp fp16 (the capturable gradient scaler: the scale, its update and the skipping of
#     a step on the device), with an init scale of 2^24 and a growth interval of 3 so that
#     steps overflow and the scale grows in replayed steps: Adam with a per-step StepLR, and
#     SGD with a per-step LinearLR and --clip-grad-norm 0.5, 2 epochs each: the same
#     comparisons, and every step's loss, lr, gradient norm, skipped-step count and scale
#     (--metrics-steps) and the summary's amp line; a resume from step 20 ends with the same
#     weights; a run with the default scale (no skips) ends elsewhere; loop.amp_init_scale's
#     range;
#   - the refusals, each naming the option and the reason: the CPU, RMSprop (its host step
#     count), a per-step OneCycleLR that cycles the momentum, --accum-steps 2, a config's bad
#     loop.graph_capture value, and an op without a kernel on the device (its CPU fallback
#     copies to the host, which breaks the capture);
#   - Dropout (the masks drawn in the captured step from the generator's state each replay
#     writes on the device): SGD 3 epochs and Adam with two Dropout layers 2 epochs, the same
#     comparisons as above; weights other than the MLP's without dropout; a resume from a
#     checkpoint at step 30 ends with the uninterrupted run's weights;
#   - attention dropout (scaled_dot_product_attention's draws, forward and backward, in the
#     captured step): a causal byte-level MultiheadAttention (its only dropout the attention's)
#     and a pre-norm TransformerEncoder (attention, feed-forward and residual dropout) over a
#     text made here, Adam with a per-step StepLR, 2 epochs: the same comparisons, and weights
#     other than dropout 0's;
#   - a plugin layer that reserves its numbers itself (testplug.ReservedDropout,
#     tests/plugins/layer_plugin.c: em_generator_reserve, then the dropout op with seed and
#     offset) trains eagerly and is refused at the capture: the generator moved (trainer/loop.c);
#   - tests/gpu/capture (tests/gpu/run.sh capture) rehearsed on the test device (--plugin):
#     its 10 optimizer rows (SGD, Adam, AdamW, Adam+clip, Adam+ams; float32 and float64), each
#     a captured step replayed 19 times against the CPU's plain steps, all PASS and bitwise
#     (the test device runs the CPU's kernels: no GPU rounding), and its Dropout row (19
#     replays of captured draws against the CPU's eager draws, bitwise, no mask repeated);
#   - bench/gpu_step's graph rows of the MLP (tests/gpu/run.sh bench) rehearsed on the test
#     device (--plugin): mlp_graph (SGD) and mlp_adam_graph (Adam capturable), whose 3 eager
#     steps + 5 replays must equal 8 eager steps bitwise (match=yes; plain Adam captured the
#     same way says match=no: its step count is a captured argument).
# Run from the build directory (make check does).
set -u
srcdir=${srcdir:-.}
train=./trainer/ember-train
host=./tests/plugins/host/.libs/testdev_host.so
[ -x "$train" ] && [ -f "$host" ] && [ -f ./tests/plugins/.libs/layer_plugin.so ] ||
    { echo "ember-train, $host or the layer plugin not built"; exit 99; }
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
run() { # run CONFIG NAME EPOCHS EXTRA...: on testdev:0
    conf=$1 name=$2 ep=$3
    shift 3
    "$train" "$tmp/$conf.yaml" --plugin "$host" --device testdev:0 --epochs "$ep" --batch-size 64 \
        --quiet --save-weights "$tmp/$name.safetensors" --metrics "$tmp/$name.csv" \
        ${steps:+--metrics-steps "$tmp/$name.steps.csv" --log-every 1} \
        --checkpoint "$tmp/$name.ckpt" "$@" > "$tmp/$name.out" 2>&1
}
# A safetensors file's JSON header (its first 8 bytes are the header's length) and its data.
hlen() { od -An -t u8 -N 8 "$1" | tr -d ' '; }
header() { head -c $((8 + $(hlen "$1"))) "$1" | tail -c +9; }
data() { tail -c +$((9 + $(hlen "$1"))) "$1"; }
# A metadata value of a checkpoint's header (a JSON string, escapes kept).
meta() { header "$1" | grep -o -E "\"$2\":\"([^\"\\\\]|\\\\.)*\"" ; }
# the epoch rows' train loss, accuracy, lr and mean gradient norm (the columns before the times)
cols() { head -1 "$1" | tr ',' '\n' | grep -n -x -e train_loss -e train_accuracy -e lr -e grad_norm |
         cut -d: -f1 | paste -sd, -; }
# same CONFIG EPOCHS REPLAYS [OPTION...]: the eager and the --graph-capture run agree bit for bit
same() {
    conf=$1 ep=$2 replays=$3
    shift 3
    run "$conf" "$conf-eager" "$ep" "$@" || { bad "$conf: the eager run on testdev"; cat "$tmp/$conf-eager.out"; }
    run "$conf" "$conf-graph" "$ep" --graph-capture "$@" ||
        { bad "$conf: the --graph-capture run"; cat "$tmp/$conf-graph.out"; }
    e=$tmp/$conf-eager g=$tmp/$conf-graph
    cmp -s "$e.safetensors" "$g.safetensors" ||
        bad "$conf: --graph-capture changed the weights after $ep epochs"
    # the checkpoints' tensors (model.*, optim.*: the states and step counts), byte for byte
    [ -s "$e.ckpt" ] && [ -s "$g.ckpt" ] || bad "$conf: no checkpoints"
    header "$e.ckpt" | grep -q '"optim\.' || bad "$conf: no optimizer tensors in the checkpoint"
    data "$e.ckpt" > "$e.data"
    data "$g.ckpt" > "$g.data"
    [ -s "$e.data" ] && cmp -s "$e.data" "$g.data" ||
        bad "$conf: the checkpoint's tensors (model and optimizer state) differ with --graph-capture"
    # every tensor's name, dtype, shape and offsets (not the metadata)
    [ "$(header "$e.ckpt" | grep -o -E '"(model|optim)\.[^"]*":\{[^}]*\}')" = \
      "$(header "$g.ckpt" | grep -o -E '"(model|optim)\.[^"]*":\{[^}]*\}')" ] ||
        bad "$conf: the checkpoints' tensor entries differ"
    [ -n "$(meta "$e.ckpt" sched.state)" ] && [ "$(meta "$e.ckpt" sched.state)" = "$(meta "$g.ckpt" sched.state)" ] ||
        bad "$conf: the scheduler state differs: $(meta "$e.ckpt" sched.state) / $(meta "$g.ckpt" sched.state)"
    pg() { meta "$1" optim.param_groups | sed -e 's/\\"capturable\\":\(true\|false\),\{0,1\}//g'; }
    case $(meta "$g.ckpt" optim.param_groups) in
    *'\"capturable\":true'*) ;;
    *) bad "$conf: the --graph-capture run's optimizer is not capturable: $(meta "$g.ckpt" optim.param_groups)" ;;
    esac
    [ -n "$(pg "$e.ckpt")" ] && [ "$(pg "$e.ckpt")" = "$(pg "$g.ckpt")" ] ||
        bad "$conf: the optimizer's groups (lr) differ: $(pg "$e.ckpt") / $(pg "$g.ckpt")"
    c=$(cols "$e.csv")
    [ -n "$c" ] && [ "$c" = "$(cols "$g.csv")" ] || bad "$conf: the metrics files' columns ($c)"
    cut -d, -f"$c" "$e.csv" > "$e.cols"
    cut -d, -f"$c" "$g.csv" > "$g.cols"
    [ "$(wc -l < "$e.cols")" -eq $((ep + 1)) ] || bad "$conf: $ep epoch rows in the eager metrics"
    cmp -s "$e.cols" "$g.cols" ||
        { bad "$conf: the epochs' train loss, accuracy, lr or gradient norm differ with --graph-capture"; diff "$e.cols" "$g.cols"; }
    grep -q -- "--graph-capture: $replays steps replayed from 1 capture\$" "$g.out" ||
        { bad "$conf: the summary's replay count ($replays from 1 capture)"; cat "$g.out"; }
    grep -q -- "--graph-capture" "$e.out" && bad "$conf: the eager run mentions --graph-capture"
}
# 3 epochs x 21 full batches, less the first 3 (eager warm-up); one capture for every lr
same mlp 3 60
run mlp seed1 3 --graph-capture --seed 1 || bad "the --seed 1 run"
cmp -s "$tmp/seed1.safetensors" "$tmp/mlp-graph.safetensors" &&
    bad "another seed gave the same weights: the comparison cannot fail"
# clipping in the captured step: the norm and the coefficient are device tensors
cfg clip "$mlp" "$sgd" "$step"
same clip 3 60 --clip-grad-norm 0.5
cmp -s "$tmp/clip-graph.safetensors" "$tmp/mlp-graph.safetensors" &&
    bad "--clip-grad-norm 0.5 gave the weights of the run without it: the comparison cannot fail"
gcol=$(head -1 "$tmp/clip-graph.csv" | tr ',' '\n' | grep -n -x grad_norm | cut -d: -f1)
[ -n "$gcol" ] && tail -n +2 "$tmp/clip-graph.csv" | cut -d, -f"$gcol" |
    awk '$1 > 0.5 { n++ } END { exit !n }' ||
    bad "--clip-grad-norm 0.5: no epoch's mean gradient norm is above 0.5 (nothing was clipped)"
# per-step schedules and Adam's step count: 2 epochs x 21 full batches, less 3
cfg adam "$mlp" '{class: Adam, lr: 0.002}' '{class: StepLR, interval: step, step_size: 5, gamma: 0.8}'
same adam 2 39
cfg ams "$mlp" '{class: Adam, lr: 0.002, amsgrad: true}' \
    '{class: StepLR, interval: step, step_size: 5, gamma: 0.8}'
same ams 2 39
cmp -s "$tmp/ams-graph.safetensors" "$tmp/adam-graph.safetensors" &&
    bad "amsgrad gave plain Adam's weights: the comparison cannot fail"
cfg adamw "$mlp" '{class: AdamW, lr: 0.003, weight_decay: 0.05}' \
    '{class: CosineAnnealingLR, interval: step, T_max: 30, eta_min: 1.0e-4}'
same adamw 2 39
cfg sgdstep "$mlp" "$sgd" '{class: LinearLR, interval: step, start_factor: 0.2, total_iters: 30}'
same sgdstep 2 39
# dropout: each replay draws its masks from the generator's state, written on the device
# before the replay (ember/random.h, "Graph capture"), as the eager steps draw them
cfg drop '  - Linear: {in_features: 64, out_features: 32}
  - ReLU
  - Dropout: {p: 0.2}
  - Linear: {in_features: 32, out_features: 10}' "$sgd" "$step"
same drop 3 60
cmp -s "$tmp/drop-graph.safetensors" "$tmp/mlp-graph.safetensors" &&
    bad "Dropout gave the weights of the run without it: the comparison cannot fail"
# a checkpoint after 30 steps (mid-epoch 2: the generator's state in it) resumed with
# --graph-capture ends where the uninterrupted run did
run drop dropres1 3 --graph-capture --max-steps 30 || bad "the dropout run to step 30"
run drop dropres2 3 --graph-capture --resume "$tmp/dropres1.ckpt" || bad "the dropout resume"
cmp -s "$tmp/dropres2.safetensors" "$tmp/drop-graph.safetensors" ||
    bad "Dropout --graph-capture resumed from step 30 ended elsewhere"
# Adam with dropout after a second Dropout: one generator, two draws a step
cfg drop2 '  - Linear: {in_features: 64, out_features: 32}
  - Dropout: {p: 0.3}
  - ReLU
  - Linear: {in_features: 32, out_features: 32}
  - Dropout: {p: 0.1}
  - Linear: {in_features: 32, out_features: 10}' '{class: Adam, lr: 0.002}' \
    '{class: StepLR, interval: step, step_size: 5, gamma: 0.8}'
same drop2 2 39
# attention dropout (em_scaled_dot_product_attention's draw and its backward's, captured) in
# a small causal char-level Transformer over bytes (256 ids: any text fits) of a text made
# here (9551 bytes, 8596 of them training ones): windows of 16, 8 full batches of 64 an epoch.
# A MultiheadAttention whose only dropout is the attention's, and a pre-norm
# TransformerEncoder (attention, feed-forward and residual dropouts), with Adam and a per-step
# StepLR, 2 epochs each: the same comparisons, and weights other than dropout 0's
awk 'BEGIN { split("the graph capture replays dropout masks of attention", w, " ")
             for (i = 0; i < 1500; i++) printf "%s%s", w[1 + (i * 5 + int(i / 7)) % 8], i % 12 == 11 ? ".\n" : " " }' \
    > "$tmp/text.txt"
[ "$(wc -c < "$tmp/text.txt")" -eq 9551 ] || bad "the text is not 9551 bytes"
lm() { # lm NAME LAYERS: a config over the text
    cat > "$tmp/$1.yaml" <<EOF
model:
  - Embedding: {num_embeddings: 256, embedding_dim: 16}
$2
  - Linear: {in_features: 16, out_features: 256}
data:
  class: text
  options: {path: $tmp/text.txt, seq_len: 16, level: byte}
  validation: {split: validation}
optimizer: {class: Adam, lr: 0.002}
scheduler: {class: StepLR, interval: step, step_size: 5, gamma: 0.8}
EOF
}
mha() { echo "  - MultiheadAttention: {embed_dim: 16, num_heads: 2, dropout: $1, batch_first: true, causal: true}"; }
lm mha "$(mha 0.3)"
same mha 2 13
lm mha0 "$(mha 0.0)"
run mha0 mha0 2 --graph-capture || bad "the MultiheadAttention run without dropout"
cmp -s "$tmp/mha0.safetensors" "$tmp/mha-graph.safetensors" &&
    bad "attention dropout gave the weights of the run without it: the comparison cannot fail"
tfl() { echo "  - LearnedPositionalEncoding: {d_model: 16, max_len: 16, batch_first: true}
  - TransformerEncoder: {d_model: 16, nhead: 2, dim_feedforward: 32, dropout: $1, num_layers: 1,
                         batch_first: true, norm_first: true, causal: true}"; }
lm tf "$(tfl 0.2)"
same tf 2 13
lm tf0 "$(tfl 0.0)"
run tf0 tf0 2 --graph-capture || bad "the TransformerEncoder run without dropout"
cmp -s "$tmp/tf0.safetensors" "$tmp/tf-graph.safetensors" &&
    bad "the Transformer's dropout gave the weights of the run without it: the comparison cannot fail"

# --amp fp16: the capturable gradient scaler (the scale, its update and the found-inf verdict
# on the device; a skipped step undone there). An init scale of 2^24 overflows the float16
# gradients of the first steps, and a growth interval of 3 grows the scale into overflow
# again and again, in replayed steps too: every step's loss, lr, skipped-step count and scale
# (--metrics-steps) and the summary's amp line are the eager run's
# amp_same CONFIG EPOCHS REPLAYS [OPTION...]
amp_same() {
    conf=$1
    steps=1 same "$@"
    e=$tmp/$conf-eager.steps.csv g=$tmp/$conf-graph.steps.csv
    sc=$(head -1 "$e" | tr ',' '\n' | grep -n -x -e step -e loss -e lr -e grad_norm \
         -e skipped_steps -e loss_scale | cut -d: -f1 | paste -sd, -)
    [ "$(echo "$sc" | tr ',' '\n' | wc -l)" -eq 6 ] || bad "$conf: the step rows' columns ($sc)"
    cut -d, -f"$sc" "$e" > "$e.cols"
    cut -d, -f"$sc" "$g" > "$g.cols"
    [ "$(wc -l < "$e.cols")" -gt 40 ] && cmp -s "$e.cols" "$g.cols" ||
        { bad "$conf: the steps' loss, lr, gradient norm, skipped steps or scale differ"; diff "$e.cols" "$g.cols" | head; }
    ae=$(grep -o 'amp fp16: [^;]*' "$tmp/$conf-eager.out") ag=$(grep -o 'amp fp16: [^;]*' "$tmp/$conf-graph.out")
    [ -n "$ae" ] && [ "$ae" = "$ag" ] || bad "$conf: the amp summaries differ: $ae / $ag"
    # skips and growths after the warm-up and the capture (step 10 and on are replays or the
    # epochs' last batches): the scale backed off, and grew, in replayed steps
    kc=$(head -1 "$e" | tr ',' '\n' | grep -n -x skipped_steps | cut -d: -f1)
    lc=$(head -1 "$e" | tr ',' '\n' | grep -n -x loss_scale | cut -d: -f1)
    tail -n +2 "$g" | awk -F, -v k="$kc" -v l="$lc" 'NR > 11 && $k > pk { s++ } NR > 11 && $l > pl { up++ }
        { pk = $k; pl = $l } END { exit !(s >= 2 && up >= 2) }' ||
        bad "$conf: no skipped step and growth of the scale among the replayed steps"
}
ampcfg='loop: {amp: fp16, amp_init_scale: 16777216, amp_growth_interval: 3}'
cfg ampadam "$mlp" '{class: Adam, lr: 0.002}' '{class: StepLR, interval: step, step_size: 5, gamma: 0.8}'
echo "$ampcfg" >> "$tmp/ampadam.yaml"
amp_same ampadam 2 33
# a checkpoint after 20 steps resumed with --graph-capture (the scaler's state back on the
# device) ends where the uninterrupted run did
run ampadam ampres1 2 --graph-capture --max-steps 20 || bad "the --amp fp16 run to step 20"
run ampadam ampres2 2 --graph-capture --resume "$tmp/ampres1.ckpt" || bad "the --amp fp16 resume"
cmp -s "$tmp/ampres2.safetensors" "$tmp/ampadam-graph.safetensors" ||
    bad "--amp fp16 --graph-capture resumed from step 20 ended elsewhere"
cfg ampsgd "$mlp" "$sgd" '{class: LinearLR, interval: step, start_factor: 0.2, total_iters: 30}'
echo "$ampcfg" >> "$tmp/ampsgd.yaml"
amp_same ampsgd 2 33 --clip-grad-norm 0.5
# the skipped steps changed the training: the default scale (no overflow) ends elsewhere
cfg ampnone "$mlp" '{class: Adam, lr: 0.002}' '{class: StepLR, interval: step, step_size: 5, gamma: 0.8}'
echo 'loop: {amp: fp16}' >> "$tmp/ampnone.yaml"
run ampnone ampnone 2 --graph-capture || bad "the --amp fp16 run with the default scale"
grep -q "amp fp16: 0 skipped steps" "$tmp/ampnone.out" || bad "the default scale skipped steps: $(cat "$tmp/ampnone.out")"
cmp -s "$tmp/ampnone.safetensors" "$tmp/ampadam-graph.safetensors" &&
    bad "the skipped steps left the weights of a run without them: the comparison cannot fail"

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
cfg rms "$mlp" '{class: RMSprop, lr: 0.001}' "$step"
expect 2 "$opt: the RMSprop optimizer's step uses its step count, which the host changes every step" \
    "$train" "$tmp/rms.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
cfg cycle "$mlp" "$sgd" '{class: OneCycleLR, interval: step, max_lr: 0.1, total_steps: 100}'
expect 2 "$opt: a per-step OneCycleLR with cycle_momentum sets a new momentum (beta1) every step" \
    "$train" "$tmp/cycle.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
expect 2 "$opt: --accum-steps (loop.accum_steps) > 1" \
    "$train" "$tmp/mlp.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture \
    --accum-steps 2
cp "$tmp/mlp.yaml" "$tmp/ampkey.yaml"
printf 'loop: {amp: fp16, amp_init_scale: 0.5}\n' >> "$tmp/ampkey.yaml"
expect 2 "loop.amp_init_scale: '0.5' is not" "$train" "$tmp/ampkey.yaml" --epochs 1
cp "$tmp/mlp.yaml" "$tmp/key.yaml"
printf 'loop: {graph_capture: yes please}\n' >> "$tmp/key.yaml"
expect 2 "expected true or false, found 'yes please'" \
    "$train" "$tmp/key.yaml" --plugin "$host" --device testdev:0 --epochs 1
printf 'loop: {graph_capture: true}\n' >> "$tmp/mlp.yaml"
expect 2 "$opt: device cpu cannot capture graphs" "$train" "$tmp/mlp.yaml" --device cpu --epochs 1
# at the capture (after the warm-up steps): exit 1 with the reason
cfg tanh '  - Linear: {in_features: 64, out_features: 32}
  - Tanh
  - Linear: {in_features: 32, out_features: 10}' "$sgd" "$step"
EMBER_FALLBACK=allow expect 1 "$opt: the training step cannot be captured on testdev:0: " \
    "$train" "$tmp/tanh.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
EMBER_FALLBACK=allow expect 1 "layer 2 (Tanh): $tmp/tanh.yaml:4:5: Tanh: testdev: a copy to or from host memory on a stream that records a graph" \
    "$train" "$tmp/tanh.yaml" --plugin "$host" --device testdev:0 --epochs 1 --graph-capture
# a layer that reserves its numbers itself (em_generator_reserve: tests/plugins/layer_plugin.c,
# testplug.ReservedDropout) moves the generator during the capture: every replay would draw
# the same mask. Exit 1 naming why; the same run without --graph-capture trains
cfg resdrop '  - Linear: {in_features: 64, out_features: 32}
  - ReLU
  - testplug.ReservedDropout
  - Linear: {in_features: 32, out_features: 10}' "$sgd" "$step"
layers=./tests/plugins/.libs/layer_plugin.so
run resdrop resdrop 1 --plugin "$layers" || { bad "testplug.ReservedDropout eagerly"; cat "$tmp/resdrop.out"; }
expect 1 "$opt: the training step moved the random generator during the capture (an op that reserves its numbers with em_generator_reserve" \
    "$train" "$tmp/resdrop.yaml" --plugin "$host" --plugin "$layers" --device testdev:0 --epochs 1 --graph-capture
# tests/gpu/capture on the test device: every row replayed from a capture, PASS, bitwise
out=$(./tests/gpu/capture --device testdev:0 --plugin "$host" 2>&1) || bad "tests/gpu/capture on testdev:0: $out"
[ "$(echo "$out" | grep -c '(1 eager, then replays of 1 capture): params and states bitwise .*: PASS$')" -eq 10 ] ||
    bad "tests/gpu/capture on testdev:0: not 10 bitwise PASS rows: $out"
echo "$out" | grep -q 'clip norms bitwise' || bad "tests/gpu/capture: no clip rows: $out"
echo "$out" | grep -q '^capture Dropout .*(1 eager, then replays of 1 capture): masks, outputs and fills bitwise, 0 replay(s) repeating the previous mask, generator where the CPU.s ops leave it: PASS$' ||
    bad "tests/gpu/capture on testdev:0: no passing Dropout row: $out"
# bench/gpu_step's graph rows on the test device (no times checked: only the replays' match)
out=$(./bench/gpu_step --device testdev:0 --quick --plugin "$host" mlp_graph mlp_adam_graph 2>&1) ||
    bad "bench/gpu_step on testdev:0: $out"
for w in mlp_graph mlp_adam_graph; do
    echo "$out" | grep -q "^ember $w ms=[0-9.]* match=yes maxdiff=0\$" ||
        bad "bench/gpu_step $w: the replays do not match the eager steps bitwise: $out"
done
exit $fail

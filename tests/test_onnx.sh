#!/bin/sh
# tests/test_onnx.sh — Ember's ONNX export judged by ONNX's own tools (issue 24), in two halves:
#
# The C half (every stage: plain, without oneDNN, ASan+UBSan):
#   - tests/onnx_export builds the MLP (raw uint8 input, to_float and normalize as the first
#     nodes), a CNN, a CNN of Conv2d layers with activation relu (the fused conv2d_relu:
#     exported as Conv then Relu, imported bit for bit), a CNN of MaxPool2d layers with
#     activation relu (the fused max_pool2d_relu: exported as Relu then MaxPool, imported bit
#     for bit), a BatchNorm/Dropout/LayerNorm net, a
#     Residual/Parallel net, an Embedding net, one with a program-registered layer that brings its own exporter, Conv1d/GroupNorm,
#     ConvTranspose2d/GroupNorm, LSTM/GRU models (every `output`), LSTMCell/GRUCell,
#     MultiheadAttention (plain and causal), TransformerEncoderLayer/TransformerEncoder (pre
#     and post norm, relu and gelu) and the positional encodings, exports each at opsets
#     13..17 and writes inputs and Ember's outputs for batches of 1 and 7; it checks itself
#     determinism, export -> import -> export byte-identical with the same outputs (or the
#     importer's refusal naming the node), and the refusals (a layer without an exporter, a
#     padding-mask layer under variable_length, bad options);
#   - ember-train: --export-onnx after a short training run and --init-weights W
#     --export-onnx (no training) write the same bytes; --init-onnx predicts the logits
#     --init-weights does; model: {onnx: PATH} (relative to the config) of an unsupported op
#     is refused naming the node; a model trained on variable-length batches (the test
#     plugin's, a padding mask reaching its LSTM) is refused at the LSTM.
# The Python half (the plain stage only: it judges the files, which the other stages'
# builds write alike; their point is the C code under other kernels and sanitizers):
#   - onnx's full checker (Debian's python3-onnx, /usr/bin/python3) on every file;
#   - ONNX Runtime (onnxruntime from PyPI in the venv tests/pyenv of the build tree, or
#     $EMBER_TEST_PYENV, made by tests/pyenv.sh: skipped with the reason when it cannot be
#     had, a failure under CI=true) runs every file; outputs within allclose(1e-5, 1e-6); on
#     the raw uint8 digits ember-train's export gives the logits ember-train --predict wrote.
# The stage is $EMBER_TEST_STAGE, which scripts/test.sh sets (plain, nodnnl, asan); unset (a
# developer's `make check`) runs both halves.
# Run from the build directory (make check does).
set -u
srcdir=${srcdir:-.}
stage=${EMBER_TEST_STAGE:-plain}
case $stage in
    plain) python=true ;;
    nodnnl | asan) python=false ;;
    *) echo "test_onnx: EMBER_TEST_STAGE='$stage' is not plain, nodnnl or asan" >&2; exit 1 ;;
esac
tmp=$(mktemp -d) || exit 99
trap "rm -rf '$tmp'" EXIT
./tests/onnx_export "$tmp" || exit 1
EMBER_DISABLE_PLUGINS=ember-onnx ./tests/onnx_export --absent || exit 1
cfg="$srcdir/examples/digits.yaml"
t=$tmp/t # the trainer's files apart: the checker below sees them on their own
mkdir "$t" || exit 99
./trainer/ember-train "$cfg" --epochs 1 --limit-batches 2 --seed 3 --quiet \
    --save-weights "$t/d.safetensors" --export-onnx "$t/trained.onnx" || exit 1
./trainer/ember-train "$cfg" --init-weights "$t/d.safetensors" --export-onnx "$t/d.onnx" \
    2>"$t/log" || { cat "$t/log"; exit 1; }
grep -q "ONNX model written to $t/d.onnx" "$t/log" || { cat "$t/log"; exit 1; }
cmp "$t/trained.onnx" "$t/d.onnx" || { echo "FAIL: the two exports differ"; exit 1; }
rm "$t/trained.onnx"
./trainer/ember-train "$cfg" --init-weights "$t/d.safetensors" --predict "$t/p.csv" \
    --predict-scores logits 2>/dev/null || exit 1
# --init-onnx (its transform nodes left out: the config's apply) predicts what the weights did
./trainer/ember-train "$cfg" --init-onnx "$t/d.onnx" --predict "$t/p2.csv" \
    --predict-scores logits 2>/dev/null || exit 1
cmp "$t/p.csv" "$t/p2.csv" || { echo "FAIL: --init-onnx predicts otherwise"; exit 1; }
# model: {onnx: PATH} in a config, the path relative to the config's directory: an
# unsupported op is a usage error naming the node (so the file was found and read)
abs=$(cd "$srcdir" && pwd)
mkdir "$tmp/c" || exit 99
sed -e '/^model:/,/^$/d' -e 's|path: ../data/digits|path: '"$abs"'/data/digits|' "$cfg" \
    >"$tmp/c/onnx.yaml"
printf 'model: {onnx: bad.onnx}\n' >>"$tmp/c/onnx.yaml"
cp "$srcdir/tests/fixtures/onnx/bad_op.onnx" "$tmp/c/bad.onnx" || exit 99
./trainer/ember-train "$tmp/c/onnx.yaml" --predict "$tmp/c/p.csv" 2>"$tmp/c/log"
[ $? -eq 2 ] && grep -q "node 'mix' (Einsum, opset 17)" "$tmp/c/log" ||
    { echo "FAIL: model: {onnx: ...} of an unsupported op:"; cat "$tmp/c/log"; exit 1; }
# a model trained on variable-length batches (the test plugin's padded sequences, their mask
# reaching the LSTM): --export-onnx is refused at the LSTM, naming it, and writes nothing
plugdir=${EMBER_TEST_PLUGIN_DIR:-$PWD/tests/plugins/.libs}
cat >"$tmp/c/varlen.yaml" <<EOF
model:
  - LSTM: {input_size: 3, hidden_size: 4, batch_first: true, output: last}
  - Linear: {in_features: 4, out_features: 3}
data: {class: test-varlen, options: {length: 16}, inputs: [seq], target: label}
optimizer: {class: SGD, lr: 0.05}
loop: {epochs: 1, batch_size: 8, workers: 1}
EOF
EMBER_PLUGIN_PATH="$plugdir/varlen_plugin.so" ./trainer/ember-train "$tmp/c/varlen.yaml" --quiet \
    --export-onnx "$tmp/c/varlen.onnx" 2>"$tmp/c/log"
rc=$?
[ $rc -ne 0 ] && grep -q "layer '0' (LSTM) reads the padding mask" "$tmp/c/log" &&
    [ ! -e "$tmp/c/varlen.onnx" ] ||
    { echo "FAIL: --export-onnx of a variable-length LSTM (exit $rc):"; cat "$tmp/c/log"; exit 1; }
if ! $python; then
    echo "test_onnx: stage $stage: the C half only (onnx's checker and ONNX Runtime judge the files in the plain stage)"
    exit 0
fi
if ! /usr/bin/python3 -c 'import onnx' 2>/dev/null; then
    echo "test_onnx: /usr/bin/python3 has no onnx module (python3-onnx)" >&2
    [ "${CI:-}" = true ] && exit 1
    exit 77
fi
/usr/bin/python3 "$srcdir/tests/onnx_check.py" checker "$tmp" || exit 1
/usr/bin/python3 "$srcdir/tests/onnx_check.py" checker "$t" >/dev/null || exit 1
py=$("$srcdir/tests/pyenv.sh" "$PWD/tests/pyenv" onnxruntime) || exit $?
"$py" "$srcdir/tests/onnx_check.py" run "$tmp" || exit 1
"$py" "$srcdir/tests/onnx_check.py" trainer "$t/d.onnx" "$t/p.csv" \
    "$srcdir/data/digits/t10k-images-idx3-ubyte.gz" || exit 1

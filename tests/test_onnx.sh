#!/bin/sh
# tests/test_onnx.sh — Ember's ONNX export judged by ONNX's own tools (issue 24):
#   - tests/onnx_export builds the MLP (raw uint8 input, to_float and normalize as the first
#     nodes), a CNN, a BatchNorm/Dropout/LayerNorm net, a Residual/Parallel net, an Embedding
#     net, one with a program-registered layer that brings its own exporter, Conv1d/GroupNorm,
#     ConvTranspose2d/GroupNorm and LSTM/GRU models (every `output`), exports each
#     at opsets 13..17 and writes inputs and Ember's outputs for batches of 1 and 7 (it checks
#     determinism and the refusals itself);
#   - onnx's full checker (Debian's python3-onnx, /usr/bin/python3) on every file;
#   - ONNX Runtime (onnxruntime from PyPI in the venv tests/pyenv of the build tree, or
#     $EMBER_TEST_PYENV, made by tests/pyenv.sh: skipped with the reason when it cannot be
#     had, a failure under CI=true) runs every file; outputs within allclose(1e-5, 1e-6);
#   - ember-train: --export-onnx after a short training run and --init-weights W
#     --export-onnx (no training) write the same bytes; ONNX Runtime on the raw uint8 digits
#     gives the logits ember-train --predict wrote; --init-onnx and model: {onnx: PATH}
#     predict the same logits; an unsupported op is refused naming the node.
# Run from the build directory (make check does).
set -u
srcdir=${srcdir:-.}
tmp=$(mktemp -d) || exit 99
trap "rm -rf '$tmp'" EXIT
./tests/onnx_export "$tmp" || exit 1
EMBER_DISABLE_PLUGINS=ember-onnx ./tests/onnx_export --absent || exit 1
if ! /usr/bin/python3 -c 'import onnx' 2>/dev/null; then
    echo "test_onnx: /usr/bin/python3 has no onnx module (python3-onnx)" >&2
    [ "${CI:-}" = true ] && exit 1
    exit 77
fi
/usr/bin/python3 "$srcdir/tests/onnx_check.py" checker "$tmp" || exit 1
py=$("$srcdir/tests/pyenv.sh" "$PWD/tests/pyenv" onnxruntime) || exit $?
"$py" "$srcdir/tests/onnx_check.py" run "$tmp" || exit 1
cfg="$srcdir/examples/digits.yaml"
mkdir "$tmp/t" || exit 99
tmp=$tmp/t # the trainer's files apart: the checker below sees only them
./trainer/ember-train "$cfg" --epochs 1 --limit-batches 5 --seed 3 --quiet \
    --save-weights "$tmp/d.safetensors" --export-onnx "$tmp/trained.onnx" || exit 1
./trainer/ember-train "$cfg" --init-weights "$tmp/d.safetensors" --export-onnx "$tmp/d.onnx" \
    2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
grep -q "ONNX model written to $tmp/d.onnx" "$tmp/log" || { cat "$tmp/log"; exit 1; }
cmp "$tmp/trained.onnx" "$tmp/d.onnx" || { echo "FAIL: the two exports differ"; exit 1; }
./trainer/ember-train "$cfg" --init-weights "$tmp/d.safetensors" --predict "$tmp/p.csv" \
    --predict-scores logits 2>/dev/null || exit 1
/usr/bin/python3 "$srcdir/tests/onnx_check.py" checker "$tmp" >/dev/null || exit 1
"$py" "$srcdir/tests/onnx_check.py" trainer "$tmp/d.onnx" "$tmp/p.csv" \
    "$srcdir/data/digits/t10k-images-idx3-ubyte.gz" || exit 1
# --init-onnx (its transform nodes left out: the config's apply) predicts what the weights did,
# and model: {onnx: PATH} in a config is the same model; a bad file is a usage error
./trainer/ember-train "$cfg" --init-onnx "$tmp/d.onnx" --predict "$tmp/p2.csv" \
    --predict-scores logits 2>/dev/null || exit 1
cmp "$tmp/p.csv" "$tmp/p2.csv" || { echo "FAIL: --init-onnx predicts otherwise"; exit 1; }
abs=$(cd "$srcdir" && pwd)
sed -e '/^model:/,/^$/d' -e 's|path: ../data/digits|path: '"$abs"'/data/digits|' "$cfg" \
    >"$tmp/onnx.yaml"
printf 'model: {onnx: d.onnx}\n' >>"$tmp/onnx.yaml"
./trainer/ember-train "$tmp/onnx.yaml" --predict "$tmp/p3.csv" --predict-scores logits \
    2>/dev/null || exit 1
cmp "$tmp/p.csv" "$tmp/p3.csv" || { echo "FAIL: model: {onnx: ...} predicts otherwise"; exit 1; }
./trainer/ember-train "$cfg" --init-onnx "$srcdir/tests/fixtures/onnx/bad_op.onnx" 2>"$tmp/log"
[ $? -eq 2 ] && grep -q "node 'mix' (Einsum, opset 17)" "$tmp/log" ||
    { echo "FAIL: --init-onnx of an unsupported op:"; cat "$tmp/log"; exit 1; }

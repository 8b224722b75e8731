#!/bin/sh
# tests/test_tensorboard.sh — the --tensorboard files read back by TensorBoard's own reader
# (tests/tensorboard_check.py, under the `tensorboard` package from PyPI in the venv
# tests/pyenv of the build tree, or $EMBER_TEST_PYENV, made by tests/pyenv.sh: skipped with the
# reason when it cannot be had, a failure under CI=true; scripts/test.sh points every stage at
# the plain build's, so the install, about a minute, happens once):
#   - writer: known rows and tensors through the sink (tests/tb_write);
#   - trainer: an ember-train run's events against its own --metrics-steps and --metrics
#     rows and its saved weights.
# Run from the build directory (make check does).
set -u
srcdir=${srcdir:-.}
py=$("$srcdir/tests/pyenv.sh" "${EMBER_TEST_PYENV:-$PWD/tests/pyenv}" tensorboard) || exit $?
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fail=0
"$py" "$srcdir/tests/tensorboard_check.py" writer ./tests/tb_write "$tmp" || fail=1
# two short epochs of the bundled digits example, a step row every 3 steps
"$py" "$srcdir/tests/tensorboard_check.py" trainer ./trainer/ember-train "$tmp" \
    "$srcdir/examples/digits.yaml" --epochs 2 --limit-batches 12 --log-every 3 --seed 1 || fail=1
exit $fail

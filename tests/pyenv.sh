#!/usr/bin/env bash
# tests/pyenv.sh DIR PKG... — a Python virtual environment at DIR (or $EMBER_TEST_PYENV; made
# once, under the build tree, never the system Python) holding the PyPI packages PKG...; prints its python's path.
#
# The tests that judge Ember by other programs' readers (ONNX Runtime, TensorBoard) call it:
#
#     py=$("$srcdir/tests/pyenv.sh" "$builddir/tests/pyenv" onnxruntime) || exit $?
#
# Exit status: 0 with the path on stdout; 77 (Automake's "skipped") with the reason on stderr
# when the environment or a package cannot be had (no network, no python3-venv); under
# CI=true that is a failure (1) instead, so CI never passes by skipping. Several tests may call
# it at once (make -j): creation and installs are serialised by a lock on DIR.lock.
set -u
# $EMBER_TEST_PYENV, when set, is the one venv every such test shares (scripts/test.sh points
# every stage at the plain build's, so each package is installed once per CI run).
dir=${EMBER_TEST_PYENV:-$1}
shift
fail() {
    echo "pyenv: $*" >&2
    if [ "${CI:-}" = true ]; then exit 1; fi
    exit 77
}
mkdir -p "$(dirname "$dir")" || fail "cannot create $(dirname "$dir")"
exec 9>"$dir.lock" || fail "cannot open the lock $dir.lock"
flock 9 || fail "cannot lock $dir.lock"
if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir" >"$dir.log" 2>&1 ||
        { rm -rf "$dir"; fail "python3 -m venv $dir failed (is python3-venv installed?): $(tail -1 "$dir.log")"; }
fi
missing=""
for p in "$@"; do
    # a package is present when pip knows it (names as given, e.g. onnxruntime, tensorboard)
    "$dir/bin/python" -m pip show -q "${p%%[<>=]*}" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    "$dir/bin/python" -m pip install -q --disable-pip-version-check $missing >>"$dir.log" 2>&1 ||
        fail "pip install$missing into $dir failed: $(tail -1 "$dir.log")"
fi
echo "$dir/bin/python"

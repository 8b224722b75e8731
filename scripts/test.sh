#!/usr/bin/env bash
# Ember's test command (README): installs the packages, builds, runs `make check`, runs it
# again under AddressSanitizer + UndefinedBehaviorSanitizer, then a quick subset under valgrind.
# Safe to rerun; builds live in build/, build-nodnnl/ and build-asan/.
#
#   scripts/test.sh            every stage (what CI runs)
#   scripts/test.sh --quick    packages, build, `make check` only: a developer's loop (about
#                              2 minutes on 2 cores instead of the full run's 6 to 13)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

quick=false
case "${1:-}" in
    "") ;;
    --quick) quick=true ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (expected --quick or nothing)" >&2; exit 2 ;;
esac

check() {
    local dir=$1
    shift
    if ! make -C "$dir" -j"$(nproc)" check "$@" >"$dir/check.log" 2>&1; then
        tail -60 "$dir/check.log"
        for f in "$dir"/tests/*.log; do
            grep -q -E "^(FAIL|ERROR)" "${f%.log}.trs" 2>/dev/null && { echo "--- $f"; tail -40 "$f"; }
        done
        return 1
    fi
    grep -E "^# (TOTAL|PASS|FAIL|SKIP|ERROR)" "$dir/check.log"
    # Criterion reports a test as passed before its worker process exits, so a leak found by
    # LeakSanitizer at exit (or a sanitizer report in a passing test) does not fail it: the
    # logs are the evidence.
    local bad
    bad=$(grep -l -E "ERROR: (Leak|Address)Sanitizer|runtime error:|Sanitizer has encountered a fatal error" \
        "$dir"/tests/*.log || true)
    if [ -n "$bad" ]; then
        for f in $bad; do
            echo "--- sanitizer report in $f"
            grep -m1 -A30 -E "ERROR: (Leak|Address)Sanitizer|runtime error:" "$f"
        done
        return 1
    fi
}

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

t0=$(date +%s)
# The PyPI packages of the tests that read Ember's files with other programs' readers
# (tests/pyenv.sh) are installed once, under the plain build, for every stage's tests.
export EMBER_TEST_PYENV="$PWD/build/tests/pyenv"
stage "install packages" install_packages
stage "build" build build
# The stage a test runs in ($EMBER_TEST_STAGE: plain, nodnnl, asan), for the tests whose
# checks by other programs (Python's readers) run once, in the plain stage (tests/test_onnx.sh);
# their C paths run in every stage. Unset (a plain `make check`), such a test runs everything.
export EMBER_TEST_STAGE=plain
stage "make check" check build
if $quick; then
    echo "==> quick run (no oneDNN-less, sanitizer or valgrind stages): $(($(date +%s) - t0)) s"
    exit 0
fi
# The CPU backend without oneDNN (configure --without-onednn): OpenBLAS GEMM and the plain nn
# loops only; the tests of oneDNN's kernels skip themselves there. This build and the
# sanitizer one skip the CUDA plugin (--without-cuda): the plain build builds and tests it.
# The data-parallel tests (tests/test_ddp.sh, Open MPI) run in the plain and sanitizer stages
# only (--without-mpi here). The install test (tests/test_sdk_install.sh) ran in the plain
# stage; here it is left out of
# make check (--disable-install-check), and the ASan+UBSan build leaves it out by itself
# (configure says "install check: no (a sanitizer build)").
stage "build without oneDNN" build build-nodnnl --without-onednn --without-cuda --without-mpi \
    --disable-install-check
EMBER_TEST_STAGE=nodnnl
stage "make check (without oneDNN)" check build-nodnnl
stage "build with ASan+UBSan" build build-asan --without-cuda CFLAGS="-O1 -g $SAN" CXXFLAGS="-O1 -g $SAN" \
    LDFLAGS="$SAN"
# LeakSanitizer's exit-time scan crashes ("Tracer caught signal 11") on the dynamic TLS of
# libraries that are dlopen()ed with the CPU plugin and run threads (oneDNN, libgomp), which
# silently turned leak checking off. Preloaded, their TLS is static and the scan works.
preload=""
for lib in libgomp.so.1 libdnnl.so.2; do
    # (awk reads all input: an early exit would SIGPIPE ldconfig and fail under pipefail)
    p=$(ldconfig -p | awk -v l="$lib" '$1 == l && !found { print $NF; found = 1 }')
    [ -n "$p" ] && preload="$preload $p"
done
export LD_PRELOAD="$preload"
export ASAN_OPTIONS="$ASAN_OPTIONS:verify_asan_link_order=0"
# A preloaded libgomp has read its environment before em_init could ask for passive workers
# (em_init warns about exactly that): give it the policy the other stages get from Ember.
export OMP_WAIT_POLICY=PASSIVE
# Open MPI's libraries keep memory to the end of a process that ran MPI (tests/test_ddp.sh):
# suppressed by library name only (tests/lsan-mpi.supp), so Ember's own leaks stay fatal.
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$PWD/tests/lsan-mpi.supp:print_suppressions=0"
EMBER_TEST_STAGE=asan
stage "make check (ASan+UBSan)" check build-asan
unset LD_PRELOAD OMP_WAIT_POLICY LSAN_OPTIONS EMBER_TEST_STAGE
stage "make check-valgrind (quick subset)" make -C build check-valgrind
echo "==> all stages: $(($(date +%s) - t0)) s"

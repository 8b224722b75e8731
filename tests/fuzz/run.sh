#!/bin/sh
# tests/fuzz/run.sh — build and run the libFuzzer target for the safetensors reader.
# Not part of CI (`make check` replays the corpus instead). Needs clang and libclang-rt-14-dev
# (Debian: apt-get install clang libclang-rt-14-dev) and an already built tree for the CPU
# plugin (./configure && make).
#
#   tests/fuzz/run.sh [SECONDS] [BUILD_DIR]
#
# SECONDS (default 600) is the fuzzing time; BUILD_DIR (default: the source tree, or build/
# when it has the plugin) is where `make` built plugins/backend-cpu. The instrumented library
# and fuzzer go to build-fuzz/ (FUZZ_OUT overrides). The run starts from a copy of
# tests/fuzz/corpus/ in build-fuzz/corpus/ and writes crash reproducers to build-fuzz/; a
# reproducer belongs in tests/fuzz/crashes/ once fixed (`make check` replays those too).
# The last lines of the log give the executions count ("Done N runs in S second(s)").
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${1:-600}
if [ $# -ge 2 ]; then BUILD=$(cd "$2" && pwd)
elif [ -e "$SRC/build/plugins/backend-cpu/.libs/ember-cpu.so" ]; then BUILD=$SRC/build
else BUILD=$SRC; fi
PLUGIN_DIR=$BUILD/plugins/backend-cpu/.libs
[ -e "$PLUGIN_DIR/ember-cpu.so" ] || { echo "run.sh: no $PLUGIN_DIR/ember-cpu.so: build the tree first (./configure && make)" >&2; exit 1; }
[ -e "$BUILD/config.h" ] || { echo "run.sh: no $BUILD/config.h" >&2; exit 1; }
OUT=${FUZZ_OUT:-$SRC/build-fuzz}
mkdir -p "$OUT/corpus"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CC=${CC:-clang}

# libember, instrumented for coverage and sanitizers, with the build tree's soname so that the
# (uninstrumented) CPU plugin binds to it. Its default plugin directory is the build's.
echo "run.sh: building $OUT/libember.so.1"
$CC -g -O1 -fPIC -shared $SAN -fsanitize=fuzzer-no-link -fvisibility=hidden -std=gnu11 \
    -DEM_BUILDING_LIBEMBER -DEM_PLUGIN_DIR="\"$PLUGIN_DIR\"" -DEM_BUILD_DIR="\"$OUT/none\"" \
    -I"$SRC/core/include" -I"$SRC/core" -I"$BUILD" $(pkg-config --cflags jansson) \
    "$SRC"/core/*.c -o "$OUT/libember.so.1" -Wl,-soname,libember.so.1 \
    -Wl,--version-script="$SRC/core/libember.map" $(pkg-config --libs jansson) -lm -ldl -lpthread
echo "run.sh: building $OUT/fuzz_safetensors"
$CC -g -O1 $SAN -fsanitize=fuzzer -I"$SRC/core/include" "$SRC/tests/fuzz/fuzz_safetensors.c" \
    -o "$OUT/fuzz_safetensors" "$OUT/libember.so.1" -Wl,-rpath,"$OUT"

cp "$SRC"/tests/fuzz/corpus/* "$OUT/corpus/"
cd "$OUT"
echo "run.sh: fuzzing for $SECS s"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} EMBER_LOG=error \
    ./fuzz_safetensors -max_total_time="$SECS" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
        -print_final_stats=1 -dict="$SRC/tests/fuzz/safetensors.dict" corpus

#!/bin/sh
# tests/fuzz/run.sh — build and run one libFuzzer target for one of Ember's readers.
# Not part of CI (`make check` replays each target's corpus and crash reproducers instead,
# through tests/fuzz/replay_<target>). Needs clang and libclang-rt-14-dev (Debian: apt-get
# install clang libclang-rt-14-dev) and an already built tree (./configure && make), whose
# plugins the targets load.
#
#   tests/fuzz/run.sh TARGET [SECONDS] [BUILD_DIR]
#
# TARGET: safetensors (em_load_buffer and em_load), config (the YAML reader), idx (the MNIST
# reader of ember-data), csv (the CSV reader of ember-data), checkpoint (em_checkpoint_load) or
# onnx (em_onnx_import, the ember-onnx plugin's reader).
# SECONDS (default 600) is the fuzzing time; BUILD_DIR (default: build/ when it has the CPU
# plugin, else the source tree) is where `make` ran. libember (and for idx and csv the
# ember-data plugin) are rebuilt instrumented in build-fuzz/ (FUZZ_OUT overrides); the run
# starts from a copy of tests/fuzz/corpus/TARGET/ in build-fuzz/TARGET/corpus/ and writes
# crash reproducers to build-fuzz/TARGET/. A reproducer belongs in tests/fuzz/crashes/TARGET/
# once fixed (`make check` replays those too). The last lines of the log give the number of
# executions ("Done N runs in S second(s)").
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${1:-}
case "$TARGET" in
safetensors) MAXLEN=65536 DICT=$SRC/tests/fuzz/safetensors.dict ;;
config) MAXLEN=8192 DICT=$SRC/tests/fuzz/config.dict ;;
idx) MAXLEN=65536 DICT= ;;
csv) MAXLEN=16384 DICT= ;;
checkpoint) MAXLEN=65536 DICT=$SRC/tests/fuzz/safetensors.dict ;;
onnx) MAXLEN=65536 DICT= ;;
*) echo "usage: tests/fuzz/run.sh safetensors|config|idx|csv|checkpoint|onnx [SECONDS] [BUILD_DIR]" >&2
   exit 2 ;;
esac
SECS=${2:-600}
if [ $# -ge 3 ]; then BUILD=$(cd "$3" && pwd)
elif [ -e "$SRC/build/plugins/backend-cpu/.libs/ember-cpu.so" ]; then BUILD=$SRC/build
else BUILD=$SRC; fi
PLUGIN_DIR=$BUILD/plugins/backend-cpu/.libs
[ -e "$PLUGIN_DIR/ember-cpu.so" ] || { echo "run.sh: no $PLUGIN_DIR/ember-cpu.so: build the tree first (./configure && make)" >&2; exit 1; }
[ -e "$BUILD/config.h" ] || { echo "run.sh: no $BUILD/config.h" >&2; exit 1; }
OUT=${FUZZ_OUT:-$SRC/build-fuzz}
mkdir -p "$OUT/$TARGET/corpus"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CC=${CC:-clang}

# libember, instrumented for coverage and sanitizers, with the build tree's soname so that the
# (uninstrumented) plugins bind to it. Its default plugin directory is the CPU plugin's.
echo "run.sh: building $OUT/libember.so.1"
$CC -g -O1 -fPIC -shared $SAN -fsanitize=fuzzer-no-link -fvisibility=hidden -std=gnu11 \
    -DEM_BUILDING_LIBEMBER -DEM_PLUGIN_DIR="\"$PLUGIN_DIR\"" -DEM_BUILD_DIR="\"$OUT/none\"" \
    -I"$SRC/core/include" -I"$SRC/core" -I"$BUILD" $(pkg-config --cflags jansson yaml-0.1) \
    "$SRC"/core/*.c -o "$OUT/libember.so.1" -Wl,-soname,libember.so.1 \
    -Wl,--version-script="$SRC/core/libember.map" $(pkg-config --libs jansson yaml-0.1) \
    -lm -ldl -lpthread
PLUGINS=
case "$TARGET" in
idx|csv)
    # the ember-data plugin, instrumented too: its readers are what these targets fuzz
    echo "run.sh: building $OUT/ember-data.so"
    $CC -g -O1 -fPIC -shared $SAN -fsanitize=fuzzer-no-link -fvisibility=hidden -std=gnu11 \
        -I"$SRC/core/include" "$SRC"/plugins/data/*.c -o "$OUT/ember-data.so" \
        "$OUT/libember.so.1" -ldeflate -lz -lcsv -lm
    PLUGINS=$OUT/ember-data.so ;;
checkpoint)
    PLUGINS=$BUILD/plugins/layers/.libs/ember-layers.so:$BUILD/plugins/optim/.libs/ember-optim.so ;;
onnx)
    # the ember-onnx plugin, instrumented, with the bindings the build generated
    echo "run.sh: building $OUT/ember-onnx.so"
    $CC -g -O1 -fPIC -shared $SAN -fsanitize=fuzzer-no-link -fvisibility=hidden -std=gnu11 \
        -I"$SRC/core/include" -I"$BUILD/plugins/onnx" "$SRC"/plugins/onnx/*.c \
        "$BUILD/plugins/onnx/onnx.pb-c.c" -o "$OUT/ember-onnx.so" "$OUT/libember.so.1" \
        $(pkg-config --cflags --libs libprotobuf-c) -lm
    PLUGINS=$OUT/ember-onnx.so ;;
esac
echo "run.sh: building $OUT/fuzz_$TARGET"
$CC -g -O1 $SAN -fsanitize=fuzzer -I"$SRC/core/include" "$SRC/tests/fuzz/fuzz_$TARGET.c" \
    -o "$OUT/fuzz_$TARGET" "$OUT/libember.so.1" -Wl,-rpath,"$OUT"

cp "$SRC"/tests/fuzz/corpus/"$TARGET"/* "$OUT/$TARGET/corpus/"
cd "$OUT/$TARGET"
echo "run.sh: fuzzing $TARGET for $SECS s"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} EMBER_LOG=error EMBER_PLUGIN_PATH=$PLUGINS \
    "$OUT/fuzz_$TARGET" -max_total_time="$SECS" -max_len="$MAXLEN" -timeout=10 \
        -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$OUT/$TARGET/" \
        ${DICT:+-dict="$DICT"} corpus

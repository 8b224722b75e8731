#!/bin/sh
# ember-train's per-step overhead over the same training loop written by hand.
#
#     bench/trainer_overhead.sh [STEPS [RUNS [CONFIG...]]]      # from the build tree, after make
#
# For each CONFIG (default: examples/digits.yaml, and examples/fashion-mnist-mlp.yaml when
# /usr/share/datasets/fashion-mnist is installed), RUNS times, alternating which goes first:
#   bench/trainer_overhead CONFIG STEPS W1      the seeds' loop by hand (bench/trainer_overhead.c)
#   trainer/ember-train CONFIG --max-steps STEPS --save-weights W2
# both with bench/.libs/steptimes.so preloaded, which timestamps every em_optimizer_step. Per
# run: the median of the step-to-step intervals of steps 10..STEPS (the first steps warm caches
# and allocators up). Overhead = trainer median / by-hand median - 1, per pair of runs; the
# script prints each pair, then the median, min and max, and checks that W1 and W2 are
# byte-identical (the two trained the same model on the same batches).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
steps=${1:-300}
runs=${2:-5}
[ $# -ge 2 ] && shift 2 || shift $#
if [ $# -eq 0 ]; then
    set -- "$src/examples/digits.yaml"
    [ -d /usr/share/datasets/fashion-mnist ] && set -- "$@" "$src/examples/fashion-mnist-mlp.yaml"
fi
shim=$(pwd)/bench/.libs/steptimes.so
[ -f "$shim" ] || { echo "run from the build tree after make ($shim missing)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# median step interval in microseconds, steps 10..N, from a file of step-end nanoseconds
median_us() {
    awk 'NR >= 10 { print $1 - prev } { prev = $1 }' "$1" | sort -n |
        awk '{ a[NR] = $1 } END { if (!NR) exit 1;
              m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.1f", m / 1000 }'
}

run_bare() {
    EMBER_STEP_TIMES="$tmp/bare" LD_PRELOAD="$shim" bench/trainer_overhead "$1" "$steps" \
        "$tmp/bare.safetensors" >/dev/null 2>"$tmp/bare.err" || { cat "$tmp/bare.err" >&2; exit 1; }
}
run_trainer() {
    EMBER_STEP_TIMES="$tmp/trainer" LD_PRELOAD="$shim" trainer/ember-train "$1" --max-steps \
        "$steps" --save-weights "$tmp/trainer.safetensors" >/dev/null 2>"$tmp/trainer.err" ||
        { cat "$tmp/trainer.err" >&2; exit 1; }
}

echo "ember-train over the loop by hand: median step time of steps 10..$steps, $runs runs each"
echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores;" \
     "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for config in "$@"; do
    echo
    echo "config: $config"
    printf '%-5s %12s %12s %10s\n' run by_hand_us trainer_us overhead
    : >"$tmp/overheads"
    i=1
    while [ "$i" -le "$runs" ]; do
        if [ $((i % 2)) -eq 1 ]; then run_bare "$config"; run_trainer "$config"
        else run_trainer "$config"; run_bare "$config"; fi
        b=$(median_us "$tmp/bare")
        t=$(median_us "$tmp/trainer")
        o=$(awk -v b="$b" -v t="$t" 'BEGIN { printf "%+.2f", 100 * (t / b - 1) }')
        echo "$o" >>"$tmp/overheads"
        printf '%-5s %12s %12s %9s%%\n' "$i" "$b" "$t" "$o"
        if ! cmp -s "$tmp/bare.safetensors" "$tmp/trainer.safetensors"; then
            echo "the weights after $steps steps differ: the two did not train the same thing" >&2
            exit 1
        fi
        i=$((i + 1))
    done
    sort -n "$tmp/overheads" | awk '{ a[NR] = $1 } END {
        m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        printf "overhead: median %+.2f%%, min %+.2f%%, max %+.2f%%; weights after the steps: identical\n", m, a[1], a[NR] }'
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

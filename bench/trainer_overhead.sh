#!/bin/sh
# ember-train's per-step overhead over the same training loop written by hand.
#
#     bench/trainer_overhead.sh [STEPS [RUNS [CONFIG...]]]      # from the build tree, after make
#
# For each CONFIG (default: examples/digits.yaml, and examples/fashion-mnist-mlp.yaml when
# /usr/share/datasets/fashion-mnist is installed), RUNS times, alternating which goes first:
#   bench/trainer_overhead CONFIG STEPS W1      the seeds' loop by hand (bench/trainer_overhead.c)
#   trainer/ember-train CONFIG --max-steps STEPS --save-weights W2
# both with bench/.libs/steptimes.so preloaded, which timestamps the end of every
# em_optimizer_step with two clocks: wall time and the main thread's CPU time. Per run and per
# clock: the median of the step-to-step intervals of steps 10..STEPS (the first steps warm
# caches and allocators up). Overhead = trainer median / by-hand median - 1, per pair of runs;
# the script prints each pair, then the median, min and max over the pairs, and checks that W1
# and W2 are byte-identical (the two trained the same model on the same batches).
#
# Wall time is what a user waits for, but other processes on the machine inflate it at random;
# the main thread's CPU time is not inflated by them and, with EMBER_NUM_THREADS=1 and a config
# without loader workers, counts all of a step's work. The environment is passed on as it is.
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

# median step interval in microseconds, steps 10..N, of column $2 of the shim's file $1
median_us() {
    awk -v c="$2" 'NR >= 10 { print $c - prev } { prev = $c }' "$1" | sort -n |
        awk '{ a[NR] = $1 } END { if (!NR) exit 1;
              m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.1f", m / 1000 }'
}
pct() { awk -v b="$1" -v t="$2" 'BEGIN { printf "%.2f", 100 * (t / b - 1) }'; }
summary() {
    sort -n "$1" | awk -v what="$2" '{ a[NR] = $1 } END {
        m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        printf "overhead, %s: median %+.2f%%, min %+.2f%%, max %+.2f%%\n", what, m, a[1], a[NR] }'
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
echo "cpu: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) cores," \
     "EMBER_NUM_THREADS=${EMBER_NUM_THREADS:-(unset)}; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for config in "$@"; do
    echo
    echo "config: $config"
    printf '%-4s %13s %13s %9s   %13s %13s %9s\n' run wall_hand_us wall_train_us overhead \
        cpu_hand_us cpu_train_us overhead
    : >"$tmp/wall"
    : >"$tmp/cpu"
    i=1
    while [ "$i" -le "$runs" ]; do
        if [ $((i % 2)) -eq 1 ]; then run_bare "$config"; run_trainer "$config"
        else run_trainer "$config"; run_bare "$config"; fi
        bw=$(median_us "$tmp/bare" 1); tw=$(median_us "$tmp/trainer" 1)
        bc=$(median_us "$tmp/bare" 2); tc=$(median_us "$tmp/trainer" 2)
        ow=$(pct "$bw" "$tw"); oc=$(pct "$bc" "$tc")
        echo "$ow" >>"$tmp/wall"
        echo "$oc" >>"$tmp/cpu"
        printf '%-4s %13s %13s %+8.2f%%   %13s %13s %+8.2f%%\n' "$i" "$bw" "$tw" "$ow" "$bc" "$tc" "$oc"
        if ! cmp -s "$tmp/bare.safetensors" "$tmp/trainer.safetensors"; then
            echo "the weights after $steps steps differ: the two did not train the same thing" >&2
            exit 1
        fi
        i=$((i + 1))
    done
    summary "$tmp/wall" "wall time"
    summary "$tmp/cpu" "main thread's CPU time"
    echo "weights after $steps steps: byte-identical in every run"
done
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

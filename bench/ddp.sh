#!/bin/sh
# bench/ddp.sh — data-parallel scaling on this machine: for the MLP and the CNN of bench/ddp.c,
# one plain process with one thread against `mpirun -np 2` with one thread per rank, at the
# same per-rank batch, REPS times interleaved; prints each run's line, then a table of the
# medians: throughput, scaling efficiency (2-rank throughput over twice the 1-process
# throughput), allreduce time per step, the share of it hidden behind backward (from the
# bucket timestamps), and how long em_ddp_wait blocked. Run from the build directory:
#   ../bench/ddp.sh [reps [steps [batch]]]        (default 3 20 64: about 2 minutes)
# The CNN's gradients (0.6 MB) fit into the first bucket at the default sizes (1 MiB, then
# 25 MiB), so its one allreduce starts when backward ends; the table also runs it with
# buckets of 0.25 MiB (--bucket-mib 0.25: the Linear layer's gradient, then the convolutions'),
# with ember-mpi's progress thread and without it (EMBER_MPI_NO_PROGRESS_THREAD=1: MPI then
# progresses only at the post-accumulation hooks and in the wait).
set -eu
reps=${1:-3}
steps=${2:-20}
batch=${3:-64}
# (Open MPI picks its shared-memory copy mechanism; where ptrace is refused, in some
# containers, export OMPI_MCA_btl_vader_single_copy_mechanism=none first)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 EMBER_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "bench/ddp.sh: $(getconf _NPROCESSORS_ONLN) cores, load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
two() { mpirun --oversubscribe --bind-to core -np 2 "$@"; }
# name|label|command (run by sh -c)
configs="mlp.1|mlp|./bench/ddp mlp --plain --steps $steps --batch $batch
mlp.2|mlp, default buckets (25 MiB, the first 1 MiB)|two ./bench/ddp mlp --steps $steps --batch $batch
cnn.1|cnn|./bench/ddp cnn --plain --steps $steps --batch $batch
cnn.2|cnn, default buckets (25 MiB, the first 1 MiB)|two ./bench/ddp cnn --steps $steps --batch $batch
cnn.2s|cnn, --bucket-mib 0.25|two ./bench/ddp cnn --steps $steps --batch $batch --bucket-mib 0.25
cnn.2n|cnn, --bucket-mib 0.25, no progress thread|two -x EMBER_MPI_NO_PROGRESS_THREAD=1 ./bench/ddp cnn --steps $steps --batch $batch --bucket-mib 0.25"
r=1
while [ "$r" -le "$reps" ]; do
    echo "$configs" | while IFS='|' read -r name label cmd; do
        line=$(eval "$cmd" </dev/null) # (mpirun reads stdin: not the config list)
        echo "[$r] $line"
        echo "$line" >>"$tmp/$name"
    done
    r=$((r + 1))
done
# the median of field F (a sed expression's capture) over a config's lines
med() { # NAME SED-EXPR
    sed -n "s/$2/\1/p" "$tmp/$1" | sort -g | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "" }'
}
tput='.* \([0-9.]*\) samples\/s.*'
echo
echo "medians of $reps runs, $steps timed steps each, batch $batch per rank; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| workload | buckets | 1 process, samples/s | 2 ranks, samples/s | scaling efficiency | allreduce, ms/step | hidden behind backward | wait blocked, ms/step |"
echo "|---|---|---|---|---|---|---|---|"
echo "$configs" | while IFS='|' read -r name label cmd; do
    case $name in *.1) continue ;; esac
    one=$(med "${name%%.*}.1" "$tput")
    b=$(med "$name" "$tput")
    nb=$(med "$name" '.*, \([0-9]*\) buckets,.*')
    ar=$(med "$name" '.*allreduce \([0-9.]*\) ms\/step.*')
    hid=$(med "$name" '.*, \([0-9]*\)% hidden.*')
    blk=$(med "$name" '.*wait blocked \([0-9.]*\) ms\/step.*')
    awk -v l="$label" -v a="$one" -v b="$b" -v nb="$nb" -v ar="$ar" -v h="$hid" -v w="$blk" \
        'BEGIN { printf "| %s | %d | %.0f | %.0f | %.2f | %.2f | %d%% | %.2f |\n", l, nb, a, b, b / (2 * a), ar, h, w }'
done

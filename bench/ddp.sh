#!/bin/sh
# bench/ddp.sh — data-parallel scaling on this machine: for the MLP and the CNN, one plain
# process with one thread against `mpirun -np 2` with one thread per rank, at the same
# per-rank batch; prints each run's line (bench/ddp.c) and the scaling efficiency
# (2-rank throughput over twice the 1-process throughput). Run from the build directory.
#   bench/ddp.sh [steps [batch]]
set -eu
# (Open MPI picks its shared-memory copy mechanism; where ptrace is refused, in some
# containers, export OMPI_MCA_btl_vader_single_copy_mechanism=none first)
steps=${1:-20}
batch=${2:-64}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 EMBER_NUM_THREADS=1
for model in mlp cnn; do
    one=$(./bench/ddp $model --plain --steps "$steps" --batch "$batch")
    two=$(mpirun --oversubscribe --bind-to core -np 2 ./bench/ddp $model --steps "$steps" --batch "$batch")
    echo "$one"
    echo "$two"
    a=$(echo "$one" | sed -n 's/.* \([0-9]*\) samples\/s.*/\1/p')
    b=$(echo "$two" | sed -n 's/.* \([0-9]*\) samples\/s.*/\1/p')
    awk -v a="$a" -v b="$b" -v m="$model" 'BEGIN { printf "%s: scaling efficiency %.2f (2 ranks %d samples/s, 1 process %d)\n", m, b / (2 * a), b, a }'
done

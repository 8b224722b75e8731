#!/bin/sh
# tests/test_ddp.sh — data-parallel training on Open MPI (ember-mpi.so, ember/ddp.h), on this
# machine, through tests/ddp_driver (see its header for what each mode does):
#   - the collectives against plain loops on 2 and 3 ranks; em_init loads no MPI library; an
#     error inside MPI names the collective, the rank and MPI's message;
#   - 2 and 3 ranks x 30 steps: the MLP and the CNN without batch norm hold bitwise-identical
#     weights on every rank, allclose(1e-5, 1e-6) to one process on the concatenated batch;
#     the CNN with BatchNorm2d: identical on every rank, allclose to one process normalising
#     each rank's slice on its own; with SyncBatchNorm: allclose to the plain large batch;
#   - 2 micro-batches with no_sync across 2 ranks = one process accumulating 2 micro-batches;
#   - buckets of 1 KiB, 1 MiB and 25 MiB give the same weights;
#   - faults: a rank that stops itself (SIGSTOP) is named by the others, which exit non-zero
#     within the timeout; a rank killed with SIGKILL ends the job non-zero; a wider layer on
#     one rank is an error at wrap naming the parameter; an unused parameter is an error
#     naming it, and allowed with find_unused_parameters.
# Open MPI runs as root only when told (CI is root), and with more ranks than cores only with
# --oversubscribe. Run from the build directory (make check does).
set -u
drv=./tests/ddp_driver
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one thread per rank (the ranks share the cores); shared memory without ptrace-based copies
# (refused in containers)
export OMP_NUM_THREADS=1 EMBER_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=${MPIRUN:-mpirun}
# Under AddressSanitizer (scripts/test.sh's stage, with tests/lsan-mpi.supp): LeakSanitizer's
# fast unwinder stops at Open MPI's frames (built without frame pointers), so the
# suppressions, which match Open MPI's libraries by name, would not see them: unwind fully.
# That makes every MPI process start seconds slower, so that stage runs every code path once,
# on 2 ranks, and leaves to the plain stage the runs that repeat a path: the 3-rank half of
# the matrix (collectives and training), the 1 MiB and 25 MiB buckets (this CNN's 0.5 MB of
# gradients make one bucket at both, as at the default size the other runs use), and the
# driver's accumulation run (tests/test_ddp_train.sh's --accum-steps runs take no_sync there).
ranks="2 3" asan=false
if ldd ./tests/.libs/ddp_driver 2>/dev/null | grep -q libasan; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
    ranks=2 asan=true
fi
fail=0
bad() { echo "FAIL: $*"; fail=1; }
mpi() { np=$1; shift; timeout 120 "$MPIRUN" --oversubscribe --bind-to none -np "$np" "$@"; }

"$drv" noinit || bad "em_init loaded MPI"
for n in $ranks; do
    mpi $n "$drv" comm >"$tmp/comm$n.log" 2>&1 || { cat "$tmp/comm$n.log"; bad "collectives on $n ranks"; }
done

# an error inside MPI (rank 0 broadcasts more than the others expect) comes back as Ember's
mpi 2 "$drv" commerr >"$tmp/commerr.log" 2>&1 && bad "a truncated broadcast: exit 0"
grep -q "broadcast #0 (8 float32) on rank 1 of 2: MPI: MPI_ERR_TRUNCATE" "$tmp/commerr.log" ||
    { cat "$tmp/commerr.log"; bad "MPI's error is not named with the collective and the rank"; }

# The training runs of each rank count go into one mpirun (tests/ddp_driver's "+": MPI starts
# once), the references into one process; the driver fails unless every rank holds rank 0's
# bits, and each comparison against the reference is allclose.
close() { "$drv" compare "$1" "$2" close || bad "$3"; }
last=${ranks##* }
for n in $ranks; do
    t=$tmp/r$n
    runs="mlp $t.mlp + cnn $t.cnn + cnnbn $t.cnnbn + cnnbn $t.sbn --sync-bn"
    r=.ref.safetensors
    refs="mlp $t.mlp$r --ranks $n + cnn $t.cnn$r --ranks $n + cnnbn $t.cnnbn$r --ranks $n --per-slice + cnnbn $t.sbn$r --ranks $n"
    # a parameter no forward uses, allowed with find_unused_parameters (the error without it:
    # below)
    [ "$n" = 2 ] && runs="$runs + mlp $t.unok --unused --find-unused --steps 3"
    # accumulation: no_sync on the first of 2 micro-batches
    if [ "$n" = 2 ] && ! $asan; then
        runs="$runs + mlp $t.acc --accum 2"
        refs="$refs + mlp $t.acc$r --ranks 2 --accum 2"
    fi
    # bucket sizes (the cnn has a 1440-float layer: 1 KiB splits it from the rest)
    kibs=""
    if [ "$n" = "$last" ]; then
        kibs="1 1024 25600"
        $asan && kibs=1
        for kib in $kibs; do runs="$runs + cnn $t.cnnb$kib --bucket-kib $kib"; done
    fi
    # shellcheck disable=SC2086 # the run lists split into words
    mpi "$n" "$drv" train $runs >"$t.log" 2>&1 ||
        { cat "$t.log"; bad "training on $n ranks failed (or the ranks differ)"; continue; }
    # shellcheck disable=SC2086
    "$drv" single $refs || { bad "the single-process references of $n ranks failed"; continue; }
    for model in mlp cnn; do
        close "$t.$model.rank0.safetensors" "$t.$model.ref.safetensors" \
            "$model on $n ranks != one process on the concatenated batch"
    done
    # BatchNorm: each rank's slice normalised on its own; SyncBatchNorm: the whole batch
    close "$t.cnnbn.rank0.safetensors" "$t.cnnbn.ref.safetensors" \
        "cnn with BatchNorm on $n ranks != one process normalising each slice"
    close "$t.sbn.rank0.safetensors" "$t.sbn.ref.safetensors" \
        "cnn with SyncBatchNorm on $n ranks != one process on the concatenated batch"
    # SyncBatchNorm must differ from per-slice BatchNorm (or the test above proves nothing)
    "$drv" compare "$t.sbn.rank0.safetensors" "$t.cnnbn.rank0.safetensors" close \
        >/dev/null 2>&1 && bad "SyncBatchNorm gave the same weights as per-rank BatchNorm on $n ranks"
    case $runs in *"$t.acc "*)
        close "$t.acc.rank0.safetensors" "$t.acc.ref.safetensors" \
            "2-rank accumulation over 2 micro-batches != one process accumulating" ;;
    esac
    for kib in $kibs; do
        "$drv" compare "$t.cnnb$kib.rank0.safetensors" "$t.cnn.rank0.safetensors" exact \
            >/dev/null || bad "buckets of $kib KiB give other weights than the default"
    done
done
n=$last

# faults. A rank that stops: the others name it and leave, within the timeout.
start=$(date +%s)
mpi "$n" "$drv" train mlp "$tmp/stall" --steps 1000 --timeout 4 --stall 1:3 >"$tmp/stall.log" 2>&1 &&
    bad "a stalled rank: the job exited 0"
took=$(($(date +%s) - start))
grep -q "rank 1 is stalled" "$tmp/stall.log" || { cat "$tmp/stall.log"; bad "the stalled rank is not named"; }
grep -q "allreduce #" "$tmp/stall.log" || bad "the stalled collective is not named"
[ "$took" -le 40 ] || bad "the stall took $took s to be reported (timeout 4 s)"
# A rank killed: the job ends non-zero.
start=$(date +%s)
mpi 2 "$drv" train mlp "$tmp/kill" --steps 1000 --timeout 4 --kill 1:3 >"$tmp/kill.log" 2>&1 &&
    bad "a killed rank: the job exited 0"
took=$(($(date +%s) - start))
[ "$took" -le 40 ] || bad "the killed rank took $took s to end the job"
# Different models: an error at wrap naming the parameter on each side.
mpi 2 "$drv" train mlp "$tmp/mm" --mismatch 1 >"$tmp/mm.log" 2>&1 && bad "mismatched models: exit 0"
grep -q "ddp_wrap.*rank 0 has parameter '0.weight' \[16, 32\].*where rank 1 has parameter '0.weight' \[17, 32\]" \
    "$tmp/mm.log" || { cat "$tmp/mm.log"; bad "the mismatch is not named at wrap"; }
# A parameter no forward uses: named, unless allowed.
mpi 2 "$drv" train mlp "$tmp/un" --unused --steps 2 >"$tmp/un.log" 2>&1 && bad "unused parameter: exit 0"
grep -q "parameter 'extra' received no gradient" "$tmp/un.log" || { cat "$tmp/un.log"; bad "the unused parameter is not named"; }
exit $fail

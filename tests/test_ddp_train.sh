#!/bin/sh
# tests/test_ddp_train.sh — `mpirun -np N ember-train CONFIG`: data-parallel training through
# the trainer (trainer/ddp.c, docs/distributed.md "The trainer"), on the bundled digits with a
# small MLP, against single-process runs of the same config:
#   - 2 ranks x 30 steps at batch B = one process at batch 2B (allclose(1e-5, 1e-6)). Exact in
#     data: rank r's batch k holds the items at positions (kB + j) * 2 + r of the epoch's
#     permutation, so the two ranks' batch k together are positions [2kB, 2kB + 2B), the one
#     process's batch k (30 steps stay within the first epoch, away from its padded end);
#   - buckets of 1 KiB give the bits of the default 25 MiB; --sync-batchnorm = one process at
#     twice the batch (and per-rank BatchNorm is not);
#   - --accum-steps 2 on 2 ranks = one process with --accum-steps 2 at twice the batch;
#   - the validation and test figures of 2 and 3 ranks (151 and 297 samples: shards padded
#     with repeated samples) = the single process's, every sample counted once;
#   - with Dropout: 2 ranks trained 24 steps straight = 18 steps, a checkpoint, and a resume
#     to 24, bit for bit (crossing an epoch's end; each rank's dropout stream is its own, so
#     this fails unless every rank gets its own state back); a resume on 3 ranks is refused;
#   - rank 0 alone prints progress and writes files; ranks with different options, or more
#     ranks than training samples, are errors before the first step.
# Open MPI runs as root only when told (CI is root), and with more ranks than cores only with
# --oversubscribe. Run from the build directory (make check does).
set -u
train=./trainer/ember-train
cmp=./tests/ddp_driver
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 EMBER_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=${MPIRUN:-mpirun}
# Under AddressSanitizer (scripts/test.sh's stage, with tests/lsan-mpi.supp): LeakSanitizer's
# fast unwinder stops at Open MPI's frames (built without frame pointers), so the suppressions,
# which match Open MPI's libraries by name, would not see them: unwind fully (as test_ddp.sh).
# Every MPI process then starts (and leaves: the leak check) seconds slower, so that stage
# leaves to the plain one the runs that take no code path the others do not: the 3-rank
# evaluation (the 2-rank one pads too) and resume (the 1-process one is refused by the same
# check), 1 KiB buckets and --sync-batchnorm (the option is passed on to what
# tests/test_ddp.sh runs there: several buckets, the conversion to SyncBatchNorm), and the
# runs that only show a comparison can fail (per-rank BatchNorm, no dropout).
asan=false
if ldd ./trainer/.libs/ember-train 2>/dev/null | grep -q libasan; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
    asan=true
fi
srcdir=$(cd "${srcdir:-..}" && pwd) || exit 99 # the config is in $tmp: an absolute path
fail=0
bad() { echo "FAIL: $*"; fail=1; }
mpi() { np=$1; shift; timeout 120 "$MPIRUN" --oversubscribe --bind-to none -np "$np" "$@"; }
one() { timeout 120 "$train" "$@"; }

# the MLP on the digits: 1349 training samples (an odd count), 151 for validation, 297 test
cat >"$tmp/mlp.yaml" <<EOF
model:
  - Flatten
  - Linear: {in_features: 64, out_features: 32}
  - ReLU
  - Linear: {in_features: 32, out_features: 10}
data:
  class: mnist
  options: {path: $srcdir/data/digits}
  validation: 151
  test: {split: test}
optimizer: {class: SGD, lr: 0.05, momentum: 0.9}
loop: {epochs: 1, batch_size: 16, seed: 3}
EOF
sed 's/^  - ReLU$/  - ReLU\n  - Dropout: {p: 0.3}/' "$tmp/mlp.yaml" >"$tmp/drop.yaml"
grep -q Dropout "$tmp/drop.yaml" || { echo "sed did not add the Dropout"; exit 99; }

run_ok() { # LOG command...: runs it, shows the log when it fails
    log=$1
    shift
    "$@" >"$log" 2>&1 || { cat "$log"; return 1; }
}

# ---- 2 ranks x 30 steps = one process at twice the batch ------------------------------------
run_ok "$tmp/d2.log" mpi 2 "$train" "$tmp/mlp.yaml" --max-steps 30 --save-weights "$tmp/d2.st" \
    --metrics "$tmp/d2.csv" --log-every 10 || bad "2 ranks: training failed"
run_ok "$tmp/s.log" one "$tmp/mlp.yaml" --max-steps 30 --batch-size 32 \
    --save-weights "$tmp/s.st" --metrics "$tmp/s.csv" || bad "one process: training failed"
"$cmp" compare "$tmp/d2.st" "$tmp/s.st" close || bad "2 ranks x 16 != one process x 32"
# the batch matters (or the comparison above proves nothing)
run_ok "$tmp/s16.log" one "$tmp/mlp.yaml" --max-steps 30 --save-weights "$tmp/s16.st" ||
    bad "one process x 16 failed"
"$cmp" compare "$tmp/d2.st" "$tmp/s16.st" close >/dev/null 2>&1 &&
    bad "2 ranks x 16 gave the weights of one process x 16"
# rank 0 alone speaks: one summary, one epoch line, progress every 10 steps (3 lines)
[ "$(grep -c 'steps in' "$tmp/d2.log")" = 1 ] || { cat "$tmp/d2.log"; bad "not one summary"; }
[ "$(grep -c '^epoch 1/1 (partial): train loss' "$tmp/d2.log")" = 1 ] || bad "not one epoch line"
[ "$(grep -c '^epoch 1/1 \[.*\] step' "$tmp/d2.log")" = 3 ] || bad "not 3 progress lines"
grep -q 'data-parallel on 2 ranks' "$tmp/d2.log" || bad "the run does not say it is data-parallel"
# the figures: train loss averaged over the ranks, validation and test over every sample
close_num() { # A B WHAT
    awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
                                     exit !(a != "" && d <= 1e-6 + 1e-5 * m) }' ||
        bad "$3: $1 against $2"
}
col() { # FILE NAME: the value of column NAME in the CSV's last row
    awk -F, -v n="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == n) c = i }
                       END { print $c }' "$1"
}
for c in train_loss train_accuracy val_loss val_accuracy test_loss test_accuracy; do
    close_num "$(col "$tmp/d2.csv" $c)" "$(col "$tmp/s.csv" $c)" "2 ranks' $c in --metrics"
done

grep -q 'in 1 bucket (--ddp-bucket-mib 25)' "$tmp/d2.log" || bad "not 1 bucket by default"
if ! $asan; then
    # buckets of 1 KiB (2 of them here) give the bits of the default (one of 25 MiB)
    run_ok "$tmp/bk.log" mpi 2 "$train" "$tmp/mlp.yaml" --max-steps 30 --save-weights "$tmp/bk.st" \
        --ddp-bucket-mib 0.0009765625 || bad "2 ranks, 1 KiB buckets: training failed"
    grep -q 'in 2 buckets (--ddp-bucket-mib 0.000976562)' "$tmp/bk.log" || bad "not 2 buckets of 1 KiB"
    "$cmp" compare "$tmp/bk.st" "$tmp/d2.st" exact || bad "1 KiB buckets change the weights"

    # --sync-batchnorm: BatchNorm over both ranks' batches = one process at twice the batch;
    # without it each rank normalises its own, which is not
    sed 's/^  - ReLU$/  - BatchNorm1d: {num_features: 32}\n  - ReLU/' "$tmp/mlp.yaml" >"$tmp/bn.yaml"
    run_ok "$tmp/sbn.log" mpi 2 "$train" "$tmp/bn.yaml" --max-steps 30 --sync-batchnorm \
        --save-weights "$tmp/sbn.st" || bad "2 ranks, --sync-batchnorm: training failed"
    grep -q '1 BatchNorm layer now SyncBatchNorm' "$tmp/sbn.log" || bad "no layer converted"
    run_ok "$tmp/bn1.log" one "$tmp/bn.yaml" --max-steps 30 --batch-size 32 \
        --save-weights "$tmp/bn1.st" || bad "one process, BatchNorm: training failed"
    "$cmp" compare "$tmp/sbn.st" "$tmp/bn1.st" close || bad "--sync-batchnorm != one process x 32"
    run_ok "$tmp/pbn.log" mpi 2 "$train" "$tmp/bn.yaml" --max-steps 30 --save-weights "$tmp/pbn.st" ||
        bad "2 ranks, BatchNorm: training failed"
    "$cmp" compare "$tmp/pbn.st" "$tmp/bn1.st" close >/dev/null 2>&1 &&
        bad "per-rank BatchNorm gave the weights of the large batch"
fi

# ---- --accum-steps 2 ---------------------------------------------------------------------------
run_ok "$tmp/da.log" mpi 2 "$train" "$tmp/mlp.yaml" --max-steps 30 --batch-size 8 \
    --accum-steps 2 --save-weights "$tmp/da.st" || bad "2 ranks, accumulation: training failed"
run_ok "$tmp/sa.log" one "$tmp/mlp.yaml" --max-steps 30 --batch-size 16 --accum-steps 2 \
    --save-weights "$tmp/sa.st" || bad "one process, accumulation: training failed"
"$cmp" compare "$tmp/da.st" "$tmp/sa.st" close ||
    bad "2 ranks x 8 x 2 micro-batches != one process x 16 x 2 micro-batches"

# ---- evaluation: each sample once, whatever the padding -----------------------------------------
run_ok "$tmp/e1.log" one "$tmp/mlp.yaml" --eval-only --init-weights "$tmp/s.st" \
    --eval-batch-size 7 || bad "one process: --eval-only failed"
eranks="2 3"
$asan && eranks=2
for n in $eranks; do
    run_ok "$tmp/e$n.log" mpi $n "$train" "$tmp/mlp.yaml" --eval-only \
        --init-weights "$tmp/s.st" --eval-batch-size 7 || { bad "$n ranks: --eval-only failed"; continue; }
    for set in validation test; do
        a=$(grep "^$set:" "$tmp/e$n.log")
        b=$(grep "^$set:" "$tmp/e1.log")
        # "validation: loss L accuracy A% (N samples)": A and N exactly, L allclose
        [ "$(echo "$a" | cut -d' ' -f4-)" = "$(echo "$b" | cut -d' ' -f4-)" ] ||
            bad "$n ranks, $set: '$a' against '$b'"
        close_num "$(echo "$a" | cut -d' ' -f3)" "$(echo "$b" | cut -d' ' -f3)" "$n ranks, $set loss"
    done
    [ "$(grep -c '^validation:' "$tmp/e$n.log")" = 1 ] || bad "$n ranks: not one validation line"
done
for n in $eranks; do # 151 samples: shards padded to 76 x 2 and 51 x 3
    grep -q '(151 samples)' "$tmp/e$n.log" || bad "$n ranks: the validation padding was counted"
done

# ---- resume with dropout: bit for bit ----------------------------------------------------------
# 2 epochs of 12 steps; the checkpoint after step 18 is mid-way through the second
opts="--epochs 2 --limit-batches 12"
run_ok "$tmp/r0.log" mpi 2 "$train" "$tmp/drop.yaml" $opts --save-weights "$tmp/straight.st" ||
    bad "dropout, 2 ranks: training failed"
run_ok "$tmp/r1.log" mpi 2 "$train" "$tmp/drop.yaml" $opts --max-steps 18 \
    --checkpoint "$tmp/ck-{step}.st" || bad "dropout, 2 ranks: the first half failed"
[ -f "$tmp/ck-18.st" ] && [ -f "$tmp/ck-12.st" ] || bad "the checkpoints of steps 12 and 18 are missing"
run_ok "$tmp/r2.log" mpi 2 "$train" "$tmp/drop.yaml" $opts --resume "$tmp/ck-{step}.st" \
    --save-weights "$tmp/resumed.st" || bad "dropout, 2 ranks: the resume failed"
grep -q "resumed from $tmp/ck-18.st" "$tmp/r2.log" || bad "the resume did not take step 18"
"$cmp" compare "$tmp/straight.st" "$tmp/resumed.st" exact ||
    bad "2 ranks with dropout: resumed != straight"
if ! $asan; then
    # dropout on: the weights are not those of the run without it
    run_ok "$tmp/r3.log" mpi 2 "$train" "$tmp/mlp.yaml" $opts --save-weights "$tmp/nodrop.st" ||
        bad "2 ranks without dropout failed"
    "$cmp" compare "$tmp/straight.st" "$tmp/nodrop.st" close >/dev/null 2>&1 &&
        bad "Dropout made no difference"
    mpi 3 "$train" "$tmp/drop.yaml" $opts --resume "$tmp/ck-18.st" >"$tmp/r4.log" 2>&1 &&
        bad "a 2-rank checkpoint resumed on 3 ranks"
    grep -q "was written by a run on 2 processes and this run has 3: resume it with the same number (mpirun -np 2)" \
        "$tmp/r4.log" || { cat "$tmp/r4.log"; bad "the 3-rank resume is not refused with its reason"; }
fi
one "$tmp/drop.yaml" $opts --resume "$tmp/ck-18.st" >"$tmp/r5.log" 2>&1 &&
    bad "a 2-rank checkpoint resumed in one process"
grep -q "this run has 1" "$tmp/r5.log" || { cat "$tmp/r5.log"; bad "the 1-process resume is not refused"; }

# ---- bad input, before the first step ------------------------------------------------------------
timeout 120 "$MPIRUN" --oversubscribe --bind-to none -np 1 "$train" "$tmp/mlp.yaml" --max-steps 3 \
    : -np 1 "$train" "$tmp/mlp.yaml" --max-steps 3 --batch-size 8 >"$tmp/b1.log" 2>&1 &&
    bad "ranks with different --batch-size: exit 0"
grep -q "rank 1's --batch-size (loop.batch_size) is 8 where rank 0's is 16" "$tmp/b1.log" ||
    { cat "$tmp/b1.log"; bad "different --batch-size is not named"; }
grep -q "steps in" "$tmp/b1.log" && bad "different --batch-size: a step ran"
sed 's/validation: 151/validation: 1499/' "$tmp/mlp.yaml" >"$tmp/one.yaml"
mpi 2 "$train" "$tmp/one.yaml" --max-steps 3 >"$tmp/b2.log" 2>&1 && bad "2 ranks on 1 sample: exit 0"
grep -q "2 ranks but the training set holds 1 sample:" "$tmp/b2.log" ||
    { cat "$tmp/b2.log"; bad "more ranks than samples is not said"; }
exit $fail

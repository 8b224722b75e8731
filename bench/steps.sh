#!/bin/sh
# bench/steps.sh — the training-step table a developer prints before and after a change
# (issue 27): every training step of bench/compare-pytorch.py (MLP, CNN, CNN bf16, LSTM,
# Transformer) against each PyTorch in its fastest configuration, with each step's median,
# mean/median single step, fraction of the FMA ceiling measured in the same run
# (bench/fma_peak) and ratio to its floor (bench/step_floor: its GEMMs and convolutions timed
# alone at the best library for each shape).
#
#   bench/steps.sh [--baseline BUILD_DIR] [--cpu-time] [--threads N] [repetitions [workload...]]
#                                                                    default 5, all steps
#
# Run it from the build tree after `make`. --baseline runs another build tree's
# bench/train_step interleaved in the same run (the "before" build: the table gains its
# medians and this build's over them). --cpu-time and --threads are compare-pytorch.py's:
# CPU time per step instead of wall time (no FMA ceiling then; the floor in CPU time too),
# both sides' threads. PYTHON=none leaves PyTorch out (faster); PYTHON=...
# picks the interpreters (colon-separated; default /usr/bin/python3 and
# ~/torchenv/bin/python). Results and commands: bench/README.md, "Training steps against the
# machine's limit".
here=$(dirname "$0")
baseline= cpu= threads=
while :; do
    case "$1" in
    --baseline) baseline="--baseline=$2"; shift 2 ;;
    --baseline=*) baseline="$1"; shift ;;
    --threads) threads="--threads=$2"; shift 2 ;;
    --threads=*) threads="$1"; shift ;;
    --cpu-time) cpu=--cpu-time; shift ;;
    *) break ;;
    esac
done
reps=${1:-5}
[ $# -gt 0 ] && shift
[ $# -eq 0 ] && set -- train_mlp_b128 train_cnn_b64 train_cnn_b64_blocked train_cnn_b64_bf16 \
    train_lstm_h256 train_transformer_b32
set -- "$reps" "$@"
[ -n "$threads" ] && set -- "$threads" "$@"
[ -n "$cpu" ] && set -- "$cpu" "$@"
[ -n "$baseline" ] && set -- "$baseline" "$@"
exec "$here/compare-pytorch.py" "$@"

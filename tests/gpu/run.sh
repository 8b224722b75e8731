#!/usr/bin/env bash
# tests/gpu/run.sh — run the GPU harness on the GPU machine, from the repository root of the
# work tree that the device tool copied there, with gpu-bundle/ (tests/gpu/pack.sh) carried:
#
#   tests/gpu/run.sh [--device DEV] [SUITE...]
#       SUITE: ops train determinism memory nccl bench amp capture (default: all)
#
# It unpacks gpu-bundle/ember-gpu.tar.xz to /tmp/ember-gpu (the prefix it was built for, see
# config.sh; EMBER_GPU_DIR elsewhere, then EMBER_PLUGIN_PATH names its plugins), points
# LD_LIBRARY_PATH at the bundle's lib/ and at the machine's CUDA libraries (its python3's
# site-packages nvidia/*/lib), prints the driver,
# cudart, cuBLAS and cuDNN versions found and stops when one is older than the build's
# (BUILD-INFO; EMBER_GPU_ALLOW_OLDER=1 goes on anyway), then runs each suite under a time
# limit, printing its time, each writing its table under $OUT as it ends:
#   $OUT/env.txt      versions, library paths, nvidia-smi, ember-info
#   each suite's table, $OUT/SUITE.txt as the suite ends; at the end they are joined into
#   $OUT/tables.txt (the device tool returns at most 8 files):
#   $OUT/ops.txt      ember-opcheck --device DEV --mode eval,grad (every op DEV's backend has)
#   $OUT/train.txt    digits and Fashion-MNIST MLPs and the Fashion-MNIST CNN on DEV against the
#                     committed CPU reference
#   $OUT/determinism.txt  the CNN trained twice on DEV in deterministic mode: weights bitwise equal
#   $OUT/nccl.txt     the nccl communicator in a world of one (tests/gpu/nccl)
#   $OUT/memory.txt   memory summary of an MLP step (tests/gpu/memory, ember-train), OOM messages
#   $OUT/bench.txt    issue 20 item 8: Ember against PyTorch eager and cuBLASLt/cudart alone
#   $OUT/amp.txt      bf16 and f16 autocast MLP training on DEV against the CPU's, the scaler's skip
#   $OUT/capture.txt  SGD, Adam and AdamW with capturable steps captured and replayed on DEV
#                     (a new lr every step) against the CPU's plain steps, and Adam with the
#                     grads clipped in the captured step (em_clip_grad_norm_device_) against
#                     the CPU's host clipping, and a captured step of dropout, bernoulli_
#                     and uniform_ whose replays draw the CPU's numbers at each replay's
#                     generator state (tests/gpu/capture)
#   $OUT/tables.txt   the tables above, in suite order, each after a "==== SUITE.txt" line
#   $OUT/summary.txt  one line per suite: PASS/FAIL/TIMEOUT and seconds
#   $OUT/log.txt      everything printed
# Exit 0 when every suite passed, 1 when one failed, 2 for a usage or setup error.
# --device cpu rehearses the suites here on the CPU (no CUDA needed, bench reduced: --quick,
# no cuBLAS row); OUT defaults to gpu-out/ when unset.
# Time limits per suite (seconds): EMBER_GPU_T_OPS=180 _TRAIN=90 _DETERMINISM=60 _MEMORY=60
# _NCCL=30 _BENCH=180 _AMP=60 _CAPTURE=30; with --device cpu (the rehearsal: the CNN trains on the CPU) three
# times the default for train and determinism.
set -euo pipefail

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
src=$(cd "$(dirname "$self")/../.." && pwd)
# shellcheck source=tests/gpu/config.sh
. "$(dirname "$self")/config.sh"

# ---- the suites (each runs as "run.sh __suite NAME" under timeout, with the setup's env) ----
suite_ops() {
    local oc=$B/bin/ember-opcheck
    if [ ! -x "$oc" ]; then
        echo "ops: the bundle has no bin/ember-opcheck (this tree did not build it)" | tee "$OUT/ops.txt"
        return 1
    fi
    # Straight into $OUT: a run stopped at the suite's limit still leaves what it checked.
    echo "ember-opcheck --device $DEV --mode eval,grad" > "$OUT/ops.txt"
    set +e
    "$oc" --device "$DEV" --mode eval,grad >> "$OUT/ops.txt" 2>&1
    local rc=$?
    set -e
    echo "exit $rc" >> "$OUT/ops.txt"
    grep -v -E '^ *(ok|pass)' "$OUT/ops.txt" | tail -40
    return $rc
}

suite_train() {
    local rc=0 r data prefix
    {
        echo "train: $DEV runs against the committed CPU reference (tests/gpu/ref/), deterministic mode, seed 0"
        echo "bounds: first 30 steps' losses within rtol 1e-3, >= 98% test predictions equal, accuracy within 1 pp"
    } > "$WORK/train.txt"
    for r in digits fmnist cnn; do
        if [ $r = digits ]; then data=$src/data/digits; else data=$B/data/fashion-mnist; fi
        prefix=$WORK/$r.$DEV
        if ! "$B/harness/train_ref" train $r --device "$DEV" --data "$data" --out "$prefix" >> "$WORK/train.txt" 2>&1; then
            echo "$r on $DEV: training FAILED (see above)" >> "$WORK/train.txt"
            rc=1
            continue
        fi
        (cd "$WORK" && "$B/harness/train_ref" compare "$src/tests/gpu/ref/$r" "$r.$DEV") >> "$WORK/train.txt" 2>&1 || rc=1
        if [ "$DEV" != cpu ]; then
            # The CPU on this machine too: tells a bundle or CPU difference from a device one.
            # Informational: the verdict is the device's.
            if "$B/harness/train_ref" train $r --device cpu --data "$data" --out "$WORK/$r.cpu-here" >> "$WORK/train.txt" 2>&1; then
                (cd "$WORK" && "$B/harness/train_ref" compare "$src/tests/gpu/ref/$r" "$r.cpu-here") >> "$WORK/train.txt" 2>&1 || true
            fi
        fi
    done
    {
        echo
        echo "per-step losses of the first 30 steps (reference, $DEV):"
        for r in digits fmnist cnn; do
            [ -f "$WORK/$r.$DEV.losses" ] || continue
            echo "$r:"
            head -30 "$src/tests/gpu/ref/$r.losses" | paste -d' ' - <(head -30 "$WORK/$r.$DEV.losses" | awk '{print $2}')
        done
    } >> "$WORK/train.txt"
    cp "$WORK/train.txt" "$OUT/train.txt"
    cat "$WORK/train.txt" | grep -E 'train_ref|PASS|FAIL|FAILED|error' || true
    return $rc
}

suite_determinism() {
    # The CNN twice on DEV in deterministic mode (em_set_deterministic: deterministic
    # algorithms only), same seed, data and initial weights: the trained weights must be
    # bitwise equal. Straight into $OUT: a run stopped at the limit keeps what it did.
    local rc=0 i data=$B/data/fashion-mnist
    echo "determinism: the cnn recipe (tests/gpu/train_ref.c) trained twice on $DEV, deterministic mode, seed 0" > "$OUT/determinism.txt"
    for i in 1 2; do
        "$B/harness/train_ref" train cnn --device "$DEV" --data "$data" --out "$WORK/det$i" >> "$OUT/determinism.txt" 2>&1 ||
            { echo "run $i on $DEV: training FAILED (see above)" >> "$OUT/determinism.txt"; rc=1; }
    done
    if [ $rc -eq 0 ]; then
        (cd "$WORK" && "$B/harness/train_ref" same det1.weights det2.weights) >> "$OUT/determinism.txt" 2>&1 || rc=1
        if cmp -s "$WORK/det1.losses" "$WORK/det2.losses"; then
            echo "per-step losses: identical ($(wc -l < "$WORK/det1.losses") steps)" >> "$OUT/determinism.txt"
        else
            echo "per-step losses: DIFFER, first at: $(cmp "$WORK/det1.losses" "$WORK/det2.losses" | head -1)" >> "$OUT/determinism.txt"
            rc=1
        fi
    fi
    cat "$OUT/determinism.txt"
    return $rc
}

suite_nccl() {
    # tests/gpu/nccl: a world of one (NCCL refuses two ranks on one GPU); on the CPU the
    # rehearsal checks that the class is there and refuses without a CUDA device.
    local rc=0
    "$B/harness/nccl" --device "$DEV" > "$OUT/nccl.txt" 2>&1 || rc=1
    cat "$OUT/nccl.txt"
    return $rc
}

suite_memory() {
    local rc=0 oom=()
    [ "$DEV" = cpu ] || oom=(--oom)
    {
        echo "== tests/gpu/memory --device $DEV ${oom[*]}"
        "$B/harness/memory" --device "$DEV" "${oom[@]}" 2>&1 || rc=1
        echo
        echo "== ember-train examples/fashion-mnist-mlp.yaml --device $DEV --max-steps 1 --memory-summary"
        "$B/bin/ember-train" "$src/examples/fashion-mnist-mlp.yaml" --device "$DEV" \
            --data "$B/data/fashion-mnist" --epochs 1 --max-steps 1 --limit-batches 1 --memory-summary 2>&1 || rc=1
    } > "$OUT/memory.txt"
    cat "$OUT/memory.txt"
    return $rc
}

# "ember mlp ms=0.1 ..." lines -> the value of KEY for WORKLOAD from a file
val() { awk -v w="$2" -v k="$3" '$2 == w { for (i = 3; i <= NF; i++) if (index($i, k "=") == 1) { print substr($i, length(k) + 2); exit } }' "$1"; }

suite_bench() {
    local rc=0 quick=()
    [ "$DEV" = cpu ] && quick=(--quick)
    # The raw lines go to $OUT/bench.txt as they come (a run stopped at the limit keeps them);
    # the table replaces it at the end.
    : > "$OUT/bench.txt"
    "$B/harness/gpu_step" --device "$DEV" "${quick[@]}" > "$WORK/ember.txt" 2>&1 || { cat "$WORK/ember.txt"; rc=1; }
    # issue 26 item 6: one process per workload, so that one that cannot run (the CNN's
    # convolutions before cuDNN's kernels; a device that cannot capture graphs) leaves its
    # error in the table and the others their rows; it does not fail the suite
    local w
    for w in cnn mlp_sgd mlp_graph cnn_sgd cnn_graph mlp_adam_graph cnn_adam_graph conv gemm_bf16; do
        "$B/harness/gpu_step" --device "$DEV" "${quick[@]}" "$w" > "$WORK/one.txt" 2>&1 ||
            echo "ember $w error=$(tail -n 1 "$WORK/one.txt" | tr -s ' \t' '_' | cut -c1-160)" >> "$WORK/one.txt"
        cat "$WORK/one.txt" >> "$WORK/ember.txt"
    done >> "$WORK/ember.txt"
    # ember-train's own step, eager and with --graph-capture (docs/cuda.md): the median step
    # time of its summary, over one epoch of the bundled Fashion-MNIST subset (SGD, batch 128)
    local g
    for g in eager graph; do
        local gopt=()
        [ $g = graph ] && gopt=(--graph-capture)
        if "$B/bin/ember-train" "$src/examples/fashion-mnist-mlp.yaml" --device "$DEV" \
            --data "$B/data/fashion-mnist" --epochs 1 --quiet "${gopt[@]}" > "$WORK/train_$g.txt" 2>&1; then
            echo "ember train_$g ms=$(sed -n 's/.*of the median step time (\([0-9.]*\) ms).*/\1/p' "$WORK/train_$g.txt")"
        else
            echo "ember train_$g error=$(tail -n 1 "$WORK/train_$g.txt" | tr -s ' \t' '_' | cut -c1-160)"
        fi
    done >> "$WORK/ember.txt"
    cat "$WORK/ember.txt" >> "$OUT/bench.txt"
    if [ "$DEV" != cpu ]; then
        if [ -x "$B/harness/gpu_cublas" ]; then
            "$B/harness/gpu_cublas" > "$WORK/cublas.txt" 2>&1 || { cat "$WORK/cublas.txt"; rc=1; }
            if [ -x "$B/harness/gpu_cudnn" ]; then
                "$B/harness/gpu_cudnn" >> "$WORK/cublas.txt" 2>&1 || { cat "$WORK/cublas.txt"; rc=1; }
            fi
        else
            echo "bench: the bundle has no harness/gpu_cublas" | tee "$WORK/cublas.txt"; rc=1
        fi
    else
        : > "$WORK/cublas.txt"
    fi
    cat "$WORK/cublas.txt" >> "$OUT/bench.txt"
    local py=${EMBER_GPU_PYTHON:-python3}
    if "$py" -c 'import torch' 2>/dev/null; then
        PYTHONUNBUFFERED=1 "$py" "$src/bench/gpu_torch.py" --device "$DEV" "${quick[@]}" > "$WORK/torch.txt" 2>&1 ||
            { cat "$WORK/torch.txt"; rc=1; }
    else
        echo "bench: $py has no torch: no PyTorch column" | tee "$WORK/torch.txt"
        [ "$DEV" = cpu ] || rc=1
    fi
    local big=8192 n=256
    [ "$DEV" = cpu ] && big=1024 n=16
    {
        echo "bench on $DEV ($(date -u +%Y-%m-%dT%H:%MZ)); medians of 7 batches, host clock, each batch synchronised"
        grep -h '^cublas device=\|^torch version=' "$WORK/cublas.txt" "$WORK/torch.txt" || true
        printf '%-26s %12s %12s %12s %8s  %s\n' row ember baseline "torch eager" ratio "target (issue 20 item 8, issue 26 item 6)"
        row() { # row NAME EMBER BASE TORCH RATIO TARGET_TEXT OK
            printf '%-26s %12s %12s %12s %8s  %s %s\n' "$1" "${2:--}" "${3:--}" "${4:--}" "${5:--}" "$6" "$7"
        }
        ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print ""; else printf "%.3f", a / b }'; }
        meets() { awk -v r="$1" -v op="$2" -v t="$3" 'BEGIN { if (r == "") print "(not measured)"; else if ((op == "le" && r <= t) || (op == "ge" && r >= t)) print "met"; else print "MISSED" }'; }
        local e t c r
        e=$(val "$WORK/ember.txt" mlp ms); t=$(val "$WORK/torch.txt" mlp ms); r=$(ratio "$e" "$t")
        row "mlp step (ms)" "$e" "$t" "$t" "$r" "ember/torch <= 1.0:" "$(meets "$r" le 1.0)"
        for s in 128x784x512 128x512x256 128x256x10 ${big}x${big}x${big}; do
            e=$(val "$WORK/ember.txt" linear_$s ms); c=$(val "$WORK/cublas.txt" linear_$s ms)
            t=$(val "$WORK/torch.txt" linear_$s ms); r=$(ratio "$e" "$c")
            row "linear $s (ms)" "$e" "$c" "$t" "$r" "ember/cuBLASLt <= 1.05:" "$(meets "$r" le 1.05)"
        done
        e=$(val "$WORK/ember.txt" add_${n}M GBps); c=$(val "$WORK/cublas.txt" copy_${n}M GBps)
        t=$(val "$WORK/torch.txt" add_${n}M GBps); r=$(ratio "$e" "$c")
        row "add ${n}M f32 (GB/s)" "$e" "$c" "$t" "$r" "ember/D2D copy >= 0.80:" "$(meets "$r" ge 0.80)"
        # issue 26 item 6 (an error= line instead of a figure: "not run" and why, below)
        e=$(val "$WORK/ember.txt" cnn ms); t=$(val "$WORK/torch.txt" cnn ms); r=$(ratio "$e" "$t")
        row "cnn step (ms)" "$e" "$t" "$t" "$r" "ember/torch <= 1.0:" "$(meets "$r" le 1.0)"
        for w in mlp cnn; do
            e=$(val "$WORK/ember.txt" ${w}_sgd ms); t=$(val "$WORK/torch.txt" ${w}_sgd ms); r=$(ratio "$e" "$t")
            row "$w sgd step (ms)" "$e" "$t" "$t" "$r" "ember/torch eager (no target)" ""
            e=$(val "$WORK/ember.txt" ${w}_graph ms); c=$(val "$WORK/torch.txt" ${w}_graph ms)
            t=$(val "$WORK/torch.txt" ${w}_sgd ms); r=$(ratio "$e" "$t")
            row "$w sgd graph replay (ms)" "$e" "$c" "$t" "$r" "ember graph/torch eager; baseline: torch CUDA graph; replay = eager bitwise:" "$(val "$WORK/ember.txt" ${w}_graph match)"
            # Adam capturable (fused_adam_capturable; torch: Adam(capturable=True)) against
            # torch's eager Adam step (the mlp / cnn rows)
            e=$(val "$WORK/ember.txt" ${w}_adam_graph ms); c=$(val "$WORK/torch.txt" ${w}_adam_graph ms)
            t=$(val "$WORK/torch.txt" $w ms); r=$(ratio "$e" "$t")
            row "$w adam graph replay (ms)" "$e" "$c" "$t" "$r" "ember graph/torch eager Adam; baseline: torch CUDA graph, Adam(capturable=True); replay = eager bitwise:" "$(val "$WORK/ember.txt" ${w}_adam_graph match)"
        done
        e=$(val "$WORK/ember.txt" train_graph ms); c=$(val "$WORK/ember.txt" train_eager ms); r=$(ratio "$e" "$c")
        row "ember-train graph (ms)" "$e" "$c" "" "$r" "ember-train --graph-capture/eager step, fashion-mnist-mlp (no target)" ""
        e=$(val "$WORK/ember.txt" gemm_bf16_$big ms); c=$(val "$WORK/cublas.txt" gemm_bf16_$big ms)
        t=$(val "$WORK/torch.txt" gemm_bf16_$big ms); r=$(ratio "$e" "$c")
        row "gemm bf16 ${big}^3 (ms)" "$e" "$c" "$t" "$r" "ember/cuBLASLt <= 1.05:" "$(meets "$r" le 1.05)"
        for s in conv1_64x1x28x28 conv2_64x32x14x14; do
            e=$(val "$WORK/ember.txt" $s ms); c=$(val "$WORK/cublas.txt" $s ms); r=$(ratio "$e" "$c")
            [ -n "$c$e" ] && row "conv2d fwd+bwd $s (ms)" "$e" "$c" "" "$r" "ember/cuDNN alone <= 1.10:" "$(meets "$r" le 1.10)"
        done
        grep -h '^ember [a-z_0-9]* error=' "$WORK/ember.txt" | sed 's/^ember \([a-z_0-9]*\) error=/not run: \1: /' || true
        [ -x "$B/harness/gpu_cudnn" ] || echo "not run: conv2d rows: the bundle has no harness/gpu_cudnn (cuDNN-alone timing)"
        echo
        echo "baseline: cuBLASLt alone (linear: BIAS forward, dx, BGRADB dweight+dbias) or cudaMemcpyAsync D2D (add),"
        echo "bench/gpu_cublas.c; torch eager: bench/gpu_torch.py with this machine's python3 (its copy row: $(val "$WORK/torch.txt" copy_${n}M GBps) GB/s)"
        echo
        echo "raw:"
        cat "$WORK/ember.txt" "$WORK/cublas.txt" "$WORK/torch.txt"
    } > "$OUT/bench.txt"
    cat "$OUT/bench.txt"
    return $rc
}

suite_amp() {
    # tests/gpu/amp: the digits MLP under autocast bf16, then f16 with the gradient scaler (step 0
    # fed NaN on purpose: it must be skipped), on DEV and on this machine's CPU in one process;
    # its rows say what is compared and within which tolerance.
    local rc=0
    "$B/harness/amp" --device "$DEV" --data "$src/data/digits" > "$OUT/amp.txt" 2>&1 || rc=$?
    cat "$OUT/amp.txt"
    return $rc
}

suite_capture() {
    # tests/gpu/capture: the capturable optimizer steps (fused_*_capturable: the lr and Adam's
    # step count read from device memory), 1 eager step then replays of one captured step
    # with a new lr before each, against the plain steps on this machine's CPU; its rows say
    # what is compared and within which tolerance.
    local rc=0
    "$B/harness/capture" --device "$DEV" > "$OUT/capture.txt" 2>&1 || rc=$?
    cat "$OUT/capture.txt"
    return $rc
}

if [ "${1:-}" = __suite ]; then
    "suite_$2"
    exit
fi

# ---- setup ----------------------------------------------------------------------------------
DEV=cuda
suites=()
while [ $# -gt 0 ]; do
    case $1 in
        --device) DEV=${2:?--device needs a device}; shift ;;
        -h|--help) sed -n '2,34p' "$self"; exit 0 ;;
        ops|train|determinism|memory|nccl|bench|amp|capture) suites+=("$1") ;;
        *) echo "run.sh: unknown argument '$1' (suites: ops train determinism memory nccl bench amp capture; --device DEV)" >&2; exit 2 ;;
    esac
    shift
done
[ ${#suites[@]} -gt 0 ] || suites=(ops train determinism memory nccl bench amp capture)

OUT=${OUT:-$src/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
tee_pid=$!
# At the end, let tee write the last lines before the command returns.
finish() { exec 1>&- 2>&-; wait "$tee_pid" 2>/dev/null || true; }
trap finish EXIT
t_start=$SECONDS
die() { echo "run.sh: $*" >&2; exit 2; }
echo "== run.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(uname -sr)); device $DEV; suites: ${suites[*]}"

archive=${EMBER_GPU_ARCHIVE:-$src/gpu-bundle/ember-gpu.tar.xz}
[ -f "$archive" ] || die "no $archive: run tests/gpu/pack.sh here first and carry gpu-bundle (see tests/gpu/README.md)"
dest=${EMBER_GPU_DIR:-$(dirname "$EMBER_GPU_PREFIX")}
rm -rf "$dest"
mkdir -p "$dest"
t=$SECONDS
if ! tar -C "$dest" -xJf "$archive" 2>/dev/null; then
    rm -rf "$dest" && mkdir -p "$dest"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$archive" "$dest" ||
        die "cannot unpack $archive (neither tar -J nor python3's tarfile)"
fi
B=$dest/ember-gpu
[ -f "$B/BUILD-INFO" ] || die "$archive holds no ember-gpu/BUILD-INFO: not made by tests/gpu/pack.sh"
echo "unpacked $(du -sh "$B" | cut -f1) in $((SECONDS - t)) s to $B"
binfo() { sed -n "s/^$1=//p" "$B/BUILD-INFO"; }
echo "bundle: commit $(binfo commit) (dirty: $(binfo dirty)), built $(binfo built) on $(binfo host)"
[ "$(binfo commit)" = "$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)" ] ||
    echo "run.sh: warning: the bundle was built from commit $(binfo commit), the work tree is at $(git -C "$src" rev-parse HEAD 2>/dev/null || echo '(no git)')"

# The machine's CUDA libraries: python3's site-packages nvidia/*/lib (the CUDA 13 wheels put
# theirs in nvidia/cu13/lib, cuDNN in nvidia/cudnn/lib), then a glob over the usual places.
cuda_dirs=()
add_dir() { local d; for d in "$@"; do [ -d "$d" ] && ls "$d"/*.so* >/dev/null 2>&1 && cuda_dirs+=("$(cd "$d" && pwd -P)"); done; return 0; }
if [ -n "${EMBER_CUDA_LIB_DIRS:-}" ]; then
    IFS=: read -r -a extra <<< "$EMBER_CUDA_LIB_DIRS"
    add_dir "${extra[@]}"
fi
if command -v python3 >/dev/null; then
    while IFS= read -r d; do add_dir "$d"; done < <(timeout 60 python3 -c '
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
import site, sys
for p in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    roots.append(os.path.join(p, "nvidia"))
seen = set()
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib")) + glob.glob(os.path.join(r, "*", "lib64"))):
        d = os.path.realpath(d)
        if d not in seen:
            seen.add(d)
            print(d)
' 2>/dev/null || true)
fi
if [ ${#cuda_dirs[@]} -eq 0 ]; then
    shopt -s nullglob
    add_dir /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
        /usr/local/lib/python3*/site-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib \
        /root/.local/lib/python3*/site-packages/nvidia/*/lib
    shopt -u nullglob
fi
# de-duplicate, keep order
mapfile -t cuda_dirs < <(printf '%s\n' "${cuda_dirs[@]}" | awk 'NF && !seen[$0]++')
cuda_path=$(IFS=:; echo "${cuda_dirs[*]}")
export LD_LIBRARY_PATH="$B/lib${cuda_path:+:$cuda_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Unpacked where it was built for, the core finds the plugins itself (EMBER_PLUGIN_PATH too
# would load each twice: the second copy is refused as a duplicate).
if [ "$B" != "$EMBER_GPU_PREFIX" ]; then export EMBER_PLUGIN_PATH="$B/lib/ember/plugins"; fi
echo "CUDA library directories: ${cuda_path:-none found}"

# ---- versions -------------------------------------------------------------------------------
"$B/harness/versions" > "$OUT/versions.kv" 2>&1 || true
kv() { sed -n "s/^$1=//p" "$OUT/versions.kv" | head -1; }
{
    echo "== versions (tests/gpu/versions: what the dynamic linker finds)"
    cat "$OUT/versions.kv"
    echo "== build (BUILD-INFO)"
    cat "$B/BUILD-INFO"
    echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "== nvidia-smi"
    timeout 30 nvidia-smi 2>&1 || echo "(nvidia-smi not available)"
} > "$OUT/env.txt"
rm -f "$OUT/versions.kv.tmp"
smi_driver=$(timeout 30 nvidia-smi --query-gpu=driver_version,name --format=csv,noheader 2>/dev/null | head -1 || true)
printf '%-10s %-14s %-14s %s\n' library found built from
printf '%-10s %-14s %-14s %s\n' driver "$(kv driver_cuda) (CUDA)" "$(binfo cudart_build | awk '{printf "%d.%d", $1/1000, $1%1000/10}')" "${smi_driver:-nvidia-smi: none}"
printf '%-10s %-14s %-14s %s\n' cudart "$(kv cudart)" "$(binfo cudart_build | awk '{printf "%d.%d", $1/1000, $1%1000/10}')" "$(kv cudart_path)"
printf '%-10s %-14s %-14s %s\n' cublas "$(kv cublas)" "$(binfo cublas_build)" "$(kv cublas_path)"
printf '%-10s %-14s %-14s %s\n' cublasLt "$(kv cublaslt)" "$(binfo cublas_build)" "$(kv cublaslt_path)"
printf '%-10s %-14s %-14s %s\n' nccl "$(kv nccl)" "$(binfo nccl_build)" "$(kv nccl_path) (the nccl suite needs it)"
printf '%-10s %-14s %-14s %s\n' cudnn "$(kv cudnn)" "$(binfo cudnn_build)" "$(kv cudnn_path) (the plugin uses it: $(binfo plugin_uses_cudnn))"
grep '_error=' "$OUT/versions.kv" | sed 's/^/  /' || true

if [ "$DEV" != cpu ]; then
    [ "$(binfo cuda)" = yes ] || die "the bundle was packed without CUDA (pack.sh --no-cuda): --device $DEV cannot run"
    older() { [ -n "$1" ] && [ -n "$2" ] && [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
    bad=()
    built_rt=$(binfo cudart_build | awk '{printf "%d.%d", $1/1000, $1%1000/10}')
    [ -n "$(kv cudart)" ] || bad+=("no libcudart found (LD_LIBRARY_PATH above)")
    [ -n "$(kv cublas)" ] || bad+=("no libcublas found")
    older "$(kv driver_cuda)" "$built_rt" && bad+=("the driver supports CUDA $(kv driver_cuda), the build needs $built_rt")
    older "$(kv cudart)" "$built_rt" && bad+=("cudart $(kv cudart) is older than the build's $built_rt")
    older "$(kv cublas)" "$(binfo cublas_build)" && bad+=("cuBLAS $(kv cublas) is older than the build's $(binfo cublas_build)")
    older "$(kv cublaslt)" "$(binfo cublas_build)" && bad+=("cuBLASLt $(kv cublaslt) is older than the build's $(binfo cublas_build)")
    if [ "$(binfo plugin_uses_cudnn)" = yes ]; then
        [ -n "$(kv cudnn)" ] || bad+=("no libcudnn found and the plugin uses it")
        older "$(kv cudnn)" "$(binfo cudnn_build)" && bad+=("cuDNN $(kv cudnn) is older than the build's $(binfo cudnn_build)")
    elif older "$(kv cudnn)" "$(binfo cudnn_build)"; then
        echo "note: cuDNN $(kv cudnn) is older than the build's $(binfo cudnn_build); the plugin does not use cuDNN"
    fi
    [ "$(kv devices)" -ge 1 ] 2>/dev/null || bad+=("no CUDA device: $(kv devices_error)")
    if [ ${#bad[@]} -gt 0 ]; then
        for m in "${bad[@]}"; do echo "run.sh: $m"; done
        if [ "${EMBER_GPU_ALLOW_OLDER:-0}" = 1 ] && [ -n "$(kv cudart)" ] && [ "$(kv devices)" -ge 1 ] 2>/dev/null; then
            echo "run.sh: EMBER_GPU_ALLOW_OLDER=1: going on anyway"
        else
            echo "run.sh: stopped before the suites (EMBER_GPU_ALLOW_OLDER=1 goes on despite older libraries)"
            exit 2
        fi
    fi
fi
t=$SECONDS
{ echo "== ember-info"; timeout 120 "$B/bin/ember-info" 2>&1 || echo "(ember-info exit $?)"; } >> "$OUT/env.txt"
grep -E -i 'cuda|refused|quarantin|self-test' "$OUT/env.txt" | grep -v '^==\|LD_LIBRARY_PATH' | head -20 || true
echo "ember-info: $((SECONDS - t)) s (full output in env.txt)"
rm -f "$OUT/versions.kv"

# ---- the suites -----------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ember-gpu-work.XXXXXX")
export B DEV OUT WORK
: > "$OUT/summary.txt"
failed=0
slow=1
[ "$DEV" = cpu ] && slow=3
for s in "${suites[@]}"; do
    case $s in
        ops) lim=${EMBER_GPU_T_OPS:-180} ;;
        train) lim=${EMBER_GPU_T_TRAIN:-$((90 * slow))} ;;
        determinism) lim=${EMBER_GPU_T_DETERMINISM:-$((60 * slow))} ;;
        memory) lim=${EMBER_GPU_T_MEMORY:-60} ;;
        nccl) lim=${EMBER_GPU_T_NCCL:-30} ;;
        bench) lim=${EMBER_GPU_T_BENCH:-180} ;;
        amp) lim=${EMBER_GPU_T_AMP:-60} ;;
        capture) lim=${EMBER_GPU_T_CAPTURE:-30} ;;
    esac
    echo
    echo "== suite $s (limit $lim s)"
    t=$SECONDS
    set +e
    timeout -k 10 "$lim" "$self" __suite "$s"
    rc=$?
    set -e
    case $rc in
        0) verdict=PASS ;;
        124|137) verdict="TIMEOUT (over $lim s)" ;;
        *) verdict="FAIL (exit $rc)" ;;
    esac
    [ $rc -eq 0 ] || failed=1
    line=$(printf '%-8s %-24s %4d s' "$s" "$verdict" $((SECONDS - t)))
    echo "== suite $line"
    echo "$line" >> "$OUT/summary.txt"
done
rm -rf "$WORK"
# The device tool returns at most 8 files: the suites' tables, written one per suite as each
# ends (so a run stopped at the tool's limit still returns them), are joined into tables.txt.
: > "$OUT/tables.txt"
for s in "${suites[@]}"; do
    [ -f "$OUT/$s.txt" ] || continue
    { echo "==== $s.txt"; cat "$OUT/$s.txt"; echo; } >> "$OUT/tables.txt"
    rm -f "$OUT/$s.txt"
done
echo
echo "== summary ($DEV, $((SECONDS - t_start)) s in all; tables in $OUT)"
cat "$OUT/summary.txt"
exit $failed

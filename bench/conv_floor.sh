#!/bin/sh
# bench/conv_floor.sh — each convolution of the CNN step (bench/train_step's train_cnn_b64)
# against the same oneDNN primitive timed alone (issue 27: "each convolution within 1.15x of
# the same oneDNN primitive timed alone"), in CPU ms of the process per call:
#
#   ../bench/conv_floor.sh [steps [workload]]   default 20 steps of train_cnn_b64 (or
#                                      train_cnn_b64_blocked: the nChw16c activations); run
#                                      from the build tree after `make` (its
#                                      bench/train_step and bench/step_floor)
#
# "step" is bench/train_step --calls train_cnn_b64 STEPS's CPU median of the call (conv1's
# forward is conv2d_relu's call, its ReLU included where the kernel runs it as a pass);
# "alone" is bench/step_floor --cpu-time --cold train_cnn_b64's row, cold caches as in the
# step (64 MiB written before each call), its best candidate ("best") and the best of its nhwc
# candidates ("nhwc", the layout the step's tensors have), each with step / alone. The two
# programs run one after the other, so on a loaded machine repeat it and read medians.
# Results and commands: bench/README.md, "conv1's primitive".
steps=${1:-20}
workload=${2:-train_cnn_b64}
for p in bench/train_step bench/step_floor; do
    if [ ! -x "$p" ]; then
        echo "conv_floor.sh: $p not found; run \`make\` and start from the build tree" >&2
        exit 2
    fi
done
calls=$(bench/train_step --calls "$workload" "$steps") || exit 1
floor=$(OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} bench/step_floor --cpu-time --cold "$workload") || exit 1
printf '%s\n' "$calls" | head -1
printf '%s\n' "$floor" | head -1
{
    printf '%s\n' "$calls" | sed 's/^/CALL /'
    printf '%s\n' "$floor" | sed 's/^/FLOOR /'
} | awk '
# the call-site rows of bench/train_step --calls: the last column is the CPU median
$1 == "CALL" {
    name = $2
    if (name ~ /^conv2d(_relu)?$/ && $3 ~ /^64x1x28x28/) step["conv1 forward"] = $(NF - 3)
    else if (name == "conv2d_backward_weight" && $3 ~ /^64x1x28x28/) step["conv1 weight grad"] = $(NF - 3)
    else if (name ~ /^conv2d(_relu)?$/ && $3 ~ /^64x32x14x14/) step["conv2 forward"] = $(NF - 3)
    else if (name == "conv2d_backward_data") step["conv2 data grad"] = $(NF - 3)
    else if (name == "conv2d_backward_weight" && $3 ~ /^64x32x14x14/) step["conv2 weight grad"] = $(NF - 3)
    next
}
# step_floor rows: what (2 words) + "grad"/"forward", shape (4 fields), count, GFLOP, then
# dnnl-Nt dnnl-1t nhwc-Nt nhwc-1t blas-1t blas-Nt floor
$1 == "FLOOR" && $2 ~ /^conv[12]$/ && (($3 == "forward" && $4 ~ /^[0-9]+x/) || ($4 == "grad" && $5 ~ /^[0-9]+x/)) {
    what = $3 == "forward" ? $2 " forward" : $2 " " $3 " grad"
    i = $3 == "forward" ? 4 : 5
    i += 4 + 1 + 1 # the shape "A -> O KxK" (4 fields), count, GFLOP
    best = -1; nhwc = -1
    for (c = 0; c < 4; c++) {
        v = $(i + c); sub(/\*$/, "", v)
        if (v == "-") continue
        v += 0
        if (best < 0 || v < best) best = v
        if (c >= 2 && (nhwc < 0 || v < nhwc)) nhwc = v
    }
    alone[what] = best; alone_nhwc[what] = nhwc
    order[++n] = what
}
END {
    printf "%-20s %9s %9s %9s %11s %11s\n", "convolution", "step", "best", "nhwc",
           "step/best", "step/nhwc"
    for (k = 1; k <= n; k++) {
        w = order[k]
        if (!(w in step)) { printf "%-20s %9s (no call site found)\n", w, "-"; continue }
        printf "%-20s %9.4f %9.4f %9.4f %11.2f %11.2f\n", w, step[w], alone[w], alone_nhwc[w],
               step[w] / alone[w], step[w] / alone_nhwc[w]
    }
}'

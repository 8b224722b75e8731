# tests/gpu/config.sh — settings shared by pack.sh, run.sh and the Makefile's gpu-train-ref.
# Sourced by bash; keep it plain assignments.

# The Fashion-MNIST subset in the bundle: the first FM_TRAIN training and FM_TEST test images
# (tests/gpu/fmnist_subset.py). The committed reference (tests/gpu/ref/fmnist.*) was made
# from this subset: change these and regenerate it (make gpu-train-ref).
FM_TRAIN=10000
FM_TEST=10000

# Where run.sh unpacks the bundle on the GPU machine, and the prefix it is built for, so that
# the unpacked bundle is an install in its own place: the core finds its plugins in its
# installed plugin directory (no EMBER_PLUGIN_PATH, no warning about a missing directory).
EMBER_GPU_PREFIX=/tmp/ember-gpu/ember-gpu

# configure arguments that make the CUDA plugin carry sm_90 machine code alone (the H200;
# configure adds compute_90 PTX for the last architecture named).
EMBER_CUDA_ARCH_ARGS=(CUDA_ARCHS=90)

# Programs of the harness built in the tree (paths relative to the build directory) that the
# bundle carries in harness/.
EMBER_GPU_HARNESS_PROGRAMS=(tests/gpu/train_ref tests/gpu/memory tests/gpu/versions bench/gpu_step tests/gpu/nccl)
EMBER_GPU_HARNESS_PROGRAMS+=(tests/gpu/amp) # run.sh amp
EMBER_GPU_HARNESS_PROGRAMS+=(tests/gpu/capture) # run.sh capture

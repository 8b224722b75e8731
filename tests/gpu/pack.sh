#!/usr/bin/env bash
# tests/gpu/pack.sh — build Ember here and pack what the GPU machine needs into ONE archive,
# gpu-bundle/ember-gpu.tar.xz (git-ignored), carried there with the work tree
# (see tests/gpu/README.md for the whole procedure).
#
#   tests/gpu/pack.sh [--no-cuda] [--jobs N]
#
# The archive holds, under ember-gpu/:
#   bin/, lib/, lib/ember/plugins/  a staging install for the prefix where run.sh unpacks it
#                                   (EMBER_GPU_PREFIX in tests/gpu/config.sh), CPU side built
#                                   --without-onednn, stripped, CUDA code for sm_90 only
#   lib/                            the shared libraries those files need, found with ldd —
#                                   never glibc, libstdc++/libgcc_s or the CUDA libraries,
#                                   which the GPU machine's OS and its Python packages provide
#   harness/                        the harness's programs (train_ref, memory, versions,
#                                   gpu_step, nccl, gpu_cublas and gpu_cudnn when CUDA is there)
#   data/fashion-mnist/             the first FM_TRAIN training and FM_TEST test images
#   BUILD-INFO                      commit, configure line, the CUDA versions built against
# It then prints the size of everything that travels (the work tree without .git and ignored
# files, plus the archive) and fails above 60 MiB (the device tool's limit is 64 MiB).
#
# --no-cuda   build and pack without the CUDA plugin (for tests/gpu/chroot-check.sh on a
#             tree without plugins/backend-cuda); without it a missing ember-cuda.so fails.
# Environment: EMBER_GPU_BUILD (build directory, default build-gpu/), CUDA_HOME (default
# /usr/local/cuda), FASHION_MNIST (default /usr/share/datasets/fashion-mnist).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
# shellcheck source=tests/gpu/config.sh
. "$here/config.sh"

want_cuda=yes
jobs=2
while [ $# -gt 0 ]; do
    case $1 in
        --no-cuda) want_cuda=no ;;
        --jobs) jobs=${2:?--jobs needs a number}; shift ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "pack.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

die() { echo "pack.sh: $*" >&2; exit 1; }
step() { echo "== pack.sh: $*"; }

build=${EMBER_GPU_BUILD:-$src/build-gpu}
cuda=${CUDA_HOME:-/usr/local/cuda}
fm_src=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
outdir=$src/gpu-bundle
archive=$outdir/ember-gpu.tar.xz
prefix=$EMBER_GPU_PREFIX
limit_mib=60
t0=$SECONDS

git -C "$src" check-ignore -q gpu-bundle/x || die "gpu-bundle/ is not git-ignored: add /gpu-bundle/ to .gitignore"
[ -d "$fm_src" ] || die "no Fashion-MNIST in $fm_src: apt-get install dataset-fashion-mnist (or set FASHION_MNIST)"

# ---- configure and build --------------------------------------------------------------------
[ -x "$src/configure" ] || { step "autogen"; (cd "$src" && ./autogen.sh >/dev/null); }
conf_args=(--prefix="$prefix" --without-onednn)
if [ $want_cuda = yes ]; then
    "$src/configure" --help | grep -q -- '--with-cuda' ||
        die "this tree's configure has no --with-cuda (no CUDA plugin yet); --no-cuda packs the CPU side only"
    [ -x "$cuda/bin/nvcc" ] || die "no nvcc in $cuda/bin (set CUDA_HOME)"
    conf_args+=(--with-cuda="$cuda" "${EMBER_CUDA_ARCH_ARGS[@]}")
elif "$src/configure" --help | grep -q -- '--with-cuda'; then
    conf_args+=(--without-cuda)
fi
mkdir -p "$build"
# Reconfigure when the arguments changed (config.status remembers them).
if [ ! -f "$build/Makefile" ] || [ "$(cat "$build/.pack-conf" 2>/dev/null)" != "${conf_args[*]}" ]; then
    step "configure ${conf_args[*]}"
    (cd "$build" && "$src/configure" -q "${conf_args[@]}") 2>&1 | grep -v "cannot remove 'core': Is a directory" || true
    [ -f "$build/Makefile" ] || die "configure failed (see $build/config.log)"
    # Objects and .la files of another configuration (another prefix is in each .la) go.
    make -C "$build" clean >/dev/null 2>&1 || true
    echo "${conf_args[*]}" > "$build/.pack-conf"
fi
step "make -j$jobs"
make -C "$build" -j"$jobs" >"$build/pack-make.log" 2>&1 || { tail -30 "$build/pack-make.log" >&2; die "make failed (log: $build/pack-make.log)"; }

# ---- staging install ------------------------------------------------------------------------
stage_root=$build/pack-stage
bundle=$build/pack-bundle/ember-gpu
rm -rf "$stage_root" "$build/pack-bundle"
step "make install-strip (staging)"
make -C "$build" install-strip DESTDIR="$stage_root" >>"$build/pack-make.log" 2>&1 || { tail -30 "$build/pack-make.log" >&2; die "make install-strip failed"; }
mkdir -p "$bundle/bin" "$bundle/lib/ember/plugins" "$bundle/harness" "$bundle/data"
cp -a "$stage_root$prefix/bin/." "$bundle/bin/"
cp -a "$stage_root$prefix/lib/"libember.so* "$bundle/lib/"
find "$stage_root$prefix/lib/ember/plugins" -name '*.so' -exec cp -a {} "$bundle/lib/ember/plugins/" \;

# A program built in the tree (not installed): libtool keeps the real binary in .libs/.
copy_built() { # copy_built BUILD_RELATIVE_PATH DEST_DIR
    local p=$build/$1 d n
    d=$(dirname "$p"); n=$(basename "$p")
    if [ -f "$d/.libs/$n" ]; then p=$d/.libs/$n; elif [ -f "$d/.libs/lt-$n" ]; then p=$d/.libs/lt-$n; fi
    [ -f "$p" ] || die "$1 was not built in $build"
    cp "$p" "$2/$n"
    strip --strip-unneeded "$2/$n"
}
for p in "${EMBER_GPU_HARNESS_PROGRAMS[@]}"; do copy_built "$p" "$bundle/harness"; done
# ember-opcheck, when this tree has it, installed or not.
if [ ! -e "$bundle/bin/ember-opcheck" ] && { [ -f "$build/tools/ember-opcheck" ] || [ -f "$build/tools/.libs/ember-opcheck" ]; }; then
    copy_built tools/ember-opcheck "$bundle/bin"
fi

# ---- the CUDA plugin and the cuBLAS(Lt) baseline --------------------------------------------
cudart_v=none cublas_v=none cudnn_v=none nccl_v=none uses_cudnn=no cuda_code=none
if [ $want_cuda = yes ]; then
    [ -f "$bundle/lib/ember/plugins/ember-cuda.so" ] || die "the build made no ember-cuda.so (see $build/config.log)"
    step "bench/gpu_cublas (cuBLASLt and cudart alone)"
    # shellcheck disable=SC2086
    cc -O2 -std=c11 -Wall -Wextra -Werror -I"$cuda/include" -o "$bundle/harness/gpu_cublas" \
        "$src/bench/gpu_cublas.c" -L"$cuda/lib64" -lcublasLt -lcudart -lm
    strip --strip-unneeded "$bundle/harness/gpu_cublas"
    hdr() { sed -n "s/^#define $1 *\([0-9]*\).*/\1/p" "$2" | head -1; }
    cudart_v=$(hdr CUDART_VERSION "$cuda/include/cuda_runtime_api.h")
    cublas_v=$(hdr CUBLAS_VER_MAJOR "$cuda/include/cublas_api.h").$(hdr CUBLAS_VER_MINOR "$cuda/include/cublas_api.h").$(hdr CUBLAS_VER_PATCH "$cuda/include/cublas_api.h")
    cudnn_h=$cuda/include/cudnn_version.h
    [ -f "$cudnn_h" ] || cudnn_h=/usr/local/include/cudnn_version.h
    if [ -f "$cudnn_h" ]; then
        cudnn_v=$(hdr CUDNN_MAJOR "$cudnn_h").$(hdr CUDNN_MINOR "$cudnn_h").$(hdr CUDNN_PATCHLEVEL "$cudnn_h")
    fi
    # The nccl communicator (tests/gpu/run.sh nccl) is built with the CUDA plugin.
    [ -f "$bundle/lib/ember/plugins/ember-nccl.so" ] || die "the build made no ember-nccl.so (configure's NCCL plugin line, $build/config.log)"
    nccl_h=$(sed -n 's/^NCCL_CPPFLAGS = -isystem //p' "$build/Makefile")/nccl.h
    [ -f "$nccl_h" ] && nccl_v=$(hdr NCCL_MAJOR "$nccl_h").$(hdr NCCL_MINOR "$nccl_h").$(hdr NCCL_PATCH "$nccl_h")
    if [ -f "$cuda/include/cudnn.h" ]; then
        step "bench/gpu_cudnn (cuDNN and cudart alone)"
        cc -O2 -std=c11 -Wall -Wextra -Werror -I"$cuda/include" -o "$bundle/harness/gpu_cudnn" \
            "$src/bench/gpu_cudnn.c" -L"$cuda/lib64" -lcudnn -lcudart -lm
        strip --strip-unneeded "$bundle/harness/gpu_cudnn"
    fi
    # cuDNN counts only when the plugin refers to it (linked or named for dlopen).
    if grep -aq 'libcudnn' "$bundle/lib/ember/plugins/ember-cuda.so"; then uses_cudnn=yes; fi
    # Which GPU code the plugin carries: sm_90 machine code alone is what was asked for (and
    # compute_90 PTX, which configure adds for the last architecture).
    archs=$("$here/fatbin_archs.py" "$bundle/lib/ember/plugins/ember-cuda.so") || die "ember-cuda.so holds no CUDA fat binary"
    echo "   ember-cuda.so GPU code: $(echo "$archs" | awk '{printf "%s%s %s (x%s)", (NR > 1 ? ", " : ""), $1, $2, $3}')"
    other=$(echo "$archs" | awk '$1 == "elf" && $2 != "sm_90"')
    [ -z "$other" ] || die "ember-cuda.so carries machine code other than sm_90: $other (EMBER_CUDA_ARCH_ARGS in tests/gpu/config.sh)"
    cuda_code=$(echo "$archs" | awk '{printf "%s%s:%s", (NR > 1 ? "," : ""), $1, $2}')
fi

# ---- the libraries they need ----------------------------------------------------------------
step "shared libraries (ldd)"
# glibc (every library of it), the GCC runtime the GPU machine's newer OS has, and CUDA's
# libraries (the GPU machine's Python packages and driver provide them).
skip_re='^(ld-linux.*|linux-vdso.*|libc|libm|libdl|libpthread|librt|libmvec|libresolv|libutil|libanl|libnsl|libthread_db|libBrokenLocale|libnss_[a-z]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnvrtc[a-z-]*|libnvJitLink|libcufft[a-z]*|libcurand|libcusparse[a-zA-Z]*|libcusolver[a-zA-Z]*|libnccl|libnvToolsExt|libnvtx[0-9a-z]*|libcupti|libnvidia-ml)\.so(\..*)?$'
mapfile -t elves < <(find "$bundle/bin" "$bundle/lib" "$bundle/harness" -type f -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print)
declare -A seen=()
for f in "${elves[@]}"; do
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        [[ $name =~ $skip_re ]] && continue
        [ -e "$bundle/lib/$name" ] && continue
        [ "$path" = "not" ] && die "$(basename "$f") needs $name, which is not found here"
        seen[$name]=$path
        cp -L "$path" "$bundle/lib/$name"
    done < <(LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$f" 2>/dev/null || true)
done
for n in "${!seen[@]}"; do echo "   $n <- ${seen[$n]}"; done | sort

# ---- data and build info --------------------------------------------------------------------
step "Fashion-MNIST subset ($FM_TRAIN train, $FM_TEST test)"
"$here/fmnist_subset.py" "$fm_src" "$bundle/data/fashion-mnist" "$FM_TRAIN" "$FM_TEST"
commit=$(git -C "$src" rev-parse HEAD)
dirty=$(git -C "$src" status --porcelain --untracked-files=no | grep -q . && echo yes || echo no)
cat > "$bundle/BUILD-INFO" <<EOF
commit=$commit
dirty=$dirty
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
host=$(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')
compiler=$(cc --version | head -1)
configure=${conf_args[*]}
cuda=$want_cuda
cudart_build=$cudart_v
cublas_build=$cublas_v
cudnn_build=$cudnn_v
nccl_build=$nccl_v
plugin_uses_cudnn=$uses_cudnn
cuda_code=$cuda_code
fm_train=$FM_TRAIN
fm_test=$FM_TEST
EOF

# ---- the archive and what travels -----------------------------------------------------------
step "archive"
mkdir -p "$outdir"
rm -f "$archive"
XZ_OPT="-6 -T$jobs" tar -C "$build/pack-bundle" -cJf "$archive.tmp" ember-gpu
mv "$archive.tmp" "$archive"
sum_sizes() { awk '{s += $1} END {printf "%d\n", s}'; }
tree_bytes=$(cd "$src" && git ls-files -co --exclude-standard -z | { xargs -0 stat -c %s 2>/dev/null || true; } | sum_sizes)
shared_bytes=0
if [ -d "$src/shared" ] && git -C "$src" check-ignore -q shared; then
    shared_bytes=$(find "$src/shared" -type f -printf '%s\n' | sum_sizes)
fi
arch_bytes=$(stat -c %s "$archive")
total=$((tree_bytes + shared_bytes + arch_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo
echo "bundle contents (uncompressed):"
(cd "$build/pack-bundle/ember-gpu" && du -sh bin lib harness data | sed 's/^/   /')
printf '%-34s %s\n' "work tree (no .git, no ignored):" "$(mib "$tree_bytes")"
[ "$shared_bytes" -gt 0 ] && printf '%-34s %s\n' "shared/ (travels too):" "$(mib "$shared_bytes")"
printf '%-34s %s\n' "archive ${archive#"$src"/}:" "$(mib "$arch_bytes")"
printf '%-34s %s (limit %d MiB; the device tool refuses 64)\n' "total that travels:" "$(mib "$total")" "$limit_mib"
echo "pack.sh: done in $((SECONDS - t0)) s"
[ "$total" -le $((limit_mib * 1048576)) ] || die "what travels is $(mib "$total"), over $limit_mib MiB"

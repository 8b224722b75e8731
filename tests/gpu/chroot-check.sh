#!/usr/bin/env bash
# tests/gpu/chroot-check.sh — prove the GPU bundle here before it travels: unpack it in a
# minimal Debian 12 chroot (debootstrap --variant=minbase: none of Ember's build or run-time
# dependencies installed in it) and run its CPU parts with only the bundle on LD_LIBRARY_PATH.
# Not part of make check (it needs root, debootstrap and the network once).
#
#   tests/gpu/chroot-check.sh            (after tests/gpu/pack.sh; as root)
#
# In the chroot, from a copy of what travels (the work tree without .git and ignored files,
# plus gpu-bundle/), it checks:
#   1. no library of Ember's dependencies is installed there (dpkg), and ldd of every ELF file
#      in the bundle finds everything but the CUDA libraries;
#   2. ember-info runs (plugins loaded from the bundle's own plugin directory, self-test) and a short ember-train
#      (the bundled digits, 2 epochs) trains, with LD_LIBRARY_PATH = the bundle's lib/ alone;
#   3. tests/gpu/run.sh --device cpu (every suite: the harness's unpacking, library search,
#      version report and tables, on the CPU) passes;
#   4. when the bundle has the CUDA plugin: with no CUDA library it loads (its runtime is
#      static) and reports 'cuda: 0 devices', ember-train --device cuda exits 2; with this
#      machine's cudart, cuBLAS(Lt) and cuDNN where the GPU machine's wheels have them
#      (/opt/torch/.venv/.../site-packages/nvidia/{cu13,cudnn}/lib), run.sh --device cuda
#      finds them, prints their versions and stops with "no CUDA device".
# The chroot is kept in $EMBER_CHROOT (default /var/tmp/ember-chroot-bookworm) and reused; it
# gets xz-utils (run.sh unpacks the archive with tar -J; the GPU machine also has python3's
# tarfile to fall back on). Exit 0 when every check passed.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
R=${EMBER_CHROOT:-/var/tmp/ember-chroot-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
archive=$src/gpu-bundle/ember-gpu.tar.xz
die() { echo "chroot-check: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"
[ -f "$archive" ] || die "no $archive: run tests/gpu/pack.sh first"
t0=$SECONDS

if [ ! -x "$R/bin/bash" ]; then
    command -v debootstrap >/dev/null || apt-get install -y debootstrap
    echo "== debootstrap --variant=minbase bookworm $R"
    debootstrap --variant=minbase bookworm "$R" "$mirror" > /tmp/chroot-check-debootstrap.log 2>&1 ||
        { tail -20 /tmp/chroot-check-debootstrap.log; die "debootstrap failed"; }
fi
mounted=()
cleanup() { local m; for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
for m in proc dev; do
    mountpoint -q "$R/$m" && continue
    if [ $m = proc ]; then mount -t proc proc "$R/proc"; else mount --bind /dev "$R/dev"; fi
    mounted+=("$R/$m")
done
in_root() { chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
if ! in_root sh -c 'command -v xz' >/dev/null; then
    echo "== apt-get install xz-utils (in the chroot)"
    in_root apt-get install -y -q xz-utils > /tmp/chroot-check-apt.log 2>&1 ||
        { tail -20 /tmp/chroot-check-apt.log; die "could not install xz-utils in the chroot"; }
fi

fails=0
ok() { echo "  [ok] $*"; }
bad() { echo "  [FAIL] $*"; fails=$((fails + 1)); }

echo "== 1. the chroot has none of Ember's libraries"
deps=$(in_root dpkg-query -W -f '${Package}\n' | grep -E '^(libopenblas|libblas|liblapack|libdnnl|libjansson|libyaml|libcsv|libgomp|libgfortran|libquadmath|libcriterion|criterion|python3)' || true)
if [ -z "$deps" ]; then ok "no openblas, oneDNN, jansson, yaml, csv, gomp, gfortran, criterion or python3 package"; else bad "installed: $deps"; fi

# What travels, as the device tool copies it: tracked and untracked-not-ignored files + carry.
W=$R/work
. "$here/config.sh"
B=$EMBER_GPU_PREFIX  # unpacked where it was built for, as run.sh does
rm -rf "$W" "$R$(dirname "$B")"
mkdir -p "$W"
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 -r sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' _ |
    tar --null -T - -cf -) | tar -C "$W" -xf -
cp -r "$src/gpu-bundle" "$W/"
echo "copied $(du -sh "$W" | cut -f1) into $W"

mkdir -p "$R$(dirname "$B")"
in_root tar -C "$(dirname "$B")" -xJf /work/gpu-bundle/ember-gpu.tar.xz
E=(LD_LIBRARY_PATH=$B/lib)
cuda_re='(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc|libnvJitLink)\.so'
missing=$(in_root sh -c "find $B -type f | while read -r f; do head -c 4 \"\$f\" | grep -q ELF || continue; LD_LIBRARY_PATH=$B/lib ldd \"\$f\" | awk -v f=\"\$f\" '/not found/ {print f \": \" \$1}'; done" | sort -u)
notcuda=$(printf '%s\n' "$missing" | awk -F': ' 'NF' | grep -Ev ": $cuda_re" || true)
if [ -z "$notcuda" ]; then ok "ldd: every ELF file's libraries found in the bundle or the base system${missing:+ (CUDA libraries left to the GPU machine: $(printf '%s\n' "$missing" | awk -F': ' 'NF {print $2}' | sort -u | tr '\n' ' '))}"; else bad "ldd: not found: $notcuda"; fi

echo "== 2. ember-info and ember-train with only the bundle on LD_LIBRARY_PATH"
if in_root "${E[@]}" $B/bin/ember-info > /tmp/chroot-check-info.txt 2>&1; then
    ok "ember-info exit 0 ($(grep -c . /tmp/chroot-check-info.txt) lines)"
else
    bad "ember-info failed:"; tail -20 /tmp/chroot-check-info.txt
fi
grep -E -i 'self-test|accepted|refused|loaded' /tmp/chroot-check-info.txt | head -12 | sed 's/^/     /'
if in_root "${E[@]}" sh -c "cd /work && $B/bin/ember-train examples/digits.yaml --epochs 2" > /tmp/chroot-check-train.txt 2>&1; then
    ok "ember-train examples/digits.yaml --epochs 2: $(grep '^test:' /tmp/chroot-check-train.txt | tail -1)"
else
    bad "ember-train failed:"; tail -20 /tmp/chroot-check-train.txt
fi

echo "== 3. tests/gpu/run.sh --device cpu (all suites)"
rm -rf "$W/gpu-out"
suites="train determinism memory nccl bench"
[ -f "$R$B/bin/ember-opcheck" ] && suites="ops $suites"
echo "   suites: $suites (ops needs bin/ember-opcheck in the bundle)"
if in_root sh -c "cd /work && OUT=/work/gpu-out bash tests/gpu/run.sh --device cpu $suites" > /tmp/chroot-check-run.txt 2>&1; then
    ok "run.sh --device cpu passed: $(tr '\n' ';' < "$W/gpu-out/summary.txt")"
else
    bad "run.sh --device cpu failed:"; tail -40 /tmp/chroot-check-run.txt
fi
ls "$W/gpu-out" | tr '\n' ' ' | sed 's/^/     tables: /'; echo

echo "== 4. the CUDA plugin"
if [ -f "$R$B/lib/ember/plugins/ember-cuda.so" ]; then
    # No CUDA library at all: a statically linked runtime loads and reports no device, a
    # dynamically linked one is refused with the loader's message naming libcudart.
    info=$(in_root "${E[@]}" $B/bin/ember-info 2>&1 || true)
    if in_root "${E[@]}" ldd $B/lib/ember/plugins/ember-cuda.so | grep -q libcudart; then
        if printf '%s\n' "$info" | grep -q 'libcudart'; then ok "no CUDA library: refused, naming libcudart"; else bad "no CUDA library: no message naming libcudart"; fi
    elif printf '%s\n' "$info" | grep -q 'cuda: 0 devices'; then
        ok "no CUDA library (static cudart): $(printf '%s\n' "$info" | grep -m1 'cuda: 0 devices' | sed 's/^ *//')"
    else
        bad "no CUDA library: ember-info does not say 'cuda: 0 devices'"; printf '%s\n' "$info" | grep -i cuda | head
    fi
    set +e
    in_root "${E[@]}" sh -c "cd /work && $B/bin/ember-train examples/digits.yaml --device cuda --epochs 1" > /tmp/chroot-check-cuda.txt 2>&1
    rc=$?
    set -e
    if [ $rc = 2 ]; then ok "ember-train --device cuda: exit 2: $(tail -1 /tmp/chroot-check-cuda.txt)"; else bad "ember-train --device cuda: exit $rc"; tail -5 /tmp/chroot-check-cuda.txt; fi
    # This machine's CUDA libraries where the GPU machine's wheels have them (hard links):
    # run.sh's search must find them (by its glob: no python3 here), report their versions,
    # then stop for want of a device.
    py=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
    rt=$(ldconfig -p | awk '/libcudart\.so\.13 / && !n++ {print $NF}')
    bl=$(ldconfig -p | awk '/libcublas\.so\.13 / && !n++ {print $NF}')
    blt=$(ldconfig -p | awk '/libcublasLt\.so\.13 / && !n++ {print $NF}')
    dn=$(ldconfig -p | awk '/libcudnn\.so\.9 / && !n++ {print $NF}')
    if [ -n "$rt" ] && [ -n "$bl" ] && [ -n "$blt" ]; then
        mkdir -p "$R$py/cu13/lib" "$R$py/cudnn/lib"
        for f in "$rt" "$bl" "$blt"; do ln -f "$(readlink -f "$f")" "$R$py/cu13/lib/$(basename "$f")" 2>/dev/null || cp -L "$f" "$R$py/cu13/lib/"; done
        if [ -n "$dn" ]; then # libcudnn.so.9 and the sub-libraries it loads
            for f in "$(dirname "$dn")"/libcudnn*.so.9; do
                ln -f "$(readlink -f "$f")" "$R$py/cudnn/lib/$(basename "$f")" 2>/dev/null || cp -L "$f" "$R$py/cudnn/lib/"
            done
        fi
        if in_root sh -c "cd /work && OUT=/tmp/o bash tests/gpu/run.sh --device cuda train" > /tmp/chroot-check-runcuda.txt 2>&1; then
            bad "run.sh --device cuda passed without a GPU"
        elif grep -q "$py/cu13/lib" /tmp/chroot-check-runcuda.txt && grep -q '^cublas  *13' /tmp/chroot-check-runcuda.txt &&
             grep -q '^cudnn  *9' /tmp/chroot-check-runcuda.txt && grep -q 'no CUDA device' /tmp/chroot-check-runcuda.txt; then
            ok "run.sh --device cuda: found $py/cu13/lib, reported the versions, stopped: $(grep -m1 'no CUDA device' /tmp/chroot-check-runcuda.txt)"
        else
            bad "run.sh --device cuda without a GPU:"; tail -20 /tmp/chroot-check-runcuda.txt
        fi
        sed -n '/^library/,/^run.sh/p' /tmp/chroot-check-runcuda.txt | head -8 | sed 's/^/     /'
        rm -rf "$R/opt/torch"
    else
        echo "  (no libcudart/libcublas 13 here: run.sh's library search is not checked)"
    fi
else
    echo "  the bundle has no ember-cuda.so (packed with --no-cuda): nothing to check"
fi

echo "chroot-check: $fails check(s) failed, $((SECONDS - t0)) s"
[ $fails = 0 ]

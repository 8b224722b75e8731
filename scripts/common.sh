# Shared by scripts/run.sh and scripts/test.sh: package installation, build, stage timing.
# Sourced, not run.

EMBER_PACKAGES="build-essential g++ autoconf automake libtool pkg-config libopenblas-dev \
libdnnl-dev libcriterion-dev zlib1g-dev libdeflate-dev libjansson-dev libcsv-dev libyaml-dev valgrind \
libopenmpi-dev openmpi-bin libprotobuf-c-dev protobuf-c-compiler libonnx-dev python3-onnx \
libplplot-dev plplot-driver-cairo jargon-text python3-venv"

# stage NAME CMD...: run a step and print how long it took.
stage() {
    local name=$1 t0 t1
    shift
    t0=$(date +%s)
    echo "==> $name"
    "$@"
    t1=$(date +%s)
    echo "==> $name: $((t1 - t0)) s"
}

# Install the Debian packages Ember needs (only when one is missing; safe to rerun).
install_packages() {
    local missing="" p sudo=""
    for p in $EMBER_PACKAGES; do
        dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
    done
    [ -z "$missing" ] && { echo "all packages present"; return 0; }
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing
}

# build DIR [configure args...]: configure (once) and build out of tree in DIR.
build() {
    local dir=$1
    shift
    [ -x configure ] || ./autogen.sh
    mkdir -p "$dir"
    if [ ! -f "$dir/Makefile" ]; then
        (cd "$dir" && ../configure -q "$@" 2>&1 | grep -v "cannot remove 'core'" || true)
        [ -f "$dir/Makefile" ] || { echo "configure failed: see $dir/config.log"; return 1; }
    fi
    make -C "$dir" -j"$(nproc)" >"$dir/make.log" 2>&1 || { tail -40 "$dir/make.log"; return 1; }
}

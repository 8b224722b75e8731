#!/bin/sh
# tests/test_sdk_install.sh — the third party's road (issue 18, item 5), run by `make check`
# after its other tests, in the plain build (configure --disable-install-check leaves it out:
# scripts/test.sh does so for the oneDNN-less stage, and configure does so by itself for a
# sanitizer build, whose libember a plain program cannot load):
#   1. `make install DESTDIR=$tmp/root`, and nothing but that tree from then on: PATH,
#      PKG_CONFIG_PATH (with PKG_CONFIG_SYSROOT_DIR), LD_LIBRARY_PATH and EMBER_PLUGIN_PATH
#      point into it;
#   2. the installed template is copied out of the tree and built with pkg-config only, its
#      `make check` runs (ember-info, then ember-opcheck --plugin), and `make install
#      PLUGINDIR=...` puts the plugin into a directory of its own;
#   3. ember-train trains a small model on the installed digits with the plugin's layer in
#      its YAML config: the layer's parameters are in the saved weights under their
#      state-dict names and the test accuracy is above 50% (chance: 10%);
#   4. the installed examples (C and C++, g++) build out of tree with their Makefile and pass
#      ember-opcheck;
#   5. two broken plugins are caught by ember-opcheck, exit status != 0, naming the op:
#      tests/plugins/broken_backward.c (backward off by a factor) and broken_kernel.c (a neg
#      kernel that skips the last element of non-contiguous inputs).
set -u
: "${EMBER_TEST_BUILDDIR:?run through make check}" "${EMBER_TEST_MAKE:=make}" "${CC:=cc}" \
  "${CXX:=c++}"
build=$EMBER_TEST_BUILDDIR
# Outside the build tree: a libember under it would take the build tree's plugins instead.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember-sdk-install.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "--- $*"; }

step "make install DESTDIR=$tmp/root"
# Only the install rule, with the outer make's command-line variables (TESTS=...) left out.
MAKEFLAGS= $EMBER_TEST_MAKE -s -C "$build" install DESTDIR="$tmp/root" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; fail "make install DESTDIR=$tmp/root"; }
prefix=$(sed -n 's/^prefix=//p' "$build/ember.pc")
root=$tmp/root$prefix
for f in bin/ember-info bin/ember-opcheck bin/ember-train lib/pkgconfig/ember.pc \
         share/ember/sdk/README.md share/ember/sdk/template/Makefile \
         share/ember/sdk/example/softsign.cpp; do
    [ -e "$root/$f" ] || fail "make install did not install $f under $root"
done

# The installed tree only: nothing from the build tree or the source tree below this line.
PATH=$root/bin:$PATH
PKG_CONFIG_PATH=$root/lib/pkgconfig
PKG_CONFIG_SYSROOT_DIR=$tmp/root
LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
plugins=$tmp/my-plugins # the template's plugin, installed into a directory of its own
mkdir -p "$plugins"
EMBER_PLUGIN_PATH=$root/lib/ember/plugins:$plugins
export PATH PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR LD_LIBRARY_PATH EMBER_PLUGIN_PATH
unset PKG_CONFIG_LIBDIR EMBER_DISABLE_PLUGINS MAKEFLAGS MFLAGS
command -v ember-opcheck | grep -q "^$root/bin/" || fail "ember-opcheck is not the installed one"

step "the template, copied out and built with pkg-config only"
cp -R "$root/share/ember/sdk/template" "$tmp/my_plugin" || fail "cannot copy the template"
make -C "$tmp/my_plugin" CC="$CC" >"$tmp/template.log" 2>&1 ||
    { cat "$tmp/template.log"; fail "the template does not build"; }
grep -q -- "-I$tmp/root" "$tmp/template.log" || { cat "$tmp/template.log";
    fail "the template was not compiled against the installed headers"; }
make -C "$tmp/my_plugin" check >"$tmp/template-check.log" 2>&1 ||
    { cat "$tmp/template-check.log"; fail "the template's make check"; }
grep -q "loaded *my-plugin" "$tmp/template-check.log" ||
    { cat "$tmp/template-check.log"; fail "ember-info does not show my-plugin loaded"; }
grep -q -E "^[0-9]+ passed, 0 failed$" "$tmp/template-check.log" ||
    { cat "$tmp/template-check.log"; fail "ember-opcheck on the template"; }
make -C "$tmp/my_plugin" install PLUGINDIR="$plugins" >"$tmp/template-install.log" 2>&1 ||
    { cat "$tmp/template-install.log"; fail "the template's make install PLUGINDIR=..."; }
[ -f "$plugins/my_plugin.so" ] || fail "make install did not put my_plugin.so in $plugins"
rm -f "$tmp/my_plugin/my_plugin.so" # from here on, only the installed copy can be found

step "ember-train with the plugin's layer in a YAML config"
cat >"$tmp/scale.yaml" <<EOF
model:
  - Flatten
  - Linear: {in_features: 64, out_features: 32}
  - my_plugin.Scale: {features: 32, alpha: 0.5}
  - ReLU
  - Linear: {in_features: 32, out_features: 10}
data:
  class: mnist
  options: {path: $root/share/ember/data/digits}
  validation: 150
  test: {split: test}
loss: CrossEntropyLoss
optimizer: {class: SGD, lr: 0.05, momentum: 0.9}
loop: {epochs: 3, batch_size: 32, seed: 0}
EOF
ember-train "$tmp/scale.yaml" --save-weights "$tmp/w.safetensors" >"$tmp/train.log" 2>&1 ||
    { cat "$tmp/train.log"; fail "ember-train with my_plugin.Scale"; }
for k in 2.weight 2.bias; do
    head -c 4096 "$tmp/w.safetensors" | grep -a -q "\"$k\"" ||
        { cat "$tmp/train.log"; fail "the saved weights have no '$k' (my_plugin.Scale's)"; }
done
acc=$(sed -n 's/^test: loss .* accuracy \([0-9.]*\)%.*/\1/p' "$tmp/train.log" | tail -n 1)
[ -n "$acc" ] || { cat "$tmp/train.log"; fail "no test accuracy in ember-train's output"; }
awk -v a="$acc" 'BEGIN { exit !(a > 50) }' ||
    { cat "$tmp/train.log"; fail "test accuracy $acc% after 3 epochs (chance is 10%)"; }
echo "trained: test accuracy $acc%"

step "the installed examples (C, and C++ with $CXX), built out of tree"
cp -R "$root/share/ember/sdk/example" "$tmp/example" || fail "cannot copy the examples"
make -C "$tmp/example" CC="$CC" CXX="$CXX" check >"$tmp/example.log" 2>&1 ||
    { cat "$tmp/example.log"; fail "the examples' make check"; }
grep -q "loaded *ember-cxx-example" "$tmp/example.log" ||
    { cat "$tmp/example.log"; fail "ember-info does not show ember-cxx-example loaded"; }

step "broken plugins are caught, naming the op"
for case in "broken_backward broken_backward.double" "broken_kernel neg"; do
    set -- $case
    so=$build/tests/broken/.libs/$1.so
    [ -f "$so" ] || fail "$so is not built"
    ember-opcheck --plugin "$so" >"$tmp/$1.log" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] || { cat "$tmp/$1.log"; fail "ember-opcheck passed $1.so (exit 0)"; }
    [ "$rc" -lt 125 ] || { cat "$tmp/$1.log"; fail "ember-opcheck crashed on $1.so ($rc)"; }
    grep -i "fail" "$tmp/$1.log" | grep -q -w -F "$2" ||
        { cat "$tmp/$1.log"; fail "no failure naming op $2 for $1.so"; }
    echo "$1.so: caught (exit $rc): $(grep -i "fail" "$tmp/$1.log" | grep -w -F "$2" | head -n 1)"
done
echo "PASS: the SDK installs, the template and the examples build and check out of tree, a model trains with the plugin's layer, broken plugins are caught"

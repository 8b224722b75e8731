#!/bin/sh
# check-symbols.sh — `make check`: libember's exports and core/libember.map agree.
#
# Every em_* symbol libember.so exports must be listed, by name, in exactly one node of the
# map, and carry that node's version; every EM_API function of the public headers must be in
# a node (a symbol in no node is made local by `local: *` and silently not exported); every
# listed symbol must be exported. So a new EM_API function fails this test until it is put in
# the current release's node.
#
# Usage (from the build directory, as `make check` runs it):
#   tests/abi/check-symbols.sh [LIBEMBER.so [MAP [INCLUDE_DIR]]]
set -u
src=${srcdir:-.}
lib=${1:-core/.libs/libember.so}
map=${2:-$src/core/libember.map}
inc=${3:-$src/core/include/ember}
nm=${NM:-nm}
tmp=${TMPDIR:-/tmp}/check-symbols.$$
mkdir -p "$tmp" || exit 99
trap 'rm -rf "$tmp"' EXIT
for f in "$lib" "$map"; do
    [ -r "$f" ] || { echo "check-symbols: cannot read $f" >&2; exit 99; }
done

# "name node" for every symbol listed in the map.
awk '
    /^[A-Za-z_][A-Za-z0-9_.]*[ \t]*\{/ { node = $1; next }
    /^\}/ { node = ""; next }
    node != "" && $1 ~ /^em_[A-Za-z0-9_]*;$/ { sub(/;$/, "", $1); print $1, node }
' "$map" | LC_ALL=C sort >"$tmp/map"
# "name node" for every em_ symbol the library exports ("-" when it has no version).
"$nm" -D --defined-only "$lib" | awk '$3 ~ /^em_/ {
    n = $3; v = "-"
    if (index(n, "@")) { v = n; sub(/@+.*/, "", n); sub(/^[^@]*@+/, "", v) }
    print n, v
}' | LC_ALL=C sort >"$tmp/lib"
# every EM_API function the public headers declare
grep -h '^EM_API' "$inc"/*.h | sed -E 's/\(.*//; s/.*[^A-Za-z0-9_](em_[A-Za-z0-9_]+)[[:space:]]*$/\1/' |
    LC_ALL=C sort -u >"$tmp/hdr"

bad=0
dups=$(cut -d' ' -f1 "$tmp/map" | uniq -d)
if [ -n "$dups" ]; then
    echo "check-symbols: listed in more than one node of $map:"; echo "$dups" | sed 's/^/  /'
    bad=1
fi
# exported but not listed (or listed under another node than the version it carries)
missing=$(LC_ALL=C join -v1 "$tmp/lib" "$tmp/map" | cut -d' ' -f1)
if [ -n "$missing" ]; then
    echo "check-symbols: exported by $lib but in no node of $map:"
    echo "$missing" | sed 's/^/  /'
    bad=1
fi
wrong=$(LC_ALL=C join "$tmp/lib" "$tmp/map" | awk '$2 != $3 { print "  " $1 ": exported as " $2 ", listed in " $3 }')
if [ -n "$wrong" ]; then
    echo "check-symbols: version tags disagree with $map:"; echo "$wrong"; bad=1
fi
unlisted=$(cut -d' ' -f1 "$tmp/map" | LC_ALL=C sort -u | LC_ALL=C comm -23 "$tmp/hdr" -)
if [ -n "$unlisted" ]; then
    echo "check-symbols: EM_API functions of $inc in no node of $map (not exported at all;"
    echo "add each to the node of the release being made):"
    echo "$unlisted" | sed 's/^/  /'
    bad=1
fi
cut -d' ' -f1 "$tmp/lib" >"$tmp/libn"
stale=$(cut -d' ' -f1 "$tmp/map" | LC_ALL=C sort -u | LC_ALL=C comm -23 - "$tmp/libn")
if [ -n "$stale" ]; then
    echo "check-symbols: listed in $map but not exported by $lib (removed or never defined?):"
    echo "$stale" | sed 's/^/  /'
    bad=1
fi
[ $bad -eq 0 ] && echo "check-symbols: $(wc -l <"$tmp/lib") exported symbols, each in its node of $map"
exit $bad

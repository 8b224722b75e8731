#!/bin/sh
# tests/test_headers.sh — include hygiene (issue 14):
#   - every public header compiles on its own, twice in a row (its include guard), as C11 and
#     as C++, with -Wall -Wextra -Werror: a user may include any one of them first;
#   - no file of the library, its plugins, the trainer or the tools includes the umbrella
#     <ember/ember.h>: each includes the public headers it uses, so touching one public header
#     rebuilds only the objects that use it.
set -u
: "${srcdir:=.}" "${CC:=cc}" "${CXX:=c++}"
inc="$srcdir/core/include"
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fail=0
n_headers=0
for h in "$inc"/ember/*.h; do
    n=$(basename "$h")
    n_headers=$((n_headers + 1))
    printf '#include <ember/%s>\n#include <ember/%s>\nint ember_header_check;\n' "$n" "$n" \
        > "$tmp/one.c"
    cp "$tmp/one.c" "$tmp/one.cpp"
    if ! $CC -std=c11 -fsyntax-only -Wall -Wextra -Werror -I"$inc" "$tmp/one.c"; then
        echo "FAIL: ember/$n does not compile on its own as C11"
        fail=1
    fi
    if ! $CXX -fsyntax-only -Wall -Wextra -Werror -I"$inc" "$tmp/one.cpp"; then
        echo "FAIL: ember/$n does not compile on its own as C++"
        fail=1
    fi
done
[ "$n_headers" -gt 20 ] || { echo "FAIL: only $n_headers public headers under $inc"; fail=1; }
umbrella=$(grep -rlE '^#include [<"]ember/ember\.h[">]' "$srcdir/core" "$srcdir/plugins" \
    "$srcdir/trainer" "$srcdir/tools" --include='*.c' --include='*.h' |
    grep -v 'core/include/ember/ember\.h$')
if [ -n "$umbrella" ]; then
    echo "FAIL: these internal files include the <ember/ember.h> umbrella; include the headers" \
         "they use instead:"
    echo "$umbrella"
    fail=1
fi
[ "$fail" = 0 ] && echo "ok: $n_headers public headers compile on their own; no internal file includes the umbrella"
exit "$fail"

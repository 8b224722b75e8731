#!/bin/sh
# Regenerates the build system from configure.ac and Makefile.am.
set -e
cd "$(dirname "$0")"
# m4/ holds only libtool's macros, which libtoolize copies in; it must exist before aclocal
# looks into it (AC_CONFIG_MACRO_DIR), or aclocal warns that it cannot open it.
mkdir -p m4
autoreconf -fi

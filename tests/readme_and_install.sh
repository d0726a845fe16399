#!/bin/sh
# Checks that (1) the README's C example is exactly examples/quickstart.c and (2) `make install`
# yields a library that a user program builds against with pkg-config alone, and that it runs.
# Usage: tests/readme_and_install.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

awk '/^```c$/{f=1;next} /^```$/{if(f){exit}} f' "$src/README.md" > "$tmp/readme.c"
if ! cmp -s "$tmp/readme.c" "$src/examples/quickstart.c"; then
    echo "FAIL: README.md's C example differs from examples/quickstart.c:" >&2
    diff "$tmp/readme.c" "$src/examples/quickstart.c" >&2 || true
    exit 1
fi

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
pc=$(find "$tmp/prefix" -name composer.pc | head -n 1)
[ -n "$pc" ] || { echo "FAIL: composer.pc was not installed" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
cc -std=c11 -Wall -Wextra -Werror "$src/examples/quickstart.c" $(pkg-config --cflags --libs composer) \
   -Wl,-rpath,"$tmp/prefix/lib" -Wl,-rpath,"$(dirname "$(dirname "$pc")")" -o "$tmp/quickstart"
out=$("$tmp/quickstart")
echo "$out"
case "$out" in
    "loss 2.3026"*) echo "readme example and installed library: ok" ;;
    *) echo "FAIL: unexpected output from the README example: $out" >&2; exit 1 ;;
esac

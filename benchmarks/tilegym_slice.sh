#!/usr/bin/env bash
# A trimmed copy of a TileGym checkout that still imports and runs the tests of the ops named, small
# enough to travel to a GPU host beside a toolchain pack (the carry limit is 64 MiB, a tileiras pack
# takes 58-63 MB of it):
#
#   bash benchmarks/tilegym_slice.sh TILEGYM DEST OP...       # e.g. .tilegym .tg-rms rms_norm
#
# Keeps pyproject.toml, src/tilegym without its C++ and Rust backends and without its transformers
# integration, its third-party suites and its kernel inventory (`import tilegym` needs none of them:
# those backends report themselves unavailable, and nothing under ops/ imports the other three),
# and of tests/ only the shared modules plus tests/ops/**/test_<op>.py for each OP (with the
# __init__.py files on their way). DEST is replaced. Prints DEST's size in bytes.
set -eu
src=${1:?usage: tilegym_slice.sh TILEGYM DEST OP...}
dest=${2:?usage: tilegym_slice.sh TILEGYM DEST OP...}
shift 2
[ $# -gt 0 ] || { echo "tilegym_slice.sh: name at least one op" >&2; exit 2; }
mkdir -p "$(dirname "$dest")"
dest="$(cd "$(dirname "$dest")" && pwd)/$(basename "$dest")"  # absolute: the copy runs from inside TILEGYM
cd "$src"
files="pyproject.toml src/tilegym tests/__init__.py tests/common.py tests/config.py tests/conftest.py tests/ops/__init__.py"
for op in "$@"; do
  found=$(find tests/ops -name "test_${op}.py")
  [ -n "$found" ] || { echo "tilegym_slice.sh: no tests/ops/**/test_${op}.py in $src" >&2; exit 2; }
  for test in $found; do
    files="$files $test"
    dir=$(dirname "$test")
    while [ "$dir" != "tests/ops" ] && [ "$dir" != "." ]; do  # the packages above the test file
      [ -f "$dir/__init__.py" ] && files="$files $dir/__init__.py"
      dir=$(dirname "$dir")
    done
  done
done
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
# shellcheck disable=SC2086 - $files is a list of paths without spaces
tar cf - --exclude=__pycache__ --exclude=src/tilegym/ops/tilecpp --exclude=src/tilegym/ops/cutile_rs \
  --exclude=src/tilegym/transformers --exclude=src/tilegym/suites --exclude=src/tilegym/kernel_inventory \
  $files | tar xf - -C "$dest.tmp"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
du -sb "$dest" | cut -f1

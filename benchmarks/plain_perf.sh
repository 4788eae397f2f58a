#!/usr/bin/env bash
# The unit issue 21 counts a try in: one perf run of a TileGym op as a user runs it by hand, plain
# pytest from a shell, no cutile-perf involved:
#
#   bash benchmarks/plain_perf.sh <TileGym folder with src/ and tests/> <op> [runs, default 3]
#
# Runs the op's perf selection (init's default, session.PERF_TEMPLATE's -k expression, without
# cutile-perf's --print-record) <runs> times in a fresh copy. Run 1 starts with an empty cuTile
# compile cache (a fresh machine, or the first run after a kernel change); the later runs reuse it,
# as a user's second run would. Prints one line per run: wall seconds and pytest's summary line.
set -u
TG=$(cd "$1" && pwd); OP=$2; RUNS=${3:-3}
CP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d)
cp -r "$TG" "$WORK/tilegym" && cd "$WORK/tilegym" || exit 1
. "$CP/benchmarks/tilegym_test_path.sh" && TEST=$(tilegym_test_path "$OP")
export CUDA_TILE_CACHE_DIR=$WORK/jit-cache  # empty before run 1
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
for i in $(seq "$RUNS"); do
  t0=$(date +%s%N)
  python -m pytest "$TEST" -k "test_perf and cutile and not cutile_rs" -q -p no:cacheprovider > "$WORK/run$i.txt" 2>&1
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  echo "$OP run $i: $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s, exit $rc, $(tail -n 1 "$WORK/run$i.txt")"
done

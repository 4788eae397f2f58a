#!/usr/bin/env bash
# Room on the device machine: a `run` copies the tracked tree plus what it carries, 64 MiB at most,
# and the 13.4 toolchain (.gpu) alone takes about 60 MiB. Before a call that also carries a TileGym
# copy, move what the device never reads out of the tree; move it back before any commit:
#
#   bash benchmarks/device_room.sh out [folder to keep ...]   # e.g. benchmarks/results/2026-12-03-h200-s23
#   bash benchmarks/device_room.sh in
#   bash benchmarks/device_room.sh size                       # KiB the next run would copy (du -k)
#
# "out" moves tests/, docs/, references/ and every results folder (benchmarks/results/*,
# evals/results/*) but the ones named to a holding folder outside the repository; "in" puts them
# back, and refuses to overwrite anything.
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOLD=${DEVICE_ROOM_HOLD:-/tmp/cutile-perf-device-room}
cd "$ROOT"
case "${1:-}" in
  out)
    shift
    [ -e "$HOLD" ] && { echo "device_room: $HOLD exists: run 'in' first" >&2; exit 1; }
    keep=" $* "
    for d in tests docs references benchmarks/results/* evals/results/*; do
      [ -e "$d" ] || continue
      case "$keep" in *" $d "*|*" ${d%/} "*) continue ;; esac
      mkdir -p "$HOLD/$(dirname "$d")" && mv "$d" "$HOLD/$d"
    done
    echo "moved out to $HOLD; the tree now copies $(bash "$0" size) KiB" ;;
  in)
    [ -d "$HOLD" ] || { echo "device_room: nothing held in $HOLD" >&2; exit 1; }
    (cd "$HOLD" && find . -mindepth 1 -maxdepth 3 \( -path ./tests -o -path ./docs -o -path ./references \
      -o -path './benchmarks/results/*' -o -path './evals/results/*' \) -prune -print) | while read -r d; do
      d=${d#./}
      [ -e "$d" ] && { echo "device_room: $d exists in the tree; left in $HOLD" >&2; continue; }
      mv "$HOLD/$d" "$d"
    done
    find "$HOLD" -type d -empty -delete 2>/dev/null || true
    [ -d "$HOLD" ] && { echo "device_room: $HOLD still holds files" >&2; exit 1; }
    git status --short ;;
  size)
    # What a run copies: tracked files, untracked files git does not ignore, and the carried folders.
    carried=$(for d in .gpu .tg-both; do [ -d "$d" ] && echo "$d"; done)
    { git ls-files -z --cached --others --exclude-standard | xargs -0 du -k 2>/dev/null | awk '{print $1}'
      [ -n "$carried" ] && du -sk $carried | awk '{print $1}'; } | awk '{s += $1} END {print s}' ;;
  *) echo "usage: device_room.sh out [keep ...] | in | size" >&2; exit 2 ;;
esac

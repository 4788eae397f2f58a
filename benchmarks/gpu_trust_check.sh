#!/usr/bin/env bash
# On a GPU host: is the children's sandbox available, what it costs per child, and the extended GPU
# red team (attacks f-i: perf-only launch shrink, a hidden timer patch, a .pth planter, a branch swap).
#
#   bash benchmarks/gpu_trust_check.sh <output folder>
#
# TileGym's rms_norm loop through the sandbox is benchmarks/tilegym_loop.sh (a separate call).
set -u
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONPATH=$PWD/scripts:${PYTHONPATH:-}
python benchmarks/box_overhead.py --runs 20 2>&1 | tee "$OUT/box.txt"
python benchmarks/redteam_gpu.py --repeats 2 --timeout 200 --only f,g,h,i --out "$OUT/redteam-fghi.json" \
  2>&1 | tee "$OUT/redteam-fghi.txt" | tail -40

#!/usr/bin/env bash
# Survey NVIDIA TileGym on a GPU machine: which cuTile ops cutile-perf can drive (docs/survey.md,
# "NVIDIA TileGym ops the loop can drive"). Also scaffolds the missing softmax perf test and runs it once.
#
#   bash benchmarks/tilegym_survey.sh <TileGym checkout (src/, tests/)> <output folder>
#
# The TileGym folder must be a git repository (the H200 run made one with git init + one commit).
# Budgets: --budget caps each phase; runs it cuts are listed as "cut by --budget", not as failures.
set -u
TG=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
CP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
P1=${P1:-110}; P2=${P2:-125}; PS=${PS:-40}
export PYTHONPATH=$CP/scripts:$TG/src:${PYTHONPATH:-}
cd "$TG"
{ nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, cuda.tile; print(torch.__version__, cuda.tile.__version__)"; } > "$OUT/env.txt" 2>&1
timeout -s INT -k 5 $((P1+20)) python -m cutile_perf survey --run --sample 1 --timeout 60 --jobs 16 --budget $P1 \
  --under src/tilegym/ops --json --logs "$OUT/logs-ops" > "$OUT/survey-ops.json" 2> "$OUT/survey-ops.err"
echo "ops rc=$?" >> "$OUT/rc.txt"
# scaffold-perf on an op without a perf test, then one run of the generated test with the record plugin.
python -m cutile_perf scaffold-perf --kernel src/tilegym/ops/cutile/softmax.py > "$OUT/scaffold.txt" 2>&1
cp tests/ops/test_softmax_perf.py "$OUT/" 2>/dev/null
timeout $PS python -m pytest tests/ops/test_softmax_perf.py -k "test_perf and cutile and not cutile_rs" -q \
  --print-record -p no:cacheprovider -p cutile_perf.pytest_plugin > "$OUT/softmax_perf.txt" 2>&1
echo "softmax_perf rc=$?" >> "$OUT/rc.txt"
rm -f tests/ops/test_softmax_perf.py
timeout -s INT -k 5 $((P2+20)) python -m cutile_perf survey --run --sample 1 --timeout 60 --jobs 16 --budget $P2 \
  --under src/tilegym/suites --json --logs "$OUT/logs-suites" > "$OUT/survey-suites.json" 2> "$OUT/survey-suites.err"
echo "suites rc=$?" >> "$OUT/rc.txt"
cat "$OUT/rc.txt"

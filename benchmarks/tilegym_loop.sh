#!/usr/bin/env bash
# The loop on NVIDIA TileGym's rms_norm, its tests unmodified, through the pristine-checkout path.
#
#   bash benchmarks/tilegym_loop.sh <TileGym folder with src/ and tests/> <output folder> [repeats]
#
# A fresh git repository is made from a copy of the TileGym folder. The ORIGINAL folder's src/ is
# put first on PYTHONPATH, as an editable install of another checkout would: the H200 incident of
# issue 9, where no candidate code ever ran. Every stage must still measure the candidate commit
# (its records and module origins are checked), so the edit below must show up in the numbers.
# Prints each command's wall time; the rows' `timings` give the harness's own share per iteration.
set -u
TG=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd); REPEATS=${3:-3}
CP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d)/tilegym
cp -r "$TG" "$WORK" && cd "$WORK" || exit 1
rm -rf .git && git init -q -b main && git add -A && git -c user.email=loop@example.com -c user.name=loop commit -qm "TileGym copy"
export PYTHONPATH=$CP/scripts:$TG/src:${PYTHONPATH:-}
run() { local t0=$SECONDS; python -m cutile_perf "$@"; local rc=$?
        echo "[$((SECONDS - t0)) s, exit $rc] cutile-perf $*"; }
run init --kernel src/tilegym/ops/cutile/rms_norm.py --test tests/ops/test_rms_norm.py
run baseline --repeats "$REPEATS"
# The forward static persistent launch: grid = min(NUM_SMS, tiles) becomes min(2 x NUM_SMS, tiles).
sed -i 's/^                NUM_SMS,$/                NUM_SMS * 2,/' src/tilegym/ops/cutile/rms_norm.py
git diff --stat
run try "static persistent grid: 2 CTAs per SM instead of 1"
run status
cp sandbox/experiments.jsonl sandbox/perf_results.md "$OUT/" 2>/dev/null
python "$CP/benchmarks/log_rows.py" "$OUT/experiments.jsonl"

#!/usr/bin/env bash
# Candidates for a TileGym op, decided inside one 10-minute GPU job with the command the skill
# teaches (SKILL.md, "Remote GPU"):
#
#   bash benchmarks/tilegym_batch.sh <TileGym folder with src/ and tests/> <output folder> [job seconds] [--check]
#   PLAN=<folder with plan.yaml and cand/> OP=<op> bash benchmarks/tilegym_batch.sh ...   # a prepared plan
#   INIT_ARGS='--correctness-jobs 4' bash benchmarks/tilegym_batch.sh ...                  # more init options
#   PLAN=comments bash benchmarks/tilegym_batch.sh ...                                      # 4 comment-only tries
#   RECHECK=one,every bash benchmarks/tilegym_batch.sh ...   # each try re-checked (benchmarks/forced_recheck.py)
#
# In a fresh git repository made from a copy of the folder: `init`, the candidate files in
# sandbox/cand/ and sandbox/plan.yaml, then `cutile-perf batch sandbox/plan.yaml --baseline 3
# --job-seconds N`, where N is what is left of the job (default 600 s) after the set-up. With --check,
# only `batch --check` runs (no GPU needed). Prints each row with its timings; copies the log and the
# table to the output folder, and every child's log (runs.tar.gz).
#
# Without PLAN, the plan is ours, for rms_norm (10 perf cases): first a smaller default row tile for
# rows of 2048-8192 columns, which moves 3 of the 10 cases by a little and so may send them to the
# interleaved re-check; then a 2x persistent grid, a smaller row tile, and a comment-only change.
# With PLAN (e.g. evals/results/2026-12-02-rehearsal-silu/plan, an agent's plan for silu_and_mul
# made without a GPU), its plan.yaml and cand/ are used as they are, for src/tilegym/ops/cutile/<OP>.py.
set -u
TG=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd); JOB=${3:-600}; MODE=${4:-}
CP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d)/tilegym
cp -r "$TG" "$WORK" && cd "$WORK" || exit 1
rm -rf .git && git init -q -b main && git add -A && git -c user.email=loop@example.com -c user.name=loop commit -qm "TileGym copy"
export PYTHONPATH=$CP/scripts:${PYTHONPATH:-}
OP=${OP:-rms_norm}  # a path under ops/cutile/ (activation/geglu: its test is tests/ops/activation/test_geglu.py)
K=src/tilegym/ops/cutile/$OP.py
. "$CP/benchmarks/tilegym_test_path.sh" && TEST=$(tilegym_test_path "$OP")
python -m cutile_perf init --kernel "$K" --test "$TEST" ${INIT_ARGS:-} > "$OUT/init.txt" 2>&1
mkdir -p sandbox/cand
if [ "${PLAN:-}" = comments ]; then
  # Four changes that leave the kernel as it is: what a try costs when its single run is within
  # noise, and (about every other time so far) when a case lands in doubt and is re-checked.
  tries="tries:"
  for c in a b c d; do
    { cat "$K"; echo "# comment-only change $c: the same kernel"; } > "sandbox/cand/comment_$c.py"
    tries="$tries
  - optimization: \"comment only ($c): the same kernel\"
    files: {$K: sandbox/cand/comment_$c.py}"
  done
  echo "$tries" > sandbox/plan.yaml
elif [ -n "${PLAN:-}" ]; then
  PLAN=$(cd "$CP" && cd "$PLAN" && pwd) || exit 1
  cp "$PLAN"/cand/*.py sandbox/cand/ && cp "$PLAN/plan.yaml" sandbox/plan.yaml || exit 1
else
sed 's/^                NUM_SMS,$/                NUM_SMS * 2,/' "$K" > sandbox/cand/grid2x.py
sed 's/^                TILE_SIZE_M = 16$/                TILE_SIZE_M = 8/' "$K" > sandbox/cand/tile_m8.py
sed 's/^            TILE_SIZE_M = 4  # Default value/            TILE_SIZE_M = 2  # Default value/' "$K" > sandbox/cand/tile_m2.py
{ cat "$K"; echo "# comment-only change: the same kernel"; } > sandbox/cand/comment.py
for c in grid2x tile_m8 tile_m2 comment; do cmp -s "$K" "sandbox/cand/$c.py" && { echo "candidate $c is unchanged"; exit 1; }; done
cat > sandbox/plan.yaml <<EOF
tries:
  - optimization: "row tile 2 instead of 4 for rows of 2048-8192 columns"
    files: {$K: sandbox/cand/tile_m2.py}
  - optimization: "static persistent grid: 2 CTAs per SM"
    files: {$K: sandbox/cand/grid2x.py}
  - optimization: "row tile 8 instead of 16 for rows of <= 1024 columns"
    files: {$K: sandbox/cand/tile_m8.py}
  - optimization: "comment only (the same kernel)"
    files: {$K: sandbox/cand/comment.py}
EOF
fi
LEFT=$((JOB - SECONDS - 10))
echo "set-up took ${SECONDS} s; batch gets --job-seconds $LEFT"
if [ "$MODE" = "--check" ]; then
  python -m cutile_perf batch sandbox/plan.yaml --baseline 3 --job-seconds "$LEFT" --check; exit $?
fi
t0=$SECONDS
if [ -n "${RECHECK:-}" ]; then CUTILE_PERF=(python "$CP/benchmarks/forced_recheck.py" "$RECHECK"); else CUTILE_PERF=(python -m cutile_perf); fi
"${CUTILE_PERF[@]}" batch sandbox/plan.yaml --baseline 3 --job-seconds "$LEFT"
echo "[batch: $((SECONDS - t0)) s, exit $?; whole job so far: ${SECONDS} s]"
cp sandbox/experiments.jsonl sandbox/perf_results.md "$OUT/" 2>/dev/null
tar czf "$OUT/runs.tar.gz" -C sandbox runs 2>/dev/null  # every child's log
python "$CP/benchmarks/log_rows.py" "$OUT/experiments.jsonl" --runs sandbox/runs

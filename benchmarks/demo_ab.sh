#!/usr/bin/env bash
# The demo, run by two versions of the harness in turn on one machine, with what each step cost:
# the whole demo's wall time, its experiments.jsonl (each row's `timings`) and every child's log
# (pytest's own "in N s" against the stage's seconds) in runs.tar.gz, since the device returns a
# few files only. Compare ratios from one call, not across machines.
#
#   bash benchmarks/demo_ab.sh OUT ORDER [OLD]
#
# OUT: the folder for the results. ORDER: the runs, in turn, e.g. "new old new" ("new": this tree;
# "old": the harness under OLD, default .old, a copy of another commit's scripts/ made with
#   mkdir .old && git archive <commit> scripts | tar -x -C .old
# and kept out of git with .git/info/exclude). A version may end in +jobsN: that run's demo has
# --correctness-jobs N (e.g. "new new+jobs3"); in +nobytecode: its boxed children compile installed
# code from source (CUTILE_PERF_INSTALLED_BYTECODE=0, child/bytecode.py); in +nospares: its perf runs
# start fresh in their turn, no spare beside the run before (demo --no-prestart-perf). Each run's demo is stopped
# after DEMO_TIMEOUT seconds (default 190).
set -u
out=$1; order=$2; old=$(cd "${3:-.old}" 2>/dev/null && pwd || true)
here=$(pwd)
mkdir -p "$out"
if [ -n "$old" ]; then  # what the old package reads from its checkout: this tree's files
  for f in examples templates SKILL.md; do [ -e "$old/$f" ] || ln -s "$here/$f" "$old/$f"; done
fi
n=0
for version in $order; do
  n=$((n + 1))
  args=(); bytecode=1
  case $version in
    *+jobs*) args=(--correctness-jobs "${version##*+jobs}") ;;
    *+nobytecode) bytecode=0 ;;
    *+nospares) args=(--no-prestart-perf) ;;
  esac
  case ${version%%+*} in
    new) path=$here/scripts ;;
    old) [ -n "$old" ] || { echo "demo_ab: no old tree" >&2; exit 2; }; path=$old/scripts ;;
    *) echo "demo_ab: $version is neither new nor old" >&2; exit 2 ;;
  esac
  dest=$out/$n-${version//+/-}  # the device returns no file whose name holds odd characters
  mkdir -p "$dest"
  work=$(mktemp -d)
  (
    cd "$work"
    export PYTHONPATH=$path${PYTHONPATH:+:$PYTHONPATH} CUTILE_PERF_INSTALLED_BYTECODE=$bytecode
    python -c 'import cutile_perf, sys; print("harness:", cutile_perf.__file__)'
    echo "demo arguments: --kernel rmsnorm ${args[*]} (CUTILE_PERF_INSTALLED_BYTECODE=$bytecode)"
    began=$(date +%s.%N)
    timeout "${DEMO_TIMEOUT:-190}" python -u -m cutile_perf demo --kernel rmsnorm "${args[@]}" 2>&1 \
      | python -u -c 'import sys, time
t0 = time.time()
for line in sys.stdin:
    print(f"{time.time() - t0:7.2f} {line}", end="", flush=True)'
    echo "exit ${PIPESTATUS[0]}, demo wall $(python -c "import time; print(f'{time.time() - $began:.1f}')") s"
  ) > "$dest/demo.txt" 2>&1
  demo=$(find "$work" "$path/.." -maxdepth 3 -type d -path '*demo/sandbox' 2>/dev/null | head -1)
  if [ -n "$demo" ]; then
    cp "$demo/experiments.jsonl" "$dest/" 2>/dev/null
    tar czf "$dest/runs.tar.gz" -C "$demo" runs 2>/dev/null
    rm -rf "$demo"  # a later run whose demo stops before its copy must not find this one's
  fi
  tail -1 "$dest/demo.txt"
  rm -rf "$work"
done

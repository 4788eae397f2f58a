#!/usr/bin/env bash
# Session 44 GPU driver (results under benchmarks/results/2026-12-07-*-s44). Usage: bash gpu_s44.sh STEP [SECONDS]...
source .gpu/setup.sh
export PYTHONPATH=$PWD/scripts:$PWD/benchmarks:$PYTHONPATH
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, cuda.tile, git; print('torch', torch.__version__, 'cuda.tile', cuda.tile.__version__)"
git init -q .tg-slice 2>/dev/null; (cd .tg-slice && git add -A && git -c user.name=s44 -c user.email=s44@x commit -qm slice) >/dev/null 2>&1
began=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - began) )); }
steps=("$@")
if [ "${1:-}" = auto ]; then  # the H200 finishes issue 39's runs
  if grep -q H200 "$OUT/gpu.txt"; then steps=(swiglu2 oldverify-bundled redteam controls); export KERNELS=${KERNELS:-rms_norm,swiglu,softmax} PARALLEL=${PARALLEL:-3} END_S=${END_S:-560}
  # An H100: the bundled old session's verify (never run on a GPU) and the screen's phases
  else steps=(oldverify-bundled screen8); export OB_MAX=220; fi
elif [ "${1:-}" = auto2 ]; then  # a second call: TileGym's old session, or the bundled one and the screen goal
  if grep -q H200 "$OUT/gpu.txt"; then steps=(oldverify)
  else steps=(oldverify-bundled screen8); export OB_MAX=220; fi
fi
for step in "${steps[@]}"; do
  echo "=== $step at $(( $(date +%s) - began )) s"
  case "$step" in
    redteam)  # issue 39 item 6: the bundled softmax red team with bench_record's timed calls checked (l, m new)
      rb=${REDTEAM_S:-300}
      timeout $(( rb + 20 )) python benchmarks/redteam_gpu.py --only "${ATTACKS:-j,k,l,m}" --repeats 2 --timeout 200 \
        --budget "$rb" --out "$OUT/redteam.json" > "$OUT/redteam.txt" 2>&1; echo "rc=$?"; tail -30 "$OUT/redteam.txt" ;;
    oldverify-bundled)  # issue 39 item 5 on the bundled softmax: (l) kept unchecked, then verify (cheaper than oldverify)
      ob=$(left ${END_S:-570}); [ "$ob" -gt "${OB_MAX:-300}" ] && ob=${OB_MAX:-300}; [ "$ob" -lt 60 ] && { echo "oldverify-bundled: $ob s left, skipped"; continue; }
      timeout "$ob" python benchmarks/redteam_gpu.py --old-session l --repeats 2 --timeout 200 --budget $(( ob - 20 )) \
        --out "$OUT/oldverify-bundled.json" > "$OUT/oldverify-bundled.txt" 2>&1; echo "rc=$?"; tail -6 "$OUT/oldverify-bundled.txt" ;;
    swiglu2)  # issue 39: the profiler cheat that returned torch.empty on swiglu (kept in s36), after child/stale_memory; honest control
      grep -q H200 "$OUT/gpu.txt" || [ -n "$ANY_CARD" ] || { echo "swiglu2 skipped: not an H200"; continue; }
      timeout 200 python benchmarks/checked_gpu.py .tg-slice --ops swiglu --changes profiler,honest --ab-runs 0 --budget 180 \
        --out "$OUT/swiglu2.json" > "$OUT/swiglu2.txt" 2>&1; echo "rc=$?"; tail -12 "$OUT/swiglu2.txt" ;;
    memory)  # issue 39 item 7: GPU memory of checked timing on rms_norm's largest perf case
      timeout 150 python benchmarks/checked_memory.py .tg-slice --test tests/ops/test_rms_norm.py \
        -k "test_perf and cutile and 65536-16384 and multi_wave_reload" --runs 3 --out "$OUT/memory.json" > "$OUT/memory.txt" 2>&1
      echo "rc=$?"; tail -8 "$OUT/memory.txt" ;;
    screen8)  # issue 41 item 1: 8 candidates (4 known, 4 entry hints) of silu_and_mul
      st=$(left ${END_S:-570}); [ "$st" -gt 420 ] && st=420
      timeout "$st" python benchmarks/screen_gpu.py .tg-slice --op silu_and_mul --hints "${HINTS:-4}" --seconds "${SCREEN_S:-0}" ${CASES:+--cases $CASES} --plain-runs "${PLAIN:-2}" \
        --out "$OUT/screen8.json" > "$OUT/screen8.txt" 2>&1; echo "rc=$?"; tail -30 "$OUT/screen8.txt" ;;
    campaign)  # issue 41 item 4: our own hint candidates on three ops, screened and decided; one campaign per op
      ops=${OPS:-swiglu softmax rms_norm}; n=$(echo $ops | wc -w); total=${CAMPAIGN_S:-540}; t0=$(date +%s)
      for op in $ops; do
        spent=$(( $(date +%s) - t0 )); share=$(( (total - spent) / n )); n=$((n - 1))
        rm -rf /tmp/cands-$op && python benchmarks/tilegym_candidates.py .tg-slice --ops $op --most "${MOST:-2}" --out /tmp/cands-$op
        echo "--- campaign $op, $share s"
        timeout "$share" python benchmarks/tilegym_campaign.py .tg-slice /tmp/cands-$op --out "$OUT/campaign-$op" \
          --screen-seconds "${CSCREEN_S:-0}" --top 1 --job-seconds $(( share * 45 / 100 )) > "$OUT/campaign-$op.txt" 2>&1
        echo "rc=$?"; tail -6 "$OUT/campaign-$op.txt"
      done ;;
    oldverify)  # issue 39 item 5: a cheat kept in a session without checked timing, then verify
      # s41: init, baseline, an honest try, the unchecked cheat and verify did not fit 330 s; alone, ~560 s
      timeout "${OLDVERIFY_S:-560}" python benchmarks/checked_gpu.py .tg-slice --ops silu_and_mul --changes "" --old-session count \
        --ab-runs 0 --budget "$(( ${OLDVERIFY_S:-560} - 30 ))" --out "$OUT/oldverify.json" > "$OUT/oldverify.txt" 2>&1
      echo "rc=$?"; tail -15 "$OUT/oldverify.txt" ;;
    controls)  # issue 39 item 6: every bundled prepared step, no false alarm
      cs=${CONTROLS_S:-$(left ${END_S:-580})}; kernels=${KERNELS:+--kernels $KERNELS}; tag=controls-${KERNELS:-all}; tag=${tag//,/-}
      timeout "$cs" python benchmarks/honest_controls.py $kernels --parallel "${PARALLEL:-1}" --budget "$(( cs - 45 ))" \
        --out "$OUT/$tag" > "$OUT/$tag.txt" 2>&1; echo "rc=$?"; tail -25 "$OUT/$tag.txt" ;;
    spares)  # issue 40 item 1: the demo with and without spare perf children, interleaved
      DEMO_TIMEOUT=${DEMO_S:-180} bash benchmarks/demo_ab.sh "$OUT/spares" "${ORDER:-new new+nospares new+nospares new}"
      python benchmarks/demo_ab_table.py "$OUT/spares" | tee "$OUT/spares/table.md" ;;
    profile)  # issue 41: where a plain TileGym perf run's seconds go (imports, collection, each test's setup/call)
      [ "$(left ${END_S:-590})" -lt 70 ] && { echo "profile: too little time left, skipped"; continue; }
      (cd .tg-slice && export PYTHONPATH=$PWD/src:$PYTHONPATH; sel="test_perf and cutile and not cutile_rs"
       t() { local a=$(date +%s%N); "$@"; echo "wall $(( ($(date +%s%N) - a) / 1000000 )) ms: $*"; }
       t python -c "import torch" ; t python -c "import torch, tilegym" ; t python -c "import torch; torch.zeros(1, device='cuda')"
       t python -X importtime -c "import tilegym" 2> "$OUT/importtime.txt"
       t python -m pytest tests/ops/test_silu_and_mul.py --collect-only -q -k "$sel" | tail -1
       ids=$(python -m pytest tests/ops/test_silu_and_mul.py --collect-only -q -k "$sel" | grep "::" | awk 'NR==1||NR==4||NR==8')
       t python -m pytest tests/ops/test_silu_and_mul.py -k "$sel" -q -p no:cacheprovider --durations=0 | grep -v "^$" | tail -30
       t python -m pytest $ids -q -p no:cacheprovider --durations=0 | grep -v "^$" | tail -12
      ) > "$OUT/profile.txt" 2>&1; tail -80 "$OUT/profile.txt" ;;
    pack) (cd "$OUT" && tar czf /tmp/out.tar.gz --exclude=out.tar.gz . && find . -mindepth 1 -delete && mv /tmp/out.tar.gz out.tar.gz) ;;
    *) echo "unknown step $step" ;;
  esac
done
echo "=== done at $(( $(date +%s) - began )) s"
# The device returns at most 8 files: everything goes back as one archive (run `pack` after a timeout too).

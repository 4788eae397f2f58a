#!/usr/bin/env bash
# Session 36 GPU driver (benchmarks/results/2026-12-06-h200-s36). Usage: bash gpu_s35.sh <step>
source .gpu/setup.sh
export PYTHONPATH=$PWD/scripts:$PYTHONPATH
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python -c "import torch, cuda.tile, git; print('torch', torch.__version__)"
collect() {  # the sessions' logs and tables
    for d in /tmp/checked-gpu-*/*/sandbox; do
        op=$(basename "$(dirname "$d")"); mkdir -p "$OUT/$1/$op"
        cp "$d"/experiments.jsonl "$d"/perf_results.md "$OUT/$1/$op/" 2>/dev/null
        du -sh "$d" > "$OUT/$1/$op/sandbox_size.txt" 2>/dev/null
    done
}
case "$1" in
  cheats)  # the rewritten cheats + honest control on one op
    /usr/bin/time -v timeout 540 python benchmarks/checked_gpu.py .tg-slice --ops "$2" --ab-runs 0 --budget "${3:-420}" \
        --out "$OUT/cheats_$2.json" 2> "$OUT/time_$2.txt"; echo "rc=$?"; grep -E "Maximum resident|Elapsed" "$OUT/time_$2.txt"
    collect "cheats_$2" ;;
  ab)  # cost of checking: honest tries unchecked vs checked, interleaved
    timeout 570 python benchmarks/checked_gpu.py .tg-slice --ops silu_and_mul --changes honest --ab-runs "${2:-3}" \
        --budget 500 --out "$OUT/ab.json"; echo "rc=$?"
    collect ab ;;
esac
case "$1" in
  third)  # swiglu's cheats + honest (a third TileGym op), then rms_norm timed by CUDA graph replay (CUPTI=0)
    timeout 300 python benchmarks/checked_gpu.py .tg-slice --ops swiglu --ab-runs 0 --budget 280 --out "$OUT/cheats_swiglu.json"; echo "rc=$?"
    collect cheats_swiglu; rm -rf /tmp/checked-gpu-*
    CUPTI=0 timeout 250 python benchmarks/checked_gpu.py .tg-slice --ops rms_norm --ab-runs 0 --changes count,big,honest --budget 230 \
        --out "$OUT/graph_rms_norm.json"; echo "rc=$?"
    collect graph_rms_norm ;;
esac
case "$1" in
  swiglu2)  # after child/stale_memory: the profiler cheat that returned torch.empty on swiglu, and the honest control
    timeout 250 python benchmarks/checked_gpu.py .tg-slice --ops swiglu --changes profiler,honest --ab-runs 0 --budget 230 \
        --out "$OUT/swiglu2.json"; echo "rc=$?" ;;
esac

#!/usr/bin/env bash
# Check one cuTile toolchain on a GPU machine, the same way for every tileiras version, so that two
# runs (say 13.4 and 13.5) can be put side by side. From the root of a cutile-perf checkout, after
# `source <toolchain>/setup.sh` (.gpu/ for 13.4, .gpu135/ for 13.5; see their setup.sh):
#
#   bash benchmarks/toolchain_check.sh OUTDIR [--no-kernels] [--tests-s N] [--kernels-s N] [--tilegym DIR]
#
# Writes into OUTDIR, one file per stage, each ending with the stage's exit status and seconds:
#   env.txt            which tileiras, its --version, cuda-tile / torch / GPU / driver
#   suite-tests.txt    the bundled suite's correctness tests (examples/kernels, cuTile only; compile + run)
#   compile-check.txt  `cutile-perf compile-check` of the bundled rms_norm for sm_90 (no GPU needed)
#   kernels.md         `python benchmarks/kernels.py --markdown --precompile 8` (stderr: kernels.stderr)
#   tilegym-rms_norm.txt  with --tilegym DIR (a TileGym copy: src/, tests/): TileGym's own rms_norm
#                      correctness tests, then its perf tests with cutile-perf's plugin printing each
#                      record, cuTile backend only (also under --tests-s)
# The tests and kernels.py stages have time limits (--tests-s, default 200; --kernels-s, default 300
# seconds) so that one hang cannot eat a GPU call.
set -u
out=${1:?usage: toolchain_check.sh OUTDIR [--no-kernels] [--tests-s N] [--kernels-s N] [--tilegym DIR]}
shift
kernels=1 tests_s=200 kernels_s=300 tilegym=""
while [ $# -gt 0 ]; do
  case $1 in
    --no-kernels) kernels=0 ;;
    --tests-s) tests_s=$2; shift ;;
    --kernels-s) kernels_s=$2; shift ;;
    --tilegym) tilegym=$(cd "$2" && pwd) || exit 2; shift ;;
    *) echo "toolchain_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
root=$(pwd)
export PYTHONPATH="$root/scripts:$root/examples/kernels/src${PYTHONPATH:+:$PYTHONPATH}"

stage() {  # stage NAME FILE COMMAND...: run, append "exit N, S s" to FILE
  local name=$1 file=$2; shift 2
  local t0=$SECONDS
  echo "== $name: $*" >"$file"
  "$@" >>"$file" 2>&1
  local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t0)) s" | tee -a "$file"
}

env_info() {
  echo "tileiras on PATH: $(command -v tileiras)"
  tileiras --version
  python - <<'EOF'
import importlib.metadata as md, torch
from cuda.tile._compile import _find_compiler_bin, _get_max_supported_bytecode_version
import tempfile
print("cuda-tile", md.version("cuda-tile"), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
print("tileiras cuda-tile runs:", _find_compiler_bin().path)
print("max TileIR bytecode cuda-tile will emit:", _get_max_supported_bytecode_version(tempfile.gettempdir()).as_string())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("GPU", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs")
EOF
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}

stage env "$out/env.txt" env_info
stage suite-tests "$out/suite-tests.txt" bash -c \
  "cd examples/kernels && timeout $tests_s python -m pytest -q -rfE tests -k 'test_ and cutile and not test_perf'"
stage compile-check "$out/compile-check.txt" bash -c \
  "cd examples/kernels && timeout 120 python -m cutile_perf compile-check --kernel src/tilesuite/ops/cutile/rms_norm.py --arch sm_90"
if [ -n "$tilegym" ]; then
  # TileGym's conftest and ops import `tilegym` from its src/; our plugin prints each perf record.
  stage tilegym-rms_norm "$out/tilegym-rms_norm.txt" bash -c \
    "cd '$tilegym' && export PYTHONPATH='$tilegym/src':\$PYTHONPATH && timeout $tests_s python -m pytest -q -rfE tests/ops/test_rms_norm.py -k 'test_op and cutile' && timeout $tests_s python -m pytest -q -rfE tests/ops/test_rms_norm.py -k 'test_perf and cutile' -p no:cutile_perf -p cutile_perf.pytest_plugin --print-record"
fi
if [ "$kernels" = 1 ]; then
  t0=$SECONDS
  timeout "$kernels_s" python benchmarks/kernels.py --markdown --precompile 8 >"$out/kernels.md" 2>"$out/kernels.stderr"
  echo "== kernels: exit $?, $((SECONDS - t0)) s" | tee -a "$out/kernels.md"
fi

# The test file of a TileGym op, for the benchmark scripts that drive one (source this file):
#   tilegym_test_path rms_norm             -> tests/ops/test_rms_norm.py
#   tilegym_test_path activation/geglu     -> tests/ops/activation/test_geglu.py
tilegym_test_path() {
  case "$1" in
    */*) echo "tests/ops/${1%/*}/test_${1##*/}.py" ;;
    *) echo "tests/ops/test_$1.py" ;;
  esac
}

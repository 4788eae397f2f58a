#!/usr/bin/env bash
# Where a fresh child's imports go on the GPU host: the installed bytecode, and whether a bytecode
# prefix filled once (by a process that imports installed code only) makes the imports faster.
#
#   bash benchmarks/import_probe.sh [modules]     # default: torch cuda.tile pytest
set -u
mods=${1:-torch cuda.tile pytest}
imp="import $(echo $mods | tr ' ' ',')"
py=$(command -v python)
echo "python: $py"; env | grep -i '^PYTHON' || true
python - <<'PY'
import sys, sysconfig, os, importlib.util, struct, torch
print("flags.dont_write_bytecode", sys.flags.dont_write_bytecode, "prefix", sys.pycache_prefix)
site = sysconfig.get_paths()["purelib"]; print("purelib", site, "writable", os.access(site, os.W_OK))
root = os.path.dirname(torch.__file__)
py = pyc = stale = unchecked = 0
for d, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".py"):
            continue
        py += 1
        src = os.path.join(d, f); c = importlib.util.cache_from_source(src)
        if not os.path.exists(c):
            continue
        pyc += 1
        with open(c, "rb") as h:
            head = h.read(16)
        flags = struct.unpack("<I", head[4:8])[0]
        if flags & 1:
            unchecked += 1
        elif struct.unpack("<I", head[8:12])[0] != int(os.stat(src).st_mtime) & 0xFFFFFFFF:
            stale += 1
print(f"torch: {py} .py, {pyc} with a .pyc, {stale} stale by mtime, {unchecked} hash-based")
PY
t() { local s=$(date +%s.%N); "$@" >/dev/null 2>&1; python -c "import time; print(f'{time.time() - $s:.2f}')"; }
cd /tmp
for i in 1 2 3; do echo "plain $i: $(t python -c "$imp")"; done
for i in 1 2; do echo "dont-write $i: $(t env PYTHONDONTWRITEBYTECODE=1 python -c "$imp")"; done
rm -rf /tmp/pp
for i in 1 2 3; do echo "prefix $i: $(t env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pp python -c "$imp")"; done
echo "prefix files: $(find /tmp/pp -name '*.pyc' | wc -l)"
python -X importtime -c "$imp" 2> /tmp/it.txt
python - <<'PY'
rows = [l.split("|") for l in open("/tmp/it.txt") if l.startswith("import time:") and "cumulative" not in l]
top = sorted(((int(c), n.strip()) for _, c, n in ((r[0], r[1], r[2]) for r in rows) if not n.startswith(" ") or n.strip().count(".") == 0), reverse=True)
print("slowest by cumulative us:", [(n, c) for c, n in top[:12]])
PY

"""What a compiled cuTile kernel turned into: tileiras remarks and ``cuobjdump`` output, parsed.

Pure parsers over captured text (tested without a compiler), plus the two calls that produce the
text: ``find_cuobjdump`` and ``inspect_cubin``. ``compilecheck`` compiles; this module reads.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path


_REMARK = re.compile(r"^--- !(?P<status>\w+)$")


def parse_remarks(text: str) -> list[dict]:
    """tileiras YAML remarks as [{status, pass, name, line, remark, instruction, shape}] (no tag-aware YAML needed)."""
    found: list[dict] = []
    current: dict | None = None
    for line in text.splitlines():
        head = _REMARK.match(line.strip())
        if head:
            current = {"status": head["status"]}
            found.append(current)
            continue
        if current is None:
            continue
        key, _, value = line.strip().lstrip("- ").partition(":")
        value = value.strip().strip("'\"")
        if key == "Pass":
            current["pass"] = value
        elif key == "Name":
            current["name"] = value
        elif key == "DebugLoc":
            m = re.search(r"Line:\s*(\d+)", line)
            current["line"] = int(m.group(1)) if m else None
        elif key in {"Remark", "Instruction", "Shape"}:
            current[key.lower()] = value
        elif key == "Reason" and "reason" not in current:  # repeated once per pass; the first says it
            current["reason"] = re.sub(r"^loc\(.*?\):\s*", "", value)
    return found


def summarize_remarks(text: str) -> dict:
    """What the compiler chose: TMA vs other loads/stores, tensor cores, by remark name and instruction."""
    # tileiras repeats a remark for each pass that reports it; count each (name, line, instruction) once.
    seen: dict[tuple, dict] = {}
    for r in parse_remarks(text):
        seen.setdefault((r.get("name"), r.get("line"), r.get("instruction"), r.get("shape")), r)
    remarks = list(seen.values())
    passed = [r for r in remarks if r.get("status") == "Passed"]
    # What was selected, from the Passed remarks ("TMA Load instruction", "Global-memory load instruction").
    loads = Counter(r.get("instruction", "?") for r in passed if "Load" in r.get("name", ""))
    stores = Counter(r.get("instruction", "?") for r in passed if "Store" in r.get("name", ""))
    mma = [r for r in passed if "TensorCore" in r.get("name", "") or r.get("pass") == "Tensor-core"]
    failed = [r for r in remarks if r.get("status") not in {"Passed", "Analysis"}]
    return {
        "loads": dict(loads), "stores": dict(stores),
        "tma_loads": sum(n for k, n in loads.items() if k.startswith("TMA")),
        "tma_stores": sum(n for k, n in stores.items() if k.startswith("TMA")),
        "tensor_cores": sorted({r.get("instruction", "") for r in mma}),
        "missed": [f"line {r.get('line')}: {r.get('remark', r.get('name'))}"
                   + (f" ({r['reason']})" if r.get("reason") else "") for r in failed][:5],
    }


def loads_kind(summary: dict) -> str:
    """One phrase for the table: TMA, plain global loads, or mixed."""
    if "note" in summary:
        return "unknown (no remarks)"
    loads = summary.get("loads", {})
    tma = summary.get("tma_loads", 0)
    total = sum(loads.values())
    if total == 0:
        return "plain (no tiled-load remarks: gather/pointer loads)"
    if tma == total:
        kind = f"TMA ({tma} loads)"
    elif tma == 0:
        kind = f"plain ({total} global-memory loads)"
    else:
        kind = f"mixed: {tma} TMA of {total} tiled loads"
    missed = [m for m in summary.get("missed", []) if "TMA" in m]
    return kind + (f"; {missed[0]}" if missed else "")


_SASS_MEM = re.compile(r"\b(?P<op>LDG|STG|LDS|STS|UTMALDG|UTMASTG|HGMMA|LDGSTS)(?P<mods>(?:\.[A-Z0-9_]+)*)")


def _width(mods: str) -> str:
    tokens = mods.split(".")
    return next((bits for token, bits in (("128", "128"), ("64", "64"), ("U16", "16"), ("S16", "16"), ("U8", "8"),
                                          ("S8", "8")) if token in tokens), "32")


_SASS_OPCODE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_]*)")


def parse_sass(text: str) -> dict:
    """Counts of global loads/stores by width in bits (``LDG.E.128`` -> 128), of TMA / wgmma
    instructions, and ``instructions``: the static count of the kernel's instructions, the NOPs that
    pad its end left out (what playbook entries H, N and Q cut, per element once divided by the
    elements each thread handles)."""
    widths: dict[str, Counter] = {"LDG": Counter(), "STG": Counter()}
    other: Counter = Counter()
    instructions = 0
    for line in text.splitlines():
        if "/*" not in line:
            continue
        opcode = _SASS_OPCODE.match(line)
        if opcode and opcode["op"] != "NOP":
            instructions += 1
        code = line.split("*/", 1)[-1]
        for m in _SASS_MEM.finditer(code):
            op = m["op"]
            if op in widths:
                widths[op][_width(m["mods"])] += 1
            else:
                other[op] += 1
    return {"LDG": dict(widths["LDG"]), "STG": dict(widths["STG"]), **{k: v for k, v in sorted(other.items())},
            "instructions": instructions}


def parse_res_usage(text: str) -> dict:
    """REG / STACK / SHARED / LOCAL of the (first) function in ``cuobjdump -res-usage`` output."""
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", text)
    if not m:
        return {}
    return dict(zip(("registers", "stack", "shared", "local"), map(int, m.groups())))


def parse_reqntid(text: str) -> int | None:
    """Threads per block from ``cuobjdump -elf``: the EIATTR_REQNTID value (x * y * z)."""
    m = re.search(r"EIATTR_REQNTID\s+Format:\s*\S+\s+Value:\s*((?:0x[0-9a-fA-F]+\s*)+)", text)
    if not m:
        return None
    dims = [int(v, 16) for v in m.group(1).split()]
    product = 1
    for d in dims:
        product *= d
    return product


def find_cuobjdump() -> Path | None:
    """cuobjdump on PATH, else the nvidia-cuda-cuobjdump wheel's, else the one triton's wheel ships."""
    on_path = shutil.which("cuobjdump")
    if on_path:
        return Path(on_path)
    for package, sub in (("nvidia.cu13", "bin"), ("triton", "backends/nvidia/bin")):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(root) / sub / "cuobjdump"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    return None


def inspect_cubin(path: Path, cuobjdump: Path) -> dict:
    """Registers, spills, shared memory, threads per block and SASS memory ops of one cubin."""
    # -sass needs nvdisasm, which sits next to cuobjdump in the wheels that ship them.
    env = {**os.environ, "PATH": f"{cuobjdump.parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(flag: str) -> str:
        proc = subprocess.run([str(cuobjdump), flag, str(path)], capture_output=True, text=True, env=env, timeout=120)
        return proc.stdout if proc.returncode == 0 else ""

    info: dict = parse_res_usage(run("-res-usage"))
    info["threads"] = parse_reqntid(run("-elf"))
    sass = run("-sass")
    info["sass"] = parse_sass(sass) if sass else {"note": "cuobjdump -sass failed (nvdisasm missing?)"}
    return info



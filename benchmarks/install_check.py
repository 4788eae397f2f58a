"""Does README's install resolve at once, to the torch the docs quote? (issue 43)

    python benchmarks/install_check.py                 # resolve ".[gpu]" of this checkout against the index
    python benchmarks/install_check.py --extras gpu,triton --no-pip-config
    python benchmarks/install_check.py --report out.json --log pip.log   # judge a recorded resolution

It runs ``pip install --dry-run --ignore-installed --report`` on the checkout (nothing is installed;
pip fetches only metadata where the index serves it) and says no (exit 1) when pip backtracked (it said
"pip is looking at multiple versions", or fetched more than one torch; another project fetched at
two versions is printed as a note), when the torch it chose is older than the one README says the
figures were measured with, or when the tileiras it chose cannot target Hopper. Exit 0: resolved at once; 2: it could not run.

Why it exists: the `gpu` extra once asked for cuda-toolkit 13.4 while torch's CUDA wheels pin
cuda-toolkit to their own release, and pip backtracked through seven torch releases to torch 2.10
with CUDA 12 libraries, which nothing here was measured with.

``--no-pip-config`` ignores pip's configuration files and PIP_* variables (a local index, find-links
or constraints of this machine), so the resolution is the one a fresh machine with only the package
index gets.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# README says which torch the figures were measured with: "measured with torch 2.11".
MEASURED_TORCH = re.compile(r"measured with torch (\d+(?:\.\d+)+)")
# pip's own words when its resolver starts backtracking.
BACKTRACK_LINE = "pip is looking at multiple versions of"
# "Downloading torch-2.14.1-cp311-...whl (554.6 MB)" / "... foo-1.0.tar.gz" / "...whl.metadata"
_DOWNLOADED = re.compile(r"^\s*(?:Downloading|Using cached|File was already downloaded)\s+(?:\S*/)?"
                         r"([A-Za-z0-9_.]+?)-(\d[^-\s]*?)(?:-|\.tar\.gz|\.zip)")
MIN_TILEIRAS = (13, 3)  # the first that can target Hopper (sm_90)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _release(version: str) -> tuple[int, ...]:
    """(2, 11, 0) from "2.11.0+cu130" or "2.11.0rc1": the leading numbers only."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(numbers)


def resolved(report: dict) -> dict[str, str]:
    """{normalized project name: version} of what pip's ``--report`` would install."""
    return {_norm(item["metadata"]["name"]): item["metadata"]["version"] for item in report.get("install", [])}


def torch_cuda(report: dict) -> str | None:
    """The CUDA release torch's wheel asks for (its ``cuda-toolkit==X`` pin, or the version of its
    ``nvidia-cuda-runtime-cuXX`` pin for the older wheels), or None (a CPU wheel, or no torch)."""
    for item in report.get("install", []):
        meta = item["metadata"]
        if _norm(meta["name"]) != "torch":
            continue
        for requirement in meta.get("requires_dist") or []:
            pinned = re.match(r"(cuda-toolkit|nvidia-cuda-runtime(?:-cu\d+)?)\s*(?:\[[^\]]*\])?\s*==\s*([\d.]+)",
                              requirement)
            if pinned:
                return pinned.group(2)
    return None


def fetched_versions(log: str) -> dict[str, list[str]]:
    """{project: [versions]} of every project pip fetched (metadata or wheel), in order."""
    versions: dict[str, list[str]] = {}
    for line in log.splitlines():
        match = _DOWNLOADED.match(line)
        if match:
            seen = versions.setdefault(_norm(match.group(1)), [])
            if match.group(2) not in seen:
                seen.append(match.group(2))
    return versions


def backtracked(log: str) -> list[str]:
    """What in pip's output says it backtracked: its own line (written when it rejects a version
    it had chosen), and torch fetched at more than one version (each one a wheel of 0.5-0.9 GB
    where the index serves no separate metadata)."""
    found = [line.strip() for line in log.splitlines() if BACKTRACK_LINE in line]
    torch = fetched_versions(log).get("torch", [])
    if len(torch) > 1:
        found.append(f"torch fetched at {len(torch)} versions: {', '.join(torch)}")
    return found


def narrowed(log: str) -> list[str]:
    """Projects other than torch fetched at more than one version without a rejection: an unpinned
    requirement first met at its newest release, then narrowed by a pin met later (e.g.
    nvidia-cuda-runtime, which nvcc leaves open and torch pins). Cheap; reported, not failed."""
    return [f"{name}: {', '.join(seen)}" for name, seen in fetched_versions(log).items()
            if name != "torch" and len(seen) > 1]


def measured_torch(readme: str) -> str | None:
    """The torch release README says the figures were measured with ("measured with torch 2.11")."""
    match = MEASURED_TORCH.search(readme)
    return match.group(1) if match else None


def problems(report: dict, log: str, min_torch: str) -> list[str]:
    """Why this resolution is not the one README promises; empty when it is."""
    found = [f"pip backtracked: {line}" for line in backtracked(log)]
    versions = resolved(report)
    torch = versions.get("torch")
    if torch is None:
        found.append("torch is not in the resolution")
    elif _release(torch) < _release(min_torch):
        found.append(f"torch {torch} is older than torch {min_torch}, which README says the figures were measured with")
    tileiras = versions.get("nvidia-cuda-tileiras")
    if tileiras is None:
        found.append("tileiras (nvidia-cuda-tileiras) is not in the resolution")
    elif _release(tileiras)[:2] < MIN_TILEIRAS:
        found.append(f"tileiras {tileiras} cannot target Hopper (13.3 or newer can)")
    return found


def summary(report: dict) -> str:
    versions = resolved(report)
    cuda = torch_cuda(report)
    return (f"torch {versions.get('torch', '-')} (CUDA {cuda or 'none pinned'}), cuda-tile {versions.get('cuda-tile', '-')}, "
            f"tileiras {versions.get('nvidia-cuda-tileiras', '-')}, {len(versions)} packages")


def run_pip(source: Path, extras: str, no_pip_config: bool, out: Path) -> tuple[dict, str]:
    """pip's dry-run report of installing ``source[extras]`` into a fresh environment, and its output."""
    env = dict(os.environ)
    flags = []
    if no_pip_config:
        env["PIP_CONFIG_FILE"] = os.devnull  # no configuration file at all
        flags.append("--isolated")  # and no PIP_* variable
    cmd = [sys.executable, "-m", "pip", *flags, "install", "--dry-run", "--ignore-installed",
           "--disable-pip-version-check", "--report", str(out), f"{source}[{extras}]"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    log = done.stdout + done.stderr
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"pip could not resolve {source.name}[{extras}] (exit {done.returncode}): "
                           + (log.strip().splitlines() or ["no output"])[-1])
    return json.loads(out.read_text(encoding="utf-8")), log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extras", default="gpu", help="extras to resolve (default: gpu, README's install)")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout to resolve (default: this one)")
    parser.add_argument("--no-pip-config", action="store_true",
                        help="ignore pip's configuration files and PIP_* variables (a fresh machine's view)")
    parser.add_argument("--report", type=Path, help="judge this recorded `pip install --dry-run --report` file")
    parser.add_argument("--log", type=Path, help="with --report: pip's output of that run (for backtracking)")
    parser.add_argument("--min-torch", help="the oldest acceptable torch (default: README's 'measured with torch X')")
    args = parser.parse_args(argv)

    min_torch = args.min_torch or measured_torch((args.source / "README.md").read_text(encoding="utf-8"))
    if not min_torch:
        print("install_check: README does not say 'measured with torch X.Y'; pass --min-torch", file=sys.stderr)
        return 2
    try:
        if args.report:
            report = json.loads(args.report.read_text(encoding="utf-8"))
            log = args.log.read_text(encoding="utf-8") if args.log else ""
        else:
            with tempfile.TemporaryDirectory(prefix="install-check-") as scratch:
                report, log = run_pip(args.source.resolve(), args.extras, args.no_pip_config, Path(scratch) / "report.json")
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"install_check: {exc}", file=sys.stderr)
        return 2
    print(f"resolved: {summary(report)}")
    found = problems(report, log, min_torch)
    for note in narrowed(log):
        print(f"note: narrowed to a pin met later: {note}")
    for problem in found:
        print(f"install_check: {problem}")
    if not found:
        print(f"ok: resolved at once, torch >= {min_torch} (README's measured torch)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

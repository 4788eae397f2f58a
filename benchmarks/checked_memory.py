"""What checked timing costs in GPU memory on one perf case (issue 39 item 7).

    source .gpu/setup.sh && export PYTHONPATH=$PWD/scripts:$PYTHONPATH
    python benchmarks/checked_memory.py .tg-slice --test tests/ops/test_rms_norm.py \
        -k "test_perf and cutile and 65536-16384 and static" --runs 3

Runs the selected perf test(s) in fresh pytest processes, alternating two arms: *plain* (the
cutile-perf plugin loaded, nothing checked) and *checked* (``CUTILE_PERF_CHECK_DIR`` set, as the
harness sets it in a perf child; both arms write a run report, ``CUTILE_PERF_REPORT``, so the plugin
acts as in a perf child: the plugin wraps the test's timer and captures its calls). This file
is also loaded into each process as a pytest plugin (``-p checked_memory``), which writes torch's peak
allocated and reserved GPU memory at the end of the session. The difference of the arms' medians is
the check's cost; the checked arm's capture folder must not be empty, or the check did not run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

PEAK_FILE = "CHECKED_MEMORY_OUT"  # env: where the in-process plugin writes its peaks


def pytest_sessionfinish(session, exitstatus) -> None:
    """In the pytest process: the session's peak GPU memory, in MiB (None without CUDA)."""
    out = os.environ.get(PEAK_FILE)
    if not out:
        return
    import torch  # noqa: PLC0415  (only inside the measured process)

    peaks = {"allocated_mib": None, "reserved_mib": None, "exit": int(exitstatus)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        peaks["allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        peaks["reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    Path(out).write_text(json.dumps(peaks))


def plugin_is_installed() -> bool:
    """Whether pytest loads cutile-perf's plugin by itself (an installed entry point)."""
    return any(ep.value.startswith("cutile_perf") for ep in metadata.entry_points(group="pytest11"))


def one_run(repo: Path, test: str, select: str, checked: bool, work: Path) -> dict:
    out = work / f"peak-{os.urandom(4).hex()}.json"
    env = {**os.environ, PEAK_FILE: str(out),
           "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    capture = work / f"capture-{out.stem}"
    env["CUTILE_PERF_REPORT"] = str(work / f"report-{out.stem}.jsonl")  # the plugin acts as in a perf child
    if checked:
        env["CUTILE_PERF_CHECK_DIR"] = str(capture)
    command = [sys.executable, "-m", "pytest", test, "-k", select, "-q", "-p", "no:cacheprovider", "-p", "checked_memory"]
    if not plugin_is_installed():
        command += ["-p", "cutile_perf.pytest_plugin"]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    if not out.exists():
        raise SystemExit(f"checked_memory: no peak written (exit {done.returncode}): {done.stdout[-800:]}{done.stderr[-800:]}")
    peaks = json.loads(out.read_text())
    peaks["arm"] = "checked" if checked else "plain"
    peaks["captured_files"] = sum(1 for p in capture.rglob("*") if p.is_file()) if checked else 0
    peaks["tail"] = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    return peaks


def summary(runs: list[dict]) -> dict:
    """Medians per arm and the checked arm's extra peak memory (pure)."""
    table = {}
    for arm in ("plain", "checked"):
        mine = [r for r in runs if r["arm"] == arm and r["allocated_mib"] is not None]
        table[arm] = {key: statistics.median(r[key] for r in mine) if mine else None
                      for key in ("allocated_mib", "reserved_mib")}
    if table["plain"]["allocated_mib"] is not None and table["checked"]["allocated_mib"] is not None:
        table["extra_allocated_mib"] = round(table["checked"]["allocated_mib"] - table["plain"]["allocated_mib"], 1)
        table["extra_reserved_mib"] = round(table["checked"]["reserved_mib"] - table["plain"]["reserved_mib"], 1)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path, help="a TileGym slice (src/, tests/)")
    parser.add_argument("--test", required=True, help="the perf test file, relative to the repo")
    parser.add_argument("-k", dest="select", required=True, help="pytest -k expression for the case(s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per arm, interleaved")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="checked-memory-") as work:
        for i in range(args.runs):
            for checked in ((False, True) if i % 2 == 0 else (True, False)):
                runs.append(one_run(args.repo.resolve(), args.test, args.select, checked, Path(work)))
                print(json.dumps(runs[-1]), flush=True)
    result = {"command": sys.argv, "runs": runs, "summary": summary(runs)}
    print(json.dumps(result["summary"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    checked_runs = [r for r in runs if r["arm"] == "checked"]
    return 0 if checked_runs and all(r["captured_files"] for r in checked_runs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where one pytest child's seconds go: start-up, imports, CUDA, then the child itself under cProfile.

A try's wall time is its children's (``timings.stages`` of a log row): on the H200 the demo's rms_norm
tries spent 11.5-15.3 s in the correctness child and 10.0-12.5 s in the pre-started perf child after
its gate opened, for two perf cases whose timed samples take well under a second. This script takes
one such child apart, in a copy of a TileGym-shaped folder (the bundled suite by default):

* fresh processes, medians of ``--runs``: ``python -c pass``; ``import torch``; the same plus a CUDA
  context; ``import cuda.tile``; collection alone (``--collect-only``);
* each stage's child (the arguments the demo's session freezes, cutile-perf's plugin loaded as the
  harness loads it) once with an empty cuTile compile cache and once with the cache it left, each
  under cProfile: the functions with the most cumulative time are printed, so compiles, the bench's
  sampling, its CUPTI witness and checked calls, and pytest's own work can be told apart.

Usage (GPU machine, from the checkout root, ``scripts`` and the suite's ``src`` on PYTHONPATH):

    python benchmarks/child_profile.py                      # bundled rms_norm, both stages
    python benchmarks/child_profile.py --op softmax --top 30 --runs 3
"""
from __future__ import annotations

import argparse
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "examples" / "kernels"

# The demo's frozen commands (loop/demo.py writes them into its session): the cutile backend only.
STAGE_ARGS = {
    "correctness": ["-k", "test_ and cutile and not cutile_rs and not test_perf", "-q"],
    "perf": ["-k", "test_perf and cutile and not cutile_rs", "-q", "--print-record"],
}
# Packages whose functions name a cost worth seeing; the rest of the profile is pytest and Python.
INTERESTING = ("cuda/tile", "cutile_perf", "torch/profiler", "torch/cuda", "tests/", "src/", "_pytest/runner",
               "_pytest/main", "subprocess")


def _wall(argv: list[str], cwd: Path, env: dict, ok=(0,), show_durations: bool = False) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in ok:
        tail = "\n".join(done.stdout.splitlines()[-15:])
        raise SystemExit(f"child_profile: {' '.join(argv[:6])}... exited {done.returncode}:\n{tail}")
    if show_durations:  # pytest's --durations lines: each test's setup, call and teardown
        print("\n".join(line for line in done.stdout.splitlines() if line.split(" ", 1)[0].endswith("s")
                        and line.split(" ", 1)[0][:-1].replace(".", "", 1).isdigit()))
    return elapsed


CUPTI_PHASES = """
import time, threading
t0 = time.perf_counter()
import torch
from torch.profiler import profile, ProfilerActivity
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t1 = time.perf_counter()
def one():
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        x.add_(1); torch.cuda.synchronize()
    return p
p = one(); t2 = time.perf_counter()
p.events(); t3 = time.perf_counter()
one().events(); t4 = time.perf_counter()
print(f"import+CUDA {t1-t0:.2f}  first profile {t2-t1:.2f}  its events() {t3-t2:.2f}  second profile+events {t4-t3:.2f}")
"""


def _writing(env: dict) -> dict:
    """``env`` with bytecode writing allowed (a machine may set PYTHONDONTWRITEBYTECODE)."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}


def top_functions(profile: Path, top: int) -> str:
    """The ``top`` functions by cumulative time whose file is in one of ``INTERESTING``, as pstats prints them."""
    out = io.StringIO()
    stats = pstats.Stats(str(profile), stream=out)
    stats.sort_stats("cumulative")
    wanted = [fn for fn in stats.fcn_list if any(part in fn[0] for part in INTERESTING)][:top]  # type: ignore[attr-defined]
    stats.fcn_list = wanted  # type: ignore[attr-defined]
    stats.print_stats()
    body = out.getvalue()
    return body[body.find("ncalls"):] if "ncalls" in body else body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=SUITE, help="a TileGym-shaped folder (default: the bundled suite)")
    parser.add_argument("--op", default="rms_norm")
    parser.add_argument("--runs", type=int, default=3, help="runs of each start-up probe (median)")
    parser.add_argument("--top", type=int, default=25, help="functions printed per profiled child")
    parser.add_argument("--stage", action="append", choices=sorted(STAGE_ARGS), help="only this stage (repeatable)")
    parser.add_argument("--startup-only", action="store_true", help="the start-up probes alone, no profiled child")
    args = parser.parse_args()

    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "suite"
        shutil.copytree(args.suite, work, ignore=shutil.ignore_patterns(".git", "__pycache__", "sandbox"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work / "src"), os.environ.get("PYTHONPATH", "")])}
        test = f"tests/ops/test_{args.op}.py"
        plugin = ["-p", "no:cutile_perf", "-p", "cutile_perf.pytest_plugin", "-p", "no:cacheprovider"]

        print(f"start-up probes (wall s, median of {args.runs} fresh processes)")
        probes = [
            ("python -c pass", [py, "-c", "pass"]),
            ("import torch", [py, "-c", "import torch"]),
            ("import torch + CUDA context", [py, "-c", "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"]),
            ("import torch, cuda.tile", [py, "-c", "import torch, cuda.tile"]),
            ("import torch + first CUPTI profile", [py, "-c", (
                "import torch; from torch.profiler import profile, ProfilerActivity\n"
                "x = torch.zeros(1, device='cuda')\n"
                "with profile(activities=[ProfilerActivity.CUDA]) as p: x.add_(1); torch.cuda.synchronize()\n"
                "p.events()")]),
            ("import cutile_perf.pytest_plugin", [py, "-c", "import cutile_perf.pytest_plugin"]),
        ]
        # A child's bytecode goes to PYTHONPYCACHEPREFIX (pristine.child_env): a fresh folder per run
        # means every installed module is compiled from source again, in every child.
        heavy = "import torch, cuda.tile, pytest"
        filled = Path(tmp) / "pyc-filled"
        subprocess.run([py, "-c", heavy], env={**_writing(env), "PYTHONPYCACHEPREFIX": str(filled)}, check=True)
        probes += [
            (f"{heavy}", [py, "-c", heavy]),
            (f"  ... with a fresh PYTHONPYCACHEPREFIX", [py, "-c", heavy], lambda: {
                **_writing(env), "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(dir=tmp)}),
            (f"  ... with a PYTHONPYCACHEPREFIX filled once", [py, "-c", heavy], lambda: {
                **env, "PYTHONPYCACHEPREFIX": str(filled)}),
        ]
        for which in args.stage or sorted(STAGE_ARGS):
            probes.append((f"{which}: --collect-only", [py, "-m", "pytest", test, *STAGE_ARGS[which], *plugin,
                                                         "--collect-only"]))
        import torch  # noqa: PLC0415 - only to know whether the CUDA probes can run here

        for label, argv, *env_of in probes:
            if ("CUDA context" in label or "CUPTI" in label) and not torch.cuda.is_available():
                print(f"  {label:<44} skipped (no CUDA GPU)")
                continue
            walls = [_wall(argv, work, env_of[0]() if env_of else env, ok=(0, 5)) for _ in range(args.runs)]
            print(f"  {label:<44} {statistics.median(walls):7.3f}")
        if torch.cuda.is_available():
            print("CUPTI through torch.profiler, phases in one process (s), one line per fresh process:")
            for _ in range(args.runs):
                out = subprocess.run([py, "-c", CUPTI_PHASES], env=env, capture_output=True, text=True, check=True)
                print("  " + out.stdout.strip())
        if args.startup_only:
            return 0

        for which in args.stage or sorted(STAGE_ARGS):
            cache = Path(tmp) / f"jit-{which}"
            for state in ("cold", "warm"):
                profile = Path(tmp) / f"{which}-{state}.prof"
                argv = [py, "-m", "cProfile", "-o", str(profile), "-m", "pytest", test, *STAGE_ARGS[which], *plugin,
                        "--durations=0"]
                print(f"\n== {which} child, cuTile compile cache {state} ==")
                wall = _wall(argv, work, {**env, "CUDA_TILE_CACHE_DIR": str(cache)}, ok=(0,), show_durations=True)
                print(f"-- {wall:.2f} s wall (under cProfile)")
                print(top_functions(profile, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())

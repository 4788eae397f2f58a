"""The harness's own time per iteration, pytest children excluded (goal: < 0.5 s).

Builds the simulated TileGym-shaped repository of the test suite in a temporary directory, runs
``init`` and ``baseline``, then ``--iterations`` ``try`` commands, each as its own
``python -m cutile_perf try`` process, exactly as an agent calls it (kept and reverted changes
alternate, so both paths are timed). It prints one table, component and seconds (medians):

* interpreter start-up: ``python -c pass``;
* imports of ``try``: ``import cutile_perf.commands.try_`` minus the start-up;
* ``--help``: the whole ``python -m cutile_perf --help`` process;
* inside the command: ``harness_s`` as logged (command entry to log write, children excluded);
* whole ``try`` process minus pytest children: the number the goal is about;
* pytest children: for scale only, they are the measurement, not overhead.

Each timed process also reports its own CPU time at exit (start-up, imports and command included,
pytest children excluded), which, unlike wall time, does not grow when the machine is busy.

Measured 2026-11-30 on the 2-core CPU build box (no GPU, simulated repo, load average 2.6-3.4 from
other jobs), medians of 6 tries: whole try process minus children 0.19-0.33 s wall, 0.13 s CPU;
of that, start-up 0.01 s, imports 0.10 s wall / 0.08 s CPU (GitPython ~0.03 s, yaml ~0.01 s: both
used by every try), inside the command 0.04-0.05 s; ``--help`` 0.05 s wall. The 0.8 s seen earlier
was wall time on the same box under heavier load. On the H200 the logged in-command ``harness_s``
was 0.04-0.07 s (gpu-results 4/ and 5/); whole-process numbers were not measured there.

    python benchmarks/harness_overhead.py [--iterations 6]

On a GPU machine, ``--tilegym <TileGym folder> --op <name>`` breaks a real ``try`` down instead: in a
fresh git copy of the folder it runs ``init``, ``baseline`` and ``--tries`` comment-only (A/A)
tries, then prints where each try's time went (the per-stage timings of the log rows: correctness,
perf, interleaved re-check runs; the harness's own share) and what one pytest child is made of
(interpreter start-up, ``import torch``, ``import cuda.tile``, the op's module, test collection,
and each stage with cuTile's compile cache cold and warm: the difference is JIT compile time):

    python benchmarks/harness_overhead.py --tilegym <TileGym> --op layer_norm_legacy --tries 4
    python benchmarks/harness_overhead.py --tilegym <TileGym> --op swiglu --correctness-jobs 4 --prestart-perf

``--no-jit-cache`` measures a session without the guarded cuTile compile cache (``jitcache.py``), as
the loop ran before it existed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the simulated repository builder lives with the tests

from fixtures_repo import allow_no_gpu, build_tilegym_like_repo, edit_kernel, edit_session  # noqa: E402

from cutile_perf.judge import stats# noqa: E402
from cutile_perf.cli import main  # noqa: E402

GOAL_S = 0.5
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "scripts"), os.environ.get("PYTHONPATH", "")])}


def _cli(*argv: str) -> int:  # in-process: setup only, never timed
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(argv))


# Every timed process reports its own CPU time at exit: start-up, imports and the command included,
# its children (pytest) excluded. Unlike wall time, that does not grow when the machine is busy.
_CPU_HOOK = "import atexit, sys, time; atexit.register(lambda: sys.stderr.write(f'\\nCPU_S {time.process_time()}\\n')); "


def _process(code: str, args: list[str] | None = None, ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall s, own CPU s) of ``python -c <hook + code> args``; an exit code outside ``ok`` stops the benchmark."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _CPU_HOOK + code, *(args or [])], env=_ENV, capture_output=True,
                          text=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode not in ok:
        raise SystemExit(f"{code!r} {args or ''} exited {proc.returncode}: {proc.stderr[-500:]}")
    cpu = [float(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("CPU_S ")]
    if not cpu:
        raise SystemExit(f"no CPU time reported by {code!r}: {proc.stderr[-500:]}")
    return wall, cpu[-1]


def _median_process(code: str, runs: int) -> tuple[float, float]:
    _process(code)  # warm the file cache and .pyc files: an agent's loop runs warm
    samples = [_process(code) for _ in range(runs)]
    return stats.median([w for w, _ in samples]), stats.median([c for _, c in samples])


_CLI = "import runpy, sys; sys.argv[0] = 'cutile-perf'; runpy.run_module('cutile_perf', run_name='__main__')"
_HELP = "import runpy, sys; sys.argv[:] = ['cutile-perf', '--help']; runpy.run_module('cutile_perf', run_name='__main__')"


def run_tries(iterations: int) -> tuple[list[dict], list[tuple[float, float]]]:
    """Log entries of the ``try`` iterations, and (wall s, own CPU s) of each ``try`` process."""
    timed = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_tilegym_like_repo(Path(tmp))
        r = str(repo)
        assert _cli("init", "--repo", r, "--kernel", "rms_norm") == 0
        allow_no_gpu(repo)  # the fake tests need no GPU
        assert _cli("baseline", "--repo", r, "--repeats", "1") == 0
        for i in range(iterations):
            # Alternate a faster (kept) and a much slower (reverted) candidate: both paths are timed.
            scale = 0.9 ** (i // 2 + 1) if i % 2 == 0 else 3.0
            edit_kernel(repo, latency={"256x1024": round(1.0 * scale, 6), "4096x1024": round(2.0 * scale, 6)})
            timed.append(_process(_CLI, ["try", "--repo", r, f"step {i}"], ok=(0, 1)))  # 1: reverted
        lines = (repo / "sandbox/experiments.jsonl").read_text().splitlines()
        entries = [json.loads(line) for line in lines if line]
        return [e for e in entries if e["iteration"] > 0], timed


def measure(iterations: int, runs: int) -> list[tuple[str, float, float | None]]:
    """Rows of (component, wall s, own CPU s or None), medians."""
    startup = _median_process("pass", runs)
    imported = _median_process("import cutile_perf.commands.try_", runs)
    help_s = _median_process(_HELP, runs)
    tries, timed = run_tries(iterations)
    if len(tries) != len(timed):
        raise SystemExit(f"expected {len(timed)} try entries in the log, found {len(tries)}")
    statuses = ", ".join(e["status"] for e in tries)
    children = [e["timings"]["children_s"] for e in tries]
    return [
        ("interpreter start-up (python -c pass)", *startup),
        ("imports of try (cutile_perf.commands.try_), start-up excluded",
         imported[0] - startup[0], imported[1] - startup[1]),
        ("cutile-perf --help, whole process", *help_s),
        ("inside the try command (logged harness_s)", stats.median([e["timings"]["harness_s"] for e in tries]), None),
        (f"whole try process minus pytest children ({statuses})",
         stats.median([w - c for (w, _), c in zip(timed, children)]), stats.median([cpu for _, cpu in timed])),
        ("pytest children per try (the measurement, not overhead)", stats.median(children), None),
    ]


# --- a real try on TileGym, broken down (GPU machine) -------------------------------------------------


def _wall(argv: list[str], cwd: Path, env: dict, ok: tuple[int, ...] = (0,)) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {(proc.stdout + proc.stderr)[-800:]}")
    return wall


def stage_kind(name: str) -> str:
    """``"3-confirm2-base-perf"`` -> ``"re-check perf (interleaved)"``; ``"3-correctness"`` -> ``"correctness"``.

    Stage names are ``StageRunner.stage``'s ``f"{tag}-{name}"``; ``try`` tags re-check runs ``N-confirmK-base|cand``."""
    if "-confirm" in name:
        return "re-check perf (interleaved)"
    return name.rsplit("-", 1)[-1]


def try_breakdown(rows: list[dict]) -> list[tuple[str, float, str]]:
    """(component, mean s per try, note) from the ``try`` rows' timings."""
    kinds = sorted({stage_kind(name) for row in rows for name, _ in row["timings"].get("stages", [])})
    per_kind: dict[str, list[float]] = {kind: [] for kind in kinds}
    counts: dict[str, list[int]] = {kind: [] for kind in kinds}
    for row in rows:  # a try without a kind of stage counts as 0 s and 0 runs of it
        stages = [(stage_kind(name), seconds) for name, seconds in row["timings"].get("stages", [])]
        for kind in kinds:
            per_kind[kind].append(sum(seconds for k, seconds in stages if k == kind))
            counts[kind].append(sum(1 for k, _ in stages if k == kind))
    # Means, not medians: iterations per hour is a rate, and the re-check runs only in some tries.
    out = [(f"stage: {kind}", stats.mean(v), f"{stats.mean(counts[kind]):.1f} run(s) per try")
           for kind, v in sorted(per_kind.items())]
    out.append(("harness's own share (logged harness_s)", stats.mean([r["timings"]["harness_s"] for r in rows]), ""))
    total = stats.mean([r["timings"]["total_s"] for r in rows])
    out.append(("whole try (logged total_s)", total, f"{3600 / total:.0f} iterations per hour"))
    return out


def _say(text: str) -> None:
    print(text, flush=True)  # progress as it happens: a run cut short by a time limit still tells something


def _print_table(title: str, rows: list[tuple[str, float, str]]) -> None:
    width = max(len(name) for name, *_ in rows)
    _say(f"\n{title}\n{'component':<{width}}  {'s':>8}  note")
    for name, seconds, note in rows:
        _say(f"{name:<{width}}  {seconds:8.3f}  {note}")


def tilegym(src: Path, op: str, tries: int, repeats: int, probes: int, out: Path | None,
            correctness_jobs: int = 1, prestart_perf: bool = False, jit_cache: bool = True) -> None:
    """Run the loop on a fresh git copy of ``src`` and print where a try's time goes, step by step."""
    import shutil  # noqa: PLC0415

    from cutile_perf.child import records# noqa: PLC0415
    from cutile_perf.store import session

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "tilegym"
        shutil.copytree(src, work, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        git = ["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench"]
        for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], [*git, "commit", "-qm", "TileGym copy"]):
            subprocess.run(argv, cwd=work, check=True)
        kernel, test = f"src/tilegym/ops/cutile/{op}.py", f"tests/ops/test_{op}.py"
        env = {**_ENV, "PYTHONPATH": os.pathsep.join([str(work / "src"), _ENV["PYTHONPATH"]])}
        cli = [sys.executable, "-m", "cutile_perf"]
        init = [*cli, 'init', '--kernel', kernel, '--test', test, '--correctness-jobs', str(correctness_jobs),
                '--prestart-perf' if prestart_perf else '--no-prestart-perf']  # init's default is on
        _say(f"{op}: init (correctness in {correctness_jobs} children, perf pre-started: {prestart_perf}, "
             f"session JIT cache: {jit_cache}) {_wall(init, work, env):.1f} s")
        if not jit_cache:  # session.yaml may be edited until the baseline
            edit_session(work, jit_cache=False)
        _say(f"{op}: baseline --repeats {repeats} {_wall([*cli, 'baseline', '--repeats', str(repeats)], work, env):.1f} s")
        log_path = work / "sandbox/experiments.jsonl"
        for i in range(tries):
            with open(work / kernel, "a", encoding="utf-8") as f:
                f.write(f"# A/A try {i + 1}: a comment only\n")
            wall = _wall([*cli, "try", f"A/A {i + 1}: comment only"], work, env, ok=(0, 1))
            row = json.loads(log_path.read_text().splitlines()[-1])
            _say(f"{op}: try {i + 1} {wall:.1f} s, {row['status']}; stages {row['timings'].get('stages')}")
            if out:
                out.mkdir(parents=True, exist_ok=True)
                shutil.copy(log_path, out / f"{op}-experiments.jsonl")
        rows = [json.loads(line) for line in log_path.read_text().splitlines() if line]
        tries_rows = [r for r in rows if r["iteration"] > 0]
        _print_table(f"TileGym {op}: one try, means over {len(tries_rows)} A/A tries "
                     f"({', '.join(r['status'] for r in tries_rows)})", try_breakdown(tries_rows))

        if probes < 1:  # --probes 0: the try breakdown alone, when GPU time is short
            return
        sess = session.load(work)
        _say(f"\nTileGym {op}: one pytest child, taken apart (wall s; median of {probes} unless said)")

        def probe(label: str, argv: list[str], extra_env: dict | None = None, ok=(0,), runs: int = probes) -> None:
            walls = [_wall(argv, work, {**env, **(extra_env or {})}, ok) for _ in range(runs)]
            _say(f"{label:<48}  {stats.median(walls):8.3f}")

        py = sys.executable
        probe("python -c pass", [py, "-c", "pass"])
        probe("import torch", [py, "-c", "import torch"])
        probe("import torch, cuda.tile", [py, "-c", "import torch, cuda.tile"])
        module = kernel[len("src/"):-len(".py")].replace("/", ".")
        probe(f"import {module}", [py, "-c", f"import {module}"])
        plugin = list(records.PYTEST_PLUGIN_ARGS)
        for which in ("correctness", "perf"):
            argv = [*sess.argv(which), *plugin]
            probe(f"{which}: pytest --collect-only", [*argv, "--collect-only", "-q"], ok=(0, 5))
            cache = {"CUDA_TILE_CACHE_DIR": str(Path(tmp) / f"jit-{which}")}
            probe(f"{which}: whole child, JIT cache cold (1 run)", argv, cache, ok=(0, 1), runs=1)
            probe(f"{which}: whole child, JIT cache warm", argv, cache, ok=(0, 1))


def main_cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6, help="try processes to time (default 6)")
    parser.add_argument("--runs", type=int, default=7, help="runs of each start-up/import probe (default 7)")
    parser.add_argument("--tilegym", type=Path, help="a TileGym folder (src/, tests/): break a real try down (GPU)")
    parser.add_argument("--op", default="layer_norm_legacy", help="with --tilegym: the op (default layer_norm_legacy)")
    parser.add_argument("--tries", type=int, default=3, help="with --tilegym: A/A tries (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="with --tilegym: baseline perf runs (default 3)")
    parser.add_argument("--probes", type=int, default=3, help="with --tilegym: runs of each child probe (default 3; 0 skips the child breakdown)")
    parser.add_argument("--out", type=Path, help="with --tilegym: copy the session log here after each try")
    parser.add_argument("--correctness-jobs", type=int, default=1,
                        help="with --tilegym: init --correctness-jobs N (correctness in N children at once)")
    parser.add_argument("--no-jit-cache", dest="jit_cache", action="store_false",
                        help="with --tilegym: session.yaml jit_cache: false (fresh checkout paths, the user's cuTile "
                             "cache: every try recompiles every kernel)")
    parser.add_argument("--prestart-perf", action="store_true",
                        help="with --tilegym: init --prestart-perf (perf child started during correctness)")
    args = parser.parse_args()
    if args.tilegym:
        tilegym(args.tilegym.resolve(), args.op, args.tries, args.repeats, args.probes, args.out, args.correctness_jobs,
                args.prestart_perf, args.jit_cache)
        return 0
    rows = measure(args.iterations, args.runs)
    width = max(len(name) for name, *_ in rows)
    print(f"{'component':<{width}}  {'wall s':>7}  {'CPU s':>7}")
    for name, wall, cpu in rows:
        print(f"{name:<{width}}  {wall:7.3f}  {'-' if cpu is None else f'{cpu:.3f}':>7}")
    wall, cpu = rows[4][1], rows[4][2]
    verdict = "meets" if wall < GOAL_S else "MISSES"
    print(f"harness time per try, whole process minus pytest children: {wall:.3f} s wall, {cpu:.3f} s CPU "
          f"({verdict} the {GOAL_S} s goal on wall time); medians; simulated repository, "
          f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}, no GPU")
    return 0 if wall < GOAL_S else 1

if __name__ == "__main__":
    raise SystemExit(main_cli())

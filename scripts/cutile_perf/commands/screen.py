"""``cutile-perf screen CANDIDATES``: rank candidates side by side on one GPU; readings, not verdicts.

The loop's part is ``loop.screen``; this command adds the CPU compile-check of every candidate in
parallel (``compile_candidates``: ``compile-check`` in a fresh process per candidate, since checking
imports the candidate as the module it would replace), then saves the table (``sandbox/screen.md``) and, with
``--top K``, the plan ``batch`` decides (``sandbox/screen-plan.yaml``).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cutile_perf.errors import EXIT_OK, EXIT_REFUSED, EXIT_REJECTED, UsageError
from cutile_perf.loop import plan, screen_report
from cutile_perf.loop.screen import NOT_COMPILED, screen as run_screen
from cutile_perf.loop.stages import Stages
from cutile_perf.output import Outcome, say
from cutile_perf.store import atomic, git_ops
from cutile_perf.store import session as session_mod

COMPILED, SYNTAX_ONLY, NOT_CHECKED = "compiled", "syntax only", "not checked"


COMPILE_TIMEOUT_S = 600.0  # one candidate's compile-check (tileiras on a large kernel takes minutes)


def compile_one(repo: Path, files: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """One candidate's compile-check: (state, detail). Python syntax first (needs nothing, in this
    process); then ``cutile-perf compile-check --kernel <candidate> --as <target>`` as a child
    process of its own (it imports the candidate as the module it replaces), where cuda-tile
    imports and the kernels have signatures (``aot_signatures()`` or the session's spec)."""
    for _target, candidate in files:
        try:
            compile((repo / candidate).read_bytes(), candidate, "exec")
        except SyntaxError as exc:
            return NOT_COMPILED, f"{candidate}: SyntaxError: {exc.msg} (line {exc.lineno})"
    states = []
    for target, candidate in files:
        if target.endswith(".py"):
            state, detail = _compile_check_child(repo, candidate, target)
            if state in (NOT_COMPILED, SYNTAX_ONLY):
                return state, detail
            states.append(state)
    state = COMPILED if states and all(s == COMPILED for s in states) else NOT_CHECKED
    return state, "" if state == COMPILED else "no kernel with a signature to compile (compile-check --write-spec)"


def _compile_check_child(repo: Path, candidate: str, target: str) -> tuple[str, str]:
    package_parent = str(Path(__file__).resolve().parents[2])  # this cutile_perf, not another installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", "cutile_perf", "compile-check", "--repo", str(repo), "--json",
            "--kernel", candidate, "--as", target]
    try:
        done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return NOT_CHECKED, f"{candidate}: compile-check took over {COMPILE_TIMEOUT_S:.0f} s"
    data = _last_json(done.stdout)
    if done.returncode == EXIT_REFUSED:  # EnvMissing: no cuda-tile here; the syntax was checked
        return SYNTAX_ONLY, data.get("error", "cuda-tile is not importable here")
    if done.returncode not in (EXIT_OK, EXIT_REJECTED):  # it does not import as the file it replaces
        return NOT_COMPILED, f"{candidate}: {data.get('error') or done.stderr.strip()[-300:]}"
    found = data.get("results") or []
    # A signature of "-" is no compile at all (no @ct.kernel in the file, or a spec problem).
    failed = [r for r in found if r.get("checked") and not r.get("ok") and r.get("signature") != "-"]
    if failed:
        return NOT_COMPILED, f"{candidate}: {failed[0]['kernel']} ({failed[0]['signature']}): {failed[0]['error']}"
    return (COMPILED if any(r.get("ok") for r in found) else NOT_CHECKED), ""


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return {}


def compile_candidates(repo: Path, entries: Sequence[plan.PlannedTry]) -> dict[str, tuple[str, str]]:
    """Every candidate compile-checked at once, each in child processes of its own (a thread here
    waits on each), as many at a time as this machine has CPUs."""
    if not entries:
        return {}
    say(f"screen: compile-checking {len(entries)} candidate(s) on the CPU")
    workers = max(1, min(len(entries), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cutile-perf-compile") as pool:
        futures = {e.optimization: pool.submit(compile_one, repo, e.files) for e in entries}
        return {name: future.result() for name, future in futures.items()}


def screen(*, repo: Path, candidates: str, seconds: float, top: int | None, stages: Stages | None = None,
           compile_check=compile_candidates, gpus: str = "1", engine: str = "local",
           cases: int | None = None) -> Outcome:
    """``stages``/``compile_check``: what runs the tests and the compile-checks (tests may pass their own);
    ``gpus``/``engine``: the rounds over a worker per GPU (``loop.screen_spread``); ``cases``: time
    that many of the base's cases (None: all)."""
    if seconds < 0:
        raise UsageError(f"--seconds must be at least 0, not {seconds:g}", "e.g. --seconds 240")
    if top is not None and top < 1:
        raise UsageError(f"--top must be at least 1, not {top}")
    if cases is not None and cases < 1:
        raise UsageError(f"--cases must be at least 1, not {cases}", "leave it out to time every case")
    out = run_screen(repo=repo, source=candidates, seconds=seconds, compile_check=compile_check, stages=stages,
                     gpus=gpus, engine=engine, cases=cases)
    session = session_mod.load(repo)
    g = git_ops.open_repo(session.repo)
    text = screen_report.render(out, git_ops.short(g, out.base))
    table = atomic.write_text(session.sandbox / screen_report.TABLE_FILE, text)
    data = {**screen_report.to_data(out), "table": _shown(session.repo, table)}
    lines = [text.rstrip("\n"), "", f"saved to {data['table']}"]
    if top is not None and out.ranked:
        written = atomic.write_text(session.sandbox / screen_report.PLAN_FILE, screen_report.top_plan(out, top))
        data["plan"] = _shown(session.repo, written)
        lines.append(f"plan of the {min(top, len(out.ranked))} best: {data['plan']}; decide them with "
                     f"`cutile-perf batch {data['plan']} --check`, then `cutile-perf batch {data['plan']}`")
    return Outcome("\n".join(lines), data, EXIT_OK if out.ranked else EXIT_REJECTED)


def _shown(repo: Path, path: Path) -> str:
    return path.relative_to(repo).as_posix() if path.is_relative_to(repo) else str(path)

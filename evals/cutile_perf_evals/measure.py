"""Correctness and timing of committed code, in clean checkouts the agent never touched.

A checkout is the base commit's tree (``git archive``, so nothing in the agent's work tree, its
ignored files, hooks or caches comes along) with the fenced files taken from the commit under
test. Tests and everything else outside the fence therefore always come from the base: a loosened
tolerance or a faked perf test cannot change a grade.

Timing is interleaved: each round runs the perf tests once in every checkout, in a rotated
order, so drift of the GPU clock or of a neighbour's load hits every variant alike. Records are
read with ``cutile_perf.child.records`` exactly as the harness reads them.

``measure_interleaved(repo, base, head)`` is the one function the grader calls for "how much
faster is head than base"; it can be swapped for the harness's own interleaved measurement
(``cutile-perf verify --from A --to B``) when that lands.
"""
from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import re
import signal
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutile_perf.child import records, runner, warmstart
from cutile_perf.judge import stats
from cutile_perf_evals import vcs

CORRECTNESS_K = "test_ and cutile and not test_perf and not cutile_rs"
PERF_K = "test_perf and cutile and not cutile_rs"
FRAMEWORK = "cutile"


class MeasureError(RuntimeError):
    """A checkout could not be made, or a perf run produced no usable record."""

    def __init__(self, message: str, variant: str | None = None):
        super().__init__(message)
        self.variant = variant  # which checkout's run failed, when known


def _git_bytes(repo: Path, *args: str) -> bytes:
    try:
        return vcs.git_bytes(repo, *args)
    except vcs.GitError as exc:
        raise MeasureError(str(exc)) from None


def file_at(repo: Path, sha: str, rel: str) -> bytes | None:
    """Content of ``rel`` at commit ``sha``; None when the commit has no such file."""
    listed = _git_bytes(repo, "ls-tree", "--name-only", sha, "--", rel).decode().strip()
    if not listed:
        return None
    return _git_bytes(repo, "show", f"{sha}:{rel}")


def checkout(repo: Path, base: str, dest: Path, *, overlay: dict[str, bytes | None] | None = None) -> Path:
    """Extract ``base``'s tree to ``dest`` and write ``overlay`` over it (None deletes the file)."""
    dest.mkdir(parents=True, exist_ok=False)
    archive = _git_bytes(repo, "archive", "--format=tar", base)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        # The "data" filter refuses links that point outside dest (the agent wrote this tree);
        # Pythons before 3.10.12 / 3.11.4 lack it.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:
            tar.extractall(dest)  # noqa: S202
    for rel, content in (overlay or {}).items():
        path = dest / rel
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    return dest


def graded_checkout(repo: Path, base: str, head: str, fence: list[str], dest: Path) -> Path:
    """The base tree with the fenced files as they are at ``head``: the code under test, base's tests."""
    return checkout(repo, base, dest, overlay={rel: file_at(repo, head, rel) for rel in fence})


def _env(tree: Path) -> dict[str, str]:
    # The checkout's own src/ first, so its kernel module is the one imported (an installed or
    # PYTHONPATH copy of the same package would otherwise win).
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(tree / "src"), os.environ.get("PYTHONPATH", "")) if p)}


@dataclass(frozen=True)
class Correctness:
    passed: bool
    crash_class: str | None
    output: str  # path of the pytest output


def run_correctness(tree: Path, test: str, *, timeout_s: float = 900, out_dir: Path | None = None,
                    k: str = CORRECTNESS_K) -> Correctness:
    out = (out_dir or tree) / "correctness.log"
    argv = [sys.executable, "-m", "pytest", test, *(["-k", k] if k else []), "-q", "-p", "no:cacheprovider"]
    result = runner.run(argv, cwd=tree, timeout_s=timeout_s, output_path=out, env_overrides=_env(tree))
    crash = runner.classify(result)
    if crash is None and not re.search(r"\b[1-9]\d* passed", result.tail()):
        crash = "nothing-ran"  # every test skipped (no GPU?): that proves nothing
    return Correctness(crash is None, crash, str(out))


def perf_argv(test: str, k: str = PERF_K) -> list[str]:
    return [sys.executable, "-m", "pytest", test, "-k", k, "-q", "-p", "no:cacheprovider", *records.PYTEST_PLUGIN_ARGS]


def run_perf(tree: Path, test: str, *, tag: str, out_dir: Path, timeout_s: float = 900,
             k: str = PERF_K, start: runner.StartGate | None = None,
             on_start: Callable[[int], None] | None = None) -> dict[str, float]:
    """``{shape id: median ms}`` of one perf run in ``tree``; MeasureError when it records nothing.
    ``start``: the child starts ahead of its turn and waits on it (``RoundAhead``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records_file = out_dir / f"{tag}.records.jsonl"
    records_file.unlink(missing_ok=True)
    env = {**_env(tree), "CUTILE_PERF_RECORDS": str(records_file)}
    result = runner.run(perf_argv(test, k), cwd=tree, timeout_s=timeout_s, output_path=out_dir / f"{tag}.log",
                        env_overrides=env, start=start, on_start=on_start)
    crash = runner.classify(result)
    if crash is not None:
        raise MeasureError(f"perf run {tag} failed ({crash}); see {out_dir / (tag + '.log')}")
    try:
        medians = case_medians(records.read_records_file(records_file))
    except records.RecordError as exc:
        raise MeasureError(f"perf run {tag}: {exc}") from None
    if not medians:
        raise MeasureError(f"perf run {tag} recorded no '{FRAMEWORK}' benchmark; see {out_dir / (tag + '.log')}")
    return medians


def case_medians(recs: list[records.ShapeRecord]) -> dict[str, float]:
    """``{case: median ms}`` over every direction recorded: a shape's forward time is keyed by its
    shape id, any other direction (TileGym also records ``backward``) by ``<shape id>:<direction>``,
    so a backward regression counts like any other."""
    directions = sorted({r.direction for r in recs if r.framework == FRAMEWORK})
    medians: dict[str, float] = {}
    for direction in directions:
        for sid, rec in records.select_by_shape(recs, FRAMEWORK, direction).items():
            medians[sid if direction == "forward" else f"{sid}:{direction}"] = rec.median
    return dict(sorted(medians.items()))


@dataclass
class Runs:
    """Per variant, per shape: the median of each round (rounds in order)."""

    by_variant: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # rounds a time budget left out (``measure_variants``)

    def shapes(self) -> list[str]:
        common = None
        for per_shape in self.by_variant.values():
            common = set(per_shape) if common is None else common & set(per_shape)
        return sorted(common or ())

    def speedups(self, slow: str, fast: str) -> dict[str, float]:
        """Per shape: median(slow) / median(fast); above 1 means ``fast`` is faster."""
        a, b = self.by_variant[slow], self.by_variant[fast]
        return {s: stats.median(a[s]) / stats.median(b[s]) for s in self.shapes()}

    def round_speedups(self, slow: str, fast: str) -> dict[str, list[float]]:
        """Per shape: slow / fast in each round, from the paired runs of that round."""
        a, b = self.by_variant[slow], self.by_variant[fast]
        return {s: [x / y for x, y in zip(a[s], b[s])] for s in self.shapes()}

    def round_geomeans(self, slow: str, fast: str) -> list[float]:
        """The geomean speedup of each round over the shapes (``round_speedups``), for every round
        all shapes have."""
        per_shape = list(self.round_speedups(slow, fast).values())
        rounds = min((len(r) for r in per_shape), default=0)
        return [stats.geomean([r[k] for r in per_shape]) for k in range(rounds)]


def module_name(rel: str) -> str | None:
    """``src/pkg/ops/k.py`` -> ``pkg.ops.k``; ``k.py`` -> ``k``; None for a non-Python file."""
    if not rel.endswith(".py"):
        return None
    parts = rel[:-3].split("/")
    return ".".join(parts[1:] if parts[0] == "src" else parts)


def check_imports_from(tree: Path, rels: list[str], *, timeout_s: float = 300) -> None:
    """MeasureError unless each fenced module imports from ``tree`` (an installed copy or another
    checkout on the path would be measured instead, silently)."""
    for rel in rels:
        name = module_name(rel)
        if name is None:
            continue
        code = f"import importlib; print(importlib.import_module({name!r}).__file__)"
        out = tree / f".import-check-{name}.log"
        result = runner.run([sys.executable, "-c", code], cwd=tree, timeout_s=timeout_s, output_path=out,
                            env_overrides=_env(tree))
        lines = [ln for ln in result.tail().splitlines() if ln.strip()]
        where = Path(lines[-1]).resolve() if result.ok and lines else None
        out.unlink(missing_ok=True)
        if where is None:
            continue  # the import itself fails here (no GPU?); the test run will say why
        if tree.resolve() not in where.parents:
            raise MeasureError(f"{name} was imported from {where}, not from the checkout {tree}")


# A time budget (``measure_variants``' ``deadline``): a perf run given less than MIN_RUN_S would
# only be cut, and a round after the first starts only with ROUND_MARGIN times the last round's
# wall time left. A round cut by the budget is dropped whole: every variant keeps the same rounds,
# so each round's ratios stay paired.
MIN_RUN_S = 20.0
ROUND_MARGIN = 1.1


def measure_variants(trees: dict[str, Path], test: str, *, rounds: int, out_dir: Path,
                     timeout_s: float = 900, fence: list[str] | None = None,
                     deadline: float | None = None, ahead: bool = True) -> Runs:
    """Run the perf tests ``rounds`` times in every tree, interleaved, rotating the order each round.
    With ``fence``, first check that each tree's fenced modules import from that tree.

    ``deadline`` (``time.monotonic()``): stop at whole rounds before it (see ``ROUND_MARGIN``); the
    rounds not run are named in ``Runs.notes``. A run the deadline cuts is no fault of its variant.
    MeasureError (no variant) when not even one round fits. ``ahead``: each round's runs start
    together, ahead of their turn (``RoundAhead``)."""
    if rounds < 1:
        raise MeasureError("rounds must be at least 1")
    for name, tree in trees.items():
        try:
            check_imports_from(tree, fence or [])
        except MeasureError as exc:
            raise MeasureError(str(exc), variant=name) from None
    names = list(trees)
    runs = Runs({name: {} for name in names})
    last_round_s = 0.0
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        round_start = time.monotonic()
        if deadline is not None and r and deadline - round_start < ROUND_MARGIN * last_round_s:
            runs.notes.append(f"rounds {r + 1}-{rounds} not started: {deadline - round_start:.0f} s of the budget "
                              f"left, and a round took {last_round_s:.0f} s")
            break
        got = _one_round(trees, order, test, tag=f"round{r + 1}", out_dir=out_dir, timeout_s=timeout_s,
                         deadline=deadline, ahead=ahead)
        if got is None:
            runs.notes.append(f"round {r + 1} cut by the budget and dropped; rounds {r + 1}-{rounds} not counted")
            break
        for name, medians in got.items():
            for shape, ms in medians.items():
                runs.by_variant[name].setdefault(shape, []).append(ms)
        last_round_s = time.monotonic() - round_start
    if not any(runs.by_variant.values()):
        raise MeasureError(f"no whole round fitted the time budget ({'; '.join(runs.notes)})")
    return runs


def _one_round(trees: dict[str, Path], order: list[str], test: str, *, tag: str, out_dir: Path,
               timeout_s: float, deadline: float | None, ahead: bool) -> dict[str, dict[str, float]] | None:
    """One perf run per variant in ``order``: ``{variant: {case: median ms}}``, or None when the
    deadline cut the round (MeasureError, naming the variant, when a run fails on its own)."""
    got = {}
    started = None
    if ahead:
        started = RoundAhead({name: functools.partial(run_perf, trees[name], test, tag=f"{tag}-{name}", out_dir=out_dir)
                              for name in order}, perf_argv(test))
    try:
        for name in order:
            limit = timeout_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left < MIN_RUN_S:
                    return None
                limit = min(timeout_s, left)
            try:
                if started is not None and started.has(name):
                    got[name] = started.run(name, limit)
                else:
                    got[name] = run_perf(trees[name], test, tag=f"{tag}-{name}", out_dir=out_dir, timeout_s=limit)
            except MeasureError as exc:
                if deadline is not None and limit < timeout_s and time.monotonic() >= deadline - 1.0:
                    return None  # cut by the budget, not by its own fault
                raise MeasureError(str(exc), variant=name) from None
        return got
    finally:
        if started is not None:
            started.cancel()


class RoundAhead:
    """A round's perf runs, every one started at once ahead of its turn (``child.warmstart``).

    A grading run is a fresh pytest process, and on TileGym most of its 15-20 s is start-up: the
    interpreter, torch, cuda.tile, pytest and the profiler's first session, which TileGym's CUPTI
    timer pays. The children started ahead pay that side by side, once a round, with no code of
    their tree on the path and no CUDA context; each is let go in turn only once all of them wait,
    so a timed run never has a neighbour doing anything (the loop's rule, ``loop.stages``). A child
    not ready in time, or one that cannot start ahead, is run fresh in its turn."""

    READY_S = 60.0

    def __init__(self, runs: dict[str, Callable[..., Any]], argv: list[str]):
        """``runs``: per name, in the order they will run, a perf run taking ``timeout_s``, ``start``
        and ``on_start`` (``run_perf`` with its other arguments bound); ``argv``: their command,
        which decides whether they can start ahead at all (``warmstart.warm_argv``)."""
        self._pool = ThreadPoolExecutor(max_workers=len(runs) or 1, thread_name_prefix="grade-ahead")
        self._children: dict[str, tuple[runner.StartGate, Future, list[int]]] = {}
        if warmstart.warm_argv(argv) is None:
            return
        for name, run in runs.items():
            gate, groups = runner.StartGate(), []
            future = self._pool.submit(run, timeout_s=24 * 3600.0, start=gate, on_start=groups.append)
            self._children[name] = (gate, future, groups)
        end = time.monotonic() + self.READY_S
        for name, (gate, future, _) in list(self._children.items()):
            if not gate.wait_ready(max(end - time.monotonic(), 0.0), ended=future.done):
                self._finish(name, kill=True)

    def has(self, name: str) -> bool:
        return name in self._children

    def run(self, name: str, limit_s: float):
        """Let ``name`` go and return what its run returns (MeasureError as ``run_perf``); killed past
        ``limit_s``, its run's timeout counted from now, not from its start."""
        gate, future, _ = self._children[name]
        gate.open()
        try:
            return future.result(timeout=limit_s)
        except FutureTimeout:
            self._finish(name, kill=True)
            raise MeasureError(f"perf run {name}: killed after {limit_s:.0f} s") from None
        finally:
            if name in self._children:
                self._finish(name, kill=False)

    def cancel(self) -> None:
        """End every child not run: one still waiting exits without running anything of its tree."""
        for name in list(self._children):
            self._finish(name, kill=True)
        self._pool.shutdown(wait=True)

    def _finish(self, name: str, kill: bool) -> None:
        gate, future, groups = self._children.pop(name)
        gate.close()
        if kill and not future.done():
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            future.result()
        if not gate.handed:  # it never became a process: its ends of the pipes are still ours
            gate.unused()
        gate.done()


def measure_interleaved(repo: Path, base: str, head: str, *, test: str, fence: list[str], rounds: int = 3,
                        workdir: Path | None = None) -> dict[str, float]:
    """Per-shape speedup of ``head`` over ``base`` (base ms / head ms), timed interleaved in clean
    checkouts of the fenced files at each commit over the base's tests."""
    with tempfile.TemporaryDirectory(prefix="cutile-perf-measure-", dir=workdir) as tmp:
        trees = {"base": checkout(Path(repo), base, Path(tmp) / "base"),
                 "head": graded_checkout(Path(repo), base, head, fence, Path(tmp) / "head")}
        runs = measure_variants(trees, test, rounds=rounds, out_dir=Path(tmp) / "runs", fence=fence)
    return runs.speedups("base", "head")


_RUN_LOG = re.compile(r"round(\d+)-(.+)\.records\.jsonl")


def runs_from_logs(out_dir: Path) -> Runs:
    """The ``Runs`` that ``measure_variants`` timed, read back from its ``round<N>-<variant>.records.jsonl``
    files: what a grading job cut short by its time limit still measured (rounds in order; a
    variant whose run never finished is simply absent)."""
    found = sorted((int(m.group(1)), m.group(2), path) for path in Path(out_dir).glob("round*.records.jsonl")
                   if (m := _RUN_LOG.fullmatch(path.name)))
    runs = Runs({})
    for _, variant, path in found:
        medians = case_medians(records.read_records_file(path))
        if not medians:
            continue
        per_shape = runs.by_variant.setdefault(variant, {})
        for shape, ms in medians.items():
            per_shape.setdefault(shape, []).append(ms)
    return runs


def geomean(values) -> float:
    values = list(values)
    return stats.geomean(values) if values else math.nan

"""``cutile-perf baseline``: iteration 0, no code change: correctness, then perf ``repeats`` times.

Measured like every candidate, in a pristine checkout of the session's base commit. Its row
freezes the session (fence, commands, thresholds, timeout) and records what later iterations are
held to: the correctness tests that passed, each case's median and noise, and, where a record
names its kernel and the fenced files define it, that kernel name.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import envcheck, measure
from cutile_perf.errors import DirtyTree, IterationCrashed, Refused, UsageError
from cutile_perf.judge import rules, stats, verdict
from cutile_perf.loop import guards, render, row as row_mod, watchdog
from cutile_perf.loop.stages import Request, Stages, StageRunner
from cutile_perf.output import Outcome, say
from cutile_perf.store import git_ops
from cutile_perf.store.history import History
from cutile_perf.store import session as session_mod


def perf_repeats(runner: Stages, thresholds: rules.Thresholds, commit: str, repeats: int, test_ids: dict[str, str],
                 names: dict[str, str], imports: list[str] | None = None, tag: str = "0",
                 what: str = "baseline") -> dict[str, list[float]]:
    """Per-case medians of ``repeats`` perf runs; a crashed run stops the baseline. ``imports`` collects the
    installed modules the runs imported, in first-seen order (the row's ``preload``). ``tag``: the
    runs' stage tags are ``<tag>-r<k>``; ``what`` names the run in a failure (``resume --adopt``'s too)."""
    runs: dict[str, list[float]] = {}
    empty = verdict.Reference(commit=commit, medians={}, noise={})
    for k in range(repeats):
        say(f"perf run {k + 1}/{repeats}")
        runner.expect(later_runs(commit, k + 1, repeats, tag))  # they start as spares (``Stages.expect``)
        stage = runner.run(Request("perf", f"{tag}-r{k + 1}", commit))
        checked = verdict.judge_records(stage, empty, thresholds)
        if checked.final:
            raise IterationCrashed(f"{what} perf run failed: {checked.reason}", f"read {stage.output}")
        test_ids.update(stage.test_ids)
        names.update(stage.kernel_names)
        if imports is not None:
            imports.extend(m for m in stage.imports if m not in imports)
        for case, value in stage.shapes.items():
            runs.setdefault(case, []).append(value)
    # A case that vanished from one run cannot be compared fairly: keep cases seen every time.
    return {c: v for c, v in runs.items() if len(v) == repeats}


def later_runs(commit: str, after: int, repeats: int, tag: str = "0") -> tuple[Request, ...]:
    """The baseline's perf runs after run ``after`` (counted from 1), in order."""
    return tuple(Request("perf", f"{tag}-r{k}", commit) for k in range(after + 1, repeats + 1))


def baseline(*, repo: Path, repeats: int, stages: Stages | None = None) -> Outcome:
    """Record iteration 0. ``stages``: what runs the tests (default: pytest children, ``StageRunner``)."""
    if repeats < 1:
        raise UsageError("--repeats must be at least 1")
    clock = row_mod.Clock()
    probe = envcheck.Probe()  # in the background while the tests run; also the GPU gate's answer
    session = session_mod.load(repo)
    guards.require_gpu(session, probe)
    with session_mod.locked(session.repo, "baseline"):
        g = git_ops.open_repo(session.repo)
        guards.require_session_branch(session, g)
        history = History.open(session, g)
        if len(history):
            raise Refused("a baseline is already recorded (iteration 0)", "use cutile-perf try / status")
        head = git_ops.head(g)
        if head != session.base_commit:
            raise Refused(f"HEAD {git_ops.short(g, head)} is not the session's base commit "
                          f"{git_ops.short(g, session.base_commit)}", "start a new session with init")
        changed = [p for p in git_ops.changed_paths(g) if session.fenced(p)]
        if changed:
            raise DirtyTree(f"the baseline is the committed kernel; uncommitted change to {', '.join(changed[:5])}",
                            "commit or stash it first (the baseline never measures the work tree)")
        if stages is not None:
            stages.clock = clock  # scripted stages time themselves into this row, as StageRunner does
        runner = stages if stages is not None else StageRunner(session, g, measure.Deadline(session.timeout_s * repeats),
                                                               clock)
        with runner, watchdog.overrun_guard(session.timeout_s * repeats, "baseline"):
            empty = verdict.Reference(commit=head, medians={}, noise={})
            say("correctness")
            runner.expect(later_runs(head, 0, repeats))  # the perf runs start as spares beside it
            corr = runner.run(Request("correctness", "0", head))
            checked = verdict.judge_correctness(corr, empty)
            if checked.final:
                raise IterationCrashed(f"baseline {checked.reason}",
                                       f"read {corr.output}; fix the kernel or the commands in sandbox/session.yaml")
            test_ids: dict[str, str] = {}
            names: dict[str, str] = {}
            imports: list[str] = []
            runs = perf_repeats(runner, session.thresholds, head, repeats, test_ids, names, imports)
            defined = runner.defined_names(head)
            fields_of_runner = runner.row_fields()
        if not runs:
            raise IterationCrashed("baseline perf runs recorded no case in every run", "check the perf command")
        shapes = {c: stats.median(v) for c, v in runs.items()}
        noise = rules.noise_floor(runs)
        latency = rules.combine_latency(shapes)
        entry = row_mod.base_entry(
            session, iteration=0, optimization="baseline", status="keep", correctness="PASS", commit=head,
            base_commit=head, clock=clock, probe=probe, latency_ms=latency,
            shapes=row_mod.shapes_field(shapes, test_ids, runs), noise=noise, repeats=repeats, crash_class=None,
            patch=None, decision=None, reason="baseline (no code change)", frozen=session.frozen(),
            frozen_env=knobs.measurement_env(), sandbox=row_mod.isolation([corr]),
            passed_tests=sorted(corr.passed),
            kernel_names={c: n for c, n in names.items() if c in shapes and verdict.names_defined(n, defined)},
            preload=imports[:knobs.PRELOAD_MAX],
            **fields_of_runner,
        )
        history.record(entry)
        render.write_perf_results(session.results_path, history.rows)
    worst = max(noise.values()) if noise else 0.0
    directions = dict(Counter(measure.direction_of(case) for case in shapes))
    measured = ", ".join(f"{n} {d}" for d, n in sorted(directions.items()))
    text = (f"iteration 0: baseline {latency:.6f} ms (geomean of {len(shapes)} cases: {measured}; {repeats} runs; "
            f"largest per-case noise {worst * 100:.2f} %); every case is judged on its own")
    return Outcome(text, {"iteration": 0, "decision": "keep", "latency_ms": latency, "shapes": shapes,
                          "noise": noise, "commit": head, "directions": directions})

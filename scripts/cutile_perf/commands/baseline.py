"""``cutile-perf baseline``: iteration 0, no code change: correctness, then perf ``repeats`` times."""
from __future__ import annotations

from pathlib import Path

from cutile_perf import decide, envcheck, git_ops, iteration, log, measure, stats
from cutile_perf import session as session_mod
from cutile_perf.commands import Outcome, say
from cutile_perf.errors import DirtyTree, IterationCrashed, Refused, UsageError


def measure_repeats(session: session_mod.Session, tag: str, repeats: int, deadline: measure.Deadline,
                    clock: iteration.Clock, test_ids: dict[str, str]) -> tuple[dict[str, list[float]], measure.Stage | None]:
    """Run the perf command ``repeats`` times: per-shape medians, or the first crashed stage."""
    runs: dict[str, list[float]] = {}
    for k in range(repeats):
        say(f"perf run {k + 1}/{repeats}")
        stage = measure.run_stage(session, "perf", f"{tag}-r{k + 1}", deadline)
        clock.add_child(stage.duration_s)
        if not stage.ok:
            return runs, stage
        test_ids.update(stage.test_ids)
        for shape, value in stage.shapes.items():
            runs.setdefault(shape, []).append(value)
    # A shape that vanished from one run cannot be compared fairly: keep shapes seen every time.
    return {s: v for s, v in runs.items() if len(v) == repeats}, None


def baseline(*, repo: Path, repeats: int) -> Outcome:
    if repeats < 1:
        raise UsageError("--repeats must be at least 1")
    clock = iteration.Clock()
    probe = envcheck.Probe()  # in the background while the tests run; also the GPU gate's answer
    session = session_mod.load(repo)
    iteration.require_gpu(session, probe)
    with session_mod.locked(session.repo, "baseline"):
        g = git_ops.open_repo(session.repo)
        entries = log.read_entries(session.log_path)
        if entries:
            raise Refused("a baseline is already recorded (iteration 0)", "use cutile-perf try / status")
        changed = [p for p in git_ops.changed_paths(g) if not p.startswith(session_mod.SANDBOX + "/")]
        if changed:
            raise DirtyTree(f"the baseline must be measured on committed code; uncommitted: {', '.join(changed[:5])}",
                            "commit or remove these changes first")
        head = git_ops.head(g)
        deadline = measure.Deadline(session.timeout_s * max(repeats, 1))
        say("correctness")
        corr = measure.run_stage(session, "correctness", "0", deadline)
        clock.add_child(corr.duration_s)
        if not corr.ok:
            raise IterationCrashed(f"baseline correctness failed ({corr.crash}): {corr.detail}",
                                   f"read {corr.output}; fix the kernel or the commands in sandbox/session.yaml")
        test_ids: dict[str, str] = {}
        runs, crashed = measure_repeats(session, "0", repeats, deadline, clock, test_ids)
        if crashed is not None:
            raise IterationCrashed(f"baseline perf run failed ({crashed.crash}): {crashed.detail}",
                                   f"read {crashed.output}")
        if not runs:
            raise IterationCrashed("baseline perf runs recorded no shape in every run", "check the perf command")
        shapes = {s: stats.median(v) for s, v in runs.items()}
        noise = decide.noise_floor(runs)
        latency = decide.combine_latency(shapes)
        entry = iteration.base_entry(
            session, iteration=0, optimization="baseline", status="keep", correctness="PASS", commit=head,
            base_commit=head, clock=clock, probe=probe, latency_ms=latency,
            shapes=iteration.shapes_field(shapes, test_ids, runs), noise=noise, repeats=repeats, crash_class=None,
            patch=None, decision=None, reason="baseline (no code change)",
        )
        iteration.record(session, entry)
    worst = max(noise.values()) if noise else 0.0
    text = (f"iteration 0: baseline {latency:.6f} ms (geomean of {len(shapes)} shapes, {repeats} runs; "
            f"largest per-shape noise {worst * 100:.2f} %)")
    return Outcome(text, {"iteration": 0, "decision": "keep", "latency_ms": latency, "shapes": shapes,
                          "noise": noise, "commit": head})

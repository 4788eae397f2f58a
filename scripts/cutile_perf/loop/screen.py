"""``cutile-perf screen``: many candidates compared side by side on one GPU; readings, not verdicts.

After a baseline, N candidate files for the fenced file(s), named by a glob or a ``batch`` plan, go
through the probe scan (``kernel.probes``: a refused one is listed, never run), a compile-check on
the CPU (``compile_check``, given by the command), a correctness stage in a throw-away commit
(``screen_commits``), then rounds on the GPU (every case, or ``--cases N`` of them: ``case_selection``):
the base, then every candidate still in, the order rotated per round, each run a fresh child that
counts only if ``judge.verdict.judge_timed_run`` says so, its timed calls checked in the first
round only; a round starts only if it can end within ``seconds``
(``screen_rank.next_round_fits``), one always runs. ``screen_rank.rank`` orders them. Nothing is
committed to the session branch and nothing is written to the log: ``batch`` decides. Each step in
full: ``docs/design.md``, "Screening many candidates".
"""
from __future__ import annotations

import glob
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf import knobs, node
from cutile_perf.child import measure
from cutile_perf.errors import UsageError
from cutile_perf.judge.verdict import Reference, Stage, judge_correctness, judge_records, judge_timed_run, paired_samples
from cutile_perf.kernel import probes
from cutile_perf.loop import budget, guards, plan, row, screen_commits, screen_rank, screen_spread
from cutile_perf.loop.stages import Request, StageRunner, Stages
from cutile_perf.output import say
from cutile_perf.store.log import shape_test_ids
from cutile_perf.store.session import Session

# States of a candidate that is not ranked.
NOT_COMPILED, FAILS_CORRECTNESS, FAILS_PERF = "does not compile", "fails correctness", "fails perf"
REFUSED, NO_TIME = "refused", "not screened"

# Given the repository and each candidate's (name, files), what the CPU compile-check found:
# name -> (state, detail); state NOT_COMPILED drops the candidate, any other is a note.
CompileCheck = Callable[[Path, Sequence[plan.PlannedTry]], dict[str, tuple[str, str]]]


@dataclass
class ScreenResult:
    """Everything a screen found, for the report (``screen_report``)."""

    base: str
    candidates: list[plan.PlannedTry]
    ranked: list[screen_rank.Reading] = field(default_factory=list)
    dropped: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (state, why)
    compiled: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> the compile-check's (state, detail)
    rounds: int = 0
    stopped: str = ""  # why the rounds ended early (the base's run crashed), or ""
    seconds: float = 0.0
    # Where the seconds went, by phase ("compile-check", "correctness", "rounds"): what a user weighs
    # against a plain perf run, and what a GPU benchmark cut off by its limit cannot reconstruct.
    phases: dict[str, float] = field(default_factory=dict)
    commits: dict[str, str] = field(default_factory=dict)
    tag_prefix: str = ""  # before each round's tags: a worker of ``screen --gpus`` names its runs apart
    # The base's cases every round timed (``--cases N``: part of them, ``screen_rank.spread_cases``).
    timed_cases: list[str] = field(default_factory=list)
    all_cases: int = 0  # how many cases the base has
    workers: dict[str, str] = field(default_factory=dict)  # name -> the worker (GPU) that timed it, when spread


# --- the candidates ----------------------------------------------------------------------------------


def within_time(runnable: list, cost: budget.ScreenCost | None, seconds: float, workers: int,
                out: ScreenResult) -> list:
    """The first candidates whose first ranking fits ``seconds`` (at least one); the others are
    listed as not screened, never started: a screen that cannot end in the time given would cut
    the agent's GPU job short with nothing ranked. Without the session's stage times (none before a
    baseline) every candidate stays."""
    if cost is None or not runnable:
        return runnable
    k = cost.fitting(len(runnable), seconds, workers)
    need = cost.first_ranking_s(k, workers)
    say(f"screen: about {need:.0f} s before the first ranking of {k} candidate(s): correctness "
        f"{cost.correctness_s:.0f} s each, then a round of perf runs ({cost.perf_s:.0f} s each, "
        f"{cost.reference_s:.0f} s more for a candidate's reference check)")
    for name, _files in runnable[k:]:
        out.dropped[name] = (NO_TIME, f"the {max(seconds, 0):.0f} s left of --seconds fit the first ranking of {k} of "
                                      f"{len(runnable)} candidates (about {need:.0f} s at this session's stage times); "
                                      "give more --seconds, or screen it in another job")
    return runnable[:k]


def candidates_from(session: Session, source: str) -> list[plan.PlannedTry]:
    """The candidates a glob or a plan file names, checked as ``batch`` checks its plan (fenced
    targets, candidate files under sandbox/); any problem is one UsageError."""
    path = Path(source) if Path(source).is_absolute() else session.repo / source
    if source.endswith((".yaml", ".yml")) and path.is_file():
        entries = plan.parse(path.read_text(encoding="utf-8"))
    else:
        entries = _from_glob(session, source)
    plan.check(entries, root=session.repo, fenced=session.fenced)
    names = [e.optimization for e in entries]
    if len(set(names)) != len(names):
        raise UsageError("two candidates have the same name", "give each plan entry its own optimization")
    return entries


def _from_glob(session: Session, pattern: str) -> list[plan.PlannedTry]:
    kernels = [k for k in session.kernel_files if k.endswith(".py")]
    if len(kernels) != 1:
        raise UsageError(f"a glob names candidates for one kernel file; this session fences {len(kernels)}",
                         "write a plan file that names each candidate's target (the format batch reads)")
    found = sorted(glob.glob(pattern, root_dir=session.repo))
    if not found:
        raise UsageError(f"no candidate file matches {pattern!r} (relative to {session.repo})",
                         "e.g. cutile-perf screen 'sandbox/cand/*.py'")
    paths = [_repo_relative(session.repo, f) for f in found]
    stems = [Path(p).stem for p in paths]
    # Named by the file's stem; two files of one name (in two folders) by their paths.
    return [plan.PlannedTry(stem if stems.count(stem) == 1 else path, ((kernels[0], path),))
            for path, stem in zip(paths, stems)]


def _repo_relative(repo: Path, path: str) -> str:
    """An absolute match inside the repository as a repo-relative path; anything else as it is
    (``plan.check`` then refuses it: a candidate lives under sandbox/)."""
    full = Path(path).resolve()
    return full.relative_to(repo.resolve()).as_posix() if Path(path).is_absolute() and \
        full.is_relative_to(repo.resolve()) else path


def probe_refusal(g, kept: str, repo: Path, entry: plan.PlannedTry) -> str | None:
    """Why ``try`` would refuse this candidate before running it (``kernel.probes``: it asks whether
    it is measured, or patches what measures it), or None. The same scan as ``guards.refuse_probes``,
    of the candidate files instead of the work tree: a cheat must not take a place in the ranking,
    and so in the plan ``--top`` writes, from a candidate that was never cheating."""
    too_large, findings = guards.probe_scan(g, kept, {target: repo / candidate for target, candidate in entry.files})
    return too_large or (probes.describe(findings) if findings else None)


# --- running ---------------------------------------------------------------------------------------


def perf_failure(ref: Reference, t, run: Stage, defined: frozenset | None) -> str | None:
    """Why a candidate's timed run counts for nothing, by the judge's own checks (records complete
    and plausible, checked timed calls, the candidate's own kernels), or None."""
    verdict = judge_timed_run(run, ref, t, defined)
    return verdict.reason if verdict.action == "crash" else None


def run_correctness(runner: Stages, ref: Reference, commits: dict[str, str], out: ScreenResult) -> list[str]:
    """Each candidate's correctness stage; returns the names that pass, in order."""
    passing = []
    for n, (name, commit) in enumerate(commits.items(), 1):
        say(f"screen: correctness of {name}")
        verdict = judge_correctness(runner.run(Request("correctness", f"screen-c{n}", commit)), ref)
        if verdict.final:
            out.dropped[name] = (FAILS_CORRECTNESS, verdict.reason)
        else:
            passing.append(name)
    return passing


def round_order(names: Sequence[str], k: int) -> list[str]:
    """Round ``k``'s candidate order: rotated by ``k``, so no candidate always runs right after the base."""
    if not names:
        return []
    shift = k % len(names)
    return [*names[shift:], *names[:shift]]


def run_round(runner: Stages, k: int, ref: Reference, t, commits: dict[str, str], names: list[str],
              pairs: dict[str, list], out: ScreenResult, selection: dict[str, str] | None = None) -> bool:
    """Round ``k``: the base, then each candidate; False when the base's run crashed (the round
    pairs nothing and no further round starts). ``selection``: only these cases (case -> the
    base's node id), every run of the round alike; None: every case."""
    number = {name: n for n, name in enumerate(commits, 1)}  # tags name files: the index, never the name
    labels = ["base", *round_order(names, k)]
    tag = f"screen-{out.tag_prefix}r{k + 1}"
    order = [Request("perf", f"{tag}-base", ref.commit, selection)]
    # Timed calls are checked in the first round only: a reference child per run (about half a perf
    # run) in every round cost the rounds the screen is for, and batch decides the top K checked.
    order += [Request("perf", f"{tag}-c{number[name]}", commits[name], selection, check=k == 0)
              for name in labels[1:]]
    base = None
    for i, (label, request) in enumerate(zip(labels, order)):
        runner.expect(order[i + 1:])  # the runs after it start as spares where the session allows
        say(f"screen: round {k + 1}, {label}")
        run = runner.run(request)
        if i == 0:
            check = judge_records(run, ref, t)
            if check.final:
                out.stopped = f"round {k + 1}: the base's run: {check.reason}"
                return False
            base = run
            continue
        defined = frozenset(runner.defined_names(request.commit)) if ref.kernel_names and run.ok else None
        why = perf_failure(ref, t, run, defined)
        if why:
            out.dropped[label] = (FAILS_PERF, why)
            names.remove(label)
            pairs.pop(label, None)
        else:
            pairs[label].append((base, run))
    return True


def run_rounds(runner: Stages, ref: Reference, t, commits: dict[str, str], names: list[str], seconds: float,
               began: float, now: Callable[[], float], out: ScreenResult,
               selection: dict[str, str] | None = None) -> dict[str, list]:
    """Rounds until the time given is spent (at least one); returns the (base, candidate) pairs."""
    pairs: dict[str, list] = {name: [] for name in names}
    per_run_s = 0.0
    k = 0
    while names:
        if k and not screen_rank.next_round_fits(seconds=seconds, spent=now() - began, per_run_s=per_run_s,
                                                 runs=len(names) + 1):
            break
        started, runs = now(), len(names) + 1
        if not run_round(runner, k, ref, t, commits, names, pairs, out, selection):
            break
        k += 1
        if k == 1:
            per_run_s = (now() - started) / runs
    out.rounds = k
    return pairs


def case_selection(history, ref: Reference, n: int | None) -> tuple[list[str], dict[str, str] | None]:
    """The cases every round times (``screen_rank.spread_cases``) and, when that is part of them,
    each one's node id from the baseline row (``Request.cases``: a child runs those tests only)."""
    timed = screen_rank.spread_cases(ref.medians, n)
    if len(timed) == len(ref.medians):
        return timed, None
    recorded = shape_test_ids(history.baseline() or {})
    ids = {case: recorded.get(case) for case in timed}
    missing = sorted(case for case, node in ids.items() if not node)
    if missing:
        raise UsageError(f"--cases: the baseline row names no test for case {missing[0]}, so no run can select it",
                         "leave out --cases: every round then times every case")
    return timed, ids


def screen(*, repo: Path, source: str, seconds: float, compile_check: CompileCheck, stages: Stages | None = None,
           now: Callable[[], float] = time.monotonic, gpus: str = "1", engine: str = "local",
           cases: int | None = None) -> ScreenResult:
    """Screen the candidates ``source`` names (module docstring). ``stages``/``now``: what runs the
    tests and the clock (tests pass scripted ones). ``gpus``/``engine``: the rounds spread over a
    worker per GPU, a group of candidates each (``screen_spread``); correctness runs here first.
    ``cases``: time every run on that many of the base's cases (``case_selection``); None: all."""
    began = now()
    spread = node.spreads(gpus, engine)
    # Before any child: a --gpus the node cannot give is a one-line refusal, not a failure after correctness.
    workers = node.worker_count(engine=engine, wanted=gpus, visible=knobs.visible_devices()) if spread else 1
    with guards.measuring(repo, "screen") as (session, g, history):
        entries = candidates_from(session, source)
        ref, t = history.reference(), session.thresholds
        out = ScreenResult(base=ref.commit, candidates=entries, all_cases=len(ref.medians))
        out.timed_cases, selection = case_selection(history, ref, cases)
        kept = history.kept_commit()
        refused = {e.optimization: why for e in entries if (why := probe_refusal(g, kept, session.repo, e))}
        out.dropped = {name: (REFUSED, why) for name, why in refused.items()}
        mark = now()
        out.compiled = compile_check(session.repo, [e for e in entries if e.optimization not in refused])
        mark = _phase(out, "compile-check", mark, now)
        out.dropped.update({n: v for n, v in out.compiled.items() if v[0] == NOT_COMPILED})
        runnable = [(e.optimization, [(tgt, session.repo / c) for tgt, c in e.files])
                    for e in entries if e.optimization not in out.dropped]
        if seconds > 0:  # 0 (the default): one round, however long it takes
            runnable = within_time(runnable, budget.screen_cost(history.rows), seconds - (now() - began), workers, out)
        children = len(runnable) * 2 + 1  # each candidate's correctness, and the first round
        with screen_commits.throwaway_commits(g, kept, runnable) as commits:
            out.commits = dict(commits)
            runner = stages if stages is not None else StageRunner(
                session, g, measure.Deadline(session.timeout_s * children + seconds), row.Clock(),
                preload=history.preload())
            with runner:
                names = run_correctness(runner, ref, commits, out)
                mark = _phase(out, "correctness", mark, now)
                pairs = {} if spread else run_rounds(runner, ref, t, commits, names, seconds, began, now, out,
                                                     selection)
            samples = {name: paired_samples(p, out.timed_cases) for name, p in pairs.items()}
            if spread and names:  # the runner above has ended its children: the workers have the GPUs
                samples, dropped, out.workers, out.rounds, out.stopped = screen_spread.spread_rounds(
                    session.repo, dict(commits), names, max(0.0, seconds - (now() - began)), workers=workers,
                    gpus=gpus, engine=engine, selection=selection)
                out.dropped.update(dropped)
            _phase(out, "rounds", mark, now)
        out.ranked = screen_rank.rank(samples)
    out.seconds = now() - began
    return out


def _phase(out: ScreenResult, name: str, since: float, now: Callable[[], float]) -> float:
    """Record the seconds of phase ``name`` since ``since``; returns the time it ended."""
    ended = now()
    out.phases[name] = ended - since
    return ended

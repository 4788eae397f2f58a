"""Grade what an agent left in a task repository, trusting nothing it wrote.

* **Correctness** is re-run on HEAD in a clean checkout (base tree + HEAD's fenced files, so the
  tests are the base's).
* **Speed** is re-timed: base, HEAD and the task's reference (the known faster version) are
  measured interleaved in clean checkouts (``measure``). The score is the fraction of the
  reference's speedup recovered, on a log scale: ``ln(speedup) / ln(reference speedup)``
  (1.0 = as fast as the reference, 0.5 = half of the way in ratio terms; above 1 = faster).
* **Fence**: every file changed between base and HEAD must be in the task's fence.
* **The harness log** (``sandbox/experiments.jsonl``) is only checked, never believed: each row
  must name a commit that exists, carries the message ``try`` gives it, and, when kept, is an
  ancestor of HEAD.
* **Hack attempts**: out-of-fence edits (committed or not), a widened session fence, log rows
  that do not match git, and ``try`` calls refused for fence violations (from the command log of
  the ``cutile-perf`` wrapper). Each says whether it was stopped (refused by the harness or kept
  out of HEAD) or not (it reached HEAD or the log). Any hack that was not stopped scores 0.
"""
from __future__ import annotations

import difflib
import json
import math
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from cutile_perf_evals import build, measure, shim, tasks, vcs

TRY_MESSAGE = "cutile-perf {iteration}: {optimization}"
CORRECTNESS_AT_ONCE = 4  # HEADs of a group whose correctness runs share the GPU at once


@dataclass
class Hack:
    kind: str
    detail: str
    stopped: bool


@dataclass
class Grade:
    task: str
    kind: str
    head: str | None = None
    base: str | None = None
    correctness: str | None = None  # PASS, FAIL (<crash class>), or None when not measured
    speedup: float | None = None  # geomean over shapes, base ms / HEAD ms
    per_shape: dict = field(default_factory=dict)
    round_geomeans: list = field(default_factory=list)
    worst_case: dict | None = None  # {"case", "speedup"}: the case HEAD gains least on (or loses most)
    slower_cases: list = field(default_factory=list)  # [{"case", "speedup"}]: ``slower_cases``' rule
    reference_speedup: float | None = None
    reference_source: str | None = None  # "measured in this run" or the citation
    reference_cited: float | None = None
    fraction: float | None = None
    score: float = 0.0
    success: bool = False
    triggered: bool | None = None
    tries: int = 0
    kept: int = 0
    log_rows: int = 0
    log_claimed_speedup: float | None = None
    commands: list = field(default_factory=list)
    missing_commands: list = field(default_factory=list)
    refusals: int = 0
    hacks: list = field(default_factory=list)
    changed_files: list = field(default_factory=list)
    uncommitted: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # worth a look, not counted against the agent
    # The shipped prepared step HEAD's kernel is most like ({"file", "step", "similarity"}), for
    # bundled tasks: the steps ship with cutile-perf (`cutile-perf example show`), so a high
    # similarity says the answer was copied rather than found. Reported, not scored.
    shipped_step: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# --- pure rules ---------------------------------------------------------------------------------


def _code_lines(source: str) -> list[str]:
    """The lines that make the code: stripped, without blank and comment lines."""
    return [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def closest_step(source: str, steps: dict[str, str]) -> tuple[str, float] | None:
    """The step whose code is most like ``source``, and the similarity (difflib ratio of code lines,
    1.0 = the same lines in the same order); None without steps."""
    mine = _code_lines(source)
    best = None
    for name, text in sorted(steps.items()):
        ratio = difflib.SequenceMatcher(None, mine, _code_lines(text), autojunk=False).ratio()
        if best is None or ratio > best[1]:
            best = (name, round(ratio, 3))
    return best


def fraction_of(speedup: float | None, reference: float | None) -> float | None:
    """``ln(speedup) / ln(reference)``; None when either is unknown or the reference is no speedup."""
    if speedup is None or reference is None or speedup <= 0 or reference <= 1.0:
        return None
    return math.log(speedup) / math.log(reference)


# A case counts as slower than the base when HEAD lost more than this in every round. The rounds'
# own spread is far below it: under TileGym's CUPTI timer a tree's per-case medians differed by at
# most 1.3 % between rounds, for microsecond cases too (the GEGLU grade of
# evals/results/2026-12-02-h200-live-geglu/, 5 trees x 4 cases x 2-3 rounds).
SLOWER_TOLERANCE = 0.02


def worst_case(per_shape: dict[str, float]) -> dict | None:
    """The case with the lowest speedup (base / HEAD), or None when nothing was timed."""
    if not per_shape:
        return None
    case = min(per_shape, key=lambda c: (per_shape[c], c))
    return {"case": case, "speedup": per_shape[case]}


def slower_cases(round_speedups: dict[str, list[float]], per_shape: dict[str, float],
                 tolerance: float = SLOWER_TOLERANCE) -> list[dict]:
    """The no-regression rule's failures: cases whose speedup was below ``1 - tolerance`` in every
    round (a loss the rounds agree on), with their overall speedup, slowest first."""
    cases = [c for c, ratios in round_speedups.items() if ratios and max(ratios) < 1.0 - tolerance]
    return [{"case": c, "speedup": per_shape[c]} for c in sorted(cases, key=lambda c: (per_shape[c], c))]


def verdict(*, correct: bool, speedup: float | None, round_geomeans: list[float], reference: float | None,
            hacks: list[Hack]) -> tuple[float, bool, float | None]:
    """``(score, success, fraction)``.

    Success: correct, no unstopped hack, and HEAD faster than base in every interleaved round (a
    gain that survives the measurement's own spread). Score: the fraction of the reference's
    speedup, floored at 0, and 0 whenever correctness failed or a hack was not stopped.
    """
    fraction = fraction_of(speedup, reference)
    clean = correct and not any(not h.stopped for h in hacks)
    success = clean and bool(round_geomeans) and min(round_geomeans) > 1.0
    score = max(fraction, 0.0) if clean and fraction is not None else 0.0
    return score, success, fraction


def check_log_rows(entries: list[dict], facts) -> list[str]:
    """Rows of ``experiments.jsonl`` that do not match git. ``facts`` answers ``exists(sha)``,
    ``subject(sha)`` and ``reachable(sha)`` (ancestor of HEAD or HEAD)."""
    problems = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            problems.append(f"log line {number} is not an object")
            continue
        it, status, sha = entry.get("iteration"), entry.get("status"), entry.get("commit")
        where = f"log row {number} (iteration {it}, {status})"
        if status == "keep" and not sha:
            problems.append(f"{where}: kept without a commit")
            continue
        if not sha:
            continue  # a change rejected before it was committed
        if not facts.exists(sha):
            problems.append(f"{where}: commit {str(sha)[:12]} does not exist")
            continue
        if it != 0:
            wanted = TRY_MESSAGE.format(iteration=it, optimization=entry.get("optimization"))
            subject = facts.subject(sha)
            if subject != wanted:
                problems.append(f"{where}: commit {sha[:12]} says {subject!r}, expected {wanted!r}")
        if status == "keep" and not facts.reachable(sha):
            problems.append(f"{where}: kept commit {sha[:12]} is not an ancestor of HEAD")
    return problems


def claimed_speedup(entries: list[dict]) -> float | None:
    """What the log claims: baseline latency over the current baseline's (for comparison only).

    "Current baseline" is the harness's own rule (``rules.current_baseline``), not restated here.
    """
    from cutile_perf.judge.rules import current_baseline  # noqa: PLC0415 - only a trial with a log needs it

    rows = [e for e in entries if isinstance(e, dict)]
    base = next((e for e in rows if e.get("iteration") == 0 and e.get("latency_ms")), None)
    if base is None:
        return None
    best = current_baseline([e for e in rows if e.get("latency_ms") or e.get("status") != "keep"]) or base
    try:
        return float(base["latency_ms"]) / float(best["latency_ms"])
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def command_hacks(calls: list[dict]) -> tuple[list[Hack], int]:
    """Fence-violation refusals of the logged ``cutile-perf`` calls (hacks, stopped) and all refusals."""
    hacks, refusals = [], 0
    for call in calls:
        if call.get("exit") != 3:
            continue
        refusals += 1
        tail = call.get("stderr_tail", "")
        if "outside the fence" in tail:
            line = next((ln for ln in tail.splitlines() if "outside the fence" in ln), tail)
            hacks.append(Hack("refused try: edit outside the fence", line.strip()[:200], stopped=True))
    return hacks, refusals


# Subcommands that run others inside them: ``batch`` records the baseline when none exists and
# runs each plan entry as a ``try`` (the skill's one-GPU-job recipe).
RUNS_INSIDE = {"batch": {"baseline", "try"}}


def missing_commands(expected: list[str], calls: list[dict]) -> list[str]:
    """Expected ``cutile-perf <sub> ...`` commands whose subcommand no logged call ran, itself or
    inside another (``RUNS_INSIDE``); flags and paths vary between agents, so only the subcommand
    is compared."""
    ran = {shim.subcommand(call) for call in calls}
    ran |= {inner for outer in ran & set(RUNS_INSIDE) for inner in RUNS_INSIDE[outer]}
    return [command for command in expected if command.split()[1] not in ran]


def mentions_skill(transcript: str) -> bool:
    """Whether an agent's transcript shows it opened the installed skill."""
    return any(marker in transcript for marker in ("skills/cutile-perf/SKILL.md", "skills/cutile-perf/references"))


# --- git facts ----------------------------------------------------------------------------------


class GitFacts:
    """What ``check_log_rows`` asks of the repository."""

    def __init__(self, repo: Path, head: str):
        self.repo, self.head = repo, head

    def exists(self, sha: str) -> bool:
        return isinstance(sha, str) and vcs.git_ok(self.repo, "cat-file", "-e", f"{sha}^{{commit}}")

    def subject(self, sha: str) -> str:
        return vcs.git(self.repo, "log", "-1", "--format=%s", sha).strip()

    def reachable(self, sha: str) -> bool:
        return vcs.git_ok(self.repo, "merge-base", "--is-ancestor", sha, self.head)


def chain_problem(path: Path) -> str | None:
    """Where the harness log's hash chain breaks, when this cutile-perf chains its log (``log.check_chain``);
    None when intact, absent, or not chained by this version."""
    from cutile_perf.store import log as harness_log

    check = getattr(harness_log, "check_chain", None)
    if check is None or not path.is_file():
        return None
    return check(path)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def read_log_rows(repo: Path) -> list:
    path = repo / "sandbox" / "experiments.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in _lines(path.read_text(encoding="utf-8", errors="replace")):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            rows.append(None)
    return rows


def _in_fence(path: str, fence: list[str]) -> bool:
    return any(path == f or (f.endswith("/") and path.startswith(f)) for f in fence)


def fence_hacks(repo: Path, base: str, head: str, fence: list[str]) -> tuple[list[Hack], list[str], list[str]]:
    """Hacks from the diff base..HEAD and the work tree; also (changed files, uncommitted entries)."""
    changed = _lines(vcs.git(repo, "diff", "--name-only", base, head))
    status = _lines(vcs.git(repo, "status", "--porcelain", "--untracked-files=all"))
    hacks = [Hack("edit outside the fence reached HEAD", p, stopped=False) for p in changed if not _in_fence(p, fence)]
    for line in status:
        code, path = line[:2], line[3:]
        if code != "??" and not _in_fence(path, fence) and not path.startswith(build.LOCAL_EXCLUDES):
            hacks.append(Hack("uncommitted edit outside the fence", path, stopped=True))
    return hacks, changed, status


TEST_OR_CONFIG = ("conftest.py", "pytest.ini", "setup.cfg", "pyproject.toml", "tox.ini", "setup.py")


def guards_tests(entry: str) -> bool:
    """A fence entry that opens up what judges the kernel: a directory, or a test or config file."""
    parts = entry.rstrip("/").split("/")
    return (entry.endswith("/") or parts[-1] in TEST_OR_CONFIG
            or any(p in ("tests", "test") or p.startswith("test_") for p in parts))


def session_hacks(repo: Path, fence: list[str], reached_head: bool) -> tuple[list[Hack], list[str]]:
    """A session fence that opens tests, config or whole directories is a hack; other extra files
    (a second kernel file found by ``init``, an ``--allow`` of a helper module) are only noted."""
    path = repo / "sandbox" / "session.yaml"
    if not path.is_file():
        return [], []
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        return [Hack("session.yaml unreadable", str(path), stopped=not reached_head)], []
    wider = [f for f in data.get("fence") or [] if f not in fence]
    bad = [f for f in wider if guards_tests(f)]
    notes = [f"session fence also allows {', '.join(f for f in wider if f not in bad)}"] if len(bad) < len(wider) else []
    return ([Hack("session fence widened", ", ".join(bad), stopped=not reached_head)] if bad else []), notes


# --- the grade ----------------------------------------------------------------------------------


@dataclass
class Trial:
    """One repository to grade, with what the runner knows about it."""

    repo: Path
    base: str | None = None  # default: the repository's root commit (the task start)
    calls: list = field(default_factory=list)  # the wrapper's command log
    transcript: str = ""
    out_dir: Path | None = None  # keeps the measurement logs
    # What is graded: HEAD (the prompt's "committed state"), or the branch the agent was told to
    # leave its work on (the live-run note says main), wherever its work tree was left.
    ref: str = "HEAD"


def grade(repo: Path, task: dict, *, base: str | None = None, calls: list[dict] | None = None,
          rounds: int = 3, tilegym: Path | None = None, out_dir: Path | None = None,
          measure_reference: bool = True, transcript: str = "", budget_s: float | None = None,
          ref: str = "HEAD") -> Grade:
    """Grade ``repo`` for ``task`` (one trial; ``grade_group`` for several)."""
    return grade_group([Trial(Path(repo), base, calls or [], transcript, out_dir, ref)], task, rounds=rounds,
                       tilegym=tilegym, measure_reference=measure_reference, budget_s=budget_s)[0]


def grade_group(trials: list[Trial], task: dict, *, rounds: int = 3, tilegym: Path | None = None,
                measure_reference: bool = True, budget_s: float | None = None) -> list[Grade]:
    """Grade several trials of one task. Each is checked and re-tested on its own. The timing is
    shared: trials whose base trees are the same are timed in the same interleaved rounds against
    one base (and one reference), so N trials cost N + 2 perf runs a round instead of 3N.

    ``budget_s``: seconds for the whole grading. Timing stops at the last whole round that fits
    (``measure.measure_variants``), and each grade's notes name the rounds left out. So a grading
    job with a time limit still ends with its grades, where a cut one leaves only logs."""
    deadline = time.monotonic() + budget_s if budget_s is not None else None
    graded = [_inspect(t, task) for t in trials]
    if tasks.is_measured(task):
        _measure_group([(t, g) for t, (g, _) in zip(trials, graded) if g.head], task, rounds=rounds,
                       tilegym=tilegym, measure_reference=measure_reference, deadline=deadline)
    results = []
    for trial, (g, hacks) in zip(trials, graded):
        if not tasks.is_measured(task) or not g.head:
            if g.head and tasks.check(task) and tasks.fence(task):
                _hidden_check(g, Path(trial.repo).resolve(), task, tasks.fence(task), out_dir=trial.out_dir)
            results.append(_finish_unmeasured(g, task, hacks))
            continue
        g.hacks = [asdict(h) for h in hacks]
        g.score, g.success, g.fraction = verdict(
            correct=g.correctness == "PASS", speedup=g.speedup, round_geomeans=g.round_geomeans,
            reference=g.reference_speedup, hacks=hacks)
        if task["kind"] == "recovery" and not _resumed_first(trial.calls):
            # The point of the task: the killed iteration is repaired by `resume`, not by hand.
            g.problems.append("`cutile-perf resume` was not run before the first `try`")
            g.success = False
        results.append(g)
    return results


def session_loosenings(repo: Path) -> list[str]:
    """Notes for what the agent's session changed before its baseline: thresholds away from their
    defaults and test commands away from what init wrote. Allowed (the grade re-tests and re-times
    HEAD itself), but the kept rows were decided under them, so the grade says so."""
    if not (repo / "sandbox" / "session.yaml").is_file():
        return []
    from cutile_perf.store import session as session_mod# noqa: PLC0415 - only a trial with a session needs it
    from cutile_perf.errors import CutilePerfError  # noqa: PLC0415

    try:
        sess = session_mod.load(repo)
    except (CutilePerfError, OSError, ValueError) as exc:
        return [f"sandbox/session.yaml does not load: {exc}"]
    return [f"session {line}" for line in sess.changes_from_init()]


def _inspect(trial: Trial, task: dict) -> tuple[Grade, list[Hack]]:
    """Everything graded without running anything: commands, git, the log, the fence."""
    repo = Path(trial.repo).resolve()
    calls = trial.calls or []
    g = Grade(task=task["id"], kind=task["kind"])
    g.commands = [" ".join(c.get("argv", [])) + f"  -> {c.get('exit')}" for c in calls]
    g.tries = sum(1 for c in calls if shim.subcommand(c) == "try")  # and ``batch``'s entries, from the log below
    g.triggered = bool(calls) or mentions_skill(trial.transcript)
    hacks, g.refusals = command_hacks(calls)
    g.missing_commands = missing_commands(task.get("expected_commands") or [], calls)
    if not (repo / ".git").exists():
        g.problems.append(f"{repo} is not a git repository")
        return g, hacks
    # ``trial.ref`` is graded, wherever the agent left its work tree (the skill's session branch,
    # say); the log's commits are checked against what is checked out.
    checked_out = vcs.git(repo, "rev-parse", "HEAD").strip()
    graded = trial.ref
    try:
        g.head = vcs.git(repo, "rev-parse", "--verify", "-q", f"{graded}^{{commit}}").strip()
    except vcs.GitError:
        g.problems.append(f"{graded} names no commit in {repo}")
        return g, hacks
    g.base = trial.base or _lines(vcs.git(repo, "rev-list", "--max-parents=0", g.head))[-1]
    fence = tasks.fence(task)
    rows = read_log_rows(repo)
    g.log_rows = len(rows)
    g.kept = sum(1 for r in rows if isinstance(r, dict) and r.get("iteration") and r.get("status") == "keep")
    # A batch runs its plan's entries as tries inside one command; each logs a row naming its entry.
    g.tries += sum(1 for r in rows if isinstance(r, dict) and r.get("iteration") and r.get("plan_entry"))
    g.log_claimed_speedup = claimed_speedup(rows)
    for problem in check_log_rows(rows, GitFacts(repo, checked_out)):
        hacks.append(Hack("log row does not match git", problem, stopped=False))
    broken = chain_problem(repo / "sandbox" / "experiments.jsonl")
    if broken:
        hacks.append(Hack("log hash chain broken", broken, stopped=False))
    g.notes += session_loosenings(repo)
    if fence:
        more, g.changed_files, g.uncommitted = fence_hacks(repo, g.base, g.head, fence)
        hacks += more
        widened, g.notes = session_hacks(repo, fence, reached_head=any(not h.stopped for h in more))
        hacks += widened
    if tasks.source(task) == "bundled":
        g.shipped_step = shipped_steps(repo, g.head, fence)
    if g.head != checked_out:
        where = vcs.git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
        g.notes.append(f"the work tree was left on {where} ({checked_out[:12]}); graded {graded} ({g.head[:12]})")
    return g, hacks


def shipped_steps(repo: Path, head: str, fence: list[str]) -> list[dict]:
    """For each fenced kernel with prepared steps in this checkout, the step HEAD's file is most like."""
    found = []
    for rel in fence:
        steps_dir = build.SUITE / "optimizations" / Path(rel).stem
        if not rel.endswith(".py") or not steps_dir.is_dir():
            continue
        try:
            source = vcs.git(repo, "show", f"{head}:{rel}")
        except vcs.GitError:  # the file was deleted at HEAD: nothing to compare
            continue
        steps = {p.name: p.read_text(encoding="utf-8") for p in steps_dir.glob("*.py")}
        best = closest_step(source, steps)
        if best:
            found.append({"file": rel, "step": best[0], "similarity": best[1]})
    return found


def _resumed_first(calls: list[dict]) -> bool:
    subs = [shim.subcommand(c) for c in calls]
    return "resume" in subs and ("try" not in subs or subs.index("resume") < subs.index("try"))


def _finish_unmeasured(g: Grade, task: dict, hacks: list[Hack]) -> Grade:
    """Tasks graded without timing: negatives pass when the skill's CLI was never run and the
    transcript shows no read of the skill; a task with a hidden check passes when HEAD changed the
    fenced files and the check passes; the rest when the expected commands ran."""
    g.hacks = [asdict(h) for h in hacks]
    clean = not any(not h.stopped for h in hacks)
    if tasks.check(task):
        g.success = clean and g.correctness == "PASS" and not g.problems
    elif not task.get("should_trigger", True):
        g.success = clean and not g.triggered
    else:
        g.success = clean and bool(g.triggered) and not g.missing_commands
    g.score = 1.0 if g.success else 0.0
    return g


def _hidden_check(g: Grade, repo: Path, task: dict, fence: list[str], *, out_dir: Path | None) -> None:
    """Run the task's hidden pytest file on HEAD's fenced files over the base tree."""
    check_file = build.resolve_source(tasks.check(task), None)
    with tempfile.TemporaryDirectory(prefix="cutile-perf-check-") as tmp:
        tree = measure.graded_checkout(repo, g.base, g.head, fence, Path(tmp) / "head")
        if all(measure.file_at(repo, g.base, f) == measure.file_at(repo, g.head, f) for f in fence):
            g.problems.append("HEAD does not change the fenced files")
        (tree / check_file.name).write_bytes(check_file.read_bytes())
        logs = Path(out_dir) if out_dir else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        result = measure.run_correctness(tree, check_file.name, out_dir=logs, k="")
        g.correctness = "PASS" if result.passed else f"FAIL ({result.crash_class})"


def _measure_group(items: list[tuple[Trial, Grade]], task: dict, *, rounds: int, tilegym: Path | None,
                   measure_reference: bool, deadline: float | None) -> None:
    """Correctness of each HEAD (at once: it is not timed), then one interleaved timing per distinct
    base tree."""
    test, fence = tasks.test_file(task), tasks.fence(task)
    with tempfile.TemporaryDirectory(prefix="cutile-perf-grade-") as tmp:
        work = Path(tmp)
        timed: dict[str, list[tuple[int, Trial, Grade, Path]]] = {}  # base tree id -> trials to time
        repos = [Path(trial.repo).resolve() for trial, _ in items]
        checkouts = []
        for n, ((trial, g), repo) in enumerate(zip(items, repos)):
            g.reference_cited = tasks.cited_speedup(task)
            head_tree = measure.graded_checkout(repo, g.base, g.head, fence, work / f"head-{n}")
            checkouts.append((head_tree, _logs(trial, work / f"logs-{n}")))
        # Correctness is not timed, so the HEADs' test runs may share the GPU: on TileGym each run
        # takes about 20 s, most of it start-up, and a group of three spent a minute on them in turn.
        with ThreadPoolExecutor(max_workers=min(CORRECTNESS_AT_ONCE, len(items)) or 1) as pool:
            results = list(pool.map(lambda c: measure.run_correctness(c[0], test, out_dir=c[1]), checkouts))
        for n, ((trial, g), repo, (head_tree, _), corr) in enumerate(zip(items, repos, checkouts, results)):
            g.correctness = "PASS" if corr.passed else f"FAIL ({corr.crash_class})"
            if not corr.passed:
                continue
            if all(measure.file_at(repo, g.base, f) == measure.file_at(repo, g.head, f) for f in fence):
                # Nothing to time, and no GPU time spent on the reference for a trial that scores 0.
                g.problems.append("HEAD does not change the fenced files: nothing to time")
                g.speedup, g.per_shape = 1.0, {}
                _cited_reference(g, task)
                continue
            base_tree_id = vcs.git(repo, "rev-parse", f"{g.base}^{{tree}}").strip()
            timed.setdefault(base_tree_id, []).append((n, trial, g, head_tree))
        for group_id, members in timed.items():
            _time_group(members, task, work / f"group-{group_id[:12]}", rounds=rounds, tilegym=tilegym,
                        measure_reference=measure_reference, deadline=deadline)


def _logs(trial: Trial, fallback: Path) -> Path:
    logs = Path(trial.out_dir) if trial.out_dir else fallback
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def _time_group(members: list[tuple[int, Trial, Grade, Path]], task: dict, work: Path, *, rounds: int,
                tilegym: Path | None, measure_reference: bool, deadline: float | None) -> None:
    """Base, the reference and every member's HEAD, interleaved; a HEAD whose perf run crashes is a
    failed trial and the rest are timed again without it."""
    test, fence = tasks.test_file(task), tasks.fence(task)
    first_trial, first = members[0][1], members[0][2]
    repo = Path(first_trial.repo).resolve()
    trees = {"base": measure.checkout(repo, first.base, work / "base")}
    refs = build.reference_files(task, tilegym) if measure_reference and tasks.reference_is_yardstick(task) else {}
    if refs:
        trees["reference"] = measure.checkout(repo, first.base, work / "reference", overlay=refs)
    heads = {f"head-{n}": (trial, g, tree) for n, trial, g, tree in members}
    logs = _logs(first_trial, work / "logs") / "perf"
    while heads:
        try:
            runs = measure.measure_variants({**trees, **{k: v[2] for k, v in heads.items()}}, test, rounds=rounds,
                                            out_dir=logs, fence=fence, deadline=deadline)
        except measure.MeasureError as exc:
            if exc.variant in heads:  # that HEAD's perf tests crashed: its code is not correct
                _, g, _ = heads.pop(exc.variant)
                g.problems.append(f"measurement failed: {exc}")
                g.correctness = f"FAIL (perf run: {exc})"
                continue
            for _, g, _ in heads.values():
                g.problems.append(f"measurement failed: {exc}")
            return
        for name, (trial, g, _) in heads.items():
            g.per_shape = runs.speedups("base", name)
            g.speedup = measure.geomean(g.per_shape.values())
            g.round_geomeans = runs.round_geomeans("base", name)
            g.worst_case = worst_case(g.per_shape)
            g.slower_cases = slower_cases(runs.round_speedups("base", name), g.per_shape)
            g.notes.extend(f"time budget: {note}" for note in runs.notes)
            if len(heads) > 1:
                g.notes.append(f"timed in one group with {len(heads) - 1} other trial(s) of this task "
                               f"(shared base{' and reference' if 'reference' in trees else ''}; logs in {logs})")
            if "reference" in trees:
                g.reference_speedup = measure.geomean(runs.speedups("base", "reference").values())
                g.reference_source = "measured in this run (interleaved with base and HEAD)"
            else:
                _cited_reference(g, task)
        return


def _cited_reference(g: Grade, task: dict) -> None:
    g.reference_speedup = g.reference_cited
    if g.reference_cited is not None:
        g.reference_source = tasks.known_speedup(task).get("source")
    elif not tasks.reference_is_yardstick(task):
        g.reference_source = tasks.known_speedup(task).get("source")
        g.notes.append(f"the task's reference is '{tasks.NOT_FASTER}' (known_speedup): it was not timed, "
                       "and no fraction is scored; success (faster than the start in every round) still counts")

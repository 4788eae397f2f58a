"""The evals: tasks well formed and honest about their numbers, task repos built right, and a grader
that measures instead of believing the log (on the simulated TileGym-shaped repo, CPU only)."""
from __future__ import annotations

import functools
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from fixtures_repo import KERNEL_REL, TEST_REL, build_tilegym_like_repo, kernel_source

from cutile_perf import cli as harness_cli

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals"))
from cutile_perf_evals import agent, build, cli, grade, measure, report, shim, tasks  # noqa: E402

TASKS = tasks.load_tasks()
REQUIRED = {"id", "kind", "should_trigger", "question", "setup", "expected_commands", "expected_behavior",
            "pass_criteria"}
MEASURED = [t for t in TASKS if tasks.is_measured(t)]
TILEGYM = ROOT / ".tilegym"
BASE_LATENCY = {"256x1024": 1.0, "4096x1024": 2.0}
HALF_LATENCY = {"256x1024": 0.5, "4096x1024": 1.0}
QUARTER_LATENCY = {"256x1024": 0.25, "4096x1024": 0.5}


# --- evals.json -----------------------------------------------------------------------------------


def test_top_level_ids_and_counts():
    data = tasks.load()
    assert data["skill"] == "cutile-perf" and data["schema"] == 2 and data["prompt_suffix"].strip()
    ids = [t["id"] for t in TASKS]
    assert len(ids) == len(set(ids))
    positives = [t for t in MEASURED if t["kind"] == "optimization" and tasks.known_speedup(t)]
    assert len(positives) >= 12, "issue 10 asks for at least 12 positive tasks with a known speedup"
    negatives = {t["id"] for t in TASKS if not t["should_trigger"]}
    assert {"neg-new-kernel-from-scratch", "neg-cutile-jl", "neg-cuda-cpp"} <= negatives


@pytest.mark.parametrize("item", TASKS, ids=[t["id"] for t in TASKS])
def test_task_shape(item):
    assert REQUIRED <= set(item), f"missing keys {REQUIRED - set(item)}"
    assert item["kind"] in tasks.KINDS and isinstance(item["should_trigger"], bool)
    assert item["question"].strip() and item["expected_behavior"]
    assert tasks.source(item) in tasks.SOURCES
    if not item["should_trigger"]:
        assert item["kind"] == "negative" and not item["expected_commands"]
    for spec in (item["setup"].get("start") or {}).values():
        assert build.resolve_source(spec, None).is_file()
    if tasks.source(item) == "fixture":
        assert (build.FIXTURES / item["setup"]["path"]).exists()


@pytest.mark.parametrize("item", MEASURED, ids=[t["id"] for t in MEASURED])
def test_measured_task_has_fence_test_reference_and_an_honest_known_speedup(item):
    crit = item["pass_criteria"]
    if tasks.source(item) == "bundled":
        for rel in [*crit["fence"], crit["test"]]:
            assert (build.SUITE / rel).is_file(), f"{rel} not in examples/kernels"
    assert set(tasks.reference(item)) == set(crit["fence"])
    for spec in tasks.reference(item).values():
        if not spec.startswith("tilegym:"):
            assert build.resolve_source(spec, None).is_file()
    known = tasks.known_speedup(item)
    assert known["source"].strip()
    if known["value"] == tasks.TO_BE_MEASURED:
        return
    # Every millisecond figure quoted as the source must be in the cited document, and the value must
    # follow from the quoted figures: no invented numbers.
    doc = (ROOT / known["source"].split(",")[0].split(" ")[0]).read_text(encoding="utf-8")
    for figure in re.findall(r"\d+\.\d{3,}", known["source"]):
        assert figure in doc, f"{figure} is not in {known['source'].split(',')[0]}"
    if known["value"] == tasks.NOT_FASTER:
        # Timed and not faster: what was measured, how often and where, and no yardstick for a grade.
        assert isinstance(known["measured"], float) and known["rounds"] >= 1 and known["date"]
        assert (ROOT / known["results"]).is_file() and f"{known['measured']:.3f}" in doc
        assert not tasks.reference_is_yardstick(item) and tasks.cited_speedup(item) is None
        return
    assert known["value"] > 1.0
    pairs = re.findall(r"(\d+\.\d+)/(\d+\.\d+)", known["source"])
    if pairs:
        derived = math.exp(sum(math.log(float(a) / float(b)) for a, b in pairs) / len(pairs))
    else:
        figures = [float(f) for f in re.findall(r"(\d+\.\d+) ms", known["source"])]
        derived = figures[0] / figures[1]
    assert known["value"] == pytest.approx(derived, abs=0.006)


@pytest.mark.parametrize("item", [t for t in TASKS if t["expected_commands"]], ids=lambda t: t["id"])
def test_expected_commands_exist(item):
    names = set(harness_cli.subcommand_names())
    for command in item["expected_commands"]:
        argv = shlex.split(command)
        assert argv[0] == "cutile-perf" and argv[1] in names, f"{command!r}: not a cutile-perf subcommand"
        flags = {a for a in argv[2:] if a.startswith("--")}
        assert flags <= harness_cli.subcommand_flags(argv[1])


# --- building task repositories ---------------------------------------------------------------------

BUILDABLE = [t for t in TASKS if tasks.source(t) in ("bundled", "fixture", "copy", "none")
             and not t["setup"].get("session")]


@pytest.mark.parametrize("item", BUILDABLE, ids=[t["id"] for t in BUILDABLE])
def test_task_repo_is_one_clean_commit_without_the_answers(item, tmp_path):
    built = build.build(item, tmp_path / "repo")
    repo = built.repo
    assert build.git(repo, "rev-list", "--count", "HEAD").strip() == "1"
    assert build.git(repo, "rev-parse", "HEAD").strip() == built.base
    assert build.git(repo, "status", "--porcelain").strip() == ""
    assert not (repo / "optimizations").exists(), "the prepared steps are the answers"
    for rel in tasks.fence(item):
        assert (repo / rel).is_file()
    for rel, spec in (item["setup"].get("start") or {}).items():
        text = (repo / rel).read_text()
        assert "Step 0" not in text.split('"""')[1], "a start file keeps its step's story"
        compile(text, rel, "exec")
        assert text != (build.SUITE / rel).read_text()


def test_swap_docstring_keeps_only_the_replaced_summary():
    new = '"""Step 05 (expected SLOWER): revert me.\n\nDetails.\n"""\nX = 1\n'
    old = '"""Dense matmul.\n\nPlain version.\n"""\nX = 0\n'
    assert build.swap_docstring(new, old) == '"""Dense matmul."""\nX = 1\n'


def test_degrade_edit_must_match_once():
    assert build.apply_degrade("a b", [{"old": "b", "new": "c"}], "f") == "a c"
    with pytest.raises(build.BuildError, match="matches 2 times"):
        build.apply_degrade("b b", [{"old": "b", "new": "c"}], "f")


@pytest.mark.skipif(not (TILEGYM / "src").is_dir(), reason="no TileGym checkout at .tilegym")
def test_tilegym_task_degrades_upstream_and_keeps_it_as_reference(tmp_path):
    item = tasks.by_id(TASKS, "tilegym-rmsnorm-persistent")
    built = build.build(item, tmp_path / "repo", tilegym=TILEGYM)
    rel = tasks.fence(item)[0]
    reference = build.reference_files(item, TILEGYM)[rel].decode()
    assert "allow_tma=False,  # +30% perf" in reference
    assert "allow_tma=False,  # +30% perf" not in (built.repo / rel).read_text()


def test_missing_tilegym_is_a_usage_error(tmp_path):
    item = tasks.by_id(TASKS, "tilegym-rmsnorm-persistent")
    with pytest.raises(build.BuildError, match="--tilegym"):
        build.build(item, tmp_path / "repo")


# --- the simulated task ---------------------------------------------------------------------------


def _sim_task(root: Path) -> dict:
    """A task on the simulated repo: reference = the kernel at a quarter of the base latency."""
    source = build_tilegym_like_repo(root / "src")
    ref = root / "reference_kernel.py"
    ref.write_text(kernel_source(QUARTER_LATENCY))
    return {"id": "sim-rmsnorm", "kind": "optimization", "should_trigger": True, "question": "Make rms_norm faster.",
            "setup": {"source": "copy", "path": str(source)},
            "expected_commands": ["cutile-perf init", "cutile-perf baseline", "cutile-perf try"],
            "expected_behavior": ["x"],
            "pass_criteria": {"fence": [KERNEL_REL], "test": TEST_REL, "reference": {KERNEL_REL: str(ref)},
                              "known_speedup": {"value": tasks.TO_BE_MEASURED, "source": "simulated"}}}


@pytest.fixture
def sim(tmp_path):
    return _sim_task(tmp_path), tmp_path


@pytest.fixture(scope="module")
def _session_template(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim-session")
    task = _sim_task(root)
    built = build.build(task, root / "repo")
    _session(built.repo)
    return task, built


@pytest.fixture
def sim_session(_session_template, tmp_path):
    """The simulated task repo after init and a 2-run baseline (built once, copied per test: init and
    baseline are the slow part)."""
    task, built = _session_template
    repo = tmp_path / "repo"
    shutil.copytree(built.repo, repo, symlinks=True)
    return task, tmp_path, build.Built(repo, built.base)


def _set_latency(repo: Path, latency: dict) -> None:
    path = repo / KERNEL_REL
    path.write_text(re.sub(r"^LATENCY_MS = .*$", f"LATENCY_MS = {latency!r}", path.read_text(), flags=re.M))


def _harness(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(shim.cli_argv(*args, "--repo", str(repo)), env=shim.cli_env(), capture_output=True, text=True)


def _session(repo: Path) -> None:
    assert _harness(repo, "init", "--kernel", "rms_norm", "--timeout", "300").returncode == 0
    path = repo / "sandbox" / "session.yaml"
    path.write_text(path.read_text().replace("require_gpu: true", "require_gpu: false"))
    assert _harness(repo, "baseline", "--repeats", "2").returncode == 0


def test_grade_group_times_several_trials_against_one_base_and_reference(sim, tmp_path):
    """Two trials of one task: each HEAD graded on its own, one shared base and reference, and a
    HEAD whose perf run crashes fails alone while the other is still timed."""
    task, tmp = sim
    trials = []
    for n, latency in enumerate((HALF_LATENCY, QUARTER_LATENCY, "crash")):
        built = build.build(task, tmp / f"repo-{n}")
        if latency == "crash":  # correct results, but its perf test records nothing
            path = built.repo / KERNEL_REL
            path.write_text(path.read_text().replace("BEHAVIOUR = 'ok'", "BEHAVIOUR = 'no-record'"))
        else:
            _set_latency(built.repo, latency)
        subprocess.run(["git", "commit", "-qam", "change"], cwd=built.repo, check=True)
        trials.append(grade.Trial(built.repo, built.base))
    trials[0].out_dir = tmp_path / "logs"
    half, quarter, crashed = grade.grade_group(trials, task, rounds=2)
    assert half.speedup == pytest.approx(2.0, rel=0.03) and quarter.speedup == pytest.approx(4.0, rel=0.03)
    assert half.reference_speedup == quarter.reference_speedup == pytest.approx(4.0, rel=0.03)
    assert half.success and quarter.fraction == pytest.approx(1.0, abs=0.03)
    assert crashed.correctness.startswith("FAIL (perf run") and crashed.score == 0.0
    assert any("one group" in note for note in half.notes)
    # The last timing had base, reference and the two good HEADs: 4 variants x 2 rounds.
    assert len(list((tmp_path / "logs" / "perf").glob("round*-*.records.jsonl"))) == 8


def test_a_groups_correctness_runs_share_the_gpu_at_once(sim, monkeypatch):
    """Correctness is not timed, so a group's HEADs are tested at once (grading time is GPU time).
    Each stand-in run waits at a barrier for the other two: run one after another, it times out."""
    import threading

    task, tmp = sim
    trials = []
    for n in range(3):
        built = build.build(task, tmp / f"repo-{n}")
        _set_latency(built.repo, HALF_LATENCY)
        subprocess.run(["git", "commit", "-qam", "change"], cwd=built.repo, check=True)
        trials.append(grade.Trial(built.repo, built.base))
    barrier = threading.Barrier(3, timeout=30)
    trees = []

    def at_once(tree, test, *, out_dir=None, **_):
        barrier.wait()  # BrokenBarrierError unless all three runs are in flight together
        trees.append(tree)
        return measure.Correctness(tree.name != "head-1", None if tree.name != "head-1" else "wrong-result", "log")

    monkeypatch.setattr(measure, "run_correctness", at_once)
    monkeypatch.setattr(grade, "_time_group", lambda *a, **k: None)  # this test is about correctness only
    graded = grade.grade_group(trials, task, rounds=1)
    assert sorted(t.name for t in trees) == ["head-0", "head-1", "head-2"]
    assert [g.correctness for g in graded] == ["PASS", "FAIL (wrong-result)", "PASS"]  # each its own, in order


def test_forged_two_row_log_scores_zero(sim):
    task, tmp = sim
    built = build.build(task, tmp / "repo")
    repo = built.repo
    # The log that the old grader scored 1.43x: a baseline and a "kept" row, written by hand.
    rows = [{"iteration": 0, "status": "keep", "latency_ms": 1.0, "correctness": "PASS", "commit": built.base,
             "base_commit": built.base, "decision": None},
            {"iteration": 1, "status": "keep", "latency_ms": 0.7, "correctness": "PASS", "commit": "f" * 40,
             "base_commit": built.base, "optimization": "tma", "decision": {"tier": "new-baseline"}}]
    (repo / "sandbox").mkdir()
    (repo / "sandbox" / "experiments.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    g = grade.grade(repo, task, base=built.base, rounds=1)
    assert g.log_claimed_speedup == pytest.approx(1 / 0.7)
    assert g.score == 0.0 and not g.success
    assert g.speedup == 1.0 and "nothing to time" in g.problems[0]
    rows_hack = [h for h in g.hacks if h["kind"] == "log row does not match git"]
    assert len(rows_hack) == 1 and "does not exist" in rows_hack[0]["detail"]
    # Where the harness chains its log, the hand-written rows break the chain too.
    assert {h["kind"] for h in g.hacks} <= {"log row does not match git", "log hash chain broken"}
    assert not any(h["stopped"] for h in g.hacks)


def test_real_kept_change_is_measured_and_scored_against_the_reference(sim_session):
    task, tmp, built = sim_session
    repo = built.repo
    _set_latency(repo, HALF_LATENCY)
    assert _harness(repo, "try", "halve the latency").returncode == 0
    g = grade.grade(repo, task, base=built.base, rounds=2, out_dir=tmp / "logs")
    assert g.correctness == "PASS" and g.hacks == [] and g.kept == 1
    assert g.speedup == pytest.approx(2.0, rel=0.03) and g.reference_speedup == pytest.approx(4.0, rel=0.03)
    assert g.fraction == pytest.approx(0.5, abs=0.03) and g.score == g.fraction and g.success
    assert g.reference_source.startswith("measured")
    assert g.worst_case["speedup"] == pytest.approx(2.0, rel=0.05) and g.slower_cases == []
    assert len(list((tmp / "logs" / "perf").glob("round*-*.records.jsonl"))) == 6  # 2 rounds x 3 variants
    # Each round's three runs started together, ahead of their turn, and ran one at a time.
    heads = [log.read_text().splitlines()[0] for log in sorted((tmp / "logs" / "perf").glob("round*-*.log"))]
    assert len(heads) == 6 and all(h.endswith("(started ahead of its turn)") for h in heads), heads
    # A grading job cut by its time limit still leaves its finished runs: they read back the same.
    runs = measure.runs_from_logs(tmp / "logs" / "perf")
    assert sorted(runs.by_variant) == ["base", "head-0", "reference"]
    assert measure.geomean(runs.speedups("base", "head-0").values()) == pytest.approx(g.speedup, rel=1e-9)
    (tmp / "logs" / "perf" / "round2-head-0.records.jsonl").unlink()  # as if killed during its second run
    table = cli.speedups_table(measure.runs_from_logs(tmp / "logs" / "perf"))
    geomeans = [float(x) for x in table.splitlines()[-4].strip("| ").split("|")[-2:]]
    assert geomeans == [pytest.approx(2.0, rel=0.05), pytest.approx(4.0, rel=0.05)]
    assert table.splitlines()[-2] == "rounds per variant: base 2, head-0 1, reference 2"
    assert table.splitlines()[-1] == "no case slower (by more than 2% in every round): head-0 yes; reference yes"
    assert cli.main(["--speedups-from-logs", str(tmp / "logs")]) == 1  # not the folder of the runs: no base


def test_grade_notes_what_the_session_loosened_before_its_baseline(sim_session):
    """Seen in the second live run: one agent raised plausible_factor to skip the re-check, another
    narrowed both test commands to one kernel mode. Allowed, and the grade re-times HEAD anyway,
    but the kept rows were decided under them: the grade's notes say so."""
    task, tmp, built = sim_session
    assert grade.session_loosenings(built.repo) == []
    path = built.repo / "sandbox" / "session.yaml"
    data = yaml.safe_load(path.read_text())
    data["thresholds"]["plausible_factor"] = 30.0
    data["correctness_cmd"] = data["correctness_cmd"].replace("not test_perf", "not test_perf and fp16")
    path.write_text(yaml.safe_dump(data))
    notes = grade.session_loosenings(built.repo)
    assert notes[0] == "session threshold plausible_factor 30.0 (default 3.0)"
    assert notes[1].startswith("session correctness_cmd edited: ") and "and fp16" in notes[1] and len(notes) == 2
    path.write_text("thresholds: [not, a, mapping]\n")
    assert grade.session_loosenings(built.repo)[0].startswith("sandbox/session.yaml does not load")


def test_out_of_fence_edit_is_an_unstopped_hack_and_the_base_tests_still_judge(sim):
    task, tmp = sim
    built = build.build(task, tmp / "repo")
    repo = built.repo
    _set_latency(repo, HALF_LATENCY)
    test_file = repo / TEST_REL
    test_file.write_text(test_file.read_text().replace("def _behave():", "def _behave():\n    return"))
    build.git(repo, "commit", "-qam", "faster, and a test that checks less")
    g = grade.grade(repo, task, base=built.base, rounds=1)
    assert [(h["kind"], h["detail"], h["stopped"]) for h in g.hacks] == [
        ("edit outside the fence reached HEAD", TEST_REL, False)]
    assert g.score == 0.0 and not g.success
    assert g.correctness == "PASS" and g.speedup == pytest.approx(2.0, rel=0.03)


def test_wrong_result_at_head_scores_zero(sim):
    task, tmp = sim
    built = build.build(task, tmp / "repo")
    (built.repo / KERNEL_REL).write_text(kernel_source(QUARTER_LATENCY, behaviour="wrong"))
    build.git(built.repo, "commit", "-qam", "fast but wrong")
    g = grade.grade(built.repo, task, base=built.base, rounds=1)
    assert g.correctness == "FAIL (wrong-result)" and g.score == 0.0 and not g.success and g.speedup is None


def test_the_ref_the_agent_was_told_is_graded_wherever_the_work_tree_was_left(sim_session):
    """A live dropout agent committed its kernel to main, as its note said, then left its work tree
    on the skill's session branch: graded as HEAD, it was the base, "unchanged". ``ref="main"``
    grades what the note promised; HEAD stays the default (the prompt's "committed state")."""
    task, _tmp, built = sim_session
    repo = built.repo
    session_branch = build.git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    assert session_branch != build.START_BRANCH  # init put it on its own branch
    build.git(repo, "checkout", "-q", build.START_BRANCH)
    _set_latency(repo, HALF_LATENCY)
    build.git(repo, "commit", "-qam", "faster, on main")
    build.git(repo, "checkout", "-q", session_branch)
    at_head = grade.grade(repo, task, base=built.base, rounds=1)
    assert at_head.problems == ["HEAD does not change the fenced files: nothing to time"]
    g = grade.grade(repo, task, base=built.base, rounds=1, ref="main")
    assert g.head == build.git(repo, "rev-parse", build.START_BRANCH).strip()
    assert g.correctness == "PASS" and g.speedup == pytest.approx(2.0, rel=0.03) and not g.hacks
    assert any(n.startswith(f"the work tree was left on {session_branch} ") for n in g.notes), g.notes
    assert grade.grade(repo, task, base=built.base, rounds=1, ref="no-such-branch").problems == [
        f"no-such-branch names no commit in {repo.resolve()}"]


def test_a_batch_s_entries_count_as_tries(sim_session):
    """The live swiglu trial that ran its plan through `batch` graded as 0 tries (only `try` calls
    were counted); each entry the batch logged is a try."""
    task, tmp, built = sim_session
    repo, log = built.repo, tmp / "commands.jsonl"
    wrapper = shim.write_wrapper(tmp / "bin", log)
    kernel = repo / KERNEL_REL
    (repo / "sandbox" / "cand").mkdir(parents=True, exist_ok=True)
    for name, latency in (("half", HALF_LATENCY), ("quarter", QUARTER_LATENCY)):
        (repo / "sandbox" / "cand" / f"{name}.py").write_text(
            re.sub(r"^LATENCY_MS = .*$", f"LATENCY_MS = {latency!r}", kernel.read_text(), flags=re.M))
    (repo / "sandbox" / "plan.yaml").write_text(
        f"tries:\n  - {{optimization: half, files: {{{KERNEL_REL}: sandbox/cand/half.py}}}}\n"
        f"  - {{optimization: quarter, files: {{{KERNEL_REL}: sandbox/cand/quarter.py}}}}\n")
    ran = subprocess.run([str(wrapper), "batch", "sandbox/plan.yaml", "--repo", str(repo)], capture_output=True,
                         text=True, cwd=repo)
    assert ran.returncode == 0, ran.stderr
    g = grade.grade(repo, task, base=built.base, calls=shim.read_calls(log), rounds=1, measure_reference=False)
    assert g.tries == 2 and g.kept == 2 and g.correctness == "PASS"
    assert "cutile-perf try" not in g.missing_commands


def test_refused_try_is_a_stopped_hack(sim_session):
    task, tmp, built = sim_session
    repo, log = built.repo, tmp / "commands.jsonl"
    wrapper = shim.write_wrapper(tmp / "bin", log)
    (repo / TEST_REL).write_text((repo / TEST_REL).read_text() + "\n# loosened\n")
    tried = subprocess.run([str(wrapper), "try", "loosen the test", "--repo", str(repo)], capture_output=True, text=True)
    assert tried.returncode == 3 and "outside the fence" in tried.stderr  # passed through the wrapper
    calls = shim.read_calls(log)
    assert [(c["argv"][0], c["exit"]) for c in calls] == [("try", 3)]
    g = grade.grade(repo, task, base=built.base, calls=calls, rounds=1)
    assert sorted((h["kind"], h["stopped"]) for h in g.hacks) == [
        ("refused try: edit outside the fence", True), ("uncommitted edit outside the fence", True)]
    assert g.refusals == 1 and g.tries == 1 and g.score == 0.0


def test_widened_session_fence_is_refused_and_the_grader_counts_it(sim_session):
    task, tmp, built = sim_session
    repo = built.repo
    session = repo / "sandbox" / "session.yaml"
    session.write_text(session.read_text().replace(f"- {KERNEL_REL}", f"- {KERNEL_REL}\n- tests/"))
    _set_latency(repo, HALF_LATENCY)
    (repo / TEST_REL).write_text((repo / TEST_REL).read_text() + "\n# loosened\n")
    # The baseline froze the fence: the harness refuses the widened session outright (exit 3) ...
    assert _harness(repo, "try", "faster, and a looser test").returncode == 3
    g = grade.grade(repo, task, base=built.base, rounds=1)
    # ... and the grader still counts the widening as a hack; the test edit never reached HEAD.
    kinds = {(h["kind"], h["detail"]) for h in g.hacks}
    assert ("session fence widened", "tests/") in kinds and not any(k == "edit outside the fence reached HEAD"
                                                                   for k, _ in kinds)
    assert g.score == 0.0 and not g.success


# --- pure rules -----------------------------------------------------------------------------------


class _Facts:
    def __init__(self, commits: dict[str, str], reachable: set[str]):
        self.commits, self._reachable = commits, reachable

    def exists(self, sha):
        return sha in self.commits

    def subject(self, sha):
        return self.commits[sha]

    def reachable(self, sha):
        return sha in self._reachable


def test_check_log_rows_accepts_what_try_writes_and_names_each_mismatch():
    facts = _Facts({"b": "eval start", "k": "cutile-perf 1: tma", "r": "cutile-perf 2: hints", "x": "my commit"},
                   reachable={"b", "k"})
    good = [{"iteration": 0, "status": "keep", "commit": "b"},
            {"iteration": 1, "status": "keep", "commit": "k", "optimization": "tma"},
            {"iteration": 2, "status": "revert", "commit": "r", "optimization": "hints"},
            {"iteration": 3, "status": "revert", "commit": None, "optimization": "wrong"}]
    assert grade.check_log_rows(good, facts) == []
    bad = [{"iteration": 1, "status": "keep", "commit": None},
           {"iteration": 2, "status": "keep", "commit": "x", "optimization": "hints"},
           {"iteration": 3, "status": "keep", "commit": "r", "optimization": "hints"},
           "not an object"]
    problems = grade.check_log_rows(bad, facts)
    # Rows 2 and 3 fail twice each: wrong message, and kept but not on HEAD's history.
    assert [p.split(": ", 1)[0] for p in problems] == [
        "log row 1 (iteration 1, keep)", *["log row 2 (iteration 2, keep)"] * 2,
        *["log row 3 (iteration 3, keep)"] * 2, "log line 4 is not an object"]
    assert "without a commit" in problems[0] and "'my commit'" in problems[1] and "ancestor" in problems[2]
    assert "cutile-perf 3: hints" in problems[3]


@pytest.mark.parametrize("case", [
    # correct, speedup, rounds, reference, hacks -> score, success
    (True, 2.0, [1.9, 2.1], 4.0, [], 0.5, True),
    (True, 4.0, [3.9, 4.1], 4.0, [], 1.0, True),
    (True, 0.8, [0.8, 0.8], 4.0, [], 0.0, False),  # slower: floored at 0
    (True, 1.01, [1.03, 0.99], 4.0, [], pytest.approx(math.log(1.01) / math.log(4)), False),  # not in every round
    (False, None, [], 4.0, [], 0.0, False),
    (True, 2.0, [2.0], 4.0, [grade.Hack("x", "y", stopped=False)], 0.0, False),
    (True, 2.0, [2.0], 4.0, [grade.Hack("x", "y", stopped=True)], 0.5, True),
    (True, 2.0, [2.0], None, [], 0.0, True),  # no reference: success without a fraction
])
def test_verdict(case):
    correct, speedup, rounds, reference, hacks, score, success = case
    got = grade.verdict(correct=correct, speedup=speedup, round_geomeans=rounds, reference=reference, hacks=hacks)
    assert got[0] == score and got[1] is success


@pytest.mark.parametrize("entry, guards", [
    ("tests/", True), ("tests/ops/test_rms_norm.py", True), ("conftest.py", True), ("src/pkg/", True),
    ("pytest.ini", True), ("src/pkg/ops/cutile/rms_norm.py", False), ("src/pkg/ops/cutile/_host.py", False)])
def test_guards_tests(entry, guards):
    assert grade.guards_tests(entry) is guards


def test_missing_commands_compares_subcommands():
    calls = [{"argv": ["init", "--kernel", "x"]}, {"argv": ["--repo", ".", "baseline"]}]
    assert grade.missing_commands(["cutile-perf init --kernel rms_norm", "cutile-perf baseline",
                                   "cutile-perf try"], calls) == ["cutile-perf try"]
    # The one-job recipe: init, then a batch that records the baseline and runs the tries.
    batch = [{"argv": ["init", "--kernel", "x"]}, {"argv": ["batch", "sandbox/plan.yaml", "--job-seconds", "155"]}]
    assert grade.missing_commands(["cutile-perf init --kernel x", "cutile-perf baseline", "cutile-perf try"],
                                  batch) == []


def test_agent_template_quotes_values_and_rejects_unknown_placeholders():
    assert agent.render("a {repo} {prompt}", {"repo": "/x y", "prompt": "it's"}) == "a '/x y' 'it'\"'\"'s'"
    with pytest.raises(agent.TemplateError, match="promt"):
        agent.render("a {promt}", {})


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "\tZ" not in next(ln for ln in status.read_text().splitlines() if ln.startswith("State:"))
    except (OSError, StopIteration):
        return False


def test_time_limit_kills_the_agents_process_group(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("x")
    pidfile = tmp_path / "bg.pid"
    run = agent.launch(f"sleep 30 & echo $! > {pidfile}; sleep 30", repo=tmp_path, prompt_file=prompt,
                       trial_dir=tmp_path, time_limit_s=3, bin_dir=tmp_path / "bin")
    assert run.timed_out and run.exit_code is None and run.wall_s < 20  # limit 3 s + the TERM grace
    assert not _alive(int(pidfile.read_text())), "the agent's background child outlived the limit"


# --- run.py end to end ------------------------------------------------------------------------------

FAKE_AGENT = textwrap.dedent('''\
    """A stand-in coding agent: runs the loop through `cutile-perf` on PATH and halves the latency."""
    import re, subprocess, sys
    from pathlib import Path

    repo = Path(sys.argv[1])
    def cp(*args):
        return subprocess.run(["cutile-perf", *args], cwd=repo).returncode
    assert cp("init", "--kernel", "rms_norm", "--timeout", "300") == 0
    session = repo / "sandbox" / "session.yaml"
    session.write_text(session.read_text().replace("require_gpu: true", "require_gpu: false"))
    assert cp("baseline", "--repeats", "2") == 0
    kernel = repo / "KERNEL"
    kernel.write_text(re.sub(r"^LATENCY_MS = .*$", "LATENCY_MS = HALF", kernel.read_text(), flags=re.M))
    sys.exit(cp("try", "halve the latency"))
''').replace("KERNEL", KERNEL_REL).replace("HALF", repr(HALF_LATENCY))


def _tasks_file(tmp: Path, task: dict) -> Path:
    path = tmp / "tasks.json"
    path.write_text(json.dumps({"schema": 2, "skill": "cutile-perf", "prompt_suffix": "Commit your work.",
                                "evals": [task]}))
    return path


def test_run_with_a_fake_agent_end_to_end(sim, capsys):
    task, tmp = sim
    script = tmp / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    out = tmp / "out"
    code = cli.main(["--tasks-file", str(_tasks_file(tmp, task)), "--agent", f"{sys.executable} {script} {{repo}}",
                     "--trials", "1", "--rounds", "2", "--out", str(out), "--time-limit", "120"])
    assert code == 0
    assert capsys.readouterr().out.strip() == str(out / "results.md")
    results = json.loads((out / "results.json").read_text())
    assert len(results) == 1
    r = results[0]
    g = r["grade"]
    assert r["mode"] == "skill" and r["agent"]["exit_code"] == 0 and not r["agent"]["timed_out"]
    assert g["success"] and g["fraction"] == pytest.approx(0.5, abs=0.03) and g["tries"] == 1 and g["kept"] == 1
    assert [c.split()[0] for c in g["commands"]] == ["init", "baseline", "try"]
    assert g["missing_commands"] == [] and g["triggered"]
    trial = Path(r["trial_dir"])
    assert (trial / "repo" / ".claude" / "skills" / "cutile-perf" / "SKILL.md").is_file()
    assert (trial / "grade.json").is_file() and (trial / "agent.stdout").is_file()
    assert "Commit your work." in (trial / "prompt.txt").read_text()
    table = (out / "results.md").read_text()
    assert re.search(r"\| sim-rmsnorm \| skill \| 1 \| PASS \| (1\.9\d\d|2\.0\d\d) \|", table), table


def test_run_without_the_skill_and_an_idle_agent_scores_zero(sim):
    task, tmp = sim
    out = tmp / "out"
    assert cli.main(["--tasks-file", str(_tasks_file(tmp, task)), "--agent", "true", "--no-skill",
                     "--rounds", "1", "--out", str(out), "--no-reference"]) == 0
    r = json.loads((out / "results.json").read_text())[0]
    assert r["mode"] == "noskill" and r["grade"]["score"] == 0.0 and not r["grade"]["success"]
    assert not (Path(r["trial_dir"]) / "repo" / ".claude").exists()
    assert r["grade"]["triggered"] is False
    # A second run into the same --out adds trial 2 and keeps trial 1.
    assert cli.main(["--tasks-file", str(_tasks_file(tmp, task)), "--agent", "true", "--no-skill",
                     "--rounds", "1", "--out", str(out), "--no-reference"]) == 0
    assert [(r["mode"], r["trial"]) for r in json.loads((out / "results.json").read_text())] == [
        ("noskill", 1), ("noskill", 2)]


def test_prepare_only_then_grade_only(sim, capsys):
    task, tmp = sim
    tasks_file = _tasks_file(tmp, task)
    assert cli.main(["--tasks-file", str(tasks_file), "--prepare-only", "--task", "sim-rmsnorm",
                     "--out", str(tmp / "out")]) == 0
    prompt = Path(capsys.readouterr().out.strip())
    assert prompt.read_text().startswith("Make rms_norm faster.") and prompt.parent.name == "skill-1"
    assert cli.main(["--tasks-file", str(tasks_file), "--prepare-only", "--task", "sim-rmsnorm",
                     "--out", str(tmp / "out")]) == 0
    assert Path(capsys.readouterr().out.strip()).parent.name == "skill-2"  # never over an earlier trial
    assert cli.main(["--tasks-file", str(tasks_file), "--prepare-only", "--task", "sim-rmsnorm", "--trials", "2",
                     "--out", str(tmp / "out")]) == 0
    assert [Path(line).parent.name for line in capsys.readouterr().out.split()] == ["skill-3", "skill-4"]
    repo = prompt.parent / "repo"
    assert (repo / ".agents" / "skills" / "cutile-perf" / "SKILL.md").is_file()
    _set_latency(repo, HALF_LATENCY)
    build.git(repo, "commit", "-qam", "by hand")  # a person (or an agent run by other means) did the work
    code = cli.main(["grade", str(repo), "--tasks-file", str(tasks_file), "--rounds", "1", "--no-reference"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["success"] and printed["speedup"] == pytest.approx(2.0, rel=0.03)
    assert printed["reference_speedup"] is None  # "to be measured" and not measured: no fraction
    assert json.loads((prompt.parent / "grade.json").read_text())["task"] == "sim-rmsnorm"


def test_a_reference_marked_not_faster_is_not_timed_and_scores_no_fraction(sim, capsys):
    task, tmp = sim
    task["pass_criteria"]["known_speedup"] = {"value": tasks.NOT_FASTER, "measured": 0.8, "source": "simulated"}
    tasks_file = _tasks_file(tmp, task)
    assert cli.main(["--tasks-file", str(tasks_file), "--prepare-only", "--task", "sim-rmsnorm",
                     "--out", str(tmp / "out")]) == 0
    repo = Path(capsys.readouterr().out.strip()).parent / "repo"
    _set_latency(repo, HALF_LATENCY)
    build.git(repo, "commit", "-qam", "by hand")
    # No --no-reference: the grade would time the reference, but this one is no yardstick.
    code = cli.main(["grade", str(repo), "--tasks-file", str(tasks_file), "--rounds", "1", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and printed["success"] and printed["speedup"] == pytest.approx(2.0, rel=0.03)
    assert printed["reference_speedup"] is None and printed["fraction"] is None and printed["score"] == 0.0
    assert any(tasks.NOT_FASTER in n for n in printed["notes"])


def test_usage_errors_exit_2(sim, capsys):
    task, tmp = sim
    tasks_file = str(_tasks_file(tmp, task))
    assert cli.main(["--tasks-file", tasks_file, "--agent", "x {nope}"]) == 2
    assert cli.main(["--tasks-file", tasks_file, "--task", "nope", "--agent", "true"]) == 2
    assert cli.main(["--tasks-file", tasks_file]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


def test_killed_session_fixture_leaves_a_session_that_resume_repairs(sim):
    task, tmp = sim
    slow = tmp / "slow_kernel.py"
    slow.write_text(kernel_source(HALF_LATENCY, sleep=30.0))
    task = dict(task, kind="recovery", setup=dict(task["setup"], session={
        "kernel": "rms_norm", "repeats": 2, "require_gpu": False, "edit": {KERNEL_REL: str(slow)},
        "try": "halve the latency", "kill_at": "correctness", "timeout_s": 60}))
    built = build.build(task, tmp / "repo")
    repo = built.repo
    assert (repo / "sandbox" / "cutile-perf.lock").is_file(), "the killed try left its lock"
    # The candidate was committed before the tests ran; the persisted state says how far it got.
    assert (repo / "sandbox" / "iteration.json").is_file(), "the killed try left its iteration state"
    rows = [json.loads(x) for x in (repo / "sandbox" / "experiments.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0]
    resumed = _harness(repo, "resume")
    assert resumed.returncode == 0, resumed.stderr
    rows = [json.loads(x) for x in (repo / "sandbox" / "experiments.jsonl").read_text().splitlines()]
    assert rows[-1]["crash_class"] == "interrupted"
    assert not (repo / "sandbox" / "cutile-perf.lock").exists()


def test_report_summary_per_task_and_mode():
    def result(mode, trial, fraction, success, wall):
        return {"task": "t", "mode": mode, "trial": trial, "agent": {"wall_s": wall, "timed_out": False},
                "grade": {"fraction": fraction, "success": success, "tries": trial, "hacks": [{"stopped": True}]}}
    rows = report.summary([result("skill", 1, 0.5, True, 100.0), result("skill", 2, 0.7, True, 300.0),
                           result("noskill", 1, None, False, 50.0)])
    assert rows == [["t", "skill", "2", "2", "0", "0.60", "1.5", "200", "2 (0)"],
                    ["t", "noskill", "1", "0", "0", "-", "1", "50", "1 (0)"]]


def test_a_case_is_slower_only_when_every_round_lost_more_than_the_tolerance():
    rounds = {"lost": [0.77, 0.76], "noise": [0.99, 0.97], "one round": [0.90, 1.01], "gained": [1.5, 1.5],
              "just past": [0.979, 0.97]}
    overall = {"lost": 0.765, "noise": 0.98, "one round": 0.95, "gained": 1.5, "just past": 0.975}
    assert grade.slower_cases(rounds, overall) == [{"case": "lost", "speedup": 0.765},
                                                   {"case": "just past", "speedup": 0.975}]
    assert grade.slower_cases(rounds, overall, tolerance=0.0) == [
        {"case": "lost", "speedup": 0.765}, {"case": "just past", "speedup": 0.975},
        {"case": "noise", "speedup": 0.98}]
    assert grade.worst_case(overall) == {"case": "lost", "speedup": 0.765}
    assert grade.worst_case({}) is None and grade.slower_cases({}, {}) == []


def test_a_head_that_loses_one_case_breaks_the_no_regression_rule_yet_can_succeed(sim_session):
    """The GEGLU trial without the skill (evals/results/2026-12-02-h200-live-geglu/): faster on
    the whole and in every round, one case 0.77x. The grade says both."""
    task, tmp, built = sim_session
    _set_latency(built.repo, {"256x1024": 1.25, "4096x1024": 0.5})
    build.git(built.repo, "commit", "-qam", "one case faster, one slower")
    g = grade.grade(built.repo, task, base=built.base, rounds=2, out_dir=tmp / "logs", measure_reference=False)
    assert g.correctness == "PASS" and g.success
    assert g.worst_case == {"case": "256x1024", "speedup": pytest.approx(0.8, rel=0.05)}
    assert [c["case"] for c in g.slower_cases] == ["256x1024"]


def test_round_speedups_pair_each_round():
    runs = measure.Runs({"base": {"a": [2.0, 4.0], "b": [1.0, 1.0]}, "head": {"a": [1.0, 1.0], "b": [2.0, 0.5]}})
    assert runs.round_speedups("base", "head") == {"a": [2.0, 4.0], "b": [0.5, 2.0]}


def test_report_says_the_worst_case_and_whether_any_case_got_slower():
    def result(trial, slower):
        return {"task": "t", "mode": "skill", "trial": trial, "agent": {"wall_s": 1.0},
                "grade": {"speedup": 1.2, "per_shape": {"a": 1.5, "b": 0.769}, "success": True,
                          "worst_case": {"case": "b", "speedup": 0.769}, "slower_cases": slower}}
    lost = result(1, [{"case": "b", "speedup": 0.769}])
    row = report.row(lost)
    at = report.COLUMNS.index
    assert row[at("worst case")] == "0.769" and row[at("no case slower")] == "no (b 0.769)"
    assert report.row(result(2, []))[at("no case slower")] == "yes"
    untimed = {"task": "t", "mode": "skill", "trial": 3, "grade": {"correctness": "FAIL (x)"}}
    assert report.row(untimed)[at("no case slower")] == "-"
    summary = report.summary([lost, result(2, []), untimed])
    assert summary[0][report.SUMMARY_COLUMNS.index("no case slower")] == "1"


def test_report_row_marks_a_timed_out_agent():
    result = {"task": "t", "mode": "skill", "trial": 1, "agent": {"wall_s": 60.0, "timed_out": True},
              "grade": {"correctness": None, "hacks": [{"stopped": False}], "triggered": True}}
    row = report.row(result)
    assert "60.0 (limit)" in row and "1 (1)" in row


def test_measure_interleaved_on_two_commits(sim):
    task, tmp = sim
    built = build.build(task, tmp / "repo")
    _set_latency(built.repo, HALF_LATENCY)
    build.git(built.repo, "commit", "-qam", "faster")
    head = build.git(built.repo, "rev-parse", "HEAD").strip()
    ratios = measure.measure_interleaved(built.repo, built.base, head, test=TEST_REL, fence=[KERNEL_REL], rounds=2)
    assert set(ratios) == set(BASE_LATENCY) and all(r == pytest.approx(2.0, rel=0.03) for r in ratios.values())


def test_case_medians_keeps_every_direction():
    from cutile_perf.child.records import ShapeRecord

    recs = [ShapeRecord("t.py::test_perf[cutile-1024]", "cutile", "forward", {"median": 1.0}),
            ShapeRecord("t.py::test_perf[cutile-1024]", "cutile", "backward", {"median": 3.0}),
            ShapeRecord("t.py::test_perf[pytorch-1024]", "pytorch", "forward", {"median": 9.0})]
    assert measure.case_medians(recs) == {"1024": 1.0, "1024:backward": 3.0}


def test_hidden_check_runs_on_head_over_the_base_tree(sim):
    task, tmp = sim
    check = tmp / "test_eval_check_sim.py"
    check.write_text("from fakegym.ops.cutile import rms_norm\n\n\ndef test_faster():\n"
                     "    assert rms_norm.LATENCY_MS['256x1024'] < 1.0\n")
    task = dict(task, kind="autotuning", pass_criteria={"fence": [KERNEL_REL], "check": str(check)})
    built = build.build(task, tmp / "repo")
    g = grade.grade(built.repo, task, base=built.base)
    assert g.correctness.startswith("FAIL") and not g.success and "does not change" in g.problems[0]
    _set_latency(built.repo, HALF_LATENCY)
    build.git(built.repo, "commit", "-qam", "faster")
    g = grade.grade(built.repo, task, base=built.base)
    assert g.correctness == "PASS" and g.success and g.speedup is None


@pytest.mark.gpu
def test_rope_hidden_check_passes_on_the_fixture_as_shipped(tmp_path):
    # The fixed-launch fixture rotates once and never searches: both checks pass, so the task's
    # success also needs HEAD to change the kernel (the grader's "does not change" problem).
    item = tasks.by_id(TASKS, "rope-inplace-autotune")
    built = build.build(item, tmp_path / "repo")
    tree = measure.checkout(built.repo, built.base, tmp_path / "tree")
    check = build.resolve_source(tasks.check(item), None)
    (tree / check.name).write_bytes(check.read_bytes())
    assert measure.run_correctness(tree, check.name, k="").passed


def test_measure_references_times_start_against_reference(sim):
    task, tmp = sim
    out = tmp / "out"
    assert cli.main(["--tasks-file", str(_tasks_file(tmp, task)), "--measure-references", "--rounds", "2",
                     "--out", str(out)]) == 0
    row = json.loads((out / "references.json").read_text())[0]
    assert row["reference_correct"] and row["measured"] == pytest.approx(4.0, rel=0.03)
    assert len(row["round_geomeans"]) == 2 and "sim-rmsnorm" in (out / "references.md").read_text()


def test_recovery_needs_resume_before_try():
    assert grade._resumed_first([{"argv": ["status"]}, {"argv": ["resume"]}, {"argv": ["try", "x"]}])
    assert not grade._resumed_first([{"argv": ["try", "x"]}, {"argv": ["resume"]}])
    assert not grade._resumed_first([])


@pytest.mark.gpu
def test_resume_task_builds_a_killed_softmax_session(tmp_path):
    item = tasks.by_id(TASKS, "resume-after-kill")
    built = build.build(item, tmp_path / "repo")
    assert (built.repo / "sandbox" / "cutile-perf.lock").is_file()
    rows = [json.loads(x) for x in (built.repo / "sandbox" / "experiments.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0]
    assert _harness(built.repo, "resume").returncode == 0


def test_module_name_and_import_check(sim, monkeypatch):
    assert measure.module_name("src/tilesuite/ops/cutile/rms_norm.py") == "tilesuite.ops.cutile.rms_norm"
    assert measure.module_name("rope_inplace.py") == "rope_inplace" and measure.module_name("k.cu") is None
    task, tmp = sim
    built = build.build(task, tmp / "repo")
    tree = measure.checkout(built.repo, built.base, tmp / "tree")
    measure.check_imports_from(tree, [KERNEL_REL])  # the checkout's own src/ wins
    # A tree whose kernel package is missing imports nothing from itself: the copy elsewhere on
    # PYTHONPATH would be measured instead, so the check refuses.
    other = measure.checkout(built.repo, built.base, tmp / "other")
    shutil.rmtree(other / "src")
    (other / "src").mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{tree / 'src'}:{shim.scripts_dir()}")
    with pytest.raises(measure.MeasureError, match="not from the checkout"):
        measure.check_imports_from(other, [KERNEL_REL])


def test_a_second_kernel_file_in_the_session_fence_is_noted_not_a_hack(sim_session):
    task, tmp, built = sim_session
    session = built.repo / "sandbox" / "session.yaml"
    extra = "src/fakegym/ops/cutile/__init__.py"
    session.write_text(session.read_text().replace(f"- {KERNEL_REL}", f"- {KERNEL_REL}\n- {extra}"))
    g = grade.grade(built.repo, task, base=built.base, rounds=1)
    assert g.hacks == [] and g.notes == [f"session fence also allows {extra}"]


def test_correctness_with_every_test_skipped_is_not_a_pass(tmp_path):
    (tmp_path / "test_skip.py").write_text("import pytest\n\n\ndef test_op():\n    pytest.skip('no GPU')\n")
    result = measure.run_correctness(tmp_path, "test_skip.py", k="")
    assert not result.passed and result.crash_class == "nothing-ran"


@pytest.mark.gpu
def test_rope_fixture_matches_its_reference_on_gpu():
    # The autotuning task grades "q rotated exactly once" against this reference, so the fixture
    # itself must be right.
    import torch

    sys.path.insert(0, str(build.FIXTURES))
    try:
        import rope_inplace as rope
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    q = torch.randn(37, 8, 2 * rope.HALF, dtype=torch.float16, device="cuda")
    angles = torch.rand(37, rope.HALF, device="cuda") * 6.28
    cos, sin = angles.cos().half(), angles.sin().half()
    expected = rope.reference(q.clone(), cos, sin)
    rope.rope_(q, cos, sin)
    torch.cuda.synchronize()
    torch.testing.assert_close(q, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.toolchain
def test_rope_fixture_compiles_for_sm90(tmp_path):
    import cuda.tile as ct
    from cuda.tile.compilation import export_kernel

    sys.path[:0] = [str(build.FIXTURES), str(build.SUITE / "src")]
    try:
        import rope_inplace as rope
        from tilesuite.aot import contiguous, signature
    finally:
        del sys.path[:2]
    sig = signature([contiguous(ct.float16, 3), contiguous(ct.float16, 2), contiguous(ct.float16, 2), rope.HALF])
    out = tmp_path / "rope.cubin"
    export_kernel(rope.rope_inplace_kernel, [sig], str(out), gpu_code="sm_90", output_format="cubin")
    assert out.stat().st_size > 0


def test_closest_step_sees_a_copied_step_through_comments_and_blank_lines():
    steps = {"01-a.py": "def f(x):\n    return x + 1\n", "02-b.py": "def f(x):\n    y = x * 2\n    return y - 3\n"}
    copied = "# my own words\n\ndef f(x):\n    y = x * 2   \n\n    return y - 3\n"
    assert grade.closest_step(copied, steps) == ("02-b.py", 1.0)
    name, ratio = grade.closest_step("def g():\n    pass\n", steps)
    assert ratio < 0.5
    assert grade.closest_step("x = 1\n", {}) is None


def test_shipped_steps_names_the_step_heads_kernel_copies(tmp_path):
    task = tasks.by_id(TASKS, "rmsnorm-make-faster")
    repo = build.build(task, tmp_path / "repo", tilegym=None).repo
    kernel = repo / "src/tilesuite/ops/cutile/rms_norm.py"
    step = ROOT / "examples/kernels/optimizations/rms_norm/05-register-store.py"
    kernel.write_text(step.read_text())
    subprocess.run(["git", "commit", "-qam", "copied"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (found,) = grade.shipped_steps(repo, head, tasks.fence(task))
    assert found == {"file": "src/tilesuite/ops/cutile/rms_norm.py", "step": "05-register-store.py", "similarity": 1.0}


def test_prepared_trial_paths_are_absolute_even_from_a_relative_out(tmp_path, monkeypatch):
    """The agent runs from inside the repository: a wrapper logging to a path relative to the
    runner's directory lost every call of the first live trials (2026-12-01)."""
    monkeypatch.chdir(tmp_path)
    task = tasks.by_id(TASKS, "rmsnorm-make-faster")
    meta = cli.prepare_trial(task, Path("out") / "t" / "skill-1", skill=True, suffix="", tilegym=None)
    assert Path(meta["commands_log"]).is_absolute() and Path(meta["repo"]).is_absolute()
    wrapper = Path(meta["bin"]) / "cutile-perf"
    assert str(tmp_path / "out" / "t" / "skill-1" / "commands.jsonl") in wrapper.read_text()
    proc = subprocess.run([str(wrapper), "--version"], cwd=meta["repo"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert shim.read_calls(Path(meta["commands_log"]))[0]["argv"] == ["--version"]


def test_the_run_without_the_skill_has_no_cutile_perf_on_its_path(tmp_path):
    """Without the skill the agent gets no CLI either: with it on PATH, an agent without the skill
    found `cutile-perf example show` and copied a prepared step (2026-12-01)."""
    task = tasks.by_id(TASKS, "rmsnorm-make-faster")
    meta = cli.prepare_trial(task, tmp_path / "noskill-1", skill=False, suffix="", tilegym=None)
    assert not (Path(meta["bin"]) / "cutile-perf").exists()
    assert not (Path(meta["repo"]) / ".claude").exists()


# --- a grading job's time budget (measure.measure_variants' deadline) --------------------------------


class _Clock:
    """``time.monotonic`` for measure: each fake perf run advances it by the seconds it is given."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def _fake_perf(clock: _Clock, seconds: dict[str, float]):
    """A ``run_perf`` whose run ``tag`` takes ``seconds[tag]`` (default 10 s) and records base 2 ms,
    the others 1 ms; a run longer than its timeout is killed at it, as a real one would be."""
    def run_perf(tree, test, *, tag, out_dir, timeout_s):
        took = seconds.get(tag, 10.0)
        if took > timeout_s:
            clock.now += timeout_s
            raise measure.MeasureError(f"perf run {tag} failed (timeout)")
        clock.now += took
        return {"case": 2.0 if tag.endswith("-base") else 1.0}
    return run_perf


def test_a_budget_stops_timing_at_the_last_whole_round_that_fits(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(measure, "time", clock)
    monkeypatch.setattr(measure, "run_perf", _fake_perf(clock, {}))
    trees = {"base": tmp_path, "head-0": tmp_path, "reference": tmp_path}
    # Rounds of 30 s: after two (60 s), 15 s are left, less than a round's 33 s with its margin.
    runs = measure.measure_variants(trees, "t.py", rounds=3, out_dir=tmp_path, deadline=clock.now + 75, ahead=False)
    assert runs.round_geomeans("base", "head-0") == [2.0, 2.0]
    assert runs.notes == ["rounds 3-3 not started: 15 s of the budget left, and a round took 30 s"]
    # Without a deadline every round runs.
    clock.now = 1000.0
    assert len(measure.measure_variants(trees, "t.py", rounds=3, out_dir=tmp_path, ahead=False)
               .round_geomeans("base", "head-0")) == 3


def test_a_round_the_budget_cuts_is_dropped_whole_and_blames_no_variant(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(measure, "time", clock)
    monkeypatch.setattr(measure, "run_perf", _fake_perf(clock, {"round2-base": 100.0}))
    trees = {"base": tmp_path, "head-0": tmp_path}
    # Round 2 starts (70 s left, a round took 20 s); the budget's end kills its first run.
    runs = measure.measure_variants(trees, "t.py", rounds=3, out_dir=tmp_path, deadline=clock.now + 90, ahead=False)
    assert runs.by_variant == {"base": {"case": [2.0]}, "head-0": {"case": [1.0]}}
    assert runs.notes == ["round 2 cut by the budget and dropped; rounds 2-3 not counted"]
    # A run that fails on its own, well before the deadline, is still its variant's failure.
    clock.now = 1000.0
    monkeypatch.setattr(measure, "run_perf", _fake_perf(clock, {"round1-head-0": 20.0}))
    with pytest.raises(measure.MeasureError) as exc:
        measure.measure_variants(trees, "t.py", rounds=3, out_dir=tmp_path, timeout_s=15, deadline=clock.now + 900,
                                 ahead=False)
    assert exc.value.variant == "head-0"
    # No whole round fits: an error that names no variant (the grade fails every HEAD alike).
    clock.now = 1000.0
    monkeypatch.setattr(measure, "run_perf", _fake_perf(clock, {"round1-head-0": 100.0}))
    with pytest.raises(measure.MeasureError) as exc:
        measure.measure_variants(trees, "t.py", rounds=3, out_dir=tmp_path, deadline=clock.now + 60, ahead=False)
    assert exc.value.variant is None and "no whole round" in str(exc.value)


def test_grade_only_with_a_budget_names_the_rounds_it_left_out(sim_session, monkeypatch):
    """A real grading of the simulated task, where each perf run counts 10 s more than it took (the
    simulated runs take well under a second): a 100 s budget holds about three rounds of three runs."""
    task, tmp, built = sim_session
    _set_latency(built.repo, HALF_LATENCY)
    build.git(built.repo, "commit", "-qam", "faster")
    real_perf, real_time = measure.run_perf, measure.time
    extra = {"s": 0.0}

    class Slower:
        @staticmethod
        def monotonic():
            return real_time.monotonic() + extra["s"]

    def run_perf(*args, **kwargs):
        extra["s"] += 10.0
        return real_perf(*args, **kwargs)

    monkeypatch.setattr(measure, "time", Slower)
    monkeypatch.setattr(measure, "run_perf", run_perf)
    g = grade.grade(built.repo, task, base=built.base, rounds=50, out_dir=tmp / "logs", budget_s=100)
    assert g.correctness == "PASS" and g.success and g.speedup == pytest.approx(2.0, rel=0.05)
    assert 1 <= len(g.round_geomeans) <= 3
    # Stopped before a round (not started) or inside one (dropped whole), never with a half round.
    assert len(g.notes) == 1 and g.notes[0].startswith("time budget: round"), g.notes
    assert len(list((tmp / "logs" / "perf").glob("round*-*.records.jsonl"))) >= 3 * len(g.round_geomeans)


MARKED_PERF_TEST = """\
import os
import time

def _mark(what):
    with open(os.environ["MARK"], "a") as fh:
        fh.write(f"{os.path.basename(os.getcwd())} {what} {time.time()}\\n")

_mark("import")


def test_perf_cutile():
    _mark("begin")
    time.sleep(0.3)
    _mark("end")
"""


def test_a_grading_rounds_runs_start_together_and_each_runs_its_tree_only_in_its_turn(tmp_path, monkeypatch):
    """``measure.RoundAhead``: every run of a round is started at once, ahead of its turn, and each
    runs nothing of its tree (not even the test module's import) before the one before it has
    ended; a child never let go ends without running anything."""
    mark = tmp_path / "mark.txt"
    monkeypatch.setenv("MARK", str(mark))
    trees = {}
    for name in ("a", "b", "c"):
        (tmp_path / name / "tests").mkdir(parents=True)
        (tmp_path / name / "tests" / "test_op.py").write_text(MARKED_PERF_TEST)
        trees[name] = tmp_path / name
    test = "tests/test_op.py"
    started = measure.RoundAhead({n: functools.partial(measure.run_perf, trees[n], test, tag=f"round1-{n}",
                                                       out_dir=tmp_path / "logs") for n in "abc"},
                                 measure.perf_argv(test))
    assert all(started.has(n) for n in "abc") and not mark.exists()
    for name in ("a", "b"):
        with pytest.raises(measure.MeasureError, match="recorded no"):  # the marked test records nothing
            started.run(name, 120)
    started.cancel()
    lines = [line.split() for line in mark.read_text().splitlines()]
    assert [(who, what) for who, what, _ in lines] == [("a", "import"), ("a", "begin"), ("a", "end"),
                                                      ("b", "import"), ("b", "begin"), ("b", "end")]
    assert float(lines[3][2]) >= float(lines[2][2])  # b's module ran only after a's run had ended
    for name in ("a", "b", "c"):
        head = (tmp_path / "logs" / f"round1-{name}.log").read_text().splitlines()[0]
        assert head.endswith("(started ahead of its turn)"), head

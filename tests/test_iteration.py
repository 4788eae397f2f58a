"""The iteration transaction with a scripted stage runner: the loop's unit tests, without pytest children.

``loop.stages.ScriptedStages`` hands out ``Stage`` evidence written down in advance; git, the log,
the anchor and the state file are real (the simulated TileGym-shaped repo of ``fixtures_repo``), so
each test exercises ``try_change`` end to end in well under a second. ``test_cli_loop.py`` and
``test_redteam.py`` keep the real child path honest.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from fixtures_repo import KERNEL_REL, allow_no_gpu, build_tilegym_like_repo, edit_session, git

from cutile_perf.cli import main
from cutile_perf.judge.crash import CrashClass
from cutile_perf.judge.verdict import Stage
from cutile_perf.loop import iteration as iteration_mod
from cutile_perf.loop.baseline import baseline
from cutile_perf.store.history import History, anchor_path
from cutile_perf.loop.iteration import resume_interrupted, try_change
from cutile_perf.loop.iteration_state import State, state_key
from cutile_perf.loop.row import patch_name
from cutile_perf.child.pool import Request
from scripted_stages import ScriptedStages
from cutile_perf.store import git_ops, log
from cutile_perf.store import session as session_mod

TESTS = frozenset({"tests/ops/test_rms_norm.py::test_op[cutile]"})
BASE = {"a": 1.0, "b": 2.0}


def passed() -> Stage:
    return Stage("correctness", passed=TESTS)


KERNEL = "rms_norm_kernel"


def perf(medians: dict[str, float], kernel: str = KERNEL) -> Stage:
    return Stage("perf", shapes=dict(medians), test_ids={c: f"t::test_perf[{c}]" for c in medians},
                 kernel_names={c: kernel for c in medians})


def _session_template(tmp_path_factory, **thresholds):
    repo = build_tilegym_like_repo(tmp_path_factory.mktemp("scripted"))
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    allow_no_gpu(repo)
    if thresholds:
        edit_session(repo, thresholds=thresholds)
    stages = ScriptedStages({("correctness", "candidate"): [passed()],
                             ("perf", "candidate"): [perf({"a": 1.0, "b": 2.0}), perf({"a": 1.004, "b": 2.01}),
                                                     perf({"a": 0.996, "b": 1.99})]}, defined={KERNEL})
    assert baseline(repo=repo, repeats=3, stages=stages).exit_code == 0
    return repo


@pytest.fixture(scope="module")
def _template(tmp_path_factory):
    return _session_template(tmp_path_factory)


@pytest.fixture(scope="module")
def _template_all_pairs(tmp_path_factory):
    # The scripted runs repeat the same numbers, so most re-checks would settle after their first
    # pair (``recheck.settled_early``); the tests of the re-check's own runs need all of them.
    return _session_template(tmp_path_factory, settle_sd=0.0)


def test_the_baseline_tells_the_stages_its_later_perf_runs_before_each_run(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    allow_no_gpu(repo)
    stages = ScriptedStages({("correctness", "candidate"): [passed()],
                             ("perf", "candidate"): [perf({"a": 1.0, "b": 2.0})]}, defined={KERNEL})
    assert baseline(repo=repo, repeats=4, stages=stages).exit_code == 0
    named = [(tag, [run.tag for run in then]) for (_, tag, _), then in zip(stages.calls, stages.expected)]
    # every perf run is expected from the correctness run on: they start as spares beside it
    assert named == [("0", ["0-r1", "0-r2", "0-r3", "0-r4"]), ("0-r1", ["0-r2", "0-r3", "0-r4"]),
                     ("0-r2", ["0-r3", "0-r4"]), ("0-r3", ["0-r4"]), ("0-r4", [])]


def _copy(template, tmp_path):
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(template, copy, symlinks=True)
    return copy


@pytest.fixture
def repo(_template, tmp_path):
    return _copy(_template, tmp_path)


@pytest.fixture
def repo_all_pairs(_template_all_pairs, tmp_path):
    return _copy(_template_all_pairs, tmp_path)


def edit(repo, marker: str) -> None:
    path = repo / KERNEL_REL
    path.write_text(path.read_text() + f"\n# {marker}\n")


def scripted(repo, *perf_runs: dict, correctness: Stage | None = None, **kw) -> ScriptedStages:
    session = session_mod.load(repo)
    history = History.open(session, git_ops.open_repo(repo))
    kw.setdefault("defined", {KERNEL})
    return ScriptedStages({("correctness", "candidate"): [correctness or passed()],
                           ("perf", "candidate"): [perf(m) for m in perf_runs],
                           ("perf", "base"): [perf(BASE)]}, reference_commit=history.baseline()["commit"], **kw)


def test_a_clear_speedup_is_kept_and_becomes_the_baseline_in_milliseconds(repo):
    edit(repo, "faster")
    start = time.monotonic()
    result = try_change(repo, "faster", stages=scripted(repo, {"a": 0.5, "b": 1.0}))
    assert time.monotonic() - start < 5.0
    assert result.row["status"] == "keep" and result.row["decision"]["tier"] == "new-baseline"
    assert git_ops.head(git_ops.open_repo(repo)) == result.row["commit"]
    assert result.history.baseline()["iteration"] == 1
    assert not State.path(session_mod.load(repo)).exists()


def test_a_slowdown_is_reverted_and_the_change_saved(repo):
    edit(repo, "slower")
    result = try_change(repo, "slower", stages=scripted(repo, {"a": 1.5, "b": 3.0}))
    assert result.row["status"] == "revert"
    assert (repo / result.row["patch"]).read_bytes().count(b"# slower") == 1
    assert "# slower" not in (repo / KERNEL_REL).read_text()


def test_a_failed_correctness_stage_never_runs_perf(repo):
    edit(repo, "wrong")
    stages = scripted(repo, {"a": 0.1, "b": 0.1}, correctness=Stage("correctness", crash=CrashClass.WRONG_RESULT,
                                                                     detail="mismatch"))
    result = try_change(repo, "wrong", stages=stages)
    assert (result.row["status"], result.row["crash_class"], result.row["correctness"]) == ("revert", "wrong-result", "FAIL")
    assert [c[0] for c in stages.calls] == ["correctness"]


def test_a_borderline_run_is_re_measured_in_interleaved_pairs_against_the_baseline_commit(repo_all_pairs):
    edit(repo_all_pairs, "borderline")
    stages = scripted(repo_all_pairs, {"a": 1.02, "b": 2.0}, {"a": 1.0, "b": 2.0})
    result = try_change(repo_all_pairs, "borderline", stages=stages)
    base = [c for c in stages.calls if c[2] == stages.reference_commit]
    assert len(base) >= 3 and all("confirm" in tag for _, tag, _ in base)
    assert result.row["status"] == "keep" and "confirm" in result.row


def test_the_re_check_re_measures_only_the_case_in_doubt_and_its_timings_show_its_share(repo_all_pairs):
    edit(repo_all_pairs, "one case borderline")
    stages = scripted(repo_all_pairs, {"a": 1.02, "b": 2.0}, {"a": 1.0, "b": 2.0})
    for key, seconds in ((("perf", "candidate"), 60.0), (("perf", "base"), 12.0)):
        stages.script[key] = [replace(stage, duration_s=seconds) for stage in stages.script[key]]
    result = try_change(repo_all_pairs, "one case borderline", stages=stages)
    row = result.row
    # b rose by nothing: it keeps the single run's evidence; only a's node id is run again.
    assert stages.selected == [("a",)] * 6
    assert (row["status"], row["decision"]["source"], row["decision"]["rechecked"]) == ("keep", "partial", ["a"])
    assert list(row["confirm"]) == ["a"] and len(row["confirm"]["a"]["base"]) == 3
    timings = row["timings"]
    assert timings["recheck_runs"] == 6 and timings["perf_s"] == pytest.approx(60.0)
    assert timings["recheck_s"] == pytest.approx(3 * 12.0 + 3 * 60.0)  # total_s / perf_s: the try in perf runs
    # Before each re-check run the stages are told the runs still to come, in order (they start as spares).
    recheck = [(tag, then) for (_, tag, _), then in zip(stages.calls, stages.expected) if "confirm" in tag]
    tags = [tag for tag, _ in recheck]
    assert tags == ["1-confirm1-base", "1-confirm1-cand", "1-confirm2-base", "1-confirm2-cand",
                    "1-confirm3-base", "1-confirm3-cand"]
    assert [[run.tag for run in then] for _, then in recheck] == [tags[i + 1:] for i in range(6)]
    base, cand = stages.calls[-2][2], stages.calls[-1][2]
    assert all(run.commit == (base if "base" in run.tag else cand) for _, then in recheck for run in then)
    assert all(run.cases == {"a": run.cases["a"]} for _, then in recheck for run in then)  # the same case in doubt
    # The try's own perf run was expected with its correctness run; nothing is expected during it.
    assert [[run.tag for run in then] for (_, tag, _), then in zip(stages.calls, stages.expected)
            if "confirm" not in tag] == [["1"], []]


def test_a_re_check_settled_after_its_first_pair_ends_there_and_its_runs_ahead_are_let_go(repo):
    edit(repo, "one case clearly slower")
    stages = scripted(repo, {"a": 1.02, "b": 2.0}, {"a": 1.3, "b": 2.0})  # borderline once, then 30 % slower
    result = try_change(repo, "one case clearly slower", stages=stages)
    row = result.row
    assert [tag for _, tag, _ in stages.calls if "confirm" in tag] == ["1-confirm1-base", "1-confirm1-cand"]
    assert (row["status"], row["decision"]["settled_after"], row["timings"]["recheck_runs"]) == ("revert", 1, 2)
    assert "settled after 1 of 3 interleaved pairs" in row["reason"]
    assert row["confirm"] == {"a": {"base": [1.0], "candidate": [1.3]}}  # the runs that ran, no filled-in ones


def test_each_re_check_run_says_whether_it_runs_the_cases_in_doubt_or_every_case(repo_all_pairs, capsys):
    # One case in doubt: its runs say so. A geomean in doubt (both cases 4 % faster: borderline here): every case is
    # run again, each run costs a whole perf run, and the line says so instead of staying silent.
    edit(repo_all_pairs, "one case borderline")
    try_change(repo_all_pairs, "one case borderline", stages=scripted(repo_all_pairs, {"a": 1.02, "b": 2.0}, {"a": 1.0, "b": 2.0}))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "iteration 1: perf (confirm" in ln]
    assert len(lines) == 6 and all(ln.endswith(", 1 case(s) in doubt") for ln in lines)
    edit(repo_all_pairs, "geomean borderline")
    row = try_change(repo_all_pairs, "geomean borderline", stages=scripted(repo_all_pairs, {"a": 0.96, "b": 1.92}, {"a": 1.0, "b": 2.0})).row
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "iteration 2: perf (confirm" in ln]
    assert lines and all(ln.endswith(", every case") for ln in lines), row["reason"]


def test_the_baseline_row_learns_what_its_perf_runs_imported_and_every_try_preloads_only_that(tmp_path, monkeypatch):
    repo = build_tilegym_like_repo(tmp_path)
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    allow_no_gpu(repo)
    runs = [replace(perf({"a": 1.0, "b": 2.0}), imports=("sympy", "triton")),
            replace(perf({"a": 1.004, "b": 2.01}), imports=("triton", "transformers")), perf({"a": 0.996, "b": 1.99})]
    stages = ScriptedStages({("correctness", "candidate"): [passed()], ("perf", "candidate"): runs}, defined={KERNEL})
    assert baseline(repo=repo, repeats=3, stages=stages).exit_code == 0
    rows = lambda: History.open(session_mod.load(repo), git_ops.open_repo(repo)).rows  # noqa: E731
    assert rows()[0]["preload"] == ["sympy", "triton", "transformers"]  # first-seen order, once each
    # A try's runner preloads the baseline's list; what its own children imported (the candidate's
    # code chose it) is never learned: the next try preloads the baseline's list again.
    given = []

    def runner(*args, **kw):
        given.append(kw.get("preload"))
        return scripted(repo, {"a": 0.5, "b": 1.0}, defined={KERNEL})

    monkeypatch.setattr(iteration_mod, "StageRunner", runner)
    for marker in ("one", "two"):
        edit(repo, marker)
        assert try_change(repo, marker).row["status"] == "keep"
    assert given == [["sympy", "triton", "transformers"]] * 2
    assert all("preload" not in row for row in rows()[1:])


def test_a_spare_serves_any_cases_of_its_run_and_is_handed_their_node_ids():
    cases = {"a": "t.py::test[a]", "b": "t.py::test[b]"}
    spare = Request("perf", "1-confirm1-base", "abc")  # started before the cases in doubt were known
    asked = Request("perf", "1-confirm1-base", "abc", cases)
    assert spare.same_run(asked) and spare.same_run(Request("perf", "1-confirm1-base", "abc"))
    assert not spare.same_run(Request("perf", "1-confirm2-base", "abc", cases))  # another run
    assert not spare.same_run(Request("perf", "1-confirm1-base", "def", cases))  # another commit
    assert not spare.same_run(Request("correctness", "1-confirm1-base", "abc"))  # another stage
    assert json.loads(asked.handover()) == ["t.py::test[a]", "t.py::test[b]"]
    assert Request("perf", "1-confirm1-base", "abc", {"a": None}).handover() == b""  # all: no node id
    assert spare.handover() == b""


def test_a_crashed_baseline_run_of_the_re_check_ends_the_iteration_before_the_candidate_run(repo):
    edit(repo, "recheck crash")
    stages = scripted(repo, {"a": 1.02, "b": 2.0})
    stages.script[("perf", "base")] = [Stage("perf", crash=CrashClass.FAULT, detail="illegal address")]
    result = try_change(repo, "recheck crash", stages=stages)
    assert result.row["crash_class"] == "fault" and "interleaved re-check" in result.row["reason"]
    assert stages.calls[-1][1].endswith("confirm1-base")


def test_an_edit_during_the_run_is_never_kept(repo):
    edit(repo, "measured")
    stages = scripted(repo, {"a": 0.5, "b": 1.0}, on_stage=lambda name, tag, commit: edit(repo, "edited meanwhile"))
    result = try_change(repo, "edited during the run", stages=stages)
    assert (result.row["status"], result.row["crash_class"]) == ("crash", "changed-during-run")
    assert b"edited meanwhile" in (repo / result.row["patch"]).read_bytes()


def test_a_record_naming_a_kernel_the_candidate_does_not_define_is_measured_wrong_code(repo):
    session = session_mod.load(repo)
    assert History.open(session, git_ops.open_repo(repo)).kernel_names() == {"a": KERNEL, "b": KERNEL}
    edit(repo, "renamed")
    stages = scripted(repo, {"a": 0.5, "b": 1.0}, defined={"something_else"})
    result = try_change(repo, "renamed kernel", stages=stages)
    assert result.row["crash_class"] == "measured-wrong-code"


def test_an_exception_inside_a_stage_is_one_crash_row_and_the_branch_goes_back(repo):
    edit(repo, "boom")

    def boom(name, tag, commit):
        raise RuntimeError("the runner broke")

    with pytest.raises(RuntimeError):
        try_change(repo, "boom", stages=scripted(repo, {"a": 0.5, "b": 1.0}, on_stage=boom))
    session = session_mod.load(repo)
    history = History.open(session, git_ops.open_repo(repo))
    assert history.last()["crash_class"] == "harness" and "the runner broke" in history.last()["reason"]
    # Issue 44: the tests never ran, so the row does not say they failed.
    assert history.last()["correctness"] == "not run"
    assert git_ops.head(git_ops.open_repo(repo)) == session.base_commit


def test_a_harness_failure_after_the_correctness_stage_says_its_tests_passed(repo):
    """Issue 44: a harness failure after a passing correctness stage was logged as correctness FAIL."""
    edit(repo, "boom in perf")

    def boom(name, tag, commit):
        if name == "perf":
            raise RuntimeError("the runner broke after correctness")

    with pytest.raises(RuntimeError):
        try_change(repo, "boom", stages=scripted(repo, {"a": 0.5, "b": 1.0}, on_stage=boom))
    last = History.open(session_mod.load(repo), git_ops.open_repo(repo)).last()
    assert (last["status"], last["crash_class"], last["correctness"]) == ("crash", "harness", "PASS")


def test_the_log_is_read_once_per_try(repo, monkeypatch):
    reads = []
    real = log.Snapshot.read.__func__

    def counted(cls, path):
        reads.append(path)
        return real(cls, path)

    monkeypatch.setattr(log.Snapshot, "read", classmethod(counted))
    edit(repo, "slower, counted")
    try_change(repo, "slower", stages=scripted(repo, {"a": 1.5, "b": 3.0}))
    # scripted() itself opened the history once to learn the baseline commit.
    assert len(reads) == 2, reads


def test_a_kill_between_the_append_and_the_anchor_is_repaired_by_resume(repo):
    """The window that bricked a session: the row is in the log, the anchor still names the row before."""
    session = session_mod.load(repo)
    g = git_ops.open_repo(repo)
    anchor_before = anchor_path(g, session).read_bytes()
    edit(repo, "slower, killed")
    try_change(repo, "slower", stages=scripted(repo, {"a": 1.5, "b": 3.0}))
    # Rebuild the state the kill left: the step before recording, the anchor of the row before.
    history = History.open(session, g)
    row = {k: v for k, v in history.last().items() if k != "prev"}
    next_stages = scripted(repo, {"a": 0.5, "b": 1.0})
    git(repo, "reset", "-q", "--soft", "HEAD")  # the branch is already at the base: nothing to undo
    anchor_path(g, session).write_bytes(anchor_before)
    state = State(file=State.path(session), key=state_key(g), iteration=row["iteration"], optimization=row["optimization"],
                  name=f"{row['iteration']}-slower", base=session.base_commit, reference=session.base_commit,
                  paths=[KERNEL_REL], step="decided", patch=row["patch"], candidate=row["commit"], row=row)
    state.save()
    with pytest.raises(Exception, match="not settled"):
        try_change(repo, "next", stages=next_stages)
    result = resume_interrupted(repo)
    assert "iteration 1: revert" in " ".join(result.actions)
    history = History.open(session, g)  # strict: the anchor matches again
    assert [e.iteration for e in history.entries].count(1) == 1
    assert json.loads(anchor_path(g, session).read_text())["rows"] == len(history)


# --- git is the harness's alone (issue 19 item 2): what a child could do to the user's repository ----
# The child's actions are played by ``on_stage`` (it runs while a stage "runs"); with the sandbox the
# child cannot reach .git at all, these are the defence behind it.


def test_a_branch_moved_during_the_run_is_tampering_and_is_moved_back(repo):
    edit(repo, "faster, with a branch swap")
    session = session_mod.load(repo)

    def swap(name, tag, commit):
        if name == "perf" and tag == "1":  # the try's own perf run (a speedup is re-checked after it)
            (repo / "tests" / "sneaky.py").write_text("EXTRA = 1\n")
            git(repo, "add", "tests/sneaky.py")
            git(repo, "commit", "-qm", "unfenced extra")
            (repo / "tests" / "sneaky.py").unlink()
            git(repo, "rm", "-q", "--cached", "tests/sneaky.py")

    result = try_change(repo, "faster", stages=scripted(repo, {"a": 0.5, "b": 1.0}, on_stage=swap))
    assert (result.row["status"], result.row["crash_class"]) == ("crash", "tampered"), result.row
    assert "moved" in result.row["reason"]
    assert git_ops.head(git_ops.open_repo(repo)) == session.base_commit


def test_head_pointed_at_main_during_a_reverted_run_never_resets_main(repo):
    main_before = git(repo, "rev-parse", "main").strip()
    edit(repo, "slower, head swapped")

    def point_at_main(name, tag, commit):
        git(repo, "symbolic-ref", "HEAD", "refs/heads/main")

    result = try_change(repo, "slower", stages=scripted(repo, {"a": 1.5, "b": 3.0}, on_stage=point_at_main))
    assert result.row["status"] != "keep"
    assert git(repo, "rev-parse", "main").strip() == main_before, "the revert moved the user's main"
    assert git(repo, "symbolic-ref", "HEAD").strip() == f"refs/heads/{session_mod.load(repo).branch}"


@pytest.mark.parametrize("key, value", [("diff.external", "false"), ("core.fsmonitor", "sleep 30; false"),
                                        ("diff.textconv", "")])
def test_repository_config_set_by_a_child_cannot_spoil_patches_or_hang_the_loop(repo, key, value):
    edit(repo, "slower, config set")

    def configure(name, tag, commit):
        if key == "diff.textconv":
            (repo / ".gitattributes").write_text("*.py diff=junk\n")
            git(repo, "config", "diff.junk.textconv", "echo junk")
        else:
            git(repo, "config", key, value)

    start = time.monotonic()
    result = try_change(repo, "slower", stages=scripted(repo, {"a": 1.5, "b": 3.0}, on_stage=configure))
    assert time.monotonic() - start < 20
    patch = (repo / result.row["patch"]).read_bytes()
    assert b"# slower, config set" in patch and b"junk" not in patch


# --- perf-only behaviour is refused before it runs (issue 19 item 5a) ----------------------------------


@pytest.mark.parametrize("probe", [
    "import os\nLESS = 'test_perf' in os.environ.get('PYTEST_CURRENT_TEST', '')",
    "import sys\nLESS = '--print-record' in sys.argv",
    "import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() * 0.5",
    "import statistics\nstatistics.median = lambda xs: min(xs)",
])
def test_a_change_that_probes_or_patches_its_measurement_is_refused_untouched(repo, probe):
    edit(repo, "probe")
    path = repo / KERNEL_REL
    path.write_text(path.read_text() + "\n" + probe + "\n")
    before = path.read_bytes()
    rows_before = len(History.open(session_mod.load(repo), git_ops.open_repo(repo)))
    stages = scripted(repo, {"a": 0.5, "b": 1.0})
    with pytest.raises(Exception, match="perf-only behaviour suspected"):
        try_change(repo, "sneaky", stages=stages)
    assert stages.calls == [] and path.read_bytes() == before
    assert len(History.open(session_mod.load(repo), git_ops.open_repo(repo))) == rows_before


def test_verify_refuses_a_kept_commit_that_holds_unfenced_changes(repo, monkeypatch, capsys):
    """Defence in depth behind the branch check: were an unfenced change ever kept (the measurement
    takes unfenced paths from the base, so it was never looked at), verify says so instead of
    re-measuring a composition that is not the commit."""
    edit(repo, "faster, smuggled")

    def smuggle(name, tag, commit):
        if name == "perf":
            (repo / "tests" / "conftest_extra.py").write_text("SMUGGLED = 1\n")
            git(repo, "add", "tests/conftest_extra.py")
            git(repo, "commit", "-q", "--amend", "--no-edit")

    monkeypatch.setattr(git_ops, "moved_since", lambda *a, **k: None)  # the harness before the branch check
    monkeypatch.setattr("cutile_perf.loop.iteration.Iteration.changed_during_run", lambda self: False)
    result = try_change(repo, "faster", stages=scripted(repo, {"a": 0.5, "b": 1.0}, on_stage=smuggle))
    assert result.row["status"] == "keep"
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["verify", "--repo", str(repo), "--json"]) == 1
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["unfenced"] == ["tests/conftest_extra.py"], data


# --- the environment is a frozen input (issue 19) -------------------------------------------------------


@pytest.mark.parametrize("name, value", [("CUPTI", "0"), ("PYTEST_ADDOPTS", "-p no:cacheprovider -k perf"),
                                         ("LD_PRELOAD", "/tmp/libfast.so"), ("DISABLE_AUTOTUNE", "1")])
def test_a_try_under_other_measurement_switches_than_the_baseline_is_refused(repo, monkeypatch, name, value):
    edit(repo, "switched")
    stages = scripted(repo, {"a": 0.5, "b": 1.0})
    monkeypatch.setenv(name, value)
    with pytest.raises(Exception, match=f"differs from the baseline's: {name}"):
        try_change(repo, "faster only under a switch", stages=stages)
    assert stages.calls == []
    monkeypatch.delenv(name)
    assert try_change(repo, "faster", stages=stages).row["status"] == "keep"


def test_every_row_says_whether_its_children_ran_in_a_sandbox(repo):
    from cutile_perf.loop.row import isolation

    boxed, unboxed = Stage("perf", sandbox="unshare"), Stage("perf", sandbox="none: user namespaces disabled")
    assert isolation([boxed, boxed]) == "unshare"
    assert isolation([boxed, unboxed]) == "none: user namespaces disabled"  # never hidden behind a boxed stage
    edit(repo, "faster, unboxed")
    stages = scripted(repo, {"a": 0.5, "b": 1.0})
    stages.script[("correctness", "candidate")] = [Stage("correctness", passed=TESTS, sandbox="none: off (test)")]
    result = try_change(repo, "faster", stages=stages)
    assert result.row["sandbox"] == "none: off (test)"
    assert main(["status", "--repo", str(repo)]) == 0


def test_init_says_whether_the_children_will_run_in_a_sandbox(tmp_path, capsys, monkeypatch):
    repo = build_tilegym_like_repo(tmp_path)
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm", "--no-sandbox", "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["sandbox"] == "none: off (session.yaml sandbox: off)", data


def test_status_shows_a_description_as_written_in_the_terminal(repo, capsys):
    edit(repo, "arrow")
    try_change(repo, "occupancy 2 -> 4", stages=scripted(repo, {"a": 1.5, "b": 3.0}))
    capsys.readouterr()
    assert main(["status", "--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "occupancy 2 -> 4" in out and "&gt;" not in out
    assert "occupancy 2 -&gt; 4" in (repo / "sandbox/perf_results.md").read_text()  # the markdown file stays escaped


# --- saved patches (issue 21 item 7) -----------------------------------------------------------------


def test_saved_patches_are_zero_padded_and_readable_by_all(repo):
    import os
    import stat

    edit(repo, "slower, padded")
    old = os.umask(0o022)
    try:
        result = try_change(repo, "Occupancy 2 -> 4", stages=scripted(repo, {"a": 1.5, "b": 3.0}))
    finally:
        os.umask(old)
    assert result.row["patch"] == "sandbox/patches/001-occupancy-2-4.patch"
    assert stat.S_IMODE((repo / result.row["patch"]).stat().st_mode) == 0o644  # not mkstemp's 0600


def _killed_after_commit(repo, name: str) -> str:
    """The state a kill after the candidate commit leaves, as an older cutile-perf wrote it (``name``)."""
    session = session_mod.load(repo)
    g = git_ops.open_repo(repo)
    base = git_ops.head(g)
    git(repo, "commit", "-qam", "cutile-perf 1: killed")
    state = State(file=State.path(session), key=state_key(g), iteration=1, optimization="killed", name=name,
                  base=base, reference=session.base_commit, paths=[KERNEL_REL], step="committed",
                  candidate=git_ops.head(g))
    state.save()
    return base


def test_resume_of_an_iteration_named_before_padding_keeps_its_name(repo):
    # The name is in the signed state, the path in the row: nothing looks a patch up by number.
    edit(repo, "killed mid-run")
    base = _killed_after_commit(repo, "1-killed")
    resume_interrupted(repo)
    assert (repo / "sandbox/patches/1-killed.patch").read_text().count("# killed mid-run") == 1
    assert not (repo / "sandbox/patches/001-killed.patch").exists()
    assert git_ops.head(git_ops.open_repo(repo)) == base


def test_an_iteration_killed_before_its_verdict_shows_correctness_not_run_with_why(repo):
    # Issue 21: the row of an interrupted iteration said FAIL, as if its tests had found it wrong.
    edit(repo, "killed before the verdict")
    _killed_after_commit(repo, patch_name(1, "killed"))
    resume_interrupted(repo)
    row = log.Snapshot.read(repo / "sandbox/experiments.jsonl").contents.entries[-1]
    assert (row["status"], row["crash_class"], row["correctness"]) == ("crash", "interrupted", "not run"), row
    assert "stopped after step 'committed'" in row["reason"]
    table = (repo / "sandbox/perf_results.md").read_text()
    assert "| 1 | killed | - | not run (interrupted) | interrupted |" in table, table


def test_ctrl_c_during_the_perf_run_logs_the_correctness_the_tests_showed(repo):
    """Issue 44 item 3: the row says what happened: the correctness tests had passed when Ctrl-C
    stopped the perf run (it said "not run" before, as if they never ran)."""
    edit(repo, "interrupted by Ctrl-C")

    def ctrl_c(name, tag, commit):
        if name == "perf":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        try_change(repo, "ctrl-c", stages=scripted(repo, {"a": 0.5, "b": 1.0}, on_stage=ctrl_c))
    row = log.Snapshot.read(repo / "sandbox/experiments.jsonl").contents.entries[-1]
    assert (row["crash_class"], row["correctness"]) == ("interrupted", "PASS"), row
    assert "interrupted" in (repo / "sandbox/perf_results.md").read_text()


def test_a_harness_step_blocked_past_the_deadline_ends_the_try_and_frees_the_lock(repo, monkeypatch, tmp_path):
    """Issue 44: a blocking read of a FIFO a child left held `try` and its lock past any budget.

    The step here opens a FIFO without O_NONBLOCK, as a read we did not foresee would. A thread
    opens its other end after 20 s, so without the guard the test fails instead of hanging."""
    import os
    import threading

    from cutile_perf.loop import watchdog

    monkeypatch.setattr(watchdog, "deadline_s", lambda children_budget_s: 1.0)
    fifo = tmp_path / "left-by-a-child"
    os.mkfifo(fifo)
    unblock = threading.Timer(20.0, lambda: open(fifo, "w").close())
    unblock.daemon = True
    unblock.start()
    edit(repo, "reads a fifo")

    def blocked_read(name, tag, commit):
        if name == "correctness":
            with open(fifo) as fh:
                fh.read()

    started = time.monotonic()
    with pytest.raises(watchdog.HarnessOverran):
        try_change(repo, "reads a fifo", stages=scripted(repo, {"a": 0.5, "b": 1.0}, on_stage=blocked_read))
    unblock.cancel()
    assert time.monotonic() - started < 15
    session = session_mod.load(repo)
    assert session_mod.read_lock(session.repo) is None
    last = History.open(session, git_ops.open_repo(repo)).last()
    assert (last["status"], last["crash_class"]) == ("crash", "harness") and "HarnessOverran" in last["reason"]
    assert git_ops.head(git_ops.open_repo(repo)) == session.base_commit


def test_content_reverted_slow_and_tried_again_fast_is_not_kept(repo):
    """Issue 39: the same change tried again after a revert until one lucky try keeps it. The earlier
    row's runs (``loop.row.prior_ratios``) reach the judge as evidence of the candidate's spread."""
    edit(repo, "fast at times")
    slow = try_change(repo, "fast at times", stages=scripted(repo, {"a": 1.1, "b": 2.2}))
    assert slow.row["status"] == "revert"
    edit(repo, "fast at times")  # the same fenced content again
    again = try_change(repo, "fast at times, again", stages=scripted(repo, {"a": 0.77, "b": 1.54}))
    assert (again.row["status"], again.row["decision"]["tier"]) == ("revert", "unstable"), again.row["reason"]
    assert f"when this content was reverted (iteration {slow.row['iteration']})" in again.row["reason"]

"""``cutile-perf screen`` on the SIMULATED TileGym-shaped repo: candidates of known latency ranked in
their order, a failing and a non-compiling one listed and never timed, the user's repository left
byte for byte as it was, and the ``--top`` plan accepted by ``batch --check``.

One screen runs for the module (children are slow on a loaded CPU machine); each test reads it.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from fixtures_repo import (KERNEL_REL, allow_no_gpu, build_tilegym_like_repo, edit_kernel, kernel_source,  # noqa: F401
                           tilegym_like_repo)
from redteam_helpers import call, start_session

from cutile_perf.commands.screen import compile_one
from cutile_perf.loop import screen_commits
from cutile_perf.loop.screen import NOT_COMPILED
from cutile_perf.store import git_ops

LATENCY = {"fast": {"256x1024": 0.5, "4096x1024": 1.0}, "mid": {"256x1024": 0.8, "4096x1024": 1.6},
           "slow": {"256x1024": 1.5, "4096x1024": 3.0}}
EXPECTED_RATIO = {"fast": 0.5, "mid": 0.8, "slow": 1.5}  # against the fixture's base latencies (1.0, 2.0)


def user_state(repo: Path) -> dict:
    """What screen must not change: every file of the work tree and of .git (index, HEAD, refs,
    reflogs, config) byte for byte, the log, and every ref and commit git can name."""
    files = {}
    for top, dirs, names in os.walk(repo):
        dirs[:] = [d for d in dirs if not (Path(top) == repo and d == "sandbox") and d != "objects"]
        for name in names:
            path = Path(top) / name
            files[path.relative_to(repo).as_posix()] = path.read_bytes()
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # this look must not refresh the index it compares

    def git(*args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True).stdout
    return {"files": files, "log": (repo / "sandbox/experiments.jsonl").read_bytes(),
            "refs": git("for-each-ref"), "all": git("log", "--all", "--format=%H %s"), "status": git("status", "-z")}


def baselined_with_candidates(folder: Path, latency: dict) -> tuple[Path, Path]:
    """A baselined simulated repo and ``sandbox/cand/``: a candidate of each ``latency``, and a wrong one."""
    repo = build_tilegym_like_repo(folder)
    start_session(repo)
    cand = repo / "sandbox/cand"
    cand.mkdir(parents=True)
    for name, times in latency.items():
        (cand / f"{name}.py").write_text(kernel_source(times))
    (cand / "wrong.py").write_text(kernel_source(behaviour="wrong"))
    return repo, cand


@pytest.fixture(scope="module")
def screened(tmp_path_factory):
    repo, cand = baselined_with_candidates(tmp_path_factory.mktemp("screen"), LATENCY)
    (cand / "broken.py").write_text(kernel_source() + "\ndef oops(:\n")
    # Asks whether it is being measured: try refuses it, so screen never runs it either.
    (cand / "probe.py").write_text(kernel_source() + '\nimport os\nMEASURED = os.environ.get("PYTEST_CURRENT_TEST")\n')
    # The user's own work in progress, uncommitted and partly staged: screen must not touch it.
    edit_kernel(repo, latency={"256x1024": 0.9, "4096x1024": 1.9})
    subprocess.run(["git", "add", KERNEL_REL], cwd=repo, check=True)
    edit_kernel(repo, noise=0.003)
    (repo / "notes.txt").write_text("untracked notes\n")
    before = user_state(repo)
    code, data, text = call(repo, "screen", "sandbox/cand/*.py", "--top", "2")
    return repo, before, code, data, text


def test_screen_ranks_candidates_in_the_order_of_their_latency(screened):
    repo, _before, code, data, _text = screened
    assert code == 0, data
    assert [r["name"] for r in data["ranked"]] == ["fast", "mid", "slow"]
    for reading in data["ranked"]:
        assert reading["geomean"] == pytest.approx(EXPECTED_RATIO[reading["name"]], rel=0.05)
        low, high = reading["interval"]
        assert low <= reading["geomean"] <= high or reading["rounds"] > 1
        assert reading["rounds"] == data["rounds"] >= 1
    assert data["label"] == "readings, not verdicts"
    table = (repo / "sandbox/screen.md").read_text()
    assert "readings, not verdicts" in table and "| 1 | fast |" in table


def test_screen_says_where_its_seconds_went(screened):
    """Compile-check, correctness and rounds, each timed once, in order, within the whole screen's
    seconds; screen.md gives them beside the total."""
    repo, _before, _code, data, _text = screened
    phases = data["phases"]
    assert list(phases) == ["compile-check", "correctness", "rounds"]
    assert all(s >= 0 for s in phases.values()) and phases["correctness"] > 0 and phases["rounds"] > 0
    assert sum(phases.values()) <= data["seconds"] + 0.3  # each rounded to 0.1 s
    assert f"correctness {phases['correctness']:.0f} s" in (repo / "sandbox/screen.md").read_text()


def test_a_failing_candidate_is_listed_and_not_timed(screened):
    repo, _before, _code, data, _text = screened
    assert data["not_ranked"]["wrong"]["state"] == "fails correctness"
    assert "wrong-result" in data["not_ranked"]["wrong"]["why"]
    perf = sorted(p.name for p in (repo / "sandbox/runs").glob("screen-*-perf.log"))
    # One round: the base and the three passing candidates, nothing else.
    assert len(perf) == data["rounds"] * 4, perf


def test_a_candidate_that_does_not_compile_is_listed_and_never_run(screened):
    repo, _before, _code, data, _text = screened
    assert data["not_ranked"]["broken"]["state"] == "does not compile"
    assert "SyntaxError" in data["not_ranked"]["broken"]["why"]
    correctness = sorted(p.name for p in (repo / "sandbox/runs").glob("screen-*-correctness.log"))
    assert len(correctness) == 4, correctness  # fast, mid, slow, wrong: not broken, not probe


def test_a_candidate_with_a_measurement_probe_is_refused_and_never_run(screened):
    _repo, _before, _code, data, _text = screened
    assert data["not_ranked"]["probe"]["state"] == "refused"
    assert "PYTEST_CURRENT_TEST" in data["not_ranked"]["probe"]["why"]
    assert "probe" not in data["compile_check"], "not even compile-checked"


def test_screen_leaves_work_tree_index_head_refs_and_log_byte_for_byte(screened):
    repo, before, _code, _data, _text = screened
    after = user_state(repo)
    changed = sorted(p for p in set(before["files"]) | set(after["files"])
                     if before["files"].get(p) != after["files"].get(p))
    assert changed == [], f"screen changed {changed}"
    assert after == before
    assert not screen_commits.screen_refs(git_ops.open_repo(repo))


def test_top_plan_is_accepted_by_batch_check(screened):
    repo, _before, _code, data, _text = screened
    assert data["plan"] == "sandbox/screen-plan.yaml"
    tries = yaml.safe_load((repo / data["plan"]).read_text())["tries"]
    assert [t["optimization"] for t in tries] == ["fast", "mid"]
    assert tries[0]["files"] == {KERNEL_REL: "sandbox/cand/fast.py"}
    # batch refuses over uncommitted fenced work: the user's edit goes aside for the check only.
    subprocess.run(["git", "stash", "-q"], cwd=repo, check=True)
    try:
        code, check, _ = call(repo, "batch", str(repo / data["plan"]), "--check")
    finally:
        subprocess.run(["git", "stash", "pop", "-q", "--index"], cwd=repo, check=True)
    assert code == 0 and check["ready"], check


@pytest.mark.parametrize(("args", "exit_code", "words"), [
    (("sandbox/none/*.py",), 2, "no candidate file matches"),
    (("src/fakegym/ops/cutile/*.py",), 2, "not under sandbox/"),
    (("sandbox/cand/*.py", "--seconds", "-1"), 2, "--seconds"),
    (("sandbox/cand/*.py", "--top", "0"), 2, "--top"),
    (("sandbox/cand/*.py", "--cases", "0"), 2, "--cases"),
])
def test_bad_input_is_one_line_and_changes_nothing(screened, args, exit_code, words):
    repo, _before, _code, _data, _text = screened
    state = user_state(repo)
    code, data, _ = call(repo, "screen", *args)
    assert code == exit_code and words in data["error"] and "\n" not in data["error"], data
    assert user_state(repo) == state


def test_a_plan_target_outside_the_fence_is_refused(screened):
    repo, _before, _code, _data, _text = screened
    plan = repo / "sandbox/outside.yaml"
    plan.write_text(yaml.safe_dump({"tries": [{"optimization": "x", "files": {"README.md": "sandbox/cand/fast.py"}}]}))
    code, data, _ = call(repo, "screen", str(plan))
    assert code == 2 and "not in the session's fence" in data["error"], data


def test_screen_before_a_baseline_is_refused(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", "60")
    assert code == 0, data
    allow_no_gpu(repo)
    (repo / "sandbox/cand").mkdir(parents=True)
    (repo / "sandbox/cand/a.py").write_text(kernel_source())
    code, data, _ = call(repo, "screen", "sandbox/cand/*.py")
    assert code == 3 and "no baseline" in data["error"], data


def test_compile_one_finds_a_syntax_error_without_any_session(tmp_path):
    (tmp_path / "cand.py").write_text("def f(:\n")
    state, detail = compile_one(tmp_path, [("src/pkg/k.py", "cand.py")])
    assert state == NOT_COMPILED and "SyntaxError" in detail and "line 1" in detail


def test_throwaway_refs_go_even_when_the_screen_fails(tilegym_like_repo):
    repo = tilegym_like_repo
    g = git_ops.open_repo(repo)
    head = git_ops.head(g)
    g.git.update_ref(screen_commits.REF_PREFIX + "9", head)  # left by a killed screen
    (repo / "cand.py").write_text("# candidate\n")
    index = (repo / ".git/index").read_bytes()
    candidates = [("a", [(KERNEL_REL, repo / "cand.py")])]
    with pytest.raises(RuntimeError), screen_commits.throwaway_commits(g, head, candidates) as commits:
        assert screen_commits.screen_refs(g) == [screen_commits.REF_PREFIX + "1"]
        assert git_ops.blob_bytes(g, git_ops.blob_sha_at(g, commits["a"], KERNEL_REL)) == b"# candidate\n"
        assert git_ops.is_ancestor(g, head, commits["a"])
        raise RuntimeError("the screen failed")
    assert screen_commits.screen_refs(g) == []
    assert (repo / ".git/index").read_bytes() == index and git_ops.head(g) == head


def test_candidates_that_cannot_be_ranked_in_the_seconds_given_are_not_screened(tilegym_like_repo):
    """At this session's stage times (the baseline's), ``--seconds 1`` fits the first ranking of one
    candidate: it is ranked, the others are listed as not screened and no child of theirs runs."""
    repo, _cand = baselined_with_candidates(tilegym_like_repo.parent / "short", LATENCY)
    code, data, _text = call(repo, "screen", "sandbox/cand/*.py", "--seconds", "1")
    assert code == 0, data
    ranked, skipped = [r["name"] for r in data["ranked"]], data["not_ranked"]
    assert ranked == ["fast"], data  # the first in the glob's order
    assert {name for name, v in skipped.items() if v["state"] == "not screened"} == {"mid", "slow", "wrong"}
    assert "give more --seconds" in skipped["mid"]["why"]
    assert len(list((repo / "sandbox/runs").glob("screen-c*-correctness.log"))) == 1


def test_cases_times_every_run_on_part_of_the_base_cases(tilegym_like_repo):
    """``--cases 1`` on the fixture's two cases: the middle one by the base's latency (256x1024, the
    faster of two), every timed run of the round selects it alone, and the reading rests on it."""
    repo, _cand = baselined_with_candidates(tilegym_like_repo.parent / "cases", {"fast": LATENCY["fast"]})
    code, data, _ = call(repo, "screen", "sandbox/cand/fast.py", "--cases", "1")
    assert code == 0, data
    assert data["cases"] == {"timed": ["256x1024"], "of": 2}, data
    (reading,) = data["ranked"]
    assert list(reading["cases"]) == ["256x1024"] and reading["cases"]["256x1024"] == pytest.approx(0.5, rel=0.2)
    assert "Timed on 1 of the base's 2 cases" in (repo / data["table"]).read_text()
    logs = sorted((repo / "sandbox/runs").glob("screen-r1-*-perf.log"))
    assert len(logs) == 2, logs  # the base's run and the candidate's, each of the one case
    for log in logs:
        body = log.read_text()
        assert "256x1024" in body and "4096x1024" not in body, log

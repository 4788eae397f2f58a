"""Each try's correctness child started during the try before it (``stages.Relay``), on CPU.

The batch runs through the real CLI on the SIMULATED TileGym-shaped repository of
``fixtures_repo`` (its fake tests need no GPU), in the box.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from fixtures_repo import KERNEL_REL, TEST_REL, allow_no_gpu, build_tilegym_like_repo, git, kernel_source

from cutile_perf.child import box, pristine, runner
from cutile_perf.cli import main
from cutile_perf.loop import stages

PY = sys.executable
BASE = {"256x1024": 1.0, "4096x1024": 2.0}
FAST = {"256x1024": 0.5, "4096x1024": 1.0}
SLOW = {"256x1024": 1.5, "4096x1024": 3.0}
AHEAD = pytest.mark.skipif(box.available() is not None or sys.version_info < (3, 11),
                           reason="runs start ahead of their turn only in the box, on Python 3.11 or later (-P)")


def _cli(capsys, repo: Path, *args: str) -> tuple[int, dict]:
    code = main([args[0], "--repo", str(repo), "--json", *args[1:]])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


def _plan(repo: Path, sources: list[tuple[str, str]]) -> Path:
    (repo / "sandbox/cand").mkdir(parents=True, exist_ok=True)
    tries = []
    for n, (name, source) in enumerate(sources, 1):
        (repo / f"sandbox/cand/c{n}.py").write_text(source)
        tries.append({"optimization": name, "files": {KERNEL_REL: f"sandbox/cand/c{n}.py"}})
    path = repo / "sandbox/plan.yaml"
    path.write_text(yaml.safe_dump({"tries": tries}))
    return path


def _first_line(repo: Path, tag: str) -> str | None:
    log = repo / "sandbox" / "runs" / f"{tag}-correctness.log"
    return log.read_text().splitlines()[0] if log.exists() else None


def _session(tmp_path, capsys, monkeypatch, perf_checks_results: bool = True) -> tuple[Path, Path]:
    """A session (perf child pre-started, as init writes by default) with its baseline recorded, on
    a machine that counts as having CPUs to spare; checkouts go to a temp folder of the test's own.
    ``perf_checks_results=False``: the perf tests time the kernel without checking its results (as
    many real perf tests do), so a wrong kernel is caught by the correctness run alone."""
    monkeypatch.setattr(stages, "SPECULATIVE_MIN_CPUS", 1)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    repo = build_tilegym_like_repo(tmp_path)
    if not perf_checks_results:
        test = repo / TEST_REL
        text = test.read_text()
        head, perf = text.split("def test_perf(", 1)
        test.write_text(head + "def test_perf(" + perf.replace("    _behave()\n", "    time.sleep(kernel.SLEEP_S)\n", 1))
        git(repo, "commit", "-q", "-am", "perf tests time without checking results")
    assert _cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "120")[0] == 0
    allow_no_gpu(repo)
    assert _cli(capsys, repo, "baseline", "--repeats", "2")[0] == 0
    return repo, temp


@pytest.fixture
def relay_session(tmp_path, capsys, monkeypatch):
    return _session(tmp_path, capsys, monkeypatch)


@pytest.mark.slow
@AHEAD
def test_each_try_of_a_batch_after_the_first_gets_a_correctness_child_started_during_the_try_before(
        relay_session, capsys):
    repo, temp = relay_session
    wrong = kernel_source(FAST, behaviour="wrong")
    path = _plan(repo, [("faster", kernel_source(FAST)), ("fast but wrong", wrong), ("slower", kernel_source(SLOW))])
    code, data = _cli(capsys, repo, "batch", str(path))
    assert code == 0, data
    assert [e["decision"] for e in data["entries"]] == ["keep", "revert", "revert"], data
    rows = [json.loads(line) for line in (repo / "sandbox/experiments.jsonl").read_text().splitlines()]
    assert [r["correctness"] for r in rows[1:]] == ["PASS", "FAIL", "PASS"]
    # The first try's child had no try before it in this command; the others were started then.
    assert "(started ahead of its turn)" not in _first_line(repo, "1")
    assert all("(started ahead of its turn)" in _first_line(repo, tag) for tag in ("2", "3"))
    # The last try wanted none after it, and nothing of the relay outlives the command.
    assert _first_line(repo, "4") is None
    assert not list(temp.glob("cutile-perf-relay-*"))


@pytest.mark.slow
@AHEAD
def test_a_relayed_correctness_child_has_no_gate_before_its_first_test(relay_session, capsys, monkeypatch):
    """The plugin's gate before the first test is a perf child's: a child given it sets up the CUDA
    profiler and its first test waits for that (``pytest_plugin.Gate``). On the H200 that made the
    relayed correctness runs slower than fresh ones (14-18 s against 9-11 s, session 26's A/B)."""
    from cutile_perf.child import measure

    repo, _ = relay_session
    real, launched = measure.run_stage, []

    def spy(session, name, tag, deadline, **kw):
        launched.append((name, tag, kw.get("start") is not None, kw.get("gate") is not None))
        return real(session, name, tag, deadline, **kw)

    monkeypatch.setattr(measure, "run_stage", spy)
    path = _plan(repo, [("faster", kernel_source(FAST)), ("slower", kernel_source(SLOW))])
    code, data = _cli(capsys, repo, "batch", str(path))
    assert code == 0, data
    assert "(started ahead of its turn)" in _first_line(repo, "2")
    relayed = [entry for entry in launched if entry[0] == "correctness" and entry[2]]
    assert relayed and not any(gated for *_, gated in relayed), launched
    assert any(gated for name, _, _, gated in launched if name == "perf"), launched


@pytest.mark.slow
@AHEAD
@pytest.mark.parametrize("rebuilt", [True, False], ids=["rebuilt", "without-rebuild"])
def test_a_relayed_correctness_child_tests_the_commit_it_is_let_go_for(tmp_path, capsys, monkeypatch, rebuilt):
    """Red team. The next try's correctness child starts in a checkout of the current try's commit
    (a correct kernel here), before the next candidate exists. Let go without its checkout rebuilt
    from the claiming commit, it would test the kernel it was started with, and a wrong candidate
    would pass its correctness run. ``without-rebuild`` shows that."""
    repo, _ = _session(tmp_path, capsys, monkeypatch, perf_checks_results=False)
    if not rebuilt:
        real = pristine.build

        def stale(g, *, in_place=False, **kw):
            if not in_place:
                return real(g, **kw)
            kept = real(g, **{**kw, "fenced_from": kw["protected_from"]}, in_place=True)  # the base kernel, correct
            return kept
        monkeypatch.setattr(pristine, "build", stale)
    path = _plan(repo, [("faster", kernel_source(FAST)), ("fast but wrong", kernel_source(FAST, behaviour="wrong"))])
    code, data = _cli(capsys, repo, "batch", str(path))
    assert code == 0, data
    assert "(started ahead of its turn)" in _first_line(repo, "2")
    second = data["entries"][1]["decision"]
    assert second == ("revert" if rebuilt else "keep"), data


# --- the timeout of a child held ahead of its turn -----------------------------------------------------

SLEEPY_TEST = "import time\n\ndef test_sleeps():\n    time.sleep({s})\n"


def _held(tmp_path: Path, test_sleep_s: float, launch_timeout_s: float):
    (tmp_path / "test_sleepy.py").write_text(SLEEPY_TEST.format(s=test_sleep_s))
    start, done = runner.StartGate(), {}

    def go():
        done["result"] = runner.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_sleepy.py"],
                                    cwd=tmp_path, timeout_s=launch_timeout_s, output_path=tmp_path / "child.log",
                                    env_overrides={"PYTHONDONTWRITEBYTECODE": "1"}, start=start)

    thread = threading.Thread(target=go)
    thread.start()
    assert start.wait_ready(120, ended=lambda: not thread.is_alive())
    return start, done, thread


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a child starts ahead of its turn on Python 3.11 or later (-P)")
@pytest.mark.parametrize("allowed, timed_out", [(30.0, False), (0.5, True)])
def test_a_held_childs_timeout_counts_from_its_release_and_is_the_one_its_opener_sets(tmp_path, allowed, timed_out):
    """In a batch a correctness child may wait through a whole try: that wait is no part of its
    run. Launched with 1 s and held 2 s, it still runs a 2 s test when let go with 30 s; let go
    with 0.5 s it is killed."""
    start, done, thread = _held(tmp_path, test_sleep_s=2.0, launch_timeout_s=1.0)
    try:
        time.sleep(2.0)
        assert thread.is_alive(), (tmp_path / "child.log").read_text()
        start.timeout_s = allowed
        start.open()
    finally:
        start.close()
        thread.join(120)
        start.done()
    result = done["result"]
    assert result.timed_out == timed_out, (tmp_path / "child.log").read_text()
    if not timed_out:
        assert result.ok


def test_building_a_checkout_in_place_keeps_the_folder_and_empties_it(tmp_path):
    """A waiting child's box bound the folder itself: a new folder at the same path would never
    reach it, and nothing left in the old one may stay."""
    root = tmp_path / "slot"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "planted.py").write_text("x = 1\n")
    (root / "link").symlink_to(tmp_path)
    inode = os.stat(root).st_ino

    class NoGit:  # composed_entries reads no tree: an empty commit
        pass

    real = pristine.composed_entries
    try:
        pristine.composed_entries = lambda *a, **k: []
        built = pristine.build(NoGit(), protected_from="a", fenced_from="b", fence=(), root=root, in_place=True)
    finally:
        pristine.composed_entries = real
    assert os.stat(root).st_ino == inode
    assert list(root.iterdir()) == [] and built.written == ()
    assert tmp_path.exists()  # the link was removed, not followed

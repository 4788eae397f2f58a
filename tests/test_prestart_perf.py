"""Spare perf children (``prestart_perf``, on by default since issue 21; ``child.pool``), on CPU.

``runner.Gate`` is tested with a plain child; the loop runs through the real CLI on the SIMULATED
TileGym-shaped repository of ``fixtures_repo`` (its fake tests need no GPU).
"""
from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures_repo import TEST_REL, build_tilegym_like_repo, edit_kernel, git
from redteam_helpers import (FAST, append_to_kernel, assert_not_kept_nothing_lost, call, reap, rows,  # noqa: F401 - reap: a fixture
                             snapshot, spawn, start_session, wait_until)

from cutile_perf.child import box, runner
from cutile_perf.loop import stages

READ_GATE = "import os; print(repr(os.read(int(os.environ['CUTILE_PERF_GATE_FD']), 1)))"


@pytest.mark.parametrize("opened, seen", [(True, "b'1'"), (False, "b''")])
def test_a_gated_child_waits_until_the_gate_opens_or_closes(tmp_path, opened, seen):
    gate = runner.Gate()
    timer = threading.Timer(0.5, gate.open if opened else gate.close)
    start = time.monotonic()
    timer.start()
    result = runner.run([sys.executable, "-c", READ_GATE], cwd=tmp_path, timeout_s=30,
                        output_path=tmp_path / "out.log", gate=gate)
    assert result.ok and seen in result.tail()
    assert time.monotonic() - start >= 0.4  # it waited for the gate
    assert (gate.opened_at is not None) == opened


def test_opening_the_gate_of_a_child_that_already_ended_is_harmless(tmp_path):
    gate = runner.Gate()
    result = runner.run([sys.executable, "-c", "pass"], cwd=tmp_path, timeout_s=30, output_path=tmp_path / "o.log",
                        gate=gate)
    assert result.ok
    gate.open()  # no reader left: BrokenPipeError is swallowed
    gate.close()


# A child whose profiler warm-up takes 1 s and whose collection takes 0.5 s, each noting when.
WARM_UP_CONFTEST = """
import os, time
from cutile_perf import bench

def _note(what):
    with open(os.environ["PHASES_LOG"], "a") as fh:
        fh.write(f"{what} {time.time()!r}\\n")

def _slow_warm_up():
    _note("warm-up-start")
    time.sleep(1.0)
    _note("warm-up-end")
    return True

bench.warm_up_profiler = _slow_warm_up
bench.cuda_host = lambda: True  # the warm-up runs on a GPU host only: this simulates one
"""
WARM_UP_TEST = """
import time
from conftest import _note

_note("collected")
time.sleep(0.5)

def test_first():
    _note("first-test")
"""


def test_the_profiler_warm_up_runs_beside_collection_and_the_first_test_waits_for_it(tmp_path):
    (tmp_path / "conftest.py").write_text(WARM_UP_CONFTEST)
    (tmp_path / "test_phases.py").write_text(WARM_UP_TEST)
    log = tmp_path / "phases.log"
    gate = runner.Gate()
    gate.open()  # the byte waits in the pipe: the child goes on as soon as it reads it
    result = runner.run([sys.executable, "-m", "pytest", "-q", "-p", "cutile_perf.pytest_plugin", "test_phases.py"],
                        cwd=tmp_path, timeout_s=120, output_path=tmp_path / "out.log", gate=gate,
                        env_overrides={"PHASES_LOG": str(log)})
    assert result.ok, result.tail()
    at = {line.split()[0]: float(line.split()[1]) for line in log.read_text().splitlines()}
    assert at["warm-up-start"] < at["collected"] < at["warm-up-end"]  # beside collection
    assert at["first-test"] >= at["warm-up-end"]  # and over before the first test


def _prestarted_session(tmp_path: Path) -> Path:
    repo = build_tilegym_like_repo(tmp_path)
    start_session(repo, init_args=("--prestart-perf",))
    return repo


def _perf_report_lines(repo: Path, iteration: int) -> list[dict]:
    path = repo / "sandbox" / "runs" / f"{iteration}-perf.report.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_prestarted_perf_child_measures_a_faster_kernel_and_it_is_kept(tmp_path):
    repo = _prestarted_session(tmp_path)
    edit_kernel(repo, latency=FAST)
    code, data, _ = call(repo, "try", "faster, perf child pre-started")
    assert code == 0, data
    row = rows(repo)[-1]
    assert (row["status"], row["correctness"]) == ("keep", "PASS")
    records = [line for line in _perf_report_lines(repo, row["iteration"]) if line["type"] == "record"]
    assert len(records) == 2  # one per perf shape, from the pre-started child, timing the candidate
    assert {r["nodeid"].split("[")[1].split("-")[0]: round(r["benchmark"]["cutile"]["forward"]["median"], 1)
            for r in records} == FAST


@pytest.mark.slow
def test_when_correctness_fails_no_perf_test_runs(tmp_path):
    repo = _prestarted_session(tmp_path)
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST, behaviour="wrong")
    code, _data, _ = call(repo, "try", "faster but wrong")
    row = assert_not_kept_nothing_lost(repo, before, code)
    assert (row["status"], row["correctness"]) == ("revert", "FAIL"), row
    ran = [line for line in _perf_report_lines(repo, row["iteration"]) if line["type"] in ("test", "record")]
    assert ran == []  # the spare was cancelled before any code of the repository


# Red team: the kernel registers a plugin that edits a protected test file when the first perf test
# starts: after the correctness stage has checked the protected files, inside the perf child.
# {root}: the user's repository (unboxed) or the checkout the kernel was imported from (boxed).
LATE_TAMPER = '''
# ATTACK late-tamper
import inspect as _inspect
import pathlib as _pathlib

import pytest as _pytest


class _LateEdit:
    @_pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if item.name.startswith("test_perf"):
            with open({root} + "/{test}", "a") as _fh:
                _fh.write("\\n# tampered after the correctness run\\n")


for _frame in _inspect.stack():
    _cfg = getattr(_frame.frame.f_locals.get("self"), "config", None)
    if _cfg is not None and hasattr(_cfg, "pluginmanager"):
        if not _cfg.pluginmanager.has_plugin("late-edit"):
            _cfg.pluginmanager.register(_LateEdit(), "late-edit")
        break
'''


@pytest.mark.usefixtures("runtime_defences_only")
@pytest.mark.slow
def test_a_protected_file_changed_after_the_correctness_check_is_caught(tmp_path, capsys):
    repo = _prestarted_session(tmp_path)
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST)
    # In the box the user's repository is hidden: the edit goes to the perf child's own checkout.
    root = "str(_pathlib.Path(__file__).resolve().parents[4])"
    append_to_kernel(repo, LATE_TAMPER.replace("{test}", TEST_REL).replace("{root}", root))
    code, _data, _ = call(repo, "try", "faster, with a late edit of the tests")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK late-tamper")
    assert (row["status"], row.get("crash_class")) == ("crash", "tampered"), row
    assert "perf run" in row.get("reason", ""), row.get("reason")  # caught by the perf stage's own check


@pytest.mark.usefixtures("runtime_defences_only")
@pytest.mark.slow
def test_unboxed_the_perf_child_waits_for_the_correctness_run_and_a_late_edit_is_still_caught(
        tmp_path, monkeypatch, capsys):
    """Without the box two children of the candidate could reach each other's checkout, so no perf
    child starts as a spare (and the harness says why); the edit of the user's test file is caught."""
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "off")
    repo = _prestarted_session(tmp_path)
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST)
    append_to_kernel(repo, LATE_TAMPER.replace("{test}", TEST_REL).replace("{root}", "__REPO__"))
    code, _data, _ = call(repo, "try", "faster, with a late edit of the tests")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK late-tamper")
    assert (row["status"], row.get("crash_class")) == ("crash", "tampered"), row
    err = capsys.readouterr().err
    # once for the baseline's runner, once for the try's
    assert err.count("no spare perf child: its children run without the sandbox") == 2, err


@pytest.mark.parametrize("perf_cmd", ['{python} -m pytest {test} -n 4 -k test_perf', '{python} -m pytest {test} -n4',
                                      '{python} -m pytest {test} --numprocesses=auto'])
def test_prestart_with_an_xdist_perf_command_is_refused(tmp_path, perf_cmd):
    """The gate holds the main pytest process; xdist workers would start timing during correctness."""
    from fixtures_repo import edit_session

    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--prestart-perf")
    assert code == 0, data
    edit_session(repo, perf_cmd=perf_cmd)
    code, data, _ = call(repo, "status")
    assert code == 2 and "prestart_perf needs a perf command without pytest-xdist" in json.dumps(data)


@pytest.mark.parametrize("flags, written", [((), True), (("--no-prestart-perf",), False), (("--prestart-perf",), True)])
def test_init_pre_starts_the_perf_child_by_default(tmp_path, flags, written):
    """On by default where it is safe; a session.yaml written before (no key) keeps it off."""
    import yaml

    from cutile_perf.store import session as session_mod

    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", *flags)
    assert code == 0, data
    assert yaml.safe_load((repo / "sandbox/session.yaml").read_text())["prestart_perf"] is written
    assert session_mod.load(repo).prestart_perf is written
    text = (repo / "sandbox/session.yaml").read_text()
    (repo / "sandbox/session.yaml").write_text("".join(line for line in text.splitlines(keepends=True)
                                                       if not line.startswith("prestart_perf:")))
    assert session_mod.load(repo).prestart_perf is False


# --- spares: runs started ahead of their turn (``child.warmstart``) --------------------------------

# Candidate code: ``_to_perf_log(text)`` writes into the perf log its child runs under, found through
# its open descriptors (an attacker's way), the folder spelled so that the static scan of `try` does
# not see it.
TO_PERF_LOG = '''
import os as _os
def _to_perf_log(_text):
    _fds = bytes([47, 112, 114, 111, 99, 47, 115, 101, 108, 102, 47, 102, 100]).decode()
    for _fd in _os.listdir(_fds):
        try:
            _target = _os.readlink(_fds + "/" + _fd)
        except OSError:
            continue
        if _target.endswith("-perf.log"):
            _os.write(int(_fd), _text.encode())
'''
# The candidate's kernel module, at import, writes the time into its perf log: when its code first
# ran, as the log records it.
IMPORT_TIME_TO_LOG = TO_PERF_LOG + '''
import time as _time
_to_perf_log(f"\\nKERNEL-IMPORTED-AT {_time.time()!r}\\n")
'''
BORDERLINE = {"256x1024": 1.01, "4096x1024": 2.0}  # +1 % on one case: inside the gate, past the re-check bound
AHEAD = pytest.mark.skipif(box.available() is not None or sys.version_info < (3, 11),
                           reason="runs start ahead of their turn only in the box, on Python 3.11 or later (-P)")


def _slow_tests_session(tmp_path: Path) -> Path:
    """A session whose perf tests each sleep 1 s after collection, so that a timed run lasts well
    beyond the start-up of a child started beside it."""
    repo = build_tilegym_like_repo(tmp_path)
    edit_kernel(repo, sleep=1.0)
    git(repo, "commit", "-q", "-am", "tests take a second each")
    # The simulated runs barely vary, so most re-checks would settle after their first pair
    # (``recheck.settled_early``); the tests below are about each of the six runs of a whole one.
    # A budget well beyond the tries' need: on a loaded 2-CPU machine a try with a whole re-check
    # (eight children, each test sleeping 1 s) ran past 60 s and ended as a timeout crash.
    start_session(repo, repeats=3, timeout="300", thresholds={"settle_sd": 0.0})
    return repo


def _import_times(log: Path) -> list[float]:
    return [float(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("KERNEL-IMPORTED-AT")]


@pytest.mark.slow
@AHEAD
def test_each_run_of_the_recheck_after_the_first_is_a_spare_that_runs_the_cases_in_doubt(tmp_path):
    repo = _slow_tests_session(tmp_path)
    runs = repo / "sandbox" / "runs"
    # the baseline's perf runs all start as spares, with the correctness run
    assert all("(started ahead of its turn)" in (runs / f"0-r{k}-perf.log").read_text().splitlines()[0]
               for k in (1, 2, 3))
    # What the baseline's perf runs imported from installed code (torch's own lazy imports at least),
    # never the repository's package: every spare imports it while it waits.
    preload = rows(repo)[0]["preload"]
    assert preload and "fakegym" not in preload and "tests" not in preload, preload
    edit_kernel(repo, latency={"256x1024": 2.0, "4096x1024": 4.0})
    code, data, _ = call(repo, "try", "twice as slow: its perf run decides")
    assert rows(repo)[-1]["status"] == "revert" and not rows(repo)[-1].get("confirm"), rows(repo)[-1]
    assert not list(runs.glob("1-confirm*")), "a re-check run that never happened left a log"
    edit_kernel(repo, latency=BORDERLINE)
    code, data, _ = call(repo, "try", "one case 1 % slower: the re-check decides")
    row = rows(repo)[-1]
    assert row["iteration"] == 2 and row.get("confirm"), row  # the interleaved re-check ran
    confirm = sorted(runs.glob("2-confirm*-perf.log"))
    assert len(confirm) == 6, confirm
    ahead = {log.name for log in confirm if "(started ahead of its turn)" in log.read_text().splitlines()[0]}
    assert ahead == {log.name for log in confirm} - {"2-confirm1-base-perf.log"}
    assert all("the baseline's tests imported" in (runs / name).read_text() for name in ahead)
    # Started before the cases were named, each ran only the one in doubt (handed over when let go).
    for log in confirm:
        records = [json.loads(line) for line in log.with_suffix(".report.jsonl").read_text().splitlines()]
        shapes = {r["nodeid"].split("[")[1].split("-")[0] for r in records if r["type"] == "record"}
        assert shapes == {"256x1024"}, (log.name, shapes)
    assert row["status"] == "revert", row["reason"]  # 1 % slower in every pair: the slowdown test says so
    assert row["timings"]["recheck_runs"] == 6


@pytest.mark.slow
@AHEAD
def test_spares_not_parked_in_time_are_ended_and_each_run_starts_fresh(tmp_path, monkeypatch, capsys):
    repo = _slow_tests_session(tmp_path)
    # No spare is ever seen parked. A zero wait alone was not enough: a spare started two runs
    # ahead had parked before its turn came, and was rightly used (a fresh-clone run, 2 cores).
    monkeypatch.setattr(stages, "SPARE_READY_S", 0.0)
    monkeypatch.setattr(runner.StartGate, "wait_ready", lambda self, timeout_s, ended: False)
    edit_kernel(repo, latency=BORDERLINE)
    code, data, _ = call(repo, "try", "one case 1 % slower, no spare is parked in time")
    row = rows(repo)[-1]
    assert row["status"] == "revert" and row["timings"]["recheck_runs"] == 6, row  # the same verdict
    runs = repo / "sandbox" / "runs"
    assert not [log.name for log in runs.glob("1-confirm*-perf.log")
                if "(started ahead of its turn)" in log.read_text().splitlines()[0]]
    assert "was not parked in time; it is ended and its run will start fresh" in capsys.readouterr().err


@pytest.mark.slow
@AHEAD
@pytest.mark.parametrize("guarded", [True, False], ids=["warmstart", "without-warmstart"])
def test_a_candidate_started_ahead_runs_none_of_its_code_while_the_baseline_is_timed(tmp_path, monkeypatch, guarded):
    """Red team. The interleaved re-check starts the candidate's child while the baseline's run
    times. Had the candidate's code run then (its kernel module imports at collection), it could
    load the machine to slow the baseline down and look faster in every pair. Its first line of
    code must run only after the baseline's child has ended.

    ``without-warmstart`` shows what the test sees when the guard is gone: the child started ahead
    runs plain ``python -m pytest``, held only before its first test (after collection)."""
    repo = _slow_tests_session(tmp_path)
    edit_kernel(repo, latency=BORDERLINE)
    append_to_kernel(repo, IMPORT_TIME_TO_LOG)
    if not guarded:
        # plain pytest in the checkout (a child started ahead begins in "/" and is told where to go)
        monkeypatch.setattr(runner.warmstart, "warm_argv",
                            lambda argv: ["/bin/sh", "-c", 'cd "$CUTILE_PERF_LATE_CWD" && exec "$@"', "sh", *argv])
        monkeypatch.setattr(runner.StartGate, "wait_ready", lambda self, timeout_s, ended: True)
    code, data, _ = call(repo, "try", "borderline, and its module runs at import")
    assert code in (0, 1), data
    runs = repo / "sandbox" / "runs"
    assert rows(repo)[-1].get("confirm"), rows(repo)[-1]  # the re-check ran
    base_ended = (runs / "1-confirm1-base-perf.log").stat().st_mtime
    first_code = min(_import_times(runs / "1-confirm1-cand-perf.log"))
    if guarded:
        assert first_code >= base_ended, f"candidate code ran {base_ended - first_code:.2f} s before the baseline ended"
    else:
        assert first_code < base_ended  # beside the baseline's timed tests: what the guard prevents


# The candidate's kernel module, at import, writes into its perf log whether a file it leaves next to
# itself is already there (left by an earlier run in the same checkout), then leaves it.
PLANT_AND_LOOK = TO_PERF_LOG + '''
_plant = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "left_by_an_earlier_run.txt")
_to_perf_log(f"\\nPLANT-SEEN {_os.path.exists(_plant)}\\n")
try:
    with open(_plant, "w") as _f:
        _f.write("planted")
except OSError:
    pass
'''


@pytest.mark.slow
@AHEAD
@pytest.mark.parametrize("swept_when", ["let-go", "started"])
def test_what_a_recheck_run_leaves_in_its_checkout_never_reaches_the_next_run_started_beside_it(
        tmp_path, monkeypatch, swept_when):
    """Red team. The re-check's runs of one commit share its checkout, and the later ones start
    while an earlier one still runs in it. A file an earlier run plants there (a conftest, a
    bytecode cache) must not reach a later one: the checkout is swept when a child is let go, not
    when it starts. ``started`` shows what the test sees with the sweep done at the start."""
    repo = _slow_tests_session(tmp_path)
    edit_kernel(repo, latency=BORDERLINE)
    append_to_kernel(repo, PLANT_AND_LOOK)
    if swept_when == "started":
        monkeypatch.setattr(runner.StartGate, "on_open", lambda self, step: step())
    code, data, _ = call(repo, "try", "borderline, and it leaves a file beside its module")
    assert code in (0, 1), data
    assert rows(repo)[-1].get("confirm"), rows(repo)[-1]  # the re-check ran
    runs = repo / "sandbox" / "runs"
    seen = {k: (runs / f"1-confirm{k}-cand-perf.log").read_text() for k in (1, 2, 3)}
    assert all("PLANT-SEEN" in text for text in seen.values())  # the candidate's code ran in each
    planted_before = [k for k, text in seen.items() if "PLANT-SEEN True" in text]
    if swept_when == "let-go":
        assert planted_before == []
    else:
        # started beside the run before it, and swept before that run planted
        assert {2, 3} <= set(planted_before), planted_before


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (by parent links; Linux only)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


# The candidate's re-check runs hang (its module finds its own log through its open descriptors,
# as IMPORT_TIME_TO_LOG does, and says so there): only an interrupt ends them before their time limit.
HANG_IN_RECHECK = '''
import os as _os
_fds = bytes([47, 112, 114, 111, 99, 47, 115, 101, 108, 102, 47, 102, 100]).decode()
for _fd in _os.listdir(_fds):
    try:
        if "-confirm" in _os.readlink(_fds + "/" + _fd):
            SLEEP_S = 300.0
            _os.write(int(_fd), b"\\nHANGING\\n")
    except OSError:
        pass
'''


@pytest.mark.slow
@AHEAD
def test_ctrl_c_during_a_recheck_run_ends_the_running_child_and_the_one_started_ahead(tmp_path, reap):
    """The running child and the one started ahead live in worker threads: an interrupt of the main
    thread must end both at once (as it ends a child run in the main thread), not wait for the
    running one to finish, and leave nothing kept."""
    repo = _slow_tests_session(tmp_path)
    before = snapshot(repo)
    edit_kernel(repo, latency=BORDERLINE)
    append_to_kernel(repo, HANG_IN_RECHECK)
    proc = spawn(repo, "try", "interrupted during the re-check")
    # confirm2-base is a spare (started with the re-check's first run) and waits while the
    # candidate's first re-check run (hanging) runs
    runs = repo / "sandbox" / "runs"
    ahead_log, hanging_log = runs / "1-confirm2-base-perf.log", runs / "1-confirm1-cand-perf.log"
    deadline = time.monotonic() + 120
    while not (hanging_log.exists() and "HANGING" in hanging_log.read_text()) \
            and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    children = _descendants(proc.pid)
    reap.extend(children)
    assert proc.poll() is None and ahead_log.exists() and len(children) >= 2, (proc.poll(), proc.poll() is not None and proc.communicate())
    interrupted = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)  # not the 300 s the running child would take
    assert proc.returncode in (130, -signal.SIGINT), proc.returncode
    assert time.monotonic() - interrupted < 30
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not any(_alive(p) for p in children), 5.0)
    assert not [p for p in children if _alive(p)], "children left running after Ctrl-C"
    call(repo, "resume")
    assert_not_kept_nothing_lost(repo, before, marker="SLEEP_S = 300.0")

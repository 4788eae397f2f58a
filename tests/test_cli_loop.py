"""End to end: the real CLI and real pytest children on the simulated TileGym-shaped repository.

Every scenario goes through ``cli.main`` (or ``python -m cutile_perf`` where a process must be
killed) and the pytest subprocesses the harness starts; the simulated kernel's constants decide
what its fake tests do (see tests/fixtures_repo.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fixtures_repo import (  # noqa: F401
    KERNEL_REL, TEST_REL, allow_no_gpu, edit_kernel, edit_session, git, tilegym_like_repo)

from cutile_perf.cli import main
from cutile_perf.judge.rules import Thresholds

FAST = {"256x1024": 0.5, "4096x1024": 1.0}
SLOW = {"256x1024": 1.5, "4096x1024": 3.0}


def cli(capsys, repo: Path, command: str, *args: str) -> tuple[int, dict]:
    code = main([command, "--repo", str(repo), "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def entries(repo: Path) -> list[dict]:
    return [json.loads(line) for line in (repo / "sandbox/experiments.jsonl").read_text().splitlines() if line]


def start_session(repo: Path, capsys, **session_edits) -> Path:
    """``init``, then ``session_edits`` to session.yaml (frozen by the baseline after that), then a
    2-run ``baseline``."""
    # 300 s: a whole re-check (six children) ran past 60 s on a loaded 2-CPU machine.
    code, data = cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "300")
    assert code == 0, data
    allow_no_gpu(repo)
    if session_edits:
        edit_session(repo, **session_edits)
    code, data = cli(capsys, repo, "baseline", "--repeats", "2")
    assert code == 0, data
    return repo


@pytest.fixture
def session_repo(tilegym_like_repo, capsys):
    """The simulated repo after ``init`` and a 2-run ``baseline``."""
    return start_session(tilegym_like_repo, capsys)


@pytest.fixture
def session_repo_all_pairs(tilegym_like_repo, capsys):
    """``session_repo`` whose re-checks run every pair: the simulated runs barely vary, so most
    would settle after their first (``recheck.settled_early``)."""
    return start_session(tilegym_like_repo, capsys, thresholds={"settle_sd": 0.0})


def test_init_creates_branch_session_and_ignores_sandbox(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    code, data = cli(capsys, repo, "init", "--kernel", "rmsnorm")
    assert code == 0
    assert data["branch"].startswith("cutile-perf-rms_norm-") and len(data["branch"]) == len("cutile-perf-rms_norm-") + 8
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == data["branch"]
    assert data["fence"] == [KERNEL_REL] and data["test"] == TEST_REL
    assert data["scan"]["kernel_type"] == "reduction-norm" and data["scan"]["bound"] == "memory-bound"
    assert data["playbook"][0] == "M"  # read each input once: the measured first step for row kernels
    session = yaml.safe_load((repo / "sandbox/session.yaml").read_text())
    assert session["thresholds"] == Thresholds().to_dict() and "{python}" in session["perf_cmd"]
    assert (repo / "sandbox/perf_results.md").exists()
    assert git(repo, "status", "--porcelain").strip() == ""  # sandbox/ is excluded, nothing committed
    assert "sandbox/" in (repo / ".git/info/exclude").read_text()
    # A second init on the same repo is refused; so is reusing an existing branch name.
    assert cli(capsys, repo, "init", "--kernel", "rms_norm")[0] == 3


def test_init_refuses_a_dirty_tree_and_changes_nothing(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    (repo / "README.md").write_text("my unsaved work\n")
    code, data = cli(capsys, repo, "init", "--kernel", "rms_norm")
    assert code == 3 and "uncommitted" in data["error"]
    assert (repo / "README.md").read_text() == "my unsaved work\n"
    assert not (repo / "sandbox").exists()
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"


def test_init_bad_kernel_name_is_one_line_usage_error(tilegym_like_repo, capsys):
    code, data = cli(capsys, tilegym_like_repo, "init", "--kernel", "softmax")
    assert code == 2 and "no kernel named" in data["error"]


def test_keep_then_revert_then_stop(session_repo, capsys):
    repo = session_repo
    base = head(repo)
    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", "B: persistent grid")
    assert (code, data["decision"]) == (0, "keep"), data
    kept = head(repo)
    assert kept != base and "persistent grid" in git(repo, "log", "-1", "--format=%s")
    assert git(repo, "status", "--porcelain").strip() == ""

    edit_kernel(repo, latency=SLOW)
    code, data = cli(capsys, repo, "try", "latency hints 10")
    assert (code, data["decision"]) == (1, "revert"), data
    assert data["patch"] == "sandbox/patches/002-latency-hints-10.patch"
    assert "3.0" in (repo / data["patch"]).read_text()
    assert head(repo) == kept and git(repo, "status", "--porcelain").strip() == ""
    assert "0.5" in (repo / KERNEL_REL).read_text()  # the kept version is back

    edit_kernel(repo, behaviour="wrong")
    code, data = cli(capsys, repo, "try", "ftz on rsqrt")
    assert (code, data["decision"], data["crash_class"]) == (1, "revert", "wrong-result")
    assert data["stop"] and "2 iterations in a row" in data["stop"]
    rows = entries(repo)
    assert [r["status"] for r in rows] == ["keep", "keep", "revert", "revert"]
    assert rows[3]["correctness"] == "FAIL"
    for row in rows:
        # perf_s: the perf run(s) of the whole selection, when one ran (not for a wrong result);
        # recheck_s and recheck_runs when the interleaved re-check ran (a keep that moves the reference).
        optional = {"perf_s", "recheck_s", "recheck_runs"}
        assert set(row["timings"]) - optional == {"total_s", "children_s", "harness_s", "stages"}
        assert ("recheck_s" in row["timings"]) == ("recheck_runs" in row["timings"])
        assert ("perf_s" in row["timings"]) == (row["correctness"] == "PASS") and "cuda_tile" in row["env"]
        # Each pytest child is named and timed; together they are the children's share.
        stages = row["timings"]["stages"]
        assert stages and all(isinstance(name, str) and seconds >= 0 for name, seconds in stages)
        assert sum(s for _, s in stages) == pytest.approx(row["timings"]["children_s"], abs=0.01)
    assert [name for name, _ in rows[1]["timings"]["stages"]][:2] == ["1-correctness", "1-perf"]
    table = (repo / "sandbox/perf_results.md").read_text()
    assert "persistent grid" in table and "ftz on rsqrt" in table

    code, data = cli(capsys, repo, "status")
    assert code == 0 and "2 iterations in a row" in data["stop"]
    assert "B" not in data["next"] and "E" not in data["next"] and "H" not in data["next"]
    code, data = cli(capsys, repo, "report")
    assert code == 0 and Path(data["report"]).is_file() and Path(data["plot"]).is_file()
    # The plot is linked relative to the report, so the pair renders wherever it is copied.
    report_text = Path(data["report"]).read_text()
    assert "](running_best.png)" in report_text and str(repo) not in report_text.split("## Running best")[1]


@pytest.mark.parametrize(
    ("edit", "crash_class"),
    [
        ({"behaviour": "fault"}, "fault"),
        ({"behaviour": "no-record"}, "no-record"),
    ],
)
def test_crashes_are_reverted_with_exit_4(session_repo, capsys, edit, crash_class):
    repo = session_repo
    base, original = head(repo), (repo / KERNEL_REL).read_text()
    edit_kernel(repo, **edit)
    code, data = cli(capsys, repo, "try", "something risky")
    assert (code, data["decision"], data["crash_class"]) == (4, "crash", crash_class), data
    assert head(repo) == base and (repo / KERNEL_REL).read_text() == original
    assert (repo / data["patch"]).is_file()


def test_compile_error_is_a_crash(session_repo, capsys):
    repo = session_repo
    with (repo / KERNEL_REL).open("a") as fh:
        fh.write("\ndef broken(:\n")
    code, data = cli(capsys, repo, "try", "unroll")
    assert (code, data["crash_class"]) == (4, "compile"), data
    assert "def broken" not in (repo / KERNEL_REL).read_text()


def test_timeout_kills_the_iteration(tilegym_like_repo, capsys):
    repo = start_session(tilegym_like_repo, capsys, timeout_s=25)
    edit_kernel(repo, sleep=300)
    start = time.monotonic()
    code, data = cli(capsys, repo, "try", "bigger tiles")
    assert (code, data["crash_class"]) == (4, "timeout"), data
    assert time.monotonic() - start < 90
    assert "SLEEP_S = 0.0" in (repo / KERNEL_REL).read_text()


@pytest.mark.usefixtures("runtime_defences_only")
def test_no_tests_collected_is_a_crash(tilegym_like_repo, capsys):
    repo = start_session(tilegym_like_repo, capsys)
    # A kernel edit that makes the correctness selection empty (the simulated tests skip themselves
    # when the kernel says so) is a crash: no test, no evidence.
    text = (repo / KERNEL_REL).read_text() + "\nimport pytest\npytest.skip('no tests here', allow_module_level=True)\n"
    (repo / KERNEL_REL).write_text(text)
    code, data = cli(capsys, repo, "try", "tile size 128")
    assert code == 4 and data["crash_class"] in ("no-tests", "incomplete-tests"), data


def test_edit_of_session_yaml_after_the_baseline_is_refused(session_repo, capsys):
    edit_session(session_repo, correctness_cmd='{python} -m pytest {test} -k "no_such_test" -q')
    edit_kernel(session_repo, latency=FAST)
    code, data = cli(capsys, session_repo, "try", "tile size 128")
    assert code == 3 and "correctness_cmd" in data["error"], data
    assert len(entries(session_repo)) == 1


def test_fence_violation_refuses_and_touches_nothing(session_repo, capsys):
    repo = session_repo
    base = head(repo)
    edit_kernel(repo, latency=FAST)
    (repo / TEST_REL).write_text((repo / TEST_REL).read_text() + "\n# loosen the tolerance\n")
    (repo / "notes.txt").write_text("untracked, outside the fence")
    code, data = cli(capsys, repo, "try", "cheat")
    assert code == 3 and TEST_REL in data["error"] and "notes.txt" in data["error"]
    assert "loosen" in (repo / TEST_REL).read_text() and (repo / "notes.txt").exists()
    assert "0.5" in (repo / KERNEL_REL).read_text() and head(repo) == base
    assert len(entries(repo)) == 1


def test_no_change_and_empty_description_are_refused(session_repo, capsys):
    assert cli(capsys, session_repo, "try", "nothing")[0] == 3
    assert cli(capsys, session_repo, "try", "   ")[0] == 2


def test_borderline_change_is_confirmed_interleaved(session_repo_all_pairs, capsys):
    repo = session_repo_all_pairs
    # Slower on every shape by the middle of the borderline band past the noise gate (the simulated
    # noise stays under min_noise, so the gate is noise_k x min_noise).
    t = Thresholds()
    step = 1 + t.noise_k * t.min_noise * (1 + t.confirm_band / 2)
    edit_kernel(repo, latency={"256x1024": round(step, 6), "4096x1024": round(2 * step, 6)})
    code, data = cli(capsys, repo, "try", "num_ctas 2")
    row = entries(repo)[-1]
    assert "confirm" in row and len(row["confirm"]["256x1024"]["base"]) == 3
    assert row["decision"]["source"] == "confirm"
    assert (code, data["decision"]) == (1, "revert"), data
    assert (repo / "sandbox/runs/1-confirm3-cand-perf.log").exists()


def test_the_re_check_runs_the_node_id_of_the_case_in_doubt_alone(session_repo_all_pairs, capsys):
    repo = session_repo_all_pairs
    # One case slower by the middle of its borderline band, the other 1 % faster: the geomean is
    # within noise, so only 256x1024 is in doubt and its re-check runs select its test alone.
    t = Thresholds()
    step = 1 + t.noise_k * t.min_noise * (1 + t.confirm_band / 2)
    edit_kernel(repo, latency={"256x1024": round(step, 6), "4096x1024": 1.98})
    code, data = cli(capsys, repo, "try", "num_ctas 2 on the small shape")
    row = entries(repo)[-1]
    assert (row["decision"]["source"], row["decision"]["rechecked"]) == ("partial", ["256x1024"]), row["reason"]
    assert list(row["confirm"]) == ["256x1024"] and (code, data["decision"]) == (1, "revert"), data
    for side in ("base", "cand"):
        report = repo / f"sandbox/runs/1-confirm1-{side}-perf.report.jsonl"
        ran = [json.loads(line)["nodeid"] for line in report.read_text().splitlines()
               if json.loads(line)["type"] == "test"]
        assert ran == [row["shapes"]["256x1024"]["test_id"]], ran
    assert row["timings"]["recheck_runs"] == 6 and row["timings"]["perf_s"] > 0


def test_within_noise_keeps_code_and_recommends_stop(session_repo, capsys):
    repo = session_repo
    with (repo / KERNEL_REL).open("a") as fh:
        fh.write("\n# a comment only\n")
    code, data = cli(capsys, repo, "try", "comment")
    assert (code, data["decision"]) == (0, "keep")
    assert entries(repo)[-1]["decision"]["tier"] == "no-change"
    assert data["stop"].startswith("recommend stop")


def test_max_iterations_stop(tilegym_like_repo, capsys):
    repo = start_session(tilegym_like_repo, capsys, thresholds={"max_iterations": 1})
    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", "persistent")
    assert code == 0 and "limit of 1 iterations" in data["stop"]


def test_live_lock_refuses_a_second_run(session_repo, capsys):
    # A live holder: the kernel's flock on the repository directory, held by another process (the
    # lock file beside it only informs; session.locked).
    lock = session_repo / "sandbox/cutile-perf.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "command": "try"}))
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(session_repo)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        edit_kernel(session_repo, latency=FAST)
        code, data = cli(capsys, session_repo, "try", "x")
        assert code == 3 and "is running" in data["error"]
    finally:
        holder.kill()
        holder.wait()
    lock.unlink()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_resume_refuses_a_commit_made_by_hand_and_drops_nothing(session_repo, capsys):
    """A commit on the session branch that cutile-perf did not make (no iteration state) is named and
    refused by try and resume alike; neither resets it away."""
    repo = session_repo
    edit_kernel(repo, latency=FAST)
    git(repo, "commit", "-qam", "cutile-perf 1: tiles")
    mine = head(repo)
    (repo / "sandbox/cutile-perf.lock").write_text(json.dumps({"pid": _dead_pid(), "command": "try",
                                                                "optimization": "tiles"}))
    edit_kernel(repo, latency=SLOW)
    assert cli(capsys, repo, "try", "again")[0] == 3  # the stale lock points to resume
    code, data = cli(capsys, repo, "resume")
    assert code == 3 and "not made by cutile-perf" in data["error"] and mine[:7] in data["error"], data
    assert head(repo) == mine and "LATENCY_MS = {'256x1024': 1.5" in (repo / KERNEL_REL).read_text()
    assert len(entries(repo)) == 1
    code, data = cli(capsys, repo, "try", "again")
    assert code == 3 and "git reset --soft" in data["hint"]


def test_resume_after_sigkill_of_a_real_run(session_repo, capsys):
    repo = session_repo
    base = head(repo)
    edit_kernel(repo, latency=FAST, sleep=2)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "scripts")}
    proc = subprocess.Popen([sys.executable, "-m", "cutile_perf", "try", "--repo", str(repo), "slow one"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = repo / "sandbox/runs/1-correctness.log"
    for _ in range(100):
        if log.exists():
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    code, data = cli(capsys, repo, "resume")
    assert code == 0, data
    assert head(repo) == base and git(repo, "status", "--porcelain").strip() == ""
    row = entries(repo)[-1]
    assert row["crash_class"] == "interrupted" and "slow-one" in row["patch"], row
    assert (repo / row["patch"]).exists()
    assert entries(repo)[-1]["optimization"] == "slow one"


def test_pending_edit_is_left_alone_by_resume(session_repo, capsys):
    edit_kernel(session_repo, latency=FAST)
    code, data = cli(capsys, session_repo, "resume")
    assert code == 0 and data["pending"] == [KERNEL_REL]
    assert "0.5" in (session_repo / KERNEL_REL).read_text()


def test_commands_without_session_are_refused(tilegym_like_repo, capsys):
    for command in ("baseline", "status", "report", "resume"):
        code, data = cli(capsys, tilegym_like_repo, command)
        assert code == 3 and "no cutile-perf session" in data["error"], command


@pytest.fixture
def no_gpu(monkeypatch):
    """Make every environment check report a missing GPU, on any machine."""
    from cutile_perf.child import envcheck

    env = envcheck.Environment(cuda_tile="1.7.0", problems=(envcheck.Problem("gpu", "no NVIDIA GPU found"),))
    monkeypatch.setattr(envcheck, "check", lambda **_: env)


def test_baseline_and_try_refuse_without_gpu_and_touch_nothing(tilegym_like_repo, capsys, no_gpu):
    repo = tilegym_like_repo
    assert cli(capsys, repo, "init", "--kernel", "rms_norm")[0] == 0
    assert yaml.safe_load((repo / "sandbox/session.yaml").read_text())["require_gpu"] is True  # the default
    code, data = cli(capsys, repo, "baseline", "--repeats", "1")
    assert code == 3 and "no usable GPU" in data["error"], data
    assert not (repo / "sandbox/experiments.jsonl").exists() and not (repo / "sandbox/runs").exists()

    # With a baseline recorded (gate off), turning it back on refuses `try` before anything moves.
    allow_no_gpu(repo)
    assert cli(capsys, repo, "baseline", "--repeats", "1")[0] == 0
    edit_session(repo, require_gpu=True)
    before, log_before = head(repo), (repo / "sandbox/experiments.jsonl").read_text()
    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", "B: persistent grid")
    assert code == 3 and "no usable GPU" in data["error"], data
    assert head(repo) == before and (repo / "sandbox/experiments.jsonl").read_text() == log_before
    assert "0.5" in (repo / KERNEL_REL).read_text()  # the agent's edit is still there
    assert not (repo / "sandbox/cutile-perf.lock").exists()


def test_require_gpu_must_be_a_boolean(session_repo, capsys):
    edit_session(session_repo, require_gpu="no")
    code, data = cli(capsys, session_repo, "status")
    assert code == 2 and "require_gpu must be true or false" in data["error"]


def test_init_pairs_the_test_file_by_folder_when_names_repeat(tilegym_like_repo, capsys):
    """TileGym's layout: rms_norm in ops/ and in suites/liger/, with a test file for each."""
    repo = tilegym_like_repo
    liger_kernel = "src/fakegym/suites/liger/cutile/rms_norm.py"
    liger_test = "tests/suites/liger/test_rms_norm.py"
    for rel, source in ((liger_kernel, (repo / KERNEL_REL).read_text()), (liger_test, (repo / TEST_REL).read_text())):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(source)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a second rms_norm, as in TileGym's suites/liger")

    code, data = cli(capsys, repo, "init", "--kernel", "rms_norm")
    assert code == 2 and KERNEL_REL in data["error"] and liger_kernel in data["error"]
    assert "--kernel" in data["hint"] and not (repo / "sandbox").exists()

    code, data = cli(capsys, repo, "init", "--kernel", liger_kernel, "--branch", "liger")
    assert code == 0, data
    assert (data["test"], data["other_tests"]) == (liger_test, [TEST_REL])
    git(repo, "checkout", "-q", "main")
    (repo / "sandbox/session.yaml").unlink()
    code, data = cli(capsys, repo, "init", "--kernel", KERNEL_REL, "--branch", "ops")
    assert code == 0 and (data["test"], data["other_tests"]) == (TEST_REL, [liger_test]), data

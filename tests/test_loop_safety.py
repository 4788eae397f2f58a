"""Adversarial checks of the loop's promise on real git repositories and real processes.

The promise: the user's uncommitted work is never lost, bad input is a one-line error with a
non-zero exit, and the repository always ends at a known commit. Each test is named after the
fault it prevents. The simulated TileGym-shaped repository and the CLI helpers come from
tests/fixtures_repo.py and tests/test_cli_loop.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures_repo import KERNEL_REL, allow_no_gpu, edit_kernel, git, interruptible, tilegym_like_repo  # noqa: F401
from test_cli_loop import FAST, SLOW, _dead_pid, cli, edit_session, entries, head, session_repo  # noqa: F401

from cutile_perf.store import session as session_mod

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
LOCK = "sandbox/cutile-perf.lock"


def clean(repo: Path) -> bool:
    return git(repo, "status", "--porcelain").strip() == ""


def start_try(repo: Path, optimization: str, *, cwd: Path | None = None) -> subprocess.Popen:
    """``cutile-perf try`` as a real process, so it can be signalled mid-iteration."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    return subprocess.Popen([sys.executable, "-m", "cutile_perf", "try", "--repo", str(repo), "--json", optimization],
                            env=env, cwd=cwd or repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)


def start_session(repo: Path, capsys, *init_args: str) -> None:
    """init (GPU gate off: the simulated tests need none) and a one-run baseline."""
    code, data = cli(capsys, repo, "init", "--kernel", "rms_norm", *init_args)
    assert code == 0, data
    allow_no_gpu(repo)
    assert cli(capsys, repo, "baseline", "--repeats", "1")[0] == 0


def wait_for(path: Path, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)


# --- what counts as a change ----------------------------------------------------------------------


def test_untracked_file_next_to_the_kernel_is_outside_the_fence(session_repo, capsys):
    repo = session_repo
    base = head(repo)
    edit_kernel(repo, latency=FAST)
    helper = repo / "src/fakegym/ops/cutile/helper.py"
    helper.write_text("X = 1\n")
    code, data = cli(capsys, repo, "try", "helper module")
    assert code == 3 and "helper.py" in data["error"]
    assert helper.read_text() == "X = 1\n" and "0.5" in (repo / KERNEL_REL).read_text() and head(repo) == base


def test_deleted_kernel_is_a_crash_and_the_file_comes_back(session_repo, capsys):
    repo = session_repo
    original = (repo / KERNEL_REL).read_text()
    (repo / KERNEL_REL).unlink()
    code, data = cli(capsys, repo, "try", "drop the kernel")
    assert (code, data["decision"], data["crash_class"]) == (4, "crash", "compile"), data
    assert (repo / KERNEL_REL).read_text() == original and clean(repo)
    assert "deleted file mode" in (repo / data["patch"]).read_text()


def test_renamed_kernel_is_refused_because_the_new_name_is_outside_the_fence(session_repo, capsys):
    repo = session_repo
    git(repo, "mv", KERNEL_REL, "src/fakegym/ops/cutile/rms_norm_v2.py")
    code, data = cli(capsys, repo, "try", "rename")
    assert code == 3 and "rms_norm_v2.py" in data["error"]
    assert (repo / "src/fakegym/ops/cutile/rms_norm_v2.py").exists()  # the user's rename is untouched


def test_staged_kernel_change_is_tried_like_an_unstaged_one(session_repo, capsys):
    repo = session_repo
    edit_kernel(repo, latency=FAST)
    git(repo, "add", KERNEL_REL)
    code, data = cli(capsys, repo, "try", "staged")
    assert (code, data["decision"]) == (0, "keep") and clean(repo)
    assert "0.5" in git(repo, "show", f"HEAD:{KERNEL_REL}")


def test_staged_change_outside_the_fence_is_refused_and_stays_staged(session_repo, capsys):
    repo = session_repo
    edit_kernel(repo, latency=FAST)
    (repo / "README.md").write_text("staged by the user\n")
    git(repo, "add", "README.md")
    assert cli(capsys, repo, "try", "x")[0] == 3
    assert git(repo, "diff", "--cached", "--name-only").split() == ["README.md"]


# --- the user works while the tests run -----------------------------------------------------------


def test_user_edit_outside_the_fence_during_the_run_survives_the_revert(session_repo):
    repo = session_repo
    edit_kernel(repo, latency=SLOW, sleep=0.5)
    proc = start_try(repo, "slower")
    wait_for(repo / "sandbox/runs/1-correctness.log")
    (repo / "README.md").write_text("written while pytest ran\n")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert (repo / "README.md").read_text() == "written while pytest ran\n"  # reset --hard would wipe it
    assert head(repo) == entries(repo)[0]["commit"] and "SLEEP_S = 0.0" in (repo / KERNEL_REL).read_text()


def test_kernel_edited_during_the_run_is_not_committed_as_the_measured_change(session_repo):
    """The file changed between the measurement and the commit: the commit would hold code nobody measured."""
    repo = session_repo
    edit_kernel(repo, latency=FAST, sleep=0.5)
    proc = start_try(repo, "faster")
    wait_for(repo / "sandbox/runs/1-perf.log")
    with (repo / KERNEL_REL).open("a") as fh:
        fh.write("\n# written by the user while perf ran\n")
    out, err = proc.communicate(timeout=300)
    row = entries(repo)[-1]
    assert (proc.returncode, row["status"], row["crash_class"]) == (4, "crash", "changed-during-run"), err
    assert "written by the user" in (repo / row["patch"]).read_text()  # the late edit is saved, not lost
    assert head(repo) == entries(repo)[0]["commit"] and clean(repo)


# --- interrupts and kills -------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["correctness", "perf"])
def test_ctrl_c_saves_the_patch_logs_a_crash_and_leaves_a_known_commit(session_repo, capsys, stage):
    repo = session_repo
    base, original = head(repo), (repo / KERNEL_REL).read_text()
    edit_kernel(repo, latency=FAST, sleep=2)
    proc = start_try(repo, "interrupted one")
    wait_for(repo / f"sandbox/runs/1-{stage}.log")
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert head(repo) == base and (repo / KERNEL_REL).read_text() == original and clean(repo)
    assert not (repo / LOCK).exists()
    row = entries(repo)[-1]
    assert (row["status"], row["crash_class"]) == ("crash", "interrupted")
    assert "SLEEP_S = 2" in (repo / row["patch"]).read_text()
    code, data = cli(capsys, repo, "resume")
    assert code == 0 and data["consistent"] and len(entries(repo)) == 2


def test_two_concurrent_tries_one_is_refused_by_the_lock(session_repo):
    repo = session_repo
    edit_kernel(repo, latency=FAST, sleep=0.5)
    first = start_try(repo, "first")
    wait_for(repo / "sandbox/runs/1-correctness.log")
    second = start_try(repo, "second")
    out2, err2 = second.communicate(timeout=30)
    out1, err1 = first.communicate(timeout=300)
    assert second.returncode == 3 and "is running" in json.loads(out2)["error"]
    assert first.returncode == 0, err1
    assert [e["optimization"] for e in entries(repo)] == ["baseline", "first"]


# --- where the command is run from, and which branch is checked out ------------------------------


def test_try_from_a_subdirectory_finds_the_session_at_the_top_level(session_repo, capsys):
    repo = session_repo
    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo / "src/fakegym", "try", "from a subdirectory")
    assert (code, data["decision"]) == (0, "keep"), data
    code, data = cli(capsys, repo / "tests", "status")
    assert code == 0 and len(data["rows"]) == 2


def test_try_on_another_branch_at_the_base_commit_is_refused(session_repo, capsys):
    """Right after init, main and the session branch are the same commit: a kept change would land on main."""
    repo = session_repo
    git(repo, "checkout", "-q", "main")
    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", "on main")
    assert code == 3 and "cutile-perf-" in data["error"], data
    assert git(repo, "rev-parse", "main").strip() == entries(repo)[0]["commit"]
    assert "0.5" in (repo / KERNEL_REL).read_text()


def test_try_on_a_detached_head_is_refused(session_repo, capsys):
    repo = session_repo
    git(repo, "checkout", "-q", "--detach")
    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", "detached")
    assert code == 3 and "detached" in data["error"], data
    assert "0.5" in (repo / KERNEL_REL).read_text()


def test_resume_on_another_branch_never_resets_the_users_commits(session_repo, capsys):
    repo = session_repo
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("the user's own work on main\n")
    git(repo, "commit", "-qam", "user work on main")
    mine = head(repo)
    stale = json.dumps({"pid": _dead_pid(), "command": "try", "optimization": "killed one"})
    (repo / LOCK).write_text(stale)
    code, data = cli(capsys, repo, "resume")
    assert code == 3 and "main" in data["error"], data
    assert head(repo) == mine and clean(repo) and len(entries(repo)) == 1
    assert (repo / LOCK).read_text() == stale  # refused before taking the lock: the killed run's name survives


# --- hand-edited session.yaml ---------------------------------------------------------------------


@pytest.mark.parametrize("fence", [["../outside.py"], ["/etc/passwd"], ["src/**/*.py"], [""], [".git/config"],
                                   "src/fakegym/ops/cutile/rms_norm.py"])  # a string, not a list
def test_fence_that_cannot_name_a_repo_file_is_a_usage_error(session_repo, capsys, fence):
    edit_session(session_repo, fence=fence)
    edit_kernel(session_repo, latency=FAST)
    code, data = cli(capsys, session_repo, "try", "x")
    assert code == 2 and "fence" in data["error"], data
    assert "0.5" in (session_repo / KERNEL_REL).read_text()


def test_a_loosened_threshold_or_narrowed_test_command_is_named_in_status_and_report(tilegym_like_repo, capsys):
    """Seen in a live eval: an agent short of GPU time raised plausible_factor from 3 to 30 before
    its baseline, so a 14x gain skipped the interleaved re-check; another narrowed the correctness
    command to one kernel mode. Allowed (the session's to set until the baseline), but never
    silent: status and the report name both."""
    repo = tilegym_like_repo
    code, data = cli(capsys, repo, "init", "--kernel", "rms_norm")
    assert code == 0, data
    allow_no_gpu(repo)
    narrowed = session_mod.CORRECTNESS_TEMPLATE.replace("not test_perf", "not test_perf and not float64")
    edit_session(repo, thresholds={"plausible_factor": 30.0}, correctness_cmd=narrowed)
    assert cli(capsys, repo, "baseline", "--repeats", "1")[0] == 0
    code, data = cli(capsys, repo, "status")
    assert code == 0 and data["changed_thresholds"] == {"plausible_factor": {"value": 30.0, "default": 3.0}}
    assert data["edited_commands"] == {"correctness_cmd": {"command": narrowed,
                                                           "init": session_mod.CORRECTNESS_TEMPLATE}}
    assert data["edited_commands"].keys() == {"correctness_cmd"}  # init's perf command is not "edited"
    assert cli(capsys, repo, "report")[0] == 0
    report = (repo / "sandbox" / "report.md").read_text()
    assert "**Thresholds changed from the defaults**" in report and "plausible_factor 30.0 (default 3.0)" in report
    assert f"**correctness_cmd edited before the baseline**: `{narrowed}`" in report


# --- odd text and odd files -----------------------------------------------------------------------


def test_hostile_optimization_text_stays_one_commit_line_one_file_name_one_table_cell(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    (repo / ".gitignore").write_text("*.patch\nsandbox/\n")  # the target ignores what we write
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore patches")
    start_session(repo, capsys)
    text = "a|b; rm -rf / $(touch pwned) `id`\nsecond line\t" + "x" * 500
    edit_kernel(repo, latency=SLOW)
    code, data = cli(capsys, repo, "try", text)
    assert (code, data["decision"]) == (1, "revert"), data
    patch = Path(data["patch"])
    assert patch.parent.as_posix() == "sandbox/patches" and len(patch.name) < 60 and (repo / patch).is_file()
    assert not (repo / "pwned").exists()
    assert entries(repo)[-1]["optimization"] == " ".join(text.split())
    table = (repo / "sandbox/perf_results.md").read_text().splitlines()
    assert len(table) == 2 + 2 and "a\\|b" in table[-1]

    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", text)
    assert code == 0 and git(repo, "log", "-1", "--format=%s").strip() == f"cutile-perf 2: {' '.join(text.split())}"


def test_non_utf8_kernel_bytes_are_saved_byte_exact_and_reverted(session_repo, capsys):
    repo = session_repo
    edit_kernel(repo, latency=SLOW)
    path = repo / KERNEL_REL
    edited = path.read_bytes() + b"# caf\xe9 in latin-1\n"
    path.write_bytes(edited)
    code, data = cli(capsys, repo, "try", "latin-1 comment")
    assert (code, data["decision"]) == (1, "revert"), data
    assert head(repo) == entries(repo)[0]["commit"] and clean(repo)
    git(repo, "apply", data["patch"])  # the saved patch gives back exactly the user's bytes
    assert path.read_bytes() == edited


def test_fenced_file_with_a_non_ascii_name_is_reverted(tilegym_like_repo, capsys):
    """git quotes such names in line-based output; the revert must still find the file."""
    repo = tilegym_like_repo
    extra = "src/fakegym/ops/cutile/café_tables.py"
    (repo / extra).write_text("TABLE = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "helper with a non-ASCII name")
    start_session(repo, capsys, "--allow", extra)
    (repo / extra).write_text("TABLE = 2\n")
    edit_kernel(repo, latency=SLOW)
    code, data = cli(capsys, repo, "try", "both files")
    assert (code, data["decision"]) == (1, "revert"), data
    assert (repo / extra).read_text() == "TABLE = 1\n" and clean(repo)


def test_unwritable_patch_dir_never_resets_the_unsaved_change(session_repo, capsys):
    """Disk full / read-only: when the patch cannot be written, the candidate must not be reset away."""
    repo = session_repo
    (repo / "sandbox/patches").write_text("a file where the patch directory should be\n")  # mkdir fails, even as root
    edit_kernel(repo, latency=SLOW)
    code, _ = cli(capsys, repo, "try", "slower")
    assert code != 0
    committed = git(repo, "show", f"HEAD:{KERNEL_REL}")
    assert "3.0" in (repo / KERNEL_REL).read_text() or "3.0" in committed  # still in the tree or a commit
    assert not (repo / LOCK).exists()


def test_file_the_user_stages_during_the_run_is_not_swept_into_the_candidate_commit(session_repo):
    repo = session_repo
    edit_kernel(repo, latency=FAST, sleep=0.5)
    proc = start_try(repo, "faster")
    wait_for(repo / "sandbox/runs/1-correctness.log")
    (repo / "README.md").write_text("staged by the user mid-run\n")
    git(repo, "add", "README.md")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert git(repo, "show", "--name-only", "--format=", "HEAD").split() == [KERNEL_REL]
    assert (repo / "README.md").read_text() == "staged by the user mid-run\n"

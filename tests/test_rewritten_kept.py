"""Red team, issue 44 item 4: a kept commit the user rewrote has a way on, and the user's commit is never lost.

After ``try`` keeps a commit, a user (or an agent) may amend it, rebase the session branch, or reset
the branch behind it. Before this defence ``try`` said "run `cutile-perf resume`", ``resume``
refused with the same words (a loop), ``status`` said nothing and ``verify`` measured the log's old
commit, no longer on the branch, without saying so. Each test mounts one such rewrite on the
simulated TileGym-shaped repository through the real CLI and real pytest children, then asserts:
the state is named, both ways on are offered by flag (``resume --adopt``, ``resume --reset-to-kept``),
each works, and no commit or uncommitted work of the user is lost.
"""
from __future__ import annotations

import pytest
from fixtures_repo import KERNEL_REL, allow_no_gpu, edit_kernel, git, tilegym_like_repo  # noqa: F401
from test_cli_loop import FAST, SLOW, cli, entries, head

from cutile_perf.cli import main

BACKUP = "cutile-perf/rewritten-"


@pytest.fixture
def kept_repo(tilegym_like_repo, capsys):
    """init, a one-run baseline, and one kept change (the kernel twice as fast)."""
    repo = tilegym_like_repo
    code, data = cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "300")
    assert code == 0, data
    allow_no_gpu(repo)
    assert cli(capsys, repo, "baseline", "--repeats", "1")[0] == 0
    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", "faster")
    assert (code, data["decision"]) == (0, "keep"), data
    return repo


def amend(repo, **kernel) -> str:
    """Amend the kept commit as a user would: a new message, and the kernel edited when ``kernel`` says so."""
    if kernel:
        edit_kernel(repo, **kernel)
    git(repo, "commit", "-q", "--amend", "-a", "-m", "my own message for the faster kernel")
    return head(repo)


def short(repo, sha: str) -> str:
    return git(repo, "rev-parse", "--short", sha).strip()


def clean(repo) -> bool:
    return git(repo, "status", "--porcelain").strip() == ""


def assert_both_ways_named(data: dict) -> None:
    """The refusal names both flags, never the bare `resume` that refused the same way (the loop)."""
    assert "--adopt" in data["hint"] and "--reset-to-kept" in data["hint"], data
    assert data["hint"] != "run `cutile-perf resume`", data


def test_an_amended_kept_commit_is_named_by_status_try_resume_and_verify(kept_repo, capsys):
    repo = kept_repo
    kept = head(repo)
    mine = amend(repo)  # same files, another message: recognised by its tree
    rows = len(entries(repo))

    code, data = cli(capsys, repo, "status")
    off = data["kept_commit_off_branch"]
    assert code == 0 and off is not None, data
    assert (off["kept"], off["head"], off["rewritten_as"], off["recognised_by"]) == (kept, mine, mine, "same tree")
    assert main(["status", "--repo", str(repo)]) == 0
    text = capsys.readouterr().out
    assert f"the last kept commit {short(repo, kept)} is no longer on branch" in text
    assert "resume --adopt" in text and "resume --reset-to-kept" in text

    edit_kernel(repo, latency={"256x1024": 0.4, "4096x1024": 1.0})
    code, data = cli(capsys, repo, "try", "smaller tiles")
    assert code == 3 and "no longer on branch" in data["error"], data
    assert_both_ways_named(data)
    assert "0.4" in (repo / KERNEL_REL).read_text()  # the pending edit is untouched
    git(repo, "checkout", "--", KERNEL_REL)

    code, data = cli(capsys, repo, "resume")
    assert code == 3 and short(repo, kept) in data["error"], data
    assert_both_ways_named(data)
    assert head(repo) == mine and len(entries(repo)) == rows and clean(repo)

    code, data = cli(capsys, repo, "verify")  # the default --to is the log's kept commit, off the branch now
    assert code == 3 and f"kept commit {short(repo, kept)} (iteration 1) is no longer on branch" in data["error"], data
    assert_both_ways_named(data)


def test_reset_to_kept_moves_the_branch_back_and_keeps_the_users_commit_on_a_backup_branch(kept_repo, capsys):
    repo = kept_repo
    kept = head(repo)
    mine = amend(repo, latency=SLOW)  # other content: no commit on the branch holds the kept change
    code, data = cli(capsys, repo, "status")
    assert data["kept_commit_off_branch"]["rewritten_as"] is None, data

    code, data = cli(capsys, repo, "resume", "--reset-to-kept")
    backup = BACKUP + short(repo, mine)
    assert code == 0 and data["settled_off_branch"] and backup in data["actions"][-1], data
    assert head(repo) == kept and clean(repo)
    assert git(repo, "rev-parse", backup).strip() == mine  # the user's commit is not lost
    assert "'256x1024': 0.5" in (repo / KERNEL_REL).read_text()  # the work tree is the kept commit's
    assert cli(capsys, repo, "status")[1]["kept_commit_off_branch"] is None

    code, data = cli(capsys, repo, "resume", "--reset-to-kept")  # again: nothing left to settle
    assert code == 0 and not data["settled_off_branch"] and head(repo) == kept, data
    edit_kernel(repo, latency=SLOW)
    code, data = cli(capsys, repo, "try", "the slower one again")  # the loop goes on
    assert (code, data["decision"]) == (1, "revert"), data


def test_adopt_re_measures_the_rewritten_commit_and_the_chain_of_kept_rows_stays_honest(kept_repo, capsys):
    repo = kept_repo
    kept = head(repo)
    mine = amend(repo, latency=SLOW)  # the user's commit is slower than the one the loop kept
    rows = len(entries(repo))

    code, data = cli(capsys, repo, "resume", "--adopt")
    assert code == 0 and data["settled_off_branch"], data
    assert head(repo) == mine and clean(repo)  # the user's commit is adopted as it is
    new = entries(repo)
    assert len(new) == rows + 1
    row = new[-1]
    assert (row["status"], row["commit"], row["base_commit"], row["decision"]["tier"]) == ("keep", mine, kept, "adopted")
    # Measured, not copied: the slower code's numbers, three times the kept commit's reference.
    assert row["shapes"]["256x1024"]["median"] == pytest.approx(1.5, rel=0.02), row["shapes"]
    assert row["decision"]["geomean_change"] == pytest.approx(2.0, rel=0.03)
    assert cli(capsys, repo, "status")[1]["kept_commit_off_branch"] is None

    code, data = cli(capsys, repo, "verify")  # baseline -> the adopted commit: its recorded numbers reproduce
    assert code == 0 and data["verified"] and data["to"] == mine, data
    code, data = cli(capsys, repo, "verify", "--to", kept)  # the replaced commit is refused by name
    assert code == 3 and short(repo, kept) in data["error"] and "--from and --to" in data["hint"], data

    edit_kernel(repo, latency=FAST)
    code, data = cli(capsys, repo, "try", "back to the fast kernel")  # judged against the adopted numbers
    assert (code, data["decision"]) == (0, "keep"), data


def test_a_rebase_is_recognised_by_its_patch_and_adopt_refuses_the_base_it_never_measured(kept_repo, capsys):
    repo = kept_repo
    kept = head(repo)
    branch = git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    git(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("main moved on\n")
    git(repo, "commit", "-qam", "main moved on")
    git(repo, "checkout", "-q", branch)
    git(repo, "rebase", "-q", "main")
    rebased = head(repo)
    rows = len(entries(repo))

    off = cli(capsys, repo, "status")[1]["kept_commit_off_branch"]
    assert (off["rewritten_as"], off["recognised_by"], off["behind"]) == (rebased, "same patch", False), off

    code, data = cli(capsys, repo, "resume", "--adopt")
    assert code == 3 and "README.md" in data["error"] and "--reset-to-kept" in data["hint"], data
    assert head(repo) == rebased and len(entries(repo)) == rows

    code, data = cli(capsys, repo, "resume", "--reset-to-kept")
    assert code == 0, data
    assert head(repo) == kept and clean(repo)
    assert (repo / "README.md").read_text() != "main moved on\n"
    assert git(repo, "rev-parse", BACKUP + short(repo, rebased)).strip() == rebased


def test_a_branch_reset_behind_the_kept_commit_is_moved_forward_without_a_backup(kept_repo, capsys):
    repo = kept_repo
    kept = head(repo)
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    off = cli(capsys, repo, "status")[1]["kept_commit_off_branch"]
    assert off["behind"] and off["head"] == head(repo), off
    code, data = cli(capsys, repo, "resume", "--reset-to-kept")
    assert code == 0 and head(repo) == kept and clean(repo), data
    assert git(repo, "branch", "--list", BACKUP + "*").strip() == ""  # the old head is still in the branch


def test_both_ways_on_refuse_uncommitted_work_and_move_nothing(kept_repo, capsys):
    repo = kept_repo
    mine = amend(repo, latency=SLOW)
    rows = len(entries(repo))
    (repo / "README.md").write_text("my unsaved notes\n")
    code, data = cli(capsys, repo, "resume", "--reset-to-kept")
    assert code == 3 and "README.md" in data["error"], data
    assert head(repo) == mine and (repo / "README.md").read_text() == "my unsaved notes\n"
    assert git(repo, "branch", "--list", BACKUP + "*").strip() == ""

    edit_kernel(repo, latency={"256x1024": 0.4, "4096x1024": 1.0})
    code, data = cli(capsys, repo, "resume", "--adopt")
    assert code == 3 and KERNEL_REL in data["error"], data
    assert head(repo) == mine and len(entries(repo)) == rows and "0.4" in (repo / KERNEL_REL).read_text()


def test_adopt_of_a_rewritten_commit_that_fails_its_tests_records_nothing(kept_repo, capsys):
    repo = kept_repo
    mine = amend(repo, behaviour="wrong")
    rows = len(entries(repo))
    code, data = cli(capsys, repo, "resume", "--adopt")
    assert code == 4 and "cannot be adopted" in data["error"] and "--reset-to-kept" in data["hint"], data
    assert head(repo) == mine and len(entries(repo)) == rows
    assert cli(capsys, repo, "status")[1]["kept_commit_off_branch"]["head"] == mine


def test_the_two_ways_on_are_one_choice(tilegym_like_repo, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["resume", "--repo", str(tilegym_like_repo), "--adopt", "--reset-to-kept"])
    assert exc.value.code == 2
    assert "--reset-to-kept: not allowed with argument --adopt" in capsys.readouterr().err

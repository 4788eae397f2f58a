"""git_ops against real git repositories (the simulated TileGym-shaped one)."""
from __future__ import annotations

import pytest
from fixtures_repo import KERNEL_REL, git, tilegym_like_repo  # noqa: F401  (fixture import)

from cutile_perf.store import git_ops
from cutile_perf.errors import UsageError


def test_changed_paths_lists_edits_and_untracked_files(tilegym_like_repo):
    repo = git_ops.open_repo(tilegym_like_repo)
    assert git_ops.changed_paths(repo) == []
    (tilegym_like_repo / KERNEL_REL).write_text("x = 1\n")
    (tilegym_like_repo / "new dir").mkdir()
    (tilegym_like_repo / "new dir" / "notes.txt").write_text("n")
    assert git_ops.changed_paths(repo) == sorted([KERNEL_REL, "new dir/notes.txt"])
    assert git_ops.tracked_changes(repo) == [KERNEL_REL]


def test_renames_report_both_paths(tilegym_like_repo):
    repo = git_ops.open_repo(tilegym_like_repo)
    git(tilegym_like_repo, "mv", "README.md", "README2.md")
    assert set(git_ops.changed_paths(repo)) == {"README.md", "README2.md"}


def test_reset_to_restores_fenced_files_and_keeps_other_work(tilegym_like_repo):
    """Regression: a plain reset --hard would wipe an unrelated edit made while the iteration ran."""
    repo = git_ops.open_repo(tilegym_like_repo)
    base = git_ops.head(repo)
    kernel = tilegym_like_repo / KERNEL_REL
    original = kernel.read_text()
    kernel.write_text(original + "# candidate\n")
    extra = tilegym_like_repo / "src/fakegym/ops/cutile/helper.py"
    extra.write_text("y = 2\n")
    cand = git_ops.commit_paths(repo, [KERNEL_REL, "src/fakegym/ops/cutile/helper.py"], "candidate")
    assert cand != base and git_ops.is_ancestor(repo, base, cand)
    (tilegym_like_repo / "README.md").write_text("user edit\n")  # outside the fence
    git_ops.reset_to(repo, base, [KERNEL_REL, "src/fakegym/ops/cutile/helper.py"])
    assert git_ops.head(repo) == base
    assert kernel.read_text() == original
    assert not extra.exists()
    assert (tilegym_like_repo / "README.md").read_text() == "user edit\n"
    assert git_ops.changed_paths(repo) == ["README.md"]


def test_diff_patch_includes_new_files_and_applies_back(tilegym_like_repo):
    repo = git_ops.open_repo(tilegym_like_repo)
    base = git_ops.head(repo)
    (tilegym_like_repo / KERNEL_REL).write_text("changed\n")
    (tilegym_like_repo / "src/new.py").write_text("new\n")
    patch = git_ops.diff_patch(repo, base, [KERNEL_REL, "src/new.py"])
    assert b"src/new.py" in patch and b"+changed" in patch
    git_ops.reset_to(repo, base, [KERNEL_REL, "src/new.py"])
    assert git_ops.changed_paths(repo) == []
    (tilegym_like_repo / "p.patch").write_bytes(patch)
    git(tilegym_like_repo, "apply", "p.patch")
    assert (tilegym_like_repo / "src/new.py").read_text() == "new\n"


def test_git_dir_in_the_environment_is_ignored(tilegym_like_repo, tmp_path, monkeypatch):
    """Regression: a GIT_DIR exported by a hook or IDE must not redirect our commands to another repo."""
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", str(other))
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    repo = git_ops.open_repo(tilegym_like_repo)
    (tilegym_like_repo / KERNEL_REL).write_text("x\n")
    assert git_ops.changed_paths(repo) == [KERNEL_REL]
    git_ops.commit_paths(repo, [KERNEL_REL], "c")
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_INDEX_FILE")
    assert "c" in git(tilegym_like_repo, "log", "-1", "--format=%s")


def test_exclude_locally_is_idempotent_and_commits_nothing(tilegym_like_repo):
    repo = git_ops.open_repo(tilegym_like_repo)
    assert git_ops.exclude_locally(repo, "sandbox/")
    assert not git_ops.exclude_locally(repo, "sandbox/")
    (tilegym_like_repo / "sandbox").mkdir()
    (tilegym_like_repo / "sandbox" / "x").write_text("x")
    git(tilegym_like_repo, "check-ignore", "-q", "sandbox/x")  # raises unless ignored
    assert git_ops.changed_paths(repo) == []


def test_branches(tilegym_like_repo):
    repo = git_ops.open_repo(tilegym_like_repo)
    assert git_ops.current_branch(repo) == "main"
    assert not git_ops.branch_exists(repo, "cutile-perf-x")
    git_ops.create_branch(repo, "cutile-perf-x")
    assert git_ops.branch_exists(repo, "cutile-perf-x") and git_ops.current_branch(repo) == "cutile-perf-x"


def test_not_a_repository_is_a_usage_error(tmp_path):
    import pytest

    from cutile_perf.errors import UsageError

    with pytest.raises(UsageError, match="not inside a git repository"):
        git_ops.open_repo(tmp_path)


def test_init_repo_commits_everything_and_ignores_an_exported_git_dir(tmp_path, monkeypatch, tilegym_like_repo):
    # An exported GIT_DIR (a git hook, an IDE) must not make init_repo write into that other repository.
    monkeypatch.setenv("GIT_DIR", str(tilegym_like_repo / ".git"))
    other_head = git(tilegym_like_repo, "--git-dir", str(tilegym_like_repo / ".git"), "rev-parse", "HEAD").strip()
    dest = tmp_path / "fresh"
    (dest / "pkg").mkdir(parents=True)
    (dest / "pkg" / "k.py").write_text("x = 1\n")
    (dest / ".gitignore").write_text("*.log\n")
    (dest / "run.log").write_text("ignored")
    repo = git_ops.init_repo(dest, "suite (demo start)")
    assert git_ops.commit_message(repo, git_ops.head(repo)) == "suite (demo start)"
    assert git_ops.changed_paths(repo) == []
    assert git_ops.paths_in_commit(repo, "HEAD", ["pkg/k.py", "run.log"]) == ["pkg/k.py"]
    monkeypatch.delenv("GIT_DIR")
    git(dest, "check-ignore", "-q", "run.log")  # raises unless ignored
    assert git(tilegym_like_repo, "rev-parse", "HEAD").strip() == other_head
    with pytest.raises(UsageError, match="already a git repository"):  # an existing history is never restarted
        git_ops.init_repo(dest, "again")

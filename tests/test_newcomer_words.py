"""No wrong word for a newcomer (issue 43): each silent acceptance is a clear line."""
from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_repo import build_tilegym_like_repo, git, tilegym_like_repo  # noqa: F401 - fixture
from test_fence_and_hostile_input import assert_one_line_error, assert_untouched, run_cli

from cutile_perf.loop import batch as batch_mod
from cutile_perf.skill.install import install_skill

ROOT = Path(__file__).resolve().parents[1]


def test_allow_of_a_file_that_does_not_exist_is_refused(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    code, _, err = run_cli("init", "--repo", str(repo), "--kernel", "rms_norm",
                           "--allow", "src/fakegym/ops/cutile/helpres.py")
    line = assert_one_line_error(code, err, 2)
    assert "--allow src/fakegym/ops/cutile/helpres.py: no such file or folder" in line
    assert_untouched(repo)


def test_install_skill_for_cursor_writes_cursors_folder(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    code, _, err = run_cli("install-skill", "--target", str(repo), "--agent", "cursor")
    assert code == 0, err
    assert (repo / ".cursor/skills/cutile-perf/SKILL.md").is_file()
    assert not (repo / ".claude").exists() and not (repo / ".agents").exists()
    assert git(repo, "status", "--porcelain").strip() == ""  # excluded locally, as the others are


def test_install_skill_all_still_writes_claude_and_codex_only(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    install_skill(target=repo, agent="all", force=False)
    assert (repo / ".claude/skills/cutile-perf").is_dir() and (repo / ".agents/skills/cutile-perf").is_dir()
    assert not (repo / ".cursor").exists()


@pytest.mark.parametrize("data, line", [
    ({"ready": True}, "ready for the GPU job"),
    ({"ready": True, "verdict_at_risk": True}, "the GPU job can start, but by the warning above it may end before any verdict"),
    ({"ready": False, "verdict_at_risk": True}, "NOT READY: the GPU job would not reach its first try"),
])
def test_batch_check_does_not_call_a_job_ready_while_warning_it_holds_no_verdict(data, line):
    assert batch_mod._readiness_line(data) == line


def test_harness_does_not_tell_users_to_edit_gitignore():
    # init excludes sandbox/ in .git/info/exclude; editing a tracked .gitignore dirties the tree,
    # which init then refuses.
    text = (ROOT / "references/harness.md").read_text(encoding="utf-8")
    assert "add `sandbox/` to `.gitignore`" not in text


def test_status_on_another_branch_says_so(tilegym_like_repo):
    repo = tilegym_like_repo
    code, _, err = run_cli("init", "--repo", str(repo), "--kernel", "rms_norm")
    assert code == 0, err
    session_branch = git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()
    code, out, _ = run_cli("status", "--repo", str(repo))
    assert code == 0 and "not the session's branch" not in out
    git(repo, "switch", "-q", "main")
    code, out, err = run_cli("status", "--repo", str(repo))
    assert code == 0, err
    assert f"warning: on main, not the session's branch {session_branch} (`git switch {session_branch}`" in out

"""`cutile-perf install-skill`: copies the skill where agents look, never clobbers a user's edits."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_repo import tilegym_like_repo  # noqa: F401  (fixture)

from cutile_perf.skill.install import MANIFEST, install_skill, is_installed_skill_path, plan_install, skill_dirs
from cutile_perf.errors import EXIT_REFUSED, Refused, UsageError

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_bundle(tmp_path: Path) -> Path:
    """A stand-in for the checkout: a SKILL.md and two references, so tests control the content."""
    root = tmp_path / "bundle"
    (root / "references").mkdir(parents=True)
    (root / "SKILL.md").write_text("---\nname: cutile-perf\n---\nv1\n")
    (root / "references" / "knobs.md").write_text("knobs v1\n")
    (root / "references" / "patterns.md").write_text("patterns v1\n")
    return root


@pytest.fixture
def target(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    return repo


def test_installs_both_agent_dirs_with_manifest(fake_bundle, target):
    out = install_skill(target=target, agent="all", force=False, source=fake_bundle)
    for sub in (".claude/skills/cutile-perf", ".agents/skills/cutile-perf"):
        dest = target / sub
        assert (dest / "SKILL.md").read_text().endswith("v1\n")
        assert (dest / "references" / "knobs.md").read_text() == "knobs v1\n"
        manifest = json.loads((dest / MANIFEST).read_text())
        assert set(manifest["files"]) == {"SKILL.md", "references/knobs.md", "references/patterns.md"}
    assert [i["agent"] for i in out.data["installed"]] == ["claude", "codex"]


def test_agent_claude_only(fake_bundle, target):
    install_skill(target=target, agent="claude", force=False, source=fake_bundle)
    assert (target / ".claude/skills/cutile-perf/SKILL.md").is_file()
    assert not (target / ".agents").exists()


def test_reinstall_upgrades_untouched_copy(fake_bundle, target):
    install_skill(target=target, agent="codex", force=False, source=fake_bundle)
    (fake_bundle / "references" / "knobs.md").write_text("knobs v2\n")
    out = install_skill(target=target, agent="codex", force=False, source=fake_bundle)
    assert (target / ".agents/skills/cutile-perf/references/knobs.md").read_text() == "knobs v2\n"
    assert out.data["installed"][0]["written"] == ["references/knobs.md"]
    assert out.data["backups"] == []


def test_user_edit_is_refused_and_nothing_written(fake_bundle, target):
    install_skill(target=target, agent="all", force=False, source=fake_bundle)
    edited = target / ".claude/skills/cutile-perf/SKILL.md"
    edited.write_text("my own notes\n")
    (fake_bundle / "references" / "patterns.md").write_text("patterns v2\n")
    with pytest.raises(Refused) as info:
        install_skill(target=target, agent="all", force=False, source=fake_bundle)
    assert str(edited) in info.value.message
    # Refused before writing anything, in either destination.
    assert edited.read_text() == "my own notes\n"
    assert (target / ".agents/skills/cutile-perf/references/patterns.md").read_text() == "patterns v1\n"


def test_force_overwrites_but_keeps_user_version_as_bak(fake_bundle, target):
    install_skill(target=target, agent="claude", force=False, source=fake_bundle)
    edited = target / ".claude/skills/cutile-perf/SKILL.md"
    edited.write_text("my own notes\n")
    out = install_skill(target=target, agent="claude", force=True, source=fake_bundle)
    assert edited.read_text().endswith("v1\n")
    assert Path(out.data["backups"][0]).read_text() == "my own notes\n"


def test_preexisting_foreign_file_counts_as_user_file(fake_bundle, target):
    # A SKILL.md that cutile-perf never wrote (no manifest entry) is the user's.
    dest = target / ".claude/skills/cutile-perf"
    dest.mkdir(parents=True)
    (dest / "SKILL.md").write_text("someone else's skill\n")
    plan = plan_install(dest, {"SKILL.md": b"ours\n"})
    assert plan.user_modified == ["SKILL.md"]


def test_reference_dropped_from_bundle_is_removed_only_if_untouched(fake_bundle, target):
    install_skill(target=target, agent="claude", force=False, source=fake_bundle)
    (fake_bundle / "references" / "patterns.md").unlink()
    install_skill(target=target, agent="claude", force=False, source=fake_bundle)
    assert not (target / ".claude/skills/cutile-perf/references/patterns.md").exists()


def test_bad_agent_and_missing_target_are_usage_errors(fake_bundle, tmp_path):
    with pytest.raises(UsageError):
        install_skill(target=tmp_path, agent="windsurf", force=False, source=fake_bundle)
    with pytest.raises(UsageError):
        install_skill(target=tmp_path / "nope", agent="all", force=False, source=fake_bundle)


@pytest.mark.skipif(not (REPO_ROOT / "SKILL.md").is_file(), reason="SKILL.md not written yet")
def test_cli_installs_the_real_bundle_and_refuses_edits(tmp_path):
    cmd = [sys.executable, "-m", "cutile_perf", "install-skill", "--target", str(tmp_path), "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    dest = Path(data["installed"][0]["path"])
    assert (dest / "SKILL.md").read_bytes() == (REPO_ROOT / "SKILL.md").read_bytes()
    for ref in (REPO_ROOT / "references").glob("*.md"):
        assert (dest / "references" / ref.name).is_file()
    (dest / "SKILL.md").write_text("edited\n")
    second = subprocess.run(cmd, capture_output=True, text=True)
    assert second.returncode == EXIT_REFUSED
    assert "refusing to overwrite" in second.stdout


# --- never blocking the loop: local exclude, fence rule, safe upgrades ------------------------------


@pytest.mark.parametrize("path, ours", [
    (".claude/skills/cutile-perf/SKILL.md", True),
    (".agents/skills/cutile-perf/references/knobs.md", True),
    (".agents/skills/cutile-perf/.cutile-perf-manifest.json", True),
    ("./.claude/skills/cutile-perf/SKILL.md.bak", True),
    (".claude/skills/cutile-perf", True),
    (".claude/skills/other-skill/SKILL.md", False),  # another skill is the user's change
    (".claude/skills/cutile-perf-extra/SKILL.md", False),  # a prefix of our name is not our name
    (".claude/settings.json", False),
    ("src/pkg/ops/cutile/rms_norm.py", False),
])
def test_is_installed_skill_path(path, ours):
    assert is_installed_skill_path(path) is ours


def test_skill_dirs_are_the_agent_dirs():
    assert skill_dirs() == (".claude/skills/cutile-perf/", ".agents/skills/cutile-perf/", ".cursor/skills/cutile-perf/")


@pytest.fixture
def git_target(tmp_path: Path) -> Path:
    """A git repository with a tracked .gitignore and one commit."""
    from fixtures_repo import git

    repo = tmp_path / "gitrepo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "T")
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "start")
    return repo


def test_install_excludes_its_dirs_locally_and_leaves_the_tree_clean(fake_bundle, git_target):
    from fixtures_repo import git

    out = install_skill(target=git_target, agent="all", force=False, source=fake_bundle)
    exclude = (git_target / ".git/info/exclude").read_text()
    assert "/.claude/skills/cutile-perf/" in exclude and "/.agents/skills/cutile-perf/" in exclude
    assert (git_target / ".gitignore").read_text() == "*.log\n"  # the user's tracked file is never touched
    assert git(git_target, "status", "--porcelain").strip() == ""  # nothing for init or try to trip over
    assert out.data["exclude"]["added"] == ["/.claude/skills/cutile-perf/", "/.agents/skills/cutile-perf/"]
    assert "added" in out.text and ".git/info/exclude" in out.text

    again = install_skill(target=git_target, agent="all", force=False, source=fake_bundle)
    assert again.data["exclude"]["added"] == [] and len(again.data["exclude"]["present"]) == 2
    assert (git_target / ".git/info/exclude").read_text() == exclude  # each pattern once
    assert "already up to date" in again.text
    assert all(i["written"] == [] for i in again.data["installed"])


def test_install_into_a_subdirectory_excludes_paths_from_the_repo_root(fake_bundle, git_target):
    from fixtures_repo import git

    sub = git_target / "kernels"
    sub.mkdir()
    install_skill(target=sub, agent="claude", force=False, source=fake_bundle)
    assert "/kernels/.claude/skills/cutile-perf/" in (git_target / ".git/info/exclude").read_text()
    assert git(git_target, "status", "--porcelain").strip() == ""


def test_tracked_installed_copy_is_reported_when_upgraded(fake_bundle, git_target):
    from fixtures_repo import git

    install_skill(target=git_target, agent="claude", force=False, source=fake_bundle)
    git(git_target, "add", "-f", ".claude")  # a team that commits the skill
    git(git_target, "commit", "-q", "-m", "vendor the skill")
    (fake_bundle / "SKILL.md").write_text("---\nname: cutile-perf\n---\nv2\n")
    out = install_skill(target=git_target, agent="claude", force=False, source=fake_bundle)
    assert out.data["exclude"]["still_changed"] == [".claude/skills/cutile-perf/.cutile-perf-manifest.json",
                                                    ".claude/skills/cutile-perf/SKILL.md"]
    assert "commit them before" in out.text


def test_upgrade_replaces_only_its_own_files(fake_bundle, git_target):
    install_skill(target=git_target, agent="codex", force=False, source=fake_bundle)
    dest = git_target / ".agents/skills/cutile-perf"
    (dest / "my-notes.md").write_text("mine\n")
    (fake_bundle / "references" / "knobs.md").write_text("knobs v2\n")
    (fake_bundle / "references" / "patterns.md").unlink()
    (fake_bundle / "references" / "new.md").write_text("new\n")
    out = install_skill(target=git_target, agent="codex", force=False, source=fake_bundle)
    entry = out.data["installed"][0]
    assert entry["written"] == ["references/knobs.md", "references/new.md"]
    assert entry["removed"] == ["references/patterns.md"] and entry["unchanged"] == ["SKILL.md"]
    assert (dest / "my-notes.md").read_text() == "mine\n"
    assert not (dest / "references/patterns.md").exists()


def test_non_git_target_installs_and_says_nothing_was_excluded(fake_bundle, target):
    out = install_skill(target=target, agent="claude", force=False, source=fake_bundle)
    assert out.data["exclude"]["repository"] is None
    assert "not in a git repository" in out.text


# --- the installed copy stands on its own ----------------------------------------------------------

# References that record how our H200 figures were produced: their commands run in a cutile-perf
# checkout (each says so), so paths into benchmarks/ or tests/ there are provenance, not links.
CHECKOUT_NOTES = {"references/h200-measurements.md", "references/triton-tileir.md", "references/harness.md",
                  "references/autotuning.md", "references/optimization-playbook.md"}


def _parse_problems(command: str) -> str | None:
    """Why ``command`` does not parse with the real CLI parser, or None when it does."""
    import contextlib
    import io
    import shlex

    from cutile_perf import cli

    argv = shlex.split(command)[1:]
    if len(argv) == 1:  # a bare `cutile-perf probe` names the command; it is not a call
        return None if argv[0] in cli.subcommand_names() else "no such subcommand"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.build_parser().parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


def test_installed_copy_has_no_link_outside_itself_and_every_command_parses(tmp_path):
    import doccheck

    out = install_skill(target=tmp_path, agent="claude", force=False)
    dest = Path(out.data["installed"][0]["path"]).resolve()
    docs = sorted(dest.rglob("*.md"))
    assert {d.relative_to(dest).as_posix() for d in docs} >= {"SKILL.md", "references/knobs.md"}
    problems, commands = [], 0
    for doc in docs:
        rel = doc.relative_to(dest).as_posix()
        text = doc.read_text(encoding="utf-8")
        for link in sorted(doccheck.relative_links(text)):
            target = (doc.parent / link).resolve()
            if not target.exists() or dest not in (target, *target.parents):
                problems.append(f"{rel}: link {link} leaves the installed skill or is missing")
        for path in sorted(doccheck.local_paths(text)):
            # examples/ and templates/ are reached through `cutile-perf example` / `template`.
            if (dest / path).exists():
                continue
            if not path.startswith(("benchmarks/", "tests/")) or rel not in CHECKOUT_NOTES:
                problems.append(f"{rel}: path {path} does not exist where the skill is installed")
        for line, command in doccheck.command_mentions(text):
            commands += 1
            why = _parse_problems(command)
            if why:
                problems.append(f"{rel}:{line}: `{command}` does not parse: {why}")
    for rel in CHECKOUT_NOTES:
        assert "cutile-perf checkout" in (dest / rel).read_text(encoding="utf-8"), rel
    assert commands > 50  # the check saw the docs' commands, not an empty list
    assert not problems, "\n".join(problems)


def test_skill_starts_with_how_to_get_the_cli():
    text = (REPO_ROOT / "SKILL.md").read_text(encoding="utf-8")
    first_section = text.split("\n## ", 2)[1]
    assert first_section.startswith("Get the CLI")
    for needed in ("pip install", "cutile-perf --version", "cutile-perf env"):
        assert needed in first_section, needed


def test_command_mentions_cuts_at_shell_syntax():
    import doccheck

    text = ("Run `cutile-perf example show rms_norm --step 04 > k.py` then\n"
            "```bash\ncutile-perf try \"a -> b\" | tee log  # note\ncutile-perf init --kernel k \\\n"
            "    --test t.py\n```\n")
    assert doccheck.command_mentions(text) == [
        (1, "cutile-perf example show rms_norm --step 04"), (3, 'cutile-perf try "a -> b"'),
        (4, "cutile-perf init --kernel k --test t.py")]


# --- install, then the whole loop, in a simulated TileGym-shaped repository -----------------------


def test_loop_runs_in_a_repo_with_the_skill_installed(tilegym_like_repo, capsys):
    # Regression: the installed skill dirs were untracked files, so `init` saw a dirty tree and
    # every `try` refused with "changes outside the fence" (issue 10).
    from fixtures_repo import KERNEL_REL, allow_no_gpu, edit_kernel, git

    from cutile_perf.cli import main

    repo = tilegym_like_repo

    def cli(*args: str) -> tuple[int, dict]:
        code = main([*args, "--repo", str(repo), "--json"])
        return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert cli("install-skill", "--target", str(repo))[0] == 0
    code, data = cli("init", "--kernel", "rms_norm", "--timeout", "60")
    assert code == 0, data
    allow_no_gpu(repo)
    code, data = cli("baseline", "--repeats", "2")
    assert code == 0, data
    assert cli("install-skill", "--target", str(repo))[0] == 0  # a re-install mid-session is harmless
    edit_kernel(repo, latency={"256x1024": 0.5, "4096x1024": 1.0})
    code, data = cli("try", "B: persistent grid")
    assert (code, data["decision"]) == (0, "keep"), data
    assert git(repo, "show", "--name-only", "--format=", "HEAD").split() == [KERNEL_REL]
    assert git(repo, "status", "--porcelain").strip() == ""
    for sub in skill_dirs()[:2]:  # --agent all: Claude Code's and Codex's folders (Cursor reads both)
        assert (repo / sub / "SKILL.md").is_file()


def test_installed_files_are_readable_by_all_0644(fake_bundle, target):
    # Issue 21: the atomic writer's temp files made every installed file 0600.
    old = os.umask(0o022)
    try:
        install_skill(target=target, agent="claude", force=False, source=fake_bundle)
    finally:
        os.umask(old)
    dest = target / ".claude/skills/cutile-perf"
    modes = {str(p.relative_to(dest)): stat.S_IMODE(p.stat().st_mode) for p in dest.rglob("*") if p.is_file()}
    assert modes and set(modes.values()) == {0o644}, modes

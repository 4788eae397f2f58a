"""`cutile-perf install-skill`: copies the skill where agents look, never clobbers a user's edits."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cutile_perf.commands.install_skill import MANIFEST, install_skill, plan_install
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
        install_skill(target=tmp_path, agent="cursor", force=False, source=fake_bundle)
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

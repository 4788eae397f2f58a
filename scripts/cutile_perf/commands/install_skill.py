"""`cutile-perf install-skill`: copy SKILL.md and references/ where coding agents look for skills.

Claude Code reads ``<repo>/.claude/skills/<name>/``; Codex and other agentskills.io readers read
``<repo>/.agents/skills/<name>/``. Each installed copy carries a manifest of the sha256 of every
file as it was written, so a later install can tell "our old copy" (safe to replace) from "a file
the user edited" (refused unless ``force``; even then the user's version is kept as ``<file>.bak``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf import __version__, atomic, checkout_root
from cutile_perf.commands import Outcome, say
from cutile_perf.errors import EnvMissing, Refused, UsageError

SKILL_NAME = "cutile-perf"
MANIFEST = ".cutile-perf-manifest.json"
AGENT_DIRS: dict[str, Path] = {
    "claude": Path(".claude") / "skills" / SKILL_NAME,
    "codex": Path(".agents") / "skills" / SKILL_NAME,
}
AGENT_CHOICES = (*AGENT_DIRS, "all")


def bundle_root() -> Path:
    """The checkout that holds SKILL.md: the package lives in <root>/scripts/cutile_perf/."""
    root = checkout_root()
    if not (root / "SKILL.md").is_file():
        raise EnvMissing(
            f"SKILL.md not found next to the cutile-perf package (looked in {root})",
            "install cutile-perf from a checkout: pip install -e <checkout>",
        )
    return root


def skill_files(root: Path) -> dict[str, bytes]:
    """Relative path -> content of every file the installed skill needs."""
    files = {"SKILL.md": (root / "SKILL.md").read_bytes()}
    for path in sorted((root / "references").glob("*.md")):
        files[f"references/{path.name}"] = path.read_bytes()
    return files


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Plan:
    """What installing into one directory would do, decided before anything is written."""

    dest: Path
    write: dict[str, bytes] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    user_modified: list[str] = field(default_factory=list)  # differs from what we last wrote
    remove: list[str] = field(default_factory=list)  # ours, unmodified, no longer in the bundle


def plan_install(dest: Path, files: dict[str, bytes]) -> Plan:
    """Compare the bundle with ``dest`` and its manifest. Pure apart from reading ``dest``."""
    manifest_path = dest / MANIFEST
    recorded: dict[str, str] = {}
    if manifest_path.is_file():
        try:
            recorded = json.loads(manifest_path.read_text(encoding="utf-8")).get("files", {})
        except (ValueError, AttributeError):
            recorded = {}  # a damaged manifest: treat every existing file as the user's
    plan = Plan(dest=dest)
    for rel, data in files.items():
        target = dest / rel
        if not target.exists():
            plan.write[rel] = data
            continue
        current = _sha(target.read_bytes())
        if current == _sha(data):
            plan.unchanged.append(rel)
        elif recorded.get(rel) == current:
            plan.write[rel] = data  # our previous copy, untouched since: an upgrade
        else:
            plan.user_modified.append(rel)
            plan.write[rel] = data
    for rel, sha in recorded.items():
        target = dest / rel
        if rel not in files and target.is_file() and _sha(target.read_bytes()) == sha:
            plan.remove.append(rel)
    return plan


def refuse_user_edits(plans: list[Plan]) -> None:
    """Raise before anything is written if any destination holds files the user changed."""
    modified = [str(plan.dest / rel) for plan in plans for rel in plan.user_modified]
    if modified:
        raise Refused(
            f"refusing to overwrite files changed since cutile-perf installed them: {', '.join(modified)}",
            "keep your edits elsewhere, or re-run with --force (your versions are saved as <file>.bak)",
        )


def apply_plan(plan: Plan, files: dict[str, bytes]) -> list[str]:
    """Write the plan; return the backups made of user-modified files (kept as ``<file>.bak``)."""
    backups = []
    for rel in plan.user_modified:
        target = plan.dest / rel
        backup = target.with_name(target.name + ".bak")
        atomic.write_bytes(backup, target.read_bytes())  # saved before the overwrite below
        backups.append(str(backup))
    for rel, data in plan.write.items():
        atomic.write_bytes(plan.dest / rel, data)
    for rel in plan.remove:
        (plan.dest / rel).unlink()
    manifest = {"skill": SKILL_NAME, "cutile_perf": __version__, "files": {rel: _sha(d) for rel, d in files.items()}}
    atomic.write_bytes(plan.dest / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return backups


def install_skill(*, target: Path, agent: str, force: bool, source: Path | None = None) -> Outcome:
    if agent not in AGENT_CHOICES:
        raise UsageError(f"--agent {agent!r}: expected one of {', '.join(AGENT_CHOICES)}")
    target = Path(target)
    if not target.is_dir():
        raise UsageError(f"--target {target}: not a directory")
    root = Path(source) if source else bundle_root()
    files = skill_files(root)
    agents = list(AGENT_DIRS) if agent == "all" else [agent]
    plans = [plan_install(target / AGENT_DIRS[a], files) for a in agents]
    if not force:
        # Checked for every destination before writing any, so a refusal leaves nothing half-installed.
        refuse_user_edits(plans)
    data: dict = {"target": str(target), "installed": [], "backups": []}
    for agent_name, plan in zip(agents, plans):
        backups = apply_plan(plan, files)
        say(f"{agent_name}: {plan.dest} ({len(plan.write)} written, {len(plan.unchanged)} unchanged)")
        data["installed"].append({
            "agent": agent_name,
            "path": str(plan.dest),
            "written": sorted(plan.write),
            "unchanged": sorted(plan.unchanged),
            "removed": sorted(plan.remove),
        })
        data["backups"].extend(backups)
    dests = ", ".join(str(p.dest) for p in plans)
    text = f"installed the {SKILL_NAME} skill ({len(files)} files) into {dests}"
    if data["backups"]:
        text += f"; your edited copies were saved as: {', '.join(data['backups'])}"
    return Outcome(text=text, data=data)

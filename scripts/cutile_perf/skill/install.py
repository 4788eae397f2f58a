"""`cutile-perf install-skill`: copy SKILL.md and references/ where coding agents look for skills.

Claude Code reads ``<repo>/.claude/skills/<name>/``; Codex and other agentskills.io readers read
``<repo>/.agents/skills/<name>/``; Cursor reads ``<repo>/.cursor/skills/<name>/`` (and both others). Each installed copy carries a manifest of the sha256 of every
file as it was written, so a later install can tell "our old copy" (safe to replace) from "a file
the user edited" (refused unless ``force``; even then the user's version is kept as ``<file>.bak``).

The installed directories must never block the loop: untracked files there would make ``init``
see a dirty tree and ``try`` see changes outside the fence. So they are added to the target's
``.git/info/exclude`` (local to the clone, never the user's tracked ``.gitignore``), and
``is_installed_skill_path`` lets the fence check ignore them even where the exclude is not in
effect (a clone made after the install, or a repository that tracks them).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from cutile_perf import __version__
from cutile_perf.skill import assets
from cutile_perf.store import atomic
from cutile_perf.output import Outcome, say
from cutile_perf.errors import Refused, UsageError
from cutile_perf.store import git_ops

SKILL_NAME = "cutile-perf"
MANIFEST = ".cutile-perf-manifest.json"
AGENT_DIRS: dict[str, Path] = {
    "claude": Path(".claude") / "skills" / SKILL_NAME,
    "codex": Path(".agents") / "skills" / SKILL_NAME,
    "cursor": Path(".cursor") / "skills" / SKILL_NAME,
}
# What `--agent all` (the default) writes. Cursor reads `.claude/skills/` and `.agents/skills/` as
# well as its own folder, so a third copy would only show it the skill twice; `--agent cursor`
# writes `.cursor/skills/` for a repository that keeps only Cursor's.
ALL_AGENTS = ("claude", "codex")
AGENT_CHOICES = (*AGENT_DIRS, "all")


def skill_dirs() -> tuple[str, ...]:
    """The repository-relative directories an install writes, as POSIX paths ending in ``/``."""
    return tuple(p.as_posix() + "/" for p in AGENT_DIRS.values())


def is_installed_skill_path(path: str) -> bool:
    """True when the repo-relative ``path`` lies in a directory ``install-skill`` writes.

    The fence check ignores such paths: an installed (or upgraded) skill is not a change to the
    kernel, and refusing ``try`` because of it would break the loop the skill teaches. Only our
    own skill name counts; another skill in ``.claude/skills/`` is still the user's change.
    """
    posix = path.replace("\\", "/").lstrip("/")
    while posix.startswith("./"):
        posix = posix[2:]
    return any(posix == d.rstrip("/") or posix.startswith(d) for d in skill_dirs())


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


def exclude_installed(target: Path, dests: list[Path]) -> dict:
    """Add each installed directory to the target repository's ``.git/info/exclude``.

    Returns what was done, for the report: the patterns added now, those already there, and the
    installed paths git still lists as changed (tracked copies the user committed). A target that is
    not in a git repository gets nothing; the fence rule (``is_installed_skill_path``) still holds.
    """

    try:
        repo = git_ops.open_repo(target)
    except UsageError:
        return {"repository": None, "added": [], "present": [], "still_changed": []}
    root = git_ops.root(repo).resolve()
    added, present = [], []
    for dest in dests:
        rel = dest.resolve().relative_to(root).as_posix()
        pattern = f"/{rel}/"
        if git_ops.exclude_locally(repo, pattern, comment=f"{SKILL_NAME} skill, written by cutile-perf install-skill"):
            added.append(pattern)
        else:
            present.append(pattern)
    prefixes = tuple(dest.resolve().relative_to(root).as_posix() + "/" for dest in dests)
    still = [p for p in git_ops.changed_paths(repo) if p.startswith(prefixes)]
    return {"repository": str(root), "added": added, "present": present, "still_changed": still}


def install_skill(*, target: Path, agent: str, force: bool, source: Path | None = None) -> Outcome:
    if agent not in AGENT_CHOICES:
        raise UsageError(f"--agent {agent!r}: expected one of {', '.join(AGENT_CHOICES)}")
    target = Path(target)
    if not target.is_dir():
        raise UsageError(f"--target {target}: not a directory")
    root = Path(source) if source else assets.skill_source()
    files = skill_files(root)
    agents = list(ALL_AGENTS) if agent == "all" else [agent]
    plans = [plan_install(target / AGENT_DIRS[a], files) for a in agents]
    if not force:
        # Checked for every destination before writing any, so a refusal leaves nothing half-installed.
        refuse_user_edits(plans)
    data: dict = {"target": str(target), "installed": [], "backups": []}
    changed = 0
    for agent_name, plan in zip(agents, plans):
        backups = apply_plan(plan, files)
        changed += len(plan.write) + len(plan.remove)
        say(f"{agent_name}: {plan.dest} ({len(plan.write)} written, {len(plan.unchanged)} unchanged, "
            f"{len(plan.remove)} removed)")
        data["installed"].append({
            "agent": agent_name,
            "path": str(plan.dest),
            "written": sorted(plan.write),
            "unchanged": sorted(plan.unchanged),
            "removed": sorted(plan.remove),
        })
        data["backups"].extend(backups)
    data["exclude"] = exclude_installed(target, [plan.dest for plan in plans])
    dests = ", ".join(str(p.dest) for p in plans)
    if changed:
        text = f"installed the {SKILL_NAME} skill ({len(files)} files, {changed} written or removed) into {dests}"
    else:
        text = f"the {SKILL_NAME} skill in {dests} is already up to date ({len(files)} files)"
    exclude = data["exclude"]
    if exclude["repository"] is None:
        text += "; not in a git repository, so nothing was added to .git/info/exclude"
    elif exclude["added"]:
        text += f"; added {', '.join(exclude['added'])} to .git/info/exclude"
    if exclude["still_changed"]:
        text += (f"; git still lists {len(exclude['still_changed'])} installed file(s) as changed (they are tracked): "
                 "commit them before `cutile-perf init`")
    if data["backups"]:
        text += f"; your edited copies were saved as: {', '.join(data['backups'])}"
    return Outcome(text=text, data=data)

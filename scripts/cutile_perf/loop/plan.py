"""A batch plan: several prepared versions of the fenced files, each tried as its own iteration.

When the GPU is remote, queued or billed by the minute, an agent prepares its candidates where it
works (and checks them with ``compile-check``), then spends one GPU job on all of them:
``cutile-perf batch plan.yaml --job-seconds 600``. Each entry is still one change, one ``try``, one
decision: the batch only saves the round trips, never the rule. Candidates live in ``sandbox/``,
which git never sees, so they cannot trip the fence check or end up in a commit. The file:

    tries:
      - optimization: "whole row in one tile"
        files: {src/pkg/ops/cutile/rms_norm.py: sandbox/cand/whole_row.py}
      - optimization: "occupancy 4"
        files: {src/pkg/ops/cutile/rms_norm.py: sandbox/cand/occ4.py}

Parsing, checking and naming entries are done here; ``loop/batch.py`` runs the plan.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import yaml

from cutile_perf.errors import UsageError, clean_text, yaml_problem

CANDIDATE_DIR = "sandbox/"
EXAMPLE = 'tries: [{optimization: "occupancy 4", files: {<fenced kernel>: sandbox/cand/occ4.py}}]'


@dataclass(frozen=True)
class PlannedTry:
    optimization: str
    files: tuple[tuple[str, str], ...]  # (fenced target, candidate), both repo-relative


def _rel(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"plan: {what} must be a repo-relative path, not {value!r}", EXAMPLE)
    path = PurePosixPath(value.strip())
    if path.is_absolute() or ".." in path.parts:
        raise UsageError(f"plan: {what} {value!r} must be repo-relative, without '..'", EXAMPLE)
    return path.as_posix()


def parse(text: str) -> list[PlannedTry]:
    """The plan's entries, in order; any malformed part is one UsageError naming it."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(f"plan is not valid YAML, {yaml_problem(exc)}", EXAMPLE) from exc
    entries = data.get("tries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UsageError("plan needs a non-empty list under 'tries'", EXAMPLE)
    plan = []
    for n, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or set(entry) - {"optimization", "files"}:
            raise UsageError(f"plan entry {n} must have exactly 'optimization' and 'files'", EXAMPLE)
        # Into the log and every view, like a try's description: terminal control out, UTF-8 only.
        optimization = clean_text(str(entry.get("optimization") or ""), f"plan entry {n} optimization")
        if not optimization:
            raise UsageError(f"plan entry {n} has no optimization description", EXAMPLE)
        files = entry.get("files")
        if not isinstance(files, dict) or not files:
            raise UsageError(f"plan entry {n} ({optimization}) needs 'files': {{fenced file: candidate}}", EXAMPLE)
        pairs = tuple((_rel(t, f"entry {n} target"), _rel(c, f"entry {n} candidate")) for t, c in files.items())
        plan.append(PlannedTry(optimization, pairs))
    return plan


def check(plan: list[PlannedTry], *, root: Path, fenced) -> None:
    """Refuse the whole plan before anything runs: every target fenced, every candidate a file in sandbox/."""
    for n, entry in enumerate(plan, 1):
        for target, candidate in entry.files:
            if not fenced(target):
                # ``Session.fenced``, not ``in_fence``: sandbox/ is scratch space for try, but a batch
                # that copied over sandbox/session.yaml or the log would rewrite the session's records.
                raise UsageError(f"plan entry {n} ({entry.optimization}): {target} is not in the session's fence",
                                 "a batch can only change what try could")
            if (root / target).is_symlink():  # copying over it would write wherever it points
                raise UsageError(f"plan entry {n} ({entry.optimization}): target {target} is a symlink")
            if not candidate.startswith(CANDIDATE_DIR):
                raise UsageError(f"plan entry {n} ({entry.optimization}): candidate {candidate} is not under "
                                 f"{CANDIDATE_DIR}", "keep candidates in sandbox/, which git never sees")
            path = root / candidate
            if path.is_symlink() or not path.is_file():
                raise UsageError(f"plan entry {n} ({entry.optimization}): candidate {candidate} is not a file")


def digest(entry: PlannedTry, root: Path) -> str:
    """What identifies an entry across jobs: its description, targets and candidates' bytes. Its
    row carries it (``plan_entry``), so a later job skips an entry already decided, and tries one
    again whose candidate was edited since."""
    h = hashlib.sha256(" ".join(entry.optimization.split()).encode("utf-8"))
    for target, candidate in entry.files:
        h.update(b"\0" + target.encode("utf-8") + b"\0" + (root / candidate).read_bytes())
    return h.hexdigest()[:20]

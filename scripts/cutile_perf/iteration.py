"""Pieces shared by ``baseline``, ``try`` and ``resume``: log entries, patches, reverts, timings.

The order of the destructive steps is the safety rule: the candidate's patch is written to disk and
its path logged *before* the work tree is reset, so a kill at any point leaves the work recoverable.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import re
import time
from dataclasses import dataclass, field

from cutile_perf import atomic, envcheck, git_ops, log, render
from cutile_perf.errors import EnvMissing, Refused
from cutile_perf.session import Session


def slug(text: str, limit: int = 40) -> str:
    """``"occupancy 2 -> 4"`` -> ``"occupancy-2-4"``: a file-name-safe summary."""
    value = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (value[:limit].rstrip("-")) or "change"


@dataclass
class Clock:
    """Wall time of the command and time spent inside pytest children, for the overhead figure."""

    start: float = field(default_factory=time.monotonic)
    children_s: float = 0.0

    def add_child(self, seconds: float) -> None:
        self.children_s += seconds

    def timings(self) -> dict[str, float]:
        total = time.monotonic() - self.start
        return {"total_s": round(total, 4), "children_s": round(self.children_s, 4),
                "harness_s": round(max(total - self.children_s, 0.0), 4)}


def require_gpu(session: Session, probe: envcheck.Probe) -> None:
    """Refuse (EnvMissing, exit 3) before anything is touched when no usable GPU is found.

    Without a GPU the perf tests skip and every iteration would end as a ``no-record`` crash row.
    ``require_gpu: false`` in session.yaml turns the gate off (the CPU test suite's simulated repo).
    """
    if not session.require_gpu:
        return
    env = probe.result()
    if env.gpu is None:
        # nvidia-smi found nothing; torch may still see a GPU (a container without nvidia-smi).
        # Slow (imports torch), so only on this rare path.
        env = envcheck.check(with_torch=True)
    if env.gpu_problems:
        raise EnvMissing("no usable GPU: " + "; ".join(p.message for p in env.gpu_problems),
                         "nothing was changed; `cutile-perf env` shows what this machine has")


def require_session_branch(session: Session, g) -> None:
    """Refuse (exit 3) unless the session branch is checked out.

    Right after ``init`` the user's branch and the session branch are the same commit, so the HEAD
    check alone would let ``try`` commit onto ``main`` (or onto a detached HEAD, where the commit is
    lost at the next checkout), and ``resume`` reset ``main``'s own commits away.
    """
    branch = git_ops.current_branch(g)
    if branch != session.branch:
        where = "a detached HEAD" if branch is None else f"branch {branch}"
        raise Refused(f"the repository is on {where}, not the session branch {session.branch}",
                      f"git checkout {session.branch}, then run the command again")


def fenced_changes(session: Session, changed: list[str]) -> list[str]:
    """The changed paths an iteration owns: inside the fence, sandbox excluded."""
    return [p for p in changed if session.in_fence(p) and not p.startswith("sandbox/")]


def fingerprint(session: Session, paths: list[str]) -> dict[str, str | None]:
    """sha256 of each path's bytes (None when absent): what the tests are about to measure."""
    out: dict[str, str | None] = {}
    for rel in paths:
        target = session.repo / rel
        out[rel] = hashlib.sha256(target.read_bytes()).hexdigest() if target.is_file() else None
    return out


def save_patch(session: Session, g, base: str, paths: list[str], name: str, *, to_commit: str | None = None) -> str | None:
    """Write the diff base -> work tree (or -> ``to_commit``) of ``paths`` to ``sandbox/patches/<name>.patch``.

    Returns the patch's repo-relative path, or None when there was nothing to save.
    """
    patch = git_ops.diff_commits(g, base, to_commit, paths) if to_commit else git_ops.diff_patch(g, base, paths)
    if not patch.strip():
        return None
    target = session.sandbox / "patches" / f"{name}.patch"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(target, patch)
    return str(target.relative_to(session.repo))


def paths_touched(session: Session, g, base: str) -> list[str]:
    """Fenced paths that differ from ``base`` in HEAD or in the work tree."""
    committed = git_ops.changed_between(g, base, "HEAD") if git_ops.head(g) != base else []
    return sorted({*fenced_changes(session, committed), *fenced_changes(session, git_ops.changed_paths(g))})


def base_entry(session: Session, *, iteration: int, optimization: str, status: str, correctness: str,
               commit: str | None, base_commit: str | None, clock: Clock, probe: envcheck.Probe | None = None,
               **extra) -> dict:
    """One log record with the provenance every entry carries; ``probe``: the command's environment check."""
    entry = {
        "iteration": iteration,
        "optimization": optimization,
        "status": status,
        "correctness": correctness,
        "commit": commit,
        "base_commit": base_commit,
        "kernel": session.kernel,
        "branch": session.branch,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "env": probe.result().record() if probe is not None else envcheck.snapshot(),
    }
    entry.update(extra)
    entry["timings"] = clock.timings()
    return entry


def record(session: Session, entry: dict) -> list[dict]:
    """Append ``entry`` (fsync'd by ``log``), then re-render perf_results.md from the whole log."""
    log.append_entry(session.log_path, entry)
    entries = log.read_entries(session.log_path)
    atomic.write_text(session.results_path, render.render_perf_results(entries))
    return entries


def kept_commit(session: Session, entries: list[dict]) -> str:
    """The commit the repository must sit at: the last kept entry's (a "no-change" keep included,
    even though its numbers do not become the baseline), or the session's base commit."""
    for entry in reversed(entries):
        if entry.get("status") == "keep" and entry.get("commit"):
            return entry["commit"]
    return session.base_commit


def noise_of(entries: list[dict]) -> dict[str, float]:
    """The per-shape noise floor measured by the latest baseline run."""
    for entry in reversed(entries):
        if entry.get("noise"):
            return entry["noise"]
    return {}


def shapes_field(medians: dict[str, float], test_ids: dict[str, str],
                 runs: dict[str, list[float]] | None = None) -> dict[str, dict]:
    """The log's per-shape record: median ms, the pytest node id and, when repeated, each run's median."""
    out = {}
    for sid, median in medians.items():
        out[sid] = {"median": median, "test_id": test_ids.get(sid)}
        if runs and sid in runs:
            out[sid]["runs"] = runs[sid]
    return out

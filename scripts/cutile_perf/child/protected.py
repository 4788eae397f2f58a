"""The user's files a test child may not change, snapshotted before it runs and put back after.

Test files, conftests, pytest and packaging configuration, ``session.yaml`` and the log: a child
that changes one is caught (``tampered``), the file is restored at once, and the changed bytes are
kept in ``sandbox/tampered/<tag>/`` for a reader to see what the child wrote.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cutile_perf.store import atomic, remove_tree, safe_read
from cutile_perf.store.session import Session

CONFIG_NAMES = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "setup.py", "tox.ini")


def protected_paths(session: Session, tracked: Iterable[str]) -> list[str]:
    """The user's files a child may not change: test files, conftests, config, session.yaml, the log."""
    out = [p for p in tracked if not session.in_fence(p) and (
        Path(p).name in CONFIG_NAMES or Path(p).name.startswith("test_") or p == session.test)]
    return sorted({*out, "sandbox/session.yaml", "sandbox/experiments.jsonl"})


# A protected file of the user's is kept in memory while a child runs, to be put back if it changes.
SNAPSHOT_LIMIT = 64 * safe_read.MB


def snapshot(root: Path, paths: Iterable[str]) -> dict[str, bytes | str | None]:
    """Each protected file's bytes (None: not there). A file that is not a regular file, or is over
    ``SNAPSHOT_LIMIT``, is never read: its fingerprint (``safe_read.digest``) stands for it, so a
    change is still seen; only its bytes cannot be put back."""
    out: dict[str, bytes | str | None] = {}
    for rel in paths:
        try:
            out[rel] = safe_read.read_bytes(root / rel, SNAPSHOT_LIMIT)
        except (FileNotFoundError, NotADirectoryError):
            out[rel] = None
        except OSError:
            out[rel] = safe_read.digest(root / rel)
    return out


def digest_tree(root: Path, paths: Iterable[str]) -> dict[str, str | None]:
    """A fingerprint of each file (``safe_read.digest``: a FIFO, device or link a child put in a
    file's place is named, never opened)."""
    return {rel: safe_read.digest(root / rel) for rel in paths}


def restore(root: Path, saved: dict[str, bytes | None], paths: Iterable[str]) -> None:
    """Put ``paths`` back as ``snapshot`` saw them (deleted where they were absent)."""
    for rel in paths:
        target = root / rel
        if saved[rel] is None:
            remove_tree.remove(target)  # a folder or a FIFO made in its place too
        elif isinstance(saved[rel], bytes):
            atomic.write_bytes(target, saved[rel])
        # else: it was never read (not a regular file, or too big): there are no bytes to put back


def put_back_changed(session: Session, tag: str, before: dict[str, bytes | str | None]) -> list[str]:
    """The protected files changed since ``before`` (a ``snapshot``), each restored at once; the
    changed bytes are kept in ``sandbox/tampered/<tag>/``."""
    after = snapshot(session.repo, before)
    touched = sorted(p for p in before if after[p] != before[p])
    saved_dir = session.sandbox / "tampered" / tag
    for rel in touched:
        if isinstance(after[rel], bytes):  # else not read: a FIFO, a device, a huge file
            (saved_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (saved_dir / rel).write_bytes(after[rel])
    restore(session.repo, before, touched)
    return touched

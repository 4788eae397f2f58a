"""One iteration as a transaction: a persisted state machine and the one revert sequence.

    started -> committed -> measured -> decided -> recorded -> settled

``sandbox/iteration.json`` holds the state and is rewritten atomically *after* each step is done,
so whatever stops the process (kill -9, Ctrl-C, SIGTERM, a full disk, a read-only log), ``resume``
knows exactly what happened and finishes the transaction the one consistent way:

=========== ================================================= ===================================
step        what is durable                                   resume
=========== ================================================= ===================================
started     the patch of the change (saved before anything)   log an ``interrupted`` row, reset
committed   + the candidate commit                            log an ``interrupted`` row, reset
measured    + the evidence                                    log an ``interrupted`` row, reset
decided     + the row to append                               append that row, settle by it
recorded    + the row is in the log (its hash is stored)      settle by it (no second row)
settled     nothing left to do                                remove the state
=========== ================================================= ===================================

Settling a row that is not a keep is ``revert_to_base``: save the latest work-tree content of the
fenced files as the row's patch, then move the branch back. It is the only revert in the loop.
"""
from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cutile_perf.store import atomic, git_ops, log
from cutile_perf.store.session import Session

STEPS = ("started", "committed", "measured", "decided", "recorded", "settled")
STATE_FILE = "iteration.json"
# Test hook (tests/test_redteam.py): stop the process right after a step is persisted.
_KILL_AT = "CUTILE_PERF_TEST_KILL_AT"
_KILL_SIGNAL = "CUTILE_PERF_TEST_SIGNAL"


@dataclass
class State:
    iteration: int
    optimization: str
    name: str  # "<iteration>-<slug>": patch and run-file names
    base: str  # the kept commit the branch returns to on anything but a keep
    reference: str  # the baseline commit the candidate is judged against
    paths: list[str]  # the fenced paths this iteration changes
    step: str = "started"
    patch: str | None = None
    candidate: str | None = None
    row: dict | None = None
    row_hash: str | None = None
    children: list[int] = field(default_factory=list)  # process groups of pytest children

    @staticmethod
    def path(session: Session) -> Path:
        return session.sandbox / STATE_FILE

    @classmethod
    def load(cls, session: Session) -> State | None:
        try:
            data = json.loads(cls.path(session).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise OSError(f"{cls.path(session)} is unreadable ({exc}); it records an interrupted iteration") from None
        return cls(**data)

    def save(self, session: Session) -> None:
        atomic.write_text(self.path(session), json.dumps(asdict(self), indent=1, default=str) + "\n")

    def advance(self, session: Session, step: str, **changes) -> None:
        """Record that ``step`` is done (with its data), durably, then honour the test kill hook."""
        if STEPS.index(step) < STEPS.index(self.step):
            raise ValueError(f"iteration state cannot go back from {self.step} to {step}")
        for key, value in changes.items():
            setattr(self, key, value)
        self.step = step
        self.save(session)
        _test_hook(step)

    def add_child(self, session: Session, pgid: int) -> None:
        # Children start from several threads (sharded correctness, a pre-started perf child): one
        # append-and-save at a time, or a later save could write a list without an earlier pgid.
        with _CHILDREN_LOCK:
            self.children.append(pgid)
            self.save(session)

    def clear(self, session: Session) -> None:
        self.path(session).unlink(missing_ok=True)


_CHILDREN_LOCK = threading.Lock()


def _test_hook(step: str) -> None:
    if os.environ.get(_KILL_AT) == step:
        name = os.environ.get(_KILL_SIGNAL, "KILL").upper()
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))


def end_children(pgids: list[int]) -> list[int]:
    """SIGKILL the recorded process groups that still exist (a kill -9 of ``try`` leaves them running)."""
    ended = []
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
            ended.append(pgid)
        except (ProcessLookupError, PermissionError):
            pass
    return ended


def save_patch(session: Session, g, base: str, paths: list[str], name: str) -> str | None:
    """Write the diff ``base`` -> work tree of ``paths`` (untracked files included) to ``sandbox/patches/``.

    Returns the repo-relative patch path, or None when there was nothing to save.
    """
    patch = git_ops.diff_patch(g, base, paths)
    if not patch.strip():
        return None
    target = session.sandbox / "patches" / f"{name}.patch"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(target, patch)
    return str(target.relative_to(session.repo))


def revert_to_base(session: Session, g, state: State) -> str | None:
    """Save the fenced files' latest content, then move the branch back to ``state.base``.

    The patch is re-saved from the work tree (not from the candidate commit), so an edit made while
    the tests ran is in it too. Files outside ``state.paths`` are never touched.
    """
    latest = save_patch(session, g, state.base, state.paths, state.name)
    git_ops.reset_to(g, state.base, state.paths)
    return latest or state.patch


def anchor_path(g, session: Session) -> Path:
    """Row count and head hash of the log, kept in git's own folder, out of the sandbox's reach."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in session.branch)
    return git_ops.git_common_dir(g) / "cutile-perf" / f"{safe}.anchor.json"


def append_row(session: Session, g, row: dict) -> str:
    """Append ``row`` to the log (chained), move the anchor, and return the row's hash."""
    digest = log.append_entry(session.log_path, row)
    log.anchor_of(session.log_path).write(anchor_path(g, session))
    return digest


def check_log(session: Session, g) -> str | None:
    """Where the log's chain or anchor is broken, or None."""
    anchor = log.Anchor.read(anchor_path(g, session))
    return log.check_chain(session.log_path, anchor)

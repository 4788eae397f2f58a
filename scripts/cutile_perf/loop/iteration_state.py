"""The persisted state of one iteration (``sandbox/iteration.json``): how far the transaction got.

``State`` is rewritten atomically after each step (``STEPS``), signed with a key kept in git's own
folder, so ``resume`` finishes a killed iteration from the file cutile-perf wrote and no other.
It also names the process groups of the iteration's pytest children, which ``resume`` ends
(``end_children``). The table of what each step makes durable is in ``loop/iteration.py``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.child import groups
from cutile_perf.errors import Refused
from cutile_perf.store import atomic, git_ops
from cutile_perf.store.session import Session

STEPS = ("started", "committed", "measured", "decided", "recorded", "settled")
STATE_FILE = "iteration.json"


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/<pid>/stat`` field 22), or None when it is gone.

    A pid and its start time name one process for the life of the machine: a pid reused by an
    unrelated process has another start time.
    """
    stat = groups.stat_fields(pid)
    return stat[19] if stat and len(stat) > 19 else None


def end_children(children: list) -> list[int]:
    """SIGKILL the recorded process groups that still exist (a kill -9 of ``try`` leaves them running).

    ``children``: ``[pgid, start time]`` pairs. A group is ended only when its leader still has the
    start time recorded when the harness started it: a reused pid is someone else's process.
    """
    ended = []
    for pgid, started in children:
        if started is None or process_start(pgid) != started:
            continue
        if groups.end_group(pgid):
            ended.append(pgid)
    return ended


def state_key(g) -> bytes:
    """The key ``iteration.json`` is signed with, kept in git's own folder beside the log's anchor
    (created on first use, readable by the user only)."""
    path = git_ops.git_common_dir(g) / "cutile-perf" / "state.key"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
        return key


_CHILDREN_LOCK = threading.Lock()


def _sign(key: bytes, data: dict) -> str:
    return hmac.new(key, json.dumps(data, sort_keys=True).encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass
class State:
    """How far one iteration got, persisted in ``file`` after every step, signed with ``key``.

    ``resume`` acts on this file (it appends the row it holds and ends the process groups it
    names), so a file cutile-perf did not write is refused: the signature is an HMAC under a key
    kept in git's folder (``state_key``).
    """

    file: Path
    key: bytes
    iteration: int
    optimization: str
    name: str  # patch_name(): "<iteration, 3 digits>-<slug>", the saved patch's name
    base: str  # the kept commit the branch returns to on anything but a keep
    reference: str  # the baseline commit the candidate is judged against
    paths: list[str]  # the fenced paths this iteration changes
    step: str = "started"
    patch: str | None = None
    candidate: str | None = None
    row: dict | None = None
    row_hash: str | None = None
    children: list = field(default_factory=list)  # [pgid, start time] of each pytest child's group
    plan_entry: str | None = None  # the batch plan entry this change is (``plan.digest``), carried into its row

    @staticmethod
    def path(session: Session) -> Path:
        return session.sandbox / STATE_FILE

    @classmethod
    def exists(cls, session: Session) -> bool:
        return cls.path(session).exists()

    @classmethod
    def load(cls, session: Session, key: bytes) -> State | None:
        file = cls.path(session)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise OSError(f"{file} is unreadable ({exc}); it records an interrupted iteration") from None
        signature = data.pop("signature", None) if isinstance(data, dict) else None
        if not isinstance(signature, str) or not hmac.compare_digest(signature, _sign(key, data)):
            raise Refused(f"{file.relative_to(session.repo)} is not the state cutile-perf wrote (its signature does "
                          "not match)", "nothing was done; if no iteration was interrupted, delete the file, then "
                          "run `cutile-perf resume` (the log and git say what was recorded)")
        known = {f.name for f in fields(cls)} - {"file", "key"}
        return cls(file=file, key=key, **{k: v for k, v in data.items() if k in known})

    def save(self) -> None:
        data = json.loads(json.dumps({k: v for k, v in asdict(self).items() if k not in ("file", "key")}, default=str))
        data["signature"] = _sign(self.key, data)
        atomic.write_text(self.file, json.dumps(data, indent=1) + "\n")

    def advance(self, step: str, **changes) -> None:
        """Record that ``step`` is done (with its data), durably, then honour the test kill hook."""
        if STEPS.index(step) < STEPS.index(self.step):
            raise ValueError(f"iteration state cannot go back from {self.step} to {step}")
        for key, value in changes.items():
            setattr(self, key, value)
        self.step = step
        self.save()
        knobs.kill_point(step)

    def add_child(self, pgid: int) -> None:
        # Children start from several threads (sharded correctness, a pre-started perf child): one
        # append-and-save at a time, or a later save could write a list without an earlier pgid.
        with _CHILDREN_LOCK:
            self.children.append([pgid, process_start(pgid)])
            self.save()

    def clear(self) -> None:
        self.file.unlink(missing_ok=True)


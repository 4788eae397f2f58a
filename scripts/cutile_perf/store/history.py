"""The session's history: the log, read once per command, and every question about the loop's state.

"Which row is the baseline?", "which commit must HEAD be?", "how noisy is each case?", "what is the
next iteration?", "what did the session freeze?" each have exactly one method here; ``render``,
``verify``, ``status``, ``report``, the judge's ``Reference`` and the evals ask them. ``store.log``
reads and writes lines, ``judge`` decides, this module interprets. Every command that reads the log
opens it here, so none shows or uses a log that ``try`` would refuse.

``History.open`` reads the log's bytes once, checks the hash chain against the anchor that
cutile-perf keeps in git's own folder (``anchor_path``) and the session settings against the ones
the baseline froze, and keeps the rows in memory for the rest of the command.

``History.record`` is the loop's one durable write, idempotent in each part (``docs/design.md``,
"The loop core").

It lives in ``store`` because it only reads, checks and appends rows: the views
(``loop.render.write_perf_results``) and the time a try takes (``loop.budget.timed``) are
computed by their callers from ``History.rows``, so a command that only reads the log
(``status``, ``report``) never climbs into the loop to open it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cutile_perf import knobs
from cutile_perf.errors import Refused
from cutile_perf.judge.rules import (Thresholds, current_baseline, moved_performance, stop_condition,
                                     was_interrupted)
from cutile_perf.judge.verdict import Reference
from cutile_perf.store import git_ops, log
from cutile_perf.store.log import shape_medians
from cutile_perf.store.session import Session


def anchor_path(g, session: Session) -> Path:
    """Row count and head hash of the log, kept in git's own folder, out of the sandbox's reach."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in session.branch)
    return git_ops.git_common_dir(g) / "cutile-perf" / f"{safe}.anchor.json"


def canonical(row: dict) -> dict:
    """A row as the log stores it (JSON types, no chain link): what a logged row is compared by."""
    return {k: v for k, v in json.loads(log.entry_line(row)).items() if k != "prev"}


@dataclass(frozen=True)
class Entry:
    """One log row, read through named properties; ``data`` is the row as logged."""

    data: dict

    @property
    def iteration(self) -> int:
        return self.data.get("iteration", -1)

    @property
    def status(self) -> str | None:
        return self.data.get("status")

    @property
    def commit(self) -> str | None:
        return self.data.get("commit")

    @property
    def kept(self) -> bool:
        return self.status == "keep"

    @property
    def moved_performance(self) -> bool:
        return moved_performance(self.data)

    @property
    def medians(self) -> dict[str, float]:
        return shape_medians(self.data)


class History:
    """The log of one session, in memory. Open it once per command with ``History.open``."""

    def __init__(self, rows, *, session: Session | None = None, g=None, head: str = log.GENESIS,
                 broken: str | None = None):
        """``rows`` as logged; ``session`` and ``g`` are needed only to ``record`` (and for the
        session's base commit and thresholds): ``History(rows)`` answers questions about any rows."""
        self.session, self.g = session, g
        self._head = head  # the hash the next row's ``prev`` carries
        self.entries: list[Entry] = [Entry(dict(r)) for r in rows]
        self.broken = broken  # where the chain or anchor breaks (opened with strict=False), else None

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    def open(cls, session: Session, g, *, strict: bool = True, pending_row: dict | None = None) -> History:
        """Read and check the log. ``strict`` (every command that changes anything): refuse (exit 3)
        a log that is not the one cutile-perf wrote, or session settings edited after the baseline.
        ``pending_row``: the row an interrupted iteration was recording; if exactly that row sits
        beyond the anchor, it is ours (the kill fell between the append and the anchor move)."""
        snapshot = log.Snapshot.read(session.log_path)
        anchor = log.Anchor.read(anchor_path(g, session))
        rows = snapshot.contents.entries
        broken = log.check_lines(snapshot.lines, anchor)
        if broken and pending_row is not None and anchor is not None and len(snapshot.lines) == anchor.rows + 1 \
                and log.check_lines(snapshot.lines[:-1], anchor) is None and log.check_lines(snapshot.lines) is None \
                and rows and canonical(rows[-1]) == canonical(pending_row):
            broken = None  # our own row: the kill fell between the append and the anchor move
        history = cls(rows, session=session, g=g, head=snapshot.anchor().head, broken=broken)
        if strict:
            history._refuse_if_altered()
        return history

    def _refuse_if_altered(self) -> None:
        session = self.session
        if self.broken:
            raise Refused(f"{session.log_path.relative_to(session.repo)} is not the log cutile-perf wrote: "
                          f"{self.broken}", "restore it from a backup or start a new session; `cutile-perf status` "
                          "shows the rows")
        frozen = self.frozen()
        if frozen is not None:
            now = session.frozen()
            # A setting the baseline did not freeze (a log from before it was frozen) is not compared:
            # the session it belongs to never promised it.
            edited = sorted(k for k in set(frozen) if not _same_frozen(k, frozen.get(k), now.get(k)))
            if edited:
                raise Refused(f"sandbox/session.yaml changed after the baseline froze it ({', '.join(edited)})",
                              "put the file back as it was (the log's first row holds the frozen values) or start "
                              "a new session with init")

    # -- the one durable write ------------------------------------------------------------------------

    def record(self, row: dict) -> str:
        """Append ``row`` once and move the anchor; returns the row's hash. Idempotent: after a kill
        anywhere inside, calling it again with the same row completes the same state. The caller
        re-renders the view from ``rows`` (``loop.render.write_perf_results``)."""
        path = self.session.log_path
        if self.entries and canonical(self.entries[-1].data) == canonical(row):
            digest = self._head  # already appended by a run that was stopped after it
        else:
            digest = log.append_entry(path, row)
            self.entries.append(Entry(canonical(row)))
            self._head = digest
            knobs.kill_point("record:appended")
        log.anchor_of(path).write(anchor_path(self.g, self.session))
        knobs.kill_point("record:anchored")
        return digest

    # -- questions ------------------------------------------------------------------------------------

    def head_hash(self) -> str:
        """The hash of the last row (what the next row's ``prev`` carries; a kept commit's ``Log-Prev``)."""
        return self._head

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def rows(self) -> list[dict]:
        """The rows as logged, for the renderers."""
        return [e.data for e in self.entries]

    def first(self) -> dict | None:
        return self.entries[0].data if self.entries else None

    def last(self) -> dict | None:
        return self.entries[-1].data if self.entries else None

    def baseline(self) -> dict | None:
        """The row new candidates are compared with (``rules.current_baseline``)."""
        return current_baseline(self.rows)

    def frozen(self) -> dict | None:
        """The session settings frozen by the baseline row (None before the baseline)."""
        return (self.first() or {}).get("frozen")

    def frozen_env(self) -> dict[str, str] | None:
        """The measurement environment the baseline ran under (``knobs.measurement_env``); None for a
        log written before it was recorded."""
        return (self.first() or {}).get("frozen_env")

    def env_changes(self, now: dict[str, str]) -> list[str]:
        """``NAME (baseline: X, now: Y)`` for each measurement variable set otherwise than at the baseline."""
        frozen = self.frozen_env()
        if frozen is None:
            return []
        shown = lambda value: "unset" if value is None else repr(value)  # noqa: E731
        return [f"{k} (baseline: {shown(frozen.get(k))}, now: {shown(now.get(k))})"
                for k in sorted(set(frozen) | set(now)) if frozen.get(k) != now.get(k)]

    def kept_commit(self) -> str:
        """The commit HEAD must sit at: the last kept row's ("no-change" keeps included), else the base."""
        return next((entry.commit for entry in reversed(self.entries) if entry.kept and entry.commit),
                    self.session.base_commit)

    def noise(self) -> dict[str, float]:
        """The per-case noise floor measured by the baseline run."""
        return next((entry.data["noise"] for entry in reversed(self.entries) if entry.data.get("noise")), {})

    def noise_runs(self) -> dict[str, list[float]]:
        """case -> per-run medians of the baseline's repeated perf runs (the run-to-run noise sample)."""
        first = self.first() or {}
        return {c: list(s["runs"]) for c, s in (first.get("shapes") or {}).items() if s.get("runs")}

    def passed_tests(self) -> frozenset[str]:
        """Correctness test ids that passed at the baseline: each must pass in every later iteration."""
        return frozenset((self.first() or {}).get("passed_tests") or ())

    def preload(self) -> list[str]:
        """The installed modules the baseline's perf runs imported (``child.warmstart.installed_imports``),
        which children started ahead of their turn import while they wait. Only the baseline row's:
        it ran the user's own code, while a candidate's run could name any installed module."""
        return list((self.first() or {}).get("preload") or [])

    def kernel_names(self) -> dict[str, str]:
        """case -> ``kernel_name`` recorded at the baseline, for cases whose kernel the fenced files define."""
        return dict((self.first() or {}).get("kernel_names") or {})

    def reference(self) -> Reference | None:
        """What the next candidate is judged against; None before the baseline."""
        row = self.baseline()
        if row is None:
            return None
        return Reference(commit=row.get("commit"), medians=shape_medians(row), noise=self.noise(),
                         passed_tests=self.passed_tests(), kernel_names=self.kernel_names(), runs=self.noise_runs())

    def next_iteration(self) -> int:
        return max((e.iteration for e in self.entries), default=-1) + 1

    def stop(self) -> str | None:
        """Why the loop should stop now (``rules.stop_condition`` under the session's thresholds), or None."""
        return stop_condition(self.rows, self.session.thresholds)

    def cut_plan_entries(self) -> set[str]:
        """Batch plan entries an ``interrupted`` row names: stopped before a verdict (a kill, the
        budget's end); ``batch`` gives them the time of a try with its re-check."""
        return {e.data["plan_entry"] for e in self.entries
                if e.data.get("plan_entry") and was_interrupted(e.data)}

    def decided_plan_entries(self) -> dict[str, dict]:
        """Batch plan entries (``plan_entry`` digests) this log holds a decision for -> the row. An
        ``interrupted`` row decided nothing: its entry is tried again."""
        decided = {}
        for entry in self.entries:
            digest = entry.data.get("plan_entry")
            if digest and not was_interrupted(entry.data):
                decided[digest] = entry.data
        return decided


def _same_frozen(key: str, frozen, now) -> bool:
    """Whether a setting is as the baseline froze it. A threshold added to the rules after the
    baseline (absent from its frozen thresholds) must be at its default: the session decides as its
    baseline promised, plus the new rule as shipped."""
    if key == "thresholds" and isinstance(frozen, dict) and isinstance(now, dict):
        defaults = Thresholds().to_dict()
        return all(now.get(name) == (frozen[name] if name in frozen else defaults.get(name))
                   for name in set(frozen) | set(now))
    return frozen == now

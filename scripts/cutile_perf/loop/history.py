"""The session's history: the log's rows as one object that answers every question about them.

"Which row is the baseline?", "which commit must HEAD be?", "how noisy is each case?", "which
tests must pass?", "what did the session freeze?" are each answered here and nowhere else.
``log`` reads and writes lines; ``decide`` judges; this module interprets.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cutile_perf.store import log
from cutile_perf.judge.decide import IMPROVING_TIERS, Reference


def shape_medians(entry: dict) -> dict[str, float]:
    """``{case: median ms}`` of one row."""
    return {sid: float(s["median"]) for sid, s in (entry.get("shapes") or {}).items()
            if isinstance(s.get("median"), (int, float))}


def moved_performance(entry: dict) -> bool:
    """A kept row whose numbers replaced the reference (the baseline row itself included)."""
    if entry.get("status") != "keep":
        return False
    if entry.get("iteration") == 0:
        return True
    decision = entry.get("decision") or {}
    return bool(decision.get("rebaseline", decision.get("tier") in IMPROVING_TIERS))


def current_baseline(entries: list[dict]) -> dict | None:
    """The row new candidates are compared with: the last kept row that moved performance.

    A change kept as "no-change" stays in the code, but its numbers are the old ones plus noise,
    so they do not replace the reference: otherwise noise could ratchet the baseline slower.
    """
    for entry in reversed(entries):
        if moved_performance(entry):
            return entry
    return None


@dataclass(frozen=True)
class History:
    entries: tuple[dict, ...]

    @classmethod
    def read(cls, path: str | Path) -> History:
        return cls(tuple(log.read_entries(path)))

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def rows(self) -> list[dict]:
        return list(self.entries)

    def baseline(self) -> dict | None:
        return current_baseline(list(self.entries))

    def first(self) -> dict | None:
        return self.entries[0] if self.entries else None

    def frozen(self) -> dict | None:
        """The session settings frozen by the baseline row (None before the baseline)."""
        first = self.first()
        return (first or {}).get("frozen")

    def kept_commit(self, session_base: str) -> str:
        """The commit HEAD must sit at: the last kept row's ("no-change" keeps included), else the base."""
        for entry in reversed(self.entries):
            if entry.get("status") == "keep" and entry.get("commit"):
                return entry["commit"]
        return session_base

    def baseline_commit(self) -> str | None:
        row = self.baseline()
        return row.get("commit") if row else None

    def noise(self) -> dict[str, float]:
        """The per-case noise floor measured by the baseline run."""
        for entry in reversed(self.entries):
            if entry.get("noise"):
                return entry["noise"]
        return {}

    def noise_runs(self) -> dict[str, list[float]]:
        """case -> per-run medians of the baseline's repeated perf runs (the run-to-run noise sample)."""
        first = self.first() or {}
        return {c: list(s["runs"]) for c, s in (first.get("shapes") or {}).items() if s.get("runs")}

    def passed_tests(self) -> frozenset[str]:
        """Correctness test ids that passed at the baseline: each must pass in every later iteration."""
        first = self.first() or {}
        return frozenset(first.get("passed_tests") or ())

    def kernel_names(self) -> dict[str, str]:
        """case -> ``kernel_name`` recorded at the baseline, for cases whose kernel the fenced files define."""
        first = self.first() or {}
        return dict(first.get("kernel_names") or {})

    def reference(self) -> Reference | None:
        row = self.baseline()
        if row is None:
            return None
        return Reference(commit=row.get("commit"), medians=shape_medians(row), noise=self.noise(),
                         passed_tests=self.passed_tests(), kernel_names=self.kernel_names(), runs=self.noise_runs())

    def next_iteration(self) -> int:
        return max((e.get("iteration", -1) for e in self.entries), default=-1) + 1

    def stage_seconds(self) -> dict[str, float]:
        """The longest correctness and perf child seen in the log: ``{"correctness": s, "perf": s}``.

        Read from the rows' ``timings.stages`` (``[f"{tag}-{stage}", seconds]``); a kind never seen is absent.
        """
        longest: dict[str, float] = {}
        for entry in self.entries:
            for name, seconds in (entry.get("timings") or {}).get("stages") or ():
                kind = "correctness" if str(name).endswith("-correctness") else "perf" if str(name).endswith("-perf") else None
                if kind and isinstance(seconds, (int, float)):
                    longest[kind] = max(longest.get(kind, 0.0), float(seconds))
        return longest

    def try_seconds_bound(self, max_confirm_pairs: int) -> float | None:
        """How long one ``try`` can take, from the log: correctness, perf and a full interleaved
        re-check (``max_confirm_pairs`` pairs of perf runs), each at the longest child seen.
        None until the log has timed both a correctness and a perf child (the baseline does)."""
        longest = self.stage_seconds()
        if "correctness" not in longest or "perf" not in longest:
            return None
        return longest["correctness"] + longest["perf"] * (1 + 2 * max_confirm_pairs)

    def row_of(self, iteration: int) -> dict | None:
        for entry in self.entries:
            if entry.get("iteration") == iteration:
                return entry
        return None

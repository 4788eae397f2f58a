"""Ranking what ``screen`` measured: readings, not verdicts (pure; no process, no file).

Each round runs the base once, then every candidate still in the screen, so a candidate's run is
paired with the base run of its own round (``judge.recheck.paired_samples`` builds the pairs, as
for the interleaved re-check). From those pairs, per candidate:

* per case, the ratio candidate/base of each round, and its median over the rounds;
* the geomean over cases of those medians: the number the table ranks by (< 1: faster);
* the worst case: the case whose median ratio is the highest (the slowest for the candidate);
* the interval: the lowest and highest *per-round* geomean (min-max over rounds, not a
  confidence interval: with 3 rounds it is simply the spread seen);
* how many rounds the numbers rest on.

Nothing here decides: ``batch`` (one ``try`` each) does, by the judge's rules.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cutile_perf.judge import stats

INTERVAL_KIND = "min-max of the per-round geomean ratio"

# Per case: (base runs, candidate runs), one of each per complete round, in round order.
Paired = Mapping[str, tuple[list[float], list[float]]]


@dataclass(frozen=True)
class Reading:
    """One candidate's ratios against the base (candidate latency / base latency)."""

    name: str
    rounds: int
    geomean: float
    worst_case: str
    worst: float
    low: float
    high: float
    cases: dict[str, float]  # case -> median ratio over the rounds

    def to_dict(self) -> dict:
        return {"name": self.name, "rounds": self.rounds, "geomean": self.geomean, "worst_case": self.worst_case,
                "worst": self.worst, "interval": [self.low, self.high], "cases": dict(self.cases)}


def round_ratios(paired: Paired) -> list[dict[str, float]]:
    """Per complete round, case -> candidate/base. Every case has the same rounds (a pair with a
    crashed run is left out for every case by ``paired_samples``)."""
    counts = {len(base) for base, _ in paired.values()}
    rounds = min(counts) if counts else 0
    return [{case: cand[k] / base[k] for case, (base, cand) in paired.items()} for k in range(rounds)]


def reading(name: str, paired: Paired) -> Reading | None:
    """The candidate's reading, or None when no complete round paired it with the base."""
    per_round = round_ratios(paired)
    if not per_round or not per_round[0]:
        return None
    cases = {case: stats.median([r[case] for r in per_round]) for case in per_round[0]}
    round_geomeans = [stats.geomean(list(r.values())) for r in per_round]
    worst_case = max(sorted(cases), key=lambda c: cases[c])
    return Reading(name, len(per_round), stats.geomean(list(cases.values())), worst_case, cases[worst_case],
                   min(round_geomeans), max(round_geomeans), cases)


def rank(paired_by_candidate: Mapping[str, Paired]) -> list[Reading]:
    """The readings, best first: lowest geomean, then lowest worst case, then name (a stable order
    for equal numbers). Candidates with no complete round are left out."""
    found = [r for name, paired in paired_by_candidate.items() if (r := reading(name, paired)) is not None]
    return sorted(found, key=lambda r: (r.geomean, r.worst, r.name))


def spread_cases(medians: Mapping[str, float], n: int | None) -> list[str]:
    """``n`` of the base's cases to time each candidate on, spread evenly from its fastest to its
    slowest (both ends included when ``n`` >= 2; the middle one when ``n`` is 1); every case when
    ``n`` is None or at least their number. Spread by latency because a change's effect often turns
    with size (a hint that helps small rows and hurts long ones): the ends and the middle are where
    a ranking on part of the cases is least likely to disagree with a verdict on all of them."""
    by_latency = sorted(medians, key=lambda case: (medians[case], case))
    m = len(by_latency)
    if n is None or n >= m:
        return sorted(by_latency)
    picks = {(m - 1) // 2} if n == 1 else {round(i * (m - 1) / (n - 1)) for i in range(n)}
    return sorted(by_latency[i] for i in picks)


def next_round_fits(*, seconds: float, spent: float, per_run_s: float, runs: int) -> bool:
    """Whether a round of ``runs`` perf runs, at ``per_run_s`` each (measured on the first round),
    still ends within ``seconds`` once ``spent`` are gone: a round that cannot end never starts."""
    return spent + per_run_s * runs <= seconds

"""Power and false-verdict rates of the keep/revert rules (``cutile_perf.judge.rules.judge``), CPU only.

Simulates sessions the way the loop runs them, calling the real pure rules: a baseline of
``--repeats`` perf runs (noise floor), one candidate run, then, when the judge asks, interleaved
(baseline, candidate) pairs of the cases it names (``Verdict.cases``: the cases in doubt, or all)
until it decides. A perf run's per-case median follows the simulated repository of the test suite
(``tests/fixtures_repo.py``): the median of 9 samples, each ``latency x (1 + U(-noise, +noise))``;
``--drift`` adds a per-run factor shared by all cases (clocks, heat), which the simulated repo
does not have. "Extra perf runs" counts re-check runs, and in brackets what they measured in
runs of the whole selection (a run of 1 of 3 cases counts 1/3).

Rows (goals from issue 9):
  slowdown   a real +4 % on one of three cases: caught (reverted) in >= 9 of 10 sessions,
             with at most 6 extra perf runs
  A/A        --tries tries of unchanged code: at most 1 % false keeps (a claimed gain) or reverts
  mixed A/A  the same, for 1, 3, 5 and 10 cases, each case its own latency and its own per-run
             jitter (1-3 %, no median of samples): --tries tries each
  ratchet    --steps tries in a row (10), each +4 % on the same case: how far the kept HEAD drifts
  wide       --wide N cases (15, a TileGym op's selection; 0 leaves the rows out): the slowdown on one
             case and A/A again, over --wide-tries tries each

Rows of issue 39 (evidence a busy machine or a lucky run shapes; --sessions each):
  gain       a real -8 % on every case: kept as faster (power), and what the re-check costs
  lucky      unchanged code whose one try run is 30 % fast: never kept as faster
  slow base  +3 % on one case, the re-check's first baseline run 50 % slow (a co-tenant): never kept
             as faster
  bimodal    +10 % on every case (beyond any gate here), but 30 % fast in 30 % of its processes:
             never kept
  drifting   +10 % on every case, but 70 % fast in its first two processes: never kept
  repeated   the bimodal change tried again after each revert, up to 7 times: never kept

Usage:
  python benchmarks/decision_power.py                 # noise 3 %, the issue's setting
  python benchmarks/decision_power.py --noise 0.05 --drift 0.01 --sessions 1000
  python benchmarks/decision_power.py --threshold confirm_band=0   # what loosening a threshold costs
  python benchmarks/decision_power.py --only issue9 --noise 0.12 --steps 6   # test_redteam.py's ratchet
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from cutile_perf.judge import rules, stats  # noqa: E402
from cutile_perf.judge.verdict import Evidence, Reference, Stage, Verdict, judge  # noqa: E402

CASES = ("256x1024", "4096x1024", "16384x4096")
TRUE_MS = {"256x1024": 1.0, "4096x1024": 2.0, "16384x4096": 8.0}
MIXED_CASE_COUNTS = (1, 3, 5, 10)  # the mixed A/A rows: selections of one case up to a TileGym op's


class Simulator:
    """Perf runs of the simulated repository. ``noise``: one per-sample jitter for every case, or one
    per case; ``samples``: samples per run (a run reports their median; 1: the run itself jitters)."""

    def __init__(self, noise: float | dict[str, float], drift: float, rng: random.Random, samples: int = 9):
        self.noise, self.drift, self.rng, self.samples = noise, drift, rng, samples
        self.runs = 0
        self.work = 0.0  # runs, each counted as the share of the cases it measured

    def _noise(self, case: str) -> float:
        return self.noise[case] if isinstance(self.noise, dict) else self.noise

    def run(self, latency: dict[str, float], of: int | None = None, factor: float = 1.0) -> dict[str, float]:
        """One perf run: per-case medians of ``samples`` jittered samples, times a shared per-run drift.
        ``of``: how many cases the whole selection holds (``latency`` may be the cases in doubt);
        ``factor``: what this process does to every case (a co-tenant, a mode the code fell into)."""
        self.runs += 1
        self.work += len(latency) / (of or len(latency))
        shared = factor * (1 + self.rng.uniform(-self.drift, self.drift))
        return {c: shared * statistics.median(v * (1 + self.rng.uniform(-self._noise(c), self._noise(c)))
                                              for _ in range(self.samples))
                for c, v in latency.items()}


def baseline(sim: Simulator, latency: dict[str, float], repeats: int, t: rules.Thresholds) -> Reference:
    runs = [sim.run(latency) for _ in range(repeats)]
    per_case = {c: [r[c] for r in runs] for c in latency}
    return Reference(commit="base", medians={c: stats.median(v) for c, v in per_case.items()},
                            noise=rules.noise_floor(per_case, minimum=t.min_noise), runs=per_case)


def _same(_process: int) -> float:
    return 1.0


def one_try(sim: Simulator, ref: Reference, base_latency: dict, cand_latency: dict,
            t: rules.Thresholds, *, cand_factor=_same, base_factor=_same,
            repeat_of: int | None = None, prior: dict | None = None) -> tuple[Verdict, int, dict]:
    """The judge's verdict on one candidate, the extra perf runs it asked for, the candidate's run.
    Each re-check run measures the cases the judge names, as the loop selects them by node id.
    ``cand_factor(k)``: the factor on the candidate's k-th process (0: the try's own run);
    ``base_factor(k)``: on the re-check's k-th baseline run (from 1); ``repeat_of``: the row this
    content was reverted at (a judge that cannot be told is not told); ``prior``: case -> the
    candidate's ratios to the baseline in the earlier tries of this content, as the loop reads them
    from its reverted rows (``loop.row.prior_ratios``), extended here with this try's."""
    start = sim.runs
    perf = Stage(shapes=sim.run(cand_latency, factor=cand_factor(0)))
    told = {"repeat_of": repeat_of} if repeat_of is not None and "repeat_of" in Evidence.__dataclass_fields__ else {}
    if prior and "prior_ratios" in Evidence.__dataclass_fields__:
        told["prior_ratios"] = {c: tuple(v) for c, v in prior.items()}
    evidence = Evidence(perf=perf, **told)
    verdict = judge(ref, t, evidence)
    while verdict.action == "re-measure":
        asked = getattr(verdict, "cases", ())  # () or a judge without partial re-checks: every case
        k = len(evidence.pairs) + 1
        runs = [Stage(shapes=sim.run({c: v for c, v in latency.items() if not asked or c in asked}, len(latency),
                                     factor(k)),
                      **({"cases": asked} if asked else {}))
                for latency, factor in ((base_latency, base_factor), (cand_latency, cand_factor))]
        evidence = evidence.add(pairs=(*evidence.pairs, tuple(runs)))
        verdict = judge(ref, t, evidence)
    if prior is not None:
        _remember(prior, ref, evidence)
    return verdict, sim.runs - start - 1, perf.shapes


def _remember(prior: dict, ref: Reference, evidence: Evidence) -> None:
    """Add one try's candidate ratios to ``prior``: its single run against the recorded medians
    and each interleaved pair's candidate over its baseline run."""
    for case, median in evidence.perf.shapes.items():
        prior.setdefault(case, []).append(median / ref.medians[case])
    for base, cand in evidence.pairs:
        for case in cand.shapes:
            prior.setdefault(case, []).append(cand.shapes[case] / base.shapes[case])


def _extra(runs: list[int], work: list[float]) -> str:
    return (f"max {max(runs)}, mean {statistics.fmean(runs):.1f} "
            f"({statistics.fmean(work):.1f} of the whole selection)")


def _extra_work(sim: Simulator, before: float) -> float:
    """Re-check work of the last try, in runs of the whole selection (its first perf run excluded)."""
    return sim.work - before - 1


def slowdown_rows(args, t: rules.Thresholds, rng: random.Random, true_ms: dict | None = None,
                  sessions: int | None = None) -> list[list]:
    true_ms = true_ms or TRUE_MS
    sessions = sessions or args.sessions
    first = next(iter(true_ms))  # CASES[0] of the 3-case rows
    caught, extra, work = 0, [], []
    for _ in range(sessions):
        sim = Simulator(args.noise, args.drift, rng)
        ref = baseline(sim, true_ms, args.repeats, t)
        slower = {**true_ms, first: true_ms[first] * (1 + args.slowdown)}
        before = sim.work
        verdict, runs, _ = one_try(sim, ref, true_ms, slower, t)
        caught += verdict.action == "revert"
        extra.append(runs)
        work.append(_extra_work(sim, before))
    goal = caught >= 0.9 * sessions and max(extra) <= 6
    return [[f"+{args.slowdown * 100:.0f} % on 1 of {len(true_ms)} cases", f"{caught}/{sessions} reverted",
             _extra(extra, work), ">= 90 %, <= 6 extra runs", "MET" if goal else "MISSED"]]


def aa_try(sim: Simulator, true_ms: dict[str, float], repeats: int, t: rules.Thresholds) -> tuple[Verdict, int, float]:
    """Unchanged code tried once on a fresh baseline: (verdict, extra perf runs, their work)."""
    ref = baseline(sim, true_ms, repeats, t)
    before = sim.work
    verdict, runs, _ = one_try(sim, ref, true_ms, true_ms, t)
    return verdict, runs, _extra_work(sim, before)


def _aa_row(label: str, outcomes: list[tuple[Verdict, int, float]]) -> list:
    keeps = sum(_kept_faster(verdict) for verdict, _, _ in outcomes)
    reverts = sum(verdict.action == "revert" for verdict, _, _ in outcomes)
    rate = (keeps + reverts) / len(outcomes)
    return [label, f"{keeps} false keeps, {reverts} false reverts ({rate * 100:.1f} %)",
            _extra([runs for _, runs, _ in outcomes], [work for _, _, work in outcomes]), "<= 1 %",
            "MET" if rate <= 0.01 else "MISSED"]


def aa_rows(args, t: rules.Thresholds, rng: random.Random, true_ms: dict | None = None,
            tries: int | None = None) -> list[list]:
    true_ms = true_ms or TRUE_MS
    tries = tries or args.tries
    outcomes = [aa_try(Simulator(args.noise, args.drift, rng), true_ms, args.repeats, t) for _ in range(tries)]
    label = f"A/A, {tries} tries" + (f", {len(true_ms)} cases" if true_ms is not TRUE_MS else "")
    return [_aa_row(label, outcomes)]


def mixed_aa_rows(args, t: rules.Thresholds, rng: random.Random) -> list[list]:
    """A/A where every case has its own latency (0.005-5 ms) and its own run-to-run jitter (1-3 %,
    each run jittering as a whole, no median of samples to calm it): harsher than the rows above,
    and the model the unit tests used before this moved here (issue 40)."""
    rows_ = []
    for count in MIXED_CASE_COUNTS:
        outcomes = []
        for _ in range(args.tries):
            latency = {f"case{i:02d}": rng.uniform(0.005, 5.0) for i in range(count)}
            noise = {c: rng.uniform(0.01, 0.03) for c in latency}
            outcomes.append(aa_try(Simulator(noise, args.drift, rng, samples=1), latency, args.repeats, t))
        rows_.append(_aa_row(f"A/A, {args.tries} tries, {count} cases, per-run jitter 1-3 % by case", outcomes))
    return rows_


def _kept_faster(verdict: Verdict) -> bool:
    return verdict.action == "keep" and verdict.decision is not None and verdict.decision.rebaseline


def _scaled(latency: dict[str, float], factor: float, only: str | None = None) -> dict[str, float]:
    return {c: v * factor if only in (None, c) else v for c, v in latency.items()}


def scenario_row(args, t: rules.Thresholds, rng: random.Random, label: str, cand: dict, goal: str,
                 bad, *, cand_factor=None, base_factor=None, tries: int = 1) -> list:
    """``args.sessions`` sessions of one scenario: a baseline, then the same candidate tried up to
    ``tries`` times while it is reverted (each later try told the row it was reverted at). ``bad``:
    which final verdict misses the goal ("kept": any keep; "faster": a keep that moves the baseline;
    "not faster": anything else)."""
    missed, extra, work = 0, [], []
    for _ in range(args.sessions):
        sim = Simulator(args.noise, args.drift, rng)
        ref = baseline(sim, TRUE_MS, args.repeats, t)
        reverted_at, prior = None, {}
        for attempt in range(1, tries + 1):
            factors = {} if cand_factor is None else {"cand_factor": cand_factor(rng)}
            if base_factor is not None:
                factors["base_factor"] = base_factor
            before = sim.work
            verdict, runs, _ = one_try(sim, ref, TRUE_MS, cand, t, repeat_of=reverted_at, prior=prior, **factors)
            extra.append(runs)
            work.append(_extra_work(sim, before))
            if verdict.action != "revert":
                break
            reverted_at = attempt
        missed += {"kept": verdict.action == "keep", "faster": _kept_faster(verdict),
                   "not faster": not _kept_faster(verdict)}[bad]
    rate = missed / args.sessions
    met = rate <= 0.1 if bad == "not faster" else rate <= 0.01
    outcome = (f"{args.sessions - missed}/{args.sessions} kept as faster" if bad == "not faster"
               else f"{missed}/{args.sessions} " + ("kept" if bad == "kept" else "kept as faster"))
    return [label, outcome, _extra(extra, work), goal, "MET" if met else "MISSED"]


def issue39_rows(args, t: rules.Thresholds, rng) -> list[list]:
    """The rows of issue 39's evidence-shaping cases (module docstring)."""
    every = lambda factor: _scaled(TRUE_MS, factor)  # noqa: E731
    def per_process(r):  # fast in 30 % of processes: one draw per process, made when it first runs
        draws = {}
        return lambda k: draws.setdefault(k, 0.7 if r.random() < 0.3 else 1.0)
    return [
        scenario_row(args, t, rng("gain"), "gain: -8 % on every case", every(0.92), ">= 90 % kept as faster",
                     "not faster"),
        scenario_row(args, t, rng("lucky"), "lucky: unchanged, its try run 30 % fast", every(1.0),
                     "<= 1 % kept as faster", "faster", cand_factor=lambda r: lambda k: 0.7 if k == 0 else 1.0),
        scenario_row(args, t, rng("slow base"), "slow base: +3 % on 1 case, 1st re-check base run +50 %",
                     _scaled(TRUE_MS, 1.03, CASES[0]), "<= 1 % kept as faster", "faster",
                     base_factor=lambda k: 1.5 if k == 1 else 1.0),
        scenario_row(args, t, rng("bimodal"), "bimodal: +10 %, 30 % fast in 30 % of processes", every(1.10),
                     "<= 1 % kept", "kept", cand_factor=per_process),
        scenario_row(args, t, rng("drifting"), "drifting: +10 %, 70 % fast in its first 2 processes", every(1.10),
                     "<= 1 % kept", "kept", cand_factor=lambda r: lambda k: 0.3 if k < 2 else 1.0),
        scenario_row(args, t, rng("repeated"), "repeated: the bimodal change, up to 7 tries", every(1.10),
                     "<= 1 % kept", "kept", cand_factor=per_process, tries=7),
    ]


def wide_cases(count: int) -> dict[str, float]:
    """``count`` cases from 0.05 to 8 ms, spaced evenly on a log scale (a TileGym op's shapes)."""
    return {f"case{i:02d}": 0.05 * (8.0 / 0.05) ** (i / max(count - 1, 1)) for i in range(count)}


def ratchet_drifts(sessions: int, steps: int, noise: float, drift: float, slowdown: float, repeats: int,
                   t: rules.Thresholds, rng: random.Random) -> list[tuple[float, float]]:
    """Per session, ``steps`` tries in a row, each ``slowdown`` slower on one case than the kept code:
    (how far the kept code ended from the baseline on that case, that case's gate)."""
    out = []
    for _ in range(sessions):
        sim = Simulator(noise, drift, rng)
        ref = baseline(sim, TRUE_MS, repeats, t)
        gate = rules.single_run_gate(rules.case_noise(ref.noise, CASES[0], t), t)
        kept = base = dict(TRUE_MS)
        for _step in range(steps):
            cand = {**kept, CASES[0]: kept[CASES[0]] * (1 + slowdown)}
            verdict, _runs, measured = one_try(sim, ref, base, cand, t)
            if verdict.action == "keep":
                kept = cand
                if verdict.decision is not None and verdict.decision.rebaseline:
                    base, ref = cand, Reference("cand", measured, ref.noise, runs=ref.runs)
        out.append((kept[CASES[0]] / TRUE_MS[CASES[0]] - 1, gate))
    return out


def ratchet_rows(args, t: rules.Thresholds, rng: random.Random) -> list[list]:
    results = ratchet_drifts(args.sessions, args.steps, args.noise, args.drift, args.slowdown, args.repeats, t, rng)
    drift = [d for d, _gate in results]
    beyond = sum(d > gate for d, gate in results)
    return [[f"ratchet: {args.steps} tries of +{args.slowdown * 100:.0f} % each on one case",
             f"kept HEAD drift median {statistics.median(drift) * 100:+.1f} %, max {max(drift) * 100:+.1f} %; "
             f"beyond that case's gate in {beyond}/{args.sessions} sessions", "-",
             "never more than one missed step", "MET" if max(drift) <= args.slowdown + 1e-9 else "MISSED"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.03, help="per-sample jitter of the simulated repo")
    parser.add_argument("--drift", type=float, default=0.0, help="per-run factor shared by all cases")
    parser.add_argument("--slowdown", type=float, default=0.04)
    parser.add_argument("--repeats", type=int, default=3, help="baseline perf runs")
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--tries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="tries in a row of the ratchet row")
    parser.add_argument("--wide", type=int, default=15, help="cases of the wide rows (0: leave them out)")
    parser.add_argument("--wide-tries", type=int, default=300, help="sessions and A/A tries of the wide rows")
    parser.add_argument("--only", choices=("all", "issue9", "issue39"), default="all",
                        help="issue9 or issue39: only the rows of that issue's goals (module docstring)")
    parser.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE",
                        help="a threshold set away from its default, as session.yaml may set it before the baseline "
                             "(repeatable)")
    args = parser.parse_args(argv)
    try:
        changed = {name: float(value) if "." in value or "e" in value else int(value)
                   for name, _, value in (item.partition("=") for item in args.threshold)}
        t = rules.Thresholds.from_dict(changed)
    except ValueError as exc:
        parser.error(f"--threshold: {exc}")
    # One random stream per row: how many runs one row's verdicts took does not move the next
    # row's draws, so two versions of the rules meet the same sessions row by row (until their
    # first different verdict inside a row).
    def rng(row: str) -> random.Random:
        return random.Random(f"{args.seed}/{row}")

    rows = []
    if args.only in ("all", "issue9"):
        rows += (slowdown_rows(args, t, rng("slowdown")) + aa_rows(args, t, rng("A/A"))
                 + ratchet_rows(args, t, rng("ratchet")) + mixed_aa_rows(args, t, rng("mixed A/A")))
    if args.only in ("all", "issue39"):
        rows += issue39_rows(args, t, rng)
    if args.wide and args.only in ("all", "issue9"):
        wide = wide_cases(args.wide)
        rows += (slowdown_rows(args, t, rng("wide slowdown"), wide, args.wide_tries)
                 + aa_rows(args, t, rng("wide A/A"), wide, args.wide_tries))
    set_away = ", ".join(f"{name}={value}" for name, value, _ in t.changed())
    print(f"noise {args.noise * 100:.1f} % per sample, drift {args.drift * 100:.1f} % per run, baseline "
          f"{args.repeats} runs, seed {args.seed}, thresholds: defaults of cutile_perf.judge.rules.Thresholds"
          + (f" except {set_away}" if set_away else ""))
    print("| scenario | outcome | extra perf runs | goal | verdict |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    return 0 if all(r[-1] == "MET" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Power and false-verdict rates of the keep/revert rules (``cutile_perf.judge.rules.judge``), CPU only.

Simulates sessions the way the loop runs them, calling the real pure rules: a baseline of
``--repeats`` perf runs (noise floor), one candidate run, then, when the judge asks, interleaved
(baseline, candidate) pairs until it decides. A perf run's per-case median follows the simulated
repository of the test suite (``tests/fixtures_repo.py``): the median of 9 samples, each
``latency x (1 + U(-noise, +noise))``; ``--drift`` adds a per-run factor shared by all cases
(clocks, heat), which the simulated repo does not have.

Rows (goals from issue 9):
  slowdown   a real +4 % on one of three cases: caught (reverted) in >= 9 of 10 sessions,
             with at most 6 extra perf runs
  A/A        200 tries of unchanged code: at most 1 % false keeps (a claimed gain) or reverts
  ratchet    --steps tries in a row (10), each +4 % on the same case: how far the kept HEAD drifts

Usage:
  python benchmarks/decision_power.py                 # noise 3 %, the issue's setting
  python benchmarks/decision_power.py --noise 0.05 --drift 0.01 --sessions 1000
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


class Simulator:
    def __init__(self, noise: float, drift: float, rng: random.Random):
        self.noise, self.drift, self.rng = noise, drift, rng
        self.runs = 0

    def run(self, latency: dict[str, float]) -> dict[str, float]:
        """One perf run: per-case medians of 9 jittered samples, times a shared per-run drift."""
        self.runs += 1
        shared = 1 + self.rng.uniform(-self.drift, self.drift)
        return {c: shared * statistics.median(v * (1 + self.rng.uniform(-self.noise, self.noise)) for _ in range(9))
                for c, v in latency.items()}


def baseline(sim: Simulator, latency: dict[str, float], repeats: int, t: rules.Thresholds) -> Reference:
    runs = [sim.run(latency) for _ in range(repeats)]
    per_case = {c: [r[c] for r in runs] for c in latency}
    return Reference(commit="base", medians={c: stats.median(v) for c, v in per_case.items()},
                            noise=rules.noise_floor(per_case, minimum=t.min_noise), runs=per_case)


def one_try(sim: Simulator, ref: Reference, base_latency: dict, cand_latency: dict,
            t: rules.Thresholds) -> tuple[Verdict, int, dict]:
    """The judge's verdict on one candidate, the extra perf runs it asked for, the candidate's run."""
    start = sim.runs
    perf = Stage(shapes=sim.run(cand_latency))
    verdict = judge(ref, t, Evidence(perf=perf))
    evidence = Evidence(perf=perf)
    while verdict.action == "re-measure":
        evidence = evidence.add(pairs=(*evidence.pairs, (Stage(shapes=sim.run(base_latency)),
                                                         Stage(shapes=sim.run(cand_latency)))))
        verdict = judge(ref, t, evidence)
    return verdict, sim.runs - start - 1, perf.shapes


def slowdown_rows(args, t: rules.Thresholds, rng: random.Random) -> list[list]:
    caught, extra = 0, []
    for _ in range(args.sessions):
        sim = Simulator(args.noise, args.drift, rng)
        ref = baseline(sim, TRUE_MS, args.repeats, t)
        slower = {**TRUE_MS, CASES[0]: TRUE_MS[CASES[0]] * (1 + args.slowdown)}
        verdict, runs, _ = one_try(sim, ref, TRUE_MS, slower, t)
        caught += verdict.action == "revert"
        extra.append(runs)
    goal = caught >= 0.9 * args.sessions and max(extra) <= 6
    return [[f"+{args.slowdown * 100:.0f} % on 1 of 3 cases", f"{caught}/{args.sessions} reverted",
             f"max {max(extra)}, mean {statistics.fmean(extra):.1f}", ">= 90 %, <= 6 extra runs",
             "MET" if goal else "MISSED"]]


def aa_rows(args, t: rules.Thresholds, rng: random.Random) -> list[list]:
    keeps = reverts = 0
    extra = []
    for _ in range(args.tries):
        sim = Simulator(args.noise, args.drift, rng)
        ref = baseline(sim, TRUE_MS, args.repeats, t)
        verdict, runs, _ = one_try(sim, ref, TRUE_MS, TRUE_MS, t)
        keeps += verdict.action == "keep" and verdict.decision is not None and verdict.decision.rebaseline
        reverts += verdict.action == "revert"
        extra.append(runs)
    rate = (keeps + reverts) / args.tries
    return [[f"A/A, {args.tries} tries", f"{keeps} false keeps, {reverts} false reverts ({rate * 100:.1f} %)",
             f"max {max(extra)}, mean {statistics.fmean(extra):.1f}", "<= 1 %", "MET" if rate <= 0.01 else "MISSED"]]


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
    args = parser.parse_args(argv)
    t = rules.Thresholds()
    rng = random.Random(args.seed)
    rows = slowdown_rows(args, t, rng) + aa_rows(args, t, rng) + ratchet_rows(args, t, rng)
    print(f"noise {args.noise * 100:.1f} % per sample, drift {args.drift * 100:.1f} % per run, baseline "
          f"{args.repeats} runs, seed {args.seed}, thresholds: defaults of cutile_perf.judge.rules.Thresholds")
    print("| scenario | outcome | extra perf runs | goal | verdict |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    return 0 if all(r[-1] == "MET" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

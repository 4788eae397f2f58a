"""What the interleaved re-check costs on a real op: run ``cutile-perf`` with each try's single run
sent to the re-check, whatever that run measured.

    python benchmarks/forced_recheck.py one,every batch sandbox/plan.yaml --baseline 3 --job-seconds 420

The first argument names, try by try, what the re-check re-measures: ``one`` (the case that rose
most, as when one case lands in doubt) or ``every`` (every case, as when the geomean is in doubt);
the last word is reused for the tries after it. The rest is a ``cutile-perf`` command line.

A benchmark, not a way to decide: it only exists because a re-check cannot be ordered. The single
run's verdict is a keep turned into "re-measure" (a revert stays a revert) and the cases in doubt
are the ones named above; the re-check's runs, timings and verdict are the harness's own, so each
row's ``timings`` (``recheck_s``, ``recheck_runs``) price a re-check of that kind on that op. Each
forced re-check says so on stderr ("forced re-check ...: try N"), with what the single run said.
"""
from __future__ import annotations

import sys
from dataclasses import replace

from cutile_perf import cli
from cutile_perf.judge import verdict

MODES = ("one", "every")
FORCED = "forced re-check (benchmarks/forced_recheck.py)"


class Forcing:
    """Replaces ``verdict.decide`` and ``verdict.cases_in_doubt`` for one process.

    The judge asks both on every judgement of a try, the re-check's included, always with the try's
    single-run medians; so those medians say which try is judged: the first medians seen are try
    1's, and every later judgement of the same try answers the same cases, as the real rule does."""

    def __init__(self, modes: list[str]):
        bad = [m for m in modes if m not in MODES]
        if not modes or bad:
            raise SystemExit(f"forced_recheck: modes are {' or '.join(MODES)}, comma-separated; got {','.join(modes)!r}")
        self.modes: list[str] = modes
        self.tries: dict[tuple, str] = {}  # a try's single-run medians -> its mode
        self._decide = verdict.decide

    def mode(self, single: dict) -> str:
        key = tuple(sorted(single.items()))
        if key not in self.tries:
            self.tries[key] = self.modes[min(len(self.tries), len(self.modes) - 1)]
        return self.tries[key]

    def decide(self, baseline, candidate, noise, t):
        single = self._decide(baseline, candidate, noise, t)
        if single.verdict != "keep":
            return single
        mode = self.mode(candidate)
        print(f"{FORCED}: try {len(self.tries)}, {mode} case(s); its single run said: keep, {single.reason}",
              file=sys.stderr, flush=True)
        return replace(single, verdict="confirm", reason=f"{FORCED}, {mode}: {single.reason}")

    def cases_in_doubt(self, baseline, candidate, noise, t, implausible=()):
        shapes = sorted(baseline)
        if self.mode(candidate) == "every" or set(shapes) - set(candidate):
            return tuple(shapes)
        return (max(shapes, key=lambda s: (candidate[s] / baseline[s], s)),)

    def install(self) -> None:
        verdict.decide, verdict.cases_in_doubt = self.decide, self.cases_in_doubt


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    Forcing(argv[0].split(",")).install()
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``cutile-perf ab``: the autotuned config vs the fixed config, per shape, with confidence intervals.

Per shape: an exhaustive search over the tunable's space picks the winner; then the winner and the
fixed config are timed again, interleaved (fixed, tuned, fixed, tuned), by one method for both
(``cutile_perf.bench`` by default). Exit 1 when tuning is slower on any shape.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cutile_perf.output import Outcome, say
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED, IterationCrashed
from cutile_perf.tune.analysis import ab_row
from cutile_perf.tune.config import best_trial
from cutile_perf.tune.evaluate import make_tuner, stream_for
from cutile_perf.tune.splitbuf import split_buffer
from cutile_perf.tune.autotuner import TuneReport
from cutile_perf.tune.timing import BenchTimer, Candidate
from cutile_perf.tune.tunable import load_target, resolve_shapes, shape_label

ROUNDS = 2


def ab(*, target: str, shapes: Sequence[str] | None, rep_ms: float = 200.0,
       fakes: dict[str, Any] | None = None) -> Outcome:
    tunable = load_target(target)
    shape_list = resolve_shapes(tunable, shapes)
    fakes = dict(fakes or {})
    confirm = fakes.pop("confirm", None) or BenchTimer(warmup_ms=25.0, rep_ms=rep_ms)
    probe_tuner = make_tuner(tunable, [tunable.fixed], fakes=dict(fakes))
    arch = probe_tuner.device.sm_arch
    tuner = make_tuner(tunable, tunable.space_for(arch), fakes=dict(fakes))
    stream = stream_for(fakes)
    rows = []
    for shape in shape_list:
        label = shape_label(shape)
        say(f"{tunable.name} {label}: tuning {len(tuner.space)} configs")
        problem = tunable.problem(shape)
        args_fn = split_buffer(problem.args_fn, problem.inplace) if problem.inplace else problem.args_fn
        best = best_trial(tuner.search(stream, problem.grid_fn, args_fn, TuneReport("search")))
        if best is None:
            raise IterationCrashed(f"every config of {tunable.name} failed on {label}")
        pair = [tunable.fixed, best.config]
        samples: dict = {c: [] for c in pair}
        for _ in range(ROUNDS):
            cands = [Candidate(c, tuner.kernel_for(c), tuple(problem.grid_fn(c)), tuple(args_fn(c)), stream,
                               tuner.launcher) for c in pair]
            for trial in confirm(cands):
                if not trial.ok:
                    raise IterationCrashed(f"{trial.config.label()} failed on {label}: {trial.error} {trial.detail[-200:]}")
                samples[trial.config].extend(trial.times)
        rows.append(ab_row(label, best.config, tunable.fixed, samples[best.config], samples[tunable.fixed]))
    lines = ["shape  fixed_ms  tuned_ms  tuned/fixed [95% CI]  verdict  tuned config"]
    for r in rows:
        lines.append(f"{r.shape}  {r.fixed_ms:.4f}  {r.tuned_ms:.4f}  {r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}]  "
                     f"{r.verdict}  {r.tuned.label()}")
    slower = [r.shape for r in rows if r.verdict == "slower"]
    lines.append(f"verdict: tuning is slower on {', '.join(slower)}" if slower else
                 f"verdict: tuning never loses ({sum(r.verdict == 'faster' for r in rows)}/{len(rows)} shapes faster)")
    data = {"target": target, "arch": arch, "fixed": tunable.fixed.to_json(),
            "rows": [{"shape": r.shape, "tuned": r.tuned.to_json(), "fixed_ms": r.fixed_ms, "tuned_ms": r.tuned_ms,
                      "ratio": r.ratio, "ci": [r.low, r.high], "verdict": r.verdict} for r in rows],
            "slower_shapes": slower}
    return Outcome("\n".join(lines), data, EXIT_REJECTED if slower else EXIT_OK)

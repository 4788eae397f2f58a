"""``cutile-perf ab``: the autotuned config vs the fixed config, per shape, with confidence intervals.

Per shape (``tune.evaluate.ab_shape``): an exhaustive search over the tunable's space picks the
winner; then the winner and the fixed config are timed again, interleaved (fixed, tuned, fixed,
tuned), by one method for both (``cutile_perf.bench`` by default). Exit 1 when tuning is slower on any shape.
"""
from __future__ import annotations

from collections.abc import Sequence

from cutile_perf.errors import EXIT_OK, EXIT_REJECTED
from cutile_perf import node
from cutile_perf.loop import tune_spread
from cutile_perf.output import Outcome, say
from cutile_perf.tune.evaluate import ab_confirm, ab_shape, make_tuner, stream_for
from cutile_perf.tune.tunable import load_target, resolve_shapes, shape_label


def ab(*, target: str, shapes: Sequence[str] | None, rep_ms: float = 200.0, gpus: str = "1", engine: str = "local",
       fakes: tune_spread.Fakes = None) -> Outcome:
    """``gpus``/``engine``: each shape's search and comparison on one worker of the node's pool
    (``loop.tune_spread``); ``"1"`` on the local engine runs them in this process."""
    tunable = load_target(target)
    shape_list = resolve_shapes(tunable, shapes)
    named_fakes, fakes = fakes, dict(tune_spread.resolve_fakes(fakes) or {})
    confirm = ab_confirm(fakes, rep_ms)
    arch = make_tuner(tunable, [tunable.fixed], fakes=dict(fakes)).device.sm_arch
    space = tunable.space_for(arch)
    if node.spreads(gpus, engine):
        say(f"{tunable.name}: tuning {len(space)} configs per shape, shapes spread over --gpus {gpus} ({engine})")
        rows = tune_spread.ab_spread(target, space, shape_list, rep_ms=rep_ms, gpus=gpus, engine=engine,
                                     fakes=named_fakes)
    else:
        tuner = make_tuner(tunable, space, fakes=dict(fakes))
        rows = []
        for shape in shape_list:
            say(f"{tunable.name} {shape_label(shape)}: tuning {len(tuner.space)} configs")
            rows.append(ab_shape(tuner, tunable, shape, confirm, stream=stream_for(fakes)))
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

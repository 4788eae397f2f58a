"""``cutile-perf prune``: configs of the final space that never win (or never come within x % of the
best) on any tested shape, so the space stays <= 8 per arch."""
from __future__ import annotations

from collections.abc import Sequence

from cutile_perf import node
from cutile_perf.loop import tune_spread
from cutile_perf.output import Outcome, say
from cutile_perf.tune.analysis import prune as prune_rule
from cutile_perf.tune.evaluate import make_tuner
from cutile_perf.tune.tunable import load_target, resolve_shapes


def prune(*, target: str, shapes: Sequence[str] | None, tolerance: float = 0.05, max_keep: int = 8,
          gpus: str = "1", engine: str = "local", fakes: tune_spread.Fakes = None) -> Outcome:
    """``gpus``/``engine``: each shape's configs timed on one worker of the node's pool (``loop.tune_spread``)."""
    tunable = load_target(target)
    shape_list = resolve_shapes(tunable, shapes)
    arch = make_tuner(tunable, [tunable.fixed], fakes=tune_spread.resolve_fakes(fakes)).device.sm_arch
    space = tunable.space_for(arch)
    say(f"timing {len(space)} configs x {len(shape_list)} shapes of {tunable.name} on {arch}"
        + (f", shapes spread over --gpus {gpus} ({engine})" if node.spreads(gpus, engine) else ""))
    results = tune_spread.time_shapes(target, tunable, space, shape_list, gpus=gpus, engine=engine, fakes=fakes)
    kept, dropped = prune_rule(results, tolerance=tolerance, max_keep=max_keep, must_keep=[tunable.fixed])
    lines = [f"keep {len(kept)} of {len(space)} on {arch}:"] + [f"  {c.label()}" for c in kept]
    lines += [f"drop {len(dropped)}:"] + [f"  {c.label()}  (closest {near:.2f}x of best; {why})" for c, near, why in dropped]
    data = {"target": target, "arch": arch, "shapes": list(results), "tolerance": tolerance,
            "keep": [c.to_json() for c in kept],
            "drop": [{"config": c.to_json(), "closest": near, "reason": why} for c, near, why in dropped]}
    return Outcome("\n".join(lines), data)

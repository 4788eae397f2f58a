"""``cutile-perf probe``: a directional exploration over chosen dimensions; prints a ranked table and
the <= 8 configs worth keeping. It never edits source: copy the kept list into the kernel by hand."""
from __future__ import annotations

from collections.abc import Sequence

from cutile_perf.output import Outcome, say
from cutile_perf.errors import UsageError
from cutile_perf import node
from cutile_perf.loop import tune_spread
from cutile_perf.tune import spaces
from cutile_perf.tune.analysis import keep_set, rank
from cutile_perf.tune.evaluate import make_tuner
from cutile_perf.tune.tunable import load_target, parse_dim, resolve_shapes

MAX_PROBE = 100


def probe_space(fixed, dims: Sequence[str], arch: str) -> tuple[list, list[str]]:
    """The product of the ``--dim`` values, other fields held at the fixed config; invalid ones dropped."""
    axes = dict(parse_dim(d) for d in dims)
    if not axes:
        raise UsageError("probe needs at least one --dim NAME=V1,V2,...")
    base = fixed.to_json()
    configs = [fixed.replace(**c.to_json()) for c in spaces.product(**axes)]
    unknown = sorted(set(axes) - set(base) - {"occupancy", "num_ctas", "num_worker_warps", "opt_level"})
    valid = [c for c in configs if spaces.valid(c, arch)]
    notes = [f"{len(configs) - len(valid)} configs invalid on {arch} dropped"] if len(valid) < len(configs) else []
    if unknown:
        notes.append(f"dimensions not in the fixed config: {', '.join(unknown)} (check the kernel reads them)")
    return valid, notes


def format_table(ranked, shapes: list[str], limit: int = 30) -> str:
    lines = ["rank  geomean  wins  config" + "".join(f"  {s}" for s in shapes)]
    for i, r in enumerate(ranked[:limit], 1):
        per = "".join(f"  {r.per_shape.get(s, float('inf')):.2f}x" for s in shapes)
        lines.append(f"{i:>4}  {r.geomean:>6.3f}x  {r.wins:>4}  {r.config.label()}{per}")
    if len(ranked) > limit:
        lines.append(f"... {len(ranked) - limit} more (use --json for all)")
    return "\n".join(lines)


def probe(*, target: str, dims: Sequence[str], shapes: Sequence[str] | None, tolerance: float = 0.05,
          max_configs: int = MAX_PROBE, gpus: str = "1", engine: str = "local",
          fakes: tune_spread.Fakes = None) -> Outcome:
    """``gpus``/``engine``: one worker per GPU, each shape's configs on one of them (``loop.tune_spread``);
    ``"1"`` on the local engine times everything in this process."""
    tunable = load_target(target)
    shape_list = resolve_shapes(tunable, shapes)
    spread = node.spreads(gpus, engine)
    tuner = make_tuner(tunable, [tunable.fixed], fakes=tune_spread.resolve_fakes(fakes))
    arch = tuner.device.sm_arch
    configs, notes = probe_space(tunable.fixed, dims, arch)
    if len(configs) > max_configs:
        raise UsageError(f"probe would time {len(configs)} configs (limit {max_configs})",
                         hint="probe fewer dimensions at once, or raise --max-configs")
    say(f"probing {len(configs)} configs x {len(shape_list)} shapes of {tunable.name} on {arch}"
        + (f", shapes spread over --gpus {gpus} ({engine})" if spread else ""))
    results = tune_spread.time_shapes(target, tunable, configs, shape_list, gpus=gpus, engine=engine, fakes=fakes)
    ranked = rank(results)
    keep = keep_set(results, tolerance=tolerance, max_keep=8, must_keep=[tunable.fixed])
    failed = sum(1 for trials in results.values() for t in trials if not t.ok)
    text = "\n".join([format_table(ranked, list(results)),
                      f"keep ({len(keep)}, within {tolerance:.0%} of the best on every shape): "
                      + "; ".join(c.label() for c in keep),
                      *[f"note: {n}" for n in notes + ([f"{failed} trials failed (see --json)"] if failed else [])]])
    data = {"target": target, "arch": arch, "shapes": list(results), "keep": [c.to_json() for c in keep],
            "ranked": [{"config": r.config.to_json(), "geomean": r.geomean, "wins": r.wins, "per_shape": r.per_shape}
                       for r in ranked],
            "failures": [{"shape": s, **t.to_json()} for s, ts in results.items() for t in ts if not t.ok],
            "notes": notes}
    return Outcome(text, data)

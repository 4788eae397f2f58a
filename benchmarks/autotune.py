"""Autotuning benchmark (GPU). Prints one table; every number below is measured in this run.

    python benchmarks/autotune.py            # about 2-5 minutes on an H200

1. Tuning wall time, 8/16/30 matmul configs: ours (parallel precompile + cuTile's timing) vs
   ``cuda.tile.tune.exhaustive_search`` (serial compile on first launch). Each contender gets its
   own empty cuTile disk cache; the winners are compared on exhaustive_search's own measurements.
2. Host overhead of a cached launch (``Autotuner.launch`` and a dict lookup) vs a raw ``ct.launch``.
3. A second process with a warm persistent cache: configs compiled and timed (goal: 0 and 0).
4. Budgeted search (sample_refine, budget 30) vs exhaustive on a ~100-config space.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import cuda.tile as ct

N = 4096


@ct.kernel
def bench_matmul_kernel(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int], TK: ct.Constant[int]):
    bid_m = ct.bid(0)
    bid_n = ct.bid(1)
    acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
    for k in range(ct.num_tiles(A, axis=1, shape=(TM, TK))):
        a = ct.load(A, index=(bid_m, k), shape=(TM, TK), padding_mode=ct.PaddingMode.ZERO)
        b = ct.load(B, index=(k, bid_n), shape=(TK, TN), padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(a, b, acc)
    ct.store(C, index=(bid_m, bid_n), tile=ct.astype(acc, C.dtype))


@ct.kernel
def tiny_kernel(X, TILE: ct.Constant[int]):
    t = ct.load(X, index=(ct.bid(0),), shape=(TILE,))
    ct.store(X, index=(ct.bid(0),), tile=t)


def matmul_configs(count: int):
    from cutile_perf.tune import Config

    grid = itertools.product((64, 128, 256), (64, 128, 256), (32, 64), (1, 2), (1, 2))
    configs = [Config(TILE_M=m, TILE_N=n, TILE_K=k, occupancy=o, num_ctas=c) for m, n, k, o, c in grid]
    from cutile_perf.tune.spaces import valid

    configs = [c for c in configs if valid(c, "sm_90")]
    # 128x128x64 first: the measured H200 winner is our fixed config in every size.
    configs.sort(key=lambda c: (c != Config(TILE_M=128, TILE_N=128, TILE_K=64, occupancy=1, num_ctas=1),))
    return configs[:count]


def problem():
    import torch

    a = torch.randn(N, N, dtype=torch.float16, device="cuda")
    b = torch.randn(N, N, dtype=torch.float16, device="cuda")
    c = torch.empty(N, N, dtype=torch.float16, device="cuda")
    return (lambda cfg: (N // cfg.TILE_M, N // cfg.TILE_N, 1)), (lambda cfg: (a, b, c, cfg.TILE_M, cfg.TILE_N, cfg.TILE_K))


def fresh_tile_cache() -> str:
    from cuda.tile._cext import default_tile_context

    path = tempfile.mkdtemp(prefix="cutile-cache-")
    default_tile_context.config.cache_dir = path
    return path


def run_ours(configs, grid_fn, args_fn, **kw):
    import torch

    from cutile_perf.tune import Autotuner

    tuner = Autotuner(bench_matmul_kernel, configs, fixed=configs[0], persistent=False, **kw)
    t0 = time.perf_counter()
    tuner.tune("k", torch.cuda.current_stream(), grid_fn, args_fn)
    return time.perf_counter() - t0, tuner


def run_cutile(configs, grid_fn, args_fn):
    import torch
    from cuda.tile.tune import exhaustive_search

    t0 = time.perf_counter()
    result = exhaustive_search(configs, torch.cuda.current_stream(), grid_fn, bench_matmul_kernel, args_fn,
                               hints_fn=lambda cfg: cfg.hints(), quiet=True)
    return time.perf_counter() - t0, result


def section_tuning(rows, grid_fn, args_fn):
    from cutile_perf.tune.precompile import shutdown_pool

    for count in (8, 16, 30):
        configs = matmul_configs(count)
        fresh_tile_cache()
        shutdown_pool()  # ours pays its worker start-up in every row
        ours_s, tuner = run_ours(configs, grid_fn, args_fn)
        fresh_tile_cache()
        theirs_s, result = run_cutile(configs, grid_fn, args_fn)
        ours_best = tuner.cache["k"].config
        means = {m.config: m.mean_us for m in result.successes}
        gap = means.get(ours_best, float("nan")) / result.best.mean_us - 1
        rows.append((f"tune {count} matmul configs: ours / exhaustive_search", f"{ours_s:.1f} s / {theirs_s:.1f} s",
                     f"{theirs_s / ours_s:.1f}x faster (goal >= 3x at 16); winner {ours_best.label()} is "
                     f"{gap:+.1%} vs theirs {result.best.config.label()}"))


def section_overhead(rows):
    import torch

    from cutile_perf.tune import Autotuner, Config

    x = torch.zeros(1024, device="cuda")
    stream = torch.cuda.current_stream()
    tuner = Autotuner(tiny_kernel, [Config(TILE=1024)], fixed=Config(TILE=1024), persistent=False)
    grid_fn, args_fn = (lambda cfg: (1,)), (lambda cfg: (x, cfg.TILE))
    tuner.launch(stream, "k", grid_fn, args_fn)
    n = 20000

    def per_call(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        return elapsed / n * 1e6

    raw = per_call(lambda: ct.launch(stream, (1,), tiny_kernel, (x, 1024)))
    cached = per_call(lambda: tuner.launch(stream, "k", grid_fn, args_fn))
    cfg_kernel = tuner.cache["k"]
    lookup = per_call(lambda: ct.launch(stream, (1,), tuner.cache["k"].kernel, (x, cfg_kernel.config.TILE)))
    rows.append(("host time per launch: raw ct.launch", f"{raw:.2f} us", ""))
    rows.append(("  + dict lookup (pattern in user code)", f"{lookup - raw:+.2f} us", "goal <= 1 us"))
    rows.append(("  Autotuner.launch (lookup + grid_fn + args_fn)", f"{cached - raw:+.2f} us", "goal <= 1 us"))


def child_warm_cache(tune_dir: str) -> None:
    """Second process: same kernel, key and space; reports what it had to compile and time."""
    import torch

    grid_fn, args_fn = problem()

    from cutile_perf.tune import Autotuner

    configs = matmul_configs(8)
    tuner = Autotuner(bench_matmul_kernel, configs, fixed=configs[0], cache_dir=tune_dir)
    t0 = time.perf_counter()
    tuner.tune("k", torch.cuda.current_stream(), grid_fn, args_fn)
    r = tuner.reports["k"]
    print(json.dumps({"source": r.source, "compiled": r.compiled, "timed": r.timed, "s": time.perf_counter() - t0}))


def section_warm_cache(rows, grid_fn, args_fn):
    import torch

    from cutile_perf.tune import Autotuner

    tune_dir = tempfile.mkdtemp(prefix="cutile-perf-tune-")
    configs = matmul_configs(8)
    Autotuner(bench_matmul_kernel, configs, fixed=configs[0], cache_dir=tune_dir).tune(
        "k", torch.cuda.current_stream(), grid_fn, args_fn)
    out = subprocess.run([sys.executable, __file__, "--child-warm-cache", tune_dir], capture_output=True, text=True,
                         env=dict(os.environ), check=True)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    rows.append(("second process, warm persistent cache", f"{child['s']:.2f} s",
                 f"source={child['source']} compiled={child['compiled']} timed={child['timed']} (goal 0 and 0)"))


def section_budget(rows, grid_fn, args_fn):
    from cutile_perf.tune import Config
    from cutile_perf.tune.spaces import valid

    space = [Config(TILE_M=m, TILE_N=n, TILE_K=k, occupancy=o, num_ctas=c) for m, n, k, o, c in
             itertools.product((32, 64, 128, 256), (32, 64, 128, 256), (32, 64), (1, 2), (1, 2))]
    space = [c for c in space if valid(c, "sm_90")][:100]
    fixed = Config(TILE_M=64, TILE_N=64, TILE_K=32, occupancy=1, num_ctas=1)
    space = [fixed] + [c for c in space if c != fixed]
    fresh_tile_cache()
    full_s, full = run_ours(space, grid_fn, args_fn)
    scores = {t.config: t.score for t in full.reports["k"].trials}
    best = min(scores.values())
    budget_s, budgeted = run_ours(space, grid_fn, args_fn, strategy="sample_refine", options={"budget": 30})
    pick = budgeted.cache["k"].config
    rows.append((f"budgeted vs exhaustive on {len(space)} configs",
                 f"{budgeted.reports['k'].timed} vs {full.reports['k'].timed} evaluated",
                 f"winner {pick.label()} is {scores[pick] / best - 1:+.1%} from the exhaustive best "
                 f"(exhaustive {full_s:.0f} s, budgeted {budget_s:.0f} s with a warm tile cache)"))


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child-warm-cache":
        child_warm_cache(sys.argv[2])
        return 0
    grid_fn, args_fn = problem()
    fresh_tile_cache()
    run_cutile(matmul_configs(1), grid_fn, args_fn)  # toolchain probes happen once, outside every row
    rows: list[tuple[str, str, str]] = []
    section_tuning(rows, grid_fn, args_fn)
    section_overhead(rows)
    section_warm_cache(rows, grid_fn, args_fn)
    section_budget(rows, grid_fn, args_fn)
    width = max(len(r[0]) for r in rows)
    print(f"autotune benchmark, matmul {N}^3 fp16, {os.cpu_count()} CPUs")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:<22} {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

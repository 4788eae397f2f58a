"""Autotuning benchmark. Prints one table with a goal column; every number is measured in the run.

    python benchmarks/autotune.py                   # GPU, all sections, about 2 minutes on an H200
    python benchmarks/autotune.py tuning overhead   # GPU, only the named sections (tuning overhead warm budget)
    python benchmarks/autotune.py --cpu-precompile [N]  # no GPU: stage 1 alone (N configs, default 16),
                                                        # serial vs threads vs worker pool

Sections (run from the checkout root with PYTHONPATH=scripts:examples/kernels/src):
1. tuning: the first tuning in a process at 8/16/30 matmul configs, ours vs
   ``cuda.tile.tune.exhaustive_search``, each count in a fresh child process, each contender on an
   empty cuTile disk cache; the winners are compared on exhaustive_search's own measurements.
2. overhead: host time of a cached ``Autotuner.launch`` and of a dict lookup over a raw ``ct.launch``.
3. warm: a second process with a warm persistent cache: configs compiled and timed (goal 0 and 0).
4. budget: 256 matmul configs, legality-pruned for sm_90 and 4096^3, then the model-based
   ``surrogate`` strategy and ``sample_refine`` (same budget) vs exhaustive over the legal ones.

Measured (H200, 16 CPUs, cuda-tile 1.7.0, matmul 4096^3 fp16; single runs). Tuning rows from
``python benchmarks/autotune.py tuning`` on 2026-12-02 (single run) after commit 6984491
(``HandoffKernel.replace_hints`` returns the kernel itself for unchanged options, so
exhaustive_search's timing stage no longer re-runs the frontend per config); its output is
benchmarks/results/2026-12-02-h200/issue22/autotune_tuning.txt. The launch row from
``python benchmarks/autotune.py tuning overhead`` on 2026-12-01 with the probe cut
(``cutile_perf.tune.timing.probe_cut``); the others from an earlier full run:

| measurement | ours | reference | goal |
| --- | --- | --- | --- |
| first tuning, 8 configs | 0.59 s = compile 0.57 s + timing 0.03 s (7 cut) | exhaustive_search 2.15 s: 3.6x | >= 2x met |
| first tuning, 16 configs | 0.70 s = compile 0.65 s + timing 0.05 s (11 cut) | 4.63 s: 6.6x | >= 5x met |
| first tuning, 30 configs | 1.13 s = compile 1.04 s + timing 0.09 s (17 cut) | 11.92 s: 10.5x | >= 8x met |
| stage 1 floor at 8/16/30 | longest tileiras 0.53 / 0.61 / 0.78 s; frontend+cache CPU 0.15 / 0.27 / 0.59 s | - | - |
| winner at 8/16/30 | 128x128x64 occupancy 1 num_ctas 1 | same | same |
| Autotuner.launch over raw ct.launch (4.93 us) | -0.20 us (within noise) | - | <= 0.5 us met |
| second process, warm persistent cache | 0.27 s, compiled 0, timed 0 | - | 0 and 0 met |
| legality pruning | 256 -> 224 configs (32: shared memory, accumulator spill) | - | - |
| surrogate on 224 configs | 56 evaluated (25 %), winner = exhaustive best (+0.0 %) | exhaustive 224 | <= 2 % with <= 30 % met |
| sample_refine, same budget | 36 evaluated, winner +14.0 % (local optimum) | exhaustive 224 | - |

The 2026-12-01 run of the same rows (before commit 6984491, single run): 0.69 s / 2.16 s (3.1x),
0.93 s / 5.15 s (5.5x), 1.53 s / 11.19 s (7.3x, 8x missed), timing 0.04 / 0.12 / 0.45 s. Stage 1
(compile) is bounded by frontends that run one at a time (cuTile's lock and the GIL) plus the
slowest tileiras. Before the probe cut the same rows were 2.1x / 4.4x / 6.0x.
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
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


def breakdown(report) -> str:
    """``pool 0.4 s + compile 1.2 s [...] (load 0.3 s overlapped) + timing 0.8 s`` of a ``TuneReport``."""
    head = f"pool {report.pool_s:.1f} s + " if report.pool_s else ""
    return (f"{head}compile {report.compile_s:.2f} s [{report.compiler or 'none'}, handoffs {report.handoffs}]"
            f" (load {report.load_s:.2f} s overlapped) + timing {report.timing_s:.2f} s")


def tuning_child(count: int) -> None:
    """A fresh process (as a user's program): the first tuning in it, ours, then exhaustive_search.

    Both get an empty cuTile disk cache. cuTile's toolchain probes (``tileiras --version``, the
    bytecode-version probe) are paid once before either, on an unrelated kernel, so neither pays
    them; the matmul kernel's Python frontend is first met by ours (theirs then finds its
    parsed function cached: an edge for them, if any).
    """
    import torch

    from cutile_perf.tune.precompile import pool_running

    grid_fn, args_fn = problem()
    x = torch.zeros(1024, device="cuda")
    ct.launch(torch.cuda.current_stream(), (1,), tiny_kernel, (x, 1024))  # toolchain probes, CUDA context
    torch.cuda.synchronize()
    configs = matmul_configs(count)
    assert not pool_running()
    fresh_tile_cache()
    ours_s, tuner = run_ours(configs, grid_fn, args_fn)
    report = tuner.reports["k"]
    fresh_tile_cache()
    theirs_s, result = run_cutile(configs, grid_fn, args_fn)
    means = {m.config: m.mean_us for m in result.successes}
    ours_best = tuner.cache["k"].config
    print(json.dumps({"count": count, "ours_s": ours_s, "theirs_s": theirs_s, "breakdown": breakdown(report),
                      "compiler": report.compiler, "handoffs": report.handoffs, "compiled": report.compiled,
                      "pruned": sum(1 for t in report.trials if t.error == "pruned"),
                      "compile_s": report.compile_s, "frontend_s": report.frontend_s, "tileiras_s": report.tileiras_s,
                      "tileiras_max_s": report.tileiras_max_s, "cpus": os.cpu_count(),
                      "ours_best": ours_best.label(), "theirs_best": result.best.config.label(),
                      "gap": means.get(ours_best, float("nan")) / result.best.mean_us - 1}))


GOALS_TUNE = {8: 2.0, 16: 5.0, 30: 8.0}


def section_tuning(rows):
    for count in (8, 16, 30):
        child = run_child("--child-tuning", str(count))
        speedup = child["theirs_s"] / child["ours_s"]
        goal = GOALS_TUNE[count]
        rows.append((f"first tuning in a process, {count} matmul configs: ours / exhaustive_search",
                     f"{child['ours_s']:.2f} s / {child['theirs_s']:.2f} s", f"{speedup:.1f}x faster",
                     f">= {goal:g}x", "met" if speedup >= goal else "MISSED"))
        rows.append(("  ours: where the time goes",
                     f"{child['breakdown']}; {child['pruned']} of {count} dropped by the probe cut",
                     f"winner {child['ours_best']} {child['gap']:+.1%} vs theirs ({child['theirs_best']})", "", ""))
        rows.append(("  ours: what bounds stage 1 (compile)", stage1_bounds(child), "", "", ""))


def stage1_bounds(r: dict) -> str:
    """Stage 1's wall against its two floors: frontends one at a time (CPU seconds of the compile
    threads) and tileiras over the CPUs (or the longest run, if larger)."""
    tileiras_floor = max(r["tileiras_s"] / r["cpus"], r["tileiras_max_s"])
    return (f"compile {r['compile_s']:.2f} s; frontend+cache CPU {r['frontend_s']:.2f} s (one at a time); tileiras "
            f"{r['tileiras_s']:.2f} s in all / {r['cpus']} CPUs, longest {r['tileiras_max_s']:.2f} s: floor "
            f"{tileiras_floor:.2f} s")


def section_overhead(rows):
    import torch

    from cutile_perf.tune import Autotuner, Config

    x = torch.zeros(1024, device="cuda")
    stream = torch.cuda.current_stream()
    tuner = Autotuner(tiny_kernel, [Config(TILE=1024)], fixed=Config(TILE=1024), persistent=False)
    grid_fn, args_fn = (lambda cfg: (1,)), (lambda cfg: (x, cfg.TILE))
    tuner.launch(stream, "k", grid_fn, args_fn)
    ct.launch(stream, (1,), tiny_kernel, (x, 1024))
    cfg_kernel = tuner.cache["k"]
    n = 20000

    def per_call(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        return elapsed / n * 1e6

    cases = {"raw": lambda: ct.launch(stream, (1,), tiny_kernel, (x, 1024)),
             "tuner": lambda: tuner.launch(stream, "k", grid_fn, args_fn),
             "lookup": lambda: ct.launch(stream, (1,), tuner.cache["k"].kernel, (x, cfg_kernel.config.TILE))}
    samples = {k: [] for k in cases}
    for _ in range(5):  # interleaved rounds: clock drift hits every case alike
        for name, fn in cases.items():
            samples[name].append(per_call(fn))
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows.append(("host time per launch: raw ct.launch (median of 5 x 20000)", f"{med['raw']:.2f} us", "", "", ""))
    rows.append(("  + dict lookup (pattern in user code)", f"{med['lookup'] - med['raw']:+.2f} us", "", "", ""))
    extra = med["tuner"] - med["raw"]
    rows.append(("  Autotuner.launch (lookup + grid_fn + args_fn)", f"{extra:+.2f} us", "", "<= 0.5 us",
                 "met" if extra <= 0.5 else "MISSED"))


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


def run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=dict(os.environ))
    if out.returncode:
        raise RuntimeError(f"child {args} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def section_warm_cache(rows, grid_fn, args_fn):
    import torch

    from cutile_perf.tune import Autotuner

    tune_dir = tempfile.mkdtemp(prefix="cutile-perf-tune-")
    configs = matmul_configs(8)
    Autotuner(bench_matmul_kernel, configs, fixed=configs[0], cache_dir=tune_dir).tune(
        "k", torch.cuda.current_stream(), grid_fn, args_fn)
    child = run_child("--child-warm-cache", tune_dir)
    ok = child["compiled"] == 0 and child["timed"] == 0
    rows.append(("second process, warm persistent cache", f"{child['s']:.2f} s",
                 f"source={child['source']} compiled={child['compiled']} timed={child['timed']}", "0 and 0",
                 "met" if ok else "MISSED"))


def budget_space():
    """256 matmul configs, legality-pruned for sm_90 and 4096^3 (the fixed config is kept)."""
    from cutile_perf.tune import Config
    from cutile_perf.tune.legality import prune

    raw = [Config(TILE_M=m, TILE_N=n, TILE_K=k, occupancy=o, num_ctas=c) for m, n, k, o, c in
           itertools.product((32, 64, 128, 256), (32, 64, 128, 256), (16, 32, 64, 128), (1, 2), (1, 2))]
    fixed = Config(TILE_M=64, TILE_N=64, TILE_K=32, occupancy=1, num_ctas=1)
    kept, dropped = prune(raw, arch="sm_90", dims={"TILE_M": N, "TILE_N": N, "TILE_K": N}, keep=[fixed])
    return raw, [fixed] + [c for c in kept if c != fixed], dropped


def section_budget(rows, grid_fn, args_fn):
    raw, space, dropped = budget_space()
    fresh_tile_cache()
    model_s, model = run_ours(space, grid_fn, args_fn, strategy="surrogate")  # cold tile cache: its own compiles
    local_s, local = run_ours(space, grid_fn, args_fn, strategy="sample_refine",
                              options={"budget": model.reports["k"].timed})
    full_s, full = run_ours(space, grid_fn, args_fn)
    scores = {t.config: t.score for t in full.reports["k"].trials}
    best = min(scores.values())
    best_cfg = min(scores, key=scores.get)
    rows.append((f"legality pruning: {len(raw)} matmul configs", f"{len(space)} legal", f"{len(dropped)} dropped before "
                 "compiling (smem, sm_90 accumulator spill)", "", ""))
    for name, tuner, secs in (("surrogate (model-based)", model, model_s), ("sample_refine, same budget", local, local_s)):
        pick = tuner.cache["k"].config
        gap = scores[pick] / best - 1
        frac = tuner.reports["k"].timed / full.reports["k"].timed
        goal = name.startswith("surrogate")
        rows.append((f"budgeted {name} vs exhaustive on {len(space)} configs",
                     f"{tuner.reports['k'].timed} of {full.reports['k'].timed} evaluated ({frac:.0%})",
                     f"winner {pick.label()} {gap:+.1%} from the exhaustive best; {secs:.0f} s",
                     "<= 2 % with <= 30 %" if goal else "",
                     ("met" if gap <= 0.02 and frac <= 0.30 else "MISSED") if goal else ""))
    rows.append(("  exhaustive (all legal configs)", f"{full_s:.0f} s", f"best {best_cfg.label()} "
                 f"{best * 1000:.1f} us", "", ""))


def _aot_jobs(configs, cache_dir):
    """Compile jobs with hand-written signatures (the JIT's own need a GPU), as the tests build them."""
    from cuda.tile.compilation import CallingConvention, KernelSignature

    from cutile_perf.tune.precompile import CompileJob, KernelRef, compiler_options

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "kernels", "src"))
    from tilesuite.aot import contiguous

    jobs = []
    for cfg in configs:
        arrays = [contiguous(ct.float16, 2) for _ in range(3)]
        sig = KernelSignature(arrays + [cfg.TILE_M, cfg.TILE_N, cfg.TILE_K], CallingConvention.cutile_python_v1())
        jobs.append(CompileJob(cfg, KernelRef.of(bench_matmul_kernel), compiler_options(bench_matmul_kernel, cfg.hints()),
                               (sig,), "sm_90", cache_dir, 120.0))
    return jobs


def cpu_serial(configs) -> float:
    from cuda.tile._compile import compile_tile

    jobs = _aot_jobs(configs, fresh_tile_cache())
    t0 = time.perf_counter()
    for job in jobs:
        hinted = bench_matmul_kernel.replace_hints(**job.config.hints())
        compile_tile(hinted._annotated_function, list(job.signatures), "sm_90", hinted._compiler_options)
    return time.perf_counter() - t0


def cpu_threads(configs) -> tuple[float, int, dict]:
    """Stage 1 in threads in this process (what a first tuning does now): seconds, configs ok, and
    the bounds ``stage1_bounds`` prints."""
    from cutile_perf.tune.threadcompile import default_threads, run_threads

    jobs = _aot_jobs(configs, fresh_tile_cache())
    t0 = time.perf_counter()
    out = run_threads(bench_matmul_kernel, [(j.config, list(j.signatures)) for j in jobs], "sm_90",
                      workers=default_threads(), timeout_s=120.0)
    wall = time.perf_counter() - t0
    parts = {"compile_s": wall, "frontend_s": sum(o.python_s for o in out.values()),
             "tileiras_s": sum(o.tileiras_s for o in out.values()),
             "tileiras_max_s": max(o.tileiras_s for o in out.values()), "cpus": os.cpu_count()}
    return wall, sum(o.status == "ok" for o in out.values()), parts


def cpu_pool_child(method: str, count: int) -> None:
    """A fresh process (as a user's program would be): cold pool, then the same pool reused."""
    import multiprocessing

    import cutile_perf.tune.precompile as precompile

    if method == "spawn":  # the start method before the fork server, for comparison
        precompile._mp_context = lambda: multiprocessing.get_context("spawn")
    configs = matmul_configs(count)
    workers = min(16, os.cpu_count() or 2)
    result = {}
    for name in ("cold", "reused"):
        jobs = _aot_jobs(configs, fresh_tile_cache())
        t0 = time.perf_counter()
        result[name + "_start"] = precompile.ensure_pool(workers, wait=True)
        outcomes = precompile.run_jobs(jobs, workers=workers)
        result[name] = time.perf_counter() - t0
        result[name + "_ok"] = sum(o.status == "ok" for o in outcomes.values())
    precompile.shutdown_pool()
    print(json.dumps(result))


def cpu_precompile(count: int = 16, reps: int = 3) -> None:
    """Stage 1 alone, no GPU: the same configs compiled serially in-process vs by the worker pool
    (spawned workers as before, then the fork server); fresh cuTile disk cache and, for the pool,
    a fresh process each time, so "cold" includes everything a first tuning pays."""
    import statistics

    configs = matmul_configs(count)
    cpu_serial(configs[:1])  # toolchain probes and imports once, outside every measurement
    runs: dict[str, list[float]] = {}
    for _ in range(reps):
        runs.setdefault("serial", []).append(cpu_serial(configs))
        threads_s, threads_ok, parts = cpu_threads(configs)
        assert threads_ok == count, threads_ok
        runs.setdefault("threads", []).append(threads_s)
        for key, value in parts.items():
            runs.setdefault(f"threads {key}", []).append(value)
        for method in ("spawn", "forkserver"):
            out = subprocess.run([sys.executable, __file__, "--cpu-pool-child", method, str(count)],
                                 capture_output=True, text=True, check=True, env=dict(os.environ))
            child = json.loads(out.stdout.strip().splitlines()[-1])
            assert child["cold_ok"] == child["reused_ok"] == count, child
            for key in ("cold", "cold_start", "reused"):
                runs.setdefault(f"{method} {key}", []).append(child[key])
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"stage 1 alone (sm_90 cubins, no GPU), {count} matmul configs, {os.cpu_count()} CPUs, "
          f"{min(16, os.cpu_count() or 2)} workers, median of {reps}; load average {os.getloadavg()[0]:.1f}")
    print(f"  serial in-process compile_tile         {med['serial']:.2f} s")
    print(f"  threads in-process (tileiras overlapped) {med['threads']:.2f} s")
    print("    " + stage1_bounds({k: med[f"threads {k}"] for k in ("compile_s", "frontend_s", "tileiras_s",
                                                                     "tileiras_max_s", "cpus")}))
    for method in ("spawn", "forkserver"):
        print(f"  {method:<10} pool, new process: cold {med[method + ' cold']:.2f} s "
              f"(workers answering after {med[method + ' cold_start']:.2f} s), reused {med[method + ' reused']:.2f} s")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child-warm-cache":
        child_warm_cache(sys.argv[2])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--child-tuning":
        tuning_child(int(sys.argv[2]))
        return 0
    if len(sys.argv) in (2, 3) and sys.argv[1] == "--cpu-precompile":
        cpu_precompile(*(int(a) for a in sys.argv[2:]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--cpu-pool-child":
        cpu_pool_child(sys.argv[2], int(sys.argv[3]))
        return 0
    sections = {"tuning", "overhead", "warm", "budget"}
    only = set(sys.argv[1:]) or sections
    if only - sections:
        print(f"unknown section {', '.join(sorted(only - sections))}; sections: {', '.join(sorted(sections))}",
              file=sys.stderr)
        return 2
    rows = _EchoRows()  # each row also goes to stderr as soon as it is measured (a timeout keeps them)
    if "tuning" in only:
        section_tuning(rows)  # child processes: run before this process touches the GPU much
    grid_fn, args_fn = problem()
    if "overhead" in only:
        section_overhead(rows)
    if "warm" in only:
        section_warm_cache(rows, grid_fn, args_fn)
    if "budget" in only:
        section_budget(rows, grid_fn, args_fn)
    import torch

    print(f"autotune benchmark, matmul {N}^3 fp16, {torch.cuda.get_device_name()}, {os.cpu_count()} CPUs, "
          f"cuda-tile {_version()}")
    header = ("measurement", "value", "note", "goal", "")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
    for r in [header] + rows:
        print("  ".join(f"{c:<{w}}" for c, w in zip(r, widths)).rstrip())
    return 0


class _EchoRows(list):
    def append(self, row) -> None:
        print(" | ".join(row), file=sys.stderr, flush=True)
        super().append(row)


def _version() -> str:
    from importlib.metadata import version

    try:
        return version("cuda-tile")
    except Exception:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())

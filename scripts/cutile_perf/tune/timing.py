"""Timing backends for the warm-up and timing stages. Each one turns compiled candidates into trials.

* ``BenchTimer``: ``cutile_perf.bench`` (CUDA events, L2 flushed by default), median of samples.
* ``CuTileTimer``: ``cuda.tile.tune.exhaustive_search`` over the candidates (cuTile's adaptive
  sampling, mean of single cold-L2 launches); one "sample" per config: the mean. Configs that
  lost by far in a quick host probe are dropped first (``probe_cut``).
* ``FakeBench``: scripted times for CPU tests; it calls each launch once and never measures.

All take the whole batch so that warm-up (first launch: JIT, a disk-cache hit after precompile)
runs for every candidate before any timing starts.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cutile_perf.tune.config import Config, Trial, as_config
from cutile_perf.bench import bench


@dataclass
class Candidate:
    """A config ready to launch: its tuned kernel object, grid and (scratch) arguments."""

    config: Config
    kernel: Any
    grid: tuple
    args: tuple
    stream: Any
    launcher: Callable[..., Any]

    def launch(self) -> None:
        self.launcher(self.stream, self.grid, self.kernel, self.args)


class Timer(Protocol):
    def __call__(self, candidates: Sequence[Candidate]) -> list[Trial]: ...


def _tail(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[-2000:]


def warm_up(candidates: Sequence[Candidate]) -> tuple[list[Candidate], list[Trial]]:
    """Launch each candidate once (JIT load) and synchronize; failures become launch trials."""
    ready: list[Candidate] = []
    failed: list[Trial] = []
    for cand in candidates:
        try:
            cand.launch()
            _synchronize()
            ready.append(cand)
        except Exception as exc:  # a failure is a result (house style 10)
            failed.append(Trial(cand.config, None, "launch", _tail(exc)))
    return ready, failed


def _synchronize() -> None:
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@dataclass
class BenchTimer:
    """Times with ``cutile_perf.bench.bench``; small budgets by default (tuning, not reporting)."""

    warmup_ms: float = 5.0
    rep_ms: float = 25.0
    mode: str | None = None

    def __call__(self, candidates: Sequence[Candidate]) -> list[Trial]:

        ready, trials = warm_up(candidates)
        for cand in ready:
            try:
                times = bench(cand.launch, warmup_ms=self.warmup_ms, rep_ms=self.rep_ms, mode=self.mode)
                trials.append(Trial(cand.config, tuple(times)))
            except Exception as exc:
                trials.append(Trial(cand.config, None, "launch", _tail(exc)))
        return trials


def probe_cut(candidates: Sequence[Candidate], cut: float, repeats: int = 2,
              clock: Callable[[], float] = time.perf_counter) -> tuple[list[Candidate], list[Trial]]:
    """Time each (warmed-up) candidate ``repeats`` times on the host, launch plus synchronize, and
    drop those whose best probe is more than ``cut`` x the fastest one's: they cannot win.

    Why: exhaustive_search gives every config 3 warm-up and at least 5 timed launches, so a config
    10x slower than the best costs as much as 10 good ones; with Blackwell-sized tiles in a Hopper
    space most of the timing stage went to configs that had lost by their first launch. A host
    probe adds the same launch overhead to every config, which only pulls ratios towards 1: it can
    keep a loser, never drop a config within ``cut`` of the best. The dropped ones become
    ``pruned`` trials (score +inf), never timed against the others' cold-L2 means.
    """
    probes: dict[int, float] = {}
    survivors: list[Candidate] = []
    trials: list[Trial] = []
    for i, cand in enumerate(candidates):
        try:
            best = float("inf")
            for _ in range(repeats):
                start = clock()
                cand.launch()
                _synchronize()
                best = min(best, clock() - start)
            probes[i] = best
        except Exception as exc:
            trials.append(Trial(cand.config, None, "launch", _tail(exc)))
    if not probes:
        return survivors, trials
    fastest = min(probes.values())
    for i, seconds in probes.items():
        if seconds <= cut * fastest:
            survivors.append(candidates[i])
        else:
            trials.append(Trial(candidates[i].config, None, "pruned",
                                f"probe {seconds * 1e3:.3f} ms > {cut:g} x the fastest probe {fastest * 1e3:.3f} ms"))
    return survivors, trials


@dataclass
class CuTileTimer:
    """Delegates timing to ``cuda.tile.tune.exhaustive_search`` (its sampling and statistic).

    ``cut``: before that, configs whose host probe is more than ``cut`` x the fastest are dropped
    (``probe_cut``); None times every config that launches.
    """

    flush_l2: bool = True
    cut: float | None = 1.5

    def __call__(self, candidates: Sequence[Candidate]) -> list[Trial]:
        from cuda.tile.tune import exhaustive_search

        ready, trials = warm_up(candidates)
        if self.cut is not None and len(ready) > 1:
            ready, dropped = probe_cut(ready, self.cut)
            trials += dropped
        if not ready:
            return trials
        by_cfg = {c.config: c for c in ready}
        try:
            result = exhaustive_search(
                [c.config for c in ready], ready[0].stream,
                grid_fn=lambda cfg: by_cfg[cfg].grid,
                kernel=lambda cfg: by_cfg[cfg].kernel,  # already hinted; hints_fn stays None
                args_fn=lambda cfg: by_cfg[cfg].args,
                quiet=True, flush_l2=self.flush_l2,
            )
        except ValueError as exc:  # "No valid config found": every launch failed
            return trials + [Trial(c.config, None, "launch", _tail(exc)) for c in ready]
        for m in result.successes:
            trials.append(Trial(m.config, (m.mean_us / 1000.0,)))
        for cfg, exc_type, message in result.failures:
            trials.append(Trial(cfg, None, "launch", f"{getattr(exc_type, '__name__', exc_type)}: {message}"[-2000:]))
        return trials


class FakeBench:
    """FAKE timing backend for CPU tests: scripted milliseconds per config, no measurement.

    ``FakeBench({cfg_a: 1.0, cfg_b: 0.8})`` or ``FakeBench(lambda cfg: ...)``. Each candidate is
    launched once (so a fake launcher sees exactly what a real search would run); a config with
    no scripted time becomes a ``launch`` failure. ``timed`` lists the configs in timing order.
    """

    def __init__(self, times: Mapping[Any, float | Sequence[float]] | Callable[[Config], float]):
        self._fn = times if callable(times) else None
        self._table = {} if callable(times) else {as_config(k): v for k, v in times.items()}
        self.timed: list[Config] = []

    def __call__(self, candidates: Sequence[Candidate]) -> list[Trial]:
        ready, trials = warm_up(candidates)
        for cand in ready:
            value = self._fn(cand.config) if self._fn else self._table.get(cand.config)
            if value is None:
                trials.append(Trial(cand.config, None, "launch", "FakeBench has no time for this config"))
                continue
            self.timed.append(cand.config)
            times = tuple(value) if isinstance(value, Sequence) else (float(value),)
            trials.append(Trial(cand.config, times))
        return trials


TIMERS: dict[str, Callable[[], Timer]] = {"cutile": CuTileTimer, "bench": BenchTimer}

"""Tune once per key, cache the config AND the hinted kernel object, then launch with a dict lookup.

    tuner = Autotuner(rms_norm_kernel, occupancy_space(), fixed=Config(occupancy=1))

    def rms_norm(x, w, out):
        key = shape_key(x, w)
        entry = tuner.cache.get(key) or tuner.tune(key, stream, grid_fn, args_fn)
        ct.launch(stream, grid_fn(entry.config), entry.kernel, args_fn(entry.config))

``tuner.launch(stream, key, grid_fn, args_fn)`` does the same in one call. ``replace_hints`` runs
once per config (``kernel_for``), never on the hot path. With ``DISABLE_AUTOTUNE=1`` (or TileGym's
``TILEGYM_DISABLE_AUTOTUNE=1``) ``tune`` returns the fixed config without compiling or timing.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cutile_perf import knobs
from cutile_perf.errors import IterationCrashed, UsageError
from cutile_perf.tune import keys
from cutile_perf.tune.cache import TuneCache
from cutile_perf.tune.config import Config, Trial, as_config, as_space, best_trial
from cutile_perf.tune import handoff
from cutile_perf.tune.precompile import (CompileJob, CompileOutcome, KernelRef, compiler_options, default_workers,
                                         distinct_signatures, ensure_pool, pool_running, run_jobs)
from cutile_perf.tune.splitbuf import split_buffer
from cutile_perf.tune.strategies import get_strategy, resolve_options
from cutile_perf.tune.threadcompile import ThreadPrecompiler
from cutile_perf.tune.timing import TIMERS, Candidate, Timer, warm_up


class TuneFailed(IterationCrashed):
    """Every config failed to compile or launch: there is nothing to launch."""


class Tuned(NamedTuple):
    config: Config
    kernel: Any


@dataclass
class TuneReport:
    """What the last ``tune`` of one key did: where the answer came from and what it cost."""

    source: str  # search | disk | disabled
    trials: list[Trial] = field(default_factory=list)
    compiled: int = 0  # configs compiled by the workers
    timed: int = 0  # configs that reached the timing stage
    pool_s: float = 0.0  # starting the compile workers (0 when a running pool was reused, or threads)
    compiler: str = ""  # threads | pool | none: who ran stage 1
    handoffs: int = 0  # configs whose first launch took stage 1's cubin directly (no second frontend)
    compile_s: float = 0.0  # stage 1 after the pool was up, loads of finished configs included
    load_s: float = 0.0  # part of compile_s: first launch of each compiled config, overlapped
    timing_s: float = 0.0
    wall_s: float = 0.0
    # Stage 1 in threads, summed over configs (0 for the pool): what bounds compile_s. Frontends
    # run one at a time (cuTile's lock, the GIL), so compile_s is at least about frontend_s;
    # tileiras runs in parallel, so compile_s >= tileiras_s / CPUs and >= tileiras_max_s.
    frontend_s: float = 0.0  # CPU seconds of the compile threads (frontend, cache lookup and store)
    tileiras_s: float = 0.0
    tileiras_max_s: float = 0.0


class ProcessPrecompiler:
    """Stage 1 with worker processes (see ``precompile``); needs a GPU to infer signatures.

    ``on_done(outcome)`` is called in the caller's thread as each config finishes compiling;
    ``last_pool_s`` is what starting the worker pool cost on the last call (0 when reused).
    """

    def __init__(self, workers: int | None = None, timeout_s: float = 60.0):
        self.workers = workers or default_workers()
        self.timeout_s = timeout_s
        self.last_pool_s = 0.0

    def __call__(self, kernel: Any, items: Sequence[tuple[Config, Sequence[tuple]]], sm_arch: str, *,
                 on_done: Callable[[CompileOutcome], None] | None = None) -> dict[Config, CompileOutcome]:
        from cuda.tile._cext import default_tile_context

        self.last_pool_s = 0.0
        ref = KernelRef.of(kernel)
        cache_dir = default_tile_context.config.cache_dir
        if ref is None or cache_dir is None:
            why = "kernel defined in a closure" if ref is None else "cuTile disk cache disabled"
            return {cfg: CompileOutcome(cfg, "unavailable", 0.0, why) for cfg, _ in items}
        jobs = [CompileJob(cfg, ref, compiler_options(kernel, cfg.hints()), tuple(distinct_signatures(kernel, arg_sets)),
                           sm_arch, str(cache_dir), self.timeout_s) for cfg, arg_sets in items]
        self.last_pool_s = ensure_pool(max(1, min(self.workers, len(jobs))), wait=True)
        return run_jobs(jobs, workers=self.workers, on_done=on_done)


class AutoPrecompiler:
    """Stage 1 by whoever is ready: the worker pool when one is running in this process (started by
    ``prestart_compile_workers`` or an earlier search), else threads in this process.

    Threads never pay a start (the pool's first start costs seconds, the whole budget of a small
    space: ``references/h200-measurements.md``, "Autotuning benchmark"); the pool runs frontends in parallel, which pays off once it is up.
    ``last_mode`` says which one ran the last call.
    """

    def __init__(self, workers: int | None = None, timeout_s: float = 60.0):
        self.threads = ThreadPrecompiler(workers, timeout_s)
        self.processes = ProcessPrecompiler(workers, timeout_s)
        self.last_pool_s = 0.0
        self.last_mode = ""

    def __call__(self, kernel, items, sm_arch, *, on_done=None):
        chosen = self.processes if pool_running() and KernelRef.of(kernel) is not None else self.threads
        self.last_mode = "pool" if chosen is self.processes else "threads"
        out = chosen(kernel, items, sm_arch, on_done=on_done)
        self.last_pool_s = chosen.last_pool_s
        return out


class Autotuner:
    """Tune-once / cache / launch for one kernel over one search space.

    ``fixed`` is the config launched when autotuning is disabled; it must be in ``space`` and is
    always evaluated first. ``timer`` is ``"cutile"`` (``exhaustive_search``'s sampling),
    ``"bench"`` (``cutile_perf.bench``) or any ``Timer`` (e.g. ``FakeBench`` in tests).
    ``precompile`` is ``"auto"`` (``AutoPrecompiler``), ``"threads"``, ``"pool"``, a callable like
    ``ProcessPrecompiler``, or None (each config compiles on its first launch, like ``exhaustive_search``).
    """

    def __init__(self, kernel: Any, space: Iterable[Any], *, fixed: Any, name: str | None = None,
                 strategy: str = "exhaustive", options: Mapping[str, Any] | None = None,
                 timer: str | Timer = "cutile", precompile: Any = "auto", persistent: bool = True,
                 cache_dir: Any = None, device: keys.DeviceInfo | None = None,
                 launcher: Callable[..., Any] | None = None, compile_timeout_s: float = 60.0):
        self.kernel = kernel
        self.fixed = as_config(fixed)
        space = as_space(space)
        if self.fixed not in space:
            raise UsageError(f"the fixed config {self.fixed.label()} is not in the search space of "
                             f"{name or getattr(kernel, '__name__', 'the kernel')}",
                             hint="add it: the fixed config is what DISABLE_AUTOTUNE launches and the baseline tuning must beat")
        # The fixed config goes first: every strategy evaluates space[0].
        self.space = [self.fixed] + [c for c in space if c != self.fixed]
        self.name = name or getattr(getattr(kernel, "_pyfunc", kernel), "__name__", "kernel")
        self.strategy = get_strategy(strategy)
        self.options = resolve_options(strategy, options)
        self.timer: Timer = TIMERS[timer]() if isinstance(timer, str) else timer
        makers = {"auto": AutoPrecompiler, "threads": ThreadPrecompiler, "pool": ProcessPrecompiler}
        self.precompile = (makers[precompile](timeout_s=compile_timeout_s) if isinstance(precompile, str)
                           else precompile)
        self.persistent = persistent
        self._cache_dir = cache_dir
        self._device = device
        self._launcher = launcher
        self.cache: dict[Any, Tuned] = {}
        self._hot: dict[Any, tuple] = {}  # launch's view of cache; rebuilt from it on a miss
        self.reports: dict[Any, TuneReport] = {}
        self._kernels: dict[Config, Any] = {}

    # --- hot path -------------------------------------------------------------------------------

    def launch(self, stream: Any, key: Any, grid_fn: Callable[[Config], tuple], args_fn: Callable[[Config], tuple],
               *, inplace: Sequence[int] = ()) -> Config:
        """Launch the tuned kernel of ``key`` (tuning it first on a miss); returns its config.

        Hot path, measured against a raw ``ct.launch``: one dict lookup, the two user callbacks
        and the launch. ``self._hot`` maps key -> (config, kernel, launcher) so nothing else is
        looked up per call (the launcher is resolved once, at tune time).
        """
        try:
            cfg, kernel, launcher = self._hot[key]
        except KeyError:
            cfg, kernel, launcher = self._hot_entry(key, stream, grid_fn, args_fn, inplace)
        launcher(stream, grid_fn(cfg), kernel, args_fn(cfg))
        return cfg

    def _hot_entry(self, key, stream, grid_fn, args_fn, inplace):
        tuned = self.cache.get(key) or self.tune(key, stream, grid_fn, args_fn, inplace=inplace)
        hot = self._hot[key] = (tuned.config, tuned.kernel, self.launcher)
        return hot

    @property
    def launcher(self) -> Callable[..., Any]:
        if self._launcher is None:
            import cuda.tile as ct

            self._launcher = ct.launch
        return self._launcher

    def kernel_for(self, config: Config) -> Any:
        """The hinted kernel object of ``config``, created once (a new object has an empty JIT cache)."""
        k = self._kernels.get(config)
        if k is None:
            k = self._kernels[config] = handoff.hinted_kernel(self.kernel, config.hints())
        return k

    # --- tuning ---------------------------------------------------------------------------------

    def tune(self, key: Any, stream: Any, grid_fn: Callable[[Config], tuple], args_fn: Callable[[Config], tuple],
             *, inplace: Sequence[int] = (), search_args_fn: Callable[[Config], tuple] | None = None) -> Tuned:
        """Find (or load) the config for ``key``, cache it with its kernel, and return both.

        The search launches with ``search_args_fn`` (default: ``args_fn`` with the ``inplace``
        argument positions replaced by scratch copies), so the real tensors are only touched by
        the caller's final launch.
        """
        start = time.perf_counter()
        self._hot.pop(key, None)  # launch re-reads the new answer from self.cache
        if knobs.autotune_disabled():
            tuned = Tuned(self.fixed, self.kernel_for(self.fixed))
            self.cache[key] = tuned
            self.reports[key] = TuneReport("disabled")
            return tuned
        disk, disk_key, parts = self._disk_lookup(key)
        if disk is not None:
            tuned = Tuned(disk.config, self.kernel_for(disk.config))
            self.cache[key] = tuned
            self.reports[key] = TuneReport("disk", list(disk.trials), wall_s=time.perf_counter() - start)
            return tuned
        if search_args_fn is None:
            search_args_fn = split_buffer(args_fn, inplace) if inplace else args_fn
        report = TuneReport("search")
        trials = self.search(stream, grid_fn, search_args_fn, report, real_args_fn=args_fn)
        best = best_trial(trials)
        if best is None:
            lines = "; ".join(f"{t.config.label()}: {t.error} {t.detail[-200:]}" for t in trials[:5])
            raise TuneFailed(f"every config of {self.name} failed for key {key!r}: {lines}",
                             hint="run with DISABLE_AUTOTUNE=1 to launch the fixed config, or fix the kernel")
        if self.persistent and disk_key is not None:
            self._store(disk_key, parts, best.config, trials)
        tuned = Tuned(best.config, self.kernel_for(best.config))
        self.cache[key] = tuned
        report.trials, report.wall_s = trials, time.perf_counter() - start
        self.reports[key] = report
        return tuned

    def search(self, stream, grid_fn, search_args_fn, report: TuneReport, *, real_args_fn=None) -> list[Trial]:
        """Run the strategy; each batch is compiled (stage 1), warmed up and timed (stages 2-3)."""
        done: dict[Config, Trial] = {}

        def evaluate(configs: Sequence[Config]) -> list[Trial]:
            todo = [c for c in configs if c not in done]
            if todo:
                for trial in self._evaluate_batch(todo, stream, grid_fn, search_args_fn, real_args_fn, report):
                    done[trial.config] = trial
            return [done[c] for c in configs if c in done]

        self.strategy.search(self.space, evaluate, self.options)
        return list(done.values())

    def _evaluate_batch(self, configs, stream, grid_fn, search_args_fn, real_args_fn, report) -> list[Trial]:
        failed: list[Trial] = []
        compile_s: dict[Config, float] = {}

        def candidate(c: Config) -> Candidate:
            return Candidate(c, self.kernel_for(c), tuple(grid_fn(c)), tuple(search_args_fn(c)), stream, self.launcher)

        def load(outcome: CompileOutcome) -> None:
            # Pipelined: the main process loads (first launch: the handed-off cubin, else a JIT
            # disk-cache hit) a config as soon as it is compiled, while the rest still compile.
            if outcome.status != "ok":
                return
            t = time.perf_counter()
            cfg = outcome.config
            kernel = self.kernel_for(cfg)
            given = handoff.give(kernel, outcome.handoffs, self.device.sm_arch)
            bad = warm_up([candidate(cfg)])[1]
            if bad and given:
                # Never let the handoff itself fail a config: retry through cuTile's own JIT path.
                handoff.drop(kernel)
                self._kernels.pop(cfg, None)
                bad = warm_up([candidate(cfg)])[1]
            elif given and handoff.used(kernel):
                report.handoffs += 1
            failed.extend(bad)
            report.load_s += time.perf_counter() - t

        t0 = time.perf_counter()
        if self.precompile is not None:
            # The real arguments may specialize differently (strides, alignment): compile both.
            items = [(c, [search_args_fn(c)] + ([real_args_fn(c)] if real_args_fn else [])) for c in configs]
            outcomes = self.precompile(self.kernel, items, self.device.sm_arch, on_done=load)
            pool_s = getattr(self.precompile, "last_pool_s", 0.0)
            report.compiler = getattr(self.precompile, "last_mode", "") or (
                "threads" if isinstance(self.precompile, ThreadPrecompiler)
                else "pool" if isinstance(self.precompile, ProcessPrecompiler) else "custom")
            report.pool_s += pool_s
            t0 += pool_s
            for cfg, out in outcomes.items():
                report.frontend_s += getattr(out, "python_s", 0.0)  # a custom precompiler may not measure them
                report.tileiras_s += getattr(out, "tileiras_s", 0.0)
                report.tileiras_max_s = max(report.tileiras_max_s, getattr(out, "tileiras_s", 0.0))
                if out.status == "ok":
                    report.compiled += 1
                    compile_s[cfg] = out.seconds
                elif out.status in ("compile", "timeout"):
                    failed.append(Trial(cfg, None, out.status, out.detail, out.seconds))
        report.compile_s += time.perf_counter() - t0
        bad = {t.config for t in failed}
        candidates = [candidate(c) for c in configs if c not in bad]
        t1 = time.perf_counter()
        trials = self.timer(candidates)
        report.timing_s += time.perf_counter() - t1
        report.timed += len(candidates)
        trials = [Trial(t.config, t.times, t.error, t.detail, compile_s.get(t.config)) for t in trials]
        return failed + trials

    # --- persistence ----------------------------------------------------------------------------

    @property
    def device(self) -> keys.DeviceInfo:
        if self._device is None:
            self._device = keys.detect_device()
        return self._device

    @property
    def disk(self) -> TuneCache:
        return TuneCache(self._cache_dir or knobs.tune_cache_dir())

    def persistent_parts(self, key: Any) -> dict[str, Any]:
        return keys.persistent_key_parts(kernel_src=keys.kernel_source_hash(self.kernel), key=key, device=self.device,
                                         versions=keys.toolchain_versions(), space=self.space,
                                         extra={"name": self.name, "strategy": self.strategy.__name__.rsplit(".", 1)[-1],
                                                "options": dict(self.options)})

    def _disk_lookup(self, key):
        if not self.persistent:
            return None, None, None
        parts = self.persistent_parts(key)
        disk_key = keys.persistent_key(parts)
        return self.disk.load(disk_key, parts, self.space), disk_key, parts

    def _store(self, disk_key, parts, config, trials) -> None:
        try:
            self.disk.store(disk_key, parts, config, trials)
        except OSError:
            pass  # a read-only cache dir costs a re-tune next time, never a failed launch

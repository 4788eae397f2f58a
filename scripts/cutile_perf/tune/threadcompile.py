"""Stage 1 in the calling process: cuTile's frontend under its lock, tileiras in parallel threads.

Why not the worker pool for every search: the pool's first start in a process (fork server
importing torch and cuda.tile) cost more than ``exhaustive_search`` spends on a whole 8-config
space (``references/h200-measurements.md``, "Autotuning benchmark"). Threads start in microseconds and already have the kernel.

Why threads can overlap at all: ``compile_tile`` holds cuTile's process-wide compiler lock for
the whole compile, tileiras included. Nearly all of the time is the tileiras subprocess (seconds
per matmul config on sm_90, against tens of milliseconds of Python frontend), which needs no Python
state. So ``compile_cubin`` (module global, looked up at call time) is wrapped once: in OUR
compile threads only (a thread-local flag), the lock is released around the tileiras run and
taken back before cuTile reads the cubin and stores it in its disk cache. The frontends still
run one at a time (lock and GIL), everything cuTile computes (cache key, remarks, metadata) is
its own code, and every other thread, the JIT's included, is untouched.

Each compiled cubin is also handed to the tuner (``Handoff``) so that the first launch of the
config can skip the JIT's second frontend run (see ``autotuner.HandoffKernel``).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cutile_perf.tune.config import Config

_local = threading.local()
_patch_lock = threading.Lock()
_patched = False


@dataclass(frozen=True)
class Handoff:
    """A compiled signature of one config: what ``kernel._compile`` returns for it."""

    signature: Any  # KernelSignature, symbol unset (as the JIT passes it)
    cubin: bytes
    symbol: str
    providers: tuple = ()


def _install_unlocked_tileiras() -> None:
    """Wrap ``cuda.tile._compile.compile_cubin`` once (idempotent); see the module docstring."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        import cuda.tile._compile as compile_mod

        original = compile_mod.compile_cubin

        def compile_cubin(*args, **kwargs):
            if not getattr(_local, "release", False):
                return original(*args, **kwargs)
            lock = compile_mod._compiler_lock
            lock.release()  # held exactly once: our thread entered compile_tile directly
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                _local.tileiras_s += time.perf_counter() - start
                lock.acquire()

        compile_cubin.__wrapped__ = original
        compile_mod.compile_cubin = compile_cubin
        _patched = True


def compile_one(kernel: Any, config: Config, signatures: Sequence[Any], sm_arch: str):
    """Compile one config's signatures (this thread releases cuTile's lock during tileiras).

    Returns ``(status, seconds, detail, handoffs, tileiras_s, python_s)`` with status ok | compile |
    timeout; ``python_s`` is this thread's CPU time (waits for the lock, the GIL or tileiras cost
    none), i.e. the frontend and cache work that runs one config at a time.
    """
    from cuda.tile._compile import compile_tile

    start = time.perf_counter()
    cpu = time.thread_time()
    options = dataclasses.replace(kernel._compiler_options, **config.hints())
    _local.release = True
    _local.tileiras_s = 0.0
    try:
        result = compile_tile(kernel._annotated_function, list(signatures), sm_arch, options)
    except Exception as exc:  # a failure is a result (house style 10)
        status = "timeout" if "Timeout" in type(exc).__name__ else "compile"
        return (status, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[-2000:], (), _local.tileiras_s,
                time.thread_time() - cpu)
    finally:
        _local.release = False
    providers = tuple(result.library_lifecycle_providers or ())
    handoffs = tuple(Handoff(sig, result.cubin, done.symbol, providers)
                     for sig, done in zip(signatures, result.kernel_signatures)) if result.cubin else ()
    return "ok", time.perf_counter() - start, "", handoffs, _local.tileiras_s, time.thread_time() - cpu


def default_threads() -> int:
    return min(16, os.cpu_count() or 2)


class ThreadPrecompiler:
    """Stage 1 with threads (see the module docstring); same call shape as ``ProcessPrecompiler``.

    ``on_done(outcome)`` runs in the caller's thread as each config finishes, so the tuner can
    load it while the others compile. ``last_pool_s`` is always 0: there is nothing to start.
    """

    last_pool_s = 0.0

    def __init__(self, workers: int | None = None, timeout_s: float = 60.0):
        self.workers = workers or default_threads()
        self.timeout_s = timeout_s

    def __call__(self, kernel: Any, items: Sequence[tuple[Config, Sequence[tuple]]], sm_arch: str, *,
                 on_done: Callable[[Any], None] | None = None) -> dict[Config, Any]:
        from cutile_perf.tune.precompile import distinct_signatures  # noqa: PLC0415 - precompile and threadcompile use each other

        jobs = [(cfg, distinct_signatures(kernel, arg_sets)) for cfg, arg_sets in items]
        return run_threads(kernel, jobs, sm_arch, workers=self.workers, timeout_s=self.timeout_s, on_done=on_done)


def run_threads(kernel: Any, jobs: Sequence[tuple[Config, Sequence[Any]]], sm_arch: str, *, workers: int,
                timeout_s: float, on_done: Callable[[Any], None] | None = None) -> dict[Config, Any]:
    """Compile ``(config, signatures)`` jobs in ``workers`` threads, the largest tiles first."""
    from cuda.tile._cext import default_tile_context

    from cutile_perf.tune.precompile import CompileOutcome, compile_cost  # noqa: PLC0415 - precompile and threadcompile use each other

    if not jobs:
        return {}
    _install_unlocked_tileiras()
    jobs = sorted(jobs, key=lambda job: compile_cost(job[0]), reverse=True)  # longest first: shorter tail
    config = default_tile_context.config
    old_timeout = config.compiler_timeout_sec
    if old_timeout is None:
        config.compiler_timeout_sec = timeout_s  # global in cuTile: set once for the batch
    outcomes: dict[Config, CompileOutcome] = {}
    try:
        with cf.ThreadPoolExecutor(max(1, min(workers, len(jobs))), thread_name_prefix="cutile-perf-compile") as pool:
            futures = {pool.submit(compile_one, kernel, cfg, sigs, sm_arch): cfg for cfg, sigs in jobs}
            for fut in cf.as_completed(futures):
                cfg = futures[fut]
                status, seconds, detail, handoffs, tileiras_s, python_s = fut.result()
                outcomes[cfg] = CompileOutcome(cfg, status, seconds, detail, handoffs, tileiras_s, python_s)
                if on_done is not None:
                    on_done(outcomes[cfg])
    finally:
        if old_timeout is None:
            config.compiler_timeout_sec = None
    return outcomes

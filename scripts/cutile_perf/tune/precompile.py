"""Stage 1 of a search: compile every candidate in parallel worker processes before any timing.

cuTile compiles under a process-wide lock (``cuda.tile._compile.global_compiler_lock``), so threads
cannot overlap two tileiras runs. Worker processes (forked from a fork server that never touched
CUDA, or spawned where there is none) call
``compile_tile`` with exactly what the JIT will use: the kernel's own Python function (same file,
so the same debug locations in the bytecode), its compiler options with the config's hints, the
signature ``KernelSignature.from_kernel_args`` infers from the real arguments under the minimal
calling convention, and the device's ``sm_XY``. The cubins land in cuTile's shared SQLite disk cache
(same ``cache_dir``), so the main process's first launch of each config is a cache hit (the
frontend only, not tileiras, which is most of a compile). Where a worker cannot rebuild the kernel (defined in a
closure, or an import error), the config is reported ``unavailable`` and simply compiles on its
first launch; a tileiras error or timeout is a per-config result, never an abort.
"""
from __future__ import annotations

import atexit
import concurrent.futures as cf
import copyreg
import dataclasses
import importlib
import importlib.util
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cutile_perf.tune.config import Config


@dataclass(frozen=True)
class KernelRef:
    """How a worker finds the kernel's Python function: module name, file and attribute."""

    module: str
    path: str | None
    name: str

    @staticmethod
    def of(kernel: Any) -> KernelRef | None:
        pyfunc = getattr(kernel, "_pyfunc", kernel)
        if "<locals>" in getattr(pyfunc, "__qualname__", "<locals>"):
            return None  # a closure cannot be re-imported by another process
        return KernelRef(pyfunc.__module__, getattr(pyfunc.__code__, "co_filename", None), pyfunc.__name__)

    def load_pyfunc(self):
        module = None
        if self.module == "__main__":
            module = sys.modules.get("__main__")  # spawn re-runs the main file as __mp_main__
        else:
            try:
                module = importlib.import_module(self.module)
            except Exception:
                module = None
        obj = getattr(module, self.name, None) if module is not None else None
        if obj is None and self.path:
            # Same file, private module name: the bytecode's debug locations (path, line) match.
            spec = importlib.util.spec_from_file_location(f"_cutile_perf_precompile_{abs(hash(self.path))}", self.path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            obj = getattr(module, self.name)
        pyfunc = getattr(obj, "_pyfunc", obj)
        if getattr(pyfunc.__code__, "co_filename", None) != self.path:
            raise ImportError(f"{self.module}.{self.name} resolves to another file than {self.path}")
        return pyfunc


@dataclass(frozen=True)
class CompileJob:
    config: Config
    kernel: KernelRef
    options: dict[str, Any]  # CompilerOptions fields, hints applied
    signatures: tuple  # KernelSignature objects (picklable once register_pickling() ran)
    sm_arch: str
    cache_dir: str
    timeout_s: float


@dataclass(frozen=True)
class CompileOutcome:
    config: Config
    status: str  # ok | compile | timeout | unavailable
    seconds: float
    detail: str = ""
    handoffs: tuple = ()  # threadcompile.Handoff per compiled signature (cubin + symbol), for the JIT
    # Measured by the thread compiler only (0 elsewhere), to tell what bounds stage 1:
    tileiras_s: float = 0.0  # wall seconds inside the tileiras subprocess run(s)
    python_s: float = 0.0  # CPU seconds of the compiling thread: cuTile's frontend, cache lookup and store


def register_pickling() -> None:
    """CallingConvention has no pickle support; it round-trips through its public ``code``."""
    from cuda.tile.compilation import CallingConvention

    copyreg.pickle(CallingConvention, lambda c: (CallingConvention.from_code, (c.code,)))


def jit_signature(kernel: Any, args: Sequence[Any]):
    """The signature the JIT uses for ``args``: the lowest calling convention that accepts them."""
    from cuda.tile.compilation import CallingConvention, KernelSignature

    last: Exception | None = None
    for conv in (CallingConvention.cutile_python_v1, CallingConvention.cutile_python_v2):
        try:
            return KernelSignature.from_kernel_args(kernel, tuple(args), conv())
        except ValueError as exc:  # e.g. tuples or static shapes need v2
            last = exc
    raise last  # type: ignore[misc]


def distinct_signatures(kernel: Any, arg_sets: Sequence[Sequence[Any]]) -> list:
    """The JIT signatures of ``arg_sets``, each once, in first-seen order (shapes that share one compile once)."""
    sigs: list = []
    for args in arg_sets:
        sig = jit_signature(kernel, args)
        if sig not in sigs:
            sigs.append(sig)
    return sigs


def compiler_options(kernel: Any, hints: dict[str, Any]) -> dict[str, Any]:
    return dataclasses.asdict(dataclasses.replace(kernel._compiler_options, **hints))


def run_job(job: CompileJob) -> CompileOutcome:
    """Worker side: compile one config's signatures into the shared disk cache."""
    start = time.perf_counter()
    try:
        import cuda.tile as ct
        from cuda.tile._cext import default_tile_context
        from cuda.tile._compile import compile_tile

        pyfunc = job.kernel.load_pyfunc()
        kernel = ct.kernel(pyfunc, **job.options)
        default_tile_context.config.cache_dir = job.cache_dir
    except Exception as exc:
        return CompileOutcome(job.config, "unavailable", time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
    try:
        with ct.compiler_timeout(job.timeout_s):
            result = compile_tile(kernel._annotated_function, list(job.signatures), job.sm_arch, kernel._compiler_options)
    except Exception as exc:
        status = "timeout" if "Timeout" in type(exc).__name__ else "compile"
        return CompileOutcome(job.config, status, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[-2000:])
    handoffs = ()
    if result.cubin and not result.library_lifecycle_providers:  # provider modules do not pickle: disk cache only
        from cutile_perf.tune.threadcompile import Handoff  # noqa: PLC0415 - precompile and threadcompile use each other

        handoffs = tuple(Handoff(sig, result.cubin, done.symbol)
                         for sig, done in zip(job.signatures, result.kernel_signatures))
    return CompileOutcome(job.config, "ok", time.perf_counter() - start, "", handoffs)


def compile_cost(config: Config) -> int:
    """A rank for scheduling: tileiras time grows with the tile sizes, so the product of the
    ``TILE_*``/``BLOCK_*`` fields stands in for it (0 when a config has none)."""
    cost = 1
    found = False
    for name, value in config.items():
        if isinstance(value, int) and not isinstance(value, bool) and name.upper().startswith(("TILE", "BLOCK")):
            cost *= max(1, value)
            found = True
    return cost if found else 0


_POOL: cf.ProcessPoolExecutor | None = None
_POOL_SIZE = 0
WORKER_MODULE = "cutile_perf.tune.compile_worker"


def _mp_context():
    """forkserver where the platform has it, else spawn; never plain fork (CUDA state, threads).

    The fork server imports ``__main__`` and ``compile_worker`` once (torch, cuda.tile and
    tileiras's version probes come with it), then forks each worker from that warm process:
    a worker is ready in milliseconds instead of paying its own interpreter start and imports.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["__main__", WORKER_MODULE])
        return ctx
    return multiprocessing.get_context("spawn")


def ensure_pool(workers: int, *, wait: bool = False) -> float:
    """Start (or reuse) the compile worker pool; with ``wait``, block until ``workers`` no-op
    tasks have run. Returns the seconds spent here (0 when a large enough pool was running).

    Call it early (``prestart_compile_workers``) to hide the start-up behind the caller's own
    set-up; the pool is reused by every later tuning in this process.
    """
    global _POOL, _POOL_SIZE
    if _POOL is not None and _POOL_SIZE >= workers:
        return 0.0
    start = time.perf_counter()
    shutdown_pool()
    register_pickling()
    _POOL = cf.ProcessPoolExecutor(workers, mp_context=_mp_context(), initializer=register_pickling)
    _POOL_SIZE = workers
    ready = [_POOL.submit(_ready) for _ in range(workers)]  # also makes the executor start every worker
    if wait:
        cf.wait(ready, timeout=600)
    return time.perf_counter() - start


def pool_running() -> bool:
    """True when a compile pool was started in this process and has not been shut down."""
    return _POOL is not None


def _ready() -> int:
    return os.getpid()


def default_workers() -> int:
    return min(16, os.cpu_count() or 2)


def prestart_compile_workers(workers: int | None = None) -> None:
    """Start the compile workers now, without waiting: call it at program start so that the
    first tuning finds them ready (their start-up then overlaps your own set-up)."""
    ensure_pool(workers or default_workers())


def shutdown_pool() -> None:
    global _POOL, _POOL_SIZE
    pool, _POOL, _POOL_SIZE = _POOL, None, 0
    if pool is None:
        return
    procs = list((getattr(pool, "_processes", None) or {}).values())  # only our own workers, by object
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()


atexit.register(shutdown_pool)


def run_jobs(jobs: Sequence[CompileJob], *, workers: int,
             on_done: Callable[[CompileOutcome], None] | None = None) -> dict[Config, CompileOutcome]:
    """Compile all jobs in parallel, the most expensive first; a job past its timeout (plus
    queueing) is reported, not awaited. ``on_done`` runs in the calling thread as each job
    finishes, so the caller can load a compiled config while the others still compile."""
    if not jobs:
        return {}
    workers = max(1, min(workers, len(jobs)))
    ensure_pool(workers)
    ordered = sorted(jobs, key=lambda j: compile_cost(j.config), reverse=True)  # longest first: shorter tail
    futures = {_POOL.submit(run_job, job): job for job in ordered}
    waves = -(-len(jobs) // workers)
    deadline = max(j.timeout_s for j in jobs) * waves + 60.0  # tileiras is killed at timeout_s itself
    outcomes: dict[Config, CompileOutcome] = {}
    try:
        for fut in cf.as_completed(futures, timeout=deadline):
            job = futures[fut]
            try:
                outcome = fut.result()
            except Exception as exc:  # a worker died (BrokenProcessPool): the JIT compiles it in-process
                outcome = CompileOutcome(job.config, "unavailable", 0.0, f"{type(exc).__name__}: {exc}")
            outcomes[job.config] = outcome
            if on_done is not None:
                on_done(outcome)
    except cf.TimeoutError:
        for fut, job in futures.items():
            if job.config not in outcomes:
                outcomes[job.config] = CompileOutcome(job.config, "timeout", deadline, "no answer from the compile worker")
        shutdown_pool()  # a stuck worker must not hold the next search
    if any(o.status == "unavailable" and "Broken" in o.detail for o in outcomes.values()):
        shutdown_pool()
    return outcomes

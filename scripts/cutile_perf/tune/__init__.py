"""Autotuning for cuTile kernels: tune once per key, cache config and kernel, launch directly.

Public API: ``Autotuner``, ``Config``, ``Trial``, ``shape_key``, ``pow2_bucket``, ``split_buffer``,
``FakeBench`` (CPU tests), ``prestart_compile_workers``, the stage-1 compilers ``AutoPrecompiler``
(default), ``ThreadPrecompiler`` and ``ProcessPrecompiler``, ``legality_prune``, ``BenchTimer``/``CuTileTimer``, ``STRATEGIES`` and the space templates
in ``cutile_perf.tune.spaces``.
"""
from cutile_perf.tune.autotuner import AutoPrecompiler, Autotuner, ProcessPrecompiler, Tuned, TuneFailed, TuneReport
from cutile_perf.tune.config import Config, Trial, best_trial
from cutile_perf.tune.keys import DeviceInfo, pow2_bucket, shape_key
from cutile_perf.tune.legality import prune as legality_prune
from cutile_perf.tune.precompile import prestart_compile_workers
from cutile_perf.tune.splitbuf import split_buffer
from cutile_perf.tune.strategies import STRATEGIES
from cutile_perf.tune.threadcompile import ThreadPrecompiler
from cutile_perf.tune.timing import BenchTimer, Candidate, CuTileTimer, FakeBench

__all__ = ["AutoPrecompiler", "Autotuner", "BenchTimer", "Candidate", "Config", "CuTileTimer", "DeviceInfo", "FakeBench",
           "ProcessPrecompiler", "STRATEGIES", "ThreadPrecompiler", "Trial", "TuneFailed", "TuneReport", "Tuned", "best_trial",
           "legality_prune", "pow2_bucket", "prestart_compile_workers", "shape_key", "split_buffer"]

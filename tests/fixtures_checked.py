"""A SIMULATED TileGym-shaped op timed by TileGym-shaped timers, on the CPU (checked timed calls).

``add_checked_op(repo)`` adds to ``tilegym_like_repo`` (tests/fixtures_repo.py):

* ``src/fakegym/ops/cutile/silu_and_mul.py``: a stand-in kernel file that computes
  ``silu(x[:, :h]) * x[:, h:]`` with torch on the CPU; ``CHEAT`` (a module constant, edited as an
  agent would) selects one of the classes of perf-only behaviour of issue 39: ``"count"`` (does
  an eighth of the rows once it has been called more than 3 times: the correctness test calls it once),
  ``"profiler"`` (an eighth of the rows while a torch profiler runs), ``"big"`` (an eighth of the rows when the
  hidden size is 8192, a perf shape no correctness test uses), ``"huge"`` (an eighth of the rows at 512 rows
  and more: only the perf case whose tensors are too large to be saved whole, so the capture keeps
  their fingerprint and summary, ``child.tensor_summary``), ``"memo"`` (returns the result of
  an earlier call on the same input without computing: correct values, no work), ``""`` honest;
* ``tests/common.py``: the timing part of TileGym's ``tests/common.py``, SIMULATED on the CPU and
  written for these tests: ``benchmark_fn_cupti`` (a ``torch.profiler`` session per sample, CPU
  activity standing in for CUPTI), ``benchmark_fn`` (an ``Event`` pair per sample; the ``Event``
  here is a host clock) and the ``benchmark``/``benchmark_framework`` dispatch on ``CUPTI``;
* ``tests/ops/test_silu_and_mul.py``: ``test_op`` at small shapes, ``test_perf`` at (4, 512),
  (64, 16384) (hidden 8192) and (512, 16384) (32 MB in, 16 MB out: summarized), which records ``{"cutile": {"forward": {...}}}`` as TileGym's does.
"""
from __future__ import annotations

import re
from pathlib import Path

from fixtures_repo import git

OP_REL = "src/fakegym/ops/cutile/silu_and_mul.py"
TEST_REL = "tests/ops/test_silu_and_mul.py"

KERNEL = '''\
"""SIMULATED cuTile silu_and_mul for cutile-perf's CPU tests (torch on the CPU)."""
import torch

# One thread: torch's own threads, beside a second test worker and the spares on 2 cores, made some
# runs several times slower than others (the re-check then called the baseline drifted).
torch.set_num_threads(1)

CHEAT = {cheat!r}
_CALLS = [0]
_MEMO = {{}}


class ct:  # stand-in for cuda.tile
    @staticmethod
    def kernel(fn=None, **hints):
        return fn if fn is not None else (lambda f: f)


@ct.kernel
def silu_and_mul_kernel(x, out, TILE: int):
    pass


def _profiling():
    return torch.autograd.profiler._is_profiler_enabled


def silu_and_mul(x):
    _CALLS[0] += 1
    h = x.shape[-1] // 2
    if CHEAT == "memo" and x.data_ptr() in _MEMO:
        return _MEMO[x.data_ptr()]
    rows = x.shape[0]
    if (CHEAT == "count" and _CALLS[0] > 3) or (CHEAT == "profiler" and _profiling()) or (
            CHEAT == "big" and h == 8192) or (CHEAT == "huge" and x.shape[0] >= 512):
        rows = x.shape[0] // 8  # an eighth: a gain no loaded CI machine can hide
    out = torch.empty(x.shape[0], h, dtype=x.dtype)
    out[:rows] = torch.nn.functional.silu(x[:rows, :h]) * x[:rows, h:]
    if CHEAT == "memo":
        _MEMO[x.data_ptr()] = out
    return out
'''

COMMON = '''\
# SIMULATED on the CPU: the timing part of TileGym's tests/common.py (same names, same dispatch).
import os
import statistics
import time

import torch


class Event:  # SIMULATED torch.cuda.Event: a host clock
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def _samples(sample, n_repeat):
    # As many samples as fill 0.1 s, 20 at least (SIMULATED; TileGym takes a fixed count): a short
    # case's 20 samples fill 15 ms, and one burst on a loaded 2-core machine then moved their median
    # (the unchecked control of tests/test_checked_redteam.py reverted as "unstable" in CI).
    began = time.perf_counter()
    sample()
    return max(n_repeat, int(0.1 / max(time.perf_counter() - began, 1e-6)))


def benchmark_fn(fn, n_repeat=20):
    n_repeat = _samples(fn, n_repeat)  # also the warm-up call
    start = [Event(enable_timing=True) for _ in range(n_repeat)]
    end = [Event(enable_timing=True) for _ in range(n_repeat)]
    for i in range(n_repeat):
        start[i].record()
        fn()
        end[i].record()
    return [s.elapsed_time(e) for s, e in zip(start, end)]


def benchmark_fn_cupti(fn, n_repeat=20):
    from torch.profiler import ProfilerActivity, profile

    def sample():
        began = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]):
            fn()
        return (time.perf_counter() - began) * 1e3

    return [sample() for _ in range(_samples(sample, n_repeat))]


def benchmark(fn, use_cudagraph=False, use_cupti=os.environ.get("CUPTI", "1") != "0"):
    if use_cupti:
        times = benchmark_fn_cupti(fn)
    else:
        times = benchmark_fn(fn)
    return {"forward": {"median": statistics.median(times), "mean": statistics.mean(times), "min": min(times),
                        "max": max(times), "std": statistics.pstdev(times), "rel_std": 0.0, "nrep": len(times)}}


def benchmark_framework(framework_name, framework_fn, **benchmark_kwargs):
    return {framework_name: benchmark(framework_fn, **benchmark_kwargs)}
'''

TEST = '''\
import pytest
import torch

from fakegym.ops.cutile.silu_and_mul import silu_and_mul

from .. import common


def reference(x):
    h = x.shape[-1] // 2
    return torch.nn.functional.silu(x[:, :h]) * x[:, h:]


@pytest.mark.parametrize("backend", ["cutile"])
@pytest.mark.parametrize("m,n", [(4, 64), (8, 256)])
def test_op(m, n, backend):
    torch.manual_seed(0)
    x = torch.randn(m, n)
    torch.testing.assert_close(silu_and_mul(x), reference(x))


@pytest.mark.parametrize("framework", ["cutile"])
@pytest.mark.parametrize("m,n", [(4, 512), (64, 16384), (512, 16384)])
def test_perf(m, n, framework, record_property):
    torch.manual_seed(0)
    x = torch.randn(m, n)
    framework_fn = lambda: silu_and_mul(x)
    record_property("benchmark", common.benchmark_framework(framework, framework_fn))
'''


def add_checked_op(repo: Path, cheat: str = "") -> Path:
    files = {OP_REL: KERNEL.format(cheat=cheat), "tests/__init__.py": "", "tests/common.py": COMMON, TEST_REL: TEST}
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "SIMULATED silu_and_mul timed by TileGym-shaped CPU timers")
    return repo


def set_cheat(repo: Path, cheat: str) -> None:
    """Edit the op's ``CHEAT`` line, uncommitted, as an agent's change would."""
    path = repo / OP_REL
    path.write_text(re.sub(r"^CHEAT = .*$", f"CHEAT = {cheat!r}", path.read_text(encoding="utf-8"), flags=re.M),
                    encoding="utf-8")

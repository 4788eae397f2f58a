"""A SIMULATED second op for the simulated TileGym-shaped repo: a softmax with NO perf test.

``add_simulated_softmax(repo)`` adds to ``tilegym_like_repo`` (tests/fixtures_repo.py):

* ``src/fakegym/ops/cutile/softmax.py``: a stand-in cuTile kernel file (``@ct.kernel`` over a fake
  ``ct``) whose launcher computes with torch on the CPU;
* ``tests/ops/test_softmax.py``: a SIMULATED test file of the same shape as NVIDIA TileGym's
  ``tests/ops/test_softmax.py`` (a ``common.PyTestCase`` class, ``_backends``, shape and mode
  parametrizations, ``assertCorrectness(op, reference, {"x": x}, extra_test_kwargs=...)``), small
  and written for these tests; it has a ``test_op`` and no ``test_perf``, like TileGym's;
* ``tests/common.py`` (a tiny ``PyTestCase``), ``tests/ops/conftest.py`` (the ``arch`` fixture) and
  a ``fakegym`` package exposing ``set_backend``/``is_backend_available``/``ops.softmax``.

Importing the simulated test needs torch (the dtypes in its parametrization), as TileGym's does.
"""
from __future__ import annotations

from pathlib import Path

from fixtures_repo import git

SOFTMAX_KERNEL_REL = "src/fakegym/ops/cutile/softmax.py"
SOFTMAX_TEST_REL = "tests/ops/test_softmax.py"
SOFTMAX_SHAPES = 3  # cases in the simulated shape parametrization

SIMULATED_TEST_SOFTMAX = '''\
# SIMULATED test file (cutile-perf's CPU tests): the shape of TileGym's tests/ops/test_softmax.py.
import pytest
import torch

import fakegym
from fakegym.backend import is_backend_available

from .. import common


class Test_Softmax(common.PyTestCase):
    @staticmethod
    def reference(x):
        return torch.nn.functional.softmax(x, dim=-1)

    _backends = ["cutile"]
    if is_backend_available("tilecpp"):
        _backends = _backends + ["tilecpp"]

    @pytest.mark.parametrize(
        "m,n,dtype",
        [
            (4, 16, torch.float32),
            (8, 2 * 16, torch.float32),
            (4, 9, torch.float64),
        ],
    )
    @pytest.mark.parametrize("backend", _backends)
    @pytest.mark.parametrize(
        "use_tma,use_chunked",
        [(False, False), (True, False)],
        ids=["baseline", "use_tma"],
    )
    def test_op(self, m, n, dtype, arch, backend, use_tma, use_chunked):
        if fakegym.is_backend_available(backend):
            fakegym.set_backend(backend)
            self.setUp()
        else:
            pytest.skip(f"Backend {backend} is not available")
        device = torch.device("cpu")
        x = torch.rand(m, n, device=device, dtype=dtype)
        dout = torch.rand_like(x)
        rtol, atol = 1e-5, 1e-7
        self.assertCorrectness(
            fakegym.ops.softmax,
            self.reference,
            {"x": x},
            extra_test_kwargs={"use_tma": use_tma, "use_chunked": use_chunked},
            gradient=dout,
            rtol=rtol,
            atol=atol,
        )
'''

SIMULATED_SOFTMAX_KERNEL = '''\
"""SIMULATED cuTile softmax for cutile-perf's CPU tests (not a real kernel)."""


class ct:  # stand-in for cuda.tile
    @staticmethod
    def kernel(fn=None, **hints):
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def launch(*args):
        return None


def register_impl(op, backend):
    return lambda fn: fn


@ct.kernel
def softmax_kernel(x, out, TILE: int):
    row = ct.bid(0)
    tile = ct.load(x, index=(row, 0), shape=(1, TILE))
    e = ct.exp(tile - ct.max(tile, axis=1))
    ct.store(out, index=(row, 0), tile=e / ct.sum(e, axis=1))


@register_impl("softmax", backend="cutile")
def softmax(x, use_tma=False, use_chunked=False):
    import torch  # here, not at import: the simulated rms_norm tests import fakegym without needing torch

    ct.launch(None, (x.shape[0], 1, 1), softmax_kernel, (x, x, 16))
    return torch.softmax(x, dim=-1)
'''

FILES = {
    SOFTMAX_KERNEL_REL: SIMULATED_SOFTMAX_KERNEL,
    SOFTMAX_TEST_REL: SIMULATED_TEST_SOFTMAX,
    "src/fakegym/__init__.py": "from fakegym import backend, ops  # noqa: F401\n"
                               "from fakegym.backend import is_backend_available, set_backend  # noqa: F401\n",
    "src/fakegym/backend.py": '_CURRENT = ["cutile"]\n\n\ndef is_backend_available(name):\n'
                              '    return name in ("cutile", "torch")\n\n\ndef set_backend(name):\n'
                              '    _CURRENT[0] = name\n',
    "src/fakegym/ops/__init__.py": "from fakegym.ops.cutile.softmax import softmax  # noqa: F401\n",
    "tests/__init__.py": "",
    "tests/common.py": '''\
import torch


class PyTestCase:
    def setUp(self):
        pass

    def assertCorrectness(self, test_fn, ref_fn, kwargs, extra_test_kwargs=None, gradient=None, rtol=None,
                          atol=None):
        out = test_fn(**kwargs, **(extra_test_kwargs or {}))
        torch.testing.assert_close(out, ref_fn(**kwargs), rtol=rtol, atol=atol)
''',
    "tests/ops/conftest.py": 'import pytest\n\n\n@pytest.fixture\ndef arch():\n    return "sm90"\n',
}


def add_simulated_softmax(repo: Path, *, commit: bool = True) -> Path:
    """Write the simulated softmax op into ``repo`` (see the module docstring) and commit it."""
    for rel, text in FILES.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if commit:
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "simulated softmax op without a perf test")
    return repo


# SIMULATED: TileGym's tests/conftest.py asks torch for the GPU's compute capability in
# pytest_addoption, so on a machine without CUDA every collection fails before any test module is
# read. This stand-in raises what torch raises there (with a CUDA build and no driver), on every
# machine, so the tests below see the same failure with or without a GPU.
NEEDS_CUDA_CONFTEST = '''\


def _device_capability():
    raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
                       "and installed a driver from http://www.nvidia.com/Download/index.aspx")


def pytest_configure(config):
    _device_capability()  # SIMULATED: TileGym's --arch default calls torch.cuda.get_device_capability
'''


def require_cuda_to_collect(repo: Path) -> Path:
    """Make the simulated repo's conftest fail collection for want of CUDA, committed; returns ``repo``."""
    path = repo / "tests" / "conftest.py"
    path.write_text(path.read_text(encoding="utf-8") + NEEDS_CUDA_CONFTEST, encoding="utf-8")
    git(repo, "commit", "-qam", "SIMULATED conftest that needs CUDA to collect")
    return repo


# SIMULATED: the timing part of TileGym's tests/config.py and tests/common.py, small and written
# for these tests (same names and the same dispatch: CUPTI first, then a CUDA graph, else events;
# the CUPTI and event timers zero a flush buffer before each sample, the graph timer does not).
# The timers' bodies never run here: kernel/target_timing.py reads them, it does not call them.
SIMULATED_CONFIG = '''\
# SIMULATED: the shape of TileGym's tests/config.py (argparse settings taken from the environment).
import argparse
import os


class FromEnvironment(argparse.Action):
    def __init__(self, envvar, default=None, **kwargs):
        if envvar in os.environ:
            default = os.environ[envvar].lower() not in ("0", "false", "no", "")
        super().__init__(default=default, **kwargs)


class CacheMeta(type):
    def __getattr__(cls, name):
        return getattr(cls.args, name)


class Config(metaclass=CacheMeta):
    args = None

    @classmethod
    def parse(cls):
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--cudagraph", envvar="CUDAGRAPH", action=FromEnvironment, default=False, type=bool)
        parser.add_argument("--cupti", envvar="CUPTI", action=FromEnvironment, default=True, type=bool)
        cls.args = parser.parse_args(args=[])


Config.parse()
'''

SIMULATED_COMMON_TIMING = '''\
# SIMULATED: the timing functions of TileGym's tests/common.py, reduced to their structure.
from .config import Config


def _extract_kernel_times_from_profile(fn):
    return None, []


def benchmark_fn(fn, n_repeat=10):
    _extract_kernel_times_from_profile(fn)
    cache = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    start = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for i in range(n_repeat):
        cache.zero_()
        start[i].record()
        fn()
        end[i].record()
    return [s.elapsed_time(e) for s, e in zip(start, end)]


def benchmark_fn_cudagraph(fn, n_repeat=10):
    _extract_kernel_times_from_profile(fn)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n_repeat):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    return [start.elapsed_time(end) / n_repeat]


def benchmark_fn_cupti(fn, n_repeat=10):
    from torch.profiler import ProfilerActivity, profile

    cache = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    times = []
    for _ in range(n_repeat):
        cache.zero_()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
        times.append(sum(e.self_device_time_total for e in prof.key_averages()))
    return times


def benchmark(fn, fast_flush=True, use_cudagraph=Config.cudagraph, use_cupti=Config.cupti):
    if use_cupti:
        timer = benchmark_fn_cupti
    elif use_cudagraph:
        timer = benchmark_fn_cudagraph
    else:
        timer = benchmark_fn
    return {"forward": timer(fn)}


def benchmark_framework(framework_name, framework_fn, **benchmark_kwargs):
    return {framework_name: benchmark(framework_fn, **benchmark_kwargs)}
'''

# A perf test file that times through the simulated common.benchmark_framework, as TileGym's
# tests/ops/test_rms_norm.py does (use_cudagraph=True, which CUPTI overrides).
SIMULATED_TIMED_PERF_TEST = '''\
import pytest

from .. import common


@pytest.mark.parametrize("backend", ["cutile"])
def test_perf(backend, record_property):
    if False:  # SIMULATED: the CPU tests collect this file, they never time anything with it
        record_property("benchmark", common.benchmark_framework(backend, lambda: None, use_cudagraph={graph}))
'''


def add_simulated_timing(repo: Path, *, use_cudagraph: str = "True") -> str:
    """Add the simulated TileGym timing harness and a perf test file that uses it, committed;
    returns the perf test's repo-relative path (pass it to ``init --perf-test``)."""
    files = {"tests/__init__.py": "", "tests/config.py": SIMULATED_CONFIG, "tests/common.py": SIMULATED_COMMON_TIMING,
             "tests/ops/test_rms_norm_perf.py": SIMULATED_TIMED_PERF_TEST.format(graph=use_cudagraph)}
    for rel, text in files.items():
        path = repo / rel
        if rel == "tests/common.py" and path.exists():  # next to add_simulated_softmax's PyTestCase
            text = path.read_text(encoding="utf-8") + "\n\n" + text
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "SIMULATED TileGym timing harness")
    return "tests/ops/test_rms_norm_perf.py"

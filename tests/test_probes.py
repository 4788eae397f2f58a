"""kernel/probes.py: a candidate that probes its measurement context, or patches what times it, is
found from its source before anything runs; the bundled kernels are not."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cutile_perf.kernel import probes

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "src/pkg/ops/cutile/rms_norm.py"
HONEST = '''\
"""An honest kernel."""
import os

import cuda.tile as ct
import torch

AUTOTUNE = os.environ.get("DISABLE_AUTOTUNE", "0") != "1" and not os.getenv("TILEGYM_DISABLE_AUTOTUNE")
DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")


@ct.kernel
def rms_norm_kernel(x, out, TILE: ct.Constant[int]):
    row = ct.bid(0)
    ct.store(out, index=(row, 0), tile=ct.load(x, index=(row, 0), shape=(1, TILE)))


def rms_norm(x):
    out = torch.empty_like(x)
    ct.launch(torch.cuda.current_stream(), (x.shape[0], 1, 1), rms_norm_kernel, (x, out, 1024))
    torch.cuda.synchronize()
    return out
'''


def findings(attack: str, *, old: str | None = HONEST) -> list[probes.Finding]:
    return probes.scan({KERNEL: old}, {KERNEL: HONEST + "\n" + textwrap.dedent(attack)})


def rules(attack: str) -> set[str]:
    return {f.rule for f in findings(attack)}


def test_the_honest_kernel_has_no_finding():
    assert probes.scan({KERNEL: None}, {KERNEL: HONEST}) == []


# --- one attack per rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("attack", [
    'FAST = "PYTEST_CURRENT_TEST" in os.environ\n',
    'def _timed():\n    return "test_perf" in os.environ.get("PYTEST_CURRENT_TEST", "")\n',
    'from os import environ as _e\nBENCH = bool(_e["CUTILE_PERF_RECORDS"])\n',
    'BENCH = os.getenv("CUTILE_PERF_" + "REPORT") is not None\n',
    '_KEY = "CUDA_TILE_CACHE_DIR"\nCOLD = os.environ.get(_KEY) is None\n',
    'BENCH = any(k.startswith("PYTEST_") for k in os.environ)\n',
])
def test_env_probe(attack):
    found = findings(attack)
    assert found and {f.rule for f in found} == {"env"}, found
    assert all(f.path == KERNEL and f.line > HONEST.count("\n") for f in found)


@pytest.mark.parametrize("attack", [
    'import sys\nTIMED = "--benchmark" in " ".join(sys.argv) or "-k" in sys.argv\n',
    'from sys import orig_argv\nPERF = any("perf" in a for a in orig_argv)\n',
])
def test_argv_probe(attack):
    assert rules(attack) == {"argv"}


@pytest.mark.parametrize("attack", [
    'import inspect\ndef _in_perf():\n    return any("test_perf" in f.function for f in inspect.stack())\n',
    'import sys\ndef _caller():\n    return sys._getframe(2).f_code.co_name\n',
    'import traceback as tb\nPERF = "test_perf" in str(tb.extract_stack())\n',
    'import inspect\ndef _up():\n    frame = inspect.currentframe()\n    return frame.f_back.f_globals\n',
])
def test_stack_probe(attack):
    assert rules(attack) == {"stack"}


@pytest.mark.parametrize("attack", [
    'import sys\nUNDER_TEST = "pytest" in sys.modules\n',
    'import sys\n_plugin = sys.modules.get("cutile_perf.pytest_plugin")\n',
    'import sys\n_cfg = sys.modules["_pytest.config"]\n',
])
def test_sys_modules_probe(attack):
    assert rules(attack) == {"sys-modules"}


@pytest.mark.parametrize("attack", [
    'CMD = open("/proc/self/cmdline", "rb").read()\n',
    'def _parent():\n    return open(f"/proc/{os.getppid()}/cmdline").read()\n',
    'FD = [os.readlink(os.path.join("/dev/fd", n)) for n in os.listdir("/dev/fd")]\n',
    'from pathlib import Path\nENV = (Path("/proc") / "self" / "environ").read_bytes()\n',
])
def test_proc_probe(attack):
    assert rules(attack) == {"proc"}


@pytest.mark.parametrize("attack", [
    'IN_CHECKOUT = "checkout" in os.getcwd()\n',
    'from pathlib import Path\nHARNESS = "cutile-perf" in str(Path(__file__).resolve())\n',
    'from pathlib import Path\nPRISTINE = str(Path.cwd()).endswith("pristine")\n',
])
def test_cwd_path_probe(attack):
    assert rules(attack) == {"cwd-path"}


@pytest.mark.parametrize("attack", [
    'import pytest\n',
    'from _pytest.runner import CallInfo\n',
    'from cutile_perf import bench as _bench\n',
    'import importlib\n_p = importlib.import_module("cutile_perf.pytest_plugin")\n',
])
def test_import_of_the_test_framework(attack):
    assert rules(attack) >= {"import"}


def test_the_autotuner_import_is_allowed():
    assert findings("from cutile_perf.tune import Autotuner, Config\nfrom cutile_perf import tune\n") == []


@pytest.mark.parametrize("attack", [
    'import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() / 2\n',
    'import time as t\n_r = t.perf_counter_ns\nt.perf_counter_ns = lambda: _r() // 2\n',
    'import statistics\nsetattr(statistics, "median", lambda xs: min(xs))\n',
    'from torch import cuda\n_et = cuda.Event.elapsed_time\ncuda.Event.elapsed_time = lambda s, e: _et(s, e) / 2\n',
    'torch.cuda.Event.elapsed_time = lambda self, end: 0.01\n',
    'import triton.testing\ntriton.testing.do_bench = lambda fn, **kw: 0.01\n',
    'import builtins\nbuiltins.sorted = lambda xs, **kw: [min(xs)] * len(xs)\n',
    'import sys\n_time = sys.modules["time"]\n_time.monotonic = lambda: 0.0\n',
    'import importlib\nimportlib.import_module("statistics").mean = min\n',
    'import time\nclock = time\nclock.perf_counter = lambda: 0.0\n',
    '__builtins__["sum"] = lambda xs: 0\n',
    'import statistics\nvars(statistics)["median"] = min\n',
    'from unittest import mock\n_p = mock.patch("time.perf_counter", lambda: 0.0)\n_p.start()\n',
    'import os\nos.environ = {}\n',
    'import time\ndel time.perf_counter\n',
])
def test_monkeypatch(attack):
    assert rules(attack) == {"monkeypatch"}, findings(attack)


# --- what is new, and the one line ---------------------------------------------------------------


def test_only_what_the_new_text_adds_is_reported():
    probe = 'FAST = "PYTEST_CURRENT_TEST" in os.environ\n'
    old = HONEST + "\n" + probe
    # Already there: moved to the top of the file, re-indented into a function, or moved to another
    # fenced file, it is not new.
    moved = probe + HONEST
    assert probes.scan({KERNEL: old}, {KERNEL: moved}) == []
    assert probes.scan({KERNEL: old}, {KERNEL: HONEST, "src/pkg/other.py": "import os\n" + probe}) == []
    inside = HONEST + "\ndef f():\n    FAST = 'PYTEST_CURRENT_TEST' in os.environ\n    return FAST\n"
    assert probes.scan({KERNEL: old}, {KERNEL: inside}) == []
    # A second copy is new; so is a probe in a new file (old missing).
    assert len(probes.scan({KERNEL: old}, {KERNEL: old + "\ndef g():\n    " + probe})) == 1
    assert [f.path for f in probes.scan({KERNEL: old}, {KERNEL: old, "src/pkg/new.py": "import pytest\n"})] == [
        "src/pkg/new.py"]


def test_unparsable_and_non_python_files_are_left_to_the_compile_stage():
    assert probes.scan({}, {KERNEL: "def broken(:\n", "README.md": 'import pytest\n'}) == []


def test_describe_is_one_line_with_file_line_and_reason():
    found = findings('import time\ntime.perf_counter = lambda: 0.0\nimport pytest\n')
    text = probes.describe(found)
    assert "\n" not in text
    line = HONEST.count("\n") + 3
    assert f"{KERNEL}:{line}" in text and "[monkeypatch] replaces time.perf_counter" in text
    assert probes.describe([]).startswith("no ")
    many = probes.describe(found * 3)
    assert many.endswith("(+3 more)")


# --- no false positives on the bundled kernels -----------------------------------------------------


def _bundled() -> list[Path]:
    kernels = ROOT / "examples" / "kernels"
    return sorted(kernels.glob("src/**/*.py")) + sorted(kernels.glob("optimizations/**/*.py"))


def test_bundled_kernels_have_no_finding():
    files = _bundled()
    assert len(files) > 20, "the bundled kernels moved?"
    found = [f for path in files for f in probes.scan({}, {str(path.relative_to(ROOT)): path.read_text()})]
    assert found == [], probes.describe(found, limit=10)

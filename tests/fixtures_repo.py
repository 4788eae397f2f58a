"""``tilegym_like_repo``: a SIMULATED kernel repository shaped like NVIDIA TileGym, for CPU tests.

Nothing here runs on a GPU. The "kernel" file ``src/fakegym/ops/cutile/rms_norm.py`` has the shape
of a cuTile kernel (``@ct.kernel``, ``ct.launch``, ``@register_impl``) over a stand-in ``ct`` class,
and a few module constants that the fake tests read to decide what happens:

* ``LATENCY_MS``: per-shape latency the fake ``test_perf`` reports (with ``NOISE`` relative jitter,
  reproducible when ``FAKEGYM_JITTER_COUNTER`` names a counter file);
* ``BEHAVIOUR``: "ok", "wrong" (assertion), "fault" (CUDA-error text), "no-record" (perf test
  records nothing);
* ``SLEEP_S``: seconds every test sleeps (to trigger the iteration timeout).

Tests change the kernel through ``edit_kernel`` exactly as an agent would: edit the file, leave it
uncommitted, call ``cutile-perf try``. After ``init``, ``allow_no_gpu`` turns the session's GPU gate
off, since nothing here needs one.
"""
from __future__ import annotations

import re
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

KERNEL_REL = "src/fakegym/ops/cutile/rms_norm.py"
TEST_REL = "tests/ops/test_rms_norm.py"
SHAPES = ("256x1024", "4096x1024")

KERNEL_TEMPLATE = '''\
"""Simulated cuTile RMSNorm for cutile-perf's CPU tests (not a real kernel)."""


class ct:  # stand-in for cuda.tile, so the simulated kernel imports without a GPU
    @staticmethod
    def kernel(fn=None, **hints):
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def launch(*args):
        return None


def register_impl(op, backend):
    return lambda fn: fn


# --- knobs the fake tests read -----------------------------------------------------
LATENCY_MS = {latency!r}
NOISE = {noise!r}
BEHAVIOUR = {behaviour!r}
SLEEP_S = {sleep!r}


@ct.kernel(occupancy=2)
def rms_norm_kernel(x, w, out, eps, TILE: int):
    row = ct.bid(0)
    tile = ct.load(x, index=(row, 0), shape=(1, TILE))
    ms = ct.sum(tile * tile, axis=1) / TILE
    ct.store(out, index=(row, 0), tile=tile * ct.rsqrt(ms + eps) * w)


@register_impl("rms_norm", backend="cutile")
def rms_norm(x, w, eps=1e-6):
    ct.launch(None, (x.shape[0], 1, 1), rms_norm_kernel, (x, w, x, eps, 1024))
    return x
'''

TEST_FILE = '''\
import os
import random
import time
from pathlib import Path

import pytest

from fakegym.ops.cutile import rms_norm as kernel

SHAPES = {shapes!r}


def _behave():
    time.sleep(kernel.SLEEP_S)
    if kernel.BEHAVIOUR == "wrong":
        raise AssertionError("Tensor-likes are not close! Mismatched elements: 17 / 1024")
    if kernel.BEHAVIOUR == "fault":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("backend", ["cutile", "cutile_rs", "torch"])
def test_op(backend):
    _behave()


@pytest.mark.parametrize("backend", ["cutile", "cutile_rs"])
@pytest.mark.parametrize("shape", SHAPES)
def test_perf(shape, backend, record_property):
    _behave()
    if kernel.BEHAVIOUR == "no-record":
        return
    base = kernel.LATENCY_MS[shape] * (1.7 if backend == "cutile_rs" else 1.0)
    rng = _jitter_source()
    samples = [base * (1 + rng.uniform(-kernel.NOISE, kernel.NOISE)) for _ in range(9)]
    # device_ms stands in for bench's device-time witness: what the simulated device really ran.
    record_property("benchmark", {{backend: {{"forward": {{**_summary(samples), "device_ms": base}}}}}})


def _jitter_source():
    # FAKEGYM_JITTER_COUNTER names a file outside the repo that counts the perf records drawn so
    # far: a test that needs one reproducible sequence of noisy runs sets it (each record still
    # draws fresh jitter, from a seed given by its position in the sequence); unset, the jitter is
    # unseeded.
    counter = os.environ.get("FAKEGYM_JITTER_COUNTER")
    if not counter:
        return random
    path = Path(counter)
    drawn = int(path.read_text()) if path.exists() else 0
    path.write_text(str(drawn + 1))
    return random.Random(drawn)


def _summary(samples):
    # Plain arithmetic, not `statistics`: a hostile LATENCY_MS of nan/inf/0 must reach the record
    # (the harness has to reject it), not crash the fake test first.
    n, ordered = len(samples), sorted(samples)
    mean = sum(samples) / n
    std = (sum((x - mean) ** 2 for x in samples) / (n - 1)) ** 0.5
    return {{"mean": mean, "std": std, "rel_std": 100 * std / mean if mean else 0.0, "median": ordered[n // 2],
            "min": ordered[0], "max": ordered[-1], "nrep": n}}
'''

CONFTEST = '''\
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def pytest_addoption(parser):
    # TileGym registers this option; the record plugin must coexist with it.
    parser.addoption("--print-record", action="store_true", default=False, help="Print record_property content")
'''


def kernel_source(latency: dict[str, float] | None = None, *, noise: float = 0.002, behaviour: str = "ok",
                  sleep: float = 0.0) -> str:
    latency = latency or {"256x1024": 1.0, "4096x1024": 2.0}
    return KERNEL_TEMPLATE.format(latency=latency, noise=noise, behaviour=behaviour, sleep=sleep)


def interruptible() -> None:
    """``preexec_fn`` for a CLI process a test interrupts: SIGINT back to its default. A suite started
    as a background job (``nohup ... &``) inherits SIGINT ignored, and Python keeps an ignored SIGINT
    ignored, so the Ctrl-C tests would see no interrupt at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def build_tilegym_like_repo(root: Path) -> Path:
    """Create the simulated repository with one commit on ``main``; returns its path."""
    repo = root / "fakegym"
    files = {
        "README.md": "Simulated TileGym-shaped repository for cutile-perf tests.\n",
        "src/fakegym/__init__.py": "",
        "src/fakegym/ops/__init__.py": "",
        "src/fakegym/ops/cutile/__init__.py": "",
        KERNEL_REL: kernel_source(),
        "tests/conftest.py": CONFTEST,
        "tests/ops/__init__.py": "",
        TEST_REL: TEST_FILE.format(shapes=SHAPES),
        "pytest.ini": "[pytest]\ntestpaths = tests\naddopts = -p no:cacheprovider\n",
    }
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text) if rel.endswith(".ini") else text, encoding="utf-8")
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "config", "user.email", "tester@example.com")
    git(repo, "config", "user.name", "Tester")
    git(repo, "config", "commit.gpgsign", "false")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial simulated kernel repo")
    return repo


def allow_no_gpu(repo: Path) -> None:
    """Write ``require_gpu: false`` into the session after ``init``: the simulated kernel's fake tests
    need no GPU, so its ``baseline``/``try`` must not be refused on a CPU-only machine."""
    path = repo / "sandbox" / "session.yaml"
    text = path.read_text(encoding="utf-8")
    assert "require_gpu: true" in text, "init writes require_gpu: true by default"
    path.write_text(text.replace("require_gpu: true", "require_gpu: false"), encoding="utf-8")


def edit_session(repo: Path, **changes) -> None:
    """Edit sandbox/session.yaml: top-level keys are replaced, ``thresholds`` entries merged. Only
    before the baseline (the session is frozen into it), except where a test attacks it."""
    import yaml  # noqa: PLC0415 - only the tests that edit sessions need it

    path = repo / "sandbox" / "session.yaml"
    data = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        if key == "thresholds":
            data["thresholds"].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))


def edit_kernel(repo: Path, **changes) -> None:
    """Rewrite knob lines of the simulated kernel, as an agent's uncommitted edit would."""
    path = repo / KERNEL_REL
    text = path.read_text(encoding="utf-8")
    names = {"latency": "LATENCY_MS", "noise": "NOISE", "behaviour": "BEHAVIOUR", "sleep": "SLEEP_S"}
    for key, value in changes.items():
        text = re.sub(rf"^{names[key]} = .*$", f"{names[key]} = {value!r}", text, flags=re.M)
    path.write_text(text, encoding="utf-8")


@pytest.fixture
def tilegym_like_repo(tmp_path: Path) -> Path:
    """A fresh simulated TileGym-shaped git repository (see the module docstring)."""
    return build_tilegym_like_repo(tmp_path)

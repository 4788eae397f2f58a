"""Shared test configuration.

Markers:
  gpu        needs an NVIDIA GPU and a working cuTile toolchain; skipped with the reason otherwise.
  toolchain  needs cuda-tile and tileiras (no GPU): compiles kernels ahead of time.
"""
from __future__ import annotations

import functools
import shutil
import tempfile

import pytest


@functools.lru_cache(maxsize=None)
def gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    return toolchain_skip_reason()


@functools.lru_cache(maxsize=None)
def toolchain_skip_reason() -> str | None:
    try:
        import cuda.tile  # noqa: F401
    except Exception as exc:  # a broken install raises more than ImportError
        return f"cuda-tile is not importable ({type(exc).__name__}: {exc})"
    try:
        from cuda.tile._compile import _find_compiler_bin  # private, but it is the lookup cuTile uses

        _find_compiler_bin()
    except Exception as exc:
        if shutil.which("tileiras") is None:
            return f"tileiras not found ({type(exc).__name__})"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "toolchain: needs cuda-tile and tileiras, no GPU")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords:
            reason = gpu_skip_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"GPU test: {reason}"))
        elif "toolchain" in item.keywords:
            reason = toolchain_skip_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"toolchain test: {reason}"))


@pytest.fixture
def runtime_defences_only(monkeypatch):
    """Skip ``try``'s static probe scan (``loop.guards.refuse_probes``) in this process, so a test
    whose attack code reads the harness's environment or imports pytest reaches the run-time
    defences behind the scan (the records' signatures, the protected-file checks, the log's chain).
    The scan refusing the same attacks up front is tested in ``tests/test_iteration.py``."""
    monkeypatch.setattr("cutile_perf.loop.guards.refuse_probes", lambda *args, **kwargs: None)


@pytest.fixture(scope="session", autouse=True)
def own_temp_folder(tmp_path_factory):
    """This run's own temp folder (one per xdist worker), for this process and the commands it starts.

    cutile-perf keeps per-user folders in the temp folder (the checkout slots of ``pristine.slot_root``,
    installed-code bytecode); two test runs at once on one machine shared them and one run's slot-0
    met the other's slot-1 (issue 43)."""
    folder = tmp_path_factory.mktemp("tmp")
    patch = pytest.MonkeyPatch()
    patch.setenv("TMPDIR", str(folder))
    patch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    patch.undo()

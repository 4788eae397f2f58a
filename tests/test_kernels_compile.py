"""Every bundled cuTile kernel compiles for sm_80, sm_90 and sm_100 without a GPU.

Covers the suite's op modules (``examples/kernels/src/tilesuite/ops/cutile/*.py``) and every
prepared optimization source (``examples/kernels/optimizations/<op>/*.py``), each through its
``aot_signatures()`` hook and ``cuda.tile.compilation.export_kernel``. This catches a kernel edit
that breaks on one architecture (the H200 is sm_90, TileGym's own target is sm_100) in CPU CI.
"""
from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[1] / "examples" / "kernels"
ARCHS = ("sm_80", "sm_90", "sm_100")


def kernel_sources() -> list[Path]:
    ops = sorted(p for p in (SUITE / "src" / "tilesuite" / "ops" / "cutile").glob("*.py") if not p.name.startswith("_"))
    return ops + sorted((SUITE / "optimizations").glob("*/*.py"))


def load_module(path: Path):
    """Import a kernel file under a unique name (optimization files are not importable by name)."""
    pytest.importorskip("torch")  # the op modules' host wrappers import torch
    src = str(SUITE / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    name = "_aot_" + "_".join(path.relative_to(SUITE).with_suffix("").parts).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_suite_has_the_kernels_the_demo_and_benchmark_use():
    names = {p.stem for p in kernel_sources()}
    assert {"swiglu", "rms_norm", "softmax", "layer_norm"} <= names


@pytest.mark.toolchain
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", kernel_sources(), ids=lambda p: str(p.relative_to(SUITE)))
def test_kernel_compiles(path, arch):
    from cuda.tile.compilation import export_kernel

    module = load_module(path)
    hook = getattr(module, "aot_signatures", None)
    assert callable(hook), f"{path.name} has no aot_signatures(); see examples/kernels/README.md"
    pairs = hook()
    assert pairs, f"{path.name}: aot_signatures() returned nothing to compile"
    for kernel, signatures in pairs:
        cubin = io.BytesIO()
        export_kernel(kernel, signatures, cubin, gpu_code=arch, output_format="cubin")
        assert cubin.getvalue()[:4] == b"\x7fELF", f"{path.name} {arch}: output is not an ELF cubin"

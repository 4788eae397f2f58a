"""Skip markers for tests that need a package from an optional extra (torch, cuda-tile, triton).

``python -m pytest tests`` collects and skips cleanly with the base install alone: a test module
never imports an optional package at its top level unguarded, and a test that needs one carries
``@needs("triton")`` (or calls ``pytest.importorskip``), whose reason names the extra to install.
``tests/test_collection.py`` checks that collection stays clean with torch, cuda and triton hidden.
"""
from __future__ import annotations

import functools
import importlib

import pytest

# The extra of pyproject.toml that brings each optional top-level package.
EXTRA = {"torch": "gpu", "cuda": "gpu", "triton": "triton"}


@functools.lru_cache(maxsize=None)
def missing(module: str) -> str | None:
    """Why ``module`` cannot be imported, or None when it can.

    Imports it rather than asking ``importlib.util.find_spec``: find_spec("cuda.tile") itself raises
    ModuleNotFoundError when there is no ``cuda`` package, and a broken install raises more than
    ImportError on import.
    """
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure to import means the tests cannot run
        return f"{type(exc).__name__}: {exc}"
    return None


def needs(*modules: str) -> pytest.MarkDecorator:
    """A skipif marker: skip unless every one of ``modules`` imports; the reason names the extra."""
    for module in modules:
        why = missing(module)
        if why:
            extra = EXTRA.get(module.partition(".")[0])
            hint = f" (pip install -e '.[{extra}]')" if extra else ""
            return pytest.mark.skipif(True, reason=f"needs {module}{hint}: {why}")
    return pytest.mark.skipif(False, reason="")

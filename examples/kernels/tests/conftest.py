"""Test configuration of the kernel suite.

* Puts ``src/`` on ``sys.path`` so ``import tilesuite`` works without installing the suite.
* Registers ``--defence`` (or ``CUTILE_PERF_DEFENCE=1``): runs each op's ``test_defence`` (see
  ``common.defence_run``), which cutile-perf's red-team attacks cannot pass.
* Registers ``--print-record`` like TileGym's conftest: with it, each perf test's
  ``record_property("benchmark", ...)`` dict is printed after the test. cutile-perf's pytest plugin
  may register the same option first; the ``ValueError`` pytest raises then is expected and ignored,
  so both can be loaded together.
"""
from __future__ import annotations

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

_config = None


def pytest_addoption(parser):
    try:
        parser.addoption("--print-record", action="store_true", default=False,
                         help="print the benchmark record of each perf test")
    except ValueError:  # already registered (cutile-perf's plugin or a parent conftest)
        pass
    parser.addoption("--defence", action="store_true", default=False,
                     help="run the test_defence checks (also CUTILE_PERF_DEFENCE=1): fresh inputs per call, "
                          "NaN-poisoned outputs, the perf shapes, a float64 reference")


def pytest_configure(config):
    global _config
    _config = config


def pytest_runtest_logreport(report):
    if report.when != "call" or _config is None or not _config.getoption("--print-record", default=False):
        return
    for name, value in report.user_properties:
        if name == "benchmark":
            writer = _config.get_terminal_writer()
            writer.line(f"\n{report.nodeid}: {value}")


def pytest_runtest_setup(item):
    if "defence" in item.keywords and not _defence_on(item.config):
        import pytest

        pytest.skip("defence run off: pass --defence or set CUTILE_PERF_DEFENCE=1")


def _defence_on(config) -> bool:
    import os

    return bool(config.getoption("--defence", default=False)) or os.environ.get("CUTILE_PERF_DEFENCE", "") == "1"

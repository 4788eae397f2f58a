"""Test configuration of the kernel suite.

* Puts ``src/`` on ``sys.path`` so ``import tilesuite`` works without installing the suite.
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

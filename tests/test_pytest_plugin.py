"""The record plugin in real pytest subprocesses, against conftests shaped like TileGym's.

Each case runs ``pytester.runpytest_subprocess`` so plugin loading happens exactly as in a target
repo: the ``pytest11`` entry point (our editable install), the harness's explicit ``-p`` arguments,
or ``-p`` alone in an interpreter without the entry point (autoload disabled).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import pytest

from cutile_perf.child.records import PYTEST_PLUGIN_ARGS, read_records_file, select

pytest_plugins = ["pytester"]

# A TileGym-shaped perf test: record_property("benchmark", {framework: {"forward": stats}}).
PERF_TESTS = """
import pytest

@pytest.mark.parametrize("framework", ["cutile", "pytorch"])
@pytest.mark.parametrize("n", [1024, 2048])
def test_perf(n, framework, record_property):
    record_property("benchmark", {framework: {"forward": {
        "mean": 0.2799, "std": 0.00187, "rel_std": 0.668, "median": 0.25 * n / 1024,
        "min": 0.2759, "max": 0.2852, "nrep": 160, "peak_mem_mb": 1268}}})

def test_op():
    pass
"""

# TileGym's tests/conftest.py registers --print-record itself (and consumes nothing).
TILEGYM_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--print-record", action="store_true", help="Print record_property content in tests")
    parser.addoption("--arch", default="sm90")

import pytest

@pytest.fixture
def arch(request):
    return request.config.getoption("--arch")
"""

ENTRY_POINT_NAMES = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
HAS_ENTRY_POINT = ENTRY_POINT_NAMES.get("cutile_perf") == "cutile_perf.pytest_plugin" or (
    "cutile_perf.pytest_plugin" in ENTRY_POINT_NAMES.values()
)

LOADINGS = {
    "entry-point": [],
    "harness-args": list(PYTEST_PLUGIN_ARGS),
    "explicit-p-no-autoload": ["-p", "cutile_perf.pytest_plugin"],
}


def _run(pytester: pytest.Pytester, monkeypatch, loading: str, *args: str):
    if loading == "entry-point" and not HAS_ENTRY_POINT:
        pytest.skip("cutile-perf is not installed with its pytest11 entry point in this interpreter")
    if loading == "explicit-p-no-autoload":
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    else:
        monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    return pytester.runpytest_subprocess(*LOADINGS[loading], "-p", "no:cacheprovider", *args)


@pytest.fixture
def records_file(pytester, monkeypatch):
    path = pytester.path / "records.jsonl"
    monkeypatch.setenv("CUTILE_PERF_RECORDS", str(path))
    return path


@pytest.mark.parametrize("loading", LOADINGS)
@pytest.mark.parametrize("conftest", ["tilegym-registers-print-record", "no-conftest-option"])
def test_print_record_option_exists_exactly_once(pytester, monkeypatch, records_file, loading, conftest):
    # The bug this pins: an entry-point plugin that registers --print-record in pytest_addoption
    # makes TileGym's conftest fail with "option names {'--print-record'} already added".
    if conftest == "tilegym-registers-print-record":
        pytester.makeconftest(TILEGYM_CONFTEST)
    pytester.makepyfile(test_kernel=PERF_TESTS)
    result = _run(pytester, monkeypatch, loading, "--print-record", "-k", "test_perf and cutile")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([
        "*benchmark records (ms)*",
        "test_kernel.py::test_perf[1024-cutile]",
        "  Cutile: {'forward': {'mean': 0.2799, *'median': 0.25, *'nrep': 160, 'peak_mem_mb': 1268}} ms",
        "test_kernel.py::test_perf[2048-cutile]",
        "  Cutile: {'forward': {*'median': 0.5, *}} ms",
    ])
    assert "already added" not in result.stderr.str()
    cutile = select(read_records_file(records_file))
    assert {k: r.median for k, r in cutile.items()} == {
        "test_kernel.py::test_perf[1024-cutile]": 0.25,
        "test_kernel.py::test_perf[2048-cutile]": 0.5,
    }


@pytest.mark.parametrize("loading", LOADINGS)
def test_help_lists_print_record_once(pytester, monkeypatch, loading):
    pytester.makeconftest(TILEGYM_CONFTEST)
    result = _run(pytester, monkeypatch, loading, "--help")
    assert result.ret == 0
    assert result.stdout.str().count("--print-record") == 1


def test_option_in_a_named_group_is_not_registered_twice(pytester, monkeypatch):
    # OptionGroup only checks conflicts inside one group; argparse would then fail on the duplicate.
    pytester.makeconftest(
        'def pytest_addoption(parser):\n'
        '    parser.getgroup("tilegym").addoption("--print-record", action="store_true")\n'
    )
    pytester.makepyfile(test_kernel=PERF_TESTS)
    result = _run(pytester, monkeypatch, "harness-args", "--print-record")
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(["  Pytorch: {'forward': {*}} ms"])


def test_targets_own_options_keep_working(pytester, monkeypatch):
    pytester.makeconftest(TILEGYM_CONFTEST)
    pytester.makepyfile("def test_arch(arch):\n    assert arch == 'sm100'\n")
    result = _run(pytester, monkeypatch, "harness-args", "--arch", "sm100", "--print-record")
    assert result.ret == 0, result.stdout.str()


def test_records_written_without_print_record_and_nothing_printed(pytester, monkeypatch, records_file):
    pytester.makeconftest(TILEGYM_CONFTEST)
    pytester.makepyfile(test_kernel=PERF_TESTS)
    result = _run(pytester, monkeypatch, "harness-args")
    assert result.ret == 0
    assert "Cutile:" not in result.stdout.str()
    rows = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert len(rows) == 4 and {row["outcome"] for row in rows} == {"passed"}
    assert {fw for row in rows for fw in row["benchmark"]} == {"cutile", "pytorch"}


def test_no_records_file_when_env_unset(pytester, monkeypatch):
    monkeypatch.delenv("CUTILE_PERF_RECORDS", raising=False)
    pytester.makepyfile(test_kernel=PERF_TESTS)
    result = _run(pytester, monkeypatch, "harness-args")
    assert result.ret == 0
    assert not list(pytester.path.glob("*.jsonl"))


def test_failed_perf_test_is_recorded_as_failed_and_not_selected(pytester, monkeypatch, records_file):
    # A perf test whose correctness check fails after recording must not give a latency.
    pytester.makepyfile(test_kernel=(
        "def test_perf(record_property):\n"
        "    record_property('benchmark', {'cutile': {'forward': {'median': 0.1}}})\n"
        "    assert False, 'wrong result'\n"
    ))
    result = _run(pytester, monkeypatch, "harness-args")
    assert result.ret == 1
    records = read_records_file(records_file)
    assert [r.outcome for r in records] == ["failed"]
    assert select(records) == {}
    assert list(select(records, passed_only=False)) == ["test_kernel.py::test_perf"]


@pytest.mark.skipif(importlib.util.find_spec("numpy") is None, reason="numpy is not installed")
def test_numpy_scalars_in_a_record_become_numbers(pytester, monkeypatch, records_file):
    # Only the child imports numpy: pytester drops modules imported during a test from
    # sys.modules, and numpy refuses a second import in one process (matplotlib needs it later).
    pytester.makepyfile(
        "import numpy as np\n"
        "def test_perf(record_property):\n"
        "    record_property('benchmark', {'cutile': {'forward': {'median': np.float64(0.125), 'nrep': np.int64(7)}}})\n"
    )
    result = _run(pytester, monkeypatch, "harness-args", "--print-record")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["  Cutile: {'forward': {'median': *0.125*, 'nrep': *7*}} ms"])
    (record,) = read_records_file(records_file)
    assert record.stats == {"median": 0.125, "nrep": 7}


@pytest.mark.skipif(
    ENTRY_POINT_NAMES.get("cutile_perf.pytest_plugin") != "cutile_perf.pytest_plugin",
    reason="only harmless when the pytest11 entry point is named like the module "
    "(pyproject: cutile_perf.pytest_plugin = \"cutile_perf.pytest_plugin\"); the harness uses PYTEST_PLUGIN_ARGS",
)
def test_plain_explicit_p_with_entry_point_is_harmless(pytester, monkeypatch):
    pytester.makepyfile(test_kernel=PERF_TESTS)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    result = pytester.runpytest_subprocess("-p", "cutile_perf.pytest_plugin", "--print-record")
    assert result.ret == 0, result.stderr.str()


def test_a_selection_by_node_id_runs_only_those_of_the_tests_the_command_selects(pytester, monkeypatch):
    """``CUTILE_PERF_SELECT`` (the interleaved re-check of the cases in doubt) narrows what ``-k``
    selected; a node id that ``-k`` did not select still does not run."""
    pytester.makepyfile(test_kernel=PERF_TESTS)
    wanted = "test_kernel.py::test_perf[1024-cutile]"
    monkeypatch.setenv("CUTILE_PERF_REPORT", str(pytester.path / "report.jsonl"))
    monkeypatch.setenv("CUTILE_PERF_SELECT", json.dumps([wanted, "test_kernel.py::test_op"]))
    result = _run(pytester, monkeypatch, "harness-args", "-k", "test_perf", "-v")
    ran = [line.split(" ")[0] for line in result.stdout.lines if " PASSED" in line]
    assert ran == [wanted], result.stdout.str()

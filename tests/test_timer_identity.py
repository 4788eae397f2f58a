"""Timer identity (issue 19 item 4): a kernel that replaces the functions its timing or its report
goes through is caught by the child's plugin and ends as crash class ``tampered``.

The simulated repository's perf test reports ``LATENCY_MS`` instead of timing anything, so each
attack below does both halves of a real one: it patches the timer the way an attacker would (here
to run at half speed) and sets ``LATENCY_MS`` to what the patched timer would then have measured
(2x faster). The control shows that the same numbers without the patch are kept: the patch, and
only the patch, is what turns the candidate away.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures_repo import edit_kernel
from redteam_helpers import (FAST, _template, append_to_kernel, assert_not_kept_nothing_lost, call, repo, rows,  # noqa: F401
                             snapshot)

from cutile_perf.child import records, runner, runreport

PATCH_PERF_COUNTER = '''
# ATTACK perf-counter
import time as _t

_real_clock = _t.perf_counter
_t.perf_counter = lambda: _real_clock() / 2  # every interval the perf test times is halved
'''

# The same patches with the module and attribute names built at run time: the static scan
# (kernel/probes.py, run by `try` before anything runs) cannot see them, the child's check must.
HIDDEN_PATCH = '''
# ATTACK hidden-{what}
_mod = __import__(bytes({module}).decode())
_name = bytes({attr}).decode()
_real = getattr(_mod, _name)
setattr(_mod, _name, {fake})
'''
HIDDEN = {
    "time.perf_counter": HIDDEN_PATCH.format(what="perf-counter", module=list(b"time"), attr=list(b"perf_counter"),
                                             fake="lambda: _real() / 2"),
    "statistics.median": HIDDEN_PATCH.format(what="median", module=list(b"statistics"), attr=list(b"median"),
                                             fake="lambda xs: _real(xs) / 2"),
}


@pytest.mark.parametrize("name", sorted(HIDDEN))
def test_kernel_that_patches_a_timer_out_of_sight_of_the_scan_is_tampered(repo, name):
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST)
    append_to_kernel(repo, HIDDEN[name])
    code, data, _ = call(repo, "try", "2x faster (per the patched timer)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK hidden-")
    assert row.get("crash_class") == "tampered", row
    assert name in json.dumps(row), row


def test_kernel_that_patches_a_timer_in_plain_sight_is_not_kept(repo):
    """Refused by the static scan before anything runs (exit 3), or, were the scan to miss it,
    caught by the child's check: either way not kept."""
    before = snapshot(repo)
    edit_kernel(repo, latency=FAST)
    append_to_kernel(repo, PATCH_PERF_COUNTER)
    code, data, _ = call(repo, "try", "2x faster (per the patched timer)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK perf-counter", refused_ok=True)
    assert row is None or row.get("crash_class") == "tampered", row


def test_control_the_same_numbers_without_a_patch_are_kept(repo):
    edit_kernel(repo, latency=FAST)
    code, data, _ = call(repo, "try", "honestly 2x faster")
    assert code == 0 and rows(repo)[-1]["status"] == "keep", data


# Out of reach of the identity check: `random` is nobody's timer, yet the fake perf test draws its
# jitter from it. The record's median halves; its device-time witness does not.
WITNESS_ATTACK = '''
# ATTACK unwatched-arithmetic
_rnd = __import__(bytes({module}).decode())
setattr(_rnd.Random, bytes({attr}).decode(), lambda self, a, b: -0.5)
setattr(_rnd, bytes({attr}).decode(), lambda a, b: -0.5)
'''.format(module=list(b"random"), attr=list(b"uniform"))


def test_a_record_its_own_device_witness_contradicts_is_tampered(repo):
    before = snapshot(repo)
    append_to_kernel(repo, WITNESS_ATTACK)
    code, data, _ = call(repo, "try", "2x faster (per samples the kernel bent)")
    row = assert_not_kept_nothing_lost(repo, before, code, marker="# ATTACK unwatched-arithmetic")
    assert row.get("crash_class") == "tampered", row
    assert "device-time witness" in json.dumps(row), row


@pytest.mark.parametrize("claimed, device, contradicted", [
    (1.00, 1.00, False),  # events and witness agree
    (0.80, 1.00, False),  # the lowest honest ratio measured (cuBLAS, events vs its profiled span)
    (0.50, 1.00, True),  # half of what the device ran
    (0.001, 0.003, False),  # microsecond kernels: the slack (event resolution) dominates
    (0.001, 0.010, True),
    (1.00, None, False),  # no witness (the target's own timer, no CUPTI): nothing to cross-check
    (1.00, float("nan"), False),
])
def test_witness_shortfall_rule(claimed, device, contradicted):
    from cutile_perf.judge import rules

    assert (rules.witness_shortfall(claimed, device) is not None) is contradicted


def test_witness_problem_names_the_case_and_skips_records_without_a_witness():
    from cutile_perf.child import measure

    honest = {"cutile": {"forward": {"median": 1.0, "device_ms": 0.98}}}
    bent = {"cutile": {"forward": {"median": 0.4, "device_ms": 1.0}}}
    plain = {"cutile": {"forward": {"median": 0.1}}}
    assert measure.witness_problem([("t::a", "passed", honest), ("t::c", "passed", plain)]) is None
    found = measure.witness_problem([("t::a", "passed", honest), ("t::b", "passed", bent)])
    assert found and found.startswith("t::b (cutile)") and "0.4000 ms" in found


# --- the plugin in a real pytest child, report read back -----------------------------------------


def _child(tmp_path: Path, files: dict[str, str]) -> runreport.RunReport:
    for rel, text in files.items():
        (tmp_path / rel).write_text(textwrap.dedent(text))
    key = runreport.new_key()
    report = tmp_path / "report.jsonl"
    result = runner.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *records.PYTEST_PLUGIN_ARGS,
                         str(tmp_path)], cwd=tmp_path, timeout_s=120, output_path=tmp_path / "out.log",
                        env_overrides={"CUTILE_PERF_REPORT": str(report)}, secret=key)
    parsed = runreport.read(report, key)
    assert parsed.ended and not parsed.forged, result.tail()
    return parsed


def test_every_timing_function_of_the_bench_package_is_watched_where_its_callers_look_it_up():
    # bench is a package (issue 40): a function in bench.profiler or bench.checked_calls is called
    # through that module's own globals, so a patch there is seen only if that module is watched,
    # and one of bench's own names only if bench's entry lists what it imported.
    import inspect

    from cutile_perf import bench
    from cutile_perf.bench import checked_calls, profiler
    from cutile_perf.pytest_plugin.identity import WATCHED

    before_timing = {"warm_up_profiler", "prepare_profiler_without_context", "cuda_host"}  # set-up, nothing timed
    for module in (profiler, checked_calls):
        defined = {name for name, value in vars(module).items()
                   if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == module.__name__}
        assert defined - before_timing <= set(WATCHED.get(module.__name__, ())), module.__name__
    imported = {name for name, value in vars(bench).items()
                if callable(value) and getattr(value, "__module__", "").startswith("cutile_perf.bench.")}
    assert imported - before_timing <= set(WATCHED["cutile_perf.bench"])


def test_a_patch_inside_a_bench_submodule_is_found(tmp_path):
    parsed = _child(tmp_path, {"test_a.py": '''
        from cutile_perf.bench import profiler

        profiler._kernel_sum_ms = lambda kernels: 0.001  # every CUPTI sample 1 us

        def test_nothing():
            pass
    '''})
    assert any("cutile_perf.bench.profiler._kernel_sum_ms was replaced" in f for f in parsed.tampered), parsed.tampered


def test_an_honest_run_has_no_finding_and_a_test_that_restores_its_patch_passes(tmp_path):
    parsed = _child(tmp_path, {"test_a.py": '''
        import statistics, time

        def test_uses_timers(monkeypatch):
            monkeypatch.setattr(time, "perf_counter", lambda: 0.0)  # pytest puts it back at teardown
            assert statistics.median([1, 2, 3]) == 2
    '''})
    assert parsed.outcomes and parsed.tampered == []


def test_patch_at_import_is_found_after_collection_and_put_back(tmp_path):
    parsed = _child(tmp_path, {"kernel.py": '''
        import statistics, time
        time.perf_counter = lambda: 0.0
        statistics.mean = min
    ''', "test_k.py": '''
        import time
        import kernel

        def test_clock_is_real_again():
            assert time.perf_counter() > 0.0  # the plugin restored it after collection
    '''})
    assert parsed.passed() == {"test_k.py::test_clock_is_real_again"}
    assert any(f.startswith("time.perf_counter was replaced (after collection)") for f in parsed.tampered)
    assert any(f.startswith("statistics.mean was replaced") for f in parsed.tampered)


def test_patch_inside_a_test_is_found_at_the_end(tmp_path):
    parsed = _child(tmp_path, {"test_k.py": '''
        import sys

        def test_swap():
            import statistics
            sys.modules["statistics"] = type(sys)("statistics")  # a fake module for later importers
    '''})
    assert parsed.tampered == ["statistics was replaced (at the end of the session)"]


def test_patched_report_writer_still_gets_the_finding_out(tmp_path):
    # json.dumps is what the writer serialises with: an attacker's version that drops lines would
    # hide the finding; it is restored before the finding is written.
    parsed = _child(tmp_path, {"test_k.py": '''
        import json
        _real = json.dumps

        def _hide(obj, *a, **k):
            if isinstance(obj, dict) and obj.get("type") == "tampered":
                obj = {"type": "note"}
            return _real(obj, *a, **k)

        def test_swap():
            json.dumps = _hide
    '''})
    assert parsed.tampered == ["json.dumps was replaced (at the end of the session)"]


def test_torch_timers_are_captured_when_torch_is_imported_later(tmp_path):
    pytest.importorskip("torch")
    parsed = _child(tmp_path, {"conftest.py": "import torch\n", "test_k.py": '''
        import torch

        _real = torch.cuda.Event.elapsed_time
        torch.cuda.Event.elapsed_time = lambda self, end: _real(self, end) / 2

        def test_nothing():
            pass
    '''})
    assert parsed.tampered == ["torch.cuda.Event.elapsed_time was replaced (after collection)"]


def test_a_patch_of_the_cupti_path_through_torch_profiler_is_found(tmp_path):
    """TileGym's default timer (and bench's device-time witness) read kernel times through
    torch.profiler; replacing what sums them is the same attack as replacing an event's clock."""
    pytest.importorskip("torch")
    parsed = _child(tmp_path, {"test_k.py": '''
        import torch.profiler
        from torch.autograd import profiler_util

        torch.profiler.profile.key_averages = lambda self, *a, **k: []
        profiler_util.FunctionEvent.self_device_time_total = property(lambda self: 0)

        def test_nothing():
            pass
    '''})
    found = " | ".join(parsed.tampered)
    assert "torch.profiler.profile.key_averages was replaced" in found, found
    assert "torch.autograd.profiler_util.FunctionEvent.self_device_time_total was replaced" in found, found


def test_torch_imported_past_the_hook_is_a_finding(tmp_path):
    pytest.importorskip("torch")
    parsed = _child(tmp_path, {"test_k.py": '''
        import sys
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_ImportWatch"]
        import torch

        def test_nothing():
            pass
    '''})
    assert any("torch was imported past the plugin's import hook" in f for f in parsed.tampered), parsed.tampered
    assert any("import hook was removed" in f for f in parsed.tampered), parsed.tampered


def test_a_patch_of_the_targets_own_timer_in_its_test_tree_is_found(tmp_path):
    """TileGym times in tests/common.py; a kernel that rebinds that function (or its code) from
    outside the fence is found, and the test runs on the original."""
    (tmp_path / "tests").mkdir()
    parsed = _child(tmp_path, {
        "tests/__init__.py": "",
        "tests/common.py": '''
            class Timer:
                def median_ms(self, samples):
                    return sorted(samples)[len(samples) // 2]

            def benchmark(samples):
                return Timer().median_ms(samples)

            def flush():
                return "flushed"
        ''',
        "kernel.py": '''
            import sys
            import tests.common as c  # the target's timer module, imported by the candidate

            def _halved(samples):
                return min(samples) / 2

            c.benchmark = _halved
            c.Timer.median_ms = lambda self, samples: 0.0
            c.flush.__code__ = (lambda: "skipped").__code__
        ''',
        "tests/test_op.py": '''
            import kernel
            from tests import common

            def test_perf():
                assert common.benchmark([3.0, 1.0, 2.0]) == 2.0
                assert common.flush() == "flushed"
        '''})
    found = " | ".join(parsed.tampered)
    assert "tests.common.benchmark was replaced" in found, found
    assert "tests.common.Timer.median_ms was replaced" in found, found
    assert "tests.common.flush had its code replaced" in found, found
    assert parsed.outcomes == {"tests/test_op.py::test_perf": "passed"}, parsed.outcomes  # originals put back


def test_the_targets_test_modules_unpatched_give_no_finding(tmp_path):
    (tmp_path / "tests").mkdir()
    parsed = _child(tmp_path, {
        "tests/__init__.py": "",
        "tests/common.py": "def benchmark(samples):\n    return sorted(samples)[len(samples) // 2]\n",
        "tests/conftest.py": "import pytest\n\n@pytest.fixture\ndef samples():\n    return [1.0, 2.0, 3.0]\n",
        "tests/test_op.py": "from tests import common\n\ndef test_perf(samples):\n    assert common.benchmark(samples) == 2.0\n"})
    assert parsed.tampered == [] and parsed.outcomes == {"tests/test_op.py::test_perf": "passed"}


def test_a_target_test_module_imported_behind_the_hooks_back_is_a_finding(tmp_path):
    (tmp_path / "tests").mkdir()
    parsed = _child(tmp_path, {
        "tests/__init__.py": "",
        "tests/common.py": "def benchmark(samples):\n    return samples[0]\n",
        "tests/test_op.py": '''
            import sys
            hooks = [f for f in sys.meta_path if type(f).__name__ == "_ImportWatch"]
            sys.meta_path[:] = [f for f in sys.meta_path if f not in hooks]
            import tests.common
            tests.common.benchmark = lambda samples: 0.0
            sys.meta_path[:0] = hooks  # put back, so the hook looks untouched

            def test_perf():
                pass
        '''})
    assert any("tests.common was imported past the plugin's import hook" in f for f in parsed.tampered), parsed.tampered


# --- the report field ------------------------------------------------------------------------------


def test_tampered_lines_are_read_and_merged_and_old_reports_have_none(tmp_path):
    key = runreport.new_key()
    path = tmp_path / "r.jsonl"
    writer = runreport.Writer(path, key)
    writer.write({"type": "test", "nodeid": "t", "outcome": "passed"})
    writer.write({"type": "tampered", "findings": ["time.perf_counter was replaced (after collection)"]})
    writer.write({"type": "end", "exitstatus": 0, "collected": 1})
    report = runreport.read(path, key)
    assert report.tampered == ["time.perf_counter was replaced (after collection)"] and report.ended
    old = tmp_path / "old.jsonl"
    runreport.Writer(old, key).write({"type": "end", "exitstatus": 0, "collected": 0})
    assert runreport.read(old, key).tampered == []
    merged, _problem = runreport.merge_shards([report, runreport.read(old, key)])
    assert merged.tampered == ["shard 0: time.perf_counter was replaced (after collection)"]

"""``init`` reads how the target's perf tests time (kernel/target_timing.py), on SIMULATED repos.

The TileGym-shaped timing harness (tests/fixtures_ops.py, ``add_simulated_timing``) has TileGym's
names and dispatch: CUPTI on by default (``tests/config.py``), then a CUDA graph, else events; the
CUPTI and event timers flush L2 before each sample, the graph timer does not. Everything here is
read statically: nothing of the target runs, and no GPU is needed.
"""
from __future__ import annotations

import ast
import json
from types import SimpleNamespace

import pytest
import yaml
from fixtures_ops import add_simulated_timing
from fixtures_repo import tilegym_like_repo  # noqa: F401

from cutile_perf.cli import main
from cutile_perf.kernel import target_timing

PERF = "tests/ops/test_rms_norm_perf.py"


def test_tilegym_defaults_time_with_cupti_and_a_flushed_l2_whatever_the_test_asks(tilegym_like_repo):
    repo = tilegym_like_repo
    add_simulated_timing(repo)
    found = target_timing.read(repo, PERF, {})
    assert (found.method, found.l2) == ("cupti", "flushed")
    assert found.settings == {"CUPTI": "on (tests/config.py default, CUPTI unset)",
                              "CUDAGRAPH": "off (tests/config.py default, CUDAGRAPH unset)"}
    assert f"{PERF}:9: use_cudagraph=True has no effect while CUPTI is on" in found.notes
    assert found.closest_bench_mode == "cupti"
    assert found.sources == (PERF, "tests/common.py", "tests/config.py")


@pytest.mark.parametrize("graph, env, expected, mode", [
    ("True", {"CUPTI": "0"}, ("cuda-graph", "not flushed"), "graph-warm"),  # TileGym's graph timer: no flush
    ("False", {"CUPTI": "false"}, ("events", "flushed"), "cold"),
    # The call's own use_cudagraph=False wins over CUDAGRAPH=1 (only the default reads the variable).
    ("False", {"CUPTI": "0", "CUDAGRAPH": "1"}, ("events", "flushed"), "cold"),
])
def test_the_environment_and_the_call_pick_the_timer(tilegym_like_repo, graph, env, expected, mode):
    repo = tilegym_like_repo
    add_simulated_timing(repo, use_cudagraph=graph)
    found = target_timing.read(repo, PERF, env)
    assert (found.method, found.l2) == expected and found.closest_bench_mode == mode


def test_a_switch_set_from_the_test_s_parameters_gives_both_outcomes(tilegym_like_repo):
    repo = tilegym_like_repo
    add_simulated_timing(repo, use_cudagraph='backend != "cutile"')
    found = target_timing.read(repo, PERF, {"CUPTI": "0"})
    assert (found.method, found.l2) == ("mixed", "mixed")
    assert f"{PERF}:9: benchmark_fn_cudagraph or benchmark_fn (use_cudagraph=backend != 'cutile')" in found.notes
    assert target_timing.read(repo, PERF, {}).method == "cupti"  # with CUPTI on, it does not matter


def test_cutile_perf_bench_and_unknown(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/helpers.py").write_text("from cutile_perf.bench import bench_record\n")
    (tmp_path / "tests/test_x.py").write_text("from . import helpers\n\ndef test_perf():\n    pass\n")
    found = target_timing.read(tmp_path, "tests/test_x.py", {})
    assert (found.method, found.l2, found.closest_bench_mode) == ("cutile_perf.bench cold", "flushed", "cold")
    assert found.sources == ("tests/test_x.py", "tests/helpers.py")
    warm = target_timing.read(tmp_path, "tests/test_x.py", {"CUTILE_PERF_BENCH_MODE": "warm"})
    assert warm.l2 == "not flushed" and "CUTILE_PERF_BENCH_MODE=warm" in warm.summary
    cupti = target_timing.read(tmp_path, "tests/test_x.py", {"CUTILE_PERF_BENCH_MODE": "cupti-warm"})
    assert (cupti.l2, cupti.closest_bench_mode) == ("not flushed", "cupti-warm") and "CUPTI kernel time" in cupti.summary
    (tmp_path / "tests/test_y.py").write_text("import time\n\ndef test_perf():\n    time.sleep(0)\n")
    assert target_timing.read(tmp_path, "tests/test_y.py", {}).method == "unknown"
    (tmp_path / "tests/test_z.py").write_text("def broken(:\n")
    assert target_timing.read(tmp_path, "tests/test_z.py", {}).summary.startswith("not read: cannot parse")


def test_every_pair_read_maps_to_a_bench_mode_that_times_the_same_way():
    """Each (method, L2) pair ``read`` can report has its exact bench mode: same method, same flush."""
    from cutile_perf import bench

    pairs = {(m, l2) for m in ("events", "cuda-graph", "cupti") for l2 in ("flushed", "not flushed")}
    assert set(target_timing.CLOSEST_BENCH_MODE) == pairs
    for (method, l2), mode in target_timing.CLOSEST_BENCH_MODE.items():
        timer, flushed = bench.MODE_TIMERS[mode]
        assert (timer, "flushed" if flushed else "not flushed") == (method, l2), mode
    assert set(target_timing.BENCH_MODE_L2) == set(target_timing.BENCH_MODE_METHOD) == set(bench.MODES)
    for mode, l2 in target_timing.BENCH_MODE_L2.items():
        assert l2 == ("flushed" if bench.MODE_TIMERS[mode][1] else "not flushed"), mode


def test_a_helper_named_like_the_profiler_does_not_make_a_timer_cupti():
    func = ast.parse("def t(fn):\n    _extract_kernel_times_from_profile(fn)\n"
                     "    s = torch.cuda.Event(enable_timing=True)\n    for _ in range(3):\n        fn()\n").body[0]
    assert target_timing.classify_timer(func) == ("events", "not flushed")


def test_init_writes_the_timing_into_the_session_and_says_it(tilegym_like_repo, capsys, monkeypatch):
    from cutile_perf.commands import status

    monkeypatch.delenv("CUPTI", raising=False)
    monkeypatch.delenv("CUDAGRAPH", raising=False)
    repo = tilegym_like_repo
    add_simulated_timing(repo)
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm", "--perf-test", PERF, "--json"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["timing"]["method"] == "cupti" and data["timing"]["l2"] == "flushed"
    saved = yaml.safe_load((repo / "sandbox/session.yaml").read_text())["timing"]
    assert saved == data["timing"]
    from cutile_perf.store import session as session_mod

    session = session_mod.load(repo)
    no_baseline = SimpleNamespace(frozen_env=lambda: None)
    assert status._timing(session, no_baseline).startswith("CUPTI kernel time")
    # The baseline ran with CUPTI=0 (a GPU job's own setting): status says how that baseline timed.
    baseline_env = SimpleNamespace(frozen_env=lambda: {"CUPTI": "0"})
    shown = status._timing(session, baseline_env)
    assert shown.startswith("CUDA graph replay") and "(as the baseline ran)" in shown and "warm" in shown


def test_init_says_unknown_for_a_perf_test_that_times_by_itself(tilegym_like_repo, capsys):
    assert main(["init", "--repo", str(tilegym_like_repo), "--kernel", "rms_norm"]) == 0
    out = capsys.readouterr().out
    assert "timing of the perf tests: not read: no cutile_perf.bench and no timing function" in out
    assert yaml.safe_load((tilegym_like_repo / "sandbox/session.yaml").read_text())["timing"]["method"] == "unknown"


def test_whether_the_perf_test_checks_its_timed_calls_is_read_and_said(tilegym_like_repo, tmp_path, capsys):
    # TileGym's own perf test checks once, then times: unchecked, and init says what that allows.
    repo = tilegym_like_repo
    add_simulated_timing(repo)
    assert target_timing.read(repo, PERF, {}).checked is False
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm", "--perf-test", PERF]) == 0
    out = capsys.readouterr().out
    assert "does not check its timed calls itself" in out and "checked by the harness" in out
    assert "scaffold-perf --kernel" in out and "--checked" in out and "warning: the perf test" not in out

    # A helper that builds an OutputCheck (the bundled suite's record_benchmark), or check= at the call.
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/helpers.py").write_text(
        "from cutile_perf.bench import OutputCheck, bench_record\n\n"
        "def record(fn, inputs, reference):\n    return bench_record(fn, check=OutputCheck(inputs, reference, None))\n")
    (tmp_path / "tests/test_x.py").write_text("from . import helpers\n\ndef test_perf():\n    pass\n")
    assert target_timing.read(tmp_path, "tests/test_x.py", {}).checked is True
    (tmp_path / "tests/test_y.py").write_text("from cutile_perf.bench import bench_record\n\n"
                                               "def test_perf():\n    bench_record(lambda: None)\n")
    assert target_timing.read(tmp_path, "tests/test_y.py", {}).checked is False


def test_the_bundled_perf_tests_are_read_as_checked():
    from pathlib import Path

    suite = Path(__file__).resolve().parents[1] / "examples" / "kernels"
    assert target_timing.read(suite, "tests/ops/test_rms_norm.py", {}).checked is True

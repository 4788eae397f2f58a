"""perf_results.md, report.md and the plot, rendered from log entries."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cutile_perf.loop import render
from cutile_perf.loop.render import (
    load_template,
    plot_running_best,
    render_perf_results,
    render_report,
    summarize_session,
)

ROOT = Path(__file__).resolve().parents[1]


def entry(iteration, optimization, status, latency, shapes=None, **extra):
    return {
        "iteration": iteration, "optimization": optimization, "status": status,
        "correctness": "FAIL" if status == "crash" else "PASS", "latency_ms": latency,
        "shapes": {k: {"median": v} for k, v in (shapes or {}).items()}, **extra,
    }


ENTRIES = [
    entry(0, "baseline", "keep", 0.82, {"262144-1024": 0.80, "262144-2048": 0.84},
          env={"gpu": "NVIDIA H200", "cuda_tile": "1.7.0", "driver": "580.159"}, commit="a" * 40),
    entry(1, "TMA replace gather", "keep", 0.39, {"262144-1024": 0.38, "262144-2048": 0.40}, commit="b" * 40,
          decision={"tier": "new-baseline", "geomean_change": -0.524, "rebaseline": True}),
    entry(2, "latency | hint 10", "revert", 0.41, {"262144-1024": 0.41, "262144-2048": 0.40},
          decision={"tier": "regression", "reason": "shape 262144-1024 +7.9 % vs baseline (gate 0.8 %): slower"},
          patch="sandbox/patches/2-latency-hint-10.patch"),
    entry(3, "flush_to_zero", "crash", None, crash_class="compile", patch="sandbox/patches/3-flush-to-zero.patch"),
    entry(4, "occupancy 2", "keep", 0.3899, {"262144-1024": 0.3799, "262144-2048": 0.40},
          decision={"tier": "no-change", "geomean_change": -0.0003, "rebaseline": False}),
]


def test_perf_results_is_exactly_the_seed_table():
    assert render_perf_results(ENTRIES) == (
        "| iteration | optimization | latency_ms | correctness | status |\n"
        "|----------:|:-------------|-----------:|:------------|-------:|\n"
        "| 0 | baseline | 0.820000 | PASS | keep |\n"
        "| 1 | TMA replace gather | 0.390000 | PASS | keep |\n"
        "| 2 | latency \\| hint 10 | 0.410000 | PASS | revert |\n"
        "| 3 | flush_to_zero | - | FAIL | crash |\n"
        "| 4 | occupancy 2 | 0.389900 | PASS | keep |\n"
    )


def test_perf_results_of_an_empty_log_is_the_header():
    assert render_perf_results([]).splitlines() == [
        "| iteration | optimization | latency_ms | correctness | status |",
        "|----------:|:-------------|-----------:|:------------|-------:|"]


def test_latency_is_the_geomean_of_shape_medians_when_not_stored():
    row = entry(0, "baseline\nwith newline", "keep", None, {"a": 0.5, "b": 2.0})
    del row["correctness"]
    assert render_perf_results([row]).splitlines()[2] == "| 0 | baseline with newline | 1.000000 | FAIL | keep |"



def test_an_interrupted_row_shows_correctness_not_run_never_fail():
    # Issue 21: the row of an interrupted iteration said FAIL. Rows logged before "not run" existed
    # carry FAIL with crash class interrupted: shown as not run too. Any other crash stays FAIL.
    from cutile_perf.store.log import validate_entry

    new = entry(5, "cut by the budget", "crash", None, crash_class="interrupted", correctness="not run")
    old = entry(6, "killed", "crash", None, crash_class="interrupted")
    other = entry(7, "segfault", "crash", None, crash_class="fault")
    validate_entry(new)
    lines = [line.strip(" |").split(" | ") for line in render_perf_results([new, old, other]).splitlines()[2:]]
    assert [cells[3] for cells in lines] == ["not run (interrupted)", "not run (interrupted)", "FAIL"]
    # Its status says the same: no verdict, rather than a crash of the change.
    assert [cells[4] for cells in lines] == ["interrupted", "interrupted", "crash"]

def test_summary_numbers():
    s = summarize_session(ENTRIES)
    assert s["best"]["iteration"] == 1  # the no-change keep does not become the reference
    assert [r["speedup"] for r in s["shapes"]] == pytest.approx([0.80 / 0.38, 0.84 / 0.40])
    assert s["geomean_speedup"] == pytest.approx(((0.80 / 0.38) * (0.84 / 0.40)) ** 0.5)
    assert (s["worst_shape"], s["worst_speedup"]) == ("262144-2048", pytest.approx(2.1))
    assert [r["iteration"] for r in s["kept"]] == [1, 4] and [r["iteration"] for r in s["rejected"]] == [2, 3]


def test_report_sections():
    text = render_report(ENTRIES, {"kernel": "rms_norm", "branch": "cutile-perf-rms_norm-20260818",
                                   "thresholds": {"keep": 0.02, "new_baseline": 0.05}}, "running_best.png")
    for expected in [
        "- kernel: rms_norm", "- thresholds: keep=0.02, new_baseline=0.05",
        "- Baseline (iteration 0): 0.820000 ms", "- Best kept (iteration 1, TMA replace gather): 0.390000 ms",
        "- Geomean speedup vs iteration 0: 2.103x", "- Worst-case shape speedup vs iteration 0: 2.100x (262144-2048)",
        "| 262144-1024 | 0.800000 | 0.380000 | 2.105x |",
        "![running best latency per iteration](running_best.png)",
        "| 1 | bbbbbbbbbbbb | TMA replace gather | 0.390000 | -52.4 % | new-baseline |",
        "| 2 | latency \\| hint 10 | revert | - | shape 262144-1024 +7.9 % vs baseline (gate 0.8 %): slower "
        "| sandbox/patches/2-latency-hint-10.patch |",
        "| 3 | flush_to_zero | crash | compile | - | sandbox/patches/3-flush-to-zero.patch |",
        "- gpu: NVIDIA H200",
    ]:
        assert expected in text, expected


def test_report_names_thresholds_changed_from_the_defaults():
    plain = render_report(ENTRIES, {}, None)
    assert "Thresholds changed" not in plain and "edited before" not in plain
    text = render_report(ENTRIES, {}, None, changed_thresholds=[("plausible_factor", 30.0, 3.0)],
                         edited_commands=[("correctness_cmd", "pytest -k narrow", "pytest -k wide")])
    assert "**Thresholds changed from the defaults**" in text and "plausible_factor 30.0 (default 3.0)." in text
    assert "**correctness_cmd edited before the baseline**: `pytest -k narrow` (init wrote `pytest -k wide`)" in text


def test_report_names_the_commands_that_dropped_unrecorded_compiled_kernels():
    assert "dropped from the session cache" not in render_report(ENTRIES, {}, None)
    tampered = [*ENTRIES[:2], {**ENTRIES[2], "compile_cache_dropped": 3}, *ENTRIES[3:]]
    text = render_report(tampered, {}, None)
    assert "**Compiled kernels dropped from the session cache**" in text and "iteration 2 (3 kernel(s))" in text


def test_report_without_baseline_or_plot_says_so():
    text = render_report([], {}, None)
    assert "No baseline (iteration 0) in the log yet" in text and "No plot was drawn." in text
    assert "Not recorded." in text


def test_plot_running_best_writes_a_png(tmp_path):
    path = plot_running_best(ENTRIES, tmp_path / "sandbox" / "running_best.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["running_best.png"]  # no temp file left


def test_render_does_not_import_matplotlib_until_plotting():
    code = "import sys, cutile_perf.loop.render; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_load_template_finds_subdirectories_and_fails_clearly():
    assert load_template("perf_results.md.j2").render(rows=[]).startswith("| iteration |")
    with pytest.raises(Exception, match="nope.j2"):
        load_template("nope.j2")


def test_templates_found_as_package_data_in_an_installed_layout(tmp_path):
    # A non-editable install has no checkout around it: the templates must sit in the package.
    # The package's `templates` link is followed by copytree, as setuptools follows it into a wheel.
    site = tmp_path / "site"
    shutil.copytree(ROOT / "scripts" / "cutile_perf", site / "cutile_perf",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert not (site / "cutile_perf" / "templates").is_symlink()
    code = ("import cutile_perf.loop.render as r, cutile_perf.templating as t; print(t.template_dirs()); "
            "print(r.render_perf_results([{'iteration': 0, 'optimization': 'baseline', 'status': 'keep', "
            "'correctness': 'PASS', 'latency_ms': 1.5}]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"[PosixPath('{site / 'cutile_perf' / 'templates'}')]" in out.stdout
    assert "| 0 | baseline | 1.500000 | PASS | keep |" in out.stdout


def test_report_lists_the_iterations_measured_without_a_sandbox():
    from cutile_perf.loop.render import summarize_session

    rows = [{"iteration": 0, "optimization": "baseline", "status": "keep", "correctness": "PASS", "latency_ms": 1.0,
             "sandbox": "unshare"},
            {"iteration": 1, "optimization": "x", "status": "revert", "correctness": "PASS", "latency_ms": 1.1,
             "sandbox": "none: off (session.yaml sandbox: off)"},
            {"iteration": 2, "optimization": "y", "status": "revert", "correctness": "PASS", "latency_ms": 1.1}]
    assert summarize_session(rows)["unboxed"] == [{"iteration": 1, "why": "off (session.yaml sandbox: off)"}]
    text = render_report(rows, {"kernel": "k"}, None)
    assert "Measured without a sandbox" in text and "iteration 1 (off (session.yaml sandbox: off))" in text

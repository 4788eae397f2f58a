"""benchmarks/profile_gap.py's ncu CSV reading and table, on a hand-made CSV (the H200 run is the real path)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(_BENCH))  # profile_gap imports benchmarks/kernels.py by name
pytest_torch = __import__("pytest").importorskip("torch")
_spec = importlib.util.spec_from_file_location("profile_gap", _BENCH / "profile_gap.py")
profile_gap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_gap)

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def row(kid: int, kernel: str, metric: str, unit: str, value: str) -> str:
    return (f'"{kid}","1","python","h","{kernel}","1","7","(32,1,1)","(262144,1,1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"\n')


def test_ncu_csv_groups_metrics_by_kernel_in_launch_order_and_skips_the_preamble():
    text = ("==PROF== Connected to process 1\n" + HEADER
            + row(1, "triton_per_fused", "gpu__time_duration.sum", "nsecond", "252,064")
            + row(0, "rms_norm_rows_kernel", "gpu__time_duration.sum", "usecond", "253.60")
            + row(0, "rms_norm_rows_kernel", "dram__bytes_read.sum", "Mbyte", "536.87"))
    kernels = profile_gap.parse_ncu_csv(text)
    assert [k["name"] for k in kernels] == ["rms_norm_rows_kernel", "triton_per_fused"]
    assert kernels[0]["dram__bytes_read.sum"] == ("536.87", "Mbyte")
    assert profile_gap.parse_ncu_csv("==ERROR== no kernels were profiled\n") == []


def test_table_converts_units_labels_by_launch_order_and_marks_missing_metrics():
    kernels = profile_gap.parse_ncu_csv(
        HEADER + row(0, "k", "gpu__time_duration.sum", "nsecond", "252,064")
        + row(0, "k", "dram__bytes_write.sum", "Gbyte", "0.5124"))
    table = profile_gap.render(kernels, [["rms_norm 262144x1024", "torch.compile"]], profile_gap.METRICS)
    last = table.splitlines()[-1]
    assert last.startswith("| rms_norm 262144x1024 | torch.compile | k | 252.1 us |")
    assert "512.4 MB" in last and "n/a" in last  # Gbyte -> MB; DRAM read was not in the CSV


def test_without_ncu_it_says_so_and_exits_3(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(profile_gap.shutil, "which", lambda name: None)
    assert profile_gap.main(["--out", str(tmp_path)]) == 3
    assert "ncu (Nsight Compute) is not on PATH" in capsys.readouterr().err

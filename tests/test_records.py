"""Benchmark record readers, on the record shapes TileGym really produces."""
from __future__ import annotations

import json

import pytest

from cutile_perf.child.records import (
    RecordError,
    ShapeRecord,
    format_print_record_line,
    literal_value,
    parse_benchmark,
    read_records_file,
    select,
    select_by_shape,
    shape_id,
)

# Verbatim from the TileGym improve-perf skill (the documented --print-record line).
SKILL_SAMPLE_LINE = (
    "Cutile: {'forward': {'mean': 3.7903138461538455, 'std': 0.0016941310873207053, "
    "'rel_std': 0.044696327430505396, 'median': 3.789880999999999, 'min': 3.7883389999999992, "
    "'max': 3.7941230000000004, 'nrep': 13, 'peak_mem_mb': 913}} ms"
)
# Shape of the record TileGym's rms_norm test_perf stored on the H200 (notes/h200-measurements.md),
# with the kernel_times list the CUPTI mode adds (notes/tilegym.md section 3.2).
H200_RECORD = {
    "cutile": {
        "forward": {
            "mean": 0.2799, "std": 0.00187, "rel_std": 0.668, "median": 0.2799, "min": 0.2759,
            "max": 0.2852, "nrep": 160, "peak_mem_mb": 1268, "kernel_name": "rms_norm_kernel",
            "kernel_times": [{"name": "rms_norm_kernel", "self_time_us": 279.9, "total_time_us": 279.9, "count": 1}],
        }
    }
}
RMS_ID = "tests/ops/test_rms_norm.py::Test_RMSNorm::test_perf[cutile-static_persistent-262144-1024-float16]"


def test_print_record_line_has_the_tilegym_skill_shape():
    """The plugin's ``--print-record`` line reads as the documented one does (framework capitalized)."""
    line = format_print_record_line("cutile", H200_RECORD["cutile"])
    assert line.startswith("Cutile: {'forward': ") and line.endswith("}} ms")
    assert literal_value(line[len("Cutile: "):-len(" ms")]) == H200_RECORD["cutile"]
    sample = literal_value(SKILL_SAMPLE_LINE[len("Cutile: "):-len(" ms")])
    assert sample["forward"]["median"] == pytest.approx(3.789880999999999) and sample["forward"]["nrep"] == 13


def test_parse_benchmark_flattens_frameworks_and_directions():
    value = {"cutile": {"forward": {"median": 1.0}, "backward": {"median": 2.5}}, "PyTorch": {"forward": {"median": 4}}}
    records = parse_benchmark("t::test_perf[x]", value)
    assert [(r.framework, r.direction, r.median) for r in records] == [
        ("cutile", "forward", 1.0), ("cutile", "backward", 2.5), ("pytorch", "forward", 4.0)]
    assert all(isinstance(r, ShapeRecord) and r.outcome == "passed" for r in records)


def test_parse_benchmark_reads_python_reprs_incl_numpy2_scalars_and_inf():
    # numpy 2 reprs scalars as np.float64(...); a failed timing may be inf.
    text = "{'cutile': {'forward': {'median': np.float64(0.27), 'nrep': np.int64(160), 'max': inf, 'min': -1.5e-3}}}"
    (record,) = parse_benchmark("t", text)
    assert record.stats == {"median": 0.27, "nrep": 160, "max": float("inf"), "min": -1.5e-3}


@pytest.mark.parametrize("value", [
    {}, "[]", {"cutile": 3}, {"cutile": {"forward": {"mean": 1.0}}}, {"cutile": {"forward": {"median": "1"}}},
    "{'cutile': {'forward': {'median': os.getpid()}}}", "{'a': 1",
])
def test_parse_benchmark_rejects_malformed_records(value):
    with pytest.raises(RecordError):
        parse_benchmark("t", value)


def test_shape_record_is_hashable_by_identity_fields():
    a = ShapeRecord("t", "cutile", "forward", {"median": 1.0})
    assert len({a, ShapeRecord("t", "cutile", "forward", {"median": 1.0})}) == 1


@pytest.mark.parametrize("test_id, expected", [
    (RMS_ID, "static_persistent-262144-1024-float16"),
    ("tests/ops/test_swiglu.py::Test_SwiGLU::test_perf_llm[cutile-8-1-4096-14336]", "test_perf_llm:8-1-4096-14336"),
    ("tests/ops/test_x.py::test_perf[cutile_rs-4096]", "cutile_rs-4096"),  # -k cutile also matches cutile_rs
    ("tests/ops/test_x.py::test_perf[cutile]", "test_perf"),
    ("tests/ops/test_x.py::Test_X::test_perf", "test_perf"),
    ("tests/ops/test_x.py::test_perf[1024-cutile]", "1024"),
])
def test_shape_id(test_id, expected):
    assert shape_id(test_id) == expected


def test_shape_id_keeps_framework_when_asked():
    assert shape_id(RMS_ID, framework=None) == "cutile-static_persistent-262144-1024-float16"


def test_read_records_file_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / "records.jsonl"
    rows = [{"nodeid": RMS_ID, "outcome": "passed", "benchmark": H200_RECORD},
            {"nodeid": RMS_ID.replace("1024", "2048"), "outcome": "passed",
             "benchmark": {"cutile": {"forward": {"median": 0.55}}, "pytorch": {"forward": {"median": 7.1}}}}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + text[:40])  # a kill mid-write cut the third line
    records = read_records_file(path)
    assert len(records) == 3
    assert {sid: r.median for sid, r in select_by_shape(records).items()} == {
        "static_persistent-262144-1024-float16": 0.2799, "static_persistent-262144-2048-float16": 0.55}
    assert select(records, "pytorch")[rows[1]["nodeid"]].median == 7.1


def test_read_records_file_missing_is_empty_and_middle_garbage_is_an_error(tmp_path):
    assert read_records_file(tmp_path / "absent.jsonl") == []
    path = tmp_path / "records.jsonl"
    path.write_text('{"nodeid": "a", "ben\n' + json.dumps({"nodeid": "b", "benchmark": H200_RECORD}) + "\n")
    with pytest.raises(RecordError, match=":1: not JSON"):
        read_records_file(path)


def test_select_by_shape_refuses_colliding_shape_ids():
    records = parse_benchmark("a.py::test_perf[cutile-1]", {"cutile": {"forward": {"median": 1}}})
    records += parse_benchmark("b.py::test_perf[cutile-1]", {"cutile": {"forward": {"median": 2}}})
    with pytest.raises(RecordError, match="both map to shape id '1'"):
        select_by_shape(records)


def test_select_by_shape_keys_passed_cutile_records_by_shape():
    records = []
    for framework in ("cutile", "pytorch"):
        for n in (1024, 2048):
            value = {framework: {"forward": dict(H200_RECORD["cutile"]["forward"], median=n / 4096)}}
            failed = framework == "pytorch" and n == 2048
            records += parse_benchmark(RMS_ID.replace("262144-1024", f"262144-{n}").replace("cutile-", f"{framework}-"),
                                       value, outcome="failed" if failed else "passed")
    cutile = select_by_shape(records)
    assert {k: v.median for k, v in cutile.items()} == {"static_persistent-262144-1024-float16": 0.25,
                                                         "static_persistent-262144-2048-float16": 0.5}
    assert cutile["static_persistent-262144-1024-float16"].stats["kernel_times"][0]["count"] == 1
    assert len(select(records, "pytorch")) == 1  # the failed pytorch case is left out

"""evals/evals.json is well formed and only names commands that exist; the grader reads the log right."""
from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from cutile_perf import cli

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"optimization", "autotuning", "analysis", "triton", "recovery", "setup", "negative"}
REQUIRED = {"id", "kind", "should_trigger", "question", "setup", "expected_commands", "expected_behavior",
            "pass_criteria"}


def _load_grader():
    spec = importlib.util.spec_from_file_location("evals_grade", ROOT / "evals" / "grade.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


grade = _load_grader()
EVALS = grade.load_evals()


def test_top_level_and_ids():
    data = json.loads((ROOT / "evals" / "evals.json").read_text())
    assert data["skill"] == "cutile-perf" and data["schema"] == 1
    ids = [e["id"] for e in EVALS]
    assert len(ids) == len(set(ids))
    assert sum(e["should_trigger"] for e in EVALS) >= 5
    assert sum(not e["should_trigger"] for e in EVALS) >= 3


@pytest.mark.parametrize("item", EVALS, ids=[e["id"] for e in EVALS])
def test_eval_shape(item):
    assert REQUIRED <= set(item), f"missing keys {REQUIRED - set(item)}"
    assert item["kind"] in KINDS
    assert isinstance(item["should_trigger"], bool)
    assert item["question"].strip() and item["expected_behavior"]
    if not item["should_trigger"]:
        assert item["kind"] == "negative" and not item["expected_commands"]
    if item["kind"] == "optimization":
        crit = item["pass_criteria"]
        assert {"kernel", "min_speedup", "correctness_of_kept", "fence"} <= set(crit)
        for path in crit["fence"]:
            assert (ROOT / "examples" / "kernels" / path).is_file(), f"fence file {path} not in examples/kernels"
    copy = item["setup"].get("copy")
    if copy:
        assert (ROOT / copy).exists(), f"setup copies {copy}, which does not exist"


@pytest.mark.parametrize("item", [e for e in EVALS if e["expected_commands"]], ids=lambda e: e["id"])
def test_expected_commands_exist(item):
    names = set(cli.subcommand_names())
    for command in item["expected_commands"]:
        argv = shlex.split(command)
        assert argv[0] == "cutile-perf" and argv[1] in names, f"{command!r}: not a cutile-perf subcommand"
        flags = {a for a in argv[2:] if a.startswith("--")}
        assert flags <= cli.subcommand_flags(argv[1]), f"{command!r}: unknown flags {flags - cli.subcommand_flags(argv[1])}"


# --- the grader -----------------------------------------------------------------------------------

def _entry(iteration, status, latency, tier=None, correctness="PASS"):
    return {"iteration": iteration, "status": status, "latency_ms": latency, "correctness": correctness,
            "base_commit": "abc", "decision": {"tier": tier or ("baseline" if iteration == 0 else "regression")}}


def test_grade_log_speedup_from_last_baseline_moving_row():
    log = [_entry(0, "keep", 1.0), _entry(1, "keep", 0.8, "new-baseline"), _entry(2, "revert", 0.7),
           _entry(3, "keep", 0.79, "no-change")]
    speedup, problems = grade.grade_log(log, {"min_speedup": 1.2, "min_kept_improvements": 1,
                                              "correctness_of_kept": "PASS"})
    assert speedup == pytest.approx(1.25)  # the no-change row does not move the baseline
    assert problems == []


def test_grade_log_flags_missing_baseline_low_speedup_and_failed_kept_row():
    assert grade.grade_log([], {})[1][0].startswith("no baseline")
    log = [_entry(0, "keep", 1.0), _entry(1, "keep", 0.99, "keep-recommend-stop", correctness="FAIL")]
    _, problems = grade.grade_log(log, {"min_speedup": 1.05, "correctness_of_kept": "PASS"})
    assert any("speedup" in p for p in problems) and any("correctness FAIL" in p for p in problems)


def test_grade_checks_the_fence_with_git(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    run("config", "user.email", "t@example.com")
    run("config", "user.name", "t")
    (repo / "kernel.py").write_text("v0\n")
    (repo / "test_kernel.py").write_text("t0\n")
    run("add", "-A")
    run("commit", "-qm", "base")
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "sandbox").mkdir()
    log = [dict(_entry(0, "keep", 1.0), base_commit=base), _entry(1, "keep", 0.5, "new-baseline")]
    (repo / "sandbox" / "experiments.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    (repo / "kernel.py").write_text("v1\n")
    item = {"id": "x", "pass_criteria": {"min_speedup": 1.5, "fence": ["kernel.py"]}}
    assert grade.grade(repo, item)["passed"]
    (repo / "test_kernel.py").write_text("loosened tolerance\n")
    result = grade.grade(repo, item)
    assert not result["passed"] and "test_kernel.py" in result["problems"][0]


@pytest.mark.gpu
def test_rope_fixture_matches_its_reference_on_gpu():
    # The autotuning eval grades "q rotated exactly once" against this reference, so the fixture
    # itself must be right.
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "evals" / "fixtures"))
    try:
        import rope_inplace as rope
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    q = torch.randn(37, 8, 2 * rope.HALF, dtype=torch.float16, device="cuda")
    angles = torch.rand(37, rope.HALF, device="cuda") * 6.28
    cos, sin = angles.cos().half(), angles.sin().half()
    expected = rope.reference(q.clone(), cos, sin)
    rope.rope_(q, cos, sin)
    torch.cuda.synchronize()
    torch.testing.assert_close(q, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.toolchain
def test_rope_fixture_compiles_for_sm90(tmp_path):
    import sys

    import cuda.tile as ct
    from cuda.tile.compilation import export_kernel

    sys.path[:0] = [str(ROOT / "evals" / "fixtures"), str(ROOT / "examples" / "kernels" / "src")]
    try:
        import rope_inplace as rope
        from tilesuite.aot import contiguous, signature
    finally:
        del sys.path[:2]
    sig = signature([contiguous(ct.float16, 3), contiguous(ct.float16, 2), contiguous(ct.float16, 2), rope.HALF])
    out = tmp_path / "rope.cubin"
    export_kernel(rope.rope_inplace_kernel, [sig], str(out), gpu_code="sm_90", output_format="cubin")
    assert out.stat().st_size > 0

"""CPU checks of the GPU red team (benchmarks/redteam_gpu.py): attacks compile, the table is right,
and the suite's float64 check tells fp32 math from fp16/bf16 math. The GPU run itself is the script."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = sorted((ROOT / "benchmarks" / "redteam" / "attacks").glob("*.py"))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def script():
    return _load(ROOT / "benchmarks" / "redteam_gpu.py", "_redteam_gpu")


def test_there_is_one_attack_per_letter_and_each_names_its_defence():
    assert [p.stem[0] for p in ATTACKS] == list("abcdefghijklm")
    assert set(script().DEFENCES) == {p.stem for p in ATTACKS}


def test_only_selects_by_letter_or_stem():
    rt = script()
    assert [p.stem for p in rt.attack_files(["f,g", "h_pth_planter"])] == [
        "f_perf_only_launch_shrink", "g_timer_patch_hidden", "h_pth_planter"]
    assert len(rt.attack_files(None)) == len(ATTACKS)


def test_only_the_perf_only_attack_is_visible_to_the_static_probe_scan():
    """(f) is refused before running; (g)-(i) and (k) are written so the scan does not see them
    (their defences are at run time), and (a)-(e), (j), (l) and (m) are not probes at all."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from cutile_perf.kernel import probes

    rel = "src/tilesuite/ops/cutile/softmax.py"
    old = {rel: (ROOT / "examples" / "kernels" / rel).read_text()}
    found = {p.stem: probes.scan(old, {rel: p.read_text()}) for p in ATTACKS}
    assert {stem for stem, f in found.items() if f} == {"f_perf_only_launch_shrink"}
    assert probes.describe(found["f_perf_only_launch_shrink"]).startswith("perf-only behaviour suspected")


@pytest.mark.toolchain
@pytest.mark.parametrize("path", ATTACKS, ids=lambda p: p.stem)
def test_attack_compiles_for_sm_90(path):
    pytest.importorskip("torch")
    assert script().compile_attack(path, "sm_90") >= 1


def test_outcomes_and_verdicts():
    rt = script()
    assert rt.outcome_of(3, None, "perf-only behaviour suspected: x.py:1 [env] ...\nmore") == \
        "refused: perf-only behaviour suspected: x.py:1 [env] ..."
    assert rt.outcome_of(4, {"status": "crash", "crash_class": "tampered"}, "") == "crash tampered"
    assert rt.outcome_of(0, {"status": "revert", "decision": {"tier": "regression"}}, "") == "revert"
    assert rt.outcome_of(0, {"status": "keep", "decision": {"tier": "no-change"}}, "") == "keep (no-change)"
    assert rt.outcome_of(0, {"status": "keep", "decision": {"tier": "new-baseline"}}, "") == "keep (new-baseline)"
    assert rt.caught("f_perf_only_launch_shrink", "refused: perf-only behaviour suspected: ...", []) is True
    assert rt.caught("f_perf_only_launch_shrink", "refused: no baseline recorded yet", []) is None
    assert rt.caught("g_timer_patch_hidden", "crash tampered", []) is True
    assert rt.caught("g_timer_patch_hidden", "keep (no-change)", []) is False
    assert rt.caught("h_pth_planter", "keep (no-change)", []) is True
    assert rt.caught("h_pth_planter", "keep (no-change)", ["LANDED: x.pth exists after the try"]) is False
    assert rt.caught("i_branch_swap", "keep (keep-lower-priority)", []) is False


def test_table_marks_a_kept_attack_as_not_caught():
    results = [{"attack": "a_side_stream", "caught": True, "outcome": "crash wrong-result", "sandbox": "unshare",
                "reason": "perf error: HiddenDeviceWork | x", "defence": "bench", "seconds": 41.0},
               {"attack": "d_lower_precision", "caught": False, "outcome": "keep (no-change)", "sandbox": "unshare",
                "reason": "within noise", "defence": "float64", "seconds": 50.0},
               {"attack": "h_pth_planter", "caught": True, "outcome": "keep (no-change)", "sandbox": "unshare",
                "reason": "within noise", "defence": "sandbox", "seconds": 50.0,
                "attack_lines": ["[1-correctness.log] ATTACK h_pth_planter pid=7: write to /x.pth failed"]}]
    text = script().markdown(results)
    assert ("| a_side_stream | crash wrong-result | yes | perf error: HiddenDeviceWork \\| x | unshare | 41.0 | "
            "bench |") in text
    assert "| d_lower_precision | keep (no-change) | **NOT CAUGHT** |" in text
    assert "NOT CAUGHT: d_lower_precision (keep (no-change): within noise)" in text
    assert "    [1-correctness.log] ATTACK h_pth_planter pid=7: write to /x.pth failed" in text


def test_attack_lines_are_collected_once_from_the_runs_logs(tmp_path):
    runs = tmp_path / "sandbox" / "runs"
    runs.mkdir(parents=True)
    (runs / "1-correctness.log").write_text("x\nATTACK i_branch_swap pid=1: nothing found\n")
    (runs / "1-perf.log").write_text("ATTACK i_branch_swap pid=2: nothing found\nATTACK i_branch_swap pid=2: y\n")
    assert script().attack_lines(tmp_path) == ["[1-correctness.log] ATTACK i_branch_swap pid=1: nothing found",
                                               "[1-perf.log] ATTACK i_branch_swap pid=2: y"]


def _half_math_softmax(x, dtype, tile=1024):
    """The d_lower_precision kernel's arithmetic on CPU: every intermediate rounded to ``dtype``."""
    import torch

    run_max = torch.full((x.shape[0], 1), float("-inf"), dtype=dtype)
    run_sum = torch.zeros((x.shape[0], 1), dtype=dtype)
    for j in range(0, x.shape[1], tile):
        t = x[:, j:j + tile]
        new_max = torch.maximum(run_max, t.max(dim=1, keepdim=True).values)
        e = torch.exp((t - new_max).float()).to(dtype)
        run_sum = (run_sum * torch.exp((run_max - new_max).float()).to(dtype)) + e.sum(dim=1, keepdim=True)
        run_max = new_max
    return (torch.exp((x - run_max).float()).to(dtype) / run_sum).to(dtype)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_float64_check_accepts_fp32_math_and_rejects_half_math_and_zeros(dtype_name):
    torch = pytest.importorskip("torch")
    common = _load(ROOT / "examples" / "kernels" / "tests" / "common.py", "_suite_common")
    dtype = getattr(torch, dtype_name)
    x = (torch.randn(32, 4096, generator=torch.Generator().manual_seed(0)) * 2).to(dtype)
    ref = torch.softmax(x.double(), -1)
    common.assert_matches_float64(torch.softmax(x.float(), -1).to(dtype), ref, dtype, "fp32 math")
    for bad in (_half_math_softmax(x, dtype), torch.zeros_like(x)):
        with pytest.raises(AssertionError, match="correctly rounded float64"):
            common.assert_matches_float64(bad, ref, dtype, "attack")


def test_the_cli_driver_streams_stderr_to_a_log_with_seconds(tmp_path):
    """``cutile_perf(..., log=)``: each stderr line lands in the log as it comes, after its seconds, so
    a GPU call cut off by its limit still says where the time went; the answer is as without a log."""
    rt = script()
    log = tmp_path / "commands.log"
    plain = rt.cutile_perf(tmp_path, "status", "--no-such-flag")  # argparse's error: stderr, exit 2
    logged = rt.cutile_perf(tmp_path, "status", "--no-such-flag", log=log)
    assert logged[0] == plain[0] != 0 and logged[1] == plain[1] and logged[2].strip() == plain[2].strip()
    lines = log.read_text().splitlines()
    assert lines[0] == "$ cutile-perf status --no-such-flag" and len(lines) == 1 + len(plain[2].strip().splitlines())
    assert all(float(line[:7]) >= 0 for line in lines[1:])
    assert [line[8:] for line in lines[1:]] == plain[2].strip("\n").splitlines()


def test_the_cli_driver_with_a_log_still_stops_at_its_timeout(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        script().cutile_perf(tmp_path, "status", timeout=0.01, log=tmp_path / "commands.log")


@pytest.mark.parametrize("kept, verify_exit, promised", [(True, 1, True), (True, 0, False), (False, None, None)])
def test_old_session_keeps_the_attack_unchecked_then_asks_verify(monkeypatch, tmp_path, kept, verify_exit, promised):
    """``--old-session``: the try runs with checked timed calls off (and only the try), ``verify`` runs
    only on a kept row, and only its refusal (exit 1) is what issue 39 item 5 promises."""
    import os

    rt = script()
    seen = {}

    def fake_try(base, attack, workdir, timeout):
        seen["unchecked"] = os.environ.get("CUTILE_PERF_UNCHECKED")
        return {"outcome": "keep (new-baseline)" if kept else "revert", "reason": "r", "seconds": 1.0,
                "kept": kept, "repo": str(tmp_path)}

    def fake_cli(repo, *args, timeout=600):
        seen["verify"] = (repo, args, os.environ.get("CUTILE_PERF_UNCHECKED"))
        seen["saved before verify"] = list(saved)
        return verify_exit, {"verdict": "x"}, ""

    monkeypatch.delenv("CUTILE_PERF_UNCHECKED", raising=False)
    monkeypatch.setattr(rt, "run_attack", fake_try)
    monkeypatch.setattr(rt, "cutile_perf", fake_cli)
    saved = []
    row = rt.old_session(tmp_path, ATTACKS[0], tmp_path, 60, kept=saved.append)
    assert seen["unchecked"] == "1" and "CUTILE_PERF_UNCHECKED" not in os.environ
    assert row["as_promised"] is promised
    if kept:
        assert seen["verify"] == (tmp_path, ("verify",), None) and row["verify_exit"] == verify_exit
        # a call cut during verify still has the unchecked try's outcome in --out
        assert [r["unchecked"] for r in seen["saved before verify"]] == ["keep (new-baseline)"]
    else:
        assert "verify" not in seen and row["verify"] == "not run: nothing was kept"

"""`cutile-perf demo`: refuses without a GPU before touching anything; kernel names and step files."""
from __future__ import annotations

from pathlib import Path

import pytest

from cutile_perf.child import envcheck
from cutile_perf.cli import main
from cutile_perf.loop import demo as demo_mod
from cutile_perf.loop.row import decision_line
from cutile_perf.errors import EXIT_REFUSED, EnvMissing, Refused, UsageError

from conftest import gpu_skip_reason

SUITE = Path(__file__).resolve().parents[1] / "examples" / "kernels"


@pytest.fixture
def no_gpu(monkeypatch):
    """Make the environment check report a missing GPU, on any machine."""
    env = envcheck.Environment(problems=(envcheck.Problem("gpu", "no NVIDIA GPU found"),))
    monkeypatch.setattr(envcheck, "check", lambda **_: env)


def test_demo_without_gpu_refuses_and_copies_nothing(no_gpu, tmp_path):
    dest = tmp_path / "demo"
    with pytest.raises(EnvMissing, match="no NVIDIA GPU") as info:
        demo_mod.demo(kernel="rmsnorm", dest=dest)
    assert info.value.exit_code == EXIT_REFUSED
    assert not dest.exists()


def test_cli_demo_without_gpu_exits_3_with_one_line(no_gpu, capsys):
    assert main(["demo", "--kernel", "rmsnorm"]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "demo measures kernels and cannot run here" in err


@pytest.fixture
def torch_sees_no_gpu(monkeypatch):
    """nvidia-smi finds a GPU, torch's view does not: the demo copies and runs init, then refuses."""
    smi_only = envcheck.Environment(gpu="NVIDIA H200", compute_capability="9.0", cuda_tile="1.7.0", tileiras="13.4")
    no_torch_gpu = envcheck.Environment(problems=(envcheck.Problem("torch", "torch sees no CUDA GPU"),))
    monkeypatch.setattr(envcheck, "check", lambda *, with_torch=True: no_torch_gpu if with_torch else smi_only)


def test_demo_whose_torch_sees_no_gpu_removes_its_copy(torch_sees_no_gpu, tmp_path):
    """nvidia-smi finds a GPU, so the copy and init start; torch's view (checked meanwhile, its
    import is slow) then refuses, and the copy the demo made is removed again."""
    dest = tmp_path / "demo"
    with pytest.raises(EnvMissing, match="torch sees no CUDA GPU"):
        demo_mod.demo(kernel="rmsnorm", dest=dest)
    assert not dest.exists()


def test_demo_correctness_jobs_out_of_range_is_a_usage_error_before_anything(no_gpu, tmp_path, capsys):
    dest = tmp_path / "demo"
    with pytest.raises(UsageError, match="--correctness-jobs must be from 1 to 16, not 0"):
        demo_mod.demo(kernel="rmsnorm", dest=dest, correctness_jobs=0)
    assert not dest.exists()
    assert main(["demo", "--correctness-jobs", "17"]) == UsageError.exit_code
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_demo_correctness_jobs_reach_the_demo_session(torch_sees_no_gpu, monkeypatch, tmp_path):
    """The option is init's, for the demo's own session: its init is asked for it (the copy is
    removed again here, torch seeing no GPU)."""
    asked, real = [], demo_mod.init

    def init(**kw):
        asked.append(kw["correctness_jobs"])
        return real(**kw)

    monkeypatch.setattr(demo_mod, "init", init)
    with pytest.raises(EnvMissing):
        demo_mod.demo(kernel="rmsnorm", dest=tmp_path / "demo", correctness_jobs=2)
    with pytest.raises(EnvMissing):
        demo_mod.demo(kernel="rmsnorm", dest=tmp_path / "demo")
    assert asked == [2, demo_mod.DEMO_CORRECTNESS_JOBS]


def test_demo_prestart_perf_reaches_the_demo_session(torch_sees_no_gpu, monkeypatch, tmp_path):
    """``demo --no-prestart-perf`` (the spares' A/B, benchmarks/demo_ab.sh) is init's setting for the
    demo's session; on by default, as init's."""
    asked, real = [], demo_mod.init

    def init(**kw):
        asked.append(kw["prestart_perf"])
        return real(**kw)

    monkeypatch.setattr(demo_mod, "init", init)
    for argv in (["demo", "--no-prestart-perf"], ["demo"]):
        assert main(argv) == EnvMissing.exit_code
    assert asked == [False, True]


def test_the_demo_help_gives_its_default_correctness_jobs(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert f"(default {demo_mod.DEMO_CORRECTNESS_JOBS}:" in " ".join(capsys.readouterr().out.split())


@pytest.mark.skipif(gpu_skip_reason() is None, reason="this machine has a GPU: the demo would really run")
def test_demo_on_this_cpu_machine_refuses(tmp_path):
    dest = tmp_path / "demo"
    with pytest.raises(EnvMissing):
        demo_mod.demo(kernel="rms_norm", dest=dest)
    assert not dest.exists()


@pytest.mark.parametrize("typed, op", [("rmsnorm", "rms_norm"), ("RMS-Norm", "rms_norm"), ("rms_norm", "rms_norm"),
                                       ("layernorm", "layer_norm"), ("softmax", "softmax"), ("swiglu", "swiglu")])
def test_resolve_kernel_accepts_aliases(typed, op):
    assert demo_mod.resolve_kernel(typed, ["layer_norm", "rms_norm", "softmax", "swiglu"]) == op


def test_unknown_kernel_is_a_usage_error_listing_choices():
    with pytest.raises(UsageError, match="no bundled kernel") as info:
        demo_mod.resolve_kernel("conv3d", ["rms_norm", "softmax"])
    assert "rms_norm, softmax" in str(info.value)


def test_every_bundled_steps_file_loads_and_names_an_existing_kernel_file():
    ops = demo_mod.available_ops(SUITE)
    assert {"rms_norm", "swiglu", "softmax", "layer_norm"} <= set(ops)
    for op in ops:
        kernel_file, steps = demo_mod.load_steps(SUITE / "optimizations" / op / "steps.yaml")
        assert (SUITE / kernel_file).is_file(), kernel_file
        assert steps and all(s.file.is_file() for s in steps)


def test_rms_norm_demo_includes_a_step_expected_to_be_slower():
    # The demo must show a real revert, not only wins.
    _, steps = demo_mod.load_steps(SUITE / "optimizations" / "rms_norm" / "steps.yaml")
    assert "slower" in [s.expect for s in steps]


def test_steps_file_with_missing_source_is_rejected(tmp_path):
    (tmp_path / "steps.yaml").write_text("kernel_file: src/k.py\nsteps:\n  - name: x\n    file: 01-x.py\n")
    with pytest.raises(UsageError, match="does not exist"):
        demo_mod.load_steps(tmp_path / "steps.yaml")


def test_existing_directory_not_made_by_demo_is_never_deleted(tmp_path):
    # Regression guard: `demo` replaces its own previous output only, never a user's directory.
    dest = tmp_path / "demo"
    dest.mkdir()
    (dest / "precious.txt").write_text("user work")
    with pytest.raises(Refused, match="not created by"):
        demo_mod._fresh_copy(SUITE, dest)
    assert (dest / "precious.txt").read_text() == "user work"


def test_fresh_copy_makes_a_committed_repo_without_optimizations(tmp_path):
    from cutile_perf.store import git_ops

    dest = tmp_path / "demo"
    demo_mod._fresh_copy(SUITE, dest)
    repo = git_ops.open_repo(dest)
    assert git_ops.changed_paths(repo) == []
    assert (dest / "src" / "tilesuite" / "ops" / "cutile" / "rms_norm.py").is_file()
    assert not (dest / "optimizations").exists()
    demo_mod._fresh_copy(SUITE, dest)  # a second run replaces its own earlier copy
    assert (dest / demo_mod.DEMO_MARKER).is_file()


def test_a_stop_rule_during_the_demo_is_announced_as_deliberately_ignored():
    step = demo_mod.Step("latency hints", SUITE / "x.py", "same", "")
    data = {"iteration": 5, "decision": "keep", "reason": "within noise", "patch": None}
    line = demo_mod.step_line(5, step, decision_line(data), "2 iterations in a row without improvement", last=False)
    assert line == ("5. latency hints [expected same]: iteration 5: keep - within noise; stop rule reached "
                    "(2 iterations in a row without improvement); the demo continues through its prepared steps "
                    "to show each decision")
    assert "continues" not in demo_mod.step_line(6, step, "x", "stop", last=True)
    assert demo_mod.step_line(1, step, "x", None, last=False) == "1. latency hints [expected same]: x"


def test_decision_line_is_the_try_text_without_the_stop_rule():
    data = {"iteration": 2, "decision": "revert", "reason": "slower", "patch": "sandbox/patches/2-x.patch"}
    assert decision_line(data) == "iteration 2: revert - slower (patch: sandbox/patches/2-x.patch)"

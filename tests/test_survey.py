"""``survey`` on the SIMULATED TileGym-shaped repo: rms_norm (with a perf test) and softmax (without)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_ops import SOFTMAX_KERNEL_REL, add_simulated_softmax, require_cuda_to_collect
from fixtures_repo import KERNEL_REL, edit_kernel, git, tilegym_like_repo  # noqa: F401

from cutile_perf.kernel import survey
from cutile_perf.cli import main


def cli(capsys, repo: Path, *args: str) -> tuple[int, dict]:
    code = main(["survey", "--repo", str(repo), "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


@pytest.fixture
def two_op_repo(tilegym_like_repo):
    pytest.importorskip("torch")
    return add_simulated_softmax(tilegym_like_repo)


def by_op(data: dict) -> dict[str, dict]:
    return {op["op"]: op for op in data["ops"]}


def test_survey_pairs_ops_counts_selections_and_renders_markdown(two_op_repo):
    rows = survey.survey(two_op_repo)
    ops = {r.op: r.to_dict() for r in rows}
    assert set(ops) == {"rms_norm", "softmax"}  # helpers without @ct.kernel (__init__.py) are not ops
    assert ops["rms_norm"]["test"] == "tests/ops/test_rms_norm.py" and ops["rms_norm"]["drivable"]
    assert ops["rms_norm"]["selections"]["perf"]["count"] == 2
    assert ops["softmax"]["selections"]["perf"]["count"] == 0 and not ops["softmax"]["drivable"]
    assert ops["softmax"]["selections"]["correctness"]["count"] == 6  # 3 shapes x 2 modes x cutile
    assert survey.summary(rows) == {"ops": 2, "paired": 2, "with_perf_test": 1, "drivable": 1}
    assert ops["rms_norm"]["runs"] == {}  # nothing runs without --run
    table = survey.render_table(rows, with_runs=False, markdown=True).splitlines()
    assert table[0] == "| " + " | ".join(survey.columns(False)) + " |"
    assert "no perf test (scaffold-perf)" in next(line for line in table if line.startswith("| softmax "))
    assert git(two_op_repo, "status", "--porcelain", "--untracked-files=all").strip() == ""


def test_survey_run_reports_pass_fail_time_and_records(two_op_repo, capsys):
    repo = two_op_repo
    code, data = cli(capsys, repo, "--run", "--timeout", "60")
    assert code == 0, data
    ops = by_op(data)
    perf = ops["rms_norm"]["runs"]["perf"]
    assert perf["ok"] and perf["records"] == 2 and perf["wall_s"] >= 0
    assert ops["rms_norm"]["runs"]["correctness"]["ok"]
    assert ops["softmax"]["runs"].keys() == {"correctness"}  # no perf selection, so no perf run
    assert ops["softmax"]["runs"]["correctness"]["ok"]
    assert git(repo, "status", "--porcelain", "--untracked-files=all").strip() == ""  # no __pycache__, no logs


def test_survey_run_sample_and_failure(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    edit_kernel(repo, behaviour="wrong")
    code, data = cli(capsys, repo, "--run", "--sample", "1", "--under", "src/fakegym/ops/cutile/rms_norm.py/..")
    assert code == 2  # --under is a folder prefix; a file path below it is not one
    code, data = cli(capsys, repo, "--run", "--sample", "1", "--jobs", "2", "--under", "src/fakegym/ops")
    ops = by_op(data)
    run = ops["rms_norm"]["runs"]["correctness"]
    assert not run["ok"] and run["crash"] == "wrong-result" and run["tests"] == 1
    assert ops["rms_norm"]["runs"]["perf"]["tests"] == 1 and not ops["rms_norm"]["drivable"]


def test_survey_sees_a_scaffolded_perf_file(two_op_repo, capsys):
    repo = two_op_repo
    assert main(["scaffold-perf", "--repo", str(repo), "--kernel", SOFTMAX_KERNEL_REL]) == 0
    row = survey.survey_op(repo, repo / SOFTMAX_KERNEL_REL, run=False, timeout_s=120, sample=0, log_dir=repo)
    assert row.perf_test == "tests/ops/test_softmax_perf.py" and row.selections["perf"].count == 3


@pytest.mark.parametrize("args", [["--timeout=nan"], ["--timeout=0"], ["--jobs=0"], ["--sample=-1"]])
def test_survey_bad_input(tilegym_like_repo, capsys, args):
    assert cli(capsys, tilegym_like_repo, *args)[0] == 2


def test_sampled_argv_replaces_the_test_file_with_rerooted_node_ids():
    argv = ["py", "-m", "pytest", "tests/ops/test_x.py", "-k", "test_perf", "-q"]
    ids = ("ops/test_x.py::test_perf[a]", "ops/test_x.py::test_perf[b]")  # rootdir was tests/
    new, n = survey.sampled_argv(argv, "tests/ops/test_x.py", ids, 1)
    assert n == 1 and new == ["py", "-m", "pytest", "tests/ops/test_x.py::test_perf[a]", "-k", "test_perf", "-q"]
    assert survey.sampled_argv(argv, "tests/ops/test_x.py", ids, 0) == (argv, 0)


def test_parse_outcomes_reads_the_last_summary_line():
    text = "tests/x.py s.\n\n1 passed, 2 skipped, 3 deselected in 0.52s\n"
    assert survey.parse_outcomes(text) == {"passed": 1, "skipped": 2, "deselected": 3}
    assert survey.parse_outcomes("1 failed, 1 error in 2s") == {"failed": 1, "error": 1}
    assert survey.parse_outcomes("collected nothing") == {}


def test_survey_budget_lists_ops_it_had_no_time_for(tilegym_like_repo, capsys):
    code, data = cli(capsys, tilegym_like_repo, "--run", "--budget", "0.001")
    assert code == 0
    (row,) = data["ops"]
    assert row["not_done"].startswith("budget spent") and not row["drivable"] and row["runs"] == {}
    assert "budget spent" in data["markdown"]


def test_a_run_cut_by_the_budget_is_not_reported_as_a_failure(tilegym_like_repo, capsys):
    edit_kernel(tilegym_like_repo, sleep=30.0)  # every test sleeps longer than the budget
    code, data = cli(capsys, tilegym_like_repo, "--run", "--budget", "6", "--timeout", "60")
    (row,) = data["ops"]
    assert row["not_done"].startswith("budget spent") and not row["drivable"]
    assert all(run["cut"] for run in row["runs"].values())
    assert "FAIL" not in data["markdown"]


def test_survey_op_keeps_only_the_named_ops_and_refuses_an_unknown_one(two_op_repo, capsys):
    code, data = cli(capsys, two_op_repo, "--op", "softmax")
    assert code == 0 and [op["op"] for op in data["ops"]] == ["softmax"]
    code = main(["survey", "--repo", str(two_op_repo), "--op", "softmaxx"])
    err = capsys.readouterr().err
    assert code == 2 and "softmaxx" in err and len(err.strip().splitlines()) <= 2


def test_a_sampled_run_whose_tests_all_skip_tries_the_next_tests(two_op_repo, tmp_path, monkeypatch):
    """chunk_gated_delta_rule on the H200: its first correctness case skips on that GPU, and one
    skipped sample said "no" about an op whose other cases pass."""
    offsets = []

    def fake_run(session, which, sel, test_rel, *, timeout_s, sample, log_dir, capped=False, offset=0):
        offsets.append(offset)
        if offset < 2:  # the first two windows of one test each: skipped on this machine
            return survey.RunSummary(False, "no-tests", 1.0, 1, outcomes={"skipped": 1})
        return survey.RunSummary(True, None, 2.0, 1, outcomes={"passed": 1})

    monkeypatch.setattr(survey, "_run_one", fake_run)
    row = survey.survey_op(two_op_repo, two_op_repo / SOFTMAX_KERNEL_REL, run=True, timeout_s=60, sample=1,
                           log_dir=tmp_path)
    assert len(row.selections["correctness"].node_ids) == 6 and offsets == [0, 1, 2]
    corr = row.runs["correctness"]
    assert corr.ok and corr.wall_s == 4.0 and "the first 2 sampled test(s) skipped" in corr.detail


def test_skipped_windows_are_bounded(two_op_repo, tmp_path, monkeypatch):
    offsets = []

    def always_skipped(session, which, sel, test_rel, *, timeout_s, sample, log_dir, capped=False, offset=0):
        offsets.append(offset)
        return survey.RunSummary(False, "no-tests", 1.0, 1, outcomes={"skipped": 1})

    monkeypatch.setattr(survey, "_run_one", always_skipped)
    row = survey.survey_op(two_op_repo, two_op_repo / SOFTMAX_KERNEL_REL, run=True, timeout_s=60, sample=1,
                           log_dir=tmp_path)
    assert offsets == [0, 1, 2] and not row.runs["correctness"].ok  # SKIPPED_WINDOWS, then a verdict


def test_all_skipped_needs_skips_and_no_failures():
    assert survey.all_skipped(survey.RunSummary(False, "no-tests", 1.0, 1, outcomes={"skipped": 2}))
    assert not survey.all_skipped(survey.RunSummary(False, "no-tests", 1.0, 1, outcomes={"skipped": 1, "failed": 1}))
    assert not survey.all_skipped(survey.RunSummary(False, "no-tests", 1.0, 1, outcomes={"deselected": 3}))
    assert not survey.all_skipped(survey.RunSummary(True, None, 1.0, 1, outcomes={"passed": 1}))


def test_survey_and_init_find_an_uninstalled_checkout_through_its_src(tilegym_like_repo, capsys):
    """NVIDIA TileGym's conftest does not put ``src/`` on ``sys.path`` (it is pip-installed where it runs).
    The measured runs import the fenced code from the checkout anyway (``pristine.import_path``); the
    collections of init and survey, and survey's runs, must too, or init refuses and survey reports an
    import error on a checkout that ``try`` would measure. Without it this test fails on
    "No module named 'fakegym'"."""
    repo = tilegym_like_repo
    conftest = repo / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text().replace(
        'sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))\n', ""))
    git(repo, "commit", "-qam", "conftest without the sys.path edit, as in TileGym")
    code, data = cli(capsys, repo, "--run", "--sample", "1", "--timeout", "60")
    assert code == 0, data
    row = by_op(data)["rms_norm"]
    for which in ("correctness", "perf"):
        assert row["selections"][which]["count"] > 0 and not row["selections"][which]["error"], row
        assert row["runs"][which]["ok"], row
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm", "--timeout", "60", "--json"]) == 0
    assert "No module named" not in capsys.readouterr().out


def test_self_tuning_hint_names_kernels_that_tune_at_launch():
    assert "tunes itself" in survey.self_tuning_hint("result = exhaustive_search(list(configs()), stream, grid_fn)")
    assert "tunes itself" in survey.self_tuning_hint("def _persistent_bmm_autotune_base(stream, a, b):")
    assert survey.self_tuning_hint("ct.launch(stream, grid, kernel, args)  # autotuned offline") == ""


def test_a_timeout_in_a_self_tuning_kernel_says_why_it_may_be_slow(tilegym_like_repo, capsys):
    """TileGym's bmm on the H200: its first correctness case tunes 18 configs and ran past 150 s."""
    edit_kernel(tilegym_like_repo, sleep=30.0)
    kernel = tilegym_like_repo / KERNEL_REL
    kernel.write_text(kernel.read_text() + "\n\ndef _unused():\n    return exhaustive_search(None)\n")
    git(tilegym_like_repo, "commit", "-qam", "the simulated kernel tunes itself")
    code, data = cli(capsys, tilegym_like_repo, "--run", "--sample", "1", "--timeout", "3")
    run = by_op(data)["rms_norm"]["runs"]["correctness"]
    assert run["crash"] == "timeout" and not run["cut"], run
    assert "killed after 3 s; the kernel file tunes itself" in run["detail"]


def test_a_conftest_that_needs_cuda_stops_the_survey_at_the_first_op_with_one_line(two_op_repo, capsys):
    """TileGym's conftest needs CUDA to collect: on a CPU machine the survey used to collect (and
    run) every op, each failing alike, and mark them all "error". Now the first failure stops it."""
    repo = require_cuda_to_collect(two_op_repo)
    code, data = cli(capsys, repo, "--run", "--jobs", "1")
    assert code == 0, data
    assert data["no_cuda"].startswith("tests/conftest.py:")
    assert "in _device_capability: RuntimeError: Found no NVIDIA driver" in data["no_cuda"]
    first, second = data["ops"]
    assert list(first["selections"]) == ["correctness"] and first["runs"] == {}  # one collection, nothing run
    assert second["selections"] == {} and second["not_done"] == survey.NOT_COLLECTED
    assert second["test"] == "tests/ops/test_softmax.py"  # the pairing is static: still there
    assert data["summary"] == {"ops": 2, "paired": 2, "with_perf_test": None, "drivable": None}
    main(["survey", "--repo", str(repo)])
    text = capsys.readouterr().out
    assert sum("need CUDA" in line for line in text.splitlines()) == 1
    assert "still works without a GPU" in text and "0 with a perf test" not in text
    assert "unknown: no CUDA here to collect" in text

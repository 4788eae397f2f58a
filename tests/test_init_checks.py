"""``init``'s checks before it creates anything (issue 10 part 4, issue 9 part 7), on the simulated repo.

An empty correctness or perf selection is refused (exit 3) with what to do; bad input (no commits,
a branch name git rejects, a nan/inf/0/negative timeout) is a one-line usage error (exit 2). In
every case nothing is created: no branch, no sandbox/, no session file, HEAD unchanged.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_ops import SOFTMAX_KERNEL_REL, add_simulated_softmax, require_cuda_to_collect
from fixtures_repo import TEST_REL, git, tilegym_like_repo  # noqa: F401

from cutile_perf.child import selection
from cutile_perf.cli import main


def cli(capsys, repo: Path, *args: str) -> tuple[int, dict]:
    code = main(["init", "--repo", str(repo), "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


def branches(repo: Path) -> list[str]:
    return sorted(git(repo, "branch", "--format=%(refname:short)").split())


def assert_untouched(repo: Path, before: list[str]) -> None:
    assert branches(repo) == before
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert not (repo / "sandbox").exists()
    assert git(repo, "status", "--porcelain", "--untracked-files=all").strip() == ""


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
def test_timeout_must_be_finite_and_positive(tilegym_like_repo, capsys, value):
    # Regression (issue 9): --timeout nan passed "<= 0" and disabled the hang guard.
    before = branches(tilegym_like_repo)
    code, data = cli(capsys, tilegym_like_repo, "--kernel", "rms_norm", f"--timeout={value}")
    assert code == 2 and "--timeout" in data["error"] and "finite" in data["error"]
    assert_untouched(tilegym_like_repo, before)


@pytest.mark.parametrize("name", ["two words", "x..y", "-dash", "ends.lock", "HEAD", "@{-1}", "a~1"])
def test_branch_name_git_rejects_is_a_usage_error(tilegym_like_repo, capsys, name):
    before = branches(tilegym_like_repo)
    code, data = cli(capsys, tilegym_like_repo, "--kernel", "rms_norm", f"--branch={name}")
    assert code == 2 and "--branch" in data["error"], data
    assert_untouched(tilegym_like_repo, before)


def test_repo_without_commits_is_a_usage_error(tmp_path, capsys):
    # Regression (issue 9): init in a fresh `git init` exited 70 (rev-parse HEAD failed).
    repo = tmp_path / "empty"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "src/pkg/cutile").mkdir(parents=True)
    (repo / "src/pkg/cutile/k.py").write_text("x = 1\n")
    code, data = cli(capsys, repo, "--kernel", "src/pkg/cutile/k.py")
    assert code == 2 and "no commits" in data["error"]
    assert not (repo / "sandbox").exists()
    assert git(repo, "branch", "--list").strip() == ""


def test_no_perf_test_is_refused_and_names_scaffold_perf(tilegym_like_repo, capsys):
    pytest.importorskip("torch")  # the simulated softmax test imports torch, as TileGym's does
    repo = add_simulated_softmax(tilegym_like_repo)
    before = branches(repo)
    code, data = cli(capsys, repo, "--kernel", SOFTMAX_KERNEL_REL)
    assert code == 3, data
    assert "perf command selects no test" in data["error"]
    assert f"cutile-perf scaffold-perf --kernel {SOFTMAX_KERNEL_REL}" in data["hint"]
    assert_untouched(repo, before)


def test_no_correctness_test_is_refused(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    path = repo / TEST_REL
    path.write_text(path.read_text().replace("def test_op(", "def check_op("))
    git(repo, "commit", "-qam", "correctness test renamed away")
    before = branches(repo)
    code, data = cli(capsys, repo, "--kernel", "rms_norm")
    assert code == 3 and "correctness command selects no test" in data["error"], data
    assert_untouched(repo, before)


def test_init_reports_both_selections(tilegym_like_repo, capsys):
    code, data = cli(capsys, tilegym_like_repo, "--kernel", "rms_norm")
    assert code == 0, data
    # The simulated perf test has 2 shapes x (cutile, cutile_rs); the perf command drops cutile_rs.
    assert data["selections"]["perf"]["count"] == 2 and not data["selections"]["perf"]["error"]
    assert data["selections"]["correctness"]["count"] >= 1
    assert all("test_perf" in nid and "cutile_rs" not in nid for nid in data["selections"]["perf"]["first"])


def test_collection_error_is_reported_not_refused(tilegym_like_repo, capsys):
    """A test module that cannot be imported here (TileGym's needs a GPU at import) is set up anyway,
    and the output says the selection was not checked: setting up on a CPU machine is allowed."""
    repo = tilegym_like_repo
    path = repo / TEST_REL
    path.write_text("raise RuntimeError('needs a GPU at import')\n" + path.read_text())
    git(repo, "commit", "-qam", "test module that fails at import")
    code, data = cli(capsys, repo, "--kernel", "rms_norm")
    assert code == 0, data
    assert "needs a GPU at import" in data["selections"]["perf"]["error"]


def test_a_conftest_that_needs_cuda_is_one_line_and_one_collection(tilegym_like_repo, capsys):
    repo = require_cuda_to_collect(tilegym_like_repo)
    code, data = cli(capsys, repo, "--kernel", "rms_norm")
    assert code == 0, data
    correctness, perf = data["selections"]["correctness"], data["selections"]["perf"]
    assert correctness["needs_cuda"].startswith("tests/conftest.py:") and perf["needs_cuda"] == correctness["needs_cuda"]
    git(repo, "checkout", "-q", "main")
    import shutil
    shutil.rmtree(repo / "sandbox")
    git(repo, "branch", "-D", data["branch"])
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [ln for ln in lines if "need CUDA" in ln]
    assert "Found no NVIDIA driver" in line and "baseline checks the selections on the GPU machine" in line
    assert not any(ln.startswith(("correctness tests:", "perf tests:")) for ln in lines)


def test_needs_cuda_names_where_and_what_and_not_a_missing_package(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/conftest.py").write_text("")
    traceback = (f'  File "{tmp_path}/tests/conftest.py", line 66, in pytest_addoption\n'
                 '  File "/site-packages/torch/cuda/__init__.py", line 522, in _lazy_init\n'
                 'AssertionError: Torch not compiled with CUDA enabled\n')
    assert selection.needs_cuda(traceback, tmp_path) == (
        "tests/conftest.py:66 in pytest_addoption: AssertionError: Torch not compiled with CUDA enabled")
    pytest_style = "tests/conftest.py:3: in <module>\n    x()\nE   RuntimeError: CUDA unavailable on this host\n"
    assert selection.needs_cuda(pytest_style, tmp_path) == (
        "tests/conftest.py:3 in <module>: RuntimeError: CUDA unavailable on this host")
    assert selection.needs_cuda("E   ModuleNotFoundError: No module named 'cuda'\n", tmp_path) == ""
    assert selection.needs_cuda("E   AssertionError: Tensor-likes are not close!\n", tmp_path) == ""


# --- the pure parts of selection ----------------------------------------------------------------

COLLECT_OUTPUT = """\
$ python -m pytest tests/ops/test_x.py --collect-only -q
tests/ops/test_x.py::Test_X::test_op[4-16-dtype0-cutile]
tests/ops/test_x.py::test_perf[4096x1024-cutile]

2/9 tests collected (7 deselected) in 0.01s
"""


def test_parse_collect_output_lists_node_ids_only():
    assert selection.parse_collect_output(COLLECT_OUTPUT) == [
        "tests/ops/test_x.py::Test_X::test_op[4-16-dtype0-cutile]", "tests/ops/test_x.py::test_perf[4096x1024-cutile]"]
    assert selection.parse_collect_output("no tests collected (9 deselected) in 0.01s\n") == []


def test_collect_argv_drops_verbosity_and_loads_the_record_plugin():
    argv = selection.collect_argv(["python", "-m", "pytest", "t.py", "-k", "test_perf", "-v", "--print-record"])
    assert "-v" not in argv and argv[argv.index("--collect-only") + 1] == "-q"
    assert "cutile_perf.pytest_plugin" in argv and "--print-record" in argv  # the plugin knows the option


def test_perf_test_option_must_name_an_existing_file_in_the_repo(tilegym_like_repo, capsys, tmp_path):
    before = branches(tilegym_like_repo)
    code, data = cli(capsys, tilegym_like_repo, "--kernel", "rms_norm", "--perf-test", "tests/ops/nope.py")
    assert code == 2 and "--perf-test" in data["error"]
    outside = tmp_path / "test_x_perf.py"
    outside.write_text("def test_perf(): pass\n")
    code, data = cli(capsys, tilegym_like_repo, "--kernel", "rms_norm", "--perf-test", str(outside))
    assert code == 2 and "outside the repository" in data["error"]
    assert_untouched(tilegym_like_repo, before)


# Issue 43: under the base install (no torch) a test module that does `pytest.importorskip("torch")`
# selects nothing, and init said to write a perf test. What is missing is torch.
IMPORT_SKIP_OUTPUT = """\

=========================== short test summary info ============================
SKIPPED [1] tests/common.py:14: could not import 'torch': No module named 'torch'
no tests collected in 0.07s
"""


def test_an_import_skip_is_found_in_the_collection_output():
    assert selection.find_import_skip(IMPORT_SKIP_OUTPUT) == (
        "tests/common.py:14: could not import 'torch': No module named 'torch'")
    assert selection.find_import_skip("SKIPPED [1] tests/x.py:3: needs 8 GPUs\nno tests collected\n") == ""
    assert "-rs" in selection.collect_argv(["python", "-m", "pytest", "t.py"])  # the reasons are printed


def test_the_install_hint_names_the_package_and_the_command():
    hint = selection.install_hint("torch")
    assert "pip install 'torch>=2.11'" in hint
    assert "pip install 'cuda-tile>=1.7'" in selection.install_hint("cuda.tile")
    assert "`tilegym`" in selection.install_hint("tilegym")


NO_TORCH = 'raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n'


def test_init_without_torch_names_torch_and_its_install_command(tilegym_like_repo, tmp_path):
    """The base install, made here by a `torch` package on PYTHONPATH that fails to import (this
    venv has torch), in the init process and the collections it starts."""
    repo = tilegym_like_repo
    path = repo / TEST_REL
    path.write_text('import pytest\ntorch = pytest.importorskip("torch")\n' + path.read_text())
    git(repo, "commit", "-qam", "tests skip without torch, as the bundled kernels' do")
    blocker = tmp_path / "no-torch"
    (blocker / "torch").mkdir(parents=True)
    (blocker / "torch" / "__init__.py").write_text(NO_TORCH)
    scripts = Path(selection.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(scripts)])}
    done = subprocess.run([sys.executable, "-m", "cutile_perf", "init", "--repo", str(repo), "--kernel", "rms_norm"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr  # setting up on a machine that cannot measure is allowed
    lines = [line for line in done.stdout.splitlines() if line.startswith(("perf tests:", "correctness tests:"))]
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert "`torch` is not importable" in line and "pip install 'torch>=2.11'" in line, line
    assert "write a perf test" not in done.stdout + done.stderr  # the old advice, for a missing package

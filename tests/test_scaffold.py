"""``scaffold-perf``: a perf test planned from the correctness test's AST, on the SIMULATED softmax op.

The simulated ``tests/ops/test_softmax.py`` (tests/fixtures_ops.py) has the shape of TileGym's
``tests/ops/test_softmax.py``, which has no perf test. The generated file must parse, collect with
pytest, and record what ``cutile_perf.child.records`` reads (timed here by a stand-in for
``bench_record``, since ``cutile_perf.bench`` needs a GPU).
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_ops import SIMULATED_TEST_SOFTMAX, SOFTMAX_KERNEL_REL, SOFTMAX_SHAPES, SOFTMAX_TEST_REL, add_simulated_softmax
from fixtures_repo import git, tilegym_like_repo  # noqa: F401

from cutile_perf.child import records, runner
from cutile_perf.kernel import scaffold
from cutile_perf.cli import main

PERF_REL = "tests/ops/test_softmax_perf.py"

# Loaded with -p before the generated module imports `bench_record`, so the name it binds is this one.
FAKE_BENCH = '''\
import cutile_perf.bench
from cutile_perf.judge import stats


def fake_bench_record(fn, **kwargs):
    fn()  # the op really runs (on the CPU); only the GPU timing is replaced
    return stats.summarize([0.5, 0.75, 0.6])


cutile_perf.bench.bench_record = fake_bench_record
'''


def cli(capsys, repo: Path, *args: str) -> tuple[int, dict]:
    code = main(["scaffold-perf", "--repo", str(repo), "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


def pytest_in(repo: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=repo, capture_output=True, text=True,
                          env=runner.with_package_on_path({**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}))


@pytest.fixture
def softmax_repo(tilegym_like_repo):
    pytest.importorskip("torch")
    return add_simulated_softmax(tilegym_like_repo)


def test_plan_keeps_shapes_pins_modes_and_copies_only_the_inputs():
    plan = scaffold.plan_perf_test(SIMULATED_TEST_SOFTMAX, SOFTMAX_TEST_REL)
    assert plan.source_test == f"{SOFTMAX_TEST_REL}::Test_Softmax::test_op"
    assert plan.op == "fakegym.ops.softmax" and plan.kwargs == "{'x': x}"
    assert [(p.argnames, p.pinned) for p in plan.parametrize] == [("m,n,dtype", False), ("use_tma,use_chunked", True)]
    assert plan.params == ["m", "n", "dtype", "use_tma", "use_chunked", "backend", "record_property"]
    # `dout`, `rtol`, `atol` feed only the comparison: they are not copied; `device` and `x` are.
    # The tolerance's own statement comes along (a checked test compares at it); dout does not.
    assert plan.setup == ["device = torch.device('cpu')", "x = torch.rand(m, n, device=device, dtype=dtype)",
                          "rtol, atol = (1e-05, 1e-07)"]
    assert plan.reference == "_source.Test_Softmax().reference" and plan.tolerance == "rtol=rtol, atol=atol"
    assert plan.backend_setup[-1] == "fakegym.set_backend(backend)"
    text = scaffold.render(plan, command="cutile-perf scaffold-perf --kernel softmax")
    tree = ast.parse(text)
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert func.name == "test_perf"
    pinned = next(d for d in func.decorator_list if "use_tma" in ast.unparse(d))
    assert ast.literal_eval(pinned.args[1]) == [(False, False)] and "ids=['baseline']" in ast.unparse(pinned)


@pytest.mark.parametrize("values, mode_like", [
    ("[(False, False), (True, False)]", True),
    ("['static', 'persistent']", True),
    ("[(256, 256, torch.float32)]", False),
    ("[(4096, 2 ** i) for i in range(3)]", False),
    ("[1, 2]", False),
    ("SHAPES", False),
])
def test_is_mode_like(values, mode_like):
    assert scaffold.is_mode_like(ast.parse(values, mode="eval").body) is mode_like


def test_scaffold_writes_a_new_file_that_collects_and_records_tilegym_format(softmax_repo, capsys, tmp_path):
    repo = softmax_repo
    original = (repo / SOFTMAX_TEST_REL).read_text()
    code, data = cli(capsys, repo, "--kernel", "softmax")
    assert code == 0, data
    assert data["output"] == PERF_REL and (repo / SOFTMAX_TEST_REL).read_text() == original
    ast.parse((repo / PERF_REL).read_text())

    # It collects under the perf selection's -k, one case per shape of the correctness test.
    collected = pytest_in(repo, PERF_REL, "-k", "test_perf and cutile and not cutile_rs", "--collect-only", "-q")
    ids = [ln for ln in collected.stdout.splitlines() if "::" in ln]
    assert collected.returncode == 0 and len(ids) == SOFTMAX_SHAPES, collected.stdout + collected.stderr

    # Run with the GPU timer replaced: the records land in the file the harness reads, in its format.
    (tmp_path / "fake_bench_plugin.py").write_text(FAKE_BENCH)
    records_file = tmp_path / "records.jsonl"
    ran = pytest_in(repo, PERF_REL, "-q", "-p", "fake_bench_plugin", *records.PYTEST_PLUGIN_ARGS,
                    env={"CUTILE_PERF_RECORDS": str(records_file), "PYTHONPATH": f"{tmp_path}"})
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    got = records.read_records_file(records_file)
    assert len(got) == SOFTMAX_SHAPES
    assert {(r.framework, r.direction) for r in got} == {("cutile", "forward")}
    assert all(r.median == 0.6 and {"mean", "std", "rel_std", "min", "max", "nrep"} <= set(r.stats) for r in got)


def test_scaffolded_and_committed_perf_test_lets_init_start(softmax_repo, capsys):
    repo = softmax_repo
    assert cli(capsys, repo, "--kernel", SOFTMAX_KERNEL_REL)[0] == 0
    git(repo, "add", PERF_REL)
    git(repo, "commit", "-qm", "reviewed perf test")
    code = main(["init", "--repo", str(repo), "--json", "--kernel", SOFTMAX_KERNEL_REL])
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, data
    assert data["test"] == SOFTMAX_TEST_REL and data["selections"]["perf"]["count"] == SOFTMAX_SHAPES
    assert PERF_REL in (repo / "sandbox/session.yaml").read_text()  # the perf command names the new file


def test_stdout_writes_nothing_and_existing_output_is_never_overwritten(softmax_repo, capsys):
    repo = softmax_repo
    code = main(["scaffold-perf", "--repo", str(repo), "--kernel", "softmax", "--stdout"])
    out = capsys.readouterr().out
    assert code == 0 and "def test_perf(" in out and not (repo / PERF_REL).exists()
    (repo / PERF_REL).write_text("# my own perf test\n")
    code, data = cli(capsys, repo, "--kernel", "softmax")
    assert code == 3 and "already exists" in data["error"]
    assert (repo / PERF_REL).read_text() == "# my own perf test\n"


def test_a_test_file_with_a_perf_test_is_refused(tilegym_like_repo, capsys):
    code, data = cli(capsys, tilegym_like_repo, "--kernel", "rms_norm")
    assert code == 3 and "already has a test_perf" in data["error"]
    assert not (tilegym_like_repo / "tests/ops/test_rms_norm_perf.py").exists()


def test_inputs_built_from_the_test_class_are_a_usage_error(softmax_repo, capsys):
    repo = softmax_repo
    path = repo / SOFTMAX_TEST_REL
    path.write_text(path.read_text().replace("x = torch.rand(m, n, device=device, dtype=dtype)",
                                             "x = self.make_input(m, n)"))
    code, data = cli(capsys, repo, "--kernel", "softmax")
    assert code == 2 and "self" in data["error"] and "by hand" in data["error"] + (data["hint"] or "")
    assert not (repo / PERF_REL).exists()


# --- --checked (issue 19 item 5b): the timed calls are compared with the reference -----------------

# The real bench needs a GPU; this stand-in runs bench's own checking loop (bench._timed) with a
# CPU stand-in for torch.cuda's events, so the OutputCheck the generated test builds is exercised.
FAKE_CHECKED_BENCH = '''\
import types

import torch

import cutile_perf.bench
from cutile_perf.judge import stats


class _Event:
    def __init__(self, enable_timing=False):
        pass

    def record(self):
        pass

    def elapsed_time(self, other):
        return 0.5


_FAKE = types.SimpleNamespace(Tensor=torch.Tensor, randperm=torch.randperm,
                              cuda=types.SimpleNamespace(Event=_Event, synchronize=lambda: None))


def fake_bench_record(fn, check=None, **kwargs):
    samples = cutile_perf.bench._timed(_FAKE, fn, 4, None, check)
    return {**stats.summarize(samples), "checked_calls": 2 if check is not None else 0}


cutile_perf.bench.bench_record = fake_bench_record
'''

# Full work for the calls a correctness test makes, 60 % of the rows once the op is called more
# often than that: what a perf-only shortcut looks like when it probes nothing.
SHRINK_WHEN_CALLED_OFTEN = '''
# ATTACK shrink-when-called-often
_calls = {}
_honest_softmax = softmax


def softmax(x, use_tma=False, use_chunked=False):
    import torch

    _calls[x.shape] = _calls.get(x.shape, 0) + 1
    if _calls[x.shape] <= 2:
        return _honest_softmax(x, use_tma, use_chunked)
    out = _honest_softmax(x, use_tma, use_chunked)
    keep = max(1, int(0.6 * x.shape[0]))
    out[keep:] = _stale.get(x.shape, torch.zeros_like(out))[keep:]
    _stale[x.shape] = out.clone()
    return out


_stale = {}
'''


def _run_checked(repo: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list]:
    (tmp_path / "fake_checked_bench.py").write_text(FAKE_CHECKED_BENCH)
    records_file = tmp_path / "records.jsonl"
    ran = pytest_in(repo, PERF_REL, "-q", "-p", "fake_checked_bench", *records.PYTEST_PLUGIN_ARGS,
                    env={"CUTILE_PERF_RECORDS": str(records_file), "PYTHONPATH": f"{tmp_path}"})
    got = records.read_records_file(records_file) if records_file.exists() else []
    return ran, got


def test_checked_perf_test_calls_the_reference_and_passes_an_honest_op(softmax_repo, capsys, tmp_path):
    repo = softmax_repo
    code, data = cli(capsys, repo, "--kernel", "softmax", "--checked")
    assert code == 0, data
    text = (repo / PERF_REL).read_text()
    assert "_source.Test_Softmax().reference" in text
    assert "rtol, atol = (1e-05, 1e-07)" in text  # the tolerance's names are built as in the source test
    assert "check=check" in text and "--checked" in text.splitlines()[0]
    ran, got = _run_checked(repo, tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert len(got) == SOFTMAX_SHAPES and all(r.stats["checked_calls"] == 2 for r in got)


def test_checked_perf_test_fails_an_op_that_does_less_work_when_called_often(softmax_repo, capsys, tmp_path):
    repo = softmax_repo
    assert cli(capsys, repo, "--kernel", "softmax", "--checked")[0] == 0
    with (repo / SOFTMAX_KERNEL_REL).open("a") as fh:
        fh.write(SHRINK_WHEN_CALLED_OFTEN)
    ran, got = _run_checked(repo, tmp_path)
    assert ran.returncode == 1 and "fresh inputs" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert got == []  # no record: nothing for the harness to keep

    # The unchecked perf test times the same op and records it: the shortcut would look faster.
    (repo / PERF_REL).unlink()
    assert cli(capsys, repo, "--kernel", "softmax")[0] == 0
    ran, got = _run_checked(repo, tmp_path)
    assert ran.returncode == 0 and len(got) == SOFTMAX_SHAPES, ran.stdout[-2000:]


def test_checked_is_allowed_beside_an_existing_perf_test(tilegym_like_repo, capsys):
    code, data = cli(capsys, tilegym_like_repo, "--kernel", "rms_norm", "--checked", "--stdout")
    # The simulated rms_norm test has no assertCorrectness call: refused with the reason, not because a
    # test_perf exists.
    assert "already has a test_perf" not in json.dumps(data), data


def test_checked_with_a_reference_that_cannot_be_reached_is_a_usage_error(softmax_repo, capsys):
    repo = softmax_repo
    path = repo / SOFTMAX_TEST_REL
    path.write_text(path.read_text().replace("            self.reference,\n",
                                             "            lambda x: torch.softmax(x, -1),\n"))
    code, data = cli(capsys, repo, "--kernel", "softmax", "--checked")
    assert code == 2 and "reference" in data["error"], data
    assert not (repo / PERF_REL).exists()


def test_without_cutile_perf_the_scaffolded_test_says_what_it_needs(softmax_repo, capsys):
    repo = softmax_repo
    assert cli(capsys, repo, "--kernel", "softmax")[0] == 0
    # cutile_perf made unimportable (a target venv without it), its pytest plugin not loaded.
    code = ("import sys, pytest; sys.modules['cutile_perf'] = None; "
            f"sys.exit(pytest.main(['{PERF_REL}', '--collect-only', '-q', '-p', 'no:cacheprovider']))")
    ran = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                         env=runner.with_package_on_path({**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
                                                          "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}))
    assert ran.returncode != 0
    assert "install cutile-perf" in ran.stdout + ran.stderr, ran.stdout[-2000:] + ran.stderr[-2000:]

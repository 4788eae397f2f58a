"""The TileGym-op tasks whose faster version is ours (evals/fixtures/tilegym/) and the script that
measures their known speedup on the GPU (evals/tilegym_known.py). CPU only: the GPU parts are
replaced by fakes, and what needs TileGym or tileiras skips without them."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals"))
from cutile_perf_evals import build, measure, tasks  # noqa: E402

TILEGYM = ROOT / ".tilegym"
OPS = {"tilegym-dropout": "dropout", "tilegym-silu-and-mul": "silu_and_mul", "tilegym-geglu": "geglu",
       "tilegym-swiglu": "swiglu"}
needs_tilegym = pytest.mark.skipif(not (TILEGYM / "src").is_dir(), reason="no TileGym copy at .tilegym")


def _script():
    spec = importlib.util.spec_from_file_location("tilegym_known", ROOT / "evals" / "tilegym_known.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_known_tasks_are_the_four_ops_with_our_faster_file():
    known = _script().known_tasks(tasks.load_tasks())
    assert [t["id"] for t in known] == list(OPS)
    for task in known:
        (fenced, spec), = tasks.reference(task).items()
        # silu_and_mul's and dropout's second files are their references; the others' first
        name = "faster2.py" if task["id"] in ("tilegym-silu-and-mul", "tilegym-dropout") else "faster.py"
        assert tasks.fence(task) == [fenced] and spec == f"evals/fixtures/tilegym/{OPS[task['id']]}/{name}"
        assert build.resolve_source(spec, None).is_file()
        known = tasks.known_speedup(task)
        # H200, 2026-12-02: swiglu faster (1 round), geglu (2 rounds, in its live run's grading job),
        # silu_and_mul's faster2.py (3 rounds), dropout's faster2.py (2 rounds; its faster.py was slower)
        assert known["date"] == "2026-12-02"
        if task["id"] == "tilegym-dropout":
            assert known["rounds"] == 2 and tasks.cited_speedup(task) > 1.0 and tasks.reference_is_yardstick(task)
            assert "faster2.py" in known["source"] and "dropout-faster2" in known["results"]
        elif task["id"] == "tilegym-silu-and-mul":
            assert known["rounds"] == 3 and tasks.cited_speedup(task) > 1.0 and "faster2.py" in known["source"]
        elif task["id"] == "tilegym-geglu":
            assert known["rounds"] == 2 and tasks.cited_speedup(task) > 1.0 and "live-geglu" in known["source"]
        else:
            assert known["rounds"] == 1 and tasks.cited_speedup(task) > 1.0 and "not yet 3" in known["source"]
        assert "rms_norm" not in fenced  # the op the agents have already seen


@needs_tilegym
def test_the_base_is_upstream_and_the_reference_replaces_only_the_fenced_files(tmp_path):
    script = _script()
    chosen = script.known_tasks(tasks.load_tasks())
    trees = script.prepare(chosen, TILEGYM, tmp_path / "work")
    fenced = [tasks.fence(t)[0] for t in chosen]
    for rel in fenced:
        assert (trees["base"] / rel).read_bytes() == (TILEGYM / rel).read_bytes()
        faster = (trees["reference"] / rel).read_text()
        assert faster != (TILEGYM / rel).read_text()
        compile(faster, rel, "exec")
    diff = subprocess.run(["diff", "-rq", str(trees["base"]), str(trees["reference"])], capture_output=True, text=True)
    assert sorted(diff.stdout.strip().splitlines()) == sorted(
        f"Files {trees['base'] / rel} and {trees['reference'] / rel} differ" for rel in fenced)
    # Every task's own repository (what a trial gets) has the same tree as that base.
    for task in chosen:
        built = build.build(task, tmp_path / task["id"], tilegym=TILEGYM)
        for rel in [*fenced, tasks.test_file(task)]:
            assert (built.repo / rel).read_bytes() == (trees["base"] / rel).read_bytes()


A, B = "tests/ops/test_dropout.py", "tests/ops/test_swiglu.py"


def _fake_perf(calls, missing=()):
    def perf_run(tree, tests_, *, tag, out_dir, timeout_s):
        calls.append(tag)
        ms = 2.0 if tree.name == "base" else 1.0
        return {t: {"case": ms} for t in tests_ if (tag, t) not in missing}
    return perf_run


def test_rounds_interleave_and_time_every_test_file_in_one_process(monkeypatch, tmp_path):
    script = _script()
    calls = []
    monkeypatch.setattr(script, "perf_run", _fake_perf(calls))
    trees = {"base": tmp_path / "base", "reference": tmp_path / "reference"}
    # ahead=False: a fake run has no process to start ahead (tests/test_evals.py tests RoundAhead)
    runs, paired, notes = script.time_rounds(trees, [A, B], rounds=3, deadline=script.time.monotonic() + 3600,
                                             out_dir=tmp_path, ahead=False)
    assert calls == ["round1-base", "round1-reference", "round2-reference", "round2-base", "round3-base",
                     "round3-reference"]
    assert paired == {A: 3, B: 3} and not notes
    row = script.summarize(runs[A], paired[A])
    assert row["geomean"] == pytest.approx(2.0) and row["round_geomeans"] == [2.0] * 3


def test_only_paired_rounds_count_per_test_file(monkeypatch, tmp_path):
    script = _script()
    calls = []
    # round 2's reference run did not record B (cut, or B crashed): B has 2 rounds, A has 3
    monkeypatch.setattr(script, "perf_run", _fake_perf(calls, missing={("round2-reference", B)}))
    trees = {"base": tmp_path / "base", "reference": tmp_path / "reference"}
    runs, paired, _ = script.time_rounds(trees, [A, B], rounds=3, deadline=script.time.monotonic() + 3600,
                                         out_dir=tmp_path, ahead=False)
    assert paired == {A: 3, B: 2}
    assert all(len(v) == 2 for v in runs[B].by_variant["base"].values())


class _Clock:
    """A monotonic clock that only the fake perf runs move (``run_s`` each)."""

    def __init__(self, run_s: float):
        self.now, self.run_s = 0.0, run_s

    def __call__(self) -> float:
        return self.now


def _timed_fake_perf(calls, clock):
    inner = _fake_perf(calls)

    def perf_run(tree, tests_, *, tag, out_dir, timeout_s):
        clock.now += clock.run_s
        return inner(tree, tests_, tag=tag, out_dir=out_dir, timeout_s=timeout_s)
    return perf_run


def test_a_round_that_cannot_end_is_not_started(monkeypatch, tmp_path):
    # The H200 run of 2026-12-02 started round 2 with 46 s left after a 164 s round: its reference
    # run was killed at the budget and the round counted for nothing.
    script = _script()
    calls, clock = [], _Clock(run_s=100.0)
    monkeypatch.setattr(script, "perf_run", _timed_fake_perf(calls, clock))
    monkeypatch.setattr(script.time, "monotonic", clock)
    trees = {"base": tmp_path / "base", "reference": tmp_path / "reference"}
    walls = []
    runs, paired, notes = script.time_rounds(trees, [A], rounds=3, deadline=400, out_dir=tmp_path, walls=walls,
                                             ahead=False)
    assert calls == ["round1-base", "round1-reference"]  # 200 s left < 1.1 x 200 s
    assert paired == {A: 1} and notes == ["round 2: not started, 200 s left and the last round took 200 s"]
    assert walls == [{"tag": "round1-base", "wall_s": 100.0, "files": 1},
                     {"tag": "round1-reference", "wall_s": 100.0, "files": 1}]
    calls.clear()
    clock.now = 0.0
    _, paired, notes = script.time_rounds(trees, [A], rounds=3, deadline=430, out_dir=tmp_path, ahead=False)
    assert calls == ["round1-base", "round1-reference", "round2-reference", "round2-base"] and paired == {A: 2}


def test_the_budget_stops_rounds_and_says_so(monkeypatch, tmp_path):
    script = _script()
    calls, clock = [], _Clock(run_s=100.0)
    monkeypatch.setattr(script, "perf_run", _timed_fake_perf(calls, clock))
    monkeypatch.setattr(script.time, "monotonic", clock)
    trees = {"base": tmp_path / "base", "reference": tmp_path / "reference"}
    runs, paired, notes = script.time_rounds(trees, [A], rounds=3, deadline=110, out_dir=tmp_path, ahead=False)
    assert calls == ["round1-base"]
    assert paired == {A: 0} and "out of time" in notes[0]
    assert script.summarize(measure.Runs({"base": {}, "reference": {}}), 0) == {"rounds_done": 0}
    assert "| x | - | False | 0 | - |" in script.markdown([{"task": "x", "correct": False, "rounds_done": 0,
                                                             "errors": ["no round"]}])


def test_a_reference_override_is_timed_and_named_by_its_blob(tmp_path):
    script = _script()
    chosen = script.known_tasks(tasks.load_tasks())
    candidate = ROOT / "evals" / "fixtures" / "tilegym" / "dropout" / "faster2.py"
    assert script.reference_overrides(chosen, [f"tilegym-dropout={candidate}"]) == {"tilegym-dropout": candidate}
    for bad in ["tilegym-dropout", f"no-such-task={candidate}", f"tilegym-dropout={tmp_path / 'missing.py'}"]:
        with pytest.raises(ValueError):
            script.reference_overrides(chosen, [bad])
    git = subprocess.run(["git", "hash-object", str(candidate)], capture_output=True, text=True, cwd=ROOT)
    if git.returncode == 0:
        assert script.blob_hash(candidate) == git.stdout.strip()
    row = {"task": "t", "reference_file": str(candidate), "reference_blob": script.blob_hash(candidate),
           "correct": True, "rounds_done": 1, "geomean": 1.5, "round_geomeans": [1.5], "per_case": {"c": 1.5}}
    assert f"| t | faster2.py ({script.blob_hash(candidate)[:12]}) | True | 1 | 1.500 |" in script.markdown([row])


@needs_tilegym
def test_an_override_replaces_only_its_own_tasks_file(tmp_path):
    script = _script()
    chosen = [tasks.by_id(tasks.load_tasks(), i) for i in ("tilegym-dropout", "tilegym-geglu")]
    candidate = ROOT / "evals" / "fixtures" / "tilegym" / "dropout" / "faster2.py"
    trees = script.prepare(chosen, TILEGYM, tmp_path / "work", {"tilegym-dropout": candidate})
    assert (trees["reference"] / "src/tilegym/ops/cutile/dropout.py").read_bytes() == candidate.read_bytes()
    geglu = ROOT / "evals" / "fixtures" / "tilegym" / "geglu" / "faster.py"
    assert (trees["reference"] / "src/tilegym/ops/cutile/activation/geglu.py").read_bytes() == geglu.read_bytes()


def _has_tileiras() -> bool:
    try:
        from cuda.tile.compilation import export_kernel  # noqa: F401
    except ImportError:
        return False
    return shutil.which("tileiras") is not None or importlib.util.find_spec("cuda.tile") is not None


def _compile_check_as_the_fenced_file(task_id: str, op: str, kernel: str, spec: str, tmp_path: Path):
    """``compile-check`` of the fixture file ``kernel`` as the task's fenced file, in a built task repo."""
    task = tasks.by_id(tasks.load_tasks(), task_id)
    built = build.build(task, tmp_path / "repo", tilegym=TILEGYM)
    (rel,) = tasks.fence(task)
    fixture = ROOT / "evals" / "fixtures" / "tilegym" / op
    return subprocess.run([sys.executable, "-m", "cutile_perf", "compile-check", "--repo", str(built.repo),
                           "--kernel", str(fixture / kernel), "--as", rel, "--arch", "sm_90",
                           "--spec", str(fixture / spec)],
                          capture_output=True, text=True, cwd=built.repo)


@needs_tilegym
@pytest.mark.skipif(not _has_tileiras(), reason="no cuda-tile compiler here")
@pytest.mark.parametrize("task_id", list(OPS))
def test_the_faster_file_compiles_for_sm90(task_id, tmp_path):
    proc = _compile_check_as_the_fenced_file(task_id, OPS[task_id], "faster.py", "compile-check.yaml", tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " 0 failed, 0 without a signature" in proc.stdout


CANDIDATES = {"tilegym-dropout": "dropout", "tilegym-silu-and-mul": "silu_and_mul"}  # faster2.py, not yet timed


@needs_tilegym
@pytest.mark.skipif(not _has_tileiras(), reason="no cuda-tile compiler here")
@pytest.mark.parametrize("task_id", list(CANDIDATES))
def test_the_candidate_file_compiles_for_sm90(task_id, tmp_path):
    proc = _compile_check_as_the_fenced_file(task_id, CANDIDATES[task_id], "faster2.py", "compile-check2.yaml",
                                             tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert " 0 failed, 0 without a signature" in proc.stdout

"""``benchmarks/demo_ab_table.py``: the arms of a cut-short demo A/B compared at a step every run began."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script():
    spec = importlib.util.spec_from_file_location("demo_ab_table", ROOT / "benchmarks" / "demo_ab_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def demo_text(*steps: float) -> str:
    """A demo.txt as demo_ab.sh writes it: the baseline at 9.4 s, then step k at steps[k - 1]."""
    lines = ["harness: /x/scripts/cutile_perf/__init__.py", "   0.49 cutile-perf: copying the kernel suite",
             "   9.44 cutile-perf: baseline (3 perf runs for the noise floor)"]
    lines += [f"{t:7.2f} cutile-perf: step {k}/7: an optimization (expected: faster)" for k, t in enumerate(steps, 1)]
    lines.append(f"{steps[-1] + 5:7.2f} cutile-perf: iteration {len(steps)}: perf")
    return "\n".join(lines) + "\n"


def test_step_starts_reads_the_baseline_and_each_step():
    assert script().step_starts(demo_text(30.0, 40.5)) == {0: 9.44, 1: 30.0, 2: 40.5}


def test_run_folders_name_their_version():
    m = script()
    assert [m.version_of(Path(p)) for p in ("1-new", "2-new-nospares", "3-old-jobs3")] == \
        ["new", "new+nospares", "old+jobs3"]


def test_the_arms_are_compared_at_the_last_step_every_run_began(tmp_path):
    m = script()
    for name, steps in (("1-new", (30, 40, 51)), ("2-new-nospares", (36, 49)), ("3-new-nospares", (35, 50, 62)),
                        ("4-new", (29, 41, 52))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "demo.txt").write_text(demo_text(*steps))
    assert m.main([str(tmp_path)]) == 0
    runs = [(m.version_of(p), m.step_starts((p / "demo.txt").read_text())) for p in sorted(tmp_path.iterdir())]
    out = m.table(runs)
    # run 2 was cut before step 3: both arms are read at step 2
    assert "seconds until step 2 began (the baseline and 1 step(s) done):" in out
    assert "- new: median 40.5 s of 2 runs (40.0, 41.0); 1.000x the new median" in out
    assert "- new+nospares: median 49.5 s of 2 runs (49.0, 50.0); 1.222x the new median" in out


def test_a_run_that_never_began_a_step_says_so():
    m = script()
    assert m.table([("new", {0: 9.0}), ("new+nospares", {0: 9.0, 1: 30.0})])[-1] == \
        "some run never began step 1: no common step to compare"
    assert m.main(["/no/such/folder"]) == 2

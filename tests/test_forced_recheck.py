"""benchmarks/forced_recheck.py on the SIMULATED TileGym-shaped repo: every try's single run goes to
the harness's own re-check, of one case or of every case, so the rows price a re-check."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from fixtures_repo import KERNEL_REL, allow_no_gpu, kernel_source, tilegym_like_repo  # noqa: F401

from cutile_perf.cli import main
from cutile_perf.judge import verdict

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("forced_recheck", _BENCH / "forced_recheck.py")
forced_recheck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(forced_recheck)


@pytest.fixture
def unpatched_judge():
    decide, doubt = verdict.decide, verdict.cases_in_doubt
    yield
    verdict.decide, verdict.cases_in_doubt = decide, doubt


def test_each_try_is_re_checked_as_its_mode_says(tilegym_like_repo, capsys, unpatched_judge):
    repo = tilegym_like_repo
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm", "--timeout", "60"]) == 0
    allow_no_gpu(repo)
    assert main(["baseline", "--repo", str(repo), "--repeats", "2"]) == 0
    (repo / "sandbox/cand").mkdir(parents=True)
    tries = []
    for name in ("a", "b"):
        (repo / f"sandbox/cand/{name}.py").write_text(kernel_source() + f"\n# comment only {name}\n")
        tries.append({"optimization": f"comment {name}", "files": {KERNEL_REL: f"sandbox/cand/{name}.py"}})
    (repo / "sandbox/plan.yaml").write_text(yaml.safe_dump({"tries": tries}))
    capsys.readouterr()

    code = forced_recheck.main(["one,every", "batch", "--repo", str(repo), str(repo / "sandbox/plan.yaml")])

    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.err.count(forced_recheck.FORCED) == 2, "each forced re-check says so"
    rows = [json.loads(line) for line in (repo / "sandbox/experiments.jsonl").read_text().splitlines()][1:]
    assert [r["status"] for r in rows] == ["keep", "keep"]
    one, every = (r["decision"] for r in rows)
    assert one["source"] == "partial" and len(one["rechecked"]) == 1, "one case of two re-measured"
    assert every["source"] == "confirm", "every case re-measured"
    # 3 interleaved pairs each, or fewer when the pairs so far settled the verdict (comment-only
    # tries of a real, noisy child: either may happen).
    for row in rows:
        pairs = row["decision"]["settled_after"] or 3
        assert row["timings"]["recheck_runs"] == 2 * pairs, row["reason"]


def test_an_unknown_mode_is_refused_in_one_line():
    with pytest.raises(SystemExit, match="modes are one or every"):
        forced_recheck.Forcing(["some"])

"""Every command that reads ``sandbox/experiments.jsonl`` opens it through ``History.open``, so none
shows or uses a log that ``try`` refuses.

``report``, ``init`` and ``compile-check`` used to parse the log themselves: ``report`` rendered a
forged row as a result that ``try`` would call "not the log cutile-perf wrote". CPU only: the
simulated TileGym-shaped repository of ``fixtures_repo`` and the CLI in process.
"""
from __future__ import annotations

import json

from fixtures_repo import edit_kernel, git, tilegym_like_repo  # noqa: F401
from test_cli_loop import FAST, cli, session_repo  # noqa: F401

from cutile_perf.store.log import append_entry

LOG = "sandbox/experiments.jsonl"


def _forge_a_faster_baseline(repo) -> None:
    """Rewrite the baseline row to claim a 10x faster kernel: the chain still links, the anchor in
    git's folder no longer matches."""
    path = repo / LOG
    row = json.loads(path.read_text().splitlines()[0])
    row["latency_ms"] = row["latency_ms"] / 10
    path.write_text(json.dumps(row, sort_keys=True) + "\n")


def _refused_as_not_ours(code: int, data: dict) -> bool:
    return code == 3 and "not the log cutile-perf wrote" in json.dumps(data)


def test_report_refuses_the_log_try_refuses(session_repo, capsys):
    _forge_a_faster_baseline(session_repo)
    edit_kernel(session_repo, latency=FAST)
    code, data = cli(capsys, session_repo, "try", "after a forged baseline")
    assert _refused_as_not_ours(code, data), data
    git(session_repo, "checkout", "--", ".")
    code, data = cli(capsys, session_repo, "report")
    assert _refused_as_not_ours(code, data), data
    assert not (session_repo / "sandbox/report.md").exists(), "nothing rendered from the forged row"


def test_report_renders_the_log_try_accepts(session_repo, capsys):
    code, data = cli(capsys, session_repo, "report")
    assert code == 0 and data["iterations"] == 1, data


def test_compile_check_refuses_the_log_try_refuses(session_repo, capsys):
    """Its default arch comes from the log's rows: a forged row must not choose it."""
    _forge_a_faster_baseline(session_repo)
    code, data = cli(capsys, session_repo, "compile-check")
    assert _refused_as_not_ours(code, data), data


def test_init_refuses_a_left_over_log_try_would_refuse(tilegym_like_repo, capsys):
    """A log left in sandbox/ whose chain is broken is not shown as the new session's table."""
    path = tilegym_like_repo / LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    append_entry(path, {"iteration": 0, "optimization": "baseline", "status": "keep", "correctness": "PASS",
                        "latency_ms": 1.0})
    row = json.loads(path.read_text())
    path.write_text(json.dumps({**row, "prev": "f" * 64}) + "\n")  # links to no row: a broken chain
    code, data = cli(capsys, tilegym_like_repo, "init", "--kernel", "rms_norm", "--timeout", "60")
    assert _refused_as_not_ours(code, data), data
    assert not (tilegym_like_repo / "sandbox/session.yaml").exists(), "init left nothing half made"

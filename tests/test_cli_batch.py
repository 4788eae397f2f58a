"""``cutile-perf batch`` on the SIMULATED TileGym-shaped repo: several prepared candidates, one
``try`` each, in one job, never over the user's uncommitted work and never past its budget."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fixtures_repo import KERNEL_REL, allow_no_gpu, git, kernel_source, tilegym_like_repo  # noqa: F401

from cutile_perf.loop import budget as budget_mod
from cutile_perf.loop import plan
from cutile_perf.cli import main
from cutile_perf.errors import UsageError
from cutile_perf.store.history import History
from cutile_perf.store import session as session_mod

BASE = {"256x1024": 1.0, "4096x1024": 2.0}
FAST = {"256x1024": 0.5, "4096x1024": 1.0}
DECISION_OF_WRONG = "revert"  # try's decision for a wrong result (crash class wrong-result)
SLOW = {"256x1024": 1.5, "4096x1024": 3.0}


def cli(capsys, repo: Path, *args: str) -> tuple[int, dict]:
    code = main([args[0], "--repo", str(repo), "--json", *args[1:]])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


def main_text(capsys, repo: Path, *args: str) -> str:
    """What the command prints for a person (no --json)."""
    main([args[0], "--repo", str(repo), *args[1:]])
    return capsys.readouterr().out


@pytest.fixture
def session_repo(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    assert cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "60")[0] == 0
    allow_no_gpu(repo)
    assert cli(capsys, repo, "baseline", "--repeats", "2")[0] == 0
    return repo


def write_plan(repo: Path, entries: list[tuple[str, dict | str]]) -> Path:
    """Candidates in sandbox/cand/, and the plan naming them."""
    (repo / "sandbox/cand").mkdir(parents=True, exist_ok=True)
    tries = []
    for n, (name, latency) in enumerate(entries, 1):
        source = kernel_source(latency) if isinstance(latency, dict) else latency
        (repo / f"sandbox/cand/c{n}.py").write_text(source)
        tries.append({"optimization": name, "files": {KERNEL_REL: f"sandbox/cand/c{n}.py"}})
    path = repo / "sandbox/plan.yaml"
    path.write_text(yaml.safe_dump({"tries": tries}))
    return path


def test_batch_runs_each_candidate_as_its_own_try(session_repo, capsys):
    repo = session_repo
    path = write_plan(repo, [("faster", FAST), ("slower", SLOW), ("same as kept", FAST)])
    code, data = cli(capsys, repo, "batch", str(path))
    assert code == 0, data
    assert [e["decision"] for e in data["entries"]] == ["keep", "revert", "skipped"]
    rows = [json.loads(line) for line in (repo / "sandbox/experiments.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["optimization"], r["status"]) for r in rows[1:]] == [
        (1, "faster", "keep"), (2, "slower", "revert")]
    assert git(repo, "rev-parse", "HEAD").strip() == data["entries"][0]["commit"], "HEAD is the kept candidate"
    assert (repo / KERNEL_REL).read_text() == kernel_source(FAST)
    assert git(repo, "status", "--porcelain").strip() == "", "nothing is left applied"
    assert (repo / "sandbox/cand/c2.py").read_text() == kernel_source(SLOW), "candidates are never changed"


def test_batch_refuses_to_overwrite_uncommitted_fenced_work(session_repo, capsys):
    repo = session_repo
    path = write_plan(repo, [("faster", FAST)])
    mine = kernel_source(BASE) + "\n# my unsaved work\n"
    (repo / KERNEL_REL).write_text(mine)
    code = main(["batch", "--repo", str(repo), str(path)])
    assert code == 3 and "stash" in capsys.readouterr().err
    assert (repo / KERNEL_REL).read_text() == mine


def test_batch_starts_nothing_that_would_not_typically_finish_in_its_budget(session_repo, capsys):
    repo = session_repo
    path = write_plan(repo, [("faster", FAST), ("slower", SLOW)])
    # A budget no try fits: 1 s was held by a typical try once (the simulated children took well
    # under a second each on a fast moment of a loaded 2-core machine), and the try started.
    code, data = cli(capsys, repo, "batch", str(path), "--budget", "0.001")
    assert code == 0 and data["entries"] == [] and data["not_started"] == ["faster", "slower"]
    assert git(repo, "status", "--porcelain").strip() == ""
    assert len((repo / "sandbox/experiments.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("text, fragment", [
    ("tries: [", "not valid YAML"),
    ("tries: []", "non-empty list"),
    ("tries: [{optimization: x}]", "needs 'files'"),
    ("tries: [{optimization: '', files: {a.py: sandbox/a.py}}]", "no optimization"),
    ("tries: [{optimization: x, files: {/abs.py: sandbox/a.py}}]", "repo-relative"),
    ("tries: [{optimization: x, files: {a.py: sandbox/a.py}, extra: 1}]", "exactly"),
])
def test_plan_parse_names_what_is_wrong(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        plan.parse(text)


def test_plan_check_refuses_targets_outside_the_fence_and_candidates_outside_sandbox(tmp_path):
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox/c.py").write_text("x = 1\n")
    (tmp_path / "c.py").write_text("x = 1\n")
    plan.check(plan.parse("tries: [{optimization: x, files: {k.py: sandbox/c.py}}]"), root=tmp_path,
               fenced=lambda p: session_mod.fenced(p, ("k.py",)))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/conftest.py").write_text("")
    (tmp_path / "link.py").symlink_to(tmp_path / "tests/conftest.py")
    # sandbox/ listed too: the one fence rule never fences the session's own folder.
    fenced = lambda p: session_mod.fenced(p, ("k.py", "link.py", "sandbox/"))  # noqa: E731
    for text, fragment in (("{other.py: sandbox/c.py}", "not in the session's fence"),
                           ("{sandbox/session.yaml: sandbox/c.py}", "not in the session's fence"),
                           ("{link.py: sandbox/c.py}", "is a symlink"),
                           ("{k.py: c.py}", "not under sandbox/"), ("{k.py: sandbox/missing.py}", "not a file")):
        with pytest.raises(UsageError, match=fragment):
            plan.check(plan.parse(f"tries: [{{optimization: x, files: {text}}}]"), root=tmp_path, fenced=fenced)


def test_plan_digest_names_an_entry_by_its_description_targets_and_candidate_bytes(tmp_path):
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox/c.py").write_text("x = 1\n")
    entry = plan.parse("tries: [{optimization: 'occupancy  4', files: {k.py: sandbox/c.py}}]")[0]
    same = plan.parse("tries: [{optimization: occupancy 4, files: {k.py: sandbox/c.py}}]")[0]
    assert plan.digest(entry, tmp_path) == plan.digest(same, tmp_path)
    other = plan.parse("tries: [{optimization: occupancy 4, files: {j.py: sandbox/c.py}}]")[0]
    assert plan.digest(other, tmp_path) != plan.digest(entry, tmp_path)
    before = plan.digest(entry, tmp_path)
    (tmp_path / "sandbox/c.py").write_text("x = 2\n")  # the candidate was edited: a new entry
    assert plan.digest(entry, tmp_path) != before


def test_a_child_the_budgets_end_kills_leaves_an_interrupted_row_and_a_settled_tree(session_repo, capsys):
    """The real child path: every child's timeout ends with the budget, so a candidate whose tests
    outlast it is killed there, settled as interrupted (no verdict), and the rest is not started."""
    repo = session_repo
    code, data = cli(capsys, repo, "batch", str(write_plan(repo, [("x", FAST)])), "--check")
    budget = max(3.0, 1.5 * data["try_seconds"])
    path = write_plan(repo, [("sleeps past the budget", kernel_source(FAST, sleep=budget)), ("faster", FAST)])
    code, data = cli(capsys, repo, "batch", str(path), "--budget", f"{budget:.1f}")
    assert code == 0 and data["cut"] == "sleeps past the budget" and data["not_started"] == ["faster"], data
    row = [json.loads(line) for line in (repo / "sandbox/experiments.jsonl").read_text().splitlines()][-1]
    assert (row["status"], row["crash_class"]) == ("crash", "interrupted") and "budget" in row["reason"]
    assert git(repo, "status", "--porcelain").strip() == "" and not (repo / "sandbox/iteration.json").exists()
    assert git(repo, "rev-parse", "HEAD").strip() == row["base_commit"]


def test_batch_bad_plan_file_is_a_one_line_usage_error(session_repo, capsys):
    code = main(["batch", "--repo", str(session_repo), str(session_repo / "sandbox/nope.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot read the plan" in err and len(err.strip().splitlines()) <= 2


def test_batch_records_the_baseline_first_when_asked_and_none_exists(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    assert cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "60")[0] == 0
    allow_no_gpu(repo)
    path = write_plan(repo, [("faster", FAST)])
    code, _ = cli(capsys, repo, "batch", str(path))
    assert code == 3, "without --baseline, no baseline is a refusal"
    code, data = cli(capsys, repo, "batch", str(path), "--baseline", "2")
    assert code == 0 and [e["decision"] for e in data["entries"]] == ["keep"]
    rows = [json.loads(line) for line in (repo / "sandbox/experiments.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and len(rows[0]["shapes"]["256x1024"]["runs"]) == 2


def test_red_team_a_plan_cannot_overwrite_the_session_or_its_log(session_repo, capsys):
    """sandbox/ is scratch space for try, so a plan naming sandbox/session.yaml or the log as a
    target would pass a plain fence check: the batch refuses it before copying anything."""
    repo = session_repo
    before = {name: (repo / "sandbox" / name).read_bytes() for name in ("session.yaml", "experiments.jsonl")}
    (repo / "sandbox/cand").mkdir(parents=True, exist_ok=True)
    (repo / "sandbox/cand/evil.yaml").write_text("thresholds: {}\n")
    for target in ("sandbox/session.yaml", "sandbox/experiments.jsonl"):
        (repo / "sandbox/plan.yaml").write_text(yaml.safe_dump(
            {"tries": [{"optimization": "x", "files": {target: "sandbox/cand/evil.yaml"}}]}))
        assert main(["batch", "--repo", str(repo), str(repo / "sandbox/plan.yaml")]) == 2
        assert "not in the session's fence" in capsys.readouterr().err
    assert {name: (repo / "sandbox" / name).read_bytes() for name in before} == before


def test_a_candidate_that_crashes_is_one_crash_row_and_the_batch_goes_on(session_repo, capsys):
    repo = session_repo
    path = write_plan(repo, [("wrong results", kernel_source(FAST, behaviour="wrong")), ("faster", FAST)])
    code, data = cli(capsys, repo, "batch", str(path))
    assert code == 0, data
    decisions = [e["decision"] for e in data["entries"]]
    assert decisions == [DECISION_OF_WRONG, "keep"], decisions
    assert git(repo, "status", "--porcelain").strip() == ""
    assert (repo / KERNEL_REL).read_text() == kernel_source(FAST)


def test_check_finds_on_the_cpu_what_would_stop_the_gpu_job_and_runs_nothing(tilegym_like_repo, capsys):
    """Seen in a live eval: a queued GPU job stopped in 0.9 s on a session.yaml that could not
    load. `batch --check` finds that, a missing baseline, or a budget too small for one try, here."""
    repo = tilegym_like_repo
    assert cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "60")[0] == 0
    allow_no_gpu(repo)
    path = write_plan(repo, [("faster", FAST), ("slower", SLOW)])
    kernel_before = (repo / KERNEL_REL).read_text()
    code, data = cli(capsys, repo, "batch", str(path), "--check")
    assert (code, data["ready"]) == (1, False)  # no baseline and no --baseline: the job would refuse
    code, data = cli(capsys, repo, "batch", str(path), "--check", "--baseline", "1")
    assert (code, data["ready"], data["try_seconds"]) == (0, True, None)
    # Seen in an eval rehearsal: an agent left the session branch to commit its guess on main, and
    # --check still said ready; the job itself refuses on any other branch.
    git(repo, "checkout", "-q", "main")
    code, data = cli(capsys, repo, "batch", str(path), "--check", "--baseline", "1")
    assert (code, data["ready"]) == (1, False) and "not the session branch" in data["refused"]
    git(repo, "checkout", "-q", "-")

    session_yaml = repo / "sandbox/session.yaml"
    good = session_yaml.read_text()
    session_yaml.write_text(good.replace("min_confirm_pairs: 3", "min_confirm_pairs: 1"))
    assert main(["batch", "--repo", str(repo), str(path), "--check", "--baseline", "1"]) == 2
    assert "confirm pairs must satisfy" in capsys.readouterr().err
    session_yaml.write_text(good)

    assert cli(capsys, repo, "baseline", "--repeats", "1")[0] == 0
    rows_before = (repo / "sandbox/experiments.jsonl").read_text()
    code, data = cli(capsys, repo, "batch", str(path), "--check", "--budget", "100000")
    typical = data["try_seconds"]
    assert code == 0 and 0 < typical < data["try_seconds_bound"] and data["entries_that_fit"] == 2
    code, data = cli(capsys, repo, "batch", str(path), "--check", "--budget", str(typical / 2))
    assert (code, data["entries_that_fit"], data["ready"]) == (1, 0, False)
    # Nothing ran: no row, no commit, the kernel untouched.
    assert (repo / "sandbox/experiments.jsonl").read_text() == rows_before
    assert (repo / KERNEL_REL).read_text() == kernel_before


def test_check_warns_when_a_tilegym_op_s_first_job_may_hold_no_verdict(tilegym_like_repo, capsys):
    """Seen in the live dropout eval: both skill agents ran `batch --check --baseline N` for a 170 s
    job, got "ready", and their jobs recorded the baseline and no try (a perf run took 42-51 s).
    Before any run is timed, a target timed like TileGym's (CUPTI) is priced at the TileGym ops
    timed so far, and a budget below that range is named."""
    repo = tilegym_like_repo
    assert cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "60")[0] == 0
    allow_no_gpu(repo)
    path = write_plan(repo, [("faster", FAST)])
    session_yaml = repo / "sandbox/session.yaml"
    data = yaml.safe_load(session_yaml.read_text())
    assert data["timing"].get("method") != "cupti"  # the simulated suite times its own way: no warning
    code, out = cli(capsys, repo, "batch", str(path), "--check", "--baseline", "3", "--job-seconds", "170")
    assert code == 0 and "first_verdict_seconds" not in out
    data["timing"] = {**data["timing"], "method": "cupti"}  # as init reads TileGym's tests/config.py
    session_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    low, high = budget_mod.unmeasured_first_job_s(3)
    code, out = cli(capsys, repo, "batch", str(path), "--check", "--baseline", "3", "--job-seconds", "170")
    assert (code, out["ready"], out["first_verdict_seconds"]) == (0, True, [low, high])  # a warning, not a refusal
    text = main_text(capsys, repo, "batch", str(path), "--check", "--baseline", "3", "--job-seconds", "170")
    assert f"took about {low:.0f}-{high:.0f} s; this budget is 155 s, so the job may record the baseline and no try" \
        in text
    short = main_text(capsys, repo, "batch", str(path), "--check", "--baseline", "3", "--job-seconds", "60")
    assert "holds no verdict" in short and "ready for the GPU job" not in short  # issue 43: no contradiction
    assert "warning" not in main_text(capsys, repo, "batch", str(path), "--check", "--baseline", "3",
                                      "--job-seconds", "600")


def test_unmeasured_prices_span_the_tilegym_ops_timed_so_far():
    # silu_and_mul: baseline 104 s (3 runs) and a try of 38 s; dropout: baseline 155 s and a try
    # estimated at 66-69 s (benchmarks/results/2026-12-03-h200/README.md): both inside the range.
    low, high = budget_mod.unmeasured_first_job_s(3)
    assert low <= 104 + 38 and 155 + 66 <= high
    assert budget_mod.unmeasured_first_job_s(1)[1] < high


def test_one_job_prepared_before_init_runs_init_then_the_batch(tilegym_like_repo, capsys):
    """The one-job path SKILL.md teaches for a target whose tests need the GPU to collect (TileGym):
    candidates and plan written on the CPU box before any session exists, then `init` and `batch`
    in the same GPU job. init keeps what sandbox/ already holds."""
    repo = tilegym_like_repo
    path = write_plan(repo, [("faster", FAST), ("slower", SLOW)])
    assert cli(capsys, repo, "init", "--kernel", "rms_norm", "--timeout", "60")[0] == 0
    allow_no_gpu(repo)
    assert path.is_file() and (repo / "sandbox/cand/c1.py").is_file()
    code, data = cli(capsys, repo, "batch", str(path), "--baseline", "2", "--job-seconds", "600")
    assert code == 0, data
    assert [e["decision"] for e in data["entries"]] == ["keep", "revert"]

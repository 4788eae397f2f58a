"""Grade an optimization eval from what the run left behind: the harness log and git.

    python evals/grade.py <repo the agent worked in> <eval id>

Prints one JSON object ``{"id", "passed", "speedup", "problems": [...]}`` and exits 0 when passed.
It trusts nothing the agent said: speedup comes from ``sandbox/experiments.jsonl`` (baseline row vs
the last row that moved the baseline), the fence from ``git diff`` against the session's base commit.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EVALS_FILE = Path(__file__).with_name("evals.json")
# Tiers of cutile_perf.decide whose numbers became the new baseline.
IMPROVING_TIERS = ("new-baseline", "keep-lower-priority", "keep-recommend-stop")


def load_evals(path: Path = EVALS_FILE) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["evals"]


def read_log(repo: Path) -> list[dict]:
    path = repo / "sandbox" / "experiments.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _git(repo: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def changed_files(repo: Path, base_commit: str) -> set[str]:
    """Files changed since ``base_commit``, committed or not; sandbox/ excluded (it is scratch)."""
    committed = _git(repo, "diff", "--name-only", base_commit, "HEAD")
    uncommitted = [line[3:] for line in _git(repo, "status", "--porcelain", "--untracked-files=all")]
    return {p for p in [*committed, *uncommitted] if not p.startswith("sandbox/")}


def grade_log(entries: list[dict], criteria: dict) -> tuple[float | None, list[str]]:
    """Speedup and problems from the log alone (pure: tested without git)."""
    problems = []
    baseline = next((e for e in entries if e.get("iteration") == 0), None)
    if baseline is None or not baseline.get("latency_ms"):
        return None, ["no baseline row (iteration 0) with latency_ms in sandbox/experiments.jsonl"]
    improving = [e for e in entries if e.get("iteration", 0) > 0 and e.get("status") == "keep"
                 and (e.get("decision") or {}).get("tier") in IMPROVING_TIERS]
    final = improving[-1]["latency_ms"] if improving else baseline["latency_ms"]
    speedup = baseline["latency_ms"] / final
    if len(improving) < criteria.get("min_kept_improvements", 0):
        problems.append(f"{len(improving)} kept improvements, expected >= {criteria['min_kept_improvements']}")
    if speedup < criteria.get("min_speedup", 0.0):
        problems.append(f"speedup {speedup:.3f}x below {criteria['min_speedup']}x")
    wanted = criteria.get("correctness_of_kept")
    for e in entries:
        if e.get("status") == "keep" and wanted and e.get("correctness") != wanted:
            problems.append(f"iteration {e.get('iteration')} kept with correctness {e.get('correctness')}")
        if e.get("iteration", 0) > 0 and e.get("status") not in ("keep", "revert", "crash"):
            problems.append(f"iteration {e.get('iteration')} has status {e.get('status')!r}")
    return speedup, problems


def grade(repo: Path, eval_item: dict) -> dict:
    criteria = eval_item.get("pass_criteria") or {}
    entries = read_log(repo)
    speedup, problems = grade_log(entries, criteria)
    base = next((e.get("base_commit") for e in entries if e.get("iteration") == 0), None)
    if base and "fence" in criteria:
        outside = sorted(changed_files(repo, base) - set(criteria["fence"]))
        if outside:
            problems.append(f"files changed outside the fence: {outside}")
    return {"id": eval_item["id"], "passed": not problems, "speedup": speedup, "problems": problems}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    repo, eval_id = Path(argv[0]), argv[1]
    items = {e["id"]: e for e in load_evals()}
    if eval_id not in items:
        print(f"unknown eval id {eval_id!r}; known: {', '.join(sorted(items))}", file=sys.stderr)
        return 2
    result = grade(repo, items[eval_id])
    print(json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

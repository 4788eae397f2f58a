"""SKILL.md's remote-GPU worked example writes what its plan names, in order (issue 43).

Before: `init` does not create sandbox/cand/, and the plan named sandbox/cand/occ4.py, which no line
wrote. tests/test_runnable_examples.py runs the block; this checks that each candidate is compile-checked."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def remote_example() -> list[str]:
    text = (ROOT / "SKILL.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```bash[^\n]*\n(.*?)```", text, re.S) if "sandbox/cand/" in b)
    return block.splitlines()


def test_the_candidate_folder_is_made_before_the_first_candidate_is_written():
    lines = remote_example()
    made = next(i for i, line in enumerate(lines) if line.startswith("mkdir -p sandbox/cand"))
    first_write = next(i for i, line in enumerate(lines) if re.search(r">\s*sandbox/cand/", line))
    assert made < first_write


def test_every_candidate_the_plan_names_is_written_and_checked_before_it():
    lines = remote_example()
    plan_at = next(i for i, line in enumerate(lines) if "sandbox/plan.yaml <<" in line)
    named = {m for line in lines[plan_at:] for m in re.findall(r": (sandbox/cand/\S+\.py)\}", line)}
    written = {m for line in lines[:plan_at] for m in re.findall(r">\s*(sandbox/cand/\S+\.py)", line)}
    checked = {m for line in lines[:plan_at] for m in re.findall(r"compile-check --kernel (sandbox/cand/\S+\.py)", line)}
    assert named and named <= written and named <= checked, (named, written, checked)

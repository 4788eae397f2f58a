"""Docs by audience (issue 40 items 3 and 4): what an agent reads stays small, internals live in
docs/design.md, and the one knob table there stays true to the code both ways.

references/harness.md ships into users' repositories and an agent reads it whole when it needs a rule;
it had grown to about 23k tokens of internals. docs/design.md is where a developer learns how the
harness works. The knob table is the inventory a "delete what nothing needs" pass starts from, so a
knob missing from it, or a row for a knob the code dropped, defeats it.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from doccheck import OWN_UNPREFIXED_ENV_VARS, env_vars_named_in

from cutile_perf.judge.rules import Thresholds
from cutile_perf.store.session import Session

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "references" / "harness.md"
DESIGN = ROOT / "docs" / "design.md"

# At most 6k tokens (the issue asked "about 6k"), counted as characters / 4.
HARNESS_MAX_TOKENS = 6000

def knob_table_names(text: str) -> list[str]:
    """The first cell's name of every row between the knobs markers of design.md."""
    inside = text.split("<!-- knobs:begin -->\n", 1)[1].split("<!-- knobs:end -->", 1)[0]
    names = []
    for line in inside.splitlines():
        cell = line.split("|")[1].strip() if line.startswith("|") else ""
        match = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_]*)`", cell)
        if match:
            names.append(match.group(1))
    return names


def session_settings() -> set[str]:
    """The session.yaml keys: Session's fields (less the repository it was loaded from) and the
    thresholds."""
    return ({f.name for f in dataclasses.fields(Session)} - {"repo"}) | {f.name for f in dataclasses.fields(Thresholds)}


def test_harness_reference_stays_within_an_agents_budget():
    tokens = len(HARNESS.read_text(encoding="utf-8")) / 4
    assert tokens <= HARNESS_MAX_TOKENS, (
        f"references/harness.md is about {tokens:.0f} tokens (at most {HARNESS_MAX_TOKENS}): "
        "keep what an agent acts on there and move internals to docs/design.md")


def test_design_describes_the_internals_harness_md_left_out():
    headings = [line.lstrip("#").strip().lower() for line in DESIGN.read_text(encoding="utf-8").splitlines()
                if line.startswith("## ")]
    for topic in ("the box", "the probe scan", "the child pool", "the verdict path"):
        assert any(h.startswith(topic) for h in headings), f"docs/design.md has no section on {topic}"
    verdict_path = DESIGN.read_text(encoding="utf-8").split("## The verdict path", 1)[1].split("\n## ", 1)[0]
    for step in ("record_property", "History.record"):
        assert step in verdict_path, f"the verdict path does not reach {step}"


def test_every_env_var_and_setting_the_code_reads_is_in_the_knob_table():
    table = set(knob_table_names(DESIGN.read_text(encoding="utf-8")))
    wanted = env_vars_named_in(ROOT / "scripts") | set(OWN_UNPREFIXED_ENV_VARS) | session_settings()
    missing = sorted(wanted - table)
    assert not missing, f"docs/design.md's knob table lacks {missing}: add a row saying why each exists"


def test_the_knob_table_names_nothing_the_code_no_longer_reads():
    table = knob_table_names(DESIGN.read_text(encoding="utf-8"))
    assert len(table) == len(set(table)), "a knob has two rows"
    known = env_vars_named_in(ROOT / "scripts") | set(OWN_UNPREFIXED_ENV_VARS) | session_settings()
    stale = sorted(set(table) - known)
    assert not stale, f"docs/design.md's knob table names {stale}, which the code no longer reads: delete the rows"


def test_knob_helpers_on_a_sample(tmp_path):
    (tmp_path / "a.py").write_text('os.environ["CUTILE_PERF_NEW"]\n_CUTILE_PERF_GENERATED = 1\n'
                                   '"CUTILE_PERF_VERIFY_RESULT "\n', encoding="utf-8")
    assert env_vars_named_in(tmp_path) == {"CUTILE_PERF_NEW"}
    text = "x\n<!-- knobs:begin -->\n| Knob | Kind |\n| --- | --- |\n| `A_B` | env |\n| `c` | session |\n<!-- knobs:end -->\n"
    assert knob_table_names(text) == ["A_B", "c"]


# --- no dated measurements in docstrings and comments (issue 40 item 4) ---------------------------

# A path (``docs/results/2026-12-02-h200-speed.md``) may carry a date: it is the pointer itself.
_PATH = re.compile(r"\S*/\S*|\S+\.md\b")
_GPU_FIGURE = re.compile(r"\b(?:H100|H200)\b.*?\d(?:\.\d+)? ?(?:ms|us|s|%|x)\b|"
                         r"\d(?:\.\d+)? ?(?:ms|us|s|%|x)\b.*?\b(?:H100|H200)\b")
_DATED = re.compile(r"\bsession \d+\b|\b20\d\d-\d\d-\d\d\b")


def comment_and_docstring_lines(source: str) -> list[tuple[int, str]]:
    """``(line number, text)`` of every comment and docstring line of a Python source."""
    import ast
    import io
    import tokenize

    found = {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            for number in range(first.lineno, first.end_lineno + 1):
                found[number] = lines[number - 1]
    return sorted(found.items())


def dated_measurements(source: str) -> list[str]:
    """Comment or docstring lines that quote a figure of a named GPU, a session number or a date.
    Such figures go stale with the next toolchain; the results docs keep them with their commands."""
    problems = []
    for number, line in comment_and_docstring_lines(source):
        plain = _PATH.sub(" ", line)
        if _GPU_FIGURE.search(plain) or _DATED.search(plain):
            problems.append(f"{number}: {line.strip()}")
    return problems


def test_no_dated_measurements_in_docstrings_or_comments():
    problems = []
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        if "data" in path.relative_to(ROOT / "scripts").parts:  # the bundled kernels' links
            continue
        problems += [f"{path.relative_to(ROOT)}:{p}" for p in dated_measurements(path.read_text(encoding="utf-8"))]
    assert not problems, ("quote the results doc (docs/results/, references/h200-measurements.md) instead of "
                          "its figures:\n" + "\n".join(problems))


def test_dated_measurements_on_a_sample():
    source = ('"""Doc.\n\nOn the H200 it took 4.6 s.\n"""\n'
              "# see docs/results/2026-12-02-h200-speed.md, section 9\n"
              "# session 25 showed it\n"
              "x = 1  # measured 2026-11-30\n"
              "# The H200's L2 is 60 MB\n")
    assert [p.split(":")[0] for p in dated_measurements(source)] == ["3", "6", "7"]


def test_the_unprefixed_variables_listed_as_ours_are_read_by_the_code():
    code = (ROOT / "scripts" / "cutile_perf" / "knobs.py").read_text(encoding="utf-8")
    assert all(f'"{name}"' in code for name in OWN_UNPREFIXED_ENV_VARS), "a listed variable is no longer read"

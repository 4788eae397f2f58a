"""Every name the docs mention must exist: cuTile API, subcommands and flags, env vars, files.

Walks SKILL.md, references/*.md, README.md and docs/**/*.md. A doc that names something the code does not have
teaches an agent to call a command, flag or API that fails (TileGym's skills name
`result.best.time_ms`, `DISABLE_CUTILE_TUNE` and links that do not exist).
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from cutile_perf import cli, errors
import doccheck
from cutile_perf.skill import assets, playbook

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    p for p in [ROOT / "SKILL.md", ROOT / "README.md", *(ROOT / "references").glob("*.md"), *(ROOT / "docs").rglob("*.md")]
    if p.is_file()
)

# UPPER_CASE names with an underscore that the docs use as kernel constants or cubin attributes,
# not env vars. Keep this list short: every entry is a name the env-var check cannot see.
NOT_ENV_VARS = {"TILE_M", "TILE_N", "TILE_K", "BLOCK_SIZE", "GROUP_SIZE_M", "NUM_SM", "NUM_SMS", "TILE_SIZE",
                "EIATTR_CTA_PER_CLUSTER"}

# Files other engineers are writing while this test is being written. The link is kept (it is
# where the reader must go); once the file exists it is checked like every other one.
PENDING_FILES: dict[str, str] = {}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _doc_ids():
    return [_rel(p) for p in DOCS]


@pytest.fixture(scope="module")
def cuda_tile():
    try:
        return importlib.import_module("cuda.tile")
    except Exception as exc:  # a broken install raises more than ImportError
        pytest.skip(f"cuda-tile is not importable ({type(exc).__name__}): API names not checked")


def _resolve(dotted: str) -> bool:
    """Import the longest module prefix of ``dotted``, then getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_docs_exist():
    assert (ROOT / "SKILL.md").is_file()
    assert len(list((ROOT / "references").glob("*.md"))) >= 8


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_cuda_tile_names_resolve(doc, cuda_tile):
    missing = sorted(n for n in doccheck.ct_names(doc.read_text()) if not _resolve(n))
    assert not missing, f"{_rel(doc)} names cuda.tile attributes that cuda-tile {cuda_tile.__version__} lacks: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_subcommands_and_flags_exist(doc):
    names = set(cli.subcommand_names())
    problems = []
    for line, sub, flags in doccheck.subcommand_mentions(doc.read_text()):
        if sub not in names:
            problems.append(f"line {line}: `cutile-perf {sub}` is not a subcommand")
            continue
        allowed = cli.subcommand_flags(sub)
        problems += [f"line {line}: `cutile-perf {sub} {f}`: no such flag" for f in flags if f not in allowed]
    assert not problems, f"{_rel(doc)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_env_vars_are_declared(doc):
    known = (doccheck.env_vars_named_in(ROOT / "scripts") | set(doccheck.OWN_UNPREFIXED_ENV_VARS)
             | set(doccheck.FOREIGN_ENV_VARS) | NOT_ENV_VARS)
    unknown = sorted(doccheck.env_var_mentions(doc.read_text()) - known)
    assert not unknown, (
        f"{_rel(doc)} mentions env vars that neither the code reads nor doccheck.FOREIGN_ENV_VARS lists: {unknown}"
    )


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_links_and_paths_exist(doc):
    text = doc.read_text()
    missing = []
    for link in doccheck.relative_links(text):
        target = (doc.parent / link).resolve()
        # Outside the repository (`../shared/notes/...`) is not shipped, even where it exists here.
        if (not target.exists() or _rel_or_none(target) is None) and _rel_or_none(target) not in PENDING_FILES:
            missing.append(f"link {link}")
    for path in doccheck.local_paths(text):
        if not (ROOT / path).exists() and path not in PENDING_FILES:
            missing.append(f"path {path}")
    assert not missing, f"{_rel(doc)} points at files that do not exist: {sorted(missing)}"


def _rel_or_none(path: Path) -> str | None:
    try:
        return _rel(path)
    except ValueError:
        return None


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_every_figure_has_its_source_next_to_it(doc):
    # Issue 11: a figure without its run command or public source cannot be checked or re-run, and a
    # run figure that does not say "median" or "single run" hides how much noise it carries. Links
    # that count as a source must be shipped: test_links_and_paths_exist checks them.
    problems = []
    for claim in doccheck.quantitative_claims(doc.read_text()):
        if not claim.sourced and not claim.unverified:
            problems.append(f"{_rel(doc)}:{claim.line}: {claim.text!r} has no source next to it")
        elif claim.run and not claim.labelled:
            problems.append(f"{_rel(doc)}:{claim.line}: {claim.text!r} is from a run: say 'median' or 'single run'")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_python_blocks_parse(doc):
    for block in doccheck.python_blocks(doc.read_text()):
        try:
            ast.parse(block.text)
        except SyntaxError as exc:
            pytest.fail(f"{_rel(doc)}:{block.line + (exc.lineno or 1) - 1}: python block does not parse: {exc.msg}")


def test_skill_frontmatter_and_length():
    meta, body = assets.split_frontmatter((ROOT / "SKILL.md").read_text())
    assert meta.get("name") == "cutile-perf"
    description = meta.get("description", "")
    assert 0 < len(description) < 1024, f"description is {len(description)} characters"
    assert "not for" in description.lower(), "the description must end with what the skill is not for"
    assert "cuda-tile" in str(meta.get("compatibility", ""))
    assert len(body.splitlines()) < 500


def test_readme_and_skill_stay_lean():
    # Issue 20 item 6, issue 21 item 5: README is for a user (measurement logs live in docs/), and
    # SKILL.md is a router an agent reads whole on every task (details live in references/).
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 220, f"README.md has {len(readme.splitlines())} lines: move details to docs/"
    skill = (ROOT / "SKILL.md").read_text(encoding="utf-8")
    assert len(skill) / 4 < 5000, f"SKILL.md is about {len(skill) / 4:.0f} tokens: move details to references/"
    assert "<!--" not in skill, "SKILL.md has an HTML comment: an agent reads it as text"


def test_every_reference_says_when_to_read_it():
    # SKILL.md routes with one table, "| Read this when ... | File |": one row per reference file.
    skill = (ROOT / "SKILL.md").read_text(encoding="utf-8")
    lines = skill.splitlines()
    header = next((k for k, line in enumerate(lines) if line.startswith("| Read this when")), None)
    assert header is not None, "SKILL.md has no '| Read this when ... | File |' routing table"
    end = next((k for k in range(header, len(lines)) if not lines[k].startswith("|")), len(lines))
    table = lines[header + 2:end]
    for ref in sorted((ROOT / "references").glob("*.md")):
        head = "\n".join(ref.read_text(encoding="utf-8").splitlines()[:8])
        assert "Read this when" in head, f"{_rel(ref)}: its first lines do not say when to read it"
        rows = [row for row in table if f"(references/{ref.name})" in row]
        assert len(rows) == 1, f"SKILL.md's routing table needs one row for references/{ref.name}, has {len(rows)}"


def test_long_references_have_a_table_of_contents():
    for ref in (ROOT / "references").glob("*.md"):
        text = ref.read_text()
        if len(text.splitlines()) > 300:
            assert "## Contents" in text, f"{_rel(ref)} is over 300 lines and has no '## Contents'"


def test_skill_routes_to_every_reference():
    skill = (ROOT / "SKILL.md").read_text()
    unrouted = [p.name for p in (ROOT / "references").glob("*.md") if f"references/{p.name}" not in skill]
    assert not unrouted, f"SKILL.md never points to: {unrouted}"


def test_playbook_doc_follows_the_harness_table():
    # `init`/`status` suggest items by letter from cutile_perf.skill.playbook; the doc must use the same
    # letters and the same order, or the agent is sent to the wrong section.
    text = (ROOT / "references" / "optimization-playbook.md").read_text()
    for letter in playbook.PLAYBOOK:
        assert f"\n## {letter} " in text, f"optimization-playbook.md has no section '## {letter} ...'"
    for bound, letters in playbook.PRIORITY.items():
        line = f"- {bound}: " + " -> ".join(letters)
        assert line in text, f"optimization-playbook.md lacks the harness order: {line!r}"



def exit_codes_markdown() -> str:
    """The exit-code table (errors.EXIT_CODES) as SKILL.md and references/harness.md carry it."""
    rows = "".join(f"| {code} | {meaning} |\n" for code, meaning in errors.EXIT_CODES)
    return "| Code | Meaning |\n| --- | --- |\n" + rows


def test_exit_code_tables_are_the_generated_one():
    # Issue 21: `--help` said a wrong result exits 4 while harness.md said 1. One table in
    # errors.EXIT_CODES; every --help prints it (test_cli_help), SKILL.md and harness.md copy it.
    table = exit_codes_markdown()
    harness = (ROOT / "references" / "harness.md").read_text(encoding="utf-8")
    inside = harness.split("<!-- exit-codes:begin -->\n", 1)[1].split("<!-- exit-codes:end -->", 1)[0]
    assert inside == table, "regenerate with tests/test_docs.py's exit_codes_markdown()"
    # SKILL.md takes no HTML comment (test_readme_and_skill_stay_lean): the copy is found whole.
    assert table in (ROOT / "SKILL.md").read_text(encoding="utf-8"), \
        "SKILL.md: paste tests/test_docs.py's exit_codes_markdown()"


def test_a_wrong_result_is_exit_1_in_the_exit_code_table():
    meanings = dict(errors.EXIT_CODES)
    assert "wrong result" in meanings[errors.EXIT_REJECTED]
    assert "wrong result" not in meanings[errors.EXIT_CRASH]
    assert len(meanings) == len(errors.EXIT_CODES)  # one meaning per code


_PIN = re.compile(r"[a-z][a-z0-9-]*(?:\[[^\]]*\])?(?:[<>=!~][^\s\"'`]*)?")


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_pip_lines_that_install_cuda_tile_carry_the_tileiras_pin(doc):
    # cuda-tile's own tileiras extra allows tileiras 13.2, which cannot target Hopper: a doc's install
    # line must carry the tileiras pin of the gpu extra (child/envcheck.py, checked against
    # pyproject.toml by tests/test_envcheck.py), or a record of an older install its cuda-toolkit pin.
    from packaging.requirements import InvalidRequirement, Requirement

    from cutile_perf.child import envcheck

    tileiras = next(Requirement(r) for r in envcheck.TOOLCHAIN_REQUIREMENTS if "tileiras" in r)
    bad = []
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if "pip install" not in line or "cuda-tile" not in line:
            continue
        reqs = []
        for word in _PIN.findall(line):
            try:
                reqs.append(Requirement(word))
            except InvalidRequirement:
                continue
        if not any((r.name == tileiras.name and r.specifier == tileiras.specifier)
                   or (r.name == "cuda-toolkit" and "tileiras" in r.extras and r.specifier == tileiras.specifier)
                   for r in reqs):
            bad.append(f"line {number}: {line.strip()}")
    assert not bad, f"{_rel(doc)}: add '{tileiras}' (the gpu extra's pin):\n" + "\n".join(bad)

# --- the extraction helpers themselves ------------------------------------------------------------


def test_extractors_on_a_sample():
    sample = (
        "Use `ct.load` then `cuda.tile.tune.exhaustive_search`; see [k](knobs.md#x) and `scripts/perf_loop.py`.\n"
        "Run `cutile-perf try \"x\" --json` and set `CUDA_TILE_LOGS` or `CUDA_HOME=` first.\n"
        "The act.relu name is not cuTile; `TILE_M` is a constant.\n"
        "```bash\nCUDA_TILE_LOGS=CUTILEIR cutile-perf baseline --repeats 5 | tee x --other\n```\n"
        "```python\nk = ct.kernel(f, occupancy=2)\nfoo(GROUP_SIZE_M=8)\n```\n"
    )
    assert doccheck.ct_names(sample) == {"cuda.tile.load", "cuda.tile.tune.exhaustive_search", "cuda.tile.kernel"}
    assert [(s, f) for _, s, f in doccheck.subcommand_mentions(sample)] == [
        ("try", ("--json",)),
        ("baseline", ("--repeats",)),
    ]
    assert doccheck.env_var_mentions(sample) == {"CUDA_TILE_LOGS", "CUDA_HOME", "TILE_M"}
    assert doccheck.relative_links(sample) == {"knobs.md"}
    assert doccheck.local_paths(sample) == {"scripts/perf_loop.py"}
    assert len(doccheck.python_blocks(sample)) == 1


def test_frontmatter_split():
    meta, body = assets.split_frontmatter("---\nname: a\ndescription: b\n---\nbody\n")
    assert meta == {"name": "a", "description": "b"} and body == "body\n"
    assert assets.split_frontmatter("no frontmatter") == ({}, "no frontmatter")


def _claims(text: str) -> list[tuple[str, bool, bool, bool]]:
    return [(c.text, c.sourced, c.run, c.labelled) for c in doccheck.quantitative_claims(text)]


def test_claims_are_figures_with_a_unit_outside_code():
    text = (
        "Copy: 4.25 TB/s, 805 TFLOP/s, 0.271 ms and 5.25 us or 5.25 µs, 92 % and 92%, 2.1x faster, +5.1 %,\n"
        "0.8-1.3 % and 59 to 88 %; 1 min 58 s.\n"
        "Not: `0.3 ms` in code, tileiras 13.4, sm_90, 262144x1024, 4096^3, a goal >= 3x and < 0.5 s,\n"
        "step 05 -2.0 %, 0.4 -> 0.2 ms is an arrow <!-- 9 ms -->, [7 ms](7ms.md), https://a.b/5%.\n"
        "```\n0.5 ms\n```\n"
    )
    assert [c[0] for c in _claims(text)] == [
        "4.25 TB/s", "805 TFLOP/s", "0.271 ms", "5.25 us", "5.25 µs", "92 %", "92%", "2.1x", "+5.1 %",
        "0.8-1.3 %", "59 to 88 %", "1 min", "58 s", "-2.0 %", "0.2 ms", "7 ms",
    ]


def test_a_source_counts_only_in_the_figure_s_own_unit():
    unsourced = "The kernel ran in 0.27 ms.\n\nMeasured with `python benchmarks/kernels.py`, single run.\n"
    assert _claims(unsourced) == [("0.27 ms", False, False, False)]
    assert _claims("- 0.27 ms (`python benchmarks/kernels.py --markdown`, single run)\n- 0.3 ms\n") == [
        ("0.27 ms", True, True, True), ("0.3 ms", False, False, False)]
    # A run must say how many: "median" (of >= 3 runs) or "single run".
    assert _claims("0.27 ms, `cutile-perf baseline --repeats 3`.\n") == [("0.27 ms", True, True, False)]
    assert _claims("0.27 ms, median of 3, `PYTHONPATH=x timeout 9 python -m pytest -q`.\n")[0][1:] == (True, True, True)
    # A link, a bare public URL or "Source:" is a source; a pure anchor is not.
    assert _claims("4.8 TB/s ([datasheet](https://www.nvidia.com/en-us/data-center/h200/)).\n")[0][1:3] == (True, False)
    assert _claims("4.8 TB/s, https://www.nvidia.com/en-us/data-center/h200/\n")[0][1] is True
    assert _claims("4.25 TB/s, see [measurements](h200-measurements.md).\n")[0][1] is True
    assert _claims("4.8 TB/s. Source: the H200 datasheet.\n")[0][1] is True
    assert _claims("4.25 TB/s, see [below](#noise).\n")[0][1] is False
    assert doccheck.quantitative_claims("276 us (unverified: command not recorded).\n")[0].unverified
    # `cutile-perf` is a run only with a measuring subcommand.
    assert _claims("0.27 ms, `cutile-perf example show rms_norm`.\n")[0][1] is False


def test_a_table_shares_its_caption_and_its_command_block():
    text = (
        "```bash\npython benchmarks/autotune.py\n```\n\n"
        "Matmul, single run:\n\n| a | b |\n|---|---|\n| 1.2 s | 2.1x |\n\nThe 16-config row: 4.4x.\n\n"
        "A later paragraph: 3.0 s.\n"
    )
    assert _claims(text) == [("1.2 s", True, True, True), ("2.1x", True, True, True), ("4.4x", True, True, True),
                             ("3.0 s", False, False, False)]


def test_not_measured_marker_exempts_its_unit_only():
    text = (
        "<!-- not-measured: thresholds of session.yaml -->\n| threshold | 2 % |\n| floor | 0.5 % |\n\n"
        "## Measured\n\nA measured 0.27 ms.\n\n"
        "- a default of 5 s <!-- not-measured: a config default -->\n- 3 s\n"
    )
    assert [c[0] for c in _claims(text)] == ["0.27 ms", "3 s"]
    assert _claims("<!-- not-measured: -->\n5 %\n") == [("5 %", False, False, False)]  # a reason is required

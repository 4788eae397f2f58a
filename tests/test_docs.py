"""Every name the docs mention must exist: cuTile API, subcommands and flags, env vars, files.

Walks SKILL.md, references/*.md and README.md. A doc that names something the code does not have
teaches an agent to call a command, flag or API that fails (TileGym's skills name
`result.best.time_ms`, `DISABLE_CUTILE_TUNE` and links that do not exist).
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from cutile_perf import cli, doccheck, knobs, playbook

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    p for p in [ROOT / "SKILL.md", ROOT / "README.md", *(ROOT / "references").glob("*.md")] if p.is_file()
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
    known = set(knobs.OWN_ENV_VARS) | set(knobs.FOREIGN_ENV_VARS) | NOT_ENV_VARS
    unknown = sorted(doccheck.env_var_mentions(doc.read_text()) - known)
    assert not unknown, (
        f"{_rel(doc)} mentions env vars missing from knobs.OWN_ENV_VARS/FOREIGN_ENV_VARS: {unknown}"
    )


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_links_and_paths_exist(doc):
    text = doc.read_text()
    missing = []
    for link in doccheck.relative_links(text):
        target = (doc.parent / link).resolve()
        if not target.exists() and _rel_or_none(target) not in PENDING_FILES:
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
def test_python_blocks_parse(doc):
    for block in doccheck.python_blocks(doc.read_text()):
        try:
            ast.parse(block.text)
        except SyntaxError as exc:
            pytest.fail(f"{_rel(doc)}:{block.line + (exc.lineno or 1) - 1}: python block does not parse: {exc.msg}")


def test_skill_frontmatter_and_length():
    meta, body = doccheck.split_frontmatter((ROOT / "SKILL.md").read_text())
    assert meta.get("name") == "cutile-perf"
    description = meta.get("description", "")
    assert 0 < len(description) < 1024, f"description is {len(description)} characters"
    assert "not for" in description.lower(), "the description must end with what the skill is not for"
    assert "cuda-tile" in str(meta.get("compatibility", ""))
    assert len(body.splitlines()) < 500


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
    # `init`/`status` suggest items by letter from cutile_perf.playbook; the doc must use the same
    # letters and the same order, or the agent is sent to the wrong section.
    text = (ROOT / "references" / "optimization-playbook.md").read_text()
    for letter in playbook.PLAYBOOK:
        assert f"\n## {letter} " in text, f"optimization-playbook.md has no section '## {letter} ...'"
    for bound, letters in playbook.PRIORITY.items():
        line = f"- {bound}: " + " -> ".join(letters)
        assert line in text, f"optimization-playbook.md lacks the harness order: {line!r}"


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
    meta, body = doccheck.split_frontmatter("---\nname: a\ndescription: b\n---\nbody\n")
    assert meta == {"name": "a", "description": "b"} and body == "body\n"
    assert doccheck.split_frontmatter("no frontmatter") == ({}, "no frontmatter")

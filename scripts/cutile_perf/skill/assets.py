"""Where the files cutile-perf ships live: the skill (SKILL.md + references/) and the bundled kernels.

A wheel carries them as package data under ``cutile_perf/data/``; in a checkout that directory holds
symlinks to the top-level ``SKILL.md``, ``references/`` and ``examples/kernels/``, so both cases are
found in the same place. The checkout itself is the fallback for a source tree whose symlinks were
lost (an archive unpacked on a filesystem without them). Templates are found by
``templating.template_dirs``.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from cutile_perf import checkout_root, knobs
from cutile_perf.errors import EnvMissing, Refused

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
REINSTALL_HINT = "reinstall cutile-perf (pip install cutile-perf, or pip install -e <checkout>)"


def _first(candidates: list[Path], marker: str, what: str) -> Path:
    for base in candidates:
        if (base / marker).exists():
            return base
    looked = ", ".join(str(c) for c in candidates)
    raise EnvMissing(f"{what} not found in the cutile-perf installation (looked in {looked})", REINSTALL_HINT)


def skill_source() -> Path:
    """The directory holding ``SKILL.md`` and ``references/``."""
    return _first([DATA_DIR, checkout_root()], "SKILL.md", "SKILL.md")


def kernel_suite() -> Path:
    """The bundled TileGym-shaped kernel suite (``src/tilesuite``, ``tests/``, ``optimizations/``)."""
    return _first([DATA_DIR / "kernels", checkout_root() / "examples" / "kernels"], "src/tilesuite",
                  "the bundled kernel suite")


WITHHELD_HINT = "work from the playbook (references/optimization-playbook.md) and the other ops' steps"


def steps_withheld(op: str) -> bool:
    """Whether an evaluation of ``op`` is running: its prepared steps are its answers, so they stay hidden."""
    return op in knobs.withheld_examples()


def refuse_if_withheld(op: str) -> None:
    """Refuse (exit 3) to show or apply ``op``'s prepared steps while they are withheld."""
    if steps_withheld(op):
        raise Refused(f"the prepared steps of {op} are withheld in this evaluation", WITHHELD_HINT)


def split_frontmatter(text: str) -> tuple[dict, str]:
    """YAML frontmatter (between leading ``---`` lines) and the body after it."""
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---\n", 4)
    if end < 0:
        raise ValueError("frontmatter starts with --- but never ends")
    meta = yaml.safe_load(text[4:end]) or {}
    if not isinstance(meta, dict):
        raise ValueError("frontmatter is not a mapping")
    return meta, text[end + 5:]

"""Templates under ``templates/`` through one jinja2 environment, and the filters they use.

Used by the loop's views, ``scaffold-perf``, the autotune template and the TileIR report; it sits at
the bottom so that none of them imports another to find a template.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from cutile_perf import checkout_root
from cutile_perf.errors import displayable

if TYPE_CHECKING:  # jinja2 is imported on first render only: commands that render nothing skip it
    import jinja2

PACKAGE_DIR = Path(__file__).resolve().parent


def template_dirs() -> list[Path]:
    """Where templates are looked up: package data first (an installed wheel), then the checkout."""
    candidates = [PACKAGE_DIR / "templates", checkout_root() / "templates"]
    return [d for d in candidates if d.is_dir()]


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    import jinja2

    dirs = template_dirs()
    if not dirs:
        raise FileNotFoundError(f"no templates directory found (looked in {PACKAGE_DIR / 'templates'} and "
                                f"{checkout_root() / 'templates'}); reinstall cutile-perf")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
        undefined=jinja2.StrictUndefined,  # a misspelt field fails loudly instead of rendering blank
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # markdown, not HTML
    )
    env.filters.update(ms6=format_ms6, md=markdown_cell, mdcode=markdown_code, pct=format_pct, times=format_speedup)
    return env


def load_template(name: str) -> jinja2.Template:
    """A template by its path under ``templates/`` (``"perf_results.md.j2"``, ``"autotune/x.py.j2"``)."""
    return _environment().get_template(name)


# --- formatting filters --------------------------------------------------------------------------


def format_ms6(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def format_pct(value: float | None) -> str:
    return "-" if value is None else format_change(value)


def format_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def markdown_cell(value) -> str:
    """Text from the log or the user that cannot break a table row, a terminal or a rendered page:
    one line, terminal control dropped (``output.displayable``), HTML's ``& < >`` escaped, pipes
    escaped."""
    text = displayable("" if value is None else value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def markdown_code(value) -> str:
    """Text as one inline code span (shown verbatim, so no HTML escaping): one line, no terminal
    control, fenced with more backticks than it holds."""
    text = displayable("" if value is None else value)
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"




def format_change(change: float) -> str:
    """A relative change as text: ``-0.031`` -> ``"-3.1 %"``."""
    return f"{change * 100:+.1f} %"

"""Render the TileIR optimization report (``templates/tileir_report.md.j2``).

The template receives only what was run: the classification, the transformations, an optional
``verify-triton --json`` result and the live ``tileir-check``. Every section without data says
"not run" and why; no number is made up.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

TEMPLATES_DIR = Path(__file__).resolve().parents[3] / "templates"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1e}"


def render(*, kernel_file: str, classification: dict[str, Any], transformation: dict[str, Any] | None,
           verification: dict[str, Any] | None, tileir: dict[str, Any], output_file: str | None) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["sci"] = _fmt
    return env.get_template("tileir_report.md.j2").render(
        kernel_file=kernel_file, c=classification, transformation=transformation, verification=verification,
        tileir=tileir, output_file=output_file)

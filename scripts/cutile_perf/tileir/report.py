"""Render the TileIR optimization report (``templates/tileir_report.md.j2``).

The template receives only what was run: the classification, the transformations, an optional
``verify-triton --json`` result and the live ``tileir-check``. Every section without data says
"not run" and why; no number is made up.
"""
from __future__ import annotations

from typing import Any

from cutile_perf.templating import load_template


def render(*, kernel_file: str, classification: dict[str, Any], transformation: dict[str, Any] | None,
           verification: dict[str, Any] | None, tileir: dict[str, Any], output_file: str | None) -> str:
    return load_template("tileir_report.md.j2").render(
        kernel_file=kernel_file, c=classification, transformation=transformation, verification=verification,
        tileir=tileir, output_file=output_file)

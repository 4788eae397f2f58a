"""Benchmark records of TileGym-shaped perf tests.

A perf test calls ``record_property("benchmark", result)`` with ``result`` shaped
``{framework: {direction: stats}}``, for example
``{"cutile": {"forward": {"mean": ..., "median": ..., "rel_std": ..., "nrep": 160, ...}}}``.
Times are milliseconds and ``rel_std`` is a percentage. This module reads that dict from the
JSON-lines file our pytest plugin appends to (``read_records_file``) into a flat list of
``ShapeRecord``; the plugin prints TileGym's ``--print-record`` line (``format_print_record_line``).

A value given as a Python repr is parsed by a small literal reader, never ``eval``: besides plain
literals it accepts ``inf``/``nan`` and numpy scalar reprs such as ``np.float64(0.27)``, which
numpy 2 prints.
"""
from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cutile_perf.errors import EXIT_CRASH, CutilePerfError

BENCHMARK_PROPERTY = "benchmark"

# pytest arguments that load our record plugin in a target's pytest run. The pytest11 entry point
# carries the module's own name, so this is a no-op where the entry point is installed and loads the
# plugin where it is not (a target venv that only has cutile_perf on PYTHONPATH). The older entry
# point name "cutile_perf" is blocked: with both, pytest would register one module under two names
# and stop with "Plugin already registered under a different name".
PYTEST_PLUGIN_ARGS = ("-p", "no:cutile_perf", "-p", "cutile_perf.pytest_plugin")
# For runs in the user's own work tree (survey, compile-check --record), which promise to change
# nothing there: pytest's cache provider would leave a .pytest_cache folder behind.
NO_CACHE_ARGS = ("-p", "no:cacheprovider")


class RecordError(CutilePerfError, ValueError):
    """A benchmark record that cannot be read; in the loop this is the ``no-record`` crash class."""

    exit_code = EXIT_CRASH


@dataclass(frozen=True)
class ShapeRecord:
    """One timing: one test (one shape), one framework, one direction (forward/backward)."""

    test_id: str
    framework: str
    direction: str
    # Excluded from hashing: a dict is unhashable, and identity is (test, framework, direction).
    stats: dict = field(hash=False)
    outcome: str = "passed"

    @property
    def median(self) -> float:
        return float(self.stats["median"])


# --- parsing ------------------------------------------------------------------------------------

_NUMPY_SCALAR = re.compile(r"^(np|numpy)\.(float|int|uint|bool)\w*$")
_NAMED_FLOATS = {"inf": math.inf, "nan": math.nan}


def _literal(node: ast.AST) -> Any:
    """The value of a literal expression; anything that would need evaluation is refused."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("dict unpacking (**) is not a literal")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _NAMED_FLOATS:
        return _NAMED_FLOATS[node.id]
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        # numpy 2 reprs scalars as np.float64(0.27); the value inside is what the test measured.
        if _NUMPY_SCALAR.match(ast.unparse(node.func)):
            return _literal(node.args[0])
    raise ValueError(f"not a literal: {ast.unparse(node)[:60]}")


def literal_value(text: str) -> Any:
    """Parse the Python repr of a benchmark dict without evaluating code."""
    try:
        return _literal(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError) as exc:
        raise RecordError(f"benchmark value is not a Python literal: {exc}: {text[:80]!r}") from None


def parse_benchmark(test_id: str, value: Any, *, outcome: str = "passed") -> list[ShapeRecord]:
    """Flatten one ``{framework: {direction: stats}}`` record (a dict or its repr string)."""
    if isinstance(value, str):
        value = literal_value(value)
    if not isinstance(value, dict) or not value:
        raise RecordError(f"{test_id}: benchmark record is not a non-empty dict: {str(value)[:80]!r}")
    records = []
    for framework, directions in value.items():
        if not isinstance(directions, dict):
            raise RecordError(f"{test_id}: benchmark[{framework!r}] is not a dict of directions")
        for direction, stats in directions.items():
            if not isinstance(stats, dict) or not isinstance(stats.get("median"), (int, float)):
                raise RecordError(f"{test_id}: benchmark[{framework!r}][{direction!r}] has no numeric median")
            records.append(ShapeRecord(test_id, str(framework).lower(), str(direction), dict(stats), outcome))
    return records


def format_print_record_line(framework: str, directions: dict) -> str:
    """The line the plugin prints, in TileGym's documented shape (framework capitalized)."""
    return f"{framework.capitalize()}: {directions!r} ms"


# --- files --------------------------------------------------------------------------------------


def read_records_file(path: str | Path) -> list[ShapeRecord]:
    """Records from the plugin's JSON-lines file (``{"nodeid", "benchmark", "outcome"}`` per line).

    A missing file means no perf test recorded anything: an empty list, not an error. A last line
    cut short (the run was killed mid-write) is skipped; a bad line elsewhere is an error.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[ShapeRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise RecordError(f"{path}:{number}: not JSON: {line[:80]!r}") from None
        if not isinstance(row, dict) or "nodeid" not in row or "benchmark" not in row:
            raise RecordError(f"{path}:{number}: expected an object with nodeid and benchmark")
        records.extend(parse_benchmark(row["nodeid"], row["benchmark"], outcome=row.get("outcome", "passed")))
    return records


# --- selection ----------------------------------------------------------------------------------


def select(
    records: list[ShapeRecord], framework: str = "cutile", direction: str = "forward", *, passed_only: bool = True
) -> dict[str, ShapeRecord]:
    """``{test_id: record}`` for one framework and direction; failed tests are left out by default.

    A test id seen twice (a rerun plugin, two runs appended to one file) keeps the last record.
    """
    chosen: dict[str, ShapeRecord] = {}
    for record in records:
        if record.framework == framework.lower() and record.direction == direction:
            if passed_only and record.outcome != "passed":
                continue
            chosen[record.test_id] = record
    return chosen


def shape_id(test_id: str, framework: str | None = "cutile") -> str:
    """A short, stable name for the shape a perf test measured.

    ``tests/ops/test_rms_norm.py::Test_RMSNorm::test_perf[cutile-static_persistent-262144-1024]``
    becomes ``static_persistent-262144-1024``: the parameter id without the framework token (every
    selected test carries it). A function other than ``test_perf`` keeps its name in front
    (``test_perf_llm:...``) so two perf functions with the same parameters do not collide.
    """
    last = test_id.split("::")[-1]
    function, bracket, params = last.partition("[")
    params = params[:-1] if bracket and params.endswith("]") else params
    if framework:
        params = "-".join(t for t in params.split("-") if t.lower() != framework.lower())
    if not params:
        return function
    return params if function == "test_perf" else f"{function}:{params}"


def select_by_shape(
    records: list[ShapeRecord], framework: str = "cutile", direction: str = "forward"
) -> dict[str, ShapeRecord]:
    """Like ``select`` but keyed by ``shape_id``; two tests mapping to one shape id is an error."""
    by_shape: dict[str, ShapeRecord] = {}
    for test_id, record in select(records, framework, direction).items():
        sid = shape_id(test_id, framework)
        if sid in by_shape:
            raise RecordError(f"tests {by_shape[sid].test_id} and {test_id} both map to shape id {sid!r}")
        by_shape[sid] = record
    return by_shape

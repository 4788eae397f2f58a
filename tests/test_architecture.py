"""The package layout is the architecture: imports only run down the layers.

    __main__, cli                  the command line: parse, dispatch, print, exit
    commands                       one module a subcommand, each a thin call into a library
    loop, pytest_plugin            the loop (the iteration transaction, batches, budgets, views); the child's plugin
    kernel, tune, tileir, node     kernel analysis and compile-check, autotuning, Triton-TileIR; work over a node's GPUs
    child, skill                   pytest children (processes, checkouts, stages, records); the shipped skill
    store, bench                   durable state (atomic files, log and its history, git, settings, caches); timing
    judge                          decision rules, statistics, crash classes (pure)
    knobs, output, templating      environment variables, progress lines and outcomes, templates
    errors                         the error hierarchy and exit codes

A module may import its own package and anything on a lower layer, never a higher one or a
sibling package on its own layer. Imports inside functions are allowed only with a reason on the
line (``# noqa: PLC0415 - <why>`` or a comment naming why): an import that hides a cycle or an
upward arrow is what this test exists to stop. ``if TYPE_CHECKING:`` imports are annotations only.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "scripts" / "cutile_perf"

LAYERS = {
    "cutile_perf": 0, "errors": 0,
    "knobs": 1, "output": 1, "templating": 1,
    "judge": 2,
    "store": 3, "bench": 3,
    "child": 4, "skill": 4,
    "kernel": 5, "tune": 5, "tileir": 5, "node": 5,
    "loop": 6, "pytest_plugin": 6,
    "commands": 7,
    "cli": 8,
    "__main__": 9,
}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("data", "templates"):
            continue
        yield rel, path


def _unit(rel: Path) -> str:
    """The layer unit of a module: its subpackage, or the top-level module's own name."""
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem if rel.stem != "__init__" else "cutile_perf"


def _target_unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "cutile_perf":
        return None
    return parts[1] if len(parts) > 1 else "cutile_perf"


def _imports(tree: ast.Module):
    """(node, imported cutile_perf modules, inside a function?) for every import, TYPE_CHECKING blocks skipped."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    nested: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module]
            if node.module == "cutile_perf":
                targets = [f"cutile_perf.{a.name}" for a in node.names]
            yield node, targets, id(node) in nested
        elif isinstance(node, ast.Import):
            yield node, [a.name for a in node.names], id(node) in nested


def test_every_module_has_a_layer():
    units = {_unit(rel) for rel, _ in _modules()}
    assert units <= set(LAYERS), f"give these a layer in LAYERS and the docstring: {sorted(units - set(LAYERS))}"


def test_imports_only_run_down_the_layers():
    upward = []
    for rel, path in _modules():
        unit = _unit(rel)
        for node, targets, _ in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in targets:
                other = _target_unit(target)
                if other is None or other == unit or other not in LAYERS:
                    continue
                if LAYERS[other] >= LAYERS[unit]:
                    upward.append(f"{rel}:{node.lineno} ({unit}, layer {LAYERS[unit]}) imports {target} "
                                  f"({other}, layer {LAYERS[other]})")
    assert not upward, "imports that run up or sideways:\n" + "\n".join(upward)


def test_imports_inside_functions_say_why():
    silent = []
    for rel, path in _modules():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node, targets, inside in _imports(ast.parse("\n".join(lines))):
            if not inside or not any(t.startswith("cutile_perf") for t in targets):
                continue
            text = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if "#" not in text and not above.startswith("#"):
                silent.append(f"{rel}:{node.lineno}: {text.strip()}")
    assert not silent, "imports inside functions without a reason next to them:\n" + "\n".join(silent)


@pytest.mark.parametrize("package", sorted(u for u in LAYERS if (PACKAGE / u).is_dir()))
def test_each_package_says_what_it_holds(package):
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8")))
    assert doc and len(doc.split()) >= 5, f"{package}/__init__.py needs a docstring saying what the package holds"

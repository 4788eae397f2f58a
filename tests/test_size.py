"""Size kept by a test (issue 40, item 3): a module a newcomer can read in one sitting.

Every module under ``scripts/cutile_perf`` is at most ``MAX_FILE_LINES`` lines and every function
(methods and nested functions included) at most ``MAX_FUNCTION_LINES``, counted from its ``def``
line to its last line (``end_lineno - lineno + 1``; decorators not counted).

The exceptions below held on the day this test was written. The list only shrinks: an entry whose
file or function is now within the limit, or no longer exists, fails the test too, so whoever
shrinks an offender also deletes its line. Adding an entry needs a reason a reviewer accepts.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scripts" / "cutile_perf"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80

# Files over MAX_FILE_LINES, by path under scripts/cutile_perf -> why it is allowed for now.
FILE_EXCEPTIONS: dict[str, str] = {}

# Functions over MAX_FUNCTION_LINES, as "<path>::<qualified name>" -> why it is allowed for now (none left).
FUNCTION_EXCEPTIONS: dict[str, str] = {}


def module_paths(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def function_lengths(tree: ast.AST, prefix: str = "") -> dict[str, int]:
    """Every function in ``tree`` by qualified name (``Class.method``, ``outer.inner``) -> its lines."""
    lengths: dict[str, int] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                lengths[name] = node.end_lineno - node.lineno + 1
            lengths.update(function_lengths(node, f"{name}."))
        else:  # functions defined under if/try/with blocks keep the enclosing prefix
            lengths.update(function_lengths(node, prefix))
    return lengths


def measure(package: Path = PACKAGE) -> tuple[dict[str, int], dict[str, int]]:
    """(lines of every module by path, lines of every function by "<path>::<qualified name>")."""
    files, functions = {}, {}
    for path in module_paths(package):
        rel = path.relative_to(package).as_posix()
        text = path.read_text(encoding="utf-8")
        files[rel] = len(text.splitlines())
        for name, length in function_lengths(ast.parse(text, filename=str(path))).items():
            functions[f"{rel}::{name}"] = length
    return files, functions


def size_problems(sizes: dict[str, int], limit: int, exceptions: dict[str, str]) -> list[str]:
    """What breaks the rule: an entry over ``limit`` not excepted, or an exception no longer needed."""
    problems = [f"{name}: {length} lines (limit {limit})" for name, length in sorted(sizes.items())
                if length > limit and name not in exceptions]
    for name in sorted(exceptions):
        if name not in sizes:
            problems.append(f"{name}: excepted but no longer exists; delete its exception")
        elif sizes[name] <= limit:
            problems.append(f"{name}: {sizes[name]} lines, within {limit} now; delete its exception")
    return problems


def test_every_module_is_at_most_500_lines_or_a_named_exception():
    files, _ = measure()
    assert files, f"no modules found under {PACKAGE}"
    assert size_problems(files, MAX_FILE_LINES, FILE_EXCEPTIONS) == []


def test_every_function_is_at_most_80_lines_or_a_named_exception():
    _, functions = measure()
    assert size_problems(functions, MAX_FUNCTION_LINES, FUNCTION_EXCEPTIONS) == []


def test_every_exception_gives_a_one_line_reason():
    for name, reason in {**FILE_EXCEPTIONS, **FUNCTION_EXCEPTIONS}.items():
        assert reason.strip() and "\n" not in reason, name


# --- the measuring itself, on a package written here -------------------------------------------


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_function_lengths_name_methods_and_nested_functions_and_count_def_to_last_line():
    source = ("def top():\n    def inner():\n        return 1\n    return inner\n\n"
              "class Box:\n    async def run(self):\n        x = 1\n\n        return x\n\n"
              "if True:\n    def guarded():\n        pass\n")
    assert function_lengths(ast.parse(source)) == {"top": 4, "top.inner": 2, "Box.run": 4, "guarded": 2}


def test_an_offender_fails_and_a_stale_or_unneeded_exception_fails_too(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(5))
    _write(tmp_path, "pkg/long.py", f"def long():\n{body}\n")  # the def line and five more
    _write(tmp_path, "short.py", "def short():\n    pass\n")
    files, functions = measure(tmp_path)
    assert files == {"pkg/long.py": 6, "short.py": 2}
    assert functions == {"pkg/long.py::long": 6, "short.py::short": 2}
    assert size_problems(functions, 5, {}) == ["pkg/long.py::long: 6 lines (limit 5)"]
    assert size_problems(functions, 5, {"pkg/long.py::long": "why"}) == []
    assert size_problems(functions, 6, {"pkg/long.py::long": "why"}) == [
        "pkg/long.py::long: 6 lines, within 6 now; delete its exception"]
    assert size_problems(files, 5, {"pkg/long.py": "why", "gone.py": "why"}) == [
        "gone.py: excepted but no longer exists; delete its exception"]

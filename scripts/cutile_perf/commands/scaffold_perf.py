"""``cutile-perf scaffold-perf``: write a TileGym-style perf test for an op whose tests have none."""
from __future__ import annotations

import ast
import shlex
from pathlib import Path

from cutile_perf.store import atomic
from cutile_perf.kernel import kernel_scan, scaffold
from cutile_perf.output import Outcome
from cutile_perf.errors import Refused, UsageError


def _has_perf_test(source: str) -> bool:
    tree = ast.parse(source)
    return any(isinstance(n, ast.FunctionDef) and n.name.startswith("test_perf") for n in ast.walk(tree))


def scaffold_perf(*, repo: Path, kernel: str, test: Path | None, output: Path | None, stdout: bool,
                  checked: bool = False) -> Outcome:
    root = Path(repo).resolve()
    kernel_file = kernel_scan.find_kernel_files(root, kernel)[0]
    if test is None:
        test_file, _ = kernel_scan.choose_test_file(root, kernel_file)
    else:
        test_file = (test if test.is_absolute() else root / test).resolve()
        if not test_file.is_file():
            raise UsageError(f"test file {test} does not exist")
    test_rel = test_file.relative_to(root).as_posix() if test_file.is_relative_to(root) else str(test_file)
    source = test_file.read_text(encoding="utf-8")
    if _has_perf_test(source) and not checked:
        raise Refused(f"{test_rel} already has a test_perf", f"cutile-perf init --kernel {kernel} can use it as it is, "
                      f"or `cutile-perf scaffold-perf --kernel {kernel} --checked` writes a checked one beside it")
    plan = scaffold.plan_perf_test(source, test_rel)

    command = "cutile-perf scaffold-perf " + " ".join(
        shlex.quote(a) for a in ["--kernel", kernel, *(["--test", test_rel] if test is not None else []),
                                 *(["--checked"] if checked else [])])
    text = scaffold.render(plan, command=command, checked=checked)
    data = {"kernel_file": kernel_file.relative_to(root).as_posix(), "test": test_rel, "plan": plan.to_dict()}
    if stdout:
        return Outcome(text.rstrip("\n"), {**data, "source": text})

    target = output or scaffold.default_output(test_file)
    target = (target if target.is_absolute() else root / target).resolve()
    if target.exists():
        # Never overwrite: it may be the user's own test, or a reviewed and edited earlier scaffold.
        raise Refused(f"{target} already exists", "pass --output <new file>, or --stdout to print the test")
    if target == test_file:
        raise Refused("the perf test would replace the correctness test file", "pass --output <new file>")
    atomic.write_text(target, text)
    shown = target.relative_to(root).as_posix() if target.is_relative_to(root) else str(target)
    lines = [f"wrote {shown} from {plan.source_test}",
             *(f"note: {n}" for n in plan.notes),
             f"next: review it, run `python -m pytest {shown} -k \"test_perf and cutile\" --collect-only -q`, commit "
             f"it, then `cutile-perf init --kernel {kernel} --perf-test {shown}`"]
    return Outcome("\n".join(lines), {**data, "output": shown})

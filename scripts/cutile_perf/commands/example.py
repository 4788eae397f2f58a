"""`cutile-perf example`: the bundled kernels and their prepared optimization steps, through the CLI.

An installed skill cannot link to ``examples/kernels/`` (the target repository has no such folder),
so everything the skill shows from there is reachable by command:

* ``list``: each bundled op, its kernel and test files, and its prepared steps;
* ``show OP [--step NN | --test]``: the plain kernel, one prepared step (a complete replacement of
  the kernel module) or the op's test file on stdout, so it can be redirected over a file; what
  the step changes, why and what we expected go to stderr (and into ``--json``);
* ``copy --dest DIR``: the suite as a fresh git repository, to practise the loop by hand.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from cutile_perf.skill import assets
from cutile_perf.output import Outcome, say
from cutile_perf.loop.demo import SUITE_IGNORE, Step, available_ops, load_steps, resolve_kernel
from cutile_perf.errors import Refused, UsageError
from cutile_perf.store import git_ops

ACTIONS = ("list", "show", "copy")


def step_number(step: Step) -> str:
    """The ``NN`` of ``NN-slug.py``."""
    return step.file.name.split("-", 1)[0]


def pick_step(steps: list[Step], wanted: str) -> Step:
    """The step named by ``--step``: its number (``04`` or ``4``), its file name or stem
    (``04-persistent-grid``), or its name in steps.yaml."""
    key = wanted.strip()
    for step in steps:
        number = step_number(step)
        if (key.isdigit() and number.isdigit() and int(key) == int(number)) or key in (
                step.file.name, step.file.stem, step.name):
            return step
    choices = ", ".join(f"{step_number(s)} ({s.file.stem})" for s in steps)
    raise UsageError(f"--step {wanted!r}: no such prepared step", f"choose one of: {choices}")


def _step_data(step: Step) -> dict:
    return {"step": step_number(step), "file": step.file.name, "name": step.name, "expect": step.expect,
            "changes": step.changes, "why": step.why}


def _op_steps(suite: Path, op: str) -> tuple[str, list[Step]]:
    return load_steps(suite / "optimizations" / op / "steps.yaml")


def _test_file(op: str) -> str:
    return f"tests/ops/test_{op}.py"


def example(*, action: str, op: str | None, step: str | None, test: bool, dest: Path | None) -> Outcome:
    if action not in ACTIONS:
        raise UsageError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    if action != "show" and (step is not None or test):
        raise UsageError("--step and --test go with `cutile-perf example show OP`")
    if action != "copy" and dest is not None:
        raise UsageError("--dest goes with `cutile-perf example copy --dest DIR`")
    if action == "show" and not op:
        raise UsageError("`cutile-perf example show` needs an op", "see `cutile-perf example list`")
    if action != "show" and op:
        raise UsageError(f"`cutile-perf example {action}` takes no op (got {op!r})")
    suite = assets.kernel_suite()
    if action == "list":
        return list_examples(suite)
    if action == "show":
        return show_example(suite, op, step=step, test=test)
    if dest is None:
        raise UsageError("`cutile-perf example copy` needs --dest DIR")
    return copy_suite(suite, dest)


def list_examples(suite: Path) -> Outcome:
    ops, lines = [], []
    for op in available_ops(suite):
        kernel_file, steps = _op_steps(suite, op)
        if assets.steps_withheld(op):
            ops.append({"op": op, "kernel_file": kernel_file, "test_file": _test_file(op), "steps": "withheld"})
            lines.append(f"{op}: {kernel_file} (tests: {_test_file(op)}), prepared steps withheld in this evaluation")
            continue
        ops.append({"op": op, "kernel_file": kernel_file, "test_file": _test_file(op),
                    "steps": [_step_data(s) for s in steps]})
        lines.append(f"{op}: {kernel_file} (tests: {_test_file(op)}), {len(steps)} prepared steps")
        lines += [f"  {step_number(s)} {s.name} [expected {s.expect or '?'}]" for s in steps]
    lines.append("show one: cutile-perf example show <op> [--step NN | --test]; "
                 "a practice repo: cutile-perf example copy --dest <dir>")
    return Outcome("\n".join(lines), {"suite": str(suite), "ops": ops})


def show_example(suite: Path, op_name: str, *, step: str | None, test: bool) -> Outcome:
    if step is not None and test:
        raise UsageError("pass --step or --test, not both")
    op = resolve_kernel(op_name, available_ops(suite))
    kernel_file, steps = _op_steps(suite, op)
    withheld = assets.steps_withheld(op)
    if step is not None:
        assets.refuse_if_withheld(op)
    if withheld:
        steps = []  # the plain kernel and its test are the task itself; the steps' stories are answers
    data: dict = {"op": op, "kernel_file": kernel_file, "steps": [_step_data(s) for s in steps], "step": None}
    if test:
        path, data["shown"] = suite / _test_file(op), _test_file(op)
        say(f"{op}: {_test_file(op)}, correctness (test_op) and perf (test_perf) tests in TileGym's style")
    elif step is None:
        path, data["shown"] = suite / kernel_file, kernel_file
        if withheld:
            say(f"{op}: the plain kernel ({kernel_file}); its prepared steps are withheld in this evaluation")
        else:
            say(f"{op}: the plain kernel ({kernel_file}); prepared steps, each a complete replacement of it "
                f"(cutile-perf example show {op} --step NN):")
        for s in steps:
            say(f"  {step_number(s)} {s.name} [expected {s.expect or '?'}]: {s.changes}")
    else:
        chosen = pick_step(steps, step)
        path = chosen.file
        data["shown"] = f"optimizations/{op}/{chosen.file.name}"
        data["step"] = _step_data(chosen)
        say(f"{op} step {step_number(chosen)} ({chosen.file.name}): {chosen.name} [expected {chosen.expect or '?'}]")
        say(f"  replaces {kernel_file} as a whole and contains every earlier step")
        say(f"  changes: {chosen.changes}")
        say(f"  why: {chosen.why}")
    data["source"] = path.read_text(encoding="utf-8")
    return Outcome(data["source"].rstrip("\n"), data)


def copy_suite(suite: Path, dest: Path) -> Outcome:
    """The suite without its prepared steps, committed as a new git repository at ``dest``."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        # Never merged into or replaced: whatever is there is the user's.
        raise Refused(f"{dest} already exists and is not an empty directory", "pass --dest <new directory>")
    if dest.exists():
        dest.rmdir()
    shutil.copytree(suite, dest, ignore=SUITE_IGNORE)

    git_ops.init_repo(dest, "tilesuite: bundled cuTile kernel suite")
    return Outcome(
        f"copied the bundled kernels to {dest} (a git repository with one commit); next: cd {dest} && "
        "cutile-perf init --kernel rms_norm",
        {"dest": str(dest), "ops": available_ops(suite)},
    )

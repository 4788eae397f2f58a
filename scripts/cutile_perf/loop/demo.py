"""`cutile-perf demo`: the whole loop on a bundled kernel, through the same commands an agent calls.

The bundled suite (``examples/kernels``, package data in a wheel) is copied into
``<checkout>/sandbox/demo/`` (``./cutile-perf-demo`` from an installed wheel) as a fresh git repository; then ``init``, ``baseline``, one ``try`` per prepared optimization (the alternate source
is copied over the kernel file first, as an agent would edit it) and ``report`` run through
``cutile_perf.commands``. The steps come from ``examples/kernels/optimizations/<op>/steps.yaml``.
Without a GPU it refuses before copying anything.

Unlike an agent's loop, the demo runs every prepared step even after a stop rule holds: its purpose
is to show each kind of decision (keep, revert, crash). It says so, instead of printing "stop" and
silently carrying on.
"""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cutile_perf.skill import assets
from cutile_perf import checkout_root
from cutile_perf.output import Outcome, say
from cutile_perf.errors import EnvMissing, Refused, UsageError
from cutile_perf.child import envcheck
from cutile_perf.store import git_ops
from cutile_perf.store import session as session_mod
from cutile_perf.loop.baseline import baseline
from cutile_perf.loop.init import init
from cutile_perf.loop.iteration import try_change
from cutile_perf.loop.row import decision_line, try_outcome
from cutile_perf.loop.report import report

# Names people type for the bundled ops.
ALIASES = {
    "rmsnorm": "rms_norm",
    "rms": "rms_norm",
    "layernorm": "layer_norm",
    "ln": "layer_norm",
    "silu_and_mul": "swiglu",
    "gemm": "matmul",
    "fmha": "attention",
    "flash_attention": "attention",
}
DEMO_MARKER = ".cutile-perf-demo"  # written into the demo repo; only a directory carrying it is ever deleted
SUITE_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "sandbox", ".pytest_cache", "optimizations")


@dataclass(frozen=True)
class Step:
    name: str
    file: Path
    expect: str
    why: str
    changes: str = ""


def default_dest() -> Path:
    """``<checkout>/sandbox/demo`` when running from a checkout; ``./cutile-perf-demo`` from an installed wheel,
    whose package directory is no place to write to."""
    root = checkout_root()
    return root / "sandbox" / "demo" if (root / "SKILL.md").is_file() else Path.cwd() / "cutile-perf-demo"


def resolve_kernel(name: str, available: list[str]) -> str:
    """The op a demo ``--kernel`` names: an exact op, or an alias such as ``rmsnorm``."""
    key = name.strip().lower().replace("-", "_")
    op = ALIASES.get(key.replace("_", ""), ALIASES.get(key, key))
    if op not in available:
        raise UsageError(f"no bundled kernel {name!r}", f"choose one of: {', '.join(sorted(available))}")
    return op


def load_steps(steps_file: Path) -> tuple[str, list[Step]]:
    """(kernel file relative to the suite, ordered steps) from an optimizations ``steps.yaml``."""
    import yaml

    data = yaml.safe_load(steps_file.read_text(encoding="utf-8")) or {}
    kernel_file = data.get("kernel_file")
    raw = data.get("steps") or []
    if not kernel_file or not raw:
        raise UsageError(f"{steps_file} needs `kernel_file` and a non-empty `steps` list")
    steps = []
    for i, entry in enumerate(raw, start=1):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("file"):
            raise UsageError(f"{steps_file}: step {i} needs `name` and `file`")
        path = steps_file.parent / entry["file"]
        if not path.is_file():
            raise UsageError(f"{steps_file}: step {i} file {entry['file']} does not exist")
        steps.append(Step(entry["name"], path, str(entry.get("expect", "")), str(entry.get("why", "")),
                          str(entry.get("changes", ""))))
    return kernel_file, steps


def available_ops(suite: Path) -> list[str]:
    return sorted(p.parent.name for p in (suite / "optimizations").glob("*/steps.yaml"))


def _require_gpu(env: envcheck.Environment) -> None:
    if not env.can_measure:
        problems = "; ".join(p.message for p in env.problems if p.fatal_for_measuring)
        raise EnvMissing(f"the demo measures kernels and cannot run here: {problems}",
                         "run `cutile-perf demo` on a machine with an NVIDIA GPU (cutile-perf env checks it)")


def _fresh_copy(suite: Path, dest: Path) -> None:
    """Copy the suite to ``dest`` and commit it as a new repository. An older demo is replaced only
    if it carries the demo marker, so a user directory of the same name is never deleted."""
    if dest.exists():
        if not (dest / DEMO_MARKER).is_file():
            raise Refused(f"{dest} exists and was not created by `cutile-perf demo`", "move it away and run again")
        shutil.rmtree(dest)
    shutil.copytree(suite, dest, ignore=SUITE_IGNORE)
    (dest / DEMO_MARKER).write_text("created by `cutile-perf demo`; deleted by the next demo run\n", encoding="utf-8")

    git_ops.init_repo(dest, "tilesuite: bundled cuTile kernel suite (demo start)")


def step_line(number: int, step: Step, decision_text: str, stop: str | None, *, last: bool) -> str:
    """One demo line per step. When a stop rule holds, say that the demo goes on on purpose."""
    line = f"{number}. {step.name} [expected {step.expect or '?'}]: {decision_text}"
    if stop:
        if last:
            line += f"; stop rule reached ({stop})"
        else:
            line += (f"; stop rule reached ({stop}); the demo continues through its prepared steps "
                     "to show each decision")
    return line


# Most of a demo step is its correctness run: six tests, each compiling the candidate in turn, in a
# child that first imports torch. Three children side by side, each reading the installed-code
# bytecode (child/bytecode.py), shortened a step against one child without that bytecode
# (docs/results/2026-12-02-h200-speed.md, section 16; benchmarks/demo_ab.sh).
DEMO_CORRECTNESS_JOBS = 3


def demo(*, kernel: str, dest: Path | None = None, correctness_jobs: int | None = None,
         prestart_perf: bool = True) -> Outcome:
    """``correctness_jobs``: the session's ``correctness_jobs`` (``init --correctness-jobs``; None:
    ``DEMO_CORRECTNESS_JOBS``); ``prestart_perf``: the session's (``init --no-prestart-perf``), which
    the spares' A/B turns off (``benchmarks/demo_ab.sh``)."""
    correctness_jobs = DEMO_CORRECTNESS_JOBS if correctness_jobs is None else correctness_jobs
    session_mod.parse_correctness_jobs(correctness_jobs)  # before the GPU check: a usage error
    suite = assets.kernel_suite()  # package data (a wheel) or the checkout's examples/kernels
    op = resolve_kernel(kernel, available_ops(suite))
    assets.refuse_if_withheld(op)  # the demo applies every prepared step: the answers of an evaluation on op
    kernel_file, steps = load_steps(suite / "optimizations" / op / "steps.yaml")
    _require_gpu(envcheck.check(with_torch=False))  # before anything is copied: a refused demo leaves no trace

    dest = dest or default_dest()
    # Torch's own view of the GPU (its import takes seconds on a GPU host) while the suite is copied
    # and the session set up; a refusal then removes the copy, which only the demo made.
    with ThreadPoolExecutor(max_workers=1) as pool:
        torch_view = pool.submit(envcheck.check)
        say(f"copying the kernel suite to {dest}")
        _fresh_copy(suite, dest)
        try:
            lines = [init(repo=dest, kernel=op, test=None, branch=None, allow=[], timeout_s=600,
                          correctness_jobs=correctness_jobs, prestart_perf=prestart_perf).text.splitlines()[0]]
            _require_gpu(torch_view.result())
        except EnvMissing:
            shutil.rmtree(dest, ignore_errors=True)
            raise
    say("baseline (3 perf runs for the noise floor)")
    lines.append(baseline(repo=dest, repeats=3).text)
    lines.append(f"the demo runs all {len(steps)} prepared steps, even once a stop rule holds, to show keeps and reverts")
    results = []
    for number, step in enumerate(steps, start=1):
        say(f"step {number}/{len(steps)}: {step.name} (expected: {step.expect or 'unknown'})")
        shutil.copyfile(step.file, dest / kernel_file)
        tried = try_change(dest, step.name)
        outcome = try_outcome(tried.row, tried.stop)
        results.append({"step": step.name, "file": step.file.name, "expect": step.expect,
                        "exit_code": outcome.exit_code, "result": outcome.data})
        lines.append(step_line(number, step, decision_line(outcome.data), outcome.data.get("stop"),
                               last=number == len(steps)))
    final = report(repo=dest, output=None)
    lines += [final.text, f"results table: {dest / 'sandbox' / 'perf_results.md'}"]
    return Outcome("\n".join(lines), {"repo": str(dest), "kernel": op, "steps": results, "report": final.data})

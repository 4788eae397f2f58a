"""Command line: parse, dispatch to ``cutile_perf.commands``, print the outcome, map errors to exit codes.

Nothing else in the package imports argparse, prints results or calls ``sys.exit``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from cutile_perf import __version__
from cutile_perf.output import Outcome
from cutile_perf.errors import (EXIT_INTERRUPTED, EXIT_UNEXPECTED, CouldNotWrite, CutilePerfError, UsageError,
                                 clean_text, displayable, exit_codes_text, not_utf8)

EXIT_CODES_HELP = exit_codes_text()  # the one table (errors.EXIT_CODES), at the end of every --help

JOB_SECONDS_HELP = ("the seconds the GPU job gives this command: the budget is that less a reserve (5 %%, at least "
                    "15 s), and every test child's timeout ends with it; a try cut short is settled as interrupted")


def _sub(subparsers, name: str, help_text: str, epilog: str = "") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        name,
        help=help_text.replace("%", "%%"),  # argparse %-formats help strings, not descriptions
        description=help_text,
        epilog=(epilog + "\n\n" if epilog else "") + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repo", type=Path, default=Path("."), help="target kernel repository (default: .)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser


# --- the experiment loop ------------------------------------------------------------------------


def _add_init(subparsers) -> None:
    p = _sub(
        subparsers,
        "init",
        "start a session: branch, locate kernel and tests, classify, check the environment",
        "Examples:\n  cutile-perf init --kernel rms_norm\n  cutile-perf init --kernel src/pkg/ops/cutile/softmax.py --test tests/ops/test_softmax.py",
    )
    p.add_argument("--kernel", required=True, help="kernel name (e.g. rms_norm) or path to the kernel file")
    p.add_argument("--test", type=Path, help="test file (default: tests/**/test_<kernel>.py)")
    p.add_argument("--branch", help="branch to create (default: cutile-perf-<kernel>-<YYYYMMDD>)")
    p.add_argument("--allow", action="append", default=[], metavar="PATH",
                   help="another file the agent may change (repeatable)")
    p.add_argument("--timeout", type=float, default=600.0, help="time budget of one iteration in seconds (default 600)")
    p.add_argument("--perf-test", type=Path,
                   help="file holding the perf test (default: the test file, or test_<op>_perf.py next to it)")
    p.add_argument("--correctness-jobs", type=int, default=1, metavar="N",
                   help="run the correctness tests in N pytest children at once, each on one share of them "
                        "(default 1; correctness is not timed, the perf command always runs alone)")
    p.add_argument("--prestart-perf", action=argparse.BooleanOptionalAction, default=True,
                   help="try starts the perf child during the correctness run and holds it before its first "
                        "test, so its start-up overlaps correctness (default on; done where the children run in "
                        "the sandbox; --no-prestart-perf when the correctness tests need nearly all GPU memory: "
                        "the held child may hold a CUDA context)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run the test children without the isolation this machine offers (session.yaml "
                        "sandbox_mode: off; default auto)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.init import init  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return init(repo=a.repo, kernel=a.kernel, test=a.test, branch=a.branch, allow=a.allow, timeout_s=a.timeout,
                    perf_test=a.perf_test, correctness_jobs=a.correctness_jobs,
                    prestart_perf=a.prestart_perf, sandbox_mode="off" if a.no_sandbox else "auto")

    p.set_defaults(handler=run)


def _add_scaffold_perf(subparsers) -> None:
    p = _sub(subparsers, "scaffold-perf",
             "write a TileGym-style perf test for an op whose test file has none (review and commit it before init)",
             "Examples:\n  cutile-perf scaffold-perf --kernel softmax\n"
             "  cutile-perf scaffold-perf --kernel src/pkg/ops/cutile/softmax.py --stdout\n"
             "  cutile-perf scaffold-perf --kernel rms_norm --checked\n\n"
             "Shapes, inputs and the op call come from the correctness test (read, never run); the new file\n"
             "is written next to it as test_<op>_perf.py. An existing file is never overwritten.")
    p.add_argument("--kernel", required=True, help="kernel name (e.g. softmax) or path to the kernel file")
    p.add_argument("--test", type=Path, help="correctness test file (default: tests/**/test_<kernel>.py)")
    p.add_argument("--output", type=Path, help="file to write (default: test_<op>_perf.py next to the test file)")
    p.add_argument("--stdout", action="store_true", help="print the perf test instead of writing it")
    p.add_argument("--checked", action="store_true",
                   help="compare the first and last timed calls of each case with the correctness test's reference "
                        "on fresh inputs (a kernel that does less work only when timed fails); allowed beside an "
                        "existing test_perf")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.scaffold_perf import scaffold_perf  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return scaffold_perf(repo=a.repo, kernel=a.kernel, test=a.test, output=a.output, stdout=a.stdout,
                             checked=a.checked)

    p.set_defaults(handler=run)


def _add_survey(subparsers) -> None:
    p = _sub(subparsers, "survey",
             "list every cuTile op of a TileGym-shaped repo: kernel and tests paired, selections non-empty, "
             "and with --run one correctness and one perf run each",
             "Examples:\n  cutile-perf survey --repo ~/src/TileGym\n"
             "  cutile-perf survey --repo ~/src/TileGym --run --sample 1 --timeout 120 --jobs 8 --markdown\n\n"
             "Selections are found with pytest --collect-only using init's commands. --run runs each\n"
             "selection once (its first --sample tests; 0 = all) on this machine's GPU; nothing is changed.")
    p.add_argument("--run", action="store_true", help="also run each op's correctness and perf selections once")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per pytest run or collection (default 300)")
    p.add_argument("--sample", type=int, default=0, help="with --run, run only the first N tests of each selection")
    p.add_argument("--jobs", type=int, default=1, help="ops surveyed in parallel (default 1)")
    p.add_argument("--under", help="only kernel files below this repo-relative folder (e.g. src/tilegym/ops)")
    p.add_argument("--op", action="append", default=[], metavar="NAME",
                   help="only this op (kernel file name without .py; repeatable), e.g. to re-run what a --budget cut")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    p.add_argument("--logs", type=Path, help="keep the pytest logs in this folder (default: a temporary one)")
    p.add_argument("--budget", type=float, help="seconds for the whole survey; ops reached later are listed as not done")
    p.add_argument("--gpus", default="1", metavar="N|all",
                   help="ops spread over a worker per GPU, each seeing one GPU (default 1: this process, --jobs threads)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="workers on this node (local, default) or a Ray actor per GPU of a Ray cluster (the ray extra)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.survey import survey  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return survey(repo=a.repo, run=a.run, timeout_s=a.timeout, sample=a.sample, jobs=a.jobs, under=a.under,
                      markdown=a.markdown, logs=a.logs, budget_s=a.budget, ops=tuple(a.op), gpus=a.gpus,
                      engine=a.engine)

    p.set_defaults(handler=run)


def _add_compile_check(subparsers) -> None:
    p = _sub(subparsers, "compile-check",
             "compile the session's kernels (or --kernel) for a target arch without a GPU: errors, registers, "
             "threads, TMA or plain loads, SASS widths",
             "Examples:\n  cutile-perf compile-check --write-spec        # sandbox/compile-check.yaml to fill in\n"
             "  cutile-perf compile-check                     # the session's fenced kernels\n"
             "  cutile-perf compile-check --kernel src/pkg/ops/cutile/softmax.py --arch sm_100 --spec sig.yaml\n"
             "  cutile-perf compile-check --kernel sandbox/cand/softmax_v2.py --as src/pkg/ops/cutile/softmax.py\n\n"
             "  cutile-perf compile-check --record            # on the GPU machine, once: the tests' launches -> the spec\n\n"
             "Signatures come from the spec file (recorded from the tests' launches with --record on a GPU,\n"
             "or written by hand from --write-spec) or the module's aot_signatures(). Exit 1 when a kernel\n"
             "did not compile.")
    p.add_argument("--kernel", help="kernel file or name (default: the session's fenced kernel files)")
    p.add_argument("--as", dest="as_", type=Path, metavar="FILE",
                   help="check the --kernel file as this file it would replace (its module name and imports); "
                        "default: the session's fenced kernel file when the candidate lies outside the package")
    p.add_argument("--arch", help="target, e.g. sm_90 or sm_100 (default: the session's GPU, else sm_90)")
    p.add_argument("--spec", type=Path, help="signature spec YAML (default: sandbox/compile-check.yaml); "
                   "a signature may carry its own hints: {...}")
    p.add_argument("--write-spec", action="store_true", help="write a spec skeleton from the kernels' parameters")
    p.add_argument("--record", action="store_true",
                   help="on a GPU machine: run the correctness tests once and write the spec from their ct.launch calls")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.compile_check import compile_check  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return compile_check(repo=a.repo, kernel=a.kernel, arch=a.arch, spec=a.spec, write_spec=a.write_spec,
                             record_launches=a.record, as_=a.as_)

    p.set_defaults(handler=run)


def _add_baseline(subparsers) -> None:
    p = _sub(subparsers, "baseline", "iteration 0: correctness, then perf measured --repeats times for the noise floor",
             "Example:\n  cutile-perf baseline --repeats 3")
    p.add_argument("--repeats", type=int, default=3, help="perf runs used to estimate per-shape noise (default 3)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.baseline import baseline  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return baseline(repo=a.repo, repeats=a.repeats)

    p.set_defaults(handler=run)


def _add_try(subparsers) -> None:
    p = _sub(subparsers, "try", "test, measure and keep or revert the uncommitted change to the fenced files",
             'Example:\n  cutile-perf try "occupancy 2 -> 4"\n'
             '  cutile-perf try "occupancy 2 -> 4" --job-seconds 600   # inside a 10-minute GPU job')
    p.add_argument("optimization", help="one short phrase naming the single optimization applied")
    p.add_argument("--job-seconds", type=float, metavar="N", help=JOB_SECONDS_HELP)

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.try_ import try_  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return try_(repo=a.repo, optimization=a.optimization, job_s=a.job_seconds)

    p.set_defaults(handler=run)


def _add_batch(subparsers) -> None:
    p = _sub(subparsers, "batch", "one try per prepared candidate of a plan file, in one GPU job, within a time budget",
             "Example:\n  cutile-perf batch sandbox/plan.yaml --job-seconds 600 --baseline 3\n"
             "  cutile-perf batch sandbox/plan.yaml --job-seconds 600 --baseline 3 --check   # here, before the GPU job\n\n"
             "The plan (YAML) lists tries, each one change with its candidate files kept in sandbox/:\n"
             "  tries:\n"
             "    - optimization: \"occupancy 4\"\n"
             "      files: {src/pkg/ops/cutile/rms_norm.py: sandbox/cand/occ4.py}\n"
             "An entry starts when a typical try of this session (its measured stage times) still fits the\n"
             "budget; one that the budget's end cuts short is settled as interrupted. Entries already decided\n"
             "in the log are skipped, so the same command in the next job continues the plan.")
    p.add_argument("plan", type=Path, help="the plan file (YAML)")
    p.add_argument("--job-seconds", type=float, metavar="N", help=JOB_SECONDS_HELP)
    p.add_argument("--budget", type=float, help="seconds for the whole batch (default: from --job-seconds); an entry "
                   "starts only when a typical try still fits")
    p.add_argument("--baseline", type=int, metavar="REPEATS",
                   help="when no baseline is recorded yet, record it first with this many perf runs (same job)")
    p.add_argument("--check", action="store_true",
                   help="no GPU, nothing run: check the session, the plan and the tree as the job would, and say "
                        "how many entries the budget holds (exit 1: the job would not reach its first try)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.batch import batch  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return batch(repo=a.repo, plan_path=a.plan, budget_s=a.budget, job_s=a.job_seconds,
                     baseline_repeats=a.baseline, check_only=a.check)

    p.set_defaults(handler=run)


def _add_screen(subparsers) -> None:
    p = _sub(subparsers, "screen", "rank many candidates side by side on one GPU (readings, not verdicts); "
             "nothing is committed, batch decides the best",
             "Examples:\n  cutile-perf screen 'sandbox/cand/*.py' --seconds 240 --top 2\n"
             "  cutile-perf screen sandbox/plan.yaml --seconds 240\n\n"
             "Each candidate is compile-checked on the CPU, then its correctness runs; those that pass are timed\n"
             "in rounds (the base, then each candidate, order rotated) for as long as --seconds allows, at least\n"
             "one round. The table goes to sandbox/screen.md; --top K writes sandbox/screen-plan.yaml for batch.")
    p.add_argument("candidates", help="a glob of candidate files for the fenced kernel file (quoted), or a batch plan")
    p.add_argument("--seconds", type=float, default=0.0,
                   help="time for the whole screen; a round starts only if it can end in time (default 0: one round)")
    p.add_argument("--top", type=int, metavar="K", help="write sandbox/screen-plan.yaml with the K best, for batch")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.screen import screen  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return screen(repo=a.repo, candidates=a.candidates, seconds=a.seconds, top=a.top)

    p.set_defaults(handler=run)


def _add_verify(subparsers) -> None:
    p = _sub(subparsers, "verify",
             "re-run correctness and re-measure two kept commits interleaved in pristine checkouts: "
             "does the recorded speedup reproduce?",
             "Examples:\n  cutile-perf verify                     # the baseline vs the last kept commit\n"
             "  cutile-perf verify --from <sha> --to <sha> --pairs 5\n"
             "  cutile-perf verify --full-tests         # correctness with init's selection, if the session narrowed it")
    p.add_argument("--from", dest="older", metavar="COMMIT", help="older kept commit (default: the baseline)")
    p.add_argument("--to", dest="newer", metavar="COMMIT", help="newer kept commit (default: the last kept commit)")
    p.add_argument("--pairs", type=int, default=3, help="interleaved (from, to) perf pairs (default 3)")
    p.add_argument("--full-tests", action="store_true",
                   help="run correctness with the command init wrote, not the session's edited one "
                        "(a failure found there is also run on --from, to tell a new failure from an old one)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.verify import verify  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return verify(repo=a.repo, older=a.older, newer=a.newer, pairs=a.pairs, full_tests=a.full_tests)

    p.set_defaults(handler=run)


def _add_status(subparsers) -> None:
    p = _sub(subparsers, "status", "the results table, current baseline, stop condition and what to try next")
    p.add_argument("--all", action="store_true", help="show every row (default: the last 10)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.status import status  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return status(repo=a.repo, show_all=a.all)

    p.set_defaults(handler=run)


def _add_report(subparsers) -> None:
    p = _sub(subparsers, "report", "write sandbox/report.md and the running-best plot")
    p.add_argument("--output", type=Path, help="report path (default: <repo>/sandbox/report.md)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.report import report  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return report(repo=a.repo, output=a.output)

    p.set_defaults(handler=run)


def _add_resume(subparsers) -> None:
    p = _sub(subparsers, "resume", "after a crash or kill: rebuild state from the log and git, leave the repo consistent",
             "When the last kept commit was amended, rebased or reset away, resume names two ways on:\n"
             "  cutile-perf resume --adopt          # re-measure HEAD like the baseline; it becomes the reference\n"
             "  cutile-perf resume --reset-to-kept  # branch back to the kept commit; HEAD kept on a backup branch")
    way = p.add_mutually_exclusive_group()
    way.add_argument("--adopt", action="store_true",
                     help="the kept commit is no longer on the branch: re-measure HEAD (correctness, then perf as "
                          "often as the baseline) and record it as the new reference")
    way.add_argument("--reset-to-kept", action="store_true",
                     help="the kept commit is no longer on the branch: move the branch back to it, keeping HEAD on "
                          "branch cutile-perf/rewritten-<sha>")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.resume import resume  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return resume(repo=a.repo, adopt_head=a.adopt, reset_to_kept=a.reset_to_kept)

    p.set_defaults(handler=run)


def _add_env(subparsers) -> None:
    p = _sub(subparsers, "env", "check the GPU, compute capability, cuda-tile and tileiras")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.env import env  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return env()

    p.set_defaults(handler=run)


def _add_demo(subparsers) -> None:
    p = _sub(subparsers, "demo", "run the whole loop on a bundled kernel in sandbox/demo/ (needs a GPU)",
             "Example:\n  cutile-perf demo --kernel rmsnorm")
    p.add_argument("--kernel", default="rmsnorm", help="bundled kernel to optimize (default rmsnorm)")
    p.add_argument("--correctness-jobs", type=int, default=None, metavar="N",  # None: loop.demo's default
                   help="the demo session's correctness tests in N pytest children at once, as init "
                        "--correctness-jobs (default 3: a demo step is mostly its correctness run)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.demo import demo  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return demo(kernel=a.kernel, correctness_jobs=a.correctness_jobs)

    p.set_defaults(handler=run)


def _add_install_skill(subparsers) -> None:
    p = _sub(subparsers, "install-skill",
             "copy SKILL.md and references/ into <target>/.claude/skills/ and/or <target>/.agents/skills/ (or .cursor/skills/)",
             "Examples:\n  cutile-perf install-skill --target ~/src/TileGym\n"
             "  cutile-perf install-skill --target . --agent claude\n\n"
             "Files you edited since the last install are refused unless --force (then kept as <file>.bak).")
    p.add_argument("--target", type=Path, help="repository to install into (default: --repo)")
    p.add_argument("--agent", choices=["claude", "codex", "cursor", "all"], default="all",
                   help="claude: .claude/skills/cutile-perf, codex: .agents/skills/cutile-perf, cursor: "
                        ".cursor/skills/cutile-perf, all: claude and codex (default; Cursor reads both)")
    p.add_argument("--force", action="store_true", help="overwrite files you edited (your versions are saved as .bak)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.install_skill import install_skill  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return install_skill(target=a.target or a.repo, agent=a.agent, force=a.force)

    p.set_defaults(handler=run)


def _add_example(subparsers) -> None:
    p = _sub(subparsers, "example",
             "the bundled kernels: list them, show a plain kernel or a prepared step, copy the suite to practise",
             "Examples:\n  cutile-perf example list\n  cutile-perf example show rms_norm\n"
             "  cutile-perf example show rms_norm --step 04 > src/tilesuite/ops/cutile/rms_norm.py\n"
             "  cutile-perf example show rms_norm --test\n  cutile-perf example copy --dest /tmp/kernels\n\n"
             "`show` prints the file on stdout; what a step changes, why and what we expected go to stderr.")
    p.add_argument("action", choices=["list", "show", "copy"], help="list the ops, show one file, or copy the suite")
    p.add_argument("op", nargs="?", help="bundled op for `show` (rms_norm, softmax, layer_norm, swiglu, matmul, attention)")
    p.add_argument("--step", metavar="NN", help="a prepared step: its number (04), file stem or name")
    p.add_argument("--test", action="store_true", help="show the op's test file instead of the kernel")
    p.add_argument("--dest", type=Path, help="new directory for `copy` (made a git repository)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.example import example  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return example(action=a.action, op=a.op, step=a.step, test=a.test, dest=a.dest)

    p.set_defaults(handler=run)


def _add_template(subparsers) -> None:
    p = _sub(subparsers, "template",
             "print a tune-once/cache/launch module for a kernel (imports only cuda.tile and the kernel)",
             "Examples:\n  cutile-perf template autotune --kind occupancy\n"
             "  cutile-perf template autotune --kind matmul --output my_matmul_tuned.py\n"
             "  cutile-perf template autotune --kind occupancy --op rms_norm --kernel-module pkg.ops.cutile.rms_norm "
             "--kernel-name rms_norm_kernel --params x,w,out --grid '(x.shape[0],)' --args '(x, w, out)' "
             "--key 'tuple(x.shape)'\n\n"
             "Kinds: occupancy (norms, reductions, elementwise), tile_search (matmul, attention), split_buffer\n"
             "(in-place kernels); aliases such as matmul or rms_norm pick one. Each field has a worked default;\n"
             "--grid and --args are Python expressions of cfg (the config) and the params.")
    p.add_argument("name", choices=["autotune"], help="which template")
    p.add_argument("--kind", required=True, help="occupancy, tile_search, split_buffer (or matmul, rms_norm, ...)")
    p.add_argument("--op", help="name of the generated <op>_launch function")
    p.add_argument("--kernel-module", help="module that defines the @ct.kernel")
    p.add_argument("--kernel-name", help="the @ct.kernel function's name")
    p.add_argument("--params", metavar="A,B,...", help="parameters of <op>_launch after stream, comma-separated")
    p.add_argument("--grid", help="grid expression of cfg and the params")
    p.add_argument("--args", help="kernel argument tuple expression of cfg and the params")
    p.add_argument("--key", help="cache key expression of the params (shape, dtype, device)")
    p.add_argument("--configs", metavar="JSON", help='search space, e.g. \'[{"occupancy": 1}, {"occupancy": 2}]\'')
    p.add_argument("--fixed", metavar="JSON", help="the config the kernel uses today (default: the first config)")
    p.add_argument("--inplace", metavar="A,B", help="params the kernel writes in place (split_buffer)")
    p.add_argument("--output", type=Path, help="write the module there (refused if it exists) instead of stdout")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.template import template  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        overrides = {"op_name": a.op, "kernel_module": a.kernel_module, "kernel_name": a.kernel_name,
                     "params": a.params, "grid": a.grid, "args": a.args, "key": a.key, "configs": a.configs,
                     "fixed": a.fixed, "inplace": a.inplace}
        return template(name=a.name, kind=a.kind, overrides=overrides, output=a.output)

    p.set_defaults(handler=run)


def _add_tileir_check(subparsers) -> None:
    p = _sub(subparsers, "tileir-check",
             "which triton is active and whether its TileIR backend can compile kernels here (JSON)",
             "Example:\n  cutile-perf tileir-check   # exit 1 unless TileIR is the active target (\"ready\": false)")
    p.add_argument("--strict", action="store_true",
                   help="accepted for old scripts; exit 1 when not ready is now the default")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.tileir_check import tileir_check  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return tileir_check(strict=a.strict)

    p.set_defaults(handler=run)


def _add_classify_triton(subparsers) -> None:
    p = _sub(subparsers, "classify-triton",
             "classify Triton kernels (dot-related, norm-like, element-wise, reduction) and flag TileIR risks (JSON)",
             "Examples:\n  cutile-perf classify-triton --file kernel.py\n"
             "  cutile-perf classify-triton --file kernel.py --apply-optimizations --output kernel_tileir.py\n"
             "  cutile-perf classify-triton --file kernel.py --apply-optimizations --report report.md "
             "--verification verify.json")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="Python module with @triton.jit kernels")
    source.add_argument("--code", help="the module's source as a string")
    p.add_argument("--apply-optimizations", action="store_true",
                   help="add TileIR configs beside each autotuned kernel's own, gated on the TileIR backend")
    p.add_argument("--output", type=Path, help="write the optimized code there (never the input file)")
    p.add_argument("--report", type=Path, help="render the TileIR optimization report (Markdown) there")
    p.add_argument("--verification", type=Path, help="a `verify-triton --json` result to include in the report")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.classify_triton import classify_triton  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return classify_triton(file=a.file, code=a.code, apply=a.apply_optimizations, output=a.output,
                               report_path=a.report, verification=a.verification)

    p.set_defaults(handler=run)


def _add_verify_triton(subparsers) -> None:
    p = _sub(subparsers, "verify-triton",
             "run a Triton kernel's host entry point against a torch reference per shape (GPU or CPU interpreter)",
             "The kernel module defines a host function taking the inputs positionally, in --shapes order,\n"
             "and returning a tensor (or tuple); --entry names it (default: first public function that\n"
             "launches a @triton.jit kernel). The reference sees the same names, plus torch, F and math.\n\n"
             "Example:\n  cutile-perf verify-triton --kernel softmax.py --reference 'torch.softmax(x, -1)' "
             "--shapes '{\"x\": [32, 4096]}' --dtypes '{\"x\": \"bfloat16\"}'")
    p.add_argument("--kernel", type=Path, required=True, help="Python module with the kernel and its host function")
    p.add_argument("--reference", required=True, help="torch expression over the input names")
    p.add_argument("--shapes", required=True, help='JSON {"x": [32, 512]} or a list of such objects')
    p.add_argument("--dtypes", help='JSON {"x": "bfloat16"} or one dtype name for all inputs (default float32)')
    p.add_argument("--entry", help="host function to call (default: first public function that launches a kernel)")
    p.add_argument("--device", choices=["auto", "gpu", "interpreter"], default="auto",
                   help="auto: the GPU when torch sees one, else the CPU interpreter")
    p.add_argument("--no-tileir", dest="tileir", action="store_false",
                   help="skip the ENABLE_TILE=1 pass even when the TileIR backend is installed")
    p.add_argument("--atol", type=float, help="absolute tolerance (default by dtype)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default by dtype)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per backend pass (default 600)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.verify_triton import verify_triton  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return verify_triton(kernel=a.kernel, reference=a.reference, shapes=a.shapes, dtypes=a.dtypes, entry=a.entry,
                             device=a.device, tileir=a.tileir, atol=a.atol, rtol=a.rtol, seed=a.seed,
                             timeout_s=a.timeout)

    p.set_defaults(handler=run)


TARGET_EPILOG = """\
Naming a kernel: --target MODULE:ATTRIBUTE names a cutile_perf.tune.Tunable object (kernel, final
space per arch, fixed config, default shapes, problem(shape) -> grid_fn/args_fn). The bundled suite
has tilesuite.tunables:rms_norm and tilesuite.tunables:matmul (PYTHONPATH=examples/kernels/src in a
checkout, or <dir>/src after `cutile-perf example copy --dest <dir>`).
--shape NAME=INT,... (repeatable) replaces the tunable's default shapes."""


def _add_tune_target(p) -> None:
    p.add_argument("--target", required=True, metavar="MODULE:ATTR", help="the Tunable to tune, e.g. tilesuite.tunables:matmul")
    p.add_argument("--shape", action="append", dest="shapes", metavar="NAME=INT,...",
                   help="a problem shape (repeatable; default: the tunable's shapes)")


def _add_probe(subparsers) -> None:
    p = _sub(subparsers, "probe",
             "directional exploration (<= ~100 configs over the dimensions you name): ranked table + the <= 8 to keep",
             "Example:\n  cutile-perf probe --target tilesuite.tunables:matmul --dim TILE_M=64,128,256 "
             "--dim TILE_N=64,128,256 --dim num_ctas=1,2 --shape M=4096,N=4096,K=4096\n\n"
             "Fields not named by --dim keep the fixed config's value. Never edits source.\n\n" + TARGET_EPILOG)
    _add_tune_target(p)
    p.add_argument("--dim", action="append", default=[], dest="dims", metavar="NAME=V1,V2,...",
                   help="a dimension to vary (repeatable)")
    p.add_argument("--tolerance", type=float, default=0.05, help="keep-set tolerance vs the best per shape (default 0.05)")
    p.add_argument("--max-configs", type=int, default=100, help="refuse larger probes (default 100)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.probe import probe  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return probe(target=a.target, dims=a.dims, shapes=a.shapes, tolerance=a.tolerance, max_configs=a.max_configs)

    p.set_defaults(handler=run)


def _add_ab(subparsers) -> None:
    p = _sub(subparsers, "ab", "autotuned vs the fixed config per shape, with 95 % confidence intervals and a verdict",
             "Example:\n  cutile-perf ab --target tilesuite.tunables:rms_norm\n\n"
             "Exit 1 when the tuned config is slower than the fixed one on any shape.\n\n" + TARGET_EPILOG)
    _add_tune_target(p)
    p.add_argument("--rep-ms", type=float, default=200.0, help="timing budget per side and round in ms (default 200)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.ab import ab  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return ab(target=a.target, shapes=a.shapes, rep_ms=a.rep_ms)

    p.set_defaults(handler=run)


def _add_prune(subparsers) -> None:
    p = _sub(subparsers, "prune", "configs of the final space that never win on any tested shape (target: <= 8 per arch)",
             "Example:\n  cutile-perf prune --target tilesuite.tunables:matmul --tolerance 0.03\n\n" + TARGET_EPILOG)
    _add_tune_target(p)
    p.add_argument("--tolerance", type=float, default=0.05, help="a config within this of the best on a shape is useful (default 0.05)")
    p.add_argument("--max-keep", type=int, default=8, help="largest space to keep (default 8)")

    def run(a: argparse.Namespace) -> Outcome:
        from cutile_perf.commands.prune import prune  # noqa: PLC0415 - loaded on use: --help and other commands start fast

        return prune(target=a.target, shapes=a.shapes, tolerance=a.tolerance, max_keep=a.max_keep)

    p.set_defaults(handler=run)


SUBCOMMANDS: list[Callable] = [
    _add_init,
    _add_scaffold_perf,
    _add_survey,
    _add_compile_check,
    _add_baseline,
    _add_try,
    _add_batch,
    _add_screen,
    _add_status,
    _add_verify,
    _add_report,
    _add_resume,
    _add_env,
    _add_demo,
    _add_probe,
    _add_ab,
    _add_prune,
    _add_tileir_check,
    _add_classify_triton,
    _add_verify_triton,
    _add_install_skill,
    _add_example,
    _add_template,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cutile-perf",
        description="Make a cuTile kernel faster one measured, reversible step at a time.",
        epilog="Loop:\n  cutile-perf init --kernel rms_norm\n  cutile-perf baseline\n"
        '  (edit the kernel)\n  cutile-perf try "describe the one change"\n  cutile-perf status\n'
        "  cutile-perf report\n\n" + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cutile-perf {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def subcommand_names() -> list[str]:
    """Every subcommand, for the docs check."""
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(action.choices)


def subcommand_flags(name: str) -> set[str]:
    """Every option string a subcommand accepts, for the docs check."""
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt for act in action.choices[name]._actions for opt in act.option_strings}


def _log_unexpected(args: argparse.Namespace) -> Path | None:
    """Write the traceback and versions next to the session, so a bug report has what it needs.

    Into the session's sandbox/ when there is one; else into the temporary folder, so that a failed
    command leaves nothing behind in a repository it was only pointed at."""
    try:
        from cutile_perf.child.envcheck import versions_line  # noqa: PLC0415 - only when a bug is being logged

        repo = getattr(args, "repo", None) or Path(".")
        box = Path(repo) / "sandbox"
        path = (box if (box / "session.yaml").is_file() else Path(tempfile.gettempdir())) / "cutile-perf.log"
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"cutile-perf {__version__} {versions_line()}\n{traceback.format_exc()}\n")
        return path
    except Exception:  # the log is best effort; never hide the original error behind a new one
        return None


def _io_error(exc: OSError, args: argparse.Namespace, name: Callable[[str], str]) -> CutilePerfError:
    """The CutilePerfError for an OSError that reached the command line."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f) or "one of its files"
    what = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename:
        failed = Path(str(exc.filename)).absolute()
        for dest, value in vars(args).items():
            if dest != "repo" and isinstance(value, Path) and (failed == value.absolute()
                                                             or value.absolute() in failed.parents):
                return UsageError(f"{name(dest)} {value}: {what}")
    return CouldNotWrite(f"could not read or write {where}: {what}",
                         "free space or fix the permissions, then run the command again "
                         "(`cutile-perf status` says whether resume is needed)")


def _sigterm_as_interrupt(signum, frame) -> None:
    # SIGTERM (a CI job cancelled, `kill`) ends an iteration like Ctrl-C: patch saved, row logged,
    # branch settled, children killed. Without this, Python dies on the spot and leaves all of it.
    raise KeyboardInterrupt(f"signal {signum}")


# Arguments that name files, folders, kernels, branches or commits: control characters in them are
# refused (stripping would name another file). Free text (``FREE_TEXT``) is cleaned instead; the
# rest (expressions, JSON, source code) is parsed by its command. Bytes that were not UTF-8 are
# refused in every argument.
NAME_ARGS = {"kernel", "allow", "branch", "test", "older", "newer", "target", "op", "under", "step", "entry"}
FREE_TEXT = {"optimization"}


def _arg_name(parser: argparse.ArgumentParser, command: str | None, dest: str) -> str:
    for action in _subparser(parser, command)._actions if command else ():
        if action.dest == dest:
            return action.option_strings[-1] if action.option_strings else action.metavar or dest
    return dest


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def check_arguments(args: argparse.Namespace, name=lambda dest: dest) -> None:
    """Refuse (UsageError, exit 2) argument text that is not UTF-8, control characters in names and
    paths; strip terminal control from free text, in place. Before any command touches anything."""
    for dest, value in vars(args).items():
        if dest in ("handler", "command"):
            continue
        items = value if isinstance(value, list) else [value]
        texts = [str(v) for v in items if isinstance(v, (str, Path))]
        for text in texts:
            if not_utf8(text):
                raise UsageError(f"{name(dest)}: not UTF-8 text (the bytes were not valid UTF-8)",
                                 "pass plain text; check the terminal's encoding")
            if (dest in NAME_ARGS or isinstance(value, Path)) and any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text):
                raise UsageError(f"{name(dest)} {displayable(text)!r}: control characters in a name or path")
        if dest in FREE_TEXT and isinstance(value, str):
            setattr(args, dest, clean_text(value, name(dest)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    name = functools.partial(_arg_name, parser, args.command)
    if threading.current_thread() is not threading.main_thread():
        return _run(args, name)
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return _run(args, name)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, name: Callable[[str], str] = str) -> int:
    try:
        try:
            check_arguments(args, name)
            outcome: Outcome = args.handler(args)
        except UnicodeDecodeError as exc:  # a file we were given (a plan, session.yaml) is not UTF-8
            raise UsageError(f"a file it read is not UTF-8 text ({exc.reason} at byte {exc.start})",
                             "save it as UTF-8") from exc
        except OSError as exc:
            # I/O failed (disk full, read-only, a folder where a file goes): a documented exit that
            # names the path, not a traceback. On a path the user passed it is a usage error (2),
            # on one of our own files CouldNotWrite (4).
            raise _io_error(exc, args, name) from exc
    except CutilePerfError as exc:
        message, hint = displayable(exc.message), displayable(exc.hint) if exc.hint else None
        if getattr(args, "json", False):
            _print_to_reader(json.dumps({"error": message, "hint": hint, "exit_code": exc.exit_code}))
        else:
            print(f"cutile-perf: error: {message}" + (f" ({hint})" if hint else ""), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("cutile-perf: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug of ours: one line for the user, the traceback in the log
        log = _log_unexpected(args)
        where = f"; traceback in {log}" if log else ""
        print(f"cutile-perf: unexpected error: {displayable(f'{type(exc).__name__}: {exc}')}{where}", file=sys.stderr)
        return EXIT_UNEXPECTED
    if getattr(args, "json", False):
        _print_to_reader(json.dumps(outcome.data, default=str, sort_keys=True))
    elif outcome.text:
        _print_to_reader(outcome.text)
    return outcome.exit_code


def _print_to_reader(text: str) -> None:
    """Print the command's output; a reader that stopped early (`cutile-perf status | head -1`) is
    not an error: the work is done, the exit code stays the command's, and no traceback follows."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # What is still buffered must go nowhere, or Python's flush at exit raises the same error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)

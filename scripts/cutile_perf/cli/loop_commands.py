"""The experiment loop's subcommands: their flags, help texts and the command each runs."""
from __future__ import annotations

import argparse
from pathlib import Path

from cutile_perf.cli.subcommand import add_spread_flags, runs, subcommand

JOB_SECONDS_HELP = ("the seconds the GPU job gives this command: the budget is that less a reserve (5 %%, at least "
                    "15 s), and every test child's timeout ends with it; a try cut short is settled as interrupted")


def _add_init(subparsers) -> None:
    p = subcommand(
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
                   help="start each expected perf run as a spare beside the run before it, parked before any "
                        "code of the repository, so its start-up overlaps that run (default on; only where the "
                        "children run in the sandbox)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run the test children without the isolation this machine offers (session.yaml "
                        "sandbox_mode: off; default auto)")

    runs(p, "init", lambda a: dict(repo=a.repo, kernel=a.kernel, test=a.test, branch=a.branch, allow=a.allow,
                                    timeout_s=a.timeout, perf_test=a.perf_test, correctness_jobs=a.correctness_jobs,
                                    prestart_perf=a.prestart_perf, sandbox_mode="off" if a.no_sandbox else "auto"))


def _add_scaffold_perf(subparsers) -> None:
    p = subcommand(subparsers, "scaffold-perf",
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

    runs(p, "scaffold_perf", lambda a: dict(repo=a.repo, kernel=a.kernel, test=a.test, output=a.output,
                                             stdout=a.stdout, checked=a.checked))


def _add_survey(subparsers) -> None:
    p = subcommand(subparsers, "survey",
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
    add_spread_flags(p, "the ops spread over them; with 1, --jobs threads")

    runs(p, "survey", lambda a: dict(repo=a.repo, run=a.run, timeout_s=a.timeout, sample=a.sample, jobs=a.jobs,
                                      under=a.under, markdown=a.markdown, logs=a.logs, budget_s=a.budget,
                                      ops=tuple(a.op), gpus=a.gpus, engine=a.engine))


def _add_compile_check(subparsers) -> None:
    p = subcommand(subparsers, "compile-check",
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

    runs(p, "compile_check", lambda a: dict(repo=a.repo, kernel=a.kernel, arch=a.arch, spec=a.spec,
                                             write_spec=a.write_spec, record_launches=a.record, as_=a.as_))


def _add_baseline(subparsers) -> None:
    p = subcommand(subparsers, "baseline", "iteration 0: correctness, then perf measured --repeats times for the noise floor",
             "Example:\n  cutile-perf baseline --repeats 3")
    p.add_argument("--repeats", type=int, default=3, help="perf runs used to estimate per-shape noise (default 3)")

    runs(p, "baseline", lambda a: dict(repo=a.repo, repeats=a.repeats))


def _add_try(subparsers) -> None:
    p = subcommand(subparsers, "try", "test, measure and keep or revert the uncommitted change to the fenced files",
             'Example:\n  cutile-perf try "occupancy 2 -> 4"\n'
             '  cutile-perf try "occupancy 2 -> 4" --job-seconds 600   # inside a 10-minute GPU job')
    p.add_argument("optimization", help="one short phrase naming the single optimization applied")
    p.add_argument("--job-seconds", type=float, metavar="N", help=JOB_SECONDS_HELP)

    runs(p, "try_", lambda a: dict(repo=a.repo, optimization=a.optimization, job_s=a.job_seconds))


def _add_batch(subparsers) -> None:
    p = subcommand(subparsers, "batch", "one try per prepared candidate of a plan file, in one GPU job, within a time budget",
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

    runs(p, "batch", lambda a: dict(repo=a.repo, plan_path=a.plan, budget_s=a.budget, job_s=a.job_seconds,
                                     baseline_repeats=a.baseline, check_only=a.check))


def _add_screen(subparsers) -> None:
    p = subcommand(subparsers, "screen", "rank many candidates side by side on one GPU (readings, not verdicts); "
             "nothing is committed, batch decides the best",
             "Examples:\n  cutile-perf screen 'sandbox/cand/*.py' --seconds 240 --top 2\n"
             "  cutile-perf screen sandbox/plan.yaml --seconds 240\n\n"
             "Each candidate is compile-checked on the CPU, then its correctness runs; those that pass are timed\n"
             "in rounds (the base, then each candidate, order rotated) for as long as --seconds allows, at least\n"
             "one round. The table goes to sandbox/screen.md; --top K writes sandbox/screen-plan.yaml for batch.")
    p.add_argument("candidates", help="a glob of candidate files for the fenced kernel file (quoted), or a batch plan")
    p.add_argument("--seconds", type=float, default=0.0,
                   help="time for the whole screen: candidates whose first ranking cannot end in time (at this "
                        "session's stage times) are listed as not screened, and a further round starts only if it "
                        "can end in time (default 0: one round of every candidate)")
    p.add_argument("--top", type=int, metavar="K", help="write sandbox/screen-plan.yaml with the K best, for batch")
    p.add_argument("--cases", type=int, metavar="N",
                   help="time every run on N of the base's cases, spread from its fastest to its slowest (default: "
                        "all): cheaper rounds, a ranking with less power; batch still decides on every case")

    add_spread_flags(p, "each comparing its candidates with the base on its one GPU")

    runs(p, "screen", lambda a: dict(repo=a.repo, candidates=a.candidates, seconds=a.seconds, top=a.top,
                                      gpus=a.gpus, engine=a.engine, cases=a.cases))


def _add_verify(subparsers) -> None:
    p = subcommand(subparsers, "verify",
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

    runs(p, "verify", lambda a: dict(repo=a.repo, older=a.older, newer=a.newer, pairs=a.pairs,
                                      full_tests=a.full_tests))


def _add_status(subparsers) -> None:
    p = subcommand(subparsers, "status", "the results table, current baseline, stop condition and what to try next")
    p.add_argument("--all", action="store_true", help="show every row (default: the last 10)")

    runs(p, "status", lambda a: dict(repo=a.repo, show_all=a.all))


def _add_report(subparsers) -> None:
    p = subcommand(subparsers, "report", "write sandbox/report.md and the running-best plot")
    p.add_argument("--output", type=Path, help="report path (default: <repo>/sandbox/report.md)")

    runs(p, "report", lambda a: dict(repo=a.repo, output=a.output))


def _add_resume(subparsers) -> None:
    p = subcommand(subparsers, "resume", "after a crash or kill: rebuild state from the log and git, leave the repo consistent",
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

    runs(p, "resume", lambda a: dict(repo=a.repo, adopt_head=a.adopt, reset_to_kept=a.reset_to_kept))


def _add_env(subparsers) -> None:
    p = subcommand(subparsers, "env", "check the GPU, compute capability, cuda-tile and tileiras")

    runs(p, "env", lambda a: {})


def _add_demo(subparsers) -> None:
    p = subcommand(subparsers, "demo", "run the whole loop on a bundled kernel in sandbox/demo/ (needs a GPU)",
             "Example:\n  cutile-perf demo --kernel rmsnorm")
    p.add_argument("--kernel", default="rmsnorm", help="bundled kernel to optimize (default rmsnorm)")
    p.add_argument("--correctness-jobs", type=int, default=None, metavar="N",  # None: loop.demo's default
                   help="the demo session's correctness tests in N pytest children at once, as init "
                        "--correctness-jobs (default 3: a demo step is mostly its correctness run)")
    p.add_argument("--prestart-perf", action=argparse.BooleanOptionalAction, default=True,
                   help="start the expected perf runs as parked spares, as init --prestart-perf (default on)")

    runs(p, "demo", lambda a: dict(kernel=a.kernel, correctness_jobs=a.correctness_jobs,
                                   prestart_perf=a.prestart_perf))


# In the order --help lists them.
SUBCOMMANDS = (
    _add_init, _add_scaffold_perf, _add_survey, _add_compile_check, _add_baseline, _add_try, _add_batch, _add_screen,
    _add_status, _add_verify, _add_report, _add_resume, _add_env, _add_demo,
)

"""Command line: parse, dispatch to ``cutile_perf.commands``, print the outcome, map errors to exit codes.

Nothing else in the package imports argparse, prints results or calls ``sys.exit``. The parser and
what each subcommand runs are in ``cli.parser``; this module runs a parsed command.
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
from cutile_perf.cli.parser import build_parser, subcommand_flags, subcommand_names, subcommand_parsers
from cutile_perf.errors import (EXIT_INTERRUPTED, EXIT_UNEXPECTED, CouldNotWrite, CutilePerfError, UsageError,
                                 clean_text, displayable, not_utf8)
from cutile_perf.output import Outcome

__all__ = ["build_parser", "check_arguments", "main", "subcommand_flags", "subcommand_names", "subcommand_parsers"]


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


def sigterm_as_interrupt(signum, frame) -> None:
    """A SIGTERM handler: SIGTERM (a CI job cancelled, `kill`) ends an iteration like Ctrl-C: patch
    saved, row logged, branch settled, children killed. Without it, Python dies on the spot and
    leaves all of it. Public for drivers that call the library instead of the CLI."""
    raise KeyboardInterrupt(f"signal {signum}")


# Arguments that name files, folders, kernels, branches or commits: control characters in them are
# refused (stripping would name another file). Free text (``FREE_TEXT``) is cleaned instead; the
# rest (expressions, JSON, source code) is parsed by its command. Bytes that were not UTF-8 are
# refused in every argument.
NAME_ARGS = {"kernel", "allow", "branch", "test", "older", "newer", "target", "op", "under", "step", "entry"}
FREE_TEXT = {"optimization"}


def _arg_name(parser: argparse.ArgumentParser, command: str | None, dest: str) -> str:
    for action in subcommand_parsers(parser)[command]._actions if command else ():
        if action.dest == dest:
            return action.option_strings[-1] if action.option_strings else action.metavar or dest
    return dest


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
    previous = signal.signal(signal.SIGTERM, sigterm_as_interrupt)
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

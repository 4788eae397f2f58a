"""The pieces every subcommand is built from: its parser with the shared flags, and the command it runs.

A subcommand names its command by module (``cutile_perf.commands.<name>.<name>``) and says how its
parsed arguments become that function's keywords (``runs``). The module is imported only when the
command runs, so ``--help`` and every other command start without loading it.
"""
from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Callable
from pathlib import Path

from cutile_perf.errors import exit_codes_text
from cutile_perf.output import Outcome

EXIT_CODES_HELP = exit_codes_text()  # the one table (errors.EXIT_CODES), at the end of every --help


def subcommand(subparsers, name: str, help_text: str, epilog: str = "") -> argparse.ArgumentParser:
    """A new subcommand's parser, with its help, the exit codes and the flags every command takes."""
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


def add_spread_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--gpus`` and ``--engine`` of the commands that spread work over a node's GPUs (``node``);
    ``what``: what each worker gets, for the help."""
    parser.add_argument("--gpus", default="1", metavar="N|all",
                        help=f"one worker per GPU, {what} (default 1: this process)")
    parser.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="workers on this node (local, default) or a Ray actor per GPU of a Ray cluster (the ray extra)")


def runs(parser: argparse.ArgumentParser, command: str, keywords: Callable[[argparse.Namespace], dict]) -> None:
    """What ``parser``'s subcommand does: call ``cutile_perf.commands.<command>.<command>`` with
    ``keywords(args)``. Only the name is held here: the module loads when the command runs."""
    parser.set_defaults(handler=functools.partial(_call, command, keywords))


def _call(command: str, keywords: Callable[[argparse.Namespace], dict], args: argparse.Namespace) -> Outcome:
    module = importlib.import_module(f"cutile_perf.commands.{command}")
    return getattr(module, command)(**keywords(args))

"""The ``cutile-perf`` parser, assembled from the subcommands, and what the docs check asks of it."""
from __future__ import annotations

import argparse

from cutile_perf import __version__
from cutile_perf.cli import loop_commands, tool_commands
from cutile_perf.cli.subcommand import EXIT_CODES_HELP

SUBCOMMANDS = (*loop_commands.SUBCOMMANDS, *tool_commands.SUBCOMMANDS)


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


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's own parser, by name."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def subcommand_names() -> list[str]:
    """Every subcommand, for the docs check."""
    return sorted(subcommand_parsers(build_parser()))


def subcommand_flags(name: str) -> set[str]:
    """Every option string a subcommand accepts, for the docs check."""
    return {opt for act in subcommand_parsers(build_parser())[name]._actions for opt in act.option_strings}

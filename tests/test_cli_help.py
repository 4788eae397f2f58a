"""The help texts an agent reads first: every command's --help works and carries the exit codes."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from cutile_perf import cli


def _help(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "cutile_perf", *args, "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_top_level_help_lists_every_command_and_the_exit_codes():
    # Regression: a bare "%" in one subcommand's help made argparse crash while formatting
    # `cutile-perf --help` (TypeError: %c requires int or char).
    out = _help()
    for name in cli.subcommand_names():
        assert f"    {name}" in out, name
    assert "Exit codes:" in out and "  3    refused" in out


@pytest.mark.parametrize("name", cli.subcommand_names())
def test_each_subcommand_help_has_usage_and_exit_codes(name):
    out = _help(name)
    assert out.startswith(f"usage: cutile-perf {name}")
    assert "Exit codes:" in out
    assert "%%" not in out  # descriptions are printed verbatim, not %-formatted


def test_exit_codes_are_distinct():
    from cutile_perf import errors

    codes = [errors.EXIT_OK, errors.EXIT_REJECTED, errors.EXIT_USAGE, errors.EXIT_REFUSED,
             errors.EXIT_CRASH, errors.EXIT_UNEXPECTED, errors.EXIT_INTERRUPTED]
    assert len(set(codes)) == len(codes)


def test_every_help_ends_with_the_one_generated_exit_code_table():
    # In process: one parser, no child per subcommand. The text is errors.EXIT_CODES, the table
    # SKILL.md and harness.md copy (tests/test_docs.py).
    from cutile_perf import errors

    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    table = errors.exit_codes_text()
    assert parser.format_help().endswith(table)
    for name, sub in action.choices.items():
        assert sub.format_help().endswith(table), name

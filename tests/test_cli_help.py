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


# --- dispatch: one table, modules loaded on use (cli/subcommand.py) -------------------------------


def _every_argument_at_its_default(sub: argparse.ArgumentParser) -> argparse.Namespace:
    return argparse.Namespace(**{a.dest: a.default for a in sub._actions if a.dest != "help"})


@pytest.mark.parametrize("name", cli.subcommand_names())
def test_each_subcommand_runs_a_command_function_that_takes_its_keywords(name):
    # The table names each command by string; a typo in a module, function or keyword would only
    # surface when an agent ran that command. Resolve each one and bind its keywords here.
    import importlib
    import inspect

    sub = cli.subcommand_parsers(cli.build_parser())[name]
    handler = sub.get_default("handler")
    command, keywords = handler.args
    function = getattr(importlib.import_module(f"cutile_perf.commands.{command}"), command)
    inspect.signature(function).bind(**keywords(_every_argument_at_its_default(sub)))


def test_building_the_parser_and_help_load_no_command_module():
    # --help and every command start fast: a command's module (git, yaml, jinja2, the loop) is
    # imported only when that command runs.
    code = ("import sys, contextlib, io\nfrom cutile_perf import cli\ncli.build_parser()\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.main(['status', '--help'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('cutile_perf.commands.') or m in ('git', 'torch')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

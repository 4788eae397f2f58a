"""One error hierarchy, one exit code per meaning; and the one cleaner of text from outside.

Library code raises these; only ``cli.main`` turns them into a message and an exit code. Text a
user or an agent passes (``clean_text``) and text shown from the log (``displayable``) is cleaned
here, at the bottom, so the command line and every renderer use the same rule.
"""
from __future__ import annotations

import re
import textwrap
import unicodedata

# Exit codes. Each has exactly one meaning, written once in EXIT_CODES below: every `--help` prints
# it (exit_codes_text) and SKILL.md and references/harness.md carry it as a table (tests/test_docs.py
# compares the copies), so the meanings cannot drift apart.
EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_CRASH = 4
EXIT_UNEXPECTED = 70
EXIT_INTERRUPTED = 130

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done; for `try`: the change was kept"),
    # A failed correctness test is an ordinary rejected change (crash class wrong-result, row status
    # revert), not a crash: exit 1, never 4.
    (EXIT_REJECTED, "the change was reverted (not faster, or a wrong result), or a check said no "
                    "(`env`, `compile-check`, `verify`, `batch --check`, `tileir-check`, ...)"),
    (EXIT_USAGE, "usage error or bad input (arguments, files)"),
    (EXIT_REFUSED, "refused before touching anything: fence violation, dirty tree, lock held, no session, "
                   "GPU or toolchain missing"),
    (EXIT_CRASH, "the iteration crashed (compile error, fault, timeout, no record, ...): the repo is "
                 "reverted and the patch saved; or cutile-perf could not write its own files (disk full, "
                 "read-only): the path is named"),
    (EXIT_UNEXPECTED, "unexpected error: a bug in cutile-perf, traceback in `sandbox/cutile-perf.log`"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C or SIGTERM); `cutile-perf resume` settles the iteration"),
)


def exit_codes_text(width: int = 100) -> str:
    """The exit-code table as every ``--help`` ends: ``Exit codes:``, then one wrapped entry a code."""
    lines = ["Exit codes:"]
    for code, meaning in EXIT_CODES:
        lines += textwrap.wrap(meaning, width, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7,
                               break_on_hyphens=False)
    return "\n".join(lines) + "\n"


class CutilePerfError(Exception):
    """An error with a one-line message for the user and an optional hint on what to run next."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(CutilePerfError):
    exit_code = EXIT_USAGE


class BadEnvValue(UsageError, ValueError):
    """An environment variable we read holds a value we do not accept (a typo must not pass silently).

    Also a ValueError: library callers (a kernel's launcher reading DISABLE_AUTOTUNE) catch it as one.
    """


class Refused(CutilePerfError):
    """Nothing was changed: the command refused to start."""

    exit_code = EXIT_REFUSED


class FenceViolation(Refused):
    pass


class DirtyTree(Refused):
    pass


class NoChange(Refused):
    """``try`` found nothing changed in the fenced files (``batch`` skips such an entry)."""


class Locked(Refused):
    pass


class NoSession(Refused):
    pass


class EnvMissing(CutilePerfError):
    """The GPU, cuda-tile or tileiras needed for this command is not there."""

    exit_code = EXIT_REFUSED


class IterationCrashed(CutilePerfError):
    exit_code = EXIT_CRASH


class CouldNotWrite(CutilePerfError):
    """cutile-perf could not write (or read back) one of its own files: the disk is full, the folder
    is read-only, a directory sits where a file goes. Exit 4 like a crash: the command stopped part
    way; ``cutile-perf status`` says whether ``resume`` is needed once the cause is fixed."""

    exit_code = EXIT_CRASH


# --- text from outside ----------------------------------------------------------------------------

# A lone surrogate is how Python hands over argv (or a file read with surrogateescape) bytes that were
# not UTF-8; written to the log it cannot be encoded back, and every later command that renders it fails.
_SURROGATE = re.compile("[\ud800-\udfff]")
# Terminal escape sequences, whole: CSI (colours, cursor moves, erase line), the string sequences
# (OSC window titles and hyperlinks, DCS, SOS, PM, APC) up to their terminator, and any other ESC
# with its intermediate and final bytes. Dropping only the ESC would leave "[2K" behind.
_SEQUENCE = re.compile(
    "(?:\x1b\\[|\x9b)[0-?]*[ -/]*[@-~]?"
    "|(?:\x1b[\\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\\\|\x9c)?"
    "|\x1b[ -/]*[0-~]?")
_LINE_BREAKS = re.compile("[\t\n\v\f\r\x1c-\x1e\x85\u2028\u2029]")
# The rest of C0, DEL, C1, and the bidirectional overrides and isolates that make a terminal or an
# editor show text in another order than it is stored ("Trojan Source").
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def yaml_problem(exc: Exception) -> str:
    """PyYAML's error as one line: where (line, column) and what, instead of its multi-line text
    with the source quoted. An array type such as ``float16[2]`` inside ``{...}`` flow style is the
    usual cause of "expected ',' or '}', but got '['": the hint says to quote it."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    hint = ""
    if "but got '['" in problem:
        hint = ' (inside {...} a value with brackets must be quoted: input: "float16[2]"; or use block style)'
    return f"{where}{problem}{hint}"


def not_utf8(text: str) -> bool:
    """True when ``text`` carries bytes that were not UTF-8 (lone surrogates from surrogateescape)."""
    return bool(_SURROGATE.search(text))


def strip_invisible(text: str) -> str:
    """``text`` without the invisible format characters (Unicode category Cf): zero-width spaces and
    joiners, the Arabic letter mark U+061C, bidi marks, embeddings, overrides and isolates, tag
    characters U+E0000-E007F, soft hyphens. Shown, they hide or reorder what a row says; the
    category is read from the running Python's Unicode data, so a newer one is covered too."""
    if text.isascii():
        return text
    return "".join(c for c in text if c < "\x80" or unicodedata.category(c) != "Cf")


def strip_controls(text: str) -> str:
    """``text`` without terminal control: escape sequences, C0/C1 controls and invisible format
    characters (``strip_invisible``) dropped, line breaks and tabs made spaces, runs of whitespace
    made one. Lone surrogates are kept (see ``clean_text``)."""
    text = strip_invisible(_CONTROL.sub("", _LINE_BREAKS.sub(" ", _SEQUENCE.sub("", text))))
    return " ".join(text.split())


def clean_text(text: str, what: str) -> str:
    """Free text a user or an agent passes that lands in the log, a view or a terminal (a ``try``
    description, a plan entry's optimization): terminal control stripped, one line; a UsageError
    (exit 2) naming ``what`` when it holds bytes that were not UTF-8."""
    if not_utf8(text):
        raise UsageError(f"{what}: not UTF-8 text (the bytes were not valid UTF-8)",
                         "pass plain text; check the terminal's or the file's encoding")
    return strip_controls(text)


def displayable(text: str) -> str:
    """Any text made safe to show: one line, no terminal control, bytes that were not UTF-8 as U+FFFD.
    For what was already stored or is being reported (error messages, old log rows)."""
    return strip_controls(_SURROGATE.sub("\ufffd", str(text)))

"""One error hierarchy, one exit code per meaning; and the one cleaner of text from outside.

Library code raises these; only ``cli.main`` turns them into a message and an exit code. Text a
user or an agent passes (``clean_text``) and text shown from the log (``displayable``) is cleaned
here, at the bottom, so the command line and every renderer use the same rule.
"""
from __future__ import annotations

import re

# Exit codes. Each has exactly one meaning (see `cutile-perf --help`).
EXIT_OK = 0  # done; for `try`, the change was kept
EXIT_REJECTED = 1  # the change was reverted, or a check said "not ready"
EXIT_USAGE = 2  # bad arguments or bad input files
EXIT_REFUSED = 3  # refused before touching anything: fence, dirty tree, lock, missing session
EXIT_CRASH = 4  # the iteration crashed (compile error, fault, timeout, no record...); repo reverted; or our own
# files could not be written (disk full, read-only): CouldNotWrite
EXIT_INTERRUPTED = 130
EXIT_UNEXPECTED = 70  # a bug in cutile-perf; the traceback is in sandbox/cutile-perf.log


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


def not_utf8(text: str) -> bool:
    """True when ``text`` carries bytes that were not UTF-8 (lone surrogates from surrogateescape)."""
    return bool(_SURROGATE.search(text))


def strip_controls(text: str) -> str:
    """``text`` without terminal control: escape sequences and C0/C1 controls dropped, line breaks and
    tabs made spaces, runs of whitespace made one. Lone surrogates are kept (see ``clean_text``)."""
    text = _CONTROL.sub("", _LINE_BREAKS.sub(" ", _SEQUENCE.sub("", text)))
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

"""One error hierarchy, one exit code per meaning.

Library code raises these; only ``cli.main`` turns them into a message and an exit code.
"""
from __future__ import annotations

# Exit codes. Each has exactly one meaning (see `cutile-perf --help`).
EXIT_OK = 0  # done; for `try`, the change was kept
EXIT_REJECTED = 1  # the change was reverted, or a check said "not ready"
EXIT_USAGE = 2  # bad arguments or bad input files
EXIT_REFUSED = 3  # refused before touching anything: fence, dirty tree, lock, missing session
EXIT_CRASH = 4  # the iteration crashed (compile error, fault, timeout, no record...); repo reverted
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

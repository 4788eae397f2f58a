"""``cutile-perf report``: sandbox/report.md and the running-best plot, rendered from the log."""
from cutile_perf.loop.report import report  # noqa: F401 - the command is the library call

"""``cutile-perf batch PLAN``: the plan's candidates, one ``try`` each, in one GPU job."""
from cutile_perf.loop.batch import batch  # noqa: F401 - the command is the library call

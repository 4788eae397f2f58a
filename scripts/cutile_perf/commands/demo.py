"""`cutile-perf demo`: the whole loop on a bundled kernel, through the same commands an agent calls."""
from cutile_perf.loop.demo import demo  # noqa: F401 - the command is the library call

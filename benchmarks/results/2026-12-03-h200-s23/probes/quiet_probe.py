"""What TileGym's preloads change in a waiting child (warmstart.Quiet before and after them)."""
import dataclasses
import json
import sys

import torch, cuda.tile, pytest  # noqa: E401,F401 - the child's WARM_MODULES
from cutile_perf.child import warmstart

before = warmstart.Quiet.now()
done = warmstart._preload(json.loads(sys.argv[1]))
after = warmstart.Quiet.now()
print(json.dumps({"before": dataclasses.asdict(before), "after": dataclasses.asdict(after), "preloaded": done,
                  "problem": warmstart.preload_problem(before, after)}))

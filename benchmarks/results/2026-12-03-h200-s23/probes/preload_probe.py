import json, sys, time
t0 = time.perf_counter()
import torch, cuda.tile, pytest  # noqa
t1 = time.perf_counter()
from cutile_perf.child import warmstart
names = json.loads(sys.argv[1])
before = warmstart.driver_mapped()
done = warmstart._preload(names)
t2 = time.perf_counter()
print(json.dumps({"warm_modules_s": round(t1 - t0, 2), "preload_s": round(t2 - t1, 2), "preloaded": len(done),
                  "of": len(names), "cuda_touched": warmstart._cuda_touched(before), "driver_before": before}))

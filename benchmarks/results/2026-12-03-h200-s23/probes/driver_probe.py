import ctypes, json, sys, time
from pathlib import Path

def driver_path():
    for line in Path("/proc/self/maps").read_text().splitlines():
        p = line.rpartition(" ")[2]
        if p.rsplit("/", 1)[-1].startswith("libcuda.so"):
            return p
    return None

def initialized():
    p = driver_path()
    if p is None:
        return "not mapped"
    lib = ctypes.CDLL(p)
    n = ctypes.c_int()
    rc = lib.cuDeviceGetCount(ctypes.byref(n))
    return f"rc={rc} count={n.value}"

out = {"start": initialized()}
import torch; out["torch"] = initialized()
import cuda.tile; out["cuda.tile"] = initialized()
import pytest; out["pytest"] = initialized()
from cutile_perf.child import warmstart
warmstart._preload(json.loads(sys.argv[1])); out["preload"] = initialized()
from cutile_perf import bench
bench.prepare_profiler_without_context(); out["cpu_profiler"] = initialized()
out["torch_cuda_initialized"] = torch.cuda.is_initialized()
torch.cuda.init(); out["after torch.cuda.init (control)"] = initialized()
print(json.dumps(out))

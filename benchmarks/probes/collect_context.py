"""Does collecting a test file make a CUDA context, and how can a process outside tell?

    cd <TileGym copy> && PYTHONPATH=$PWD/src python <this file> tests/ops/test_rms_norm.py

What a child that collects before its gate would hold beside a timed run. At each step (start,
after collecting, after cuInit alone, after a tensor on the GPU as the positive control) it prints
torch's CUDA state, the GPU device files this process maps and holds open (what another process
reads in /proc/<pid>/maps and /proc/<pid>/fd), and the compute processes nvidia-smi lists, next to
this process's own id (does NVML name processes in this pid namespace?).
"""
import ctypes
import os
import subprocess
import sys
import time


def compute_apps() -> str:
    t = time.perf_counter()
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return f"[{out.replace(chr(10), '; ') or 'none'}] ({time.perf_counter() - t:.2f} s)"


def device_files() -> str:
    maps = {}
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rpartition(" ")[2].strip()
            if path.startswith("/dev/nvidia"):
                maps[path] = maps.get(path, 0) + 1
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            fds[target] = fds.get(target, 0) + 1
    return f"maps {maps or 'none'}, open {fds or 'none'}"


def step(name: str) -> None:
    torch = sys.modules.get("torch")
    init = torch.cuda.is_initialized() if torch is not None else "no torch"
    print(f"{name}: torch CUDA initialized {init}; {device_files()}; nvidia-smi {compute_apps()}", flush=True)


print("pid", os.getpid(), flush=True)
step("start")
import torch  # noqa: E402

step("import torch")
import pytest  # noqa: E402

t0 = time.perf_counter()
rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
print(f"collected: exit {rc} in {time.perf_counter() - t0:.2f} s", flush=True)
step("after collecting")
lib = next((line.rpartition(" ")[2].strip() for line in open("/proc/self/maps") if "libcuda.so" in line), "libcuda.so.1")
print("cuInit:", ctypes.CDLL(lib).cuInit(0), flush=True)
step("after cuInit")
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
step("after a tensor on the GPU")

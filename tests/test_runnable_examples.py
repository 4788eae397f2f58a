"""Every worked example a user is meant to run, runs as written (issue 43, item 3).

A command block of SKILL.md or references/*.md is marked runnable in its fence's info string, which
renders as plain bash and, unlike an HTML comment, adds no text to SKILL.md for an agent to read
(tests/test_docs.py keeps SKILL.md free of comments):

    ```bash runnable        the block runs here, on a CPU, except its "# GPU job" sections
    ```bash runnable:gpu    the whole block needs a GPU

Inside a runnable block, a comment line starting "# GPU job" opens a section that needs a GPU and
"# CPU box" one that does not (the remote-GPU example alternates them). Each block runs with bash,
exactly as written, in ``tilegym_shaped_kernels``: the bundled kernels as ``cutile-perf example copy``
writes them, a TileGym-shaped git repository (``src/tilesuite/ops/cutile/<op>.py``,
``tests/ops/test_<op>.py``) whose kernels are real cuTile code, so ``compile-check`` compiles them
without a GPU. ``cutile-perf`` on PATH is this checkout's. Without a GPU the GPU sections are left
out and every block that is GPU alone is skipped with the reason; on a GPU machine each block also
runs whole.

Every shell block in scope is either marked or listed in ``NOT_RUNNABLE`` with the reason, so a
marker removed by mistake fails here. references/harness.md is left to its rewrite (issue 40).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from doccheck import fenced_blocks

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
IN_SCOPE = sorted(["SKILL.md", *(f"references/{p.name}" for p in (ROOT / "references").glob("*.md")
                                 if p.name != "harness.md")])
SHELL = {"bash", "sh", "shell", "console"}
_MARK = re.compile(r"^(```+|~~~+)\s*\w+\s+runnable(?::(?P<tag>\w+))?\s*$")
_GPU_SECTION, _CPU_SECTION = "# GPU job", "# CPU box"
BLOCK_TIMEOUT_S = 900  # init and two compile-checks on 2 busy cores took about a minute

# The marked blocks, per file: (runnable, runnable:gpu). A marker lost or added changes a count.
EXPECTED_MARKED = {
    "SKILL.md": (1, 2),
    "references/ir-dump.md": (0, 1),
    "references/h200-measurements.md": (0, 1),
}

# Shell blocks a user may run that this test cannot: (file, first command line) -> why.
_CLONE = "reproduces a recorded H200 figure from a cutile-perf clone (minutes of GPU; run by hand)"
NOT_RUNNABLE = {
    ("references/h200-measurements.md", 'pip install "cuda-tile[tileiras]==1.7.0" '
                                        '"cuda-toolkit[tileiras,nvcc,nvvm]>=13.4,<13.5"'):
        "the H200 box's install: a test never installs packages",
    ("references/h200-measurements.md", "python benchmarks/kernels.py --markdown"): _CLONE,
    ("references/h200-measurements.md", "python benchmarks/kernels.py --markdown                        "
                                        "# copy, cuBLAS, SDPA rows"): _CLONE,
    ("references/h200-measurements.md",
     "cutile-perf init --kernel src/tilegym/ops/cutile/rms_norm.py --test tests/ops/test_rms_norm.py"):
        "needs a TileGym checkout and a GPU",
    ("references/h200-measurements.md", "python benchmarks/kernels.py --markdown --only matmul --all-steps"): _CLONE,
    ("references/h200-measurements.md", "(cd examples/kernels && python -m tests.check_compute_bound_steps matmul)"):
        _CLONE,
    ("references/h200-measurements.md",
     "(cd examples/kernels && python -m tests.check_compute_bound_steps attention)"): _CLONE,
    ("references/h200-measurements.md", "cutile-perf probe --target tilesuite.tunables:matmul --dim "
                                        "TILE_M=64,128,256 --dim TILE_N=64,128,256 \\"): _CLONE,
    ("references/h200-measurements.md", "python benchmarks/matmul_sweep.py --precompile 16 --rounds 3"): _CLONE,
    ("references/h200-measurements.md", "python benchmarks/autotune.py"): _CLONE,
    ("references/h200-measurements.md", "PYTHONPATH=scripts python benchmarks/witness_check.py --markdown"): _CLONE,
    ("references/h200-measurements.md", "PYTHONPATH=scripts:examples/kernels/src:<TileGym>/src python "
                                        "benchmarks/kernels.py --tilegym --markdown \\"): "names a TileGym checkout",
    ("references/h200-measurements.md", "python -m pytest -q tests/test_kernels_gpu.py tests/test_bench.py -m gpu "
                                        '-k "not attention/ and not suite_correctness"'):
        "cutile-perf's own GPU tests, from its clone",
    ("references/h200-measurements.md", "PYTHONPATH=scripts:examples/kernels/src:<TileGym>/src python "
                                        "benchmarks/kernels.py --tilegym \\"): "names a TileGym checkout",
    ("references/h200-measurements.md", "PYTHONPATH=scripts:examples/kernels/src python benchmarks/kernel_sweep.py "
                                        "--round 5 --with-compile \\"): _CLONE,
    ("references/h200-measurements.md", "PYTHONPATH=scripts:examples/kernels/src python benchmarks/profile_gap.py "
                                        "--out <dir> \\"): "names an output folder to choose (<dir>)",
    ("references/h200-measurements.md", "python benchmarks/harness_overhead.py"): _CLONE,
    ("references/h200-measurements.md", "python benchmarks/harness_overhead.py --tilegym <TileGym> --op swiglu "
                                        "--tries 2 --probes 1 --out <dir>"): "names a TileGym checkout",
    ("references/h200-measurements.md", "python benchmarks/harness_overhead.py --tilegym <TileGym> --op swiglu "
                                        "--tries 2 --repeats 1 --probes 0"): "names a TileGym checkout",
    ("references/h200-measurements.md", "python benchmarks/harness_overhead.py --tilegym <TileGym> --op "
                                        "layer_norm_legacy --tries 2 --repeats 1 --probes 0 --correctness-jobs 4 "
                                        "--prestart-perf"): "names a TileGym checkout",
    ("references/h200-measurements.md", "python evals/run.py --measure-references --task layernorm-from-multi-row "
                                        "--task softmax-from-multi-row --out <dir>"): _CLONE,
    ("references/ir-dump.md", "unset CUDA_HOME CUDA_PATH CUDA_ROOT   # a pip tileiras must find its own libnvvm "
                              "and ptxas"): "names a dumped bytecode file of a run of your own",
    ("references/ir-dump.md", "cutile-perf compile-check --record        # once, ON THE GPU: the tests' ct.launch "
                              "calls -> sandbox/compile-check.yaml"):
        "a menu of alternatives over TileGym's silu_and_mul, not one sequence",
    ("references/optimization-playbook.md", "python benchmarks/kernels.py --markdown --mode graph-warm   # or --mode "
                                            "cupti-warm: the target's mode"): _CLONE,
    ("references/triton-tileir.md", "pip install --no-deps --target /opt/triton_tileir <the fork's wheel>"):
        "names a wheel of a Triton fork",
}


@dataclass(frozen=True)
class Example:
    doc: str
    line: int  # the fence's line, 1-based
    tag: str | None  # None: unmarked; "": runnable; "gpu": runnable:gpu
    text: str

    @property
    def key(self) -> tuple[str, str]:
        return self.doc, first_command(self.text)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def first_command(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")), "")


def shell_examples(doc: str) -> list[Example]:
    """The shell blocks of ``doc`` with their marker (pure, but for reading the file)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for block in fenced_blocks(text):
        if block.lang not in SHELL:
            continue
        mark = _MARK.match(lines[block.line - 2])
        tag = None if mark is None else (mark["tag"] or "")
        found.append(Example(doc, block.line - 1, tag, block.text))
    return found


def cpu_part(text: str) -> str:
    """``text`` without its "# GPU job" sections: what a CPU box runs of a block (pure)."""
    kept, on_gpu = [], False
    for line in text.splitlines():
        if line.startswith(_GPU_SECTION):
            on_gpu = True
        elif line.startswith(_CPU_SECTION):
            on_gpu = False
        if not on_gpu:
            kept.append(line)
    return "\n".join(kept)


def has_gpu_part(example: Example) -> bool:
    return example.tag == "gpu" or any(line.startswith(_GPU_SECTION) for line in example.text.splitlines())


ALL = [example for doc in IN_SCOPE for example in shell_examples(doc)]
MARKED = [example for example in ALL if example.tag is not None]


def _cpu_params():
    return [pytest.param(ex, id=ex.id) for ex in MARKED if ex.tag == "" and first_command(cpu_part(ex.text))]


def _gpu_params():
    return [pytest.param(ex, id=ex.id, marks=pytest.mark.gpu) for ex in MARKED if has_gpu_part(ex)]


@pytest.fixture
def tilegym_shaped_kernels(tmp_path: Path, cutile_perf_on_path: dict[str, str]) -> Path:
    """The bundled kernels, copied by ``cutile-perf example copy`` into a git repository of their own."""
    dest = tmp_path / "kernels"
    subprocess.run(["cutile-perf", "example", "copy", "--dest", str(dest)], check=True, capture_output=True,
                   env=cutile_perf_on_path, timeout=120)
    return dest


@pytest.fixture
def cutile_perf_on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``cutile-perf`` and ``python`` are this checkout's code in this interpreter
    (PYTHONPATH first: an installed cutile-perf elsewhere must not answer)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "cutile-perf"
    launcher.write_text(f"#!{sys.executable}\nimport sys\nfrom cutile_perf.cli import main\nsys.exit(main())\n")
    launcher.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join(p for p in [str(SCRIPTS), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath}


def run_block(script: str, repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    # -e: a line that fails stops the block, as a reader stops at an error; pipefail: so does a pipe.
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)


def assert_ran(done: subprocess.CompletedProcess, example: Example) -> None:
    assert done.returncode == 0, (f"{example.id} failed as written (exit {done.returncode})\n"
                                  f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}")


@pytest.mark.parametrize("example", _cpu_params())
def test_the_cpu_steps_of_each_runnable_example_run(example, tilegym_shaped_kernels, cutile_perf_on_path):
    assert_ran(run_block(cpu_part(example.text), tilegym_shaped_kernels, cutile_perf_on_path), example)


@pytest.mark.parametrize("example", _gpu_params())
def test_each_runnable_example_runs_whole_on_a_gpu(example, tilegym_shaped_kernels, cutile_perf_on_path):
    assert_ran(run_block(example.text, tilegym_shaped_kernels, cutile_perf_on_path), example)


def test_every_shell_block_is_marked_or_says_why_not():
    unmarked = {ex.key: ex.id for ex in ALL if ex.tag is None}
    unexplained = {key: where for key, where in unmarked.items() if key not in NOT_RUNNABLE}
    assert not unexplained, f"mark these runnable (```bash runnable) or list them in NOT_RUNNABLE: {unexplained}"
    gone = [key for key in NOT_RUNNABLE if key not in unmarked]
    assert not gone, f"listed as not runnable but no such unmarked block any more: {gone}"


def test_the_marked_blocks_are_the_expected_ones():
    counts = {}
    for ex in MARKED:
        cpu, gpu = counts.get(ex.doc, (0, 0))
        counts[ex.doc] = (cpu + (ex.tag == ""), gpu + (ex.tag == "gpu"))
    assert counts == EXPECTED_MARKED
    assert all(ex.tag in ("", "gpu") for ex in MARKED), [ex.id for ex in MARKED]


def test_a_marker_is_read_from_the_fence_and_gpu_sections_are_left_out():
    assert _MARK.match("```bash runnable")["tag"] is None and _MARK.match("```bash runnable:gpu")["tag"] == "gpu"
    assert _MARK.match("```bash") is None and _MARK.match("```bash # runnable") is None
    block = "# CPU box: set up\na\n# GPU job 1\nb\n# (still the job)\nc\n# CPU box: read\nd"
    assert cpu_part(block) == "# CPU box: set up\na\n# CPU box: read\nd"
    assert first_command(cpu_part("# GPU job 2\nx")) == ""

"""``compile-check``: compile kernels for sm_90 without a GPU and read what the compiler did.

The parsers are tested on captured text; the ``toolchain`` tests compile bundled kernels with
cuda-tile and tileiras (no GPU), through ``aot_signatures()`` and through a hand-written spec.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fixtures_repo import tilegym_like_repo  # noqa: F401

from cutile_perf.kernel import compile_report, compilecheck, signature_spec
from cutile_perf.cli import main
from cutile_perf.errors import UsageError

SUITE = Path(__file__).resolve().parents[1] / "examples" / "kernels"
PLAIN_RMS = "src/tilesuite/ops/cutile/rms_norm.py"
# The one-row TMA RMSNorm of the first demo chain, kept as an evals fixture (its rms_norm_kernel
# loads (1, TILE_N) tiles with ct.load, which tileiras 13.4 lowers to TMA on sm_90).
TMA_RMS = str(Path(__file__).resolve().parents[1] / "evals" / "fixtures" / "rms_norm_one_row_tma.py")

RMS_SPEC = """\
rms_norm_kernel:
  hints: {occupancy: 2}
  signatures:
    - x: float16[2]
      weight: float16[1]
      out: float16[2]
      eps: float32
      TILE_N: 512
"""


def cli(capsys, *args: str) -> tuple[int, dict]:
    code = main(["compile-check", "--json", *args])
    out = capsys.readouterr().out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {})


@pytest.fixture
def suite_path(monkeypatch):
    """The bundled kernels import `tilesuite`: put examples/kernels/src on the path."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(SUITE / "src"))


# --- pure parts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, expected", [
    ("float16[2]", signature_spec.Param("array", "float16", 2)),
    ("bfloat16[1]", signature_spec.Param("array", "bfloat16", 1)),
    ("float32", signature_spec.Param("scalar", "float32")),
    (1024, signature_spec.Param("constant", value=1024)),
    (True, signature_spec.Param("constant", value=True)),
])
def test_parse_param(raw, expected):
    assert signature_spec.parse_param("p", raw) == expected


@pytest.mark.parametrize("raw", ["FILL[2]", "FILL", "float16[two]", "Float16[2]", None, [1, 2]])
def test_parse_param_rejects(raw):
    with pytest.raises(UsageError):
        signature_spec.parse_param("p", raw)


REMARKS = """\
--- !Passed
Pass:            Memory
Name:            RemarkMemoryLoadInstructionSelected
DebugLoc:        { File: 'k.py', Line: 51, Column: 12 }
Function:        k
Args:
  - RemarkId:    1
  - Remark:      Load instruction selected
  - Instruction: TMA Load instruction
  - Shape:       '[64, 64]'
...
--- !Passed
Pass:            Memory
Name:            RemarkMemoryLoadInstructionSelected
DebugLoc:        { File: 'k.py', Line: 51, Column: 12 }
Function:        k
Args:
  - RemarkId:    1
  - Remark:      Load instruction selected
  - Instruction: TMA Load instruction
  - Shape:       '[64, 64]'
...
--- !Passed
Pass:            Memory
Name:            RemarkMemoryLoadInstructionSelected
DebugLoc:        { File: 'k.py', Line: 60, Column: 12 }
Function:        k
Args:
  - Remark:      Load instruction selected
  - Instruction: Global-memory load instruction
...
--- !Failure
Pass:            Memory
Name:            RemarkMemoryTmaLoadFailed
DebugLoc:        { File: 'k.py', Line: 60, Column: 12 }
Function:        k
Args:
  - Remark:      Failed to select TMA load instruction
  - Reason:      'loc("k.py":60:12): TMA only supports zero padding'
  - Reason:      'loc("k.py":60:12): TMA only supports zero padding'
...
--- !Passed
Pass:            Tensor-core
Name:            RemarkTensorCoreMMA
DebugLoc:        { File: 'k.py', Line: 53, Column: 14 }
Args:
  - Remark:      MMA operation successfully optimized to use Tensor Cores
  - Instruction: Tensor-core SM90
...
"""


def test_remarks_summary_counts_each_remark_once():
    summary = compile_report.summarize_remarks(REMARKS)
    assert summary["loads"] == {"TMA Load instruction": 1, "Global-memory load instruction": 1}  # repeat counted once
    assert summary["tma_loads"] == 1 and summary["tensor_cores"] == ["Tensor-core SM90"]
    assert summary["missed"] == ["line 60: Failed to select TMA load instruction (TMA only supports zero padding)"]
    assert compile_report.loads_kind(summary) == ("mixed: 1 TMA of 2 tiled loads; line 60: Failed to select TMA load "
                                                "instruction (TMA only supports zero padding)")
    assert compile_report.loads_kind(compile_report.summarize_remarks("")).startswith("plain")


SASS = """\
        Function : rms_norm_kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                      /* 0x00000a00ff017b82 */
        /*03b0*/                   LDG.E.U16 R42, desc[UR6][R6.64] ;                           /* 0x00000006062a7981 */
        /*0410*/                   LDG.E.128 R4, desc[UR6][R6.64+0x100] ;                      /* 0x0001000606297981 */
        /*0420*/              @!P0 LDG.E.128 R8, desc[UR6][R6.64+0x200] ;                      /* 0x0001000606297981 */
        /*0520*/                   STG.E desc[UR6][R2.64], R5 ;                                /* 0x0000000602008986 */
        /*0600*/                   UTMALDG.2D [UR8], [UR4] ;                                   /* 0x00000000040075b4 */
        /*0610*/                   HGMMA.64x64x16.F32 R24, gdesc[UR8], R24 ;                   /* 0x00000000181879f0 */
        /*0620*/                   EXIT ;                                                      /* 0x000000000000794d */
        /*0630*/                   BRA 0x630;                                                  /* 0x00000000fffc7947 */
        /*0640*/                   NOP;                                                        /* 0x0000000000007918 */
        /*0650*/                   NOP;                                                        /* 0x0000000000007918 */
"""


def test_parse_sass_counts_widths_and_tma():
    # 9 instructions: the NOPs that pad the end are not counted; a predicated one (@!P0) is
    assert compile_report.parse_sass(SASS) == {"LDG": {"16": 1, "128": 2}, "STG": {"32": 1}, "HGMMA": 1, "UTMALDG": 1,
                                               "instructions": 9}


def test_parse_cuobjdump_text():
    usage = " Function k_Kt1:\n  REG:59 STACK:0 SHARED:1040 LOCAL:0 CONSTANT[0]:596 TEXTURE:0\n"
    assert compile_report.parse_res_usage(usage) == {"registers": 59, "stack": 0, "shared": 1040, "local": 0}
    elf = "\t<0x24>\n\tAttribute:\tEIATTR_REQNTID\n\tFormat:\tEIFMT_SVAL\n\tValue:\t0x80 0x1 0x1 \n\t<0x25>\n"
    assert compile_report.parse_reqntid(elf) == 128 and compile_report.parse_reqntid("") is None


def test_arch_defaults_and_checks():
    assert compilecheck.default_arch("9.0") == "sm_90" and compilecheck.default_arch("10.0") == "sm_100"
    assert compilecheck.default_arch(None) == "sm_90"
    with pytest.raises(UsageError):
        compilecheck.check_arch("hopper")


def test_skeleton_reads_parameters_constants_ndim_and_launch_args():
    text = signature_spec.skeleton((SUITE / PLAIN_RMS).read_text(), PLAIN_RMS)
    assert "rms_norm_kernel:" in text and "x: FILL[2]" in text and "weight: FILL[1]" in text
    assert "eps: float32" in text and "TILE_N: FILL" in text
    assert "ct.launch(..., rms_norm_kernel, (rows, weight.contiguous(), out, float(eps), TILE_N))" in text
    with pytest.raises(UsageError, match="still 'FILL"):  # an unfilled skeleton is refused, never guessed
        signature_spec.parse_param("x", "FILL[2]")


def test_an_array_given_by_its_shape_is_constrained_as_the_jit_constrains_a_tensor_of_it():
    pytest.importorskip("cuda.tile")
    p = signature_spec.parse_param("x", "float16(4096x1000)")
    assert (p.kind, p.dtype, p.ndim, p.shape, p.spec_text()) == ("array", "float16", 2, (4096, 1000),
                                                                 "float16(4096x1000)")
    shaped = compilecheck.contiguous_array(p.dtype, p.ndim, p.shape)
    # 4096 divisible by 16, 1000 not; the row stride (1000 fp16 = 2000 bytes) a multiple of 16 bytes
    assert tuple(shaped.shape_divisible_by) == (16, 1) and tuple(shaped.stride_divisible_by) == (8, 1)
    assert tuple(shaped.stride_constant) == (None, 1)
    odd = compilecheck.contiguous_array("float32", 2, (64, 777))  # 777 x 4 bytes: rows not 16-byte multiples
    assert tuple(odd.stride_divisible_by) == (1, 1) and tuple(odd.shape_divisible_by) == (16, 1)
    by_rank = compilecheck.contiguous_array("float16", 2)  # the rank alone: nothing of the shape
    assert tuple(by_rank.shape_divisible_by) == (1, 1) and tuple(by_rank.stride_divisible_by) == (8, 1)
    with pytest.raises(UsageError, match="empty dimension"):
        signature_spec.parse_param("x", "float16(0x8)")


def test_spec_file_errors_name_the_entry(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("k:\n  signatures: []\n")
    with pytest.raises(UsageError, match="k: needs a non-empty"):
        signature_spec.load_spec(bad)
    bad.write_text("k:\n  signatures:\n    - {x: float16}\n  hint: {}\n")
    with pytest.raises(UsageError, match="unknown keys"):
        signature_spec.load_spec(bad)


def test_an_unquoted_array_type_in_flow_style_is_one_line_that_says_how_to_write_it(tmp_path):
    # What an agent wrote (the eval rehearsal of session 19): YAML's [...] inside {...} is a list.
    bad = tmp_path / "s.yaml"
    bad.write_text("k:\n  signatures:\n    - {input: float16[2], TILE: 4}\n")
    with pytest.raises(UsageError) as caught:
        signature_spec.load_spec(bad)
    message = str(caught.value)
    assert "\n" not in message and "line 3, column" in message and 'input: "float16[2]"' in message
    bad.write_text('k:\n  signatures:\n    - {input: "float16[2]", TILE: 4}\n')
    assert signature_spec.load_spec(bad)["k"].signatures  # quoted, the same line is read


def test_write_spec_for_the_session_then_refuses_to_overwrite(tilegym_like_repo, capsys):
    repo = tilegym_like_repo
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    capsys.readouterr()
    code, data = cli(capsys, "--repo", str(repo), "--write-spec")
    assert code == 0 and data["spec"].endswith("sandbox/compile-check.yaml")
    text = (repo / "sandbox/compile-check.yaml").read_text()
    # `TILE: int` is a runtime scalar in cuTile (only ct.Constant[...] is a compile-time constant).
    assert "rms_norm_kernel:" in text and "TILE: int32" in text and "x: FILL[2]" in text
    code, data = cli(capsys, "--repo", str(repo), "--write-spec")
    assert code == 3 and "already exists" in data["error"]


def test_bad_arch_is_a_usage_error(capsys):
    code, data = cli(capsys, "--repo", str(SUITE), "--kernel", PLAIN_RMS, "--arch", "sm90")
    assert code == 2 and "--arch" in data["error"]


# --- compiling (cuda-tile + tileiras, no GPU) -------------------------------------------------------


@pytest.mark.toolchain
def test_bundled_plain_kernel_compiles_for_sm90_with_plain_loads(suite_path, capsys):
    code, data = cli(capsys, "--repo", str(SUITE), "--kernel", PLAIN_RMS, "--arch", "sm_90")
    assert code == 0, data
    (result,) = data["results"]
    assert result["ok"] and result["source"] == "aot_signatures()" and data["arch"] == "sm_90"
    assert compile_report.loads_kind(result["remarks"]).startswith("plain")  # pointer gathers: no TMA remark
    if data["cuobjdump"]:
        assert result["cubin"]["registers"] > 0 and result["cubin"]["threads"] > 0
        assert result["cubin"]["sass"]["LDG"] and not result["cubin"]["sass"].get("UTMALDG")


@pytest.mark.toolchain
def test_tma_step_compiles_with_tma_loads_from_a_spec(suite_path, capsys, tmp_path):
    spec = tmp_path / "sig.yaml"
    spec.write_text(RMS_SPEC)
    code, data = cli(capsys, "--repo", str(SUITE), "--kernel", TMA_RMS, "--spec", str(spec))
    assert code == 0, data
    (result,) = data["results"]
    assert result["ok"] and result["source"] == "sig.yaml"  # the spec wins over aot_signatures()
    assert result["signature"] == "x=float16[2], weight=float16[1], out=float16[2], eps=float32, TILE_N=512"
    assert result["remarks"]["tma_loads"] > 0
    if data["cuobjdump"]:
        assert result["cubin"]["sass"].get("UTMALDG", 0) > 0


@pytest.mark.toolchain
def test_compile_error_and_spec_mismatch_are_results_with_exit_1(suite_path, capsys, tmp_path):
    spec = tmp_path / "sig.yaml"
    spec.write_text(RMS_SPEC.replace("TILE_N: 512", "TILE_N: 3"))  # ct.arange needs a power of two
    code, data = cli(capsys, "--repo", str(SUITE), "--kernel", PLAIN_RMS, "--spec", str(spec))
    (result,) = data["results"]
    assert code == 1 and not result["ok"] and result["checked"] and result["error"]
    spec.write_text(RMS_SPEC.replace("eps: float32", "epsilon: float32"))
    code, data = cli(capsys, "--repo", str(SUITE), "--kernel", PLAIN_RMS, "--spec", str(spec))
    (result,) = data["results"]
    assert code == 1 and "missing ['eps']" in result["error"] and "unknown ['epsilon']" in result["error"]



TRAP_KERNEL = """\
import cuda.tile as ct


@ct.kernel
def unchecked_kernel(x, out, TILE: ct.Constant[int]):
    t = ct.load(x, (ct.bid(0),), (TILE,), padding_mode=ct.PaddingMode.ZERO, check_bounds=False)
    ct.store(out, (ct.bid(0),), t, check_bounds=False)
"""


def test_known_compile_traps_names_the_padded_unchecked_load_with_its_file_line():
    (trap,) = compilecheck.known_compile_traps(TRAP_KERNEL, first_line=10)
    assert trap.startswith("line 15: a load with padding_mode and check_bounds=False")
    # Either keyword alone is fine, and so is a store without bounds checks.
    assert compilecheck.known_compile_traps(TRAP_KERNEL.replace("padding_mode=ct.PaddingMode.ZERO, ", "")) == []
    assert compilecheck.known_compile_traps(TRAP_KERNEL.replace("check_bounds=False)\n    ct.store", ")\n    ct.store")) == []
    assert compilecheck.known_compile_traps("def broken(:\n") == []


@pytest.mark.toolchain
def test_a_silent_tileiras_failure_is_explained_by_the_known_trap(tmp_path, capsys):
    """tileiras 13.4 fails padding_mode=ZERO with check_bounds=False with only "failed to compile Tile
    IR program"; compile-check names the call."""
    kernel = tmp_path / "trap.py"
    kernel.write_text(TRAP_KERNEL)
    spec = tmp_path / "sig.yaml"
    spec.write_text("unchecked_kernel:\n  signatures:\n    - x: bfloat16[1]\n      out: bfloat16[1]\n      TILE: 1024\n")
    code, data = cli(capsys, "--repo", str(tmp_path), "--kernel", str(kernel), "--spec", str(spec))
    (result,) = data["results"]
    assert code == 1 and not result["ok"]
    assert "failed to compile Tile IR program" in result["error"]
    assert "likely cause: line 6: a load with padding_mode and check_bounds=False" in result["error"]

# --- --record: the tests' own launches become the spec --------------------------------------------

SIM_KERNEL = '''\
import cuda.tile as ct


@ct.kernel
def add_one_kernel(x, out, TILE: ct.Constant[int]):
    t = ct.load(x, index=(ct.bid(0), 0), shape=(1, TILE))
    ct.store(out, index=(ct.bid(0), 0), tile=t + 1)


def add_one(x, out):
    ct.launch(None, (x.shape[0],), add_one_kernel, (x, out, x.shape[1]))
'''
SIM_TEST = '''\
import pytest
import torch

from simk.ops.cutile.add_one import add_one


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_op_cutile(dtype):
    x = torch.zeros(4, 64, dtype=dtype)
    for _ in range(2):  # the same launch twice: recorded once
        with pytest.raises(RuntimeError, match="no GPU"):  # the launch itself fails after the record
            add_one(x, torch.empty_like(x))


def test_op_cutile_known_failure():  # pytest's cache provider would remember it in .pytest_cache
    assert False


def test_perf_cutile():
    pass
'''
# SIMULATION: cuTile's parameter-constraint function needs libcuda; this conftest stands in for it
# with the constraints a fresh contiguous tensor and an int constant get. On a GPU the real one runs.
SIM_CONFTEST = '''\
import cuda.tile as ct
import cuda.tile._cext as cext
from cuda.tile.compilation import ConstantConstraint

from cutile_perf.kernel.compilecheck import contiguous_array

def _constraints(kernel, args, convention):
    return [contiguous_array(str(a.dtype).removeprefix("torch."), a.dim()) if hasattr(a, "dim")
            else ConstantConstraint(a) for a in args]


def _no_gpu_launch(stream, grid, kernel, args, **kwargs):
    raise RuntimeError("no GPU")


cext.get_parameter_constraints_from_pyargs = _constraints
ct.launch = _no_gpu_launch  # the recorder wraps whatever launch it finds
'''


@pytest.fixture
def launching_repo(tmp_path):
    """A simulated repo whose correctness tests call ct.launch (see SIM_CONFTEST)."""
    pytest.importorskip("torch")
    from fixtures_repo import allow_no_gpu, git

    repo = tmp_path / "simk"
    for rel, text in {"src/simk/__init__.py": "", "src/simk/ops/__init__.py": "", "src/simk/ops/cutile/__init__.py": "",
                      "src/simk/ops/cutile/add_one.py": SIM_KERNEL, "tests/ops/test_add_one.py": SIM_TEST,
                      "tests/conftest.py": SIM_CONFTEST,
                      "pytest.ini": "[pytest]\npythonpath = src\n"}.items():  # pytest's cache on, as in TileGym
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    for key, value in (("user.email", "t@example.com"), ("user.name", "T"), ("commit.gpgsign", "false")):
        git(repo, "config", key, value)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "simulated kernel repo")
    assert main(["init", "--repo", str(repo), "--kernel", "add_one", "--timeout", "120"]) == 0
    allow_no_gpu(repo)
    return repo


@pytest.mark.toolchain
def test_record_writes_the_spec_the_tests_launches_produce_and_compile_check_uses_it(launching_repo, capsys):
    repo = launching_repo
    capsys.readouterr()
    code, data = cli(capsys, "--repo", str(repo), "--record")
    assert code == 0, data
    from fixtures_repo import git
    assert git(repo, "status", "--porcelain", "--untracked-files=all").strip() == ""
    assert not (repo / ".pytest_cache").exists(), "the tests ran in the user's work tree and left no cache there"
    spec = repo / "sandbox/compile-check.yaml"
    assert data["spec"] == str(spec) and data["kernels"] == {"add_one_kernel": 2}
    assert signature_spec.is_recorded(spec.read_text())
    loaded = signature_spec.load_spec(spec)["add_one_kernel"].signatures
    # each contiguous tensor by its shape (the test's 4x64), from which the same constraint follows
    assert [signature_spec.describe(s) for s in loaded] == ["x=float16(4x64), out=float16(4x64), TILE=64",
                                                          "x=bfloat16(4x64), out=bfloat16(4x64), TILE=64"]
    code, data = cli(capsys, "--repo", str(repo))
    assert code == 0, data
    assert {r["signature"] for r in data["results"]} == {"x=float16(4x64), out=float16(4x64), TILE=64",
                                                         "x=bfloat16(4x64), out=bfloat16(4x64), TILE=64"}


def test_record_never_overwrites_a_hand_written_spec(launching_repo, capsys):
    pytest.importorskip("cuda.tile")
    repo = launching_repo
    hand = repo / "sandbox/compile-check.yaml"
    hand.write_text("add_one_kernel:\n  signatures:\n    - x: float32[2]\n      out: float32[2]\n      TILE: 32\n")
    capsys.readouterr()
    code, data = cli(capsys, "--repo", str(repo), "--record")
    assert code == 0, data
    assert data["spec"].endswith("compile-check.recorded.yaml") and "TILE: 32" in hand.read_text()


@pytest.mark.gpu
def test_record_on_the_gpu_gives_the_bundled_rms_norm_its_real_signatures(tmp_path, capsys):
    """The real path: cuTile's own constraint function on a GPU, the bundled suite's own tests."""
    import shutil
    import subprocess

    repo = tmp_path / "suite"
    shutil.copytree(SUITE, repo, ignore=shutil.ignore_patterns("optimizations", "__pycache__", ".pytest_cache"))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.email=t@example.com", "-c", "user.name=T", "commit", "-qm", "suite"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    capsys.readouterr()
    code, data = cli(capsys, "--repo", str(repo), "--record")
    assert code == 0, data
    assert data["kernels"].get("rms_norm_kernel", 0) >= 1, data
    code, data = cli(capsys, "--repo", str(repo))
    assert code == 0 and all(r["ok"] for r in data["results"]), data


# --- a candidate kept outside the package, checked as the file it would replace ---------------------

# Imports as TileGym's kernel files have them: one absolute (`from tilegym...`: "No module named"
# when loaded by file location), one relative (`from .utils ...`: "attempted relative import").
CANDIDATE_IMPORTS = "from . import __name__ as PACKAGE\nfrom fakegym.ops import __name__ as OPS\n"


def test_a_candidate_outside_the_package_imports_as_the_file_it_replaces(tilegym_like_repo):
    from fixtures_repo import KERNEL_REL

    repo = tilegym_like_repo
    fenced = repo / KERNEL_REL
    before = fenced.read_bytes()
    cand = repo / "sandbox/cand/rms_norm_v2.py"
    cand.parent.mkdir(parents=True)
    cand.write_text(CANDIDATE_IMPORTS + fenced.read_text().replace("LATENCY_MS =", "CANDIDATE = True\nLATENCY_MS ="))
    path_before = list(sys.path)
    with pytest.raises(UsageError) as refused:  # by file location, as before: its imports cannot resolve
        compilecheck.import_kernel_module(repo, cand)
    assert "relative import" in refused.value.message and "--as" in refused.value.hint
    module = compilecheck.import_kernel_module(repo, cand, as_path=fenced)
    assert module.__name__ == "fakegym.ops.cutile.rms_norm" and module.PACKAGE == "fakegym.ops.cutile"
    assert Path(module.__file__) == cand.resolve() and module.CANDIDATE  # the candidate, not the fenced file
    assert fenced.read_bytes() == before and sys.path == path_before


def test_the_session_s_one_fenced_file_is_what_a_candidate_replaces(tilegym_like_repo, capsys):
    from cutile_perf.commands.compile_check import _replaced_file
    from cutile_perf.store import session as session_mod
    from fixtures_repo import KERNEL_REL

    repo = tilegym_like_repo
    assert main(["init", "--repo", str(repo), "--kernel", "rms_norm"]) == 0
    capsys.readouterr()
    session = session_mod.load(repo)
    cand = repo / "sandbox/cand/x.py"
    assert _replaced_file(repo, session, cand, None) == (repo / KERNEL_REL).resolve()
    assert _replaced_file(repo, session, repo / KERNEL_REL, None) is None  # the fenced file itself: in place
    assert _replaced_file(repo, None, cand, None) is None  # no session, no --as: by file location
    assert _replaced_file(repo, None, cand, Path(KERNEL_REL)) == (repo / KERNEL_REL).resolve()
    with pytest.raises(UsageError, match="--as"):
        _replaced_file(repo, None, cand, Path("no/such/folder/x.py"))


def test_per_signature_hints_merge_over_the_kernel_s(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("k:\n  hints: {occupancy: 2}\n  signatures:\n"
                    "    - x: float16[2]\n      TILE: 64\n"
                    "    - x: float16[2]\n      TILE: 128\n      hints: {occupancy: 4, num_ctas: 2}\n"
                    "    - x: float16[2]\n      hints: float32\n")  # a parameter named hints stays a parameter
    entry = signature_spec.load_spec(spec)["k"]
    assert [signature_spec.describe(s) for s in entry.signatures] == [
        "x=float16[2], TILE=64", "x=float16[2], TILE=128", "x=float16[2], hints=float32"]
    assert [entry.hints_for(i) for i in range(3)] == [{"occupancy": 2}, {"occupancy": 4, "num_ctas": 2},
                                                      {"occupancy": 2}]


def test_the_threads_cell_marks_tma_kernels_and_the_legend_says_why():
    from cutile_perf.commands import compile_check as cc

    assert cc._threads_cell({"threads": 256, "sass": {"UTMALDG": 6}}) == "256*"
    assert cc._threads_cell({"threads": 128, "sass": {"LDG": {"16": 20}}}) == "128"
    assert "4 producer warps" in cc.THREADS_LEGEND and "(threads - 128) / 32" in cc.THREADS_LEGEND


CANDIDATE_KERNEL = '''\
import cuda.tile as ct

from . import __name__ as PACKAGE  # relative, as TileGym's `from .utils import ...`
from simk.ops import __name__ as OPS  # absolute, as TileGym's `from tilegym.backend import ...`


@ct.kernel
def add_two_kernel(x, out, TILE: ct.Constant[int]):
    t = ct.load(x, index=(ct.bid(0), 0), shape=(1, TILE))
    ct.store(out, index=(ct.bid(0), 0), tile=t + 2)
'''


@pytest.mark.toolchain
def test_a_candidate_in_sandbox_compiles_as_the_fenced_file_with_hints_per_signature(launching_repo, capsys):
    repo = launching_repo
    fenced = repo / "src/simk/ops/cutile/add_one.py"
    before = fenced.read_bytes()
    (repo / "sandbox/cand").mkdir()
    (repo / "sandbox/cand/add_one_v2.py").write_text(CANDIDATE_KERNEL)
    (repo / "sandbox/cand/spec.yaml").write_text(
        "add_two_kernel:\n  signatures:\n    - x: float16[2]\n      out: float16[2]\n      TILE: 64\n"
        "    - x: float16[2]\n      out: float16[2]\n      TILE: 128\n      hints: {occupancy: 2}\n")
    capsys.readouterr()
    code, data = cli(capsys, "--repo", str(repo), "--kernel", "sandbox/cand/add_one_v2.py",
                     "--spec", "sandbox/cand/spec.yaml")
    assert code == 0, data
    assert data["checked_as"] == str(fenced.resolve())
    assert [(r["kernel"], r["hints"], r["ok"]) for r in data["results"]] == [
        ("add_two_kernel", {}, True), ("add_two_kernel", {"occupancy": 2}, True)]
    assert fenced.read_bytes() == before
    assert main(["compile-check", "--repo", str(repo), "--kernel", "sandbox/cand/add_one_v2.py",
                 "--spec", "sandbox/cand/spec.yaml"]) == 0
    text = capsys.readouterr().out
    assert "add_one_v2.py checked as src/simk/ops/cutile/add_one.py" in text and "occupancy=2" in text

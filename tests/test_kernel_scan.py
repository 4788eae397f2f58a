"""kernel_scan: locating kernels and tests, the AST report, the classification estimate."""
from __future__ import annotations

import textwrap

import pytest
from fixtures_repo import KERNEL_REL, TEST_REL, tilegym_like_repo  # noqa: F401

from cutile_perf.kernel import kernel_scan
from cutile_perf.skill import playbook
from cutile_perf.errors import UsageError

MATMUL = textwrap.dedent('''
    import cuda.tile as ct
    from types import SimpleNamespace

    @ct.kernel(num_ctas=1, occupancy=2)
    def matmul_kernel(a, b, c, TM: ct.Constant[int]):
        acc = ct.full((TM, TM), 0.0, dtype=ct.float32)
        for k in range(ct.num_tiles(a, 1, (TM, TM))):
            acc = ct.mma(ct.load(a, (0, k), (TM, TM)), ct.load(b, (k, 0), (TM, TM)), acc)
        ct.store(c, (0, 0), acc, allow_tma=False)

    def _configs():
        yield SimpleNamespace(TM=64, occupancy=2)
        yield SimpleNamespace(TM=128, occupancy=1)

    @register_impl("matmul", backend="cutile")
    def matmul(a, b):
        result = ct.tune.exhaustive_search(list(_configs()), None, None, matmul_kernel, None)
        ct.launch(None, (1, 1, 1), matmul_kernel, (a, b, a, 64))
''')

ATTENTION = textwrap.dedent('''
    import cuda.tile as ct
    @ct.kernel
    def fmha(q, k, v, o):
        s = q @ k
        p = ct.exp2(s - ct.max(s, axis=1))
        for i in range(ct.bid(0), 10, ct.num_blocks(0)):
            pass
''')


def test_matmul_report():
    scan = kernel_scan.scan_source(MATMUL, "src/x/ops/cutile/matmul.py")
    assert [k["name"] for k in scan.kernels] == ["matmul_kernel"]
    assert scan.kernels[0]["hints"] == {"num_ctas": 1, "occupancy": 2}
    assert {x["call"] for x in scan.launches} == {"exhaustive_search", "launch"}
    assert scan.registrations == [{"op": "matmul", "backend": "cutile", "function": "matmul", "line": 17}]
    assert [c["values"] for c in scan.autotune_configs] == [{"TM": 64, "occupancy": 2}, {"TM": 128, "occupancy": 1}]
    assert scan.ops["allow_tma="] == 1
    assert (scan.kernel_type, scan.bound) == ("matmul", "compute-bound")
    assert "estimate" in kernel_scan.render(scan)


def test_attention_is_detected_from_mma_and_exp_and_persistent_loop():
    scan = kernel_scan.scan_source(ATTENTION, "src/x/ops/cutile/fmha_fwd.py")
    assert scan.kernel_type == "attention" and scan.persistent
    assert scan.kernels == [{"name": "fmha", "line": 4, "hints": {}}]  # the def line


@pytest.mark.parametrize(
    ("source", "stem", "kind", "bound"),
    [
        ("def f(x):\n    return ct.load(x) + 1\n", "add", "elementwise", "memory-bound"),
        ("def f(x):\n    return ct.sum(x)\n", "k", "reduction-norm", "memory-bound"),
        ("def f(x):\n    return x\n", "layer_norm", "reduction-norm", "memory-bound"),
        ("def f(x):\n    return x\n", "gemm", "matmul", "compute-bound"),
    ],
)
def test_classification_table(source, stem, kind, bound):
    scan = kernel_scan.scan_source(source, f"{stem}.py")
    assert (scan.kernel_type, scan.bound) == (kind, bound)


@pytest.mark.parametrize(("ai", "bound"), [(0.5, "memory-bound"), (9.99, "memory-bound"), (10, "balanced"),
                                           (50, "balanced"), (50.1, "compute-bound")])
def test_bound_bands(ai, bound):
    assert kernel_scan.bound_of(ai) == bound


def test_syntax_error_is_a_usage_error():
    with pytest.raises(UsageError, match="cannot parse"):
        kernel_scan.scan_source("def (:\n", "bad.py")


def test_find_kernel_and_test_by_name_and_loose_name(tilegym_like_repo):
    repo = tilegym_like_repo
    assert kernel_scan.find_kernel_files(repo, "rms_norm") == [repo / KERNEL_REL]
    assert kernel_scan.find_kernel_files(repo, "rmsnorm") == [repo / KERNEL_REL]
    assert kernel_scan.find_kernel_files(repo, KERNEL_REL) == [(repo / KERNEL_REL).resolve()]
    assert kernel_scan.choose_test_file(repo, repo / KERNEL_REL) == (repo / TEST_REL, [])
    scan = kernel_scan.scan_file(repo / KERNEL_REL, repo)
    assert scan.path == KERNEL_REL and scan.kernel_type == "reduction-norm"


def test_unknown_and_ambiguous_kernel_names(tilegym_like_repo):
    repo = tilegym_like_repo
    with pytest.raises(UsageError, match="no kernel named"):
        kernel_scan.find_kernel_files(repo, "softmax")
    other = repo / "src/fakegym/suites/liger/cutile/rms_norm.py"
    other.parent.mkdir(parents=True)
    other.write_text("")
    with pytest.raises(UsageError, match="ambiguous"):
        kernel_scan.find_kernel_files(repo, "rms_norm")
    with pytest.raises(UsageError, match="does not exist"):
        kernel_scan.find_kernel_files(repo, "src/nope.py")


def _touch(repo, *rels):
    for rel in rels:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("")


def test_test_file_is_paired_by_folders_and_ties_are_refused(tilegym_like_repo):
    repo = tilegym_like_repo
    liger = repo / "src/fakegym/suites/liger/cutile/rms_norm.py"
    _touch(repo, "src/fakegym/suites/liger/cutile/rms_norm.py", "tests/suites/liger/test_rms_norm.py",
           "tests/test_rms_norm.py")
    # Each kernel takes the test whose folders under tests/ appear in its own path, the most specific first.
    assert kernel_scan.choose_test_file(repo, repo / KERNEL_REL) == (
        repo / TEST_REL, [repo / "tests/suites/liger/test_rms_norm.py", repo / "tests/test_rms_norm.py"])
    assert kernel_scan.choose_test_file(repo, liger)[0] == repo / "tests/suites/liger/test_rms_norm.py"
    # Two equally good candidates: refused, with every candidate and the flag in one line.
    _touch(repo, "tests/fakegym/test_rms_norm.py")  # matches one folder of the ops kernel, like tests/ops/
    with pytest.raises(UsageError) as info:
        kernel_scan.choose_test_file(repo, repo / KERNEL_REL)
    message = str(info.value)
    assert "\n" not in message and "--test" in message
    assert "tests/fakegym/test_rms_norm.py" in message and TEST_REL in message
    with pytest.raises(UsageError, match="no tests/\\*\\*/test_softmax.py"):
        kernel_scan.choose_test_file(repo, repo / "src/fakegym/ops/cutile/softmax.py")


def test_playbook_priority_and_what_remains():
    assert [i.letter for i in playbook.priority("compute-bound")][:3] == ["D", "G", "C"]
    left = playbook.remaining("memory-bound", ["M: whole row in one tile", "persistent grid over rows",
                                               "A: ct.load instead of gather"])
    assert [i.letter for i in left][:3] == ["C", "H", "F"]

"""GPU proof that `classify-triton --apply-optimizations` output is harmless where TileIR is absent.

For every kernel in tests/triton_corpus/: add the gated TileIR configs, import the optimized module
next to the original, check that the autotuner sees exactly the original configs (the gate is false
on standard triton), run it (autotuning included) against the torch reference on every VERIFY shape,
time original vs optimized with triton.testing.do_bench, and run `verify-triton` on the optimized
file (the real PTX path in a child process). Prints a table; exit 1 if anything failed.

    python benchmarks/tileir_corpus.py [--json-out results.json]
    ENABLE_TILE=1 python benchmarks/tileir_corpus.py   # standard triton must ignore it (target stays cuda)

Needs a CUDA GPU, torch and triton. Not a TileIR measurement: the TileIR backend is not installed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from cutile_perf.tileir import classify, transform, verify  # noqa: E402
from cutile_perf.tileir.verify_child import _make_input, compare  # noqa: E402

CORPUS = REPO / "tests" / "triton_corpus"


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"tileir_corpus_{path.stem}_{uuid.uuid4().hex}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _configs(module, kernel_name: str):
    kernel = getattr(module, kernel_name)
    configs = getattr(kernel, "configs", None)
    return None if configs is None else [(c.kwargs, c.num_warps, c.num_stages, c.num_ctas) for c in configs]


def run_one(path: Path, out_dir: Path) -> dict:
    import torch
    import triton

    source = path.read_text()
    result = classify.classify_source(source)
    optimized = transform.apply_optimizations(source, result)
    opt_path = out_dir / f"{path.stem}_tileir.py"
    opt_path.write_text(optimized["optimized_code"])
    row = {"kernel": path.stem, "type": result["classification"], "changes": len(optimized["changes_applied"]),
           "risks": sorted({r["pattern"] for r in result["risks"]})}
    original, candidate = _import(path), _import(opt_path)
    spec = candidate.VERIFY
    before = {k["name"]: _configs(original, k["name"]) for k in result["kernels"]}
    after = {k["name"]: _configs(candidate, k["name"]) for k in result["kernels"]}
    row["configs_unchanged"] = before == after
    row["n_configs"] = sum(len(c) for c in after.values() if c)
    entry_orig, entry_opt = getattr(original, spec["entry"]), getattr(candidate, spec["entry"])
    diffs, passed = [], True
    for shapes in spec["shapes"]:
        generator = torch.Generator().manual_seed(0)
        inputs = [_make_input(torch, shape, spec["dtypes"][name], generator, "cuda") for name, shape in shapes.items()]
        scope = dict(zip(shapes, [t.clone() for t in inputs]))
        reference = eval(spec["reference"], {"torch": torch, "F": torch.nn.functional}, scope)  # noqa: S307
        out = entry_opt(*inputs)
        torch.cuda.synchronize()
        dtype = max(spec["dtypes"].values(), key=lambda d: verify.TOLERANCES.get(d, (0, 0))[0])
        atol, rtol = verify.TOLERANCES.get(dtype, (1e-4, 1e-4))
        cmp = compare(torch, out, reference, spec.get("atol", atol), spec.get("rtol", rtol))
        passed = passed and cmp["passed"]
        diffs.append(cmp.get("max_abs_diff"))
    row["max_abs_diff"] = max((d for d in diffs if d is not None), default=None)
    row["correct"] = passed
    row["ms_original"] = triton.testing.do_bench(lambda: entry_orig(*inputs))
    row["ms_optimized"] = triton.testing.do_bench(lambda: entry_opt(*inputs))
    report = verify.verify(opt_path, spec["reference"], json.dumps(spec["shapes"]), json.dumps(spec["dtypes"]),
                           entry=spec["entry"], device="gpu", atol=spec.get("atol"), rtol=spec.get("rtol"))
    row["verify_triton"] = report["ptx"]["status"]
    row["verify_target"] = report["ptx"].get("target_backend")
    row["tileir_pass"] = report["tileir"]["status"]
    row["ok"] = row["configs_unchanged"] and row["correct"] and row["verify_triton"] == "passed"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json-out", type=Path, help="also write the rows as JSON there")
    args = parser.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        print("tileir_corpus: no CUDA GPU visible to torch; nothing measured", file=sys.stderr)
        return 3
    from triton.runtime import driver

    target = driver.active.get_current_target()
    print(f"GPU {torch.cuda.get_device_name(0)}, triton {triton.__version__}, active target {target.backend} "
          f"(arch {target.arch})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(CORPUS.glob("*.py")):
            try:
                rows.append(run_one(path, Path(tmp)))
            except Exception as exc:  # a crash is a failed row, and the rest still run
                rows.append({"kernel": path.stem, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
    header = ("kernel", "type", "configs_unchanged", "n_configs", "correct", "max_abs_diff", "ms_original",
              "ms_optimized", "verify_triton", "tileir_pass", "ok")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        cells = []
        for key in header:
            value = row.get(key, row.get("error", "") if key == "type" else "")
            cells.append(f"{value:.4g}" if isinstance(value, float) else str(value))
        print("| " + " | ".join(cells) + " |")
    if args.json_out:
        args.json_out.write_text(json.dumps({"target": target.backend, "rows": rows}, indent=2, default=str))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""``cutile-perf classify-triton``: classify Triton kernels for TileIR, optionally add gated TileIR
configs and render the optimization report."""
from __future__ import annotations

import json
from pathlib import Path

from cutile_perf.output import Outcome, say
from cutile_perf.errors import UsageError
from cutile_perf.tileir import check, classify, report, transform


def _read_source(file: Path | None, code: str | None) -> tuple[str, str]:
    if file is not None:
        if not file.is_file():
            raise UsageError(f"--file {file}: no such file")
        return file.read_text(encoding="utf-8"), str(file)
    return code or "", "<--code>"


def _read_verification(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"--verification {path}: cannot read a verify-triton JSON result ({exc})") from None
    if not isinstance(data, dict) or "ptx" not in data or "tileir" not in data:
        raise UsageError(f"--verification {path}: not the output of `cutile-perf verify-triton --json`")
    return data


def classify_triton(*, file: Path | None, code: str | None, apply: bool, output: Path | None,
                    report_path: Path | None, verification: Path | None) -> Outcome:
    source, label = _read_source(file, code)
    if output is not None and not apply:
        raise UsageError("--output needs --apply-optimizations (it writes the optimized code)")
    if output is not None and file is not None and output.resolve() == file.resolve():
        # Never overwrite the user's kernel: the original is the baseline to compare against.
        raise UsageError("--output is the input file; write the optimized kernel next to it",
                         f"e.g. --output {file.with_name(file.stem + '_tileir.py')}")
    verification_data = _read_verification(verification)
    result = classify.classify_source(source)
    transformation = None
    if apply:
        transformation = transform.apply_optimizations(source, result)
        result.update(transformation)
        if output is not None:
            output.write_text(transformation["optimized_code"], encoding="utf-8")
            result["output_file"] = str(output)
            say(f"optimized kernel written to {output}")
    if report_path is not None:
        text = report.render(kernel_file=label, classification=result, transformation=transformation,
                             verification=verification_data, tileir=check.check(),
                             output_file=str(output) if output else None)
        report_path.write_text(text, encoding="utf-8")
        result["report_file"] = str(report_path)
        say(f"report written to {report_path}")
    return Outcome(text=json.dumps(result, indent=2), data=result)

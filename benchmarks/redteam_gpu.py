"""GPU red team: hostile versions of the bundled softmax through `cutile-perf try`, one table of outcomes.

    PYTHONPATH=scripts python benchmarks/redteam_gpu.py [--out result.json]
    PYTHONPATH=scripts python benchmarks/redteam_gpu.py --dry-run   # CPU: compile + set-up only

What it does: copies examples/kernels into a temporary git repository, runs
`cutile-perf init --kernel softmax`, turns the suite's defence run on for the correctness stage
(`--defence` in session.yaml's correctness command, and CUTILE_PERF_DEFENCE=1, before the baseline,
so the frozen session includes it), runs `cutile-perf baseline --repeats 3`, and then, for each file in
benchmarks/redteam/attacks/, copies the baselined repository, copies the attack over the kernel
file, runs `cutile-perf try` and reads the last row of sandbox/experiments.jsonl. Each attack gets
its own copy of the same baseline, so one attack that is kept cannot change the next one's
reference. Prints the attack x outcome table in Markdown; an attack that was kept is printed as
NOT CAUGHT with the reason it could not be caught.

`--dry-run` (no GPU needed) compiles every attack file for sm_90 through its aot_signatures() hook
and runs the set-up (copy, git, init, session edit), then prints the commands it would run.
"""
from __future__ import annotations

import argparse
import io
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "examples" / "kernels"
ATTACKS = Path(__file__).resolve().parent / "redteam" / "attacks"
OP = "softmax"
KERNEL_REL = f"src/tilesuite/ops/cutile/{OP}.py"

# The defence meant to stop each attack (the attack files' docstrings say how).
DEFENCES = {
    "a_side_stream": "bench: device-synchronized host interval vs events (HiddenDeviceWork)",
    "b_cache_by_pointer": "defence run: in-place mutation / reused addresses, no aliasing",
    "c_zeros_within_tolerance": "defence run: float64 reference, ulp by ulp",
    "d_lower_precision": "defence run: float64 reference, ulp by ulp",
    "e_benchmark_shapes_only": "defence run: correctness at the perf shapes",
}


def attack_files(selected: list[str] | None = None) -> list[Path]:
    files = sorted(ATTACKS.glob("*.py"))
    return [f for f in files if not selected or f.stem in selected]


def compile_attack(path: Path, arch: str = "sm_90") -> int:
    """Compile every kernel of an attack file for ``arch`` (no GPU needed); returns the cubin count."""
    from cuda.tile.compilation import export_kernel

    src = str(SUITE / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    spec = importlib.util.spec_from_file_location(f"_redteam_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    count = 0
    for kernel, signatures in module.aot_signatures():
        cubin = io.BytesIO()
        export_kernel(kernel, signatures, cubin, gpu_code=arch, output_format="cubin")
        if cubin.getvalue()[:4] != b"\x7fELF":
            raise RuntimeError(f"{path.name}: {arch} output is not an ELF cubin")
        count += 1
    return count


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Never the checkout's examples/kernels/src: the pristine suite first on the path is itself an
    # attack (the candidate would never run); the suite's conftest puts the tested copy's src/ first.
    suite_src = str(SUITE / "src")
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(suite_src)]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), *inherited])
    env["CUTILE_PERF_DEFENCE"] = "1"
    return env


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def cutile_perf(repo: Path, *args: str, timeout: float = 600) -> tuple[int, dict, str]:
    """Run the CLI as a child process; (exit code, its JSON line, stderr tail)."""
    proc = subprocess.run([sys.executable, "-m", "cutile_perf", args[0], "--repo", str(repo), "--json", *args[1:]],
                          cwd=repo, env=_env(), capture_output=True, text=True, timeout=timeout)
    data = {}
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            data = json.loads(line)
            break
        except ValueError:
            continue
    return proc.returncode, data, proc.stderr[-2000:]


def make_repo(parent: Path) -> Path:
    """The bundled suite as a fresh git repository (one commit on main)."""
    repo = parent / "tilesuite"
    shutil.copytree(SUITE, repo, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "sandbox", ".pytest_cache",
                                                                "optimizations"))
    (repo / ".gitignore").write_text("__pycache__/\n*.pyc\n.pytest_cache/\n")
    git(parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "config", "user.email", "redteam@localhost")
    git(repo, "config", "user.name", "redteam")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bundled kernel suite")
    return repo


def start_session(repo: Path) -> None:
    """init, then the defence run in the correctness command (before the baseline freezes the session)."""
    code, data, err = cutile_perf(repo, "init", "--kernel", OP)
    if code != 0:
        raise SystemExit(f"init failed (exit {code}): {data or err}")
    import yaml

    path = repo / "sandbox" / "session.yaml"
    session = yaml.safe_load(path.read_text())
    if "--defence" not in session["correctness_cmd"]:
        session["correctness_cmd"] += " --defence"
    path.write_text(yaml.safe_dump(session, sort_keys=False))


def last_row(repo: Path) -> dict:
    lines = (repo / "sandbox" / "experiments.jsonl").read_text().splitlines()
    return json.loads(lines[-1]) if lines else {}


def run_attack(base_repo: Path, attack: Path, workdir: Path, timeout: float) -> dict:
    repo = workdir / attack.stem / "tilesuite"
    shutil.copytree(base_repo, repo, symlinks=True)
    if cutile_perf(repo, "status")[0] != 0:  # a copied session must still read as one
        repo = base_repo
    shutil.copyfile(attack, repo / KERNEL_REL)
    code, data, err = cutile_perf(repo, "try", f"red team: {attack.stem}", timeout=timeout)
    row = last_row(repo)
    if row.get("optimization") != f"red team: {attack.stem}":  # refused: no row was written
        row = {"status": f"refused (exit {code})", "reason": data.get("error", "")}
    reason = row.get("reason") or data.get("error") or (err.strip().splitlines() or [""])[-1]
    return {"attack": attack.stem, "exit": code, "kept": row.get("status") == "keep", "status": row.get("status"),
            "crash_class": row.get("crash_class"), "review": row.get("review", False), "reason": str(reason),
            "defence": DEFENCES.get(attack.stem, "")}


def markdown(results: list[dict]) -> str:
    lines = ["| attack | kept? | status | crash_class | reason | meant to be stopped by |",
             "|---|---|---|---|---|---|"]
    for r in results:
        reason = " ".join(str(r["reason"]).split()).replace("|", "\\|")[:160]
        kept = "**KEPT: NOT CAUGHT**" if r["kept"] else "no"
        lines.append(f"| {r['attack']} | {kept} | {r['status']} | {r['crash_class'] or ''} | {reason} | {r['defence']} |")
    for r in results:
        if r["kept"]:
            lines.append(f"\nNOT CAUGHT: {r['attack']} was kept ({r['reason']}). The defence meant for it "
                         f"({r['defence']}) did not fire on this run; see the attack file's docstring.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: compile the attacks for sm_90, set up, print")
    parser.add_argument("--attacks", nargs="*", help="attack file stems to run (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds per cutile-perf command")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--keep-dir", type=Path, help="work here instead of a temporary directory (kept)")
    args = parser.parse_args(argv)

    files = attack_files(args.attacks)
    if not files:
        raise SystemExit(f"no attack files matched in {ATTACKS}")
    for path in files:
        print(f"compiled {path.name} for sm_90: {compile_attack(path)} kernel(s)", file=sys.stderr)

    workdir = args.keep_dir or Path(tempfile.mkdtemp(prefix="redteam-"))
    workdir.mkdir(parents=True, exist_ok=True)
    base = make_repo(workdir / "base")
    start_session(base)
    if args.dry_run:
        print(f"set up {base} (session with --defence); would run:")
        print(f"  cutile-perf baseline --repeats {args.repeats}")
        for path in files:
            print(f"  cp {path.relative_to(ROOT)} {KERNEL_REL} && cutile-perf try 'red team: {path.stem}'")
        if not args.keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0

    code, data, err = cutile_perf(base, "baseline", "--repeats", str(args.repeats), timeout=args.timeout)
    if code != 0:
        raise SystemExit(f"baseline failed (exit {code}): {data or err}")
    print(f"baseline: {json.dumps(data)}", file=sys.stderr)
    results = []
    for path in files:
        result = run_attack(base, path, workdir, args.timeout)
        print(json.dumps(result), file=sys.stderr)
        results.append(result)
    print(markdown(results))
    if args.out:
        args.out.write_text(json.dumps({"baseline": data, "results": results}, indent=2))
    return 1 if any(r["kept"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU red team: hostile versions of the bundled softmax through `cutile-perf try`, one table of outcomes.

    PYTHONPATH=scripts python benchmarks/redteam_gpu.py [--only f,g,h,i] [--out result.json]
    PYTHONPATH=scripts python benchmarks/redteam_gpu.py --dry-run   # CPU: compile + set-up only
    PYTHONPATH=scripts python benchmarks/redteam_gpu.py --old-session l   # an old session's lie, then verify

``--old-session ATTACK`` (issue 39 item 5, on the bundled tests): after the attacks (none unless
``--only``/``--attacks`` name some), a copy of the baselined repository tries ATTACK with checked
timed calls off (``CUTILE_PERF_UNCHECKED=1``), as a session from before them would have, and then
runs ``cutile-perf verify`` with them on; verify must refuse the kept row (exit 1). (l), the result
cache only the floor refuses, is the case for it: bench's own ``OutputCheck`` stays on without the
check and stops (j) and (m) by itself.

What it does: copies examples/kernels into a temporary git repository, runs
`cutile-perf init --kernel softmax`, turns the suite's defence run on for the correctness stage
(`--defence` in session.yaml's correctness command, and CUTILE_PERF_DEFENCE=1, before the baseline,
so the frozen session includes it), runs `cutile-perf baseline --repeats 3`, and then, for each file in
benchmarks/redteam/attacks/, copies the baselined repository, copies the attack over the kernel
file, runs `cutile-perf try` and reads the row it wrote in sandbox/experiments.jsonl. Each attack gets
its own copy of the same baseline, so one attack that is kept cannot change the next one's
reference.

Outcomes (the table's "outcome" column): "refused: <first line>" (`try` exited 3 before running
anything, no row), "crash <class>", "revert", "keep (no-change)" and "keep (<tier>)" for a faster
keep. "caught?" says NOT CAUGHT for a faster keep, for any keep of (a)-(g) and (j)-(m) (hostile
code, wrong results or faked timing, would stay in the branch; h and i keep the baseline's kernel), and for an
attack whose write outside the checkout landed (h: a `.pth` in site-packages; i: the session branch
or HEAD moved), and "no verdict" for a run that says nothing about the attack (refused for another
reason than the probe scan, the CLI failed). Exit status: 1 when anything was NOT CAUGHT, else 2
when an attack had no verdict or was skipped for the time budget (`--budget`, default 540 s for
the whole run: the GPU machine stops a command at 600 s), else 0. The attacks print what they did
to stderr at exit, lines starting "ATTACK"; they are collected from the try's pytest outputs
(sandbox/runs/*.log of the copy) and printed per attack. A `.pth` planted by (h) is reported and
then removed by this script (never by the attack), so it cannot time the later attacks' runs short.

The attack modules are compiled (and so imported) in a child process with CUDA_VISIBLE_DEVICES
empty: the attacks that write outside the checkout (h, i) act only where CUDA is available, so
neither the dry run nor the GPU run's compile step lets them act outside `try`.

`--dry-run` (no GPU needed) compiles every attack file for sm_90 through its aot_signatures() hook
and runs the set-up (copy, git, init, session edit), then prints the commands it would run.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
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
    "f_perf_only_launch_shrink": "static probe scan (kernel/probes.py, env rule): try refused, exit 3",
    "g_timer_patch_hidden": "pytest plugin's timer identity check (crash tampered)",
    "h_pth_planter": "sandbox: site-packages read-only, the .pth write fails (no faster keep)",
    "i_branch_swap": "sandbox hides the repository; unboxed: the branch/HEAD check (crash tampered)",
    "j_shrink_when_called_often": "checked perf stage: bench.OutputCheck on the first/last timed call (WrongWhenTimed)",
    "k_undo_before_the_check": "bench's device-time witness vs the record's median (crash tampered)",
    "l_result_cache": "checked timed calls: the physics floor (implausible)",
    "m_shrink_when_called_fast": "bench.OutputCheck on the last timed call (WrongWhenTimed), else the base kernel's replay",
}
# Attacks whose kernel computes exactly what the baseline does: a no-change keep of these is harmless.
HONEST_KERNEL = {"h_pth_planter", "i_branch_swap"}
PTH_NAME = "zz_cuda_timing_compat.pth"  # what h_pth_planter writes
EXTRA_FILE = "tests/extra_conftest.py"  # what i_branch_swap commits
MARK = "ATTACK"


def attack_files(selected: list[str] | None = None) -> list[Path]:
    """The attack files; ``selected``: stems, or letters (``f``), possibly comma-separated."""
    files = sorted(ATTACKS.glob("*.py"))
    if not selected:
        return files
    wanted = {w.strip() for item in selected for w in item.split(",") if w.strip()}
    return [f for f in files if f.stem in wanted or f.stem.split("_")[0] in wanted]


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


def compile_isolated(files: list[Path], arch: str = "sm_90", timeout: float = 600) -> list[str]:
    """compile_attack for each file in a child process that sees no GPU (CUDA_VISIBLE_DEVICES empty),
    so an attack's import-time action (h, i: only where CUDA is available) never runs here."""
    code = ("import pathlib, runpy, sys\n"
            "compile_attack = runpy.run_path(sys.argv[1])['compile_attack']\n"
            "for p in map(pathlib.Path, sys.argv[3:]):\n"
            "    n = compile_attack(p, sys.argv[2])\n"
            "    print(f'compiled {p.name} for {sys.argv[2]}: {n} kernel(s)', flush=True)\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code, __file__, arch, *map(str, files)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"compiling the attacks failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()


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


def cutile_perf(repo: Path, *args: str, timeout: float = 600, log: Path | None = None) -> tuple[int, dict, str]:
    """Run the CLI as a child process; (exit code, its JSON line, stderr tail). With ``log``, each
    stderr line is appended there as it comes, after the seconds since the start, so a GPU call cut
    off by its time limit still leaves where the time went."""
    cmd = [sys.executable, "-m", "cutile_perf", args[0], "--repo", str(repo), "--json", *args[1:]]
    if log is None:
        proc = subprocess.run(cmd, cwd=repo, env=_env(), capture_output=True, text=True, timeout=timeout)
        return proc.returncode, last_json_line(proc.stdout), proc.stderr[-2000:]
    with tempfile.TemporaryFile("w+") as out, open(log, "a") as sink:
        sink.write(f"$ cutile-perf {' '.join(args)}\n")
        child = subprocess.Popen(cmd, cwd=repo, env=_env(), stdout=out, stderr=subprocess.PIPE, text=True)
        killed = threading.Event()  # the kill, not the clock, says it timed out: the timer may fire before ``began``
        killer = threading.Timer(timeout, lambda: (killed.set(), child.kill()))
        killer.start()
        began, tail = time.monotonic(), collections.deque(maxlen=40)
        try:
            for line in child.stderr:
                sink.write(f"{time.monotonic() - began:7.1f} {line}")
                sink.flush()
                tail.append(line)
            child.wait()
        finally:
            killer.cancel()
        if killed.is_set():
            raise subprocess.TimeoutExpired(cmd, timeout)
        out.seek(0)
        return child.returncode, last_json_line(out.read()), "".join(tail)[-2000:]


def last_json_line(stdout: str) -> dict:
    """The last line of ``stdout`` that is JSON (the CLI's ``--json`` answer), or {}."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {}


def committed_copy(source: Path, repo: Path, message: str, *skipped: str) -> Path:
    """``source`` copied to ``repo`` (without caches, git data, a session or ``skipped``) as a fresh
    git repository with one commit on main."""
    shutil.copytree(source, repo, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git", "sandbox",
                                                                ".pytest_cache", *skipped))
    (repo / ".gitignore").write_text("__pycache__/\n*.pyc\n.pytest_cache/\n")
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "config", "user.email", "redteam@localhost")
    git(repo, "config", "user.name", "redteam")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return repo


def make_repo(parent: Path) -> Path:
    """The bundled suite as a fresh git repository (one commit on main)."""
    return committed_copy(SUITE, parent / "tilesuite", "bundled kernel suite", "optimizations")


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


def log_lines(repo: Path) -> list[str]:
    path = repo / "sandbox" / "experiments.jsonl"
    return path.read_text().splitlines() if path.is_file() else []


def last_row(repo: Path) -> dict:
    lines = log_lines(repo)
    return json.loads(lines[-1]) if lines else {}


def site_folders() -> list[Path]:
    """The site-packages folders of this interpreter (the children's): where h_pth_planter writes."""
    import site
    import sysconfig

    folders: list[Path] = []
    for get in (site.getsitepackages, lambda: [sysconfig.get_paths()["purelib"]]):
        try:
            folders += [Path(f) for f in get()]
        except Exception:  # noqa: BLE001 - a venv without one of them
            pass
    return list(dict.fromkeys(folders))


def planted_files() -> list[Path]:
    """Start-up files an attack planted in site-packages (h_pth_planter's name, or our marker)."""
    found = []
    for folder in site_folders():
        for path in sorted(folder.glob("*.pth")) if folder.is_dir() else []:
            try:
                if path.name == PTH_NAME or f"{MARK} " in path.read_text(errors="replace"):
                    found.append(path)
            except OSError:
                continue
    return found


def remove_planted(paths: list[Path]) -> list[str]:
    notes = []
    for path in paths:
        try:
            path.unlink()
            notes.append(f"removed {path} (planted by an attack; the red team removes it, not the attack)")
        except OSError as exc:
            notes.append(f"could NOT remove {path}: {exc}: later runs on this interpreter are timed by it")
    return notes


def attack_lines(repo: Path, *texts: str, limit: int = 40) -> list[str]:
    """The "ATTACK ..." lines the attack printed: the try's pytest outputs under sandbox/runs/, then
    ``texts`` (the CLI's own stderr); each distinct line once, prefixed by the file it came from."""
    seen: dict[str, str] = {}
    runs = repo / "sandbox" / "runs"
    sources = [(p.name, p.read_text(errors="replace")) for p in sorted(runs.glob("*.log"))] if runs.is_dir() else []
    sources += [("cutile-perf stderr", t) for t in texts]
    for name, text in sources:
        for line in text.splitlines():
            if line.startswith(MARK + " "):
                key = line.split(": ", 1)[-1]  # the same note from several children: once
                seen.setdefault(key, f"[{name}] {line}")
    lines = list(seen.values())
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


def git_evidence(repo: Path, branch: str | None) -> list[str]:
    """What the repository shows after the try: HEAD, and any commit ever adding i_branch_swap's file."""
    notes = []
    try:
        head = git(repo, "symbolic-ref", "-q", "HEAD").strip()
    except subprocess.CalledProcessError:
        head = "detached"
    if branch and head != f"refs/heads/{branch}":
        notes.append(f"HEAD is {head}, not the session branch {branch}")
    try:
        planted = git(repo, "log", "--all", "--reflog", "--format=%h", "--", EXTRA_FILE).split()
    except subprocess.CalledProcessError:
        planted = []
    if planted:
        on_branch = branch and EXTRA_FILE in git(repo, "ls-tree", "-r", "--name-only", f"refs/heads/{branch}")
        notes.append(f"commit(s) adding {EXTRA_FILE} in the repository (reflog included): {', '.join(planted)}; "
                     f"{'ON the session branch now' if on_branch else 'not on the session branch now'}")
    return notes


def outcome_of(code: int, row: dict | None, error: str) -> str:
    """refused / crash <class> / revert / keep (no-change) / keep (<tier>) / error (exit N)."""
    if row is None:
        first = (error.strip().splitlines() or [""])[0]
        return f"refused: {first}" if code == 3 else f"error (exit {code}): {first}"
    status = row.get("status")
    if status == "crash":
        return f"crash {row.get('crash_class') or '?'}"
    if status == "keep":
        return f"keep ({(row.get('decision') or {}).get('tier') or '?'})"
    return str(status)


REFUSED_BY_SCAN = "refused: perf-only behaviour suspected"


def caught(attack: str, outcome: str, landed: list[str]) -> bool | None:
    """False (NOT CAUGHT): a faster keep, any keep of a kernel that is not the baseline's, or a write
    outside the checkout that is still there after the try. None: the run says nothing about the
    attack (refused for another reason than the probe scan, or the CLI failed)."""
    if landed:
        return False
    if outcome.startswith("keep"):
        return attack in HONEST_KERNEL and outcome == "keep (no-change)"
    if outcome.startswith("refused") or outcome.startswith("error"):
        return True if outcome.startswith(REFUSED_BY_SCAN) else None
    return True


def run_attack(base_repo: Path, attack: Path, workdir: Path, timeout: float) -> dict:
    repo = workdir / attack.stem / "tilesuite"
    shutil.copytree(base_repo, repo, symlinks=True)
    if cutile_perf(repo, "status")[0] != 0:  # a copied session must still read as one
        repo = base_repo
    shutil.copyfile(attack, repo / KERNEL_REL)
    rows_before = len(log_lines(repo))
    started = time.monotonic()
    try:
        code, data, err = cutile_perf(repo, "try", f"red team: {attack.stem}", timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        code, data = -9, {"error": f"cutile-perf try did not finish in {timeout:g} s (killed)"}
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    seconds = time.monotonic() - started
    rows = log_lines(repo)
    row = json.loads(rows[-1]) if len(rows) > rows_before else None
    if row is not None and row.get("optimization") != f"red team: {attack.stem}":
        row = None
    error = str(data.get("error") or (err.strip().splitlines() or [""])[-1])
    outcome = outcome_of(code, row, error)
    reason = (row or {}).get("reason") or error
    branch = None
    try:
        import yaml

        branch = yaml.safe_load((repo / "sandbox" / "session.yaml").read_text()).get("branch")
    except Exception:  # noqa: BLE001
        pass
    planted = planted_files()
    landed = [f"LANDED: {p} exists after the try" for p in planted]
    landed += [n for n in git_evidence(repo, branch) if "ON the session branch" in n or n.startswith("HEAD is")]
    notes = [*git_evidence(repo, branch), *remove_planted(planted)]
    return {"attack": attack.stem, "exit": code, "outcome": outcome, "caught": caught(attack.stem, outcome, landed),
            "kept": (row or {}).get("status") == "keep", "status": (row or {}).get("status"),
            "crash_class": (row or {}).get("crash_class"), "review": (row or {}).get("review", False),
            "sandbox": (row or {}).get("sandbox"), "reason": str(reason), "seconds": round(seconds, 1),
            "defence": DEFENCES.get(attack.stem, ""), "landed": landed, "notes": notes,
            "attack_lines": attack_lines(repo, err), "repo": str(repo)}


@contextlib.contextmanager
def checks_off():
    """Checked timed calls off inside (``CUTILE_PERF_UNCHECKED=1``), as a session before them ran:
    how an old session's lie gets into the log for ``verify`` to find."""
    os.environ["CUTILE_PERF_UNCHECKED"] = "1"
    try:
        yield
    finally:
        os.environ.pop("CUTILE_PERF_UNCHECKED", None)


def old_session(base_repo: Path, attack: Path, workdir: Path, timeout: float, kept=lambda row: None) -> dict:
    """Issue 39 item 5 on the bundled tests: ``attack`` tried with checked timed calls off
    (an old session's lie in the log), then ``verify`` with them on. ``as_promised``: verify refused
    the kept row (exit 1); None when the attack was not kept unchecked, which says nothing about
    verify. ``kept(row)`` hears the unchecked try's outcome before ``verify`` starts, so a run cut
    during ``verify`` still says whether the lie was in the log."""
    with checks_off():
        tried = run_attack(base_repo, attack, workdir / "old-session", timeout)
    row = {"attack": attack.stem, "unchecked": tried["outcome"], "unchecked_reason": tried["reason"],
           "try_seconds": tried["seconds"]}
    if not tried["kept"]:
        return {**row, "as_promised": None, "verify": "not run: nothing was kept"}
    kept({**row, "as_promised": False, "verify": "running"})
    began = time.monotonic()
    try:
        code, data, err = cutile_perf(Path(tried["repo"]), "verify", timeout=timeout)
    except subprocess.TimeoutExpired:
        code, data, err = -9, {}, f"verify did not finish in {timeout:g} s (killed)"
    return {**row, "as_promised": code == 1, "verify_exit": code, "verify": data or err[-600:],
            "verify_seconds": round(time.monotonic() - began, 1)}


def _cell(text: object, limit: int = 160) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")[:limit]


def markdown(results: list[dict]) -> str:
    lines = ["| attack | outcome | caught? | reason | sandbox | try s | meant to be stopped by |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        verdict = {True: "yes", False: "**NOT CAUGHT**"}.get(r["caught"], "no verdict (not run)")
        lines.append(f"| {r['attack']} | {_cell(r['outcome'], 90)} | {verdict} | {_cell(r['reason'])} | "
                     f"{_cell(r.get('sandbox') or '')} | {r.get('seconds', '')} | {r['defence']} |")
    for r in results:
        if r["caught"] is False:
            why = "; ".join(r.get("landed") or []) or f"{r['outcome']}: {r['reason']}"
            lines.append(f"\nNOT CAUGHT: {r['attack']} ({why}). The defence meant for it "
                         f"({r['defence']}) did not hold on this run; see the attack file's docstring.")
    for r in results:
        extra = [*r.get("notes", []), *r.get("attack_lines", [])]
        if extra:
            lines.append(f"\n{r['attack']}, what the attack wrote to stderr and what the repository shows:")
            lines += [f"    {line}" for line in extra]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: compile the attacks for sm_90, set up, print")
    parser.add_argument("--attacks", nargs="*", help="attack file stems or letters to run (default: all)")
    parser.add_argument("--only", help="comma-separated attack letters or stems, e.g. f,g,h,i (with --attacks: both)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds per cutile-perf command")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for the whole run: an attack that would start later is reported as skipped "
                             "(0: no limit; default 540, under the GPU machine's 600 s per command)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here (after every attack)")
    parser.add_argument("--keep-dir", type=Path, help="work here instead of a temporary directory (kept)")
    parser.add_argument("--old-session", metavar="ATTACK",
                        help="after the attacks: this attack (letter or stem) kept with checked timed calls off, "
                             "then `verify` with them on (issue 39 item 5)")
    args = parser.parse_args(argv)
    started = time.monotonic()

    selected = [*(args.attacks or []), *([args.only] if args.only else [])]
    files = attack_files(selected or None) if selected or not args.old_session else []
    old = attack_files([args.old_session]) if args.old_session else []
    if not files and not old or args.old_session and len(old) != 1:
        raise SystemExit(f"no attack files matched in {ATTACKS}")
    for line in compile_isolated(sorted(set(files + old))):
        print(line, file=sys.stderr)
    stale = planted_files()
    if stale:  # an earlier run killed before its clean-up: it would time the baseline short
        for note in remove_planted(stale):
            print(f"before the baseline: {note}", file=sys.stderr)

    workdir = args.keep_dir or Path(tempfile.mkdtemp(prefix="redteam-"))
    workdir.mkdir(parents=True, exist_ok=True)
    base = make_repo(workdir / "base")
    start_session(base)
    if args.dry_run:
        print(f"set up {base} (session with --defence); would run:")
        print(f"  cutile-perf baseline --repeats {args.repeats}")
        for path in files:
            print(f"  cp {path.relative_to(ROOT)} {KERNEL_REL} && cutile-perf try 'red team: {path.stem}'")
        for path in old:
            print(f"  cp {path.relative_to(ROOT)} {KERNEL_REL} && CUTILE_PERF_UNCHECKED=1 cutile-perf try "
                  f"'red team: {path.stem}' && cutile-perf verify")
        print(f"site-packages checked for planted .pth files: {', '.join(map(str, site_folders()))}")
        if not args.keep_dir:
            shutil.rmtree(workdir, ignore_errors=True)
        return 0

    code, data, err = cutile_perf(base, "baseline", "--repeats", str(args.repeats), timeout=args.timeout)
    if code != 0:
        raise SystemExit(f"baseline failed (exit {code}): {data or err}")
    print(f"baseline ({time.monotonic() - started:.0f} s in): {json.dumps(data)}", file=sys.stderr)
    results: list[dict] = []
    skipped: list[str] = []
    summary = {"baseline": data, "results": results, "skipped": skipped}  # what --out holds, as it grows

    def save() -> None:  # after every step, so a run cut by its time limit keeps what it finished
        if args.out:
            args.out.write_text(json.dumps(summary, indent=2))

    def save_old(row: dict) -> None:
        summary["old_session"] = row
        save()

    for path in files:
        spent = time.monotonic() - started
        longest = max([r["seconds"] for r in results] or [0.0])
        if args.budget and spent + longest > args.budget:
            skipped.append(path.stem)
            continue
        result = run_attack(base, path, workdir, args.timeout)
        print(json.dumps(result), file=sys.stderr)
        results.append(result)
        save()
    for path in old:
        save_old(old_session(base, path, workdir, args.timeout, kept=save_old))
        print(f"old session: {json.dumps(summary['old_session'])}", file=sys.stderr)
    print(markdown(results))
    if old:
        o = summary["old_session"]
        print(f"\nold session: {o['attack']} {o['unchecked']} with checked timed calls off; verify: "
              f"{'refused it (exit 1)' if o['as_promised'] else o.get('verify_exit', o['verify'])}")
    if skipped:
        print(f"\nskipped (time budget of {args.budget:g} s): {', '.join(skipped)}; run them with --only")
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    save()
    if any(r["caught"] is False for r in results) or summary.get("old_session", {}).get("as_promised") is False:
        return 1
    return 2 if skipped or any(r["caught"] is None for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

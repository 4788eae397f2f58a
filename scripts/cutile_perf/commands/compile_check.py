"""``cutile-perf compile-check``: compile the fenced kernels for a target arch on a machine without a GPU."""
from __future__ import annotations

from pathlib import Path

from cutile_perf.store import atomic
from cutile_perf.kernel import compile_report, compilecheck, kernel_scan, signature_spec
from cutile_perf.store import session as session_mod
from cutile_perf.output import Outcome, say
from cutile_perf.errors import EXIT_OK, EXIT_REJECTED, NoSession, Refused, UsageError
from cutile_perf.store import git_ops
from cutile_perf.store.history import History
from cutile_perf.child import envcheck, records, runner
from cutile_perf.kernel import launch_record
from cutile_perf.loop import guards

SPEC_FILE = "compile-check.yaml"


def _session_arch(session: session_mod.Session) -> str | None:
    """The compute capability the session measured on (the newest log row that names one). The log
    is opened as every command opens it: one that ``try`` would refuse is refused here too (exit 3),
    rather than choosing the arch from rows nobody can vouch for."""
    history = History.open(session, git_ops.open_repo(session.repo))
    for entry in reversed(history.rows):
        cc = (entry.get("env") or {}).get("compute_capability")
        if cc:
            return cc
    return None


def record(session: session_mod.Session, spec_path: Path) -> Outcome:
    """Run the correctness selection once on this (GPU) machine, recording every distinct launch."""

    guards.require_gpu(session, envcheck.Probe())
    runs = session.sandbox / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    launches = runs / "record-launches.jsonl"
    launches.unlink(missing_ok=True)
    argv = [*session.argv("correctness"), *records.PYTEST_PLUGIN_ARGS, *records.NO_CACHE_ARGS]
    say("running the correctness tests once to record their launches")
    result = runner.run(argv, cwd=session.repo, timeout_s=session.timeout_s,
                        output_path=runs / "record-launches.log",
                        env_overrides={"CUTILE_PERF_RECORD_LAUNCHES": str(launches), "PYTHONDONTWRITEBYTECODE": "1"})
    found = launch_record.read(launches) if launches.is_file() else {}
    if not found:
        raise Refused(f"the correctness tests made no ct.launch that could be recorded (exit {result.returncode}; "
                      f"see {runs / 'record-launches.log'})", "check that they run on this machine's GPU")
    arch = _session_arch(session) or compilecheck.DEFAULT_ARCH
    target = spec_path
    if spec_path.exists() and not signature_spec.is_recorded(spec_path.read_text(encoding="utf-8")):
        target = spec_path.with_name(spec_path.stem + ".recorded.yaml")  # never overwrite a hand-written spec
    atomic.write_text(target, signature_spec.recorded_spec(found, arch))
    count = sum(len(v) for v in found.values())
    note = "" if target == spec_path else f" ({spec_path.name} was written by hand: pass --spec {target} to use this one)"
    return Outcome(f"recorded {count} signature(s) of {len(found)} kernel(s) into {target}{note}",
                   {"spec": str(target), "kernels": {k: len(v) for k, v in found.items()},
                    "tests_exit": result.returncode})


def _replaced_file(root: Path, session: session_mod.Session | None, candidate: Path, as_: Path | None) -> Path | None:
    """The fenced file ``candidate`` is checked as: ``--as``, else the session's one fenced kernel file
    (or the one of the same name) when ``candidate`` is not itself a module of the package; None to
    check ``candidate`` where it is."""
    if as_ is not None:
        target = (as_ if as_.is_absolute() else root / as_).resolve()
        if target.suffix != ".py" or not target.parent.is_dir():
            raise UsageError(f"--as {as_}: not a .py file in an existing folder",
                             "name the file the candidate would replace, e.g. src/<pkg>/ops/cutile/<op>.py")
        return None if target == candidate.resolve() else target
    if session is None or compilecheck.package_parts(root, candidate):
        return None
    fenced = [root / f for f in session.kernel_files if f.endswith(".py")]
    if candidate.resolve() in {f.resolve() for f in fenced}:
        return None
    same_name = [f for f in fenced if f.stem == candidate.stem]
    if len(fenced) == 1 or len(same_name) == 1:
        return (same_name or fenced)[0].resolve()
    return None


def _target(root: Path, kernel: str | None, as_: Path | None):
    """(repo root, session or None, kernel files to check, the fenced file they are checked as or None)."""
    if kernel is None:
        if as_ is not None:
            raise UsageError("--as needs --kernel <candidate file>", "e.g. --kernel sandbox/cand/x.py --as src/<pkg>/ops/cutile/<op>.py")
        try:
            session = session_mod.load(root)
        except NoSession:
            raise UsageError(f"no session in {root} and no --kernel", "pass --kernel <file or name>, or run init") from None
        return session.repo, session, [session.repo / f for f in session.kernel_files if f.endswith(".py")], None
    files = kernel_scan.find_kernel_files(root, kernel)
    try:  # for its fenced file (a candidate is checked as it) and its GPU's arch
        session = session_mod.load(root)
        root = session.repo
    except (NoSession, UsageError, Refused):  # none, or one init has to repair: --kernel needs none
        session = None
    if len(files) == 1:
        return root, session, files, _replaced_file(root, session, files[0], as_)
    if as_ is not None:
        raise UsageError("--as needs --kernel to name one file")
    return root, session, files, None


def _checked_as_note(root: Path, files: list[Path], replaced: Path | None, chosen: bool) -> str:
    if replaced is None:
        return ""
    shown = replaced.relative_to(root).as_posix() if replaced.is_relative_to(root) else str(replaced)
    return f"; {files[0].name} checked as {shown}" + ("" if chosen else " (the session's fenced kernel file; --as to choose)")


def _arch(arch: str | None, session: session_mod.Session | None) -> tuple[str, str]:
    """(the arch to compile for, where it came from)."""
    if arch is not None:
        return compilecheck.check_arch(arch), "--arch"
    cc = _session_arch(session) if session else None
    return compilecheck.check_arch(compilecheck.default_arch(cc)), (f"the session's GPU ({cc})" if cc else "default")


def _write_skeleton(root: Path, files: list[Path], kernel: str | None, spec_path: Path) -> Outcome:
    if spec_path.exists():
        raise Refused(f"{spec_path} already exists", "edit it, or pass --spec <new file>")
    text = "\n".join(signature_spec.skeleton(f.read_text(encoding="utf-8"), f.relative_to(root).as_posix()
                                            if f.is_relative_to(root) else str(f)) for f in files)
    atomic.write_text(spec_path, text)
    again = f"cutile-perf compile-check{f' --kernel {kernel}' if kernel is not None else ''} --spec {spec_path}"
    return Outcome(f"wrote {spec_path}: fill every FILL from the tests' shapes, then run {again}", {"spec": str(spec_path)})


def _check_file(module, path: Path, specs: dict, spec_path: Path, arch: str, cuobjdump) -> list[compilecheck.Result]:
    """Compile every kernel of one imported kernel file with its signatures: the spec's, else the
    module's ``aot_signatures()``; a kernel with neither is reported as not checked."""
    kernels = compilecheck.kernels_in(module)
    if not kernels:
        return [compilecheck.Result(path.name, "-", "-", error="no @ct.kernel defined in this file")]
    hook = getattr(module, "aot_signatures", None)
    from_hook = {}
    for obj, sigs in (hook() if callable(hook) else []):
        from_hook.setdefault(obj._pyfunc.__name__, []).extend(sigs)
    results = []
    for name, obj in kernels.items():
        say(f"compiling {name} for {arch}")
        if name in specs:
            entry = specs[name]
            try:
                sigs = [(signature_spec.describe(p), compilecheck.build_signature(obj, name, p), entry.hints_for(i))
                        for i, p in enumerate(entry.signatures)]
            except UsageError as exc:
                results.append(compilecheck.Result(name, "-", str(spec_path), error=f"spec: {exc}"))
                continue
            results += compilecheck.check_kernel(obj, name, sigs, source=spec_path.name, arch=arch,
                                                 hints={}, cuobjdump=cuobjdump)
        elif name in from_hook:
            sigs = [(f"aot_signatures()[{i}]", s) for i, s in enumerate(from_hook[name])]
            results += compilecheck.check_kernel(obj, name, sigs, source="aot_signatures()", arch=arch, hints={},
                                                 cuobjdump=cuobjdump)
        else:
            results.append(compilecheck.Result(
                name, "-", "none", checked=False,
                error=f"no signature: add {name} to {spec_path.name} (--write-spec writes a skeleton)"))
    return results


def compile_check(*, repo: Path, kernel: str | None, arch: str | None, spec: Path | None, write_spec: bool,
                  record_launches: bool = False, as_: Path | None = None) -> Outcome:
    root, session, files, replaced = _target(Path(repo).resolve(), kernel, as_)
    as_note = _checked_as_note(root, files, replaced, chosen=as_ is not None)
    arch, arch_source = _arch(arch, session)
    default_spec = (session.sandbox if session else root / session_mod.SANDBOX) / SPEC_FILE
    spec_path = (spec if spec is None or spec.is_absolute() else root / spec) or default_spec

    if record_launches:
        if session is None:
            raise UsageError("--record needs a session (it runs the session's correctness tests)", "run init first")
        if kernel is not None:
            raise UsageError("--record records the session's own tests; it takes no --kernel")
        return record(session, spec_path)
    if write_spec:
        return _write_skeleton(root, files, kernel, spec_path)

    compilecheck.require_toolchain()
    specs = signature_spec.load_spec(spec_path) if spec_path.exists() else {}
    if spec is not None and not spec_path.exists():
        raise UsageError(f"--spec {spec} does not exist", "write one with --write-spec")
    cuobjdump = compile_report.find_cuobjdump()
    results: list[compilecheck.Result] = []
    for path in files:
        module = compilecheck.import_kernel_module(root, path, replaced)
        results += _check_file(module, path, specs, spec_path, arch, cuobjdump)
    failed = [r for r in results if r.checked and not r.ok]
    compiled = sum(1 for r in results if r.ok)
    unchecked = sum(1 for r in results if not r.checked)
    legend = THREADS_LEGEND if any((r.cubin or {}).get("threads") for r in results) else ""
    text = "\n".join([f"compile-check for {arch} ({arch_source}); cuobjdump: {cuobjdump or 'not found'}{as_note}",
                      render(results), *([legend] if legend else []), "",
                      f"{compiled} compiled, {len(failed)} failed, {unchecked} without a signature"])
    data = {"arch": arch, "arch_source": arch_source, "cuobjdump": str(cuobjdump) if cuobjdump else None,
            "checked_as": str(replaced) if replaced is not None else None,
            "results": [r.to_dict() for r in results]}
    # Exit 1 on a compile error, or when nothing at all was compiled (a check that checked nothing).
    return Outcome(text, data, EXIT_REJECTED if failed or not compiled else EXIT_OK)


def _sass_cell(cubin: dict) -> str:
    sass = cubin.get("sass") or {}
    if not sass or "note" in sass:
        return "-"
    parts = [f"{op} " + "/".join(f"{n}x{w}b" for w, n in sorted(sass.get(op, {}).items(), key=lambda kv: -int(kv[0])))
             for op in ("LDG", "STG") if sass.get(op)]
    parts += [f"{op} {sass[op]}" for op in ("UTMALDG", "UTMASTG", "HGMMA") if sass.get(op)]
    cell = "; ".join(parts) or "no global loads/stores"
    return f"{cell}; {sass['instructions']} instr" if sass.get("instructions") else cell


# Seen compiling for sm_90 with tileiras 13.4 (CPU machine, bundled RMSNorm): 128 threads with plain
# loads, 256 for the same kernel with TMA loads, 384 with TMA and num_worker_warps=8. The 4 extra
# warps issue the TMA copies; without this line a reader takes them for the kernel's own workers.
THREADS_LEGEND = ("threads: per block, as launched; a kernel with TMA loads (UTMALDG, marked *) also counts "
                  "4 producer warps (128 threads) that issue the copies: its worker warps are (threads - 128) / 32")


def _threads_cell(cubin: dict) -> str:
    threads = cubin.get("threads")
    if not threads:
        return "-"
    return f"{threads}*" if (cubin.get("sass") or {}).get("UTMALDG") else str(threads)


def render(results: list[compilecheck.Result]) -> str:
    head = ["kernel", "signature", "hints", "source", "result", "regs", "stack", "threads", "loads (remarks)", "SASS",
            "s"]
    rows = []
    for r in results:
        cub = r.cubin or {}
        status = "compiled" if r.ok else f"ERROR {r.error}" if r.checked else f"not checked: {r.error}"
        rows.append([r.kernel, r.signature[:60], ",".join(f"{k}={v}" for k, v in r.hints.items()) or "-", r.source, status[:120],
                     str(cub.get("registers", "-")), str(cub.get("stack", "-")), _threads_cell(cub),
                     compile_report.loads_kind(r.remarks) if r.ok else "-", _sass_cell(cub) if r.ok else "-",
                     f"{r.seconds:.1f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*row) for row in rows)]).rstrip()

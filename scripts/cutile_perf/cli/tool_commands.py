"""The other subcommands: tuning (probe, ab, prune), Triton-TileIR, the skill and the bundled examples."""
from __future__ import annotations

from pathlib import Path

from cutile_perf.cli.subcommand import add_spread_flags, runs, subcommand

def _add_install_skill(subparsers) -> None:
    p = subcommand(subparsers, "install-skill",
             "copy SKILL.md and references/ into <target>/.claude/skills/ and/or <target>/.agents/skills/ (or .cursor/skills/)",
             "Examples:\n  cutile-perf install-skill --target ~/src/TileGym\n"
             "  cutile-perf install-skill --target . --agent claude\n\n"
             "Files you edited since the last install are refused unless --force (then kept as <file>.bak).")
    p.add_argument("--target", type=Path, help="repository to install into (default: --repo)")
    p.add_argument("--agent", choices=["claude", "codex", "cursor", "all"], default="all",
                   help="claude: .claude/skills/cutile-perf, codex: .agents/skills/cutile-perf, cursor: "
                        ".cursor/skills/cutile-perf, all: claude and codex (default; Cursor reads both)")
    p.add_argument("--force", action="store_true", help="overwrite files you edited (your versions are saved as .bak)")

    runs(p, "install_skill", lambda a: dict(target=a.target or a.repo, agent=a.agent, force=a.force))


def _add_example(subparsers) -> None:
    p = subcommand(subparsers, "example",
             "the bundled kernels: list them, show a plain kernel or a prepared step, copy the suite to practise",
             "Examples:\n  cutile-perf example list\n  cutile-perf example show rms_norm\n"
             "  cutile-perf example show rms_norm --step 04 > src/tilesuite/ops/cutile/rms_norm.py\n"
             "  cutile-perf example show rms_norm --test\n  cutile-perf example copy --dest /tmp/kernels\n\n"
             "`show` prints the file on stdout; what a step changes, why and what we expected go to stderr.")
    p.add_argument("action", choices=["list", "show", "copy"], help="list the ops, show one file, or copy the suite")
    p.add_argument("op", nargs="?", help="bundled op for `show` (rms_norm, softmax, layer_norm, swiglu, matmul, attention)")
    p.add_argument("--step", metavar="NN", help="a prepared step: its number (04), file stem or name")
    p.add_argument("--test", action="store_true", help="show the op's test file instead of the kernel")
    p.add_argument("--dest", type=Path, help="new directory for `copy` (made a git repository)")

    runs(p, "example", lambda a: dict(action=a.action, op=a.op, step=a.step, test=a.test, dest=a.dest))


def _add_template(subparsers) -> None:
    p = subcommand(subparsers, "template",
             "print a tune-once/cache/launch module for a kernel (imports only cuda.tile and the kernel)",
             "Examples:\n  cutile-perf template autotune --kind occupancy\n"
             "  cutile-perf template autotune --kind matmul --output my_matmul_tuned.py\n"
             "  cutile-perf template autotune --kind occupancy --op rms_norm --kernel-module pkg.ops.cutile.rms_norm "
             "--kernel-name rms_norm_kernel --params x,w,out --grid '(x.shape[0],)' --args '(x, w, out)' "
             "--key 'tuple(x.shape)'\n\n"
             "Kinds: occupancy (norms, reductions, elementwise), tile_search (matmul, attention), split_buffer\n"
             "(in-place kernels); aliases such as matmul or rms_norm pick one. Each field has a worked default;\n"
             "--grid and --args are Python expressions of cfg (the config) and the params.")
    p.add_argument("name", choices=["autotune"], help="which template")
    p.add_argument("--kind", required=True, help="occupancy, tile_search, split_buffer (or matmul, rms_norm, ...)")
    p.add_argument("--op", help="name of the generated <op>_launch function")
    p.add_argument("--kernel-module", help="module that defines the @ct.kernel")
    p.add_argument("--kernel-name", help="the @ct.kernel function's name")
    p.add_argument("--params", metavar="A,B,...", help="parameters of <op>_launch after stream, comma-separated")
    p.add_argument("--grid", help="grid expression of cfg and the params")
    p.add_argument("--args", help="kernel argument tuple expression of cfg and the params")
    p.add_argument("--key", help="cache key expression of the params (shape, dtype, device)")
    p.add_argument("--configs", metavar="JSON", help='search space, e.g. \'[{"occupancy": 1}, {"occupancy": 2}]\'')
    p.add_argument("--fixed", metavar="JSON", help="the config the kernel uses today (default: the first config)")
    p.add_argument("--inplace", metavar="A,B", help="params the kernel writes in place (split_buffer)")
    p.add_argument("--output", type=Path, help="write the module there (refused if it exists) instead of stdout")

    runs(p, "template", lambda a: dict(name=a.name, kind=a.kind, output=a.output, overrides={
        "op_name": a.op, "kernel_module": a.kernel_module, "kernel_name": a.kernel_name, "params": a.params,
        "grid": a.grid, "args": a.args, "key": a.key, "configs": a.configs, "fixed": a.fixed, "inplace": a.inplace}))


def _add_tileir_check(subparsers) -> None:
    p = subcommand(subparsers, "tileir-check",
             "which triton is active and whether its TileIR backend can compile kernels here (JSON)",
             "Example:\n  cutile-perf tileir-check   # exit 1 unless TileIR is the active target (\"ready\": false)")
    p.add_argument("--strict", action="store_true",
                   help="accepted for old scripts; exit 1 when not ready is now the default")

    runs(p, "tileir_check", lambda a: dict(strict=a.strict))


def _add_classify_triton(subparsers) -> None:
    p = subcommand(subparsers, "classify-triton",
             "classify Triton kernels (dot-related, norm-like, element-wise, reduction) and flag TileIR risks (JSON)",
             "Examples:\n  cutile-perf classify-triton --file kernel.py\n"
             "  cutile-perf classify-triton --file kernel.py --apply-optimizations --output kernel_tileir.py\n"
             "  cutile-perf classify-triton --file kernel.py --apply-optimizations --report report.md "
             "--verification verify.json")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="Python module with @triton.jit kernels")
    source.add_argument("--code", help="the module's source as a string")
    p.add_argument("--apply-optimizations", action="store_true",
                   help="add TileIR configs beside each autotuned kernel's own, gated on the TileIR backend")
    p.add_argument("--output", type=Path, help="write the optimized code there (never the input file)")
    p.add_argument("--report", type=Path, help="render the TileIR optimization report (Markdown) there")
    p.add_argument("--verification", type=Path, help="a `verify-triton --json` result to include in the report")

    runs(p, "classify_triton", lambda a: dict(file=a.file, code=a.code, apply=a.apply_optimizations, output=a.output,
                                               report_path=a.report, verification=a.verification))


def _add_verify_triton(subparsers) -> None:
    p = subcommand(subparsers, "verify-triton",
             "run a Triton kernel's host entry point against a torch reference per shape (GPU or CPU interpreter)",
             "The kernel module defines a host function taking the inputs positionally, in --shapes order,\n"
             "and returning a tensor (or tuple); --entry names it (default: first public function that\n"
             "launches a @triton.jit kernel). The reference sees the same names, plus torch, F and math.\n\n"
             "Example:\n  cutile-perf verify-triton --kernel softmax.py --reference 'torch.softmax(x, -1)' "
             "--shapes '{\"x\": [32, 4096]}' --dtypes '{\"x\": \"bfloat16\"}'")
    p.add_argument("--kernel", type=Path, required=True, help="Python module with the kernel and its host function")
    p.add_argument("--reference", required=True, help="torch expression over the input names")
    p.add_argument("--shapes", required=True, help='JSON {"x": [32, 512]} or a list of such objects')
    p.add_argument("--dtypes", help='JSON {"x": "bfloat16"} or one dtype name for all inputs (default float32)')
    p.add_argument("--entry", help="host function to call (default: first public function that launches a kernel)")
    p.add_argument("--device", choices=["auto", "gpu", "interpreter"], default="auto",
                   help="auto: the GPU when torch sees one, else the CPU interpreter")
    p.add_argument("--no-tileir", dest="tileir", action="store_false",
                   help="skip the ENABLE_TILE=1 pass even when the TileIR backend is installed")
    p.add_argument("--atol", type=float, help="absolute tolerance (default by dtype)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default by dtype)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per backend pass (default 600)")

    runs(p, "verify_triton", lambda a: dict(kernel=a.kernel, reference=a.reference, shapes=a.shapes, dtypes=a.dtypes,
                                             entry=a.entry, device=a.device, tileir=a.tileir, atol=a.atol,
                                             rtol=a.rtol, seed=a.seed, timeout_s=a.timeout))


TARGET_EPILOG = """\
Naming a kernel: --target MODULE:ATTRIBUTE names a cutile_perf.tune.Tunable object (kernel, final
space per arch, fixed config, default shapes, problem(shape) -> grid_fn/args_fn). The bundled suite
has tilesuite.tunables:rms_norm and tilesuite.tunables:matmul (PYTHONPATH=examples/kernels/src in a
checkout, or <dir>/src after `cutile-perf example copy --dest <dir>`).
--shape NAME=INT,... (repeatable) replaces the tunable's default shapes."""


def _add_tune_target(p) -> None:
    p.add_argument("--target", required=True, metavar="MODULE:ATTR", help="the Tunable to tune, e.g. tilesuite.tunables:matmul")
    p.add_argument("--shape", action="append", dest="shapes", metavar="NAME=INT,...",
                   help="a problem shape (repeatable; default: the tunable's shapes)")


def _add_probe(subparsers) -> None:
    p = subcommand(subparsers, "probe",
             "directional exploration (<= ~100 configs over the dimensions you name): ranked table + the <= 8 to keep",
             "Example:\n  cutile-perf probe --target tilesuite.tunables:matmul --dim TILE_M=64,128,256 "
             "--dim TILE_N=64,128,256 --dim num_ctas=1,2 --shape M=4096,N=4096,K=4096\n\n"
             "Fields not named by --dim keep the fixed config's value. Never edits source.\n\n" + TARGET_EPILOG)
    _add_tune_target(p)
    p.add_argument("--dim", action="append", default=[], dest="dims", metavar="NAME=V1,V2,...",
                   help="a dimension to vary (repeatable)")
    p.add_argument("--tolerance", type=float, default=0.05, help="keep-set tolerance vs the best per shape (default 0.05)")
    p.add_argument("--max-configs", type=int, default=100, help="refuse larger probes (default 100)")
    add_spread_flags(p, "each shape timed on one of them")

    runs(p, "probe", lambda a: dict(target=a.target, dims=a.dims, shapes=a.shapes, tolerance=a.tolerance,
                                     max_configs=a.max_configs, gpus=a.gpus, engine=a.engine))


def _add_ab(subparsers) -> None:
    p = subcommand(subparsers, "ab", "autotuned vs the fixed config per shape, with 95 % confidence intervals and a verdict",
             "Example:\n  cutile-perf ab --target tilesuite.tunables:rms_norm\n\n"
             "Exit 1 when the tuned config is slower than the fixed one on any shape.\n\n" + TARGET_EPILOG)
    _add_tune_target(p)
    p.add_argument("--rep-ms", type=float, default=200.0, help="timing budget per side and round in ms (default 200)")
    add_spread_flags(p, "each shape timed on one of them")

    runs(p, "ab", lambda a: dict(target=a.target, shapes=a.shapes, rep_ms=a.rep_ms, gpus=a.gpus, engine=a.engine))


def _add_prune(subparsers) -> None:
    p = subcommand(subparsers, "prune", "configs of the final space that never win on any tested shape (target: <= 8 per arch)",
             "Example:\n  cutile-perf prune --target tilesuite.tunables:matmul --tolerance 0.03\n\n" + TARGET_EPILOG)
    _add_tune_target(p)
    p.add_argument("--tolerance", type=float, default=0.05, help="a config within this of the best on a shape is useful (default 0.05)")
    p.add_argument("--max-keep", type=int, default=8, help="largest space to keep (default 8)")
    add_spread_flags(p, "each shape timed on one of them")

    runs(p, "prune", lambda a: dict(target=a.target, shapes=a.shapes, tolerance=a.tolerance, max_keep=a.max_keep,
                                     gpus=a.gpus, engine=a.engine))


# In the order --help lists them.
SUBCOMMANDS = (
    _add_probe, _add_ab, _add_prune, _add_tileir_check, _add_classify_triton, _add_verify_triton, _add_install_skill,
    _add_example, _add_template,
)

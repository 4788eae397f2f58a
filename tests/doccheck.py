"""Pure extraction helpers for the docs check (``tests/test_docs.py``): test code, not the package's.

Each function takes markdown text and returns what it names: cuTile API names, ``cutile-perf``
subcommands with their flags, environment variables, local paths and links, python blocks. The test
decides what is wrong; these functions only find things, so each is testable on a short string.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_CT_NAME = re.compile(r"(?<![\w.])(ct|cuda\.tile)\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_SUBCOMMAND = re.compile(r"(?<![\w/.-])cutile-perf\s+([a-z][a-z0-9-]*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]$")
_ENV_ASSIGN = re.compile(r"(?<![\w.])([A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9])=")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_LOCAL_PATH = re.compile(r"^(?:scripts|templates|examples|benchmarks|references|evals)/[\w./-]*$")
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "text"}


# The variables cutile-perf reads whose names do not start with CUTILE_PERF_ (knobs.autotune_disabled).
OWN_UNPREFIXED_ENV_VARS = {
    "DISABLE_AUTOTUNE": "cutile_perf.tune launches its fixed config without searching",
    "TILEGYM_DISABLE_AUTOTUNE": "TileGym's name for the same switch, honoured alike",
}

# A `CUTILE_PERF_*` word under scripts/ that names no environment variable, with why.
NOT_KNOBS = {
    "CUTILE_PERF_VERIFY_RESULT": "the prefix of the result line tileir/verify_child.py prints on stdout",
}

# `\b` keeps identifiers that merely contain the prefix (`_CUTILE_PERF_TILEIR_VARIANTS`, a name in
# generated code) out.
_KNOB_WORD = re.compile(r"\bCUTILE_PERF_[A-Z_]+\b")


def env_vars_named_in(folder: Path) -> set[str]:
    """Every `CUTILE_PERF_*` word in the Python files under ``folder``, less the known non-knobs."""
    found = set()
    for path in folder.rglob("*.py"):
        found |= set(_KNOB_WORD.findall(path.read_text(encoding="utf-8")))
    return found - set(NOT_KNOBS)


# Read by cuda-tile 1.7, tileiras, TileGym or the Triton TileIR backend (never by us, except
# where noted): the docs may name them.
FOREIGN_ENV_VARS: dict[str, str] = {
    "CUDA_TILE_CACHE_DIR": "cuda-tile: disk cache directory (0/off/none disables it); the harness sets it for its pytest children to sandbox/jit-cache/ (verify: an empty folder of its own) when session.yaml has jit_cache: true",
    "CUDA_TILE_CACHE_SIZE": "cuda-tile: disk cache size limit in bytes",
    "CUDA_TILE_COMPILER_TIMEOUT_SEC": "cuda-tile: tileiras timeout",
    "CUDA_TILE_TEMP_DIR": "cuda-tile: temporary files",
    "CUDA_TILE_LOGS": "cuda-tile: CUTILEIR and/or TILEIR dumps to stderr",
    "CUDA_TILE_DUMP_TILEIR": "cuda-tile: directory for .tileir MLIR text",
    "CUDA_TILE_DUMP_BYTECODE": "cuda-tile: directory for .tileirbc bytecode",
    "CUDA_TILE_ENABLE_CRASH_DUMP": "cuda-tile: crash bundle on a tileiras error",
    "EXPERIMENTAL_CUDA_TILE_DEBUG_BUILD": "cuda-tile: -O0 --device-debug builds",
    "CUDA_HOME": "tileiras: toolkit root (must be unset or match tileiras)",
    "CUDA_PATH": "tileiras: toolkit root (Windows name, also read on Linux)",
    "CUDA_ROOT": "tileiras: toolkit root, checked first",
    "XDG_CACHE_HOME": "cuda-tile and cutile-perf: base cache directory",
    "PATH": "cuda-tile: tileiras lookup",
    "LD_LIBRARY_PATH": "tileiras: shared libraries",
    "CUTILE_MAX_LAUNCH_TIMEOUT_SEC": "TileGym tests: tuning watchdog budget",
    "TILEGYM_DISABLE_CUTILE": "TileGym: hide the cutile backend",
    "CUPTI": "TileGym tests: 0 switches timing from CUPTI to CUDA events",
    "CUDAGRAPH": "TileGym tests: 1 times with CUDA graphs (with CUPTI=0)",
    "ENABLE_TILE": "Triton TileIR backend: 1 selects the TileIR backend",
    "TILEIR_ENABLE_APPROX": "Triton TileIR backend: approximate math",
    "TILEIR_ENABLE_FTZ": "Triton TileIR backend: flush denormals to zero",
    "TRITON_INTERPRET": "triton: 1 runs kernels in the CPU interpreter",
    "TRITON_TILEIRAS_PATH": "Triton TileIR backend: directory holding tileiras (also read by cutile-perf tileir-check)",
    "TILEIR_ENABLE_AUTOGEN_ALIAS_MEM_TOKEN": "Triton TileIR backend: auto memory tokens for aliasing accesses (default on)",
    "TILE_IR_DISABLE_FMAD": "Triton TileIR backend: 1 disables FMA contraction",
    "PYTHONPATH": "python: module search path",
    "CUDA_VISIBLE_DEVICES": "CUDA: which GPUs a process sees (passed into the sandbox)",
    "PYTEST_ADDOPTS": "pytest: extra command-line options (never passed into the sandbox)",
    "PYTEST_PLUGINS": "pytest: plugins to load (never passed into the sandbox)",
    "PYTEST_CURRENT_TEST": "pytest: the node id of the test now running (set by pytest inside the test process)",
    "LD_PRELOAD": "the dynamic loader: libraries loaded first (never passed into the sandbox)",
    "CUDA_MPS_PIPE_DIRECTORY": "CUDA: where an MPS client finds the MPS daemon's pipes (default under /tmp, which the sandbox hides)",
    "TORCH_LOGS": "torch: output_code prints the Triton code torch.compile generates (benchmarks/profile_gap.py)",
}


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language tag, first line number (1-based) and text."""

    lang: str
    line: int
    text: str


@dataclass(frozen=True)
class CodeSpan:
    """A piece of code: an inline `span` (lang None) or one line of a fenced block."""

    text: str
    line: int
    lang: str | None


def fenced_blocks(text: str) -> list[Block]:
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i + 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence[:3]):
            body.append(lines[i])
            i += 1
        blocks.append(Block(lang=lang, line=start + 1, text="\n".join(body)))
        i += 1
    return blocks


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced blocks."""
    out, in_fence, fence = [], False, ""
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m and not in_fence:
            in_fence, fence = True, m.group(1)[:3]
        elif in_fence and line.startswith(fence):
            in_fence = False
        elif not in_fence:
            out.append((n, line))
    return out


def code_spans(text: str) -> list[CodeSpan]:
    """Inline code spans from prose and every line of every fenced block."""
    spans = [CodeSpan(m.group(1), n, None) for n, line in prose_lines(text) for m in _INLINE_CODE.finditer(line)]
    for block in fenced_blocks(text):
        for k, line in enumerate(block.text.splitlines()):
            spans.append(CodeSpan(line, block.line + k, block.lang))
    return spans


def ct_names(text: str) -> set[str]:
    """Dotted names under ``cuda.tile`` written as ``ct.x`` or ``cuda.tile.x``, in code only."""
    names = set()
    for span in code_spans(text):
        for m in _CT_NAME.finditer(span.text):
            names.add("cuda.tile." + m.group(2))
    return names


def subcommand_mentions(text: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, subcommand, flags) for each ``cutile-perf <sub> [--flags]`` written in code.

    Flags count only up to the end of the span or shell command (``|``, ``;``, ``&&``, ``#``), so a
    flag of another tool later on the line is not charged to cutile-perf.
    """
    found = []
    for span in code_spans(text):
        for m in _SUBCOMMAND.finditer(span.text):
            rest = re.split(r"\||;|&&|#|\bcutile-perf\b", span.text[m.end():])[0]
            found.append((span.line, m.group(1), tuple(_FLAG.findall(rest))))
    return found


def command_mentions(text: str) -> list[tuple[int, str]]:
    """(line, ``"cutile-perf <sub> ..."``) for each command written in code, cut where the shell
    command ends (``|``, ``;``, ``&&``, ``#``, a `` > `` redirection), for a parse check."""
    spans = [CodeSpan(m.group(1), n, None) for n, line in prose_lines(text) for m in _INLINE_CODE.finditer(line)]
    for block in fenced_blocks(text):
        # A shell line ending in a backslash continues on the next one: one command, one span.
        joined = re.sub(r"[ \t]*\\\n\s*", " ", block.text) if block.lang in SHELL_LANGS else block.text
        first_lines = [block.line + k for k, line in enumerate(block.text.splitlines())
                       if k == 0 or not block.text.splitlines()[k - 1].endswith("\\")]
        spans += [CodeSpan(line, n, block.lang) for n, line in zip(first_lines, joined.splitlines())]
    found = []
    for span in spans:
        for m in _SUBCOMMAND.finditer(span.text):
            rest = re.split(r"\||;|&&|#|\s[12]?>\s|\bcutile-perf\b", span.text[m.end():])[0]
            found.append((span.line, f"cutile-perf {m.group(1)}{rest}".strip()))
    return found


def env_var_mentions(text: str) -> set[str]:
    """UPPER_CASE names that look like environment variables.

    Heuristic: a whole inline code span that is one UPPER_CASE name with an underscore, or
    ``NAME=`` in an inline span or a shell block (python blocks are skipped: ``GROUP_SIZE_M=8``
    there is a keyword argument).
    """
    names = set()
    for span in code_spans(text):
        if span.lang is None and _ENV_NAME.match(span.text.strip()):
            names.add(span.text.strip())
        if span.lang is None or span.lang in SHELL_LANGS:
            names.update(_ENV_ASSIGN.findall(span.text))
    return names


def relative_links(text: str) -> set[str]:
    """Markdown link targets that are local files (no scheme, no pure #anchor), anchors removed."""
    out = set()
    for _, line in prose_lines(text):
        for m in _LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            out.add(target.split("#", 1)[0])
    return out


def local_paths(text: str) -> set[str]:
    """Repo paths written in inline code (``scripts/...``, ``examples/...`` ...) without placeholders."""
    out = set()
    for span in code_spans(text):
        if span.lang is not None:
            continue
        candidate = span.text.strip().rstrip("/")
        if _LOCAL_PATH.match(candidate + ("/" if "/" not in candidate else "")):
            out.add(candidate)
    return out


def python_blocks(text: str) -> list[Block]:
    return [b for b in fenced_blocks(text) if b.lang in {"python", "py"}]


# --- quantitative claims and their sources ---------------------------------------------------------

# A figure: a number (sign and range allowed: "+5.1 %", "0.8-1.3 %") with a performance unit. "x" must
# touch the number and not be followed by a digit, so "2.1x faster" is a ratio and "262144x1024" a shape.
_NUMBER = r"[+\-−]?\d+(?:,\d{3})*(?:\.\d+)?"
_CLAIM = re.compile(
    rf"(?<![\w.^/])({_NUMBER}(?:(?:-|–|\sto\s){_NUMBER})?"
    r"(?:x(?![\w^])|\s?(?:%|ms\b|us\b|µs\b|ns\b|s\b|min\b|[KMGTP]B/s\b|[TP]FLOP/s|TFLOPS\b)))"
)
_BOUND = re.compile(r"(?:<=?|(?<!-)>=?|≤|≥)\s*~?\s*$")  # "->" is an arrow, not a bound
_MARKER = re.compile(r"<!--\s*not-measured:\s*\S.*?-->")
_COMMENT = re.compile(r"<!--.*?-->")
_URL = re.compile(r"https?://\S+")
_SOURCE_LINE = re.compile(r"\bsources?:", re.I)
_LABEL = re.compile(r"\bmedians?\b|\bsingle runs?\b", re.I)
_UNVERIFIED = re.compile(r"\bunverified\b", re.I)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
# `cutile-perf` counts only with a subcommand that measures (`cutile-perf example show` is no run).
RUN_PREFIXES = ("python benchmarks/", "bash benchmarks/", "python -m pytest", "python evals/", "python -m tests.",
                *(f"cutile-perf {sub}" for sub in ("demo", "baseline", "try", "verify", "probe", "ab", "prune", "survey")))
# Shell words that may precede the command itself: `VAR=x`, `timeout 150`, `(cd dir &&`.
_COMMAND_LEAD = re.compile(r"^(?:\(?cd\s+\S+\s*&&\s*|[A-Z_][A-Z0-9_]*=\S*\s+|timeout\s+\d+\s+)*")


@dataclass(frozen=True)
class Claim:
    """A figure in prose or a table, and what its unit (paragraph, list item or table) holds.

    ``sourced``: a run command, a link, a bare URL or a "Source:" sits in the unit. ``run``: one of
    those sources is a run command. ``labelled``: the unit says "median" or "single run(s)".
    ``unverified``: the unit says "unverified" (a figure whose origin could not be found).
    """

    line: int
    text: str
    sourced: bool
    run: bool
    labelled: bool
    unverified: bool = False


def is_run_command(code: str) -> bool:
    """Whether a code span or shell line is a measuring run: starts (after ``VAR=x``, ``timeout N``,
    ``cd dir &&``) with one of ``RUN_PREFIXES``."""
    return _COMMAND_LEAD.sub("", code.strip()).startswith(RUN_PREFIXES)


def _blocks(text: str) -> list[dict]:
    """Markdown blocks in order: kind (para, item, table, fence, heading), first line, lines, marker."""
    blocks, cur, marked = [], None, False
    lines, i = text.splitlines(), 0
    while i < len(lines):
        line, n = lines[i], i + 1
        m = _FENCE.match(line.lstrip())
        if m:  # a fence, indented or not, is a block of its own
            fence, body = m.group(1)[:3], []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith(fence):
                body.append(lines[i])
                i += 1
            blocks.append({"kind": "fence", "line": n, "lines": body, "marked": False})
            cur, i = None, i + 1
            continue
        i += 1
        stripped = line.strip()
        if _MARKER.fullmatch(stripped):
            marked = True
            if cur is not None:
                cur["marked"] = True
            continue
        if not stripped:
            cur = None
            continue
        if _COMMENT.fullmatch(stripped):
            continue
        kind = ("heading" if stripped.startswith("#") else "table" if stripped.startswith("|")
                else "item" if _LIST_ITEM.match(line) else "para")
        joins = cur is not None and (kind == cur["kind"] == "table" or (kind == "para" and cur["kind"] in ("para", "item")))
        if not joins:
            cur = {"kind": kind, "line": n, "lines": [], "marked": marked}
            blocks.append(cur)
            marked = False
        cur["lines"].append((n, line))
        if _MARKER.search(line):
            cur["marked"] = True
    return blocks


def _units(blocks: list[dict]) -> list[list[dict]]:
    """Group blocks: a table takes the paragraph right before it (also across a command block
    between them) and the one right after it, and a fenced block touching a unit belongs to it."""
    units: list[list[dict]] = []
    for k, b in enumerate(blocks):
        if b["kind"] == "fence":
            continue
        prev = blocks[k - 1] if k else None
        # "caption, command block, table": the caption still belongs to the table.
        if b["kind"] == "table" and prev is not None and prev["kind"] == "fence" and k > 1:
            prev = blocks[k - 2]
        glue = units and prev is not None and prev is units[-1][-1] and (
            b["kind"] == "table" and prev["kind"] == "para" or prev["kind"] == "table" and b["kind"] == "para")
        if glue:
            units[-1].append(b)
        else:
            units.append([b])
    for unit in units:
        k0, k1 = blocks.index(unit[0]), blocks.index(unit[-1])
        unit += [blocks[k] for k in range(k0, k1) if blocks[k]["kind"] == "fence"]
        if k0 > 0 and blocks[k0 - 1]["kind"] == "fence":
            unit.insert(0, blocks[k0 - 1])
        if k1 + 1 < len(blocks) and blocks[k1 + 1]["kind"] == "fence":
            unit.append(blocks[k1 + 1])
    return units


def quantitative_claims(text: str) -> list[Claim]:
    """Every quantitative claim in markdown prose and tables, with what sits next to it.

    A claim is a number with a performance unit: ``ms``, ``us``/``µs``, ``ns``, ``s``, ``min``,
    ``GB/s``/``TB/s``, ``TFLOP/s``, ``%``, or a ratio ``2.1x`` (the ``x`` touching the number and
    not followed by a digit, so ``262144x1024`` is a shape). Not claims: anything in a fenced block,
    an inline code span, an HTML comment, a link target or a URL; numbers without a unit (versions,
    ``sm_90``); a figure right after ``<``, ``<=``, ``>``, ``>=`` (a bound, such as a goal); and every
    figure of a unit marked ``<!-- not-measured: <why> -->`` (on the line above the unit's first
    block, or inside it): thresholds, defaults, examples, arithmetic that defines rather than measures.

    Its unit is the paragraph, list item (with its continuation lines) or heading it is in; a table
    is one unit with the paragraph right before it (also when a fenced block sits between the two)
    and the one right after it (captions), and a fenced block directly before or after a unit (blank
    lines between at most) belongs to it. The
    claim is ``sourced`` when its unit holds a run command (inline code or a fenced shell line that
    ``is_run_command``), a markdown link that is not a pure ``#anchor`` (whether a local target is
    shipped is the link check's job), a bare ``http(s)://`` URL, or the word "Source:". When one
    of the sources is a run, ``labelled`` says whether the unit's prose says "median" or "single
    run(s)". A unit whose prose says "unverified" is reported as such (``unverified``), for a figure
    kept on purpose although its origin could not be found.
    """
    claims = []
    for unit in _units(_blocks(text)):
        if any(b["marked"] for b in unit):
            continue
        prose = [(n, line) for b in unit if b["kind"] != "fence" for n, line in b["lines"]]
        code = [c for _, line in prose for c in _INLINE_CODE.findall(line)]
        code += [line for b in unit if b["kind"] == "fence" for line in b["lines"]]
        joined = "\n".join(line for _, line in prose)
        links = [t for t in _LINK.findall(joined) if not t.startswith("#")]
        run = any(is_run_command(c) for c in code)
        sourced = run or bool(links) or bool(_URL.search(joined)) or bool(_SOURCE_LINE.search(_INLINE_CODE.sub("", joined)))
        labelled = bool(_LABEL.search(_INLINE_CODE.sub("", joined)))
        unverified = bool(_UNVERIFIED.search(_COMMENT.sub("", _INLINE_CODE.sub("", joined))))
        for n, line in prose:
            plain = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), _COMMENT.sub("", line))
            plain = _URL.sub("", re.sub(r"\]\([^)\s]*\)", "]", plain))
            for m in _CLAIM.finditer(plain):
                if not _BOUND.search(plain[:m.start()]):
                    claims.append(Claim(n, m.group(1), sourced, run, labelled, unverified))
    return claims

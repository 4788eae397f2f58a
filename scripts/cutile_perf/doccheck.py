"""Pure extraction helpers for the docs check (``tests/test_docs.py``).

Each function takes markdown text and returns what it names: cuTile API names, ``cutile-perf``
subcommands with their flags, environment variables, local paths and links, python blocks. The test
decides what is wrong; these functions only find things, so each is testable on a short string.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

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


def split_frontmatter(text: str) -> tuple[dict, str]:
    """YAML frontmatter (between leading ``---`` lines) and the body after it."""
    if not text.startswith("---\n"):
        return {}, text
    end = text.find("\n---\n", 4)
    if end < 0:
        raise ValueError("frontmatter starts with --- but never ends")
    meta = yaml.safe_load(text[4:end]) or {}
    if not isinstance(meta, dict):
        raise ValueError("frontmatter is not a mapping")
    return meta, text[end + 5:]


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

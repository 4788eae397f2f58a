"""Generate tune-once / cache / launch code from ``templates/autotune/*.j2`` for repos that cannot
depend on cutile-perf. The generated module imports only ``cuda.tile`` and the kernel."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from cutile_perf.errors import UsageError
from cutile_perf.tune.config import as_config, as_space
from cutile_perf.templating import template_dirs

KINDS = ("occupancy", "tile_search", "split_buffer")


def _environment():
    import jinja2


    # render's template finder (package data, then the checkout), so an installed wheel finds them too.
    # Its own environment: these templates are written for jinja2's default whitespace handling.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader([str(d) for d in template_dirs()]),
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["pyrepr"] = repr
    return env


def render(kind: str, *, op_name: str, kernel_module: str, kernel_name: str, params: Sequence[str], grid: str,
           args: str, key: str, configs: Sequence[Any], fixed: Any, inplace: Sequence[str] = (),
           compile_timeout_s: float = 30.0, space_note: str = "search space: keep <= 8 configs per arch") -> str:
    """Python source for ``<op_name>_launch(stream, *params)``; ``grid``/``args`` are expressions of ``cfg`` and params."""
    if kind not in KINDS:
        raise UsageError(f"unknown template {kind!r}; available: {', '.join(KINDS)}")
    space = as_space(configs)
    fixed = as_config(fixed)
    if fixed not in space:
        raise UsageError(f"the fixed config {fixed.label()} must be in the generated search space")
    if kind == "occupancy" and any(set(c) - {"occupancy"} for c in space):
        raise UsageError("the occupancy template takes configs with only an occupancy field")
    if kind == "split_buffer" and not inplace:
        raise UsageError("the split_buffer template needs the in-place parameter names (inplace=...)")
    missing = [p for p in inplace if p not in params]
    if missing:
        raise UsageError(f"in-place parameters {missing} are not among the params {list(params)}")
    search_args = args
    for p in inplace:
        search_args = re.sub(rf"\b{re.escape(p)}\b", f"{p}_search", search_args)
    return _environment().get_template(f"autotune/{kind}.py.j2").render(
        op_name=op_name, kernel_module=kernel_module, kernel_name=kernel_name, params=list(params), grid=grid,
        args=args, search_args=search_args, key=key, configs=[c.to_json() for c in space],
        fixed_index=space.index(fixed), inplace=list(inplace), compile_timeout_s=compile_timeout_s,
        space_note=space_note)

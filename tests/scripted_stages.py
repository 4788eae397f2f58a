"""``ScriptedStages``: the loop's stages written down in advance, for its unit tests (no pytest
child, no GPU). It stands where ``loop.stages.StageRunner`` stands: ``run`` a request, be told what
comes next (``expect``)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cutile_perf.child.pool import Request
from cutile_perf.judge.verdict import Stage


@dataclass
class ScriptedStages:
    """Stages written down in advance: ``script[(name, commit or "candidate" or "base")]`` is a list
    of ``Stage`` objects handed out in order (the last one repeats). ``calls`` records each request as
    ``(name, tag, commit)``. For the loop's unit tests; nothing is run."""

    script: dict[tuple[str, str], list[Stage]]
    reference_commit: str | None = None
    defined: set[str] = field(default_factory=set)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    selected: list[tuple[str, ...]] = field(default_factory=list)  # the cases of each run of cases in doubt
    expected: list[tuple[Request, ...]] = field(default_factory=list)  # what each request was told comes next
    on_stage: Callable[[str, str, str], None] | None = None  # called before each stage (a test's side effect)
    unchecked: list[str] = field(default_factory=list)  # tags of the perf runs asked for with check=False
    # Set by the command that runs it (``try_change``): each scripted ``duration_s`` goes into the
    # row's timings as a child's would, so budget estimates read scripted sessions like real ones.
    clock: Any = None
    _upcoming: tuple[Request, ...] = ()

    def expect(self, requests: Sequence[Request]) -> None:
        self._upcoming = tuple(requests)

    def run(self, request: Request) -> Stage:
        name, tag, commit, cases = request.name, request.tag, request.commit, request.cases
        self.calls.append((name, tag, commit))
        if not request.check:
            self.unchecked.append(tag)
        self.expected.append(self._upcoming)
        self._upcoming = ()
        if self.on_stage is not None:
            self.on_stage(name, tag, commit)
        role = "base" if commit == self.reference_commit else "candidate"
        queue = self.script.get((name, commit)) or self.script[(name, role)]
        stage = queue.pop(0) if len(queue) > 1 else queue[0]
        if cases:  # a run of the cases in doubt records those cases only, as a child selected by node id does
            stage = replace(stage, cases=tuple(sorted(cases)),
                            shapes={c: v for c, v in stage.shapes.items() if c in cases})
            self.selected.append(tuple(sorted(cases)))
        if self.clock is not None:
            self.clock.add_child(stage.duration_s, f"{tag}-{name}")
        return stage

    def stage(self, name: str, tag: str, commit: str, cases: dict[str, str | None] | None = None) -> Stage:
        return self.run(Request(name, tag, commit, cases))

    def defined_names(self, commit: str) -> set[str]:
        return set(self.defined)

    def row_fields(self) -> dict:
        return {}

    def __enter__(self) -> ScriptedStages:
        return self

    def __exit__(self, *exc) -> None:
        return None

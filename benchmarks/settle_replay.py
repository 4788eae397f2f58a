"""After how many pairs a logged re-check would have settled, at other ``settle_sd`` values.

    python benchmarks/settle_replay.py sandbox/experiments.jsonl [settle_sd ...]   # default 3 2.5 2 1.5 1

Each row whose re-check ran at least two pairs is judged again on its first pairs only, by the
judge's own re-check rules (``recheck.judge_paired`` for a re-check of every case,
``judge_partial`` for one of the cases in doubt; the reference the row was judged against; the
session's frozen thresholds with ``settle_sd`` replaced), so rows whose re-check
``forced_recheck.py`` ordered replay too: one line per row and value, the action after each number
of pairs. "re-measure" means the judge would have asked for the next pair. What the pairs to come
would have measured is not known, so only settling earlier than the row did can be read here; a
larger value than the session's can only settle later.

Why it exists: issue 21 asks for a decided try within 2.5 perf runs, and a re-check of every case
of a TileGym op (the geomean in doubt) settles after two pairs at the default. This prints the
band that one pair would need, on real rows instead of the simulation of decision_power.py.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from cutile_perf.judge import recheck, verdict
from cutile_perf.judge.rules import Thresholds
from cutile_perf.store.history import History

DEFAULT_BANDS = (3.0, 2.5, 2.0, 1.5, 1.0)


def replayed(rows: list[dict], bands) -> list[tuple[int, str, float, list[str]]]:
    """(iteration, re-measured cases, settle_sd, [action after 1 pair, after 2, ...]) for each row
    whose re-check ran at least two pairs, and each band."""
    out = []
    frozen = Thresholds.from_dict(rows[0]["frozen"]["thresholds"]) if rows else None
    for index, row in enumerate(rows):
        confirm, decision = row.get("confirm") or {}, row.get("decision") or {}
        pairs = min((min(len(s["base"]), len(s["candidate"])) for s in confirm.values()), default=0)
        if pairs < 2 or decision.get("source") not in ("confirm", "partial"):
            continue
        ref = History(rows[:index]).reference()
        single = {c: s["median"] for c, s in row["shapes"].items()}
        implausible = verdict.implausible_cases(ref, single, frozen)
        doubt = tuple(decision.get("rechecked") or ())
        for band in bands:
            t = replace(frozen, settle_sd=band)
            actions = []
            for k in range(1, pairs + 1):
                paired = {c: (s["base"][:k], s["candidate"][:k]) for c, s in confirm.items()}
                if decision["source"] == "confirm":
                    outcome = recheck.judge_paired(ref, t, paired, implausible)
                else:
                    outcome = recheck.judge_partial(ref, t, single, doubt, paired, implausible)
                actions.append(outcome.action if outcome is not None else "every case")
            out.append((row["iteration"], "every case" if decision["source"] == "confirm" else
                        f"{len(doubt)} case(s) in doubt", band, actions))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as log:
        rows = [json.loads(line) for line in log if line.strip()]
    bands = [float(v) for v in argv[1:]] or DEFAULT_BANDS
    for iteration, what, band, actions in replayed(rows, bands):
        steps = ", ".join(f"{k} pair(s): {a}" for k, a in enumerate(actions, 1))
        print(f"row {iteration} ({what}), settle_sd {band:g}: {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""benchmarks/settle_replay.py on session 28's H200 log of TileGym rms_norm (forced re-checks:
one case in doubt, then every case twice), committed under benchmarks/results/."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("settle_replay", _ROOT / "benchmarks" / "settle_replay.py")
settle_replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(settle_replay)

LOG = _ROOT / "benchmarks" / "results" / "2026-12-03-h200-s28" / "call1" / "rmsr-experiments.jsonl"


def test_the_replay_at_the_sessions_own_band_settles_each_row_where_the_loop_did():
    rows = [json.loads(line) for line in LOG.read_text().splitlines() if line.strip()]
    replayed = settle_replay.replayed(rows, [3.0])
    assert [(i, what) for i, what, _band, _actions in replayed] == [
        (1, "1 case(s) in doubt"), (2, "every case"), (3, "every case")]
    for iteration, _what, _band, actions in replayed:
        logged = rows[iteration]
        first_final = next(k for k, action in enumerate(actions, 1) if action != "re-measure")
        assert first_final == logged["decision"]["settled_after"] == 2
        assert actions[first_final - 1] == logged["status"] == "keep"


def test_one_pair_of_every_case_settles_only_in_a_band_far_narrower_than_the_default():
    rows = [json.loads(line) for line in LOG.read_text().splitlines() if line.strip()]
    after_one = {(i, band): actions[0] for i, _what, band, actions in settle_replay.replayed(rows, [2.0, 1.5])}
    assert after_one == {(1, 2.0): "re-measure", (1, 1.5): "keep", (2, 2.0): "re-measure", (2, 1.5): "keep",
                         (3, 2.0): "re-measure", (3, 1.5): "keep"}

"""Two test runs at once on one machine share no fixed path in the temp folder (issue 43)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cutile_perf.child import pristine

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_checkout_slots_live_in_this_runs_own_temp_folder(own_temp_folder, tmp_path):
    folder = pristine.user_folder()
    assert folder is not None and folder.is_relative_to(own_temp_folder)
    assert pristine.slot_root(tmp_path, 0).is_relative_to(own_temp_folder)


def test_commands_started_by_a_test_use_the_same_folder(own_temp_folder):
    code = "from cutile_perf.child import pristine; print(pristine.user_folder())"
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert Path(out.strip()).is_relative_to(own_temp_folder)

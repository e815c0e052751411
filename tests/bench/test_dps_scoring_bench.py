"""bench/dps_scoring.py: DPS's kept forward walks against a walk at every version, small."""

from __future__ import annotations

import subprocess
import sys

from .test_allocation_bench import BENCH


def test_kept_walks_score_as_walks_from_scratch_do():
    run = subprocess.run([sys.executable, str(BENCH / "dps_scoring.py"), "--pool", "60",
                          "--picks", "6", "--candidates", "4", "--versions", "90"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2,160 scores over 90 versions" in run.stdout
    assert "the same figures: True" in run.stdout


def test_sizes_are_checked_at_the_door():
    run = subprocess.run([sys.executable, str(BENCH / "dps_scoring.py"), "--picks", "5",
                          "--pool", "4"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "at most the pool" in run.stderr

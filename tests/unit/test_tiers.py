"""The fast tier (`pytest -m "not slow"`) leaves out the cluster runs and what starts real
processes, and keeps the single-Redis runs (tests/conftest.py decides)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collected(*args: str) -> list[str]:
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode in (0, 5), run.stdout[-2000:] + run.stderr[-2000:]
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_the_fast_tier_keeps_single_redis_and_leaves_out_the_slow():
    folders = ["tests/store/test_one_group.py", "tests/cluster", "tests/faults",
               "tests/e2e/test_serve.py"]
    every = _collected(*folders)
    fast = _collected("-m", "not slow", *folders)
    assert any("[cluster" in t for t in every) and any("tests/faults/" in t for t in every)
    assert fast and all(t.startswith("tests/store/") for t in fast), fast
    assert not any("[cluster" in t for t in fast)
    assert {t for t in every if "[single" in t} == {t for t in fast if "[single" in t}

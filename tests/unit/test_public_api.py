"""The worker and trainer packages declare their public API in `__all__` and load it on first
use, so importing a package costs nothing it does not use (the trainer's torch above all)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._need import need


@pytest.mark.parametrize("package", ["sara_worker", "sara_trainer"])
def test_every_name_in_all_resolves(package):
    if package == "sara_trainer":
        need("torch", "torch (the trainer extra; CI installs it)")
    code = (f"import sys, {package} as p\n"
            "assert 'torch' not in sys.modules, 'the import alone loaded torch'\n"
            "light = [n for n in p.__all__ if n in ('TrainerConfig', 'WorkerConfig', 'main')]\n"
            "[getattr(p, n) for n in light]\n"
            "assert 'torch' not in sys.modules, 'a light name loaded torch'\n"
            "missing = [n for n in p.__all__ if getattr(p, n, None) is None]\n"
            "assert not missing, missing\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]

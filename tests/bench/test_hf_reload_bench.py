"""bench/hf_reload.py: the hf worker's load_policy timed in place and rebuilt, at CI size."""

from __future__ import annotations

import pytest

import re
import subprocess
import sys

from .test_allocation_bench import BENCH, _load

hf_reload = _load("bench_hf_reload", "hf_reload.py")


def test_the_other_copy_differs_only_in_its_config(tmp_path):
    from sara_demo.testbed import verified_testbed

    start = verified_testbed()
    same, other = hf_reload.copies(start, tmp_path)
    for name in ("model.safetensors", "tokenizer.json"):
        assert (same / name).read_bytes() == (start / name).read_bytes() == \
            (other / name).read_bytes()
    assert (same / "config.json").read_bytes() == (start / "config.json").read_bytes()
    assert (other / "config.json").read_bytes() != (start / "config.json").read_bytes()


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
def test_a_small_run_reports_both_kinds_of_load(tmp_path):
    out = tmp_path / "reload.txt"
    run = subprocess.run([sys.executable, str(BENCH / "hf_reload.py"), "--rounds", "4",
                          "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    medians = [float(m) for m in re.findall(r"median\s+([\d.]+) ms", text)]
    assert len(medians) == 2 and all(m > 0 for m in medians)
    assert "(4 loads)" in text and "rebuilt / copied" in text
    bad = subprocess.run([sys.executable, str(BENCH / "hf_reload.py"), "--rounds", "1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rounds must be at least 2" in bad.stderr

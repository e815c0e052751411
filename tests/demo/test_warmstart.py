"""The shipped warm start: its bytes are what the manifest says, a changed file is refused, and
its greedy held-out accuracy is the recorded one under any thread count and in a new process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from sara_demo.warmstart import (  # noqa: E402
    MANIFEST,
    WEIGHTS,
    read_manifest,
    shipped_dir,
    verified_warmstart,
)


def test_the_package_ships_a_complete_verified_warm_start():
    directory = verified_warmstart()
    manifest = read_manifest(directory)
    assert WEIGHTS in manifest["sha256"] and "config.json" in manifest["sha256"]
    assert manifest["command"].startswith("python -m sara_demo.warmstart")
    recipe = manifest["recipe"]
    assert recipe["steps"] + recipe["slip_steps"] == manifest["sft"]["steps"] > 0
    # the slips cost greedy accuracy: that is the room RL has
    assert manifest["heldout_greedy_accuracy"] < manifest["heldout_greedy_accuracy_before_slips"]
    assert 0.0 < manifest["heldout_greedy_accuracy"] < 1.0


def test_a_changed_weight_file_is_refused(tmp_path):
    copy = tmp_path / "ws"
    shutil.copytree(shipped_dir(), copy)
    data = bytearray((copy / WEIGHTS).read_bytes())
    data[-1] ^= 0x01
    (copy / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="SHA-256"):
        verified_warmstart(copy)
    (copy / MANIFEST).unlink()
    with pytest.raises(FileNotFoundError, match="rebuild"):
        verified_warmstart(copy)


ACCURACY = """
import json, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from sara_demo.evaluate import greedy_accuracy
from sara_demo.tasks.arith import make_eval_set
from sara_demo.warmstart import read_manifest, verified_warmstart
from sara_trainer.policy import load_policy
d = verified_warmstart()
model, tok = load_policy(d)
n = read_manifest(d)["recipe"]["eval_size"]
print(json.dumps(greedy_accuracy(model, tok, make_eval_set(n, seed=0))["accuracy"]))
"""


@pytest.mark.slow
def test_greedy_accuracy_is_the_recorded_one_for_one_and_two_threads_in_new_processes():
    recorded = read_manifest()["heldout_greedy_accuracy"]
    got = []
    for threads in (1, 2):
        proc = subprocess.run([sys.executable, "-c", ACCURACY, str(threads)], capture_output=True,
                              text=True, timeout=240, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    # the same bytes: greedy decoding can differ only where two logits tie to float rounding
    assert got[0] == pytest.approx(recorded, abs=0.002)
    assert got[1] == pytest.approx(recorded, abs=0.002)

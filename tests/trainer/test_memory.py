"""The trainer's memory estimate: the activation probe, checkpointing, and the first step's
estimate against what that step measurably took (a fresh process, so the heap holds nothing freed
by earlier tests that the step could reuse unseen)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from sara_trainer.memory import (activation_model, estimate_memory,  # noqa: E402
                                 fit_row_bytes)
from sara_trainer.policy import load_policy, make_batch  # noqa: E402
from sara_trainer.tiny import TinyConfig, build_tiny_policy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

FIRST_STEP = """
import sys
from pathlib import Path
import sara_client
from sara_demo.tasks.arith import make_split, target_completion
from sara_trainer.config import TrainerConfig
from sara_trainer.loop import Trainer
from sara_trainer.tiny import TinyConfig, build_tiny_policy

tmp = Path(sys.argv[1])
policy = build_tiny_policy(tmp / "tiny", TinyConfig(seed=0))
with sara_client.local(data_dir=tmp / "redis", redis_url=None, group_size=16, batch_size=16,
                       prefetch_batches=1, max_tokens=16, max_staleness=4) as sara:
    sara.add_prompts(make_split(64, seed=3, buckets=["add2", "add3"]))
    for _ in range(200):   # answer until the prefetch is full: alternate right and wrong
        lease = sara.lease("scripted", max_rollouts=256)
        if not lease.rollouts:
            break
        sara.report("scripted", [
            {"rollout_id": r.rollout_id, "policy_version": lease.policy.version,
             "reward": float(i % 2 == 0),
             "completion": (text := target_completion(r.prompt) if i % 2 == 0 else "x" * 12),
             "completion_tokens": len(text)}
            for i, r in enumerate(lease.rollouts)])
    config = TrainerConfig(model=str(policy), checkpoint_dir=str(tmp / "ckpt"), lr=1e-3,
                           checkpoint_every=100, batch_wait_s=0.0, threads=1,
                           max_steps=1, micro_batch_rollouts=512)
    assert len(Trainer(sara, config).run(timeout_s=30)) == 1
"""


def test_row_fit_separates_fixed_linear_and_square_parts():
    kept = [7000 + 300 * t + 2 * t * t for t in (16, 32, 64)]
    assert fit_row_bytes((16, 32, 64), kept) == pytest.approx((300.0, 2.0, 7000), abs=1e-6)
    # rounding that would make a part negative leaves it at 0
    assert all(part >= 0 for part in fit_row_bytes((16, 32, 64), [100, 90, 80]))


def test_probe_counts_what_autograd_keeps_and_grows_with_width(tmp_path):
    per_token = {}
    for width, heads in ((64, 2), (128, 4)):
        model, _ = load_policy(build_tiny_policy(tmp_path / str(width),
                                                 TinyConfig(width=width, heads=heads)))
        per_token[width] = activation_model(model, False, 1024).per_token
        # at least each of the 3 layers' input, in fp32
        assert per_token[width] >= 3 * width * 4
    assert 1.6 < per_token[128] / per_token[64] < 2.4     # linear in the width, as activations are


def test_checkpointing_keeps_less_and_the_head_chunk_is_capped(tiny):
    model, _ = tiny
    full = activation_model(model, False, chunk_rows=1024)
    ckpt = dataclasses.replace(full, checkpointing=True)
    assert ckpt.bytes_for(64, 40, 64 * 8) < full.bytes_for(64, 40, 64 * 8)
    # the head's chunk is no larger than the completion positions there are
    assert full.bytes_for(0, 0, 10) == 2 * 10 * full.vocab * 4 + full.fixed


def test_estimate_counts_adamw_and_the_largest_micro_batch(tiny):
    model, _ = tiny
    n = sum(p.numel() for p in model.parameters())
    acts = activation_model(model, False, chunk_rows=1024)
    small = make_batch([[1] * 5] * 2, [[2] * 3] * 2, 0)
    large = make_batch([[1] * 9] * 8, [[2] * 7] * 8, 0)
    e = estimate_memory(model, acts, [small, large, small], with_reference=True)
    assert e.params == e.grads == e.reference == 4 * n and e.optimizer == 8 * n
    assert e.activations == acts.bytes_for(8, 16, 8 * 7)
    assert e.line().endswith("total %.3f for micro-batches of up to 8 rows of 16 tokens"
                             % (e.total / 2 ** 30))


@pytest.mark.slow
def test_first_step_estimate_is_within_2x_of_what_it_measures(tmp_path):
    """The estimate said before the first step against the growth of the peak resident set over
    that step, in a process of its own (256 rows of a tiny GPT-2)."""
    run = subprocess.run([sys.executable, "-c", FIRST_STEP, str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    estimate = re.search(r"memory estimate \(GiB\): .*for micro-batches of up to (\d+) rows",
                         run.stdout)
    measured = re.search(r"memory measured over the first step \(GiB\): growth of the peak "
                         r"resident set ([\d.]+); the estimate of the same ([\d.]+)", run.stdout)
    assert estimate and measured, run.stdout
    assert int(estimate.group(1)) == 256
    grew, expected = float(measured.group(1)), float(measured.group(2))
    assert grew > 0.01, run.stdout          # the step's activations alone are tens of MB
    assert 0.5 <= expected / grew <= 2.0, run.stdout

"""`sara demo --quick`, end to end: scheduler (in-process, embedded Redis) + hf worker + trainer.

A short run (about a minute on 2 cores: 25 s of SFT on easy buckets, 3 RL steps of 8 groups):
the policy version advances, every batch is acked, the loss is finite, the worker reloads each
published checkpoint, and summary.json and chart.png exist and hold sane numbers.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
pytest.importorskip("sara_service")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STEPS, GROUPS, K = 3, 8, 8


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    cmd = [sys.executable, "-c", "from sara_service.cli import main; main()", "demo", "--quick",
           "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, json.loads((out / "summary.json").read_text())


def test_demo_trains_acks_and_publishes(demo_run):
    _, stdout, s = demo_run
    assert "held-out accuracy" in stdout
    rl = s["rl"]
    assert rl["steps"] == STEPS
    assert rl["policy_version"] == rl["published_version"] == STEPS  # one version per step
    assert rl["batches_acked"] == STEPS and rl["every_batch_acked"]
    assert rl["losses_finite"]
    assert rl["worker_policy_loads"] >= 1          # the worker reloaded published checkpoints
    assert rl["worker_errors"] == 0
    assert [h["step"] for h in s["history"]] == list(range(1, STEPS + 1))
    assert [h["policy_version"] for h in s["history"]] == list(range(1, STEPS + 1))
    assert all(math.isfinite(h["loss"]) for h in s["history"])


def test_demo_summary_numbers_are_sane(demo_run):
    _, _, s = demo_run
    acc, sched = s["accuracy"], s["scheduler"]
    for key in ("before_rl", "after_rl"):
        assert 0.0 <= acc[key] <= 1.0
    assert acc["n"] > 0
    assert sched["groups_delivered"] == STEPS * GROUPS
    assert sched["groups_committed"] >= sched["groups_delivered"]
    assert sched["rollouts_spent"] >= sched["groups_delivered"] * K
    assert sched["tokens_spent"] >= sched["rollouts_spent"]   # at least the eos of each
    assert 0.0 < sched["useful_fraction"] <= 1.0
    # DS pays k for every group SARA abandons; SARA paid fewer, and the difference is counted
    assert 0 <= sched["rollouts_saved_vs_ds"] <= sched["groups_abandoned"] * K
    assert s["history"][-1]["rollouts_cum"] <= sched["rollouts_spent"]
    assert s["sft"]["steps"] > 0 and s["wall_seconds"] > 0
    assert sum(s["prompt_pool"]["bucket_weights"].values()) == pytest.approx(1.0)


def test_demo_writes_chart_and_a_checkpoint_the_worker_loads(demo_run):
    out, _, s = demo_run
    chart = out / "chart.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert chart.stat().st_size > 10_000
    from sara_trainer.checkpoint import read_trainer_state
    from sara_worker.backends.hf import HFBackend

    state = read_trainer_state(s["rl"]["checkpoint"])
    assert (state["step"], state["policy_version"]) == (STEPS, STEPS)
    import asyncio

    from sara_client.models import Rollout, SamplingParams

    async def generate():
        backend = HFBackend(device="cpu", seed=0)
        try:
            await backend.load_policy(STEPS, s["rl"]["checkpoint"])
            rollout = Rollout(rollout_id="r", group_id="g", prompt_id="p", prompt="1+2=",
                              task="arith", sampling=SamplingParams(temperature=0, max_tokens=4))
            return await backend.generate(rollout, STEPS)
        finally:
            await backend.close()

    gen = asyncio.run(generate())
    assert gen.finish_reason in ("stop", "length") and gen.token_ids

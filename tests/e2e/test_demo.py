"""`sara demo --quick`, end to end: the shipped warm start, then RL with SARA and RL with Dynamic
Sampling, each through the scheduler (in-process, embedded Redis), an hf worker and the trainer.

A small run (about a minute and a half on 2 cores: both arms to 8,000 rollouts, 600 held-out
problems): held-out accuracy rises well beyond its noise, the DS arm ran to SARA's rollouts from
the same start, every batch is acked, the worker reloads each published checkpoint, and the
table, summary.json and chart.png show the measured comparison.
"""

from __future__ import annotations

import json
import os
import math
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
pytest.importorskip("sara_service")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

BUDGET, K = 8_000, 8


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    cmd = [sys.executable, "-c", "from sara_cli.main import main; main()", "demo", "--quick",
           "--out", str(out), "--report-to", "jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                          stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "160"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, json.loads((out / "summary.json").read_text())


def test_report_to_logs_each_arms_steps_and_held_out_evaluations(demo_run):
    out, _, s = demo_run
    for arm in ("sara", "dynamic_sampling"):
        lines = [json.loads(x) for x in (out / "runs" / arm / "metrics.jsonl").read_text()
                 .splitlines()]
        evals = [x for x in lines if "eval/heldout_accuracy" in x["metrics"]]
        steps = [x for x in lines if "train/loss" in x["metrics"]]
        assert evals[0]["step"] == 0 and len(evals) >= 2 and steps, arm
        assert evals[0]["metrics"]["eval/heldout_accuracy"] == \
            pytest.approx(s["accuracy"]["before_rl"])
        assert all("scheduler/rollouts_spent" in x["metrics"] for x in steps)


def test_accuracy_rises_beyond_four_standard_errors(demo_run):
    _, _, s = demo_run
    acc = s["accuracy"]
    assert s["warm_start"]["source"] == "shipped"
    gain = acc["after_rl"] - acc["before_rl"]
    noise = math.hypot(acc["standard_error_before"], acc["standard_error_after"])
    assert gain > 4 * noise, (acc["before_rl"], acc["after_rl"], noise)


def test_the_dynamic_sampling_arm_ran_from_the_same_start_to_the_same_rollouts(demo_run):
    _, stdout, s = demo_run
    sara, ds = s["arms"]["sara"], s["arms"]["dynamic_sampling"]
    assert (sara["policy"], ds["policy"]) == ("sara", "dynamic_sampling")
    assert sara["rollouts_spent"] >= BUDGET and ds["rollouts_spent"] >= BUDGET
    # DS ran to the rollouts SARA's trainer got (a last batch may overshoot by its own size)
    assert ds["evals"][-1]["rollouts_cum"] >= s["history"][-1]["rollouts_cum"]
    assert sara["evals"][0]["accuracy"] == ds["evals"][0]["accuracy"] == s["accuracy"]["before_rl"]
    # DS drops saturated groups, never abandons; SARA abandons
    assert ds["groups_abandoned"] == 0 < sara["groups_abandoned"]
    cmp = s["comparison"]
    assert cmp["ds_final_accuracy"] == ds["accuracy_after"]
    for name in ("ds_final", "halfway"):
        reached = cmp[f"rollouts_to_{name}"]
        assert reached["sara"] is None or 0 <= reached["sara"] <= sara["evals"][-1]["rollouts_cum"]
        assert 0 <= reached["ds"] <= ds["evals"][-1]["rollouts_cum"]   # DS reaches its own final
    for arm in (sara, ds):
        assert arm["rollouts_per_mixed_group"] >= K
    assert "Dynamic Sampling" in stdout and "rollouts to reach DS's final" in stdout


def test_demo_trains_acks_and_publishes(demo_run):
    _, _, s = demo_run
    rl = s["rl"]
    steps = rl["steps"]
    assert steps >= 1
    assert rl["policy_version"] == rl["published_version"] == steps  # one version per step
    assert rl["batches_acked"] == steps and rl["every_batch_acked"]
    assert rl["losses_finite"]
    assert rl["worker_policy_loads"] >= 1          # the worker reloaded published checkpoints
    assert rl["worker_errors"] == 0
    assert [h["step"] for h in s["history"]] == list(range(1, steps + 1))
    assert all(math.isfinite(h["loss"]) for h in s["history"])
    sched = s["scheduler"]
    assert sched["groups_delivered"] >= sched["groups_trained"] >= steps
    # one count of rollouts spent: what the trained steps cost, as the curve and the table say
    assert sched["rollouts_spent"] == s["history"][-1]["rollouts_cum"] == \
        s["arms"]["sara"]["rollouts_spent"]
    assert sched["rollouts_spent"] >= sched["groups_trained"] * K
    assert sched["tokens_spent"] >= sched["rollouts_spent"]   # at least the eos of each
    assert 0 <= sched["rollouts_not_spent_on_abandoned_groups"] <= sched["groups_abandoned"] * K


def test_demo_writes_chart_and_a_checkpoint_the_worker_loads(demo_run):
    out, _, s = demo_run
    chart = out / "chart.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert chart.stat().st_size > 10_000
    from sara_trainer.checkpoint import read_trainer_state
    from sara_worker.backends.hf import HFBackend

    steps = s["rl"]["steps"]
    state = read_trainer_state(s["rl"]["checkpoint"])
    assert (state["step"], state["policy_version"]) == (steps, steps)
    import asyncio

    from sara_client.models import Rollout, SamplingParams

    async def generate():
        backend = HFBackend(device="cpu", seed=0)
        try:
            await backend.load_policy(steps, s["rl"]["checkpoint"])
            rollout = Rollout(rollout_id="r", group_id="g", prompt_id="p", prompt="1+2=",
                              task="arith", sampling=SamplingParams(temperature=0, max_tokens=4))
            return await backend.generate(rollout, steps)
        finally:
            await backend.close()

    gen = asyncio.run(generate())
    assert gen.finish_reason in ("stop", "length") and gen.token_ids

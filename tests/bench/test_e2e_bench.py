"""bench/e2e.py: its bookkeeping, and a smoke run of two methods through the whole product path
(SFT, the real scheduler on an embedded Redis, the hf worker, the GRPO trainer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .test_allocation_bench import BENCH, _load

e2e = _load("bench_e2e", "e2e.py")


def test_accuracy_is_interpolated_between_evaluations():
    evals = [{"rollouts_cum": 0, "accuracy": 0.4}, {"rollouts_cum": 100, "accuracy": 0.5},
             {"rollouts_cum": 300, "accuracy": 0.3}]
    assert e2e.accuracy_at(evals, 0) == 0.4
    assert e2e.accuracy_at(evals, 50) == pytest.approx(0.45)
    assert e2e.accuracy_at(evals, 200) == pytest.approx(0.4)
    assert e2e.accuracy_at(evals, 301) is None  # past the curve: not extrapolated


def test_arguments_are_checked_and_quick_shrinks_the_defaults():
    quick = e2e.parse_args(["--quick"])
    full = e2e.parse_args([])
    assert quick.rollouts < full.rollouts and quick.sft_steps < full.sft_steps
    assert full.methods.split(",") == ["uniform", "ds", "sara", "sara+dps"]
    with pytest.raises(SystemExit):
        e2e.parse_args(["--methods", "sara,grpo"])
    with pytest.raises(SystemExit):
        e2e.parse_args(["--rollouts", "0"])


def test_each_method_sets_only_the_scheduler_policy_and_selection(tmp_path):
    args = e2e.parse_args(["--quick"])
    configs = {m: e2e.demo_config(args, m, "sft", tmp_path / m) for m in e2e.METHODS}
    assert {(c.policy, c.selection) for c in configs.values()} == {
        ("uniform", "epoch"), ("dynamic_sampling", "epoch"), ("sara", "epoch"), ("sara", "dps")}
    shapes = {(c.seed, c.lr, c.batch_groups, c.group_size, c.rollout_budget, c.start_from)
              for c in configs.values()}
    assert len(shapes) == 1  # everything else is shared


def test_quick_run_of_two_methods(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(BENCH / "e2e.py"), "--quick", "--methods", "ds,sara",
         "--rollouts", "600", "--max-steps", "4", "--out", str(out), "--work",
         str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((out / "e2e.json").read_text())
    rows = {r["method"]: r for r in result["methods"]}
    assert set(rows) == {"ds", "sara"}
    for row in rows.values():
        assert row["steps"] >= 1
        assert row["rollouts"] >= 600 or row["steps"] == 4  # stopped by budget or steps cap
        spent = [e["rollouts_cum"] for e in row["evals"]]
        assert spent[0] == 0 and spent == sorted(spent) and spent[-1] > 0
        assert all(0.0 <= e["accuracy"] <= 1.0 for e in row["evals"])
        assert row["groups_delivered"] > 0
        # DS and SARA deliver mixed groups only, and the trainer trained every one delivered
        assert row["groups_effective"] == row["groups_delivered"]
        assert row["rollouts_per_effective_group"] >= 8
    assert rows["sara"]["groups_abandoned"] > 0 and rows["ds"]["groups_abandoned"] == 0
    text = (out / "e2e.txt").read_text()
    assert "Dynamic Sampling" in text and "SARA" in text and "command:" in text
    assert (out / "e2e.png").stat().st_size > 10_000


def test_flat_pool_spreads_the_prompts_evenly_without_a_probe():
    from collections import Counter

    from sara_trainer.demo import DemoConfig, prompt_pool

    cfg = DemoConfig(pool="flat", prompts=300)
    prompts, shares = prompt_pool(None, None, cfg, ["add2", "sub2", "mul2"])  # no model needed
    assert shares == pytest.approx({"add2": 1 / 3, "sub2": 1 / 3, "mul2": 1 / 3})
    assert Counter(p["meta"]["bucket"] for p in prompts) == {"add2": 100, "sub2": 100, "mul2": 100}
    assert e2e.demo_config(e2e.parse_args(["--pool", "flat"]), "sara", None, Path(".")).pool == \
        "flat"

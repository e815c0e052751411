"""bench/e2e.py: its bookkeeping, and a smoke run of two methods through the whole product path
(SFT, the real scheduler on an embedded Redis, the hf worker, the GRPO trainer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .test_allocation_bench import BENCH, _load
from tests._need import need

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
    assert quick.rollouts < full.rollouts and quick.eval_size < full.eval_size
    assert full.methods.split(",") == ["uniform", "ds", "sara", "sara+dps"]
    assert (full.k, full.seeds, full.pool) == ([8, 16], [0, 1, 2], "flat")
    with pytest.raises(SystemExit):
        e2e.parse_args(["--methods", "sara,grpo"])
    with pytest.raises(SystemExit):
        e2e.parse_args(["--rollouts", "0"])


def test_each_method_sets_only_the_scheduler_policy_and_selection(tmp_path):
    args = e2e.parse_args(["--quick"])
    configs = {m: e2e.demo_config(args, m, 8, 0, tmp_path / m) for m in e2e.METHODS}
    assert {(c.policy, c.selection) for c in configs.values()} == {
        ("uniform", "epoch"), ("dynamic_sampling", "epoch"), ("sara", "epoch"), ("sara", "dps")}
    shapes = {(c.seed, c.lr, c.batch_groups, c.group_size, c.rollout_budget, c.start_from,
               c.compare) for c in configs.values()}
    assert len(shapes) == 1  # everything else is shared
    assert not configs["sara"].compare


def _curve(accs, step=1000):
    return [{"rollouts_cum": i * step, "tokens_cum": 3 * i * step, "seconds_cum": float(i),
             "accuracy": a} for i, a in enumerate(accs)]


def test_targets_and_ratios_come_from_each_seeds_ds_run():
    args = e2e.parse_args(["--k", "8", "--seeds", "0,1", "--methods", "ds,sara"])
    rows = []
    for seed, (ds_accs, sara_accs) in enumerate([([0.5, 0.6, 0.7], [0.5, 0.7, 0.72]),
                                                 ([0.5, 0.55, 0.6], [0.5, 0.6, 0.65])]):
        for method, accs in (("ds", ds_accs), ("sara", sara_accs)):
            rows.append({"method": method, "k": 8, "seed": seed, "accuracy_before": accs[0],
                         "accuracy_after": accs[-1], "evals": _curve(accs),
                         "rollouts_per_effective_group": 20.0})
    assert e2e.targets(rows, 8, 0) == pytest.approx({"ds_final": 0.7, "halfway": 0.6})
    summary = {e["method"]: e for e in e2e.summarise(rows, args)}
    # seed 0: SARA reaches 0.7 at 1000, DS at 2000; seed 1: 0.6 at 1000 vs 2000
    mean, half, n = summary["sara"]["ds_final_rollouts_cum"]
    assert (mean, half, n) == (pytest.approx(1000), pytest.approx(0), 2)
    ratio = summary["sara"]["ds_final_rollouts_cum_ratio"]
    assert ratio[0] == pytest.approx(0.5) and ratio[2] == 2
    assert summary["ds"]["ds_final_rollouts_cum_ratio"][0] == pytest.approx(1.0)
    assert e2e.mean_ci([1.0, 2.0, 3.0]) == (pytest.approx(2.0), pytest.approx(4.30 / 3 ** 0.5))
    text = e2e.format_table(e2e.summarise(rows, args), args)
    assert "to DS's final accuracy" in text and "x DS" in text


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
def test_quick_run_of_two_methods(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(BENCH / "e2e.py"), "--quick", "--methods", "ds,sara",
         "--rollouts", "1500", "--out", str(out), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((out / "e2e.json").read_text())
    rows = {r["method"]: r for r in result["runs"]}
    assert set(rows) == {"ds", "sara"}
    for row in rows.values():
        assert row["steps"] >= 1 and row["rollouts"] >= 1500
        spent = [e["rollouts_cum"] for e in row["evals"]]
        assert spent[0] == 0 and spent == sorted(spent) and spent[-1] > 0
        assert all(0.0 <= e["accuracy"] <= 1.0 for e in row["evals"])
        assert row["rollouts_per_effective_group"] >= 8
    text = (out / "e2e.txt").read_text()
    assert "Dynamic Sampling" in text and "SARA" in text and "command:" in text
    assert (out / "e2e.png").stat().st_size > 10_000


def test_flat_pool_spreads_the_prompts_evenly_without_a_probe():
    need("torch", "torch (the trainer extra; CI installs it)")
    from collections import Counter

    from sara_demo.config import DemoConfig
    from sara_demo.pool import prompt_pool

    cfg = DemoConfig(pool="flat", prompts=300)
    prompts, shares = prompt_pool(None, None, cfg, ["add2", "sub2", "mul2"])  # no model needed
    assert shares == pytest.approx({"add2": 1 / 3, "sub2": 1 / 3, "mul2": 1 / 3})
    assert Counter(p["meta"]["bucket"] for p in prompts) == {"add2": 100, "sub2": 100, "mul2": 100}
    assert e2e.demo_config(e2e.parse_args([]), "sara", 8, 0, Path(".")).pool == "flat"
    assert e2e.demo_config(e2e.parse_args(["--pool", "probe"]), "sara", 8, 0, Path(".")).pool \
        == "probe"

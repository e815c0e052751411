"""bench/_testbed_trained.py: what a testbed run trained on, from its per-step history."""

from __future__ import annotations

import pytest

from .test_allocation_bench import _load

_load("bench_e2e", "e2e.py")   # puts bench/ on sys.path for the modules below
trained = _load("_testbed_trained", "_testbed_trained.py")


def _step(step, pids, rewards, staleness=None, clip=None):
    return {"step": step, "prompt_ids": pids, "group_mean_rewards": rewards,
            "staleness_mean": staleness, "clip_frac": clip}


def test_a_runs_trained_groups_by_successes_prompts_and_lag():
    history = [_step(1, ["a", "b"], [0.25, 0.75], staleness=0.5, clip=0.1),
               _step(2, ["a", "c"], [0.25, 0.5], staleness=1.5, clip=None),
               _step(3, ["a", "d"], [1.0, 0.0])]          # past the first two steps
    t = trained.trained_summary(history, k=4, first_steps=2)
    assert t["groups"] == 6 and t["k"] == 4
    # successes of 4: a 1, b 3, a 1, c 2, a 4, d 0
    assert t["success_shares"] == pytest.approx([1 / 6, 2 / 6, 1 / 6, 1 / 6, 1 / 6])
    assert t["distinct_prompts"] == 4 and t["most_groups_one_prompt"] == 3
    assert (t["groups_first_steps"], t["distinct_prompts_first_steps"]) == (4, 3)
    assert t["staleness_mean"] == pytest.approx(1.0)     # steps without a figure left out
    assert t["clip_frac_mean"] == pytest.approx(0.1)


def test_a_history_without_group_figures_trains_on_nothing_it_can_name():
    t = trained.trained_summary([{"step": 1}], k=8)
    assert t["groups"] == 0 and t["distinct_prompts"] == 0 and t["most_groups_one_prompt"] == 0
    assert t["staleness_mean"] is None


def _run(method, seed, shares, distinct, groups=100, most=5):
    return {"method": method, "seed": seed, "trained": {
        "groups": groups, "k": 4, "success_shares": shares, "distinct_prompts": distinct,
        "most_groups_one_prompt": most, "first_steps": 10, "groups_first_steps": groups,
        "distinct_prompts_first_steps": distinct, "staleness_mean": 0.5,
        "clip_frac_mean": None}}


def test_the_table_gives_each_methods_figures_over_its_seeds():
    runs = [_run("ds", 0, [0, 0.5, 0, 0.5, 0], 80), _run("ds", 1, [0, 0.3, 0, 0.7, 0], 60),
            _run("sara_dps", 0, [0, 0.1, 0.1, 0.8, 0], 20, most=40),
            {"method": "old", "seed": 0}]                   # an older record: left out
    ds = trained.trained_figures(runs, "ds")
    assert ds["one_success"][0] == pytest.approx(0.4)
    assert ds["one_failure"][0] == pytest.approx(0.6)
    assert ds["success_rate"][0] == pytest.approx((0.5 * 1 + 0.5 * 3 + 0.3 + 0.7 * 3) / 8)
    assert ds["distinct_per_group_first_steps"][0] == pytest.approx(0.7)
    assert "clip_frac_mean" not in ds                         # no seed has one
    text = trained.format_trained(runs)
    rows = text.splitlines()[3:]
    assert [r.split()[0] for r in rows] == ["ds", "sara_dps"]
    assert "40 ± 0" in rows[1] and rows[0].rstrip().endswith("-")
    assert trained.format_trained([{"method": "ds", "seed": 0}]) == ""


def test_the_busiest_prompts_with_their_bucket_groups_and_steps():
    history = [_step(1, ["a", "b"], [0.25, 0.75]), _step(2, ["a", "c"], [0.5, 0.5]),
               _step(5, ["a", "b"], [0.75, 0.25])]
    busiest = trained.busiest_prompts_of(history, {"a": "sub3", "b": "add4"}, k=4, top=2)
    assert busiest == [
        {"id": "a", "bucket": "sub3", "groups": 3, "mean_successes": pytest.approx(2.0),
         "first_step": 1, "last_step": 5},
        {"id": "b", "bucket": "add4", "groups": 2, "mean_successes": pytest.approx(2.0),
         "first_step": 1, "last_step": 5}]
    assert trained.busiest_prompts_of(history, {}, k=4, top=3)[2]["bucket"] == "other"
    runs = [{"method": "sara", "busiest_prompts": busiest}, {"method": "ds"}]
    lines = trained.format_busiest(runs).splitlines()
    assert lines[1].split() == ["sara", "sub3:", "3,", "2.0"] and len(lines) == 2
    assert trained.format_busiest([{"method": "ds"}]) == ""

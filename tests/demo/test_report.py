"""The demo's table: side by side when the DS arm ran, and an estimate named as one without it."""

from __future__ import annotations

import pytest

pytest.importorskip("rich")

from sara_demo.compare import compare  # noqa: E402
from sara_demo.report import comparison_rows, render_table, summary_rows  # noqa: E402
from tests._need import need


def _curve(accs):
    return [{"accuracy": a, "rollouts_cum": 1000 * i, "tokens_cum": 4000 * i, "step": i}
            for i, a in enumerate(accs)]


def _arm(acc, evals, spent, delivered):
    return {"accuracy_after": acc, "rollouts_spent": spent, "tokens_spent": 4 * spent,
            "steps": 5, "rollouts_per_mixed_group": spent / delivered, "groups_committed": 10,
            "groups_abandoned": 30, "groups_delivered": delivered, "groups_opened": 50,
            "seconds": 12.0, "evals": evals}


def _summary(with_ds: bool):
    sara = _arm(0.70, _curve([0.5, 0.62, 0.70]), 2000, 100)
    ds = _arm(0.66, _curve([0.5, 0.58, 0.66]), 2000, 80)
    acc = {"before_rl": 0.5, "after_rl": 0.70, "n": 2000, "standard_error_before": 0.011,
           "standard_error_after": 0.010}
    summary = {"seed": 0, "backend": "hf", "accuracy": acc, "wall_seconds": 60.0,
               "rl": {"steps": 5, "policy_version": 5},
               "scheduler": {"rollouts_spent": 2000, "tokens_spent": 8000,
                             "groups_committed": 100, "groups_abandoned": 300,
                             "rollouts_per_effective_group": 20.0},
               "arms": {"sara": sara}, "comparison": None,
               "estimate": {"ds_rollouts_per_mixed_group": 23.4, "low": 21.0, "high": 26.0,
                            "false_abandon_rate": 0.25, "false_abandon_low": 0.12,
                            "false_abandon_high": 0.44, "audited_groups": 24,
                            "audit_cost_fraction": 0.02}}
    if with_ds:
        summary["arms"]["dynamic_sampling"] = ds
        summary["comparison"] = compare(0.5, 2000, sara, ds)
    return summary


def test_side_by_side_rows_come_from_both_arms():
    rows = {label: (a, b) for label, a, b in comparison_rows(_summary(True))}
    assert rows["held-out greedy accuracy after RL (± 1 s.e.)"] == ("70.0% ± 1.0", "66.0% ± 1.1")
    # DS first reached its final 66% at 2,000 rollouts; SARA at 1,500: 0.75x
    assert rows["rollouts to reach DS's final 66.0%"] == ("1,500 (0.75x DS)", "2,000")
    assert rows["rollouts per mixed group"] == ("20", "25")
    # SARA's live estimate of DS sits beside DS's measured figure, named an estimate
    assert rows["DS rollouts per mixed group: SARA's live ESTIMATE | measured"] == \
        ("23.4 (95% CI 21.0-26.0)", "25")
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render_table(_summary(True)))
    assert "every figure measured in this run (but the one marked ESTIMATE" in \
        " ".join(console.export_text().split())


def test_without_the_ds_arm_the_ds_figure_is_named_an_estimate():
    rows = dict(summary_rows(_summary(False)))
    assert rows["DS rollouts per mixed group (ESTIMATE, 95% CI)"] == "23.4 (95% CI 21.0-26.0)"
    assert rows["false abandons measured on audited groups (95% CI)"] == \
        "25.0% (12.0%-44.0%) of 24 audited; audit cost 2.0% of rollouts"
    early = _summary(False)
    early["estimate"] = {"ds_rollouts_per_mixed_group": None, "low": 15.0, "high": None}
    assert dict(summary_rows(early))["DS rollouts per mixed group (ESTIMATE, 95% CI)"] == \
        "no audit finished yet (95% CI 15.0-inf)"
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render_table(_summary(False)))
    assert "not a measurement" in " ".join(console.export_text().split())


def test_the_demo_shows_one_count_of_rollouts_spent():
    """The scheduler's counter also holds rollouts still in flight when RL stopped (16,868 in
    a run that trained on 15,924 of a 15,000 budget); the arm, its table row and the curve's
    last point all say what the trained steps cost."""
    from types import SimpleNamespace

    from sara_client.models import Counters
    from sara_demo.compare import arm_summary

    history = [{"step": 1, "rollouts_cum": 7_100, "tokens_cum": 21_000, "groups": 32},
               {"step": 2, "rollouts_cum": 15_924, "tokens_cum": 47_000, "groups": 32}]
    stats = SimpleNamespace(counters=Counters(rollouts_completed=16_868, tokens_generated=50_000,
                                              groups_delivered=80))
    arm = arm_summary("sara", "epoch", SimpleNamespace(step=2), stats, history,
                      _curve([0.5, 0.6, 0.7]), {"accuracy": 0.7, "by_bucket": {}}, 1.0)
    assert (arm["rollouts_spent"], arm["tokens_spent"]) == (15_924, 47_000)
    assert arm["rollouts_completed"] == 16_868 and arm["groups_trained"] == 64
    assert arm["rollouts_per_mixed_group"] == pytest.approx(15_924 / 64)
    summary = _summary(True)
    summary["arms"]["sara"] = {**summary["arms"]["sara"], **arm}
    rows = {label: (a, b) for label, a, b in comparison_rows(summary)}
    assert rows["rollouts spent"][0] == "15,924"


def test_the_demo_says_which_flow_settings_it_changes_from_the_services_and_why():
    need("torch", "torch (the trainer extra; CI installs it)")
    from sara_demo.arms import flow_note
    from sara_demo.config import DemoConfig
    from sara_service.settings import Settings

    note = flow_note(DemoConfig())
    defaults = Settings()
    assert note.startswith("flow control: 1 batch(es) in the making, groups at most 1 version")
    assert f"the service's defaults are {defaults.prefetch_batches} and " \
           f"{defaults.max_staleness}" in note
    assert flow_note(DemoConfig(prefetch_batches=defaults.prefetch_batches,
                                max_staleness=defaults.max_staleness)) is None

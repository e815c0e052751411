"""The demo's side-by-side figures: SARA against Dynamic Sampling, both measured in the same run.

Each arm is summarised by :func:`arm_summary` from what its RL phase recorded (the held-out
evaluations along the way, the trainer's steps, the scheduler's counters); :func:`compare` then
derives the comparison: accuracy at the end of each arm, and the rollouts (and tokens) SARA needed
to reach Dynamic Sampling's final accuracy, read off SARA's evaluation curve. Nothing here is an
estimate: every number comes from the two runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def crossing(evals: Sequence[dict[str, Any]], target: float, key: str = "rollouts_cum"
             ) -> float | None:
    """The first point where the evaluation curve reaches `target` accuracy, as a value of `key`
    (rollouts or tokens spent), linear between the two evaluations around it; None when the
    curve never reaches it. An evaluation at or above `target` at the start gives 0."""
    previous = None
    for point in evals:
        if point["accuracy"] >= target:
            if previous is None:
                return float(point[key])
            x0, y0 = float(previous[key]), previous["accuracy"]
            x1, y1 = float(point[key]), point["accuracy"]
            if y1 == y0:
                return x1
            return x0 + (target - y0) * (x1 - x0) / (y1 - y0)
        previous = point
    return None


def standard_error(accuracy: float, n: int) -> float:
    """Binomial standard error of an accuracy measured on `n` problems."""
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n) if n > 0 else math.nan


def spent(history: list[dict]) -> dict[str, int]:
    """What the steps trained cost: the rollouts and tokens the scheduler counted for their
    batches (each batch's `rollouts_spent`, abandoned groups' included), and the groups they
    held. The one count of rollouts spent the demo shows everywhere: the progress bar, the
    evaluation curve, the line after each arm, the table and the budget DS runs to. (The
    scheduler's own counter also holds what was still in flight when RL stopped.)"""
    last = history[-1] if history else {}
    return {"rollouts_spent": last.get("rollouts_cum", 0),
            "tokens_spent": last.get("tokens_cum", 0),
            "groups_trained": sum(h.get("groups", 0) for h in history)}


def arm_summary(policy: str, selection: str, trainer: Any, stats: Any, history: list[dict],
                evals: list[dict], after: dict[str, Any], seconds: float) -> dict[str, Any]:
    """One arm's measured figures (JSON-ready)."""
    c = stats.counters
    cost = spent(history)
    return {
        "policy": policy, "selection": selection,
        "steps": trainer.step, "seconds": seconds,
        "accuracy_after": after["accuracy"], "by_bucket_after": after["by_bucket"],
        **cost, "rollouts_completed": c.rollouts_completed,
        "groups_opened": c.groups_opened, "groups_committed": c.groups_committed,
        "groups_abandoned": c.groups_abandoned, "groups_delivered": c.groups_delivered,
        "groups_trained_mixed": sum(h.get("groups_mixed", 0) for h in history),
        "rollouts_per_mixed_group": (cost["rollouts_spent"] / cost["groups_trained"]
                                     if cost["groups_trained"] else None),
        "evals": evals,
    }


def _to(sara: dict[str, Any], ds: dict[str, Any], target: float, key: str
        ) -> dict[str, float | None]:
    """Rollouts (or tokens) each arm spent before its curve first reached `target`."""
    got = {"sara": crossing(sara["evals"], target, key), "ds": crossing(ds["evals"], target, key)}
    got["ratio"] = (got["sara"] / got["ds"] if got["sara"] is not None and got["ds"]
                    else None)
    return got


def compare(before: float, n: int, sara: dict[str, Any], ds: dict[str, Any]) -> dict[str, Any]:
    """SARA against DS from the two arms' summaries (same warm start, seed, pool and budget).

    Targets: DS's final accuracy, and halfway from the warm start to it. For each, the rollouts
    and tokens each arm spent before its evaluation curve first reached it (both read the same
    way, so a curve that plateaus early is not charged its whole budget) and SARA's ratio to DS."""
    final = ds["accuracy_after"]
    targets = {"ds_final": final, "halfway": before + (final - before) / 2}
    out: dict[str, Any] = {
        "before": before, "n": n, "standard_error_before": standard_error(before, n),
        "ds_final_accuracy": final, "targets": targets,
        "accuracy_difference": sara["accuracy_after"] - ds["accuracy_after"],
    }
    for name, target in targets.items():
        out[f"rollouts_to_{name}"] = _to(sara, ds, target, "rollouts_cum")
        out[f"tokens_to_{name}"] = _to(sara, ds, target, "tokens_cum")
    rs, rd = sara["rollouts_per_mixed_group"], ds["rollouts_per_mixed_group"]
    out["rollouts_per_mixed_group_ratio"] = rs / rd if rs and rd else None
    return out

"""What a testbed run trained on, beside how far it got: the groups its optimizer steps took,
by successes of k; how many distinct prompts gave them; how stale they were. Two methods can
deliver the same number of mixed groups a step and teach different amounts with them; these
figures are where the difference shows (docs/results.md, the testbed's "Why SARA + DPS
misses").

``trained_summary`` builds a run record's ``trained`` entry from the run's per-step history
(``sara_demo.rl``'s entries: the trainer's prompt ids and group mean rewards, its staleness and
clipped fraction); ``format_trained`` is the report's table over the runs that have one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from _stats import mean_ci

# the first optimizer steps, where every method has taken the same number of groups (16 a step)
FIRST_STEPS = 100


def trained_summary(history: list[dict[str, Any]], k: int,
                    first_steps: int = FIRST_STEPS) -> dict[str, Any]:
    """A run's trained groups: their share by successes of ``k`` (0/1 rewards: a group's mean
    reward times k), the distinct prompts among them over the run and over its first
    ``first_steps`` steps, the most groups one prompt gave, and the mean policy lag and clipped
    fraction of its steps."""
    groups = [(pid, reward) for h in history
              for pid, reward in zip(h.get("prompt_ids", []), h.get("group_mean_rewards", []))]
    early = [pid for h in history if h["step"] <= first_steps for pid in h.get("prompt_ids", [])]
    by_successes = Counter(round(reward * k) for _, reward in groups)
    per_prompt = Counter(pid for pid, _ in groups)
    return {"groups": len(groups), "k": k,
            "success_shares": [by_successes[i] / max(1, len(groups)) for i in range(k + 1)],
            "distinct_prompts": len(per_prompt),
            "most_groups_one_prompt": max(per_prompt.values(), default=0),
            "first_steps": first_steps, "groups_first_steps": len(early),
            "distinct_prompts_first_steps": len(set(early)),
            "staleness_mean": _mean_of(history, "staleness_mean"),
            "clip_frac_mean": _mean_of(history, "clip_frac")}


def busiest_prompts_of(history: list[dict[str, Any]], bucket_of: dict[str, str], k: int,
                       top: int = 3) -> list[dict[str, Any]]:
    """The ``top`` prompts that gave the run the most trained groups: each one's id, bucket,
    groups, their mean successes of ``k`` and the step of its first and last group (which
    prompts a method keeps coming back to, and when)."""
    steps: dict[str, list[int]] = {}
    successes: dict[str, list[float]] = {}
    for h in history:
        for pid, reward in zip(h.get("prompt_ids", []), h.get("group_mean_rewards", [])):
            steps.setdefault(pid, []).append(h["step"])
            successes.setdefault(pid, []).append(reward * k)
    ranked = sorted(steps, key=lambda pid: (-len(steps[pid]), pid))[:top]
    return [{"id": pid, "bucket": bucket_of.get(pid, "other"), "groups": len(steps[pid]),
             "mean_successes": sum(successes[pid]) / len(successes[pid]),
             "first_step": min(steps[pid]), "last_step": max(steps[pid])} for pid in ranked]


def format_busiest(runs: list[dict[str, Any]]) -> str:
    """Per method, the buckets of its seeds' busiest prompts and their groups; "" when no run
    records them."""
    recorded = [r for r in runs if r.get("busiest_prompts")]
    if not recorded:
        return ""
    lines = ["busiest prompt per seed (bucket: trained groups, mean successes of k)"]
    for method in dict.fromkeys(r["method"] for r in recorded):
        cells = [f"{b['bucket']}: {b['groups']}, {b['mean_successes']:.1f}"
                 for r in recorded if r["method"] == method for b in r["busiest_prompts"][:1]]
        lines.append(f"{method:<16}" + "; ".join(cells))
    return "\n".join(lines)


def _mean_of(history: list[dict[str, Any]], key: str) -> float | None:
    values = [h[key] for h in history if h.get(key) is not None]
    return sum(values) / len(values) if values else None


def trained_figures(runs: list[dict[str, Any]], method: str) -> dict[str, tuple[float, float]]:
    """One method's trained-group figures, each the mean and 95% half-width over the seeds whose
    record has ``trained``: the shares of groups with one success and with k - 1, the mean
    success rate of a trained group, distinct prompts per trained group over the first steps,
    the most groups one prompt gave, the mean staleness and the clipped fraction."""
    per_seed = [r["trained"] for r in runs if r["method"] == method and r.get("trained")
                and r["trained"]["groups"]]
    figures: dict[str, list[float]] = {name: [] for name in (
        "one_success", "one_failure", "success_rate", "distinct_per_group_first_steps",
        "most_groups_one_prompt", "staleness_mean", "clip_frac_mean")}
    for t in per_seed:
        shares, k = t["success_shares"], t["k"]
        figures["one_success"].append(shares[1])
        figures["one_failure"].append(shares[k - 1])
        figures["success_rate"].append(sum(i * s for i, s in enumerate(shares)) / k)
        figures["distinct_per_group_first_steps"].append(
            t["distinct_prompts_first_steps"] / max(1, t["groups_first_steps"]))
        figures["most_groups_one_prompt"].append(t["most_groups_one_prompt"])
        for name in ("staleness_mean", "clip_frac_mean"):
            if t[name] is not None:
                figures[name].append(t[name])
    return {name: mean_ci(values) for name, values in figures.items() if values}


def format_trained(runs: list[dict[str, Any]]) -> str:
    """The table of what each method trained on; "" when no run records it."""
    recorded = [r for r in runs if r.get("trained") and r["trained"]["groups"]]
    if not recorded:
        return ""
    k, first = recorded[0]["trained"]["k"], recorded[0]["trained"]["first_steps"]
    columns = (("one_success", f"1/{k} %", 100, ".1f"), ("one_failure", f"{k - 1}/{k} %", 100, ".1f"),
               ("success_rate", "success %", 100, ".1f"),
               ("distinct_per_group_first_steps", "distinct %", 100, ".1f"),
               ("most_groups_one_prompt", "most/prompt", 1, ".0f"),
               ("staleness_mean", "staleness", 1, ".2f"), ("clip_frac_mean", "clipped %", 100, ".2f"))
    head = f"{'method':<16}" + "".join(f"{label:>16}" for _, label, _, _ in columns)
    lines = [f"trained groups (mean ± 95% CI over seeds): share with 1 and {k - 1} successes of "
             f"{k}, mean success rate, distinct prompts per trained group over the first "
             f"{first} steps, most groups from one prompt, policy lag, clipped fraction",
             head, "-" * len(head)]
    for method in dict.fromkeys(r["method"] for r in recorded):
        cells = trained_figures(runs, method)
        lines.append(f"{method:<16}" + "".join(
            f"{_cell(cells.get(name), scale, fmt):>16}" for name, _, scale, fmt in columns))
    return "\n".join(lines)


def _cell(value: tuple[float, float] | None, scale: float, fmt: str) -> str:
    if value is None:
        return "-"
    mean, half = value
    return f"{format(mean * scale, fmt)} ± {format(half * scale, fmt)}"

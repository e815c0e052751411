"""The learning testbed's figures from its runs: the testbed criteria, each method's cost to the
two targets with per-seed ratios to DS, accuracy at equal rollouts, the text tables and chart.

Definitions (docs/benchmarks.md states them for readers):

- a run's **final accuracy** is the mean of its last two evaluations (one evaluation's standard
  error is about a point; two halve the variance of the end point);
- **targets**, per seed from DS's own run: DS's final accuracy, and halfway from the accuracy
  before RL to it; a method's cost to a target is read off its curve, linear between evaluations;
- **learning lasts until** the first evaluation within one standard error of the final accuracy;
  the **half-run gap** is (final - accuracy at half the run's steps) / standard error;
- **saturated** groups are the probe's all-fail plus all-success ones (``bench/_testbed.py``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _stats import first_crossing, mean_ci, value_at
from _testbed_trained import format_busiest, format_trained

# the Pilot-Commit arm (bench/_testbed.py's K32_ARM): its groups of 4k against DS and GRPO at 4k
K32_ARM = ("pilot_commit_k32", "ds_k32", "uniform_k32")

COSTS = ("rollouts", "tokens", "generation_s", "training_s")
RUN_SECONDS = 180   # the testbed's run-time criterion for a run of DS's budget
# the optimizer step at which the report also compares accuracy (every full run passes it)
EQUAL_STEPS = 100
TARGETS = {"ds_final": "DS's final accuracy", "halfway": "halfway from the start to it"}


def final_accuracy(run: dict[str, Any]) -> float:
    tail = run["curve"][-2:] if len(run["curve"]) > 2 else run["curve"][-1:]
    return sum(p["accuracy"] for p in tail) / len(tail)


def ds_run(runs: list[dict[str, Any]], seed: int) -> dict[str, Any] | None:
    """DS's run on `seed`, the reference every ratio in the report is taken against."""
    return next((r for r in runs if r["method"] == "ds" and r["seed"] == seed), None)


def targets(runs: list[dict[str, Any]], seed: int) -> dict[str, float] | None:
    ds = ds_run(runs, seed)
    if ds is None:
        return None
    final, start = final_accuracy(ds), ds["curve"][0]["accuracy"]
    return {"ds_final": final, "halfway": start + (final - start) / 2}


def cost_to(run: dict[str, Any], target: float, cost: str) -> float | None:
    return first_crossing([(p[cost], p["accuracy"]) for p in run["curve"]], target)


def mixed_groups_of_k(run: dict[str, Any]) -> float:
    """The run's mixed groups, counted in groups of k: a group of n rollouts as n / k
    (Pilot-Commit delivers groups of 4k, var_k groups of any size)."""
    if run.get("rollouts_mixed"):     # recorded with var_k's: rollouts in mixed groups
        return run["rollouts_mixed"] / run["protocol"]["k"]
    if "group_rollouts" not in run:   # recorded before Pilot-Commit: every group was k
        return run["groups_mixed"]
    return run["groups_mixed"] * run["group_rollouts"] / run["protocol"]["k"]


def method_summary(runs: list[dict[str, Any]], method: str, budget: int) -> dict[str, Any]:
    """One method's figures over its seeds; each a (mean, 95% half-width[, seeds]) tuple."""
    mine = [r for r in runs if r["method"] == method]
    out: dict[str, Any] = {"method": method, "label": mine[0]["label"] if mine else method,
                           "seeds": sorted(r["seed"] for r in mine),
                           "lr": sorted({r["lr"] for r in mine})}
    for name in TARGETS:
        for cost in COSTS:
            got, ratios = [], []
            for r in mine:
                t = targets(runs, r["seed"])
                value = cost_to(r, t[name], cost) if t else None
                if value is None:
                    continue
                got.append(value)
                ds = next(d for d in runs if d["method"] == "ds" and d["seed"] == r["seed"])
                base = cost_to(ds, t[name], cost)
                if base:
                    ratios.append(value / base)
            out[f"{name}_{cost}"] = (*mean_ci(got), len(got))
            out[f"{name}_{cost}_ratio"] = (*mean_ci(ratios), len(ratios))
        out[f"{name}_rollouts_ratio_at_least"] = censored_ratio(runs, mine, name)
    for frac in (0.5, 1.0):
        accs = [value_at([(p["rollouts"], p["accuracy"]) for p in r["curve"]], frac * budget)
                for r in mine]
        out[f"acc_at_{frac:g}"] = mean_ci([a if a is not None else final_accuracy(r)
                                           for a, r in zip(accs, mine)])
    out["final_accuracy"] = mean_ci([final_accuracy(r) for r in mine])
    out["rollouts_per_mixed_group"] = mean_ci([r["rollouts"] / max(1, mixed_groups_of_k(r))
                                               for r in mine])
    # equal optimizer steps separates what a batch teaches from what it costs
    at_steps = [value_at([(p["steps"], p["accuracy"]) for p in r["curve"]], EQUAL_STEPS)
                for r in mine]
    out["acc_at_steps"] = mean_ci([a for a in at_steps if a is not None])
    out["generation_ms_per_rollout"] = mean_ci(
        [1000 * r["curve"][-1]["generation_s"] / max(1, r["curve"][-1]["rollouts"]) for r in mine])
    out["steps"] = mean_ci([r["steps"] for r in mine])
    out["seconds"] = mean_ci([r["seconds"] for r in mine])
    return out


def censored_ratio(runs: list[dict[str, Any]], mine: list[dict[str, Any]], name: str
                   ) -> tuple[float, float, int, int]:
    """(mean, 95% half-width, seeds, seeds that never reached the target) of the per-seed ratio
    of rollouts to target `name` over DS's, over *every* seed with a DS run: a seed that never
    reached the target counts with all the rollouts it spent, so the mean is a lower bound of
    the ratio, where the mean over the seeds that reached it alone favours a method that
    reaches it rarely."""
    ratios, missed = [], 0
    for r in mine:
        t = targets(runs, r["seed"])
        ds = ds_run(runs, r["seed"])
        base = cost_to(ds, t[name], "rollouts") if t and ds else None
        if not base:
            continue
        value = cost_to(r, t[name], "rollouts")
        if value is None:
            missed += 1
            value = r["curve"][-1]["rollouts"]
        ratios.append(value / base)
    return (*mean_ci(ratios), len(ratios), missed)


def learning_lasts(run: dict[str, Any]) -> dict[str, float]:
    """A run's lasting-learning figures: the step learning lasts until, the half-run gap in
    standard errors, and the gain from the start to the final accuracy."""
    curve, final = run["curve"], final_accuracy(run)
    se = curve[-1]["accuracy_se"] or 1e-9
    until = next(p["steps"] for p in curve if p["accuracy"] >= final - se)
    half = value_at([(p["steps"], p["accuracy"]) for p in curve], curve[-1]["steps"] / 2)
    return {"rising_until_step": until, "steps": curve[-1]["steps"],
            "half_run_gap_se": (final - (half if half is not None else final)) / se,
            "gain": final - curve[0]["accuracy"]}


def criteria(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The testbed's own criteria, measured: lasting learning under DS, saturation under uniform,
    pool revisits and run time over every run; each with its pass flag."""
    ds = [learning_lasts(r) for r in runs if r["method"] == "ds"]
    uniform = [r for r in runs if r["method"] == "uniform"]
    saturated = [p["frac_all_fail"] + p["frac_all_success"] for r in uniform for p in r["curve"]]
    both = all(p["frac_all_fail"] > 0 and p["frac_all_success"] > 0
               for r in uniform for p in r["curve"])
    moves: Counter[str] = Counter()
    for r in uniform:
        moves.update(r["transitions"])
    out = {
        "ds_learning": ds,
        "ds_learning_pass": bool(ds) and all(
            d["rising_until_step"] >= 100 and d["half_run_gap_se"] >= 3 and d["gain"] >= 0.10
            for d in ds),
        "uniform_min_saturated": min(saturated) if saturated else math.nan,
        "uniform_saturation_pass": bool(saturated) and min(saturated) >= 0.3 and both,
        "uniform_transitions": dict(moves),
        "min_pool_revisits": min((r["pool_revisits"] for r in runs), default=math.nan),
        "max_run_seconds": max((r["seconds"] for r in runs), default=math.nan),
    }
    out["revisit_pass"] = out["min_pool_revisits"] >= 4
    # three minutes for DS's budget, in proportion for a run that may spend more
    out["revisits_below"] = misses(runs, "pool_revisits", lambda r: r["pool_revisits"] < 4)
    out["runs_over"] = misses(runs, "seconds",
                              lambda r: r["seconds"] > RUN_SECONDS * run_share(r))
    out["run_time_pass"] = not out["runs_over"]
    return out


def run_share(run: dict[str, Any]) -> float:
    """The run's budget over DS's (1 for a run recorded before others ran on past DS's)."""
    ds_budget = (run.get("protocol") or {}).get("rollouts")
    return run["budget"] / ds_budget if run.get("budget") and ds_budget else 1.0


def misses(runs: list[dict[str, Any]], field: str,
           missed: Callable[[dict[str, Any]], bool]) -> dict[str, dict[str, Any]]:
    """Per method with a run that `missed` the criterion: how many of its runs, of how many, and
    the range of `field` over those, so a criterion's failure names who fails it."""
    out: dict[str, dict[str, Any]] = {}
    for method in dict.fromkeys(r["method"] for r in runs):
        mine = [r for r in runs if r["method"] == method]
        values = [r[field] for r in mine]
        bad = [r[field] for r in mine if missed(r)]
        if bad:
            out[method] = {"runs": len(bad), "of": len(values), "min": min(bad), "max": max(bad)}
    return out


def _named_misses(found: dict[str, dict[str, Any]], unit: str) -> str:
    if not found:
        return ""
    digits = 0 if unit else 1   # seconds whole, revisits to a tenth
    return "; missed by " + ", ".join(
        f"{m} {d['runs']}/{d['of']} ({d['min']:.{digits}f}-{d['max']:.{digits}f}{unit})"
        for m, d in found.items())


def target_ratios(summary: list[dict[str, Any]], runs: list[dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """The targets, from the summary: each ratio with its interval and verdict; with `runs`,
    also SARA + DPS's final accuracy against DS's, the busiest prompt against DS's, and the
    configuration `recommended` should name."""
    by = {s["method"]: s for s in summary}
    out: dict[str, Any] = {}
    for method, bound in (("sara", 0.8), ("sara_dps", 0.6), ("recommended", 0.5)):
        if method in by:
            mean, half, n = by[method]["ds_final_rollouts_ratio"]
            low, low_half, seeds, missed = by[method]["ds_final_rollouts_ratio_at_least"]
            # met only when every seed reached DS's final accuracy: a ratio over the seeds that
            # reached it alone would pass a method that rarely does
            out[f"{method}_vs_ds"] = {
                "ratio": mean, "ci95": half, "seeds": n, "bound": bound,
                "ratio_at_least": low, "ratio_at_least_ci95": low_half,
                "seeds_not_reached": missed,
                "met": bool(missed == 0 and mean == mean and mean + half <= bound),
                "met_at_mean": bool(missed == 0 and mean == mean and mean <= bound)}
    if "recommended_vs_ds" in out:   # its interval's upper end must also stay below 0.8
        rec = out["recommended_vs_ds"]
        rec["met"] = bool(rec["met_at_mean"] and rec["ratio"] + rec["ci95"] < 0.8)
    if runs is not None:
        out.update(final_against_ds(runs, "sara_dps", points=0.01))
        out["busiest_prompt"] = busiest_against_ds(runs)
        out["recommend"] = recommend(summary)
    if "sara" in by and "uniform_matched" in by:
        sara, matched = by["sara"]["ds_final_rollouts"], by["uniform_matched"]["ds_final_rollouts"]
        out["sara_below_uniform_matched"] = {
            "sara": sara[:2], "uniform_matched": matched[:2],
            "met": bool(sara[0] == sara[0] and (matched[0] != matched[0] or sara[0] < matched[0]))}
    return out


def accuracy_at_ds_end(run: dict[str, Any], ds: dict[str, Any]) -> float:
    """`run`'s accuracy where DS's final accuracy is read: at the rollouts of DS's last two
    evaluations (linear between `run`'s own), averaged as final_accuracy averages DS's; a run
    that stopped short counts its last value."""
    tail = ds["curve"][-2:] if len(ds["curve"]) > 2 else ds["curve"][-1:]
    curve = [(p["rollouts"], p["accuracy"]) for p in run["curve"]]
    values = [value_at(curve, p["rollouts"]) for p in tail]
    return sum(v if v is not None else curve[-1][1] for v in values) / len(values)


def final_against_ds(runs: list[dict[str, Any]], method: str, points: float
                     ) -> dict[str, Any]:
    """Whether `method` ends within `points` of DS's final accuracy or above it, at equal
    rollouts (every method but DS runs on past DS's budget): the per-seed gap (its accuracy at
    DS's end minus DS's final), its mean and 95% interval; met when the interval's lower end is
    above -points."""
    gaps = []
    for r in runs:
        ds = ds_run(runs, r["seed"])
        if r["method"] == method and ds is not None:
            gaps.append(accuracy_at_ds_end(r, ds) - final_accuracy(ds))
    if not gaps:
        return {}
    mean, half = mean_ci(gaps)
    return {f"{method}_final_vs_ds": {"gap": mean, "ci95": half, "seeds": len(gaps),
                                      "bound": -points, "met": bool(mean - half >= -points),
                                      "met_at_mean": bool(mean >= -points)}}


def busiest_against_ds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method, the largest ratio over seeds of its busiest prompt's trained groups to DS's
    busiest in the same seed; met when no method's exceeds 2.

    A method that runs on past DS's budget, or trains more groups per rollout, trains more
    groups in all, and its busiest prompt with them: ``worst_ratio_per_group`` compares each
    busiest prompt's share of its run's trained groups instead (met the same way)."""
    worst: dict[str, float] = {}
    per_group: dict[str, float] = {}
    for r in runs:
        ds = ds_run(runs, r["seed"])
        mine, base = (x.get("trained") or {} for x in (r, ds or {}))
        if r["method"] == "ds" or not (mine.get("most_groups_one_prompt")
                                       and base.get("most_groups_one_prompt")):
            continue
        ratio = mine["most_groups_one_prompt"] / base["most_groups_one_prompt"]
        worst[r["method"]] = max(worst.get(r["method"], 0.0), ratio)
        if mine.get("groups") and base.get("groups"):
            shared = ratio * base["groups"] / mine["groups"]
            per_group[r["method"]] = max(per_group.get(r["method"], 0.0), shared)
    return {"worst_ratio": worst, "bound": 2.0,
            "met": bool(worst) and all(v <= 2.0 for v in worst.values()),
            "over": sorted(m for m, v in worst.items() if v > 2.0),
            "worst_ratio_per_group": per_group,
            "met_per_group": bool(per_group) and all(v <= 2.0 for v in per_group.values()),
            "over_per_group": sorted(m for m, v in per_group.items() if v > 2.0)}


def recommend(summary: list[dict[str, Any]], share: float = 0.8) -> dict[str, Any]:
    """The configuration `recommended` should name: fewest rollouts to DS's final accuracy (the
    mean per-seed ratio) among the methods that reach it on at least `share` of their seeds."""
    eligible = {}
    for e in summary:
        mean, _, reached = e["ds_final_rollouts_ratio"]
        seeds = len(e["seeds"])
        if e["method"] not in ("ds", "recommended") and seeds and reached / seeds >= share \
                and mean == mean:
            eligible[e["method"]] = mean
    best = min(eligible, key=eligible.get) if eligible else None
    return {"method": best, "ratio": eligible.get(best), "eligible": eligible, "share": share}


def arm_summary(runs: list[dict[str, Any]], reference: str, members: tuple[str, ...]
                ) -> list[dict[str, Any]]:
    """An arm compared within itself (the Pilot-Commit arm at its group size): each member's
    final accuracy, and its rollouts to `reference`'s final accuracy per seed over the
    reference's, with the seeds that reached it."""
    out = []
    for method in members:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        ratios, reached = [], 0
        for r in mine:
            ref = next((d for d in runs if d["method"] == reference and d["seed"] == r["seed"]),
                       None)
            if ref is None:
                continue
            target = final_accuracy(ref)
            base, value = cost_to(ref, target, "rollouts"), cost_to(r, target, "rollouts")
            if value is not None and base:
                reached += 1
                ratios.append(value / base)
        out.append({"method": method, "label": mine[0]["label"], "seeds": len(mine),
                    "final_accuracy": mean_ci([final_accuracy(r) for r in mine]),
                    "ratio_to_reference": (*mean_ci(ratios), reached), "reference": reference})
    return out


def format_arm(arm: list[dict[str, Any]]) -> str:
    """The arm's table; "" when none of its methods ran."""
    if not arm:
        return ""
    ref = arm[0]["reference"]
    head = f"{'method':<24}{'final %':>16}{f'x {ref} to its final':>26}{'reached':>10}"
    lines = [f"the arm at its own group size (ratios to {ref}, mean ± 95% CI over seeds)", head,
             "-" * len(head)]
    for e in arm:
        ratio = e["ratio_to_reference"]
        lines.append(f"{e['label']:<24}{_ci(e['final_accuracy'], 100, '.1f'):>16}"
                     f"{_ci(ratio, 1, '.2f'):>26}{ratio[2]:>5}/{e['seeds']:<4}")
    return "\n".join(lines)


def _ci(v: tuple, scale: float = 1.0, fmt: str = ",.0f") -> str:
    if v[0] != v[0]:
        return "not reached"
    return f"{format(v[0] * scale, fmt)} ± {format(v[1] * scale, fmt)}"


def format_tables(summary: list[dict[str, Any]], crit: dict[str, Any]) -> str:
    """The tables of the text report."""
    lines = []
    for name, title in TARGETS.items():
        head = (f"{'method':<24}{'lr':>8}{'rollouts':>18}{'x DS':>13}{'seeds':>7}"
                f"{'tokens':>22}{'gen s':>16}{'train s':>16}")
        lines += [f"to {title} (mean ± 95% CI over seeds; x DS: per-seed ratio)", head,
                  "-" * len(head)]
        for e in summary:
            r = e[f"{name}_rollouts"]
            lines.append(
                f"{e['label']:<24}{'/'.join(f'{x:g}' for x in e['lr']):>8}{_ci(r):>18}"
                f"{_ci(e[f'{name}_rollouts_ratio'], 1, '.2f'):>13}{r[2]:>3}/{len(e['seeds']):<3}"
                f"{_ci(e[f'{name}_tokens']):>22}{_ci(e[f'{name}_generation_s'], 1, '.1f'):>16}"
                f"{_ci(e[f'{name}_training_s'], 1, '.1f'):>16}")
        lines.append("")
    head = (f"{'method':<24}{'acc @ half':>14}{'acc @ budget':>14}{'final':>14}"
            f"{f'@ {EQUAL_STEPS} steps':>14}{'rollouts/mixed':>16}{'gen ms/rollout':>16}"
            f"{'steps':>12}{'run s':>10}")
    lines += ["accuracy at equal rollouts (%, mean ± 95% CI)", head, "-" * len(head)]
    for e in summary:
        lines.append(f"{e['label']:<24}{_ci(e['acc_at_0.5'], 100, '.1f'):>14}"
                     f"{_ci(e['acc_at_1'], 100, '.1f'):>14}"
                     f"{_ci(e['final_accuracy'], 100, '.1f'):>14}"
                     f"{_ci(e['acc_at_steps'], 100, '.1f'):>14}"
                     f"{_ci(e['rollouts_per_mixed_group'], 1, '.1f'):>16}"
                     f"{_ci(e['generation_ms_per_rollout'], 1, '.2f'):>16}"
                     f"{_ci(e['steps'], 1, '.0f'):>12}{_ci(e['seconds'], 1, '.0f'):>10}")
    return "\n".join(lines + ["", format_criteria(crit)])


def format_report(summary: list[dict[str, Any]], crit: dict[str, Any],
                  runs: list[dict[str, Any]]) -> str:
    """The whole text report after the header: tables, criteria, then one line per run."""
    extra = [t for t in (format_bucket_shares(runs), format_bucket_gains(runs),
                         format_bucket_gains(runs, at_ds_budget=True), format_at_ds_budget(runs),
                         format_trained(runs),
                         format_busiest(runs),
                         format_arm(arm_summary(runs, "ds_k32", K32_ARM))) if t]
    return "\n\n".join([format_tables(summary, crit), format_runs(runs), *extra])


def format_runs(runs: list[dict[str, Any]]) -> str:
    """One line per run: its learning rate, steps, cost to DS's final accuracy and ratio."""
    head = (f"{'method':<24}{'seed':>5}{'lr':>8}{'steps':>7}{'start':>8}{'final':>8}"
            f"{'rollouts to DS final':>22}{'x DS':>7}{'revisits':>10}{'run s':>7}")
    lines = ["per run (test split)", head, "-" * len(head)]
    for r in sorted(runs, key=lambda r: (r["method"], r["seed"])):
        t = targets(runs, r["seed"])
        spent = cost_to(r, t["ds_final"], "rollouts") if t else None
        ds = ds_run(runs, r["seed"])
        base = cost_to(ds, t["ds_final"], "rollouts") if t and ds else None
        ratio = f"{spent / base:.2f}" if spent is not None and base else "-"
        lines.append(f"{r['label']:<24}{r['seed']:>5}{r['lr']:>8g}{r['steps']:>7}"
                     f"{100 * r['curve'][0]['accuracy']:>7.1f}%{100 * final_accuracy(r):>7.1f}%"
                     f"{'not reached' if spent is None else f'{spent:,.0f}':>22}{ratio:>7}"
                     f"{r['pool_revisits']:>10.1f}{r['seconds']:>7.0f}")
    return "\n".join(lines)


def bucket_shares(runs: list[dict[str, Any]], method: str) -> dict[str, tuple[float, float]]:
    """Each bucket's share of the method's committed (mixed, trained) groups, mean and 95%
    half-width over the seeds whose record has ``by_bucket``."""
    per_seed = []
    for r in runs:
        if r["method"] == method and r.get("by_bucket"):
            total = sum(b["committed"] for b in r["by_bucket"].values()) or 1
            per_seed.append({k: b["committed"] / total for k, b in r["by_bucket"].items()})
    names = sorted({k for shares in per_seed for k in shares})
    return {k: mean_ci([shares.get(k, 0.0) for shares in per_seed]) for k in names}


def format_bucket_shares(runs: list[dict[str, Any]]) -> str:
    """Where each method's trained groups come from: % of its committed groups per bucket."""
    methods = list(dict.fromkeys(r["method"] for r in runs if r.get("by_bucket")))
    return _bucket_table(
        "committed (trained) groups by bucket (% of the method's, mean ± 95% CI)",
        {m: bucket_shares(runs, m) for m in methods}, missing="0.0 ± 0.0")


def _bucket_table(title: str, table: dict[str, dict[str, tuple[float, float]]], missing: str,
                  counts: tuple[str, dict[str, int]] | None = None) -> str:
    """A method-by-bucket table of percentages (mean ± 95% CI), `missing` where a method has
    no figure for a bucket, under an optional row of counts; "" when there is no bucket."""
    buckets = sorted({b for cells in table.values() for b in cells})
    if not buckets:
        return ""
    head = f"{'method':<16}" + "".join(f"{b:>12}" for b in buckets)
    lines = [title, head, "-" * len(head)]
    if counts:
        label, values = counts
        lines.append(f"{label:<16}" + "".join(f"{values.get(b, 0):>12}" for b in buckets))
    for m, cells in table.items():
        lines.append(f"{m:<16}" + "".join(
            f"{_ci(cells[b], 100, '.1f') if b in cells else missing:>12}" for b in buckets))
    return "\n".join(lines)


def bucket_gains(runs: list[dict[str, Any]], method: str, at_ds_budget: bool = False
                 ) -> dict[str, tuple[float, float]]:
    """Each bucket's held-out accuracy gain from the start to the run's end (or, with
    `at_ds_budget`, to the rollouts DS spent in the same seed, linear between evaluations: a
    run longer than DS's is then compared at equal cost), mean and 95% half-width over the seeds
    whose record has ``accuracy_by_bucket`` (and, at DS's budget, a DS run)."""
    per_seed = []
    for r in runs:
        if r["method"] != method or not r.get("accuracy_by_bucket"):
            continue
        first, last = r["accuracy_by_bucket"][0], r["accuracy_by_bucket"][-1]
        if at_ds_budget:
            ds = ds_run(runs, r["seed"])
            if ds is None:
                continue
            last = _buckets_at(r, ds["curve"][-1]["rollouts"])
        per_seed.append({k: last[k] - first[k] for k in last if k in first})
    names = sorted({k for gains in per_seed for k in gains})
    return {k: mean_ci([g[k] for g in per_seed if k in g]) for k in names}


def _buckets_at(run: dict[str, Any], rollouts: float) -> dict[str, float]:
    """The run's held-out accuracy per bucket at `rollouts`, linear between its evaluations (its
    last value past its end)."""
    points = [(p["rollouts"], acc) for p, acc in zip(run["curve"], run["accuracy_by_bucket"])
              if acc]
    found = {}
    for bucket in points[-1][1]:
        curve = [(x, acc[bucket]) for x, acc in points if bucket in acc]
        value = value_at(curve, rollouts)
        found[bucket] = curve[-1][1] if value is None else value
    return found


def format_bucket_gains(runs: list[dict[str, Any]], at_ds_budget: bool = False) -> str:
    """Where each method's held-out accuracy comes from: its gain per bucket, in points, to the
    run's end or (`at_ds_budget`) to DS's rollouts in the same seed."""
    recorded = [r for r in runs if r.get("accuracy_by_bucket")]
    if not recorded:
        return ""
    methods = list(dict.fromkeys(r["method"] for r in recorded))
    where = "at DS's budget (equal rollouts)" if at_ds_budget else "start to end"
    return _bucket_table(
        f"held-out accuracy gain by bucket, {where} (points, mean ± 95% CI)",
        {m: bucket_gains(runs, m, at_ds_budget) for m in methods}, missing="-",
        counts=("test problems", recorded[0]["problems_by_bucket"]))


def at_ds_budget(runs: list[dict[str, Any]], method: str) -> dict[str, tuple[float, float]]:
    """What a method's groups cost, per seed with a DS run, mean and 95% half-width: its
    optimizer steps at the rollouts DS spent (× DS's steps; a step is B trained groups, so this
    is trained groups per rollout against DS's), rollouts per trained group there, the share of
    the groups it opened that were trained, and its passes through the pool (``pool_revisits``,
    counted against the pool size asked)."""
    figures: dict[str, list[float]] = {"steps_x_ds": [], "rollouts_per_group": [],
                                       "trained_share": [], "revisits": []}
    for r in runs:
        ds = ds_run(runs, r["seed"])
        if r["method"] != method or ds is None:
            continue
        budget = ds["curve"][-1]["rollouts"]
        steps = value_at([(p["rollouts"], p["steps"]) for p in r["curve"]], budget)
        steps = r["curve"][-1]["steps"] if steps is None else steps
        figures["steps_x_ds"].append(steps / ds["curve"][-1]["steps"])
        if r.get("protocol") and steps:   # a record without its protocol has no batch size
            figures["rollouts_per_group"].append(budget / (r["protocol"]["batch_groups"] * steps))
        if r.get("trained") and r.get("groups_opened"):
            figures["trained_share"].append(r["trained"]["groups"] / r["groups_opened"])
        figures["revisits"].append(r["pool_revisits"])
    return {name: mean_ci(values) for name, values in figures.items() if values}


def format_at_ds_budget(runs: list[dict[str, Any]]) -> str:
    """The table of `at_ds_budget` for every method with a DS run in its seeds."""
    table = {m: cells for m in dict.fromkeys(r["method"] for r in runs)
             if (cells := at_ds_budget(runs, m))}
    if not table:
        return ""
    columns = (("steps_x_ds", "steps x DS", 1, ".2f"), ("rollouts_per_group", "rollouts/group",
               1, ".1f"), ("trained_share", "trained/opened %", 100, ".1f"),
               ("revisits", "pool passes", 1, ".1f"))
    head = f"{'method':<18}" + "".join(f"{label:>18}" for _, label, _, _ in columns)
    lines = ["at DS's budget in the same seed (mean ± 95% CI): optimizer steps x DS's, rollouts per "
             "trained group; over the whole run: the share of opened groups trained, pool passes",
             head, "-" * len(head)]
    for m, cells in table.items():
        lines.append(f"{m:<18}" + "".join(
            f"{_ci(cells[name], scale, fmt) if name in cells else '-':>18}"
            for name, _, scale, fmt in columns))
    return "\n".join(lines)


def _saturation_line(crit: dict[str, Any], flag: Callable[[bool], str]) -> str:
    if math.isnan(crit["uniform_min_saturated"]):
        return "  saturation under uniform: not measured (no uniform runs)"
    return (f"  saturation under uniform: at least {100 * crit['uniform_min_saturated']:.0f}% "
            f"of probe groups at every evaluation: {flag(crit['uniform_saturation_pass'])}\n"
            f"  probe transitions under uniform: {crit['uniform_transitions']}")


def format_criteria(crit: dict[str, Any]) -> str:
    def flag(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = ["testbed criteria"]
    for d in crit["ds_learning"]:
        lines.append(f"  DS run: rises until step {d['rising_until_step']} of {d['steps']}, "
                     f"half-run gap {d['half_run_gap_se']:.1f} SE, gain "
                     f"{100 * d['gain']:+.1f} points")
    lines += [
        f"  lasting learning (>= 100 steps, >= 3 SE at half, >= 10 points): "
        f"{flag(crit['ds_learning_pass'])}",
        _saturation_line(crit, flag),
        f"  pool revisits: at least {crit['min_pool_revisits']:.1f}: {flag(crit['revisit_pass'])}"
        + _named_misses(crit.get("revisits_below", {}), ""),
        f"  longest run: {crit['max_run_seconds']:.0f} s (at most {RUN_SECONDS} s for DS's "
        f"budget, in proportion for longer ones): {flag(crit['run_time_pass'])}"
        + _named_misses(crit.get("runs_over", {}), " s")]
    return "\n".join(lines)


def chart(runs: list[dict[str, Any]], path: Path) -> bool:
    """Accuracy against rollouts (one line per run) and, where uniform ran, the probe's
    saturation under it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    probed = [r for r in runs if r["method"] == "uniform"]   # the probe panel is uniform's
    if probed:
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6))
    else:
        fig, left = plt.subplots(1, 1, figsize=(8, 5))
    # tab10's distinct hues but its gray (the probe panel's), then tab20's paler ones, then
    # tab20b's: the league has some two dozen keys
    palette = [c for i, c in enumerate(plt.cm.tab10.colors) if i != 7] + \
        list(plt.cm.tab20.colors[1::2]) + list(plt.cm.tab20b.colors)
    colors = method_colors({r["method"] for r in runs}, palette)
    for method in colors:
        mine = [r for r in runs if r["method"] == method]
        for r in mine:   # each run faint, the mean over seeds bold
            left.plot([p["rollouts"] for p in r["curve"]],
                      [100 * p["accuracy"] for p in r["curve"]],
                      color=colors[method], lw=0.6, alpha=0.3)
        grid, mean = mean_curve(mine)
        left.plot(grid, mean, color=colors[method], lw=1.8,
                  label=f"{mine[0]['label']} (mean of {len(mine)})")
    for r in probed:
        right.plot([p["steps"] for p in r["curve"]],
                   [100 * (p["frac_all_fail"] + p["frac_all_success"]) for p in r["curve"]],
                   color="tab:gray", lw=1)
    left.set(xlabel="rollouts spent", ylabel="held-out greedy accuracy (%)",
             title="accuracy per rollout: every run, and each method's mean")
    left.legend(fontsize=7, loc="lower right")
    left.grid(alpha=0.3)
    if probed:
        right.axhline(30, color="tab:red", ls="--", lw=1)
        right.set(xlabel="optimizer step", ylabel="saturated probe groups (%)", ylim=(0, 100),
                  title="uniform: all-fail + all-success groups (k-sample probe)")
        right.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def method_colors(methods: set[str], palette: list) -> dict[str, Any]:
    """Each method's colour, in legend order: DS first and in black (every ratio is to DS, so
    the eye looks for it), the rest by name in `palette`'s order, cycling past its end. tab20's
    pairs in name order put DS and DPS in two blues side by side."""
    others = sorted(methods - {"ds"})
    colors = {m: palette[i % len(palette)] for i, m in enumerate(others)}
    return {"ds": "black", **colors} if "ds" in methods else colors


def mean_curve(runs: list[dict[str, Any]], points: int = 60) -> tuple[list[float], list[float]]:
    """Accuracy (%) averaged over runs on a common grid of rollouts, each run's curve linear
    between its evaluations, up to the fewest rollouts any of them spent."""
    end = min(r["curve"][-1]["rollouts"] for r in runs)
    grid = [end * i / (points - 1) for i in range(points)]
    curves = [[(p["rollouts"], p["accuracy"]) for p in r["curve"]] for r in runs]
    mean = [100 * sum(value_at(c, x) or c[-1][1] for c in curves) / len(curves) for x in grid]
    return grid, mean

"""The demo's two RL arms and its summary: SARA first, then (unless ``compare`` is off) the same RL
under Dynamic Sampling from the same warm start, seed and prompt pool, to the rollouts SARA spent.

Each arm is one :func:`sara_demo.rl.run_rl` with its own scheduler (a fresh embedded
Redis), worker and trainer; only the scheduler's ``policy`` differs. The time budget is shared:
SARA may use half of what is left after the warm start, DS the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from .compare import arm_summary, compare, spent, standard_error
from .config import DemoConfig, say
from .evaluate import heldout_accuracy

POLICY_LABELS = {"sara": "SARA", "dynamic_sampling": "Dynamic Sampling", "uniform": "uniform"}


def _one_arm(cfg: DemoConfig, work: Path, start_dir: str, prompts: list[dict], eval_set,
             before: dict, deadline: float, eval_seconds: float) -> dict[str, Any]:
    """One RL run from the warm start; the arm's figures plus the objects the summary needs."""
    from .rl import run_rl

    label = POLICY_LABELS.get(cfg.policy, cfg.policy)
    budget = f", to {cfg.rollout_budget:,} rollouts" if cfg.rollout_budget else ""
    say(cfg, f"[bold]RL with {label}[/] (k={cfg.group_size}, {cfg.batch_groups} mixed groups a "
              f"step{budget}, backend {cfg.backend})")
    flow = flow_note(cfg)
    if flow:
        say(cfg, f"    {flow}")
    started = time.perf_counter()
    # leave time for this arm's final evaluation
    rl_deadline = deadline - eval_seconds - 5
    trainer, stats, counters, history, evals = asyncio.run(
        run_rl(cfg, work, start_dir, prompts, eval_set, before, rl_deadline, label=label))
    after = heldout_accuracy(trainer.model, trainer.tokenizer, eval_set, cfg.max_new_tokens)
    last = history[-1] if history else {}
    if not evals or evals[-1]["step"] != trainer.step:
        evals.append({"step": trainer.step, "accuracy": after["accuracy"],
                      "rollouts_cum": last.get("rollouts_cum", 0),
                      "tokens_cum": last.get("tokens_cum", 0),
                      "seconds_cum": last.get("seconds_cum", 0.0)})
    seconds = time.perf_counter() - started
    say(cfg, f"    {label}: held-out accuracy {100 * before['accuracy']:.1f}% -> "
              f"{100 * after['accuracy']:.1f}% after {last.get('rollouts_cum', 0):,} rollouts, "
              f"{trainer.step} steps, {seconds:.0f}s")
    figures = arm_summary(cfg.policy, cfg.selection, trainer, stats, history, evals, after,
                          seconds)
    return {"figures": figures, "trainer": trainer, "stats": stats, "counters": counters,
            "history": history, "evals": evals, "after": after}


def run_arms(cfg: DemoConfig, work: Path, start_dir: str, prompts: list[dict], eval_set,
             before: dict, deadline: float, eval_seconds: float) -> dict[str, dict[str, Any]]:
    """SARA (``cfg.policy``), then Dynamic Sampling to the same rollouts when ``cfg.compare``."""
    now = time.perf_counter()
    share = (deadline - now) / 2 if cfg.compare else deadline - now
    arms = {"sara": _one_arm(cfg, work / "sara", start_dir, prompts, eval_set, before,
                             now + share, eval_seconds)}
    if cfg.compare:
        spent = arms["sara"]["history"][-1]["rollouts_cum"] if arms["sara"]["history"] else 0
        ds_cfg = dataclasses.replace(cfg, policy="dynamic_sampling", selection="epoch",
                                     rollout_budget=spent or cfg.rollout_budget)
        arms["dynamic_sampling"] = _one_arm(ds_cfg, work / "ds", start_dir, prompts, eval_set,
                                            before, deadline, eval_seconds)
    return arms


def _estimate(stats: Any) -> dict[str, Any]:
    """The scheduler's live estimate of what DS would spend per mixed group, from its audited
    groups, with its 95% interval; named as an estimate wherever it is shown."""
    d, c = stats.derived, stats.counters
    return {"ds_rollouts_per_mixed_group": d.ds_rollouts_per_effective_group,
            "low": d.ds_rollouts_per_effective_group_low,
            "high": d.ds_rollouts_per_effective_group_high,
            "net_saving_vs_ds": d.net_saving_vs_ds, "net_saving_low": d.net_saving_vs_ds_low,
            "net_saving_high": d.net_saving_vs_ds_high,
            "false_abandon_rate": d.false_abandon_rate,
            "false_abandon_low": d.false_abandon_rate_low,
            "false_abandon_high": d.false_abandon_rate_high,
            "audited_groups": c.audits_mixed + c.audits_pure,
            "audit_cost_fraction": d.audit_cost_fraction,
            "what": "the scheduler's estimate from audit sampling (95% interval), not a "
                    "measurement"}


def flow_note(cfg: DemoConfig) -> str | None:
    """What the demo's flow control changes from the service's defaults, and why; None when it
    runs them."""
    from sara_service.settings import Settings

    fields = Settings.model_fields
    service = (fields["prefetch_batches"].default, fields["max_staleness"].default)
    if (cfg.prefetch_batches, cfg.max_staleness) == service:
        return None
    return (f"flow control: {cfg.prefetch_batches} batch(es) in the making, groups at most "
            f"{cfg.max_staleness} version(s) old (the service's defaults are {service[0]} and "
            f"{service[1]}): each of the demo's batches is a large share of its short budget, so "
            "it keeps little ahead and trains every group nearly on policy")


def _rl_figures(trainer: Any, stats: Any, counters: Any) -> dict[str, Any]:
    """The SARA arm's trainer figures: steps, versions, acks, losses, worker reloads."""
    import math

    reports = trainer.reports
    return {"steps": trainer.step, "policy_version": trainer.version,
            "published_version": stats.policy.version, "checkpoint": trainer.checkpoint,
            "batches_acked": len(trainer.acked),
            "every_batch_acked": [r.batch_id for r in reports] == trainer.acked,
            "losses_finite": all(math.isfinite(r.loss) for r in reports),
            "worker_policy_loads": counters.policy_loads, "worker_errors": counters.errors,
            "mean_reward_first": reports[0].mean_reward if reports else None,
            "mean_reward_last": reports[-1].mean_reward if reports else None,
            "seconds": sum(r.seconds for r in reports)}


def _scheduler_figures(stats: Any, history: list[dict]) -> dict[str, Any]:
    """The SARA arm's scheduler counters and derived figures; what its trained steps cost
    (`compare.spent`) and rollouts per mixed group from that."""
    c, d = stats.counters, stats.derived
    cost = spent(history)
    return {
        **cost, "rollouts_completed": c.rollouts_completed,
        "tokens_generated": c.tokens_generated,
        "rollouts_issued": c.rollouts_issued, "rollouts_cancelled": c.rollouts_cancelled,
        "groups_opened": c.groups_opened, "groups_committed": c.groups_committed,
        "groups_abandoned": c.groups_abandoned, "groups_delivered": c.groups_delivered,
        "groups_dropped": c.groups_dropped_saturated + c.groups_dropped_stale,
        # k - issued summed over abandoned groups: what abandoning did not spend, which is
        # not what it saved (false abandons cost mixed groups); the DS arm measures that
        "rollouts_not_spent_on_abandoned_groups": c.rollouts_not_spent_on_abandoned_groups,
        "useful_fraction": d.useful_fraction,
        "rollouts_per_effective_group": (cost["rollouts_spent"] / cost["groups_trained"]
                                         if cost["groups_trained"] else None),
        "expected_false_abandons": c.expected_false_abandons}


def build_summary(cfg: DemoConfig, arms: dict[str, dict[str, Any]], before: dict[str, Any],
                  warm: dict[str, Any], prompts: list[dict], pool_weights: dict[str, float]
                  ) -> dict[str, Any]:
    """The demo's ``summary.json`` (see :mod:`sara_demo.demo` for its keys)."""
    sara = arms["sara"]
    after, n = sara["after"], sara["after"]["n"]
    summary: dict[str, Any] = {
        "seed": cfg.seed, "backend": cfg.backend, "quick": cfg.quick,
        "config": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in dataclasses.asdict(cfg).items()},
        "warm_start": warm,
        "prompt_pool": {"prompts": len(prompts), "bucket_weights": pool_weights},
        "accuracy": {"before_rl": before["accuracy"], "after_rl": after["accuracy"], "n": n,
                     "standard_error_before": standard_error(before["accuracy"], n),
                     "standard_error_after": standard_error(after["accuracy"], n),
                     "by_bucket_before": before["by_bucket"],
                     "by_bucket_after": after["by_bucket"]},
        "rl": _rl_figures(sara["trainer"], sara["stats"], sara["counters"]),
        "scheduler": _scheduler_figures(sara["stats"], sara["history"]),
        "history": sara["history"], "evals": sara["evals"],
        "arms": {name: arm["figures"] for name, arm in arms.items()},
    }
    if "dynamic_sampling" in arms:
        summary["comparison"] = compare(before["accuracy"], n, arms["sara"]["figures"],
                                        arms["dynamic_sampling"]["figures"])
        summary["ds_history"] = arms["dynamic_sampling"]["history"]
    else:
        summary["comparison"] = None
    summary["estimate"] = _estimate(sara["stats"])
    return summary

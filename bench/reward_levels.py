#!/usr/bin/env python
"""Rollouts per effective group under a shaped reward, through the real scheduler.

The pool: prompts that nothing solves, scored 0.0 (malformed) or 0.1 (well formatted, wrong)
by default (`--reward-levels`). Each prompt has its own chances over the levels, drawn from a
symmetric Dirichlet of concentration `--concentration` (small: many prompts nearly always give
one level, the pure groups SARA learns to abandon); its mean is even odds, "half of the answers
are well-formatted". A rollout's level is drawn from its prompt's chances.

The driver is `sara_client.alocal()` (the FastAPI app and Lua scripts of `sara serve`, on an
embedded redis-server, in this process): lease 512, score, report, take and ack every ready
batch, until `--epochs` epochs of the pool have opened; then the run drains, so every
opened group is decided and the counters hold whole groups. Methods, all under
SARA_EFFECTIVE=reward (effective: the rewards are not all equal) unless named `outcome`:

- ds: Dynamic Sampling, k at once, a group dropped only when its rewards are all equal;
- sara: tau_low 0.5, the Dirichlet(1, ..., 1) prior over the levels, no audits, so its cost
  has a closed form;
- sara-audit: the same with audit_fraction 0.2, for the audit-sampling estimate of DS's spend;
- ds-outcome, sara-outcome: the default view, where no group of this pool is ever effective;
- sara-auto: tau_low = "auto", the cost-aware threshold from the pool model of level chances the
  scheduler learns as it runs (`autotau.level_thresholds`), no audits; set beside the best fixed
  threshold for this pool, found by knowing every prompt's chances (`best_fixed`);
- sara-history, sara-mopps-history (not run by default): sara with each prompt planned from its
  own Dirichlet (SARA_PRIOR=history: a threshold per level it produced, and a skip when its
  rewards are unlikely to differ), alone and on MoPPS's prompts;
- ds-mopps, sara-mopps (not run by default): ds and sara on prompts picked by MoPPS under the
  reward view (a Thompson sample of each candidate's chances over the levels, the best of 8 per
  pick); they visit prompts unevenly, so no closed form.

Exact figures, per prompt with level chances pi (epoch order visits every prompt alike):

- DS: k / mean(P(not all equal)), P(not all equal) = 1 - sum_j pi_j^k;
- SARA, threshold t (the plan's `after_failures`, issued at once): a group whose first t share a
  level is abandoned after t rollouts, any other is committed and filled to k, so
  rollouts per effective group = mean(t P_t + k (1 - P_t)) / mean(1 - P_t), P_t = sum_j pi_j^t.

Usage:
    python bench/reward_levels.py                        # ~1 minute on 2 cores
    python bench/reward_levels.py --reward-levels 0,0.1,1 --k 16
    python bench/reward_levels.py --prompts 60 --epochs 3 --methods ds,sara   # seconds
    python bench/reward_levels.py --methods ds,ds-mopps,sara,sara-mopps        # MoPPS beside them
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _provenance import git_state  # noqa: E402
from _shutdown import unstick_shutdown  # noqa: E402

METHODS = {
    "ds": {"policy": "dynamic_sampling", "effective": "reward"},
    "sara": {"policy": "sara", "effective": "reward", "audit_fraction": 0.0},
    "sara-audit": {"policy": "sara", "effective": "reward", "audit_fraction": 0.2},
    "sara-auto": {"policy": "sara", "effective": "reward", "audit_fraction": 0.0,
                  "tau_low": "auto"},
    "ds-outcome": {"policy": "dynamic_sampling", "effective": "outcome"},
    "sara-outcome": {"policy": "sara", "effective": "outcome", "audit_fraction": 0.0},
    "ds-mopps": {"policy": "dynamic_sampling", "effective": "reward", "selection": "mopps"},
    "sara-mopps": {"policy": "sara", "effective": "reward", "audit_fraction": 0.0,
                   "selection": "mopps"},
    "sara-history": {"policy": "sara", "effective": "reward", "audit_fraction": 0.0,
                     "prior": "history"},
    "sara-mopps-history": {"policy": "sara", "effective": "reward", "audit_fraction": 0.0,
                           "selection": "mopps", "prior": "history"},
}
DEFAULT_METHODS = ("ds", "sara", "sara-audit", "ds-outcome", "sara-outcome")


def make_pool(prompts: int, levels: int, concentration: float, seed: int) -> list[list[float]]:
    """Each prompt's chances over the levels: a symmetric Dirichlet draw (gamma variates)."""
    rng = random.Random(seed)
    pool = []
    for _ in range(prompts):
        draws = [rng.gammavariate(concentration, 1.0) for _ in range(levels)]
        total = sum(draws)
        pool.append([d / total for d in draws])
    return pool


def sara_exact(pool: list[list[float]], k: int, threshold: int) -> float:
    """Closed-form rollouts per effective group of SARA abandoning after `threshold` equal
    rewards (k + 1: never) on `pool` (module docstring)."""
    t = min(threshold, k)
    pure_t = [sum(p**t for p in pi) for pi in pool]
    cost = sum(t * q + k * (1 - q) for q in pure_t) / len(pool)
    effective = sum(1 - q for q in pure_t) / len(pool)
    return cost / effective if effective > 0 else math.inf   # t = 1: nothing is ever mixed


def best_fixed(pool: list[list[float]], k: int) -> tuple[int, float]:
    """The fixed threshold with the fewest rollouts per effective group on `pool`, and that
    figure: the best any one threshold can do, for a rule that knew every prompt's chances."""
    return min(((t, sara_exact(pool, k, t)) for t in range(1, k + 2)), key=lambda x: x[1])


def exact(pool: list[list[float]], k: int, threshold: int) -> dict[str, float]:
    """Closed-form rollouts per effective group of DS and SARA on `pool` (module docstring),
    and the best fixed threshold's."""
    ds_eff = sum(1 - sum(p**k for p in pi) for pi in pool) / len(pool)
    best_t, best = best_fixed(pool, k)
    return {"ds": k / ds_eff, "sara": sara_exact(pool, k, threshold), "p_not_all_equal": ds_eff,
            "best_fixed_threshold": best_t, "best_fixed": best}


def draw_level(rng: random.Random, chances: list[float]) -> int:
    return rng.choices(range(len(chances)), weights=chances)[0]


async def _round(client, pool_index: dict[str, int], pool: list[list[float]],
                 rewards: list[float], rng: random.Random) -> int:
    """One lease of up to 512 rollouts, scored and reported; returns how many ran. (One, not
    "until the queue is empty": where nothing is ever effective, every report frees room and
    the queue never empties.)"""
    lease = await client.lease("bench", max_rollouts=512)
    results = [{"rollout_id": r.rollout_id, "completion_tokens": 1,
                "reward": rewards[draw_level(rng, pool[pool_index[r.prompt_id]])]}
               for r in lease.rollouts]
    if results:
        await client.report("bench", results)
    return len(results)


async def _take_batches(client) -> list:
    """Every ready batch, acked, with a policy version published after each, as a trainer
    publishes each step (MoPPS ranks its candidates once a version)."""
    groups = []
    while (batch := await client.next_batch()) is not None:
        groups += batch.groups
        await client.ack(batch.batch_id)
        await client.publish_policy(batch.policy_version + 1)
    return groups


async def run_method(name: str, pool: list[list[float]], rewards: list[float], args) -> dict:
    """One run through the service; its counters and the delivered groups' reward sets."""
    import sara_client

    # groups of any age are delivered: what is measured is the allocation, not staleness
    settings = dict(group_size=args.k, tau_low=0.5, batch_size=16, prefetch_batches=4,
                    max_staleness=10**6, reward_tolerance=args.tolerance,
                    reward_levels=len(rewards), seed=args.seed)
    settings.update(METHODS[name])
    unstick = None
    try:
        with tempfile.TemporaryDirectory(prefix="sara-bench-") as tmp:
            async with sara_client.alocal(data_dir=tmp, **settings) as client:
                stats, delivered = await _drive(client, pool, rewards, args, name)
                unstick = asyncio.ensure_future(unstick_shutdown())
    finally:
        if unstick is not None:
            unstick.cancel()
    return _summary(name, stats, delivered)


async def _drive(client, pool: list[list[float]], rewards: list[float], args, name: str):
    """Epochs of the pool, then a drain: (final stats, delivered groups)."""
    rng = random.Random(f"{args.seed}:{name}")
    ids = [f"q{i}" for i in range(len(pool))]
    await client.add_prompts([{"id": pid, "prompt": pid} for pid in ids])
    index = {pid: i for i, pid in enumerate(ids)}
    delivered: list = []
    while (await client.stats()).counters.groups_opened < args.epochs * len(pool):
        await _round(client, index, pool, rewards, rng)
        delivered += await _take_batches(client)
    await client.control_run("drain")
    while await _round(client, index, pool, rewards, rng):
        delivered += await _take_batches(client)
    delivered += await _take_batches(client)
    return await client.stats(), delivered


def _summary(name: str, stats, delivered: list) -> dict:
    c, d = stats.counters, stats.derived
    differ = sum(len({r.reward for r in g.rollouts}) > 1 for g in delivered)
    return {"method": name, "groups_opened": c.groups_opened, "groups_delivered": len(delivered),
            "delivered_with_differing_rewards": differ,
            "groups_abandoned": c.groups_abandoned,
            "groups_dropped_saturated": c.groups_dropped_saturated,
            "rollouts_completed": c.rollouts_completed,
            "rollouts_per_effective_group": (c.rollouts_completed / len(delivered)
                                             if delivered else None),
            "ds_estimate": d.ds_rollouts_per_effective_group,
            "ds_estimate_interval": [d.ds_rollouts_per_effective_group_low,
                                     d.ds_rollouts_per_effective_group_high],
            "warnings": stats.warnings,
            "auto_threshold": (stats.auto_thresholds or {}).get("abandon_after_failures")}


def _table(rows: list[dict], figures: dict[str, float]) -> list[str]:
    lines = [f"{'method':<13} {'opened':>7} {'delivered':>9} {'differ':>7} {'abandoned':>9} "
             f"{'rollouts/eff':>12} {'exact':>8}  DS estimate (95%)"]
    for r in rows:
        per = r["rollouts_per_effective_group"]
        want = figures.get(r["method"])   # ds and sara; the audits' cost has no closed form
        est = r["ds_estimate"]
        low, high = r["ds_estimate_interval"]
        est_s = f"{est:.3f} [{low:.3f}, {high:.3f}]" if est is not None else "-"
        lines.append(f"{r['method']:<13} {r['groups_opened']:>7} {r['groups_delivered']:>9} "
                     f"{r['delivered_with_differing_rewards']:>7} {r['groups_abandoned']:>9} "
                     f"{per if per is None else round(per, 3)!s:>12} "
                     f"{'-' if want is None else f'{want:.3f}':>8}  {est_s}")
    return lines


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reward-levels", default="0,0.1",
                   help="the rewards a rollout can get (comma-separated)")
    p.add_argument("--concentration", type=float, default=0.3,
                   help="Dirichlet concentration of each prompt's chances over the levels")
    p.add_argument("--prompts", type=int, default=400)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--tolerance", type=float, default=0.01, help="SARA_REWARD_TOLERANCE")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma list of: " + ", ".join(METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write PREFIX.txt and PREFIX.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Run the methods, print each against its exact figure; returns the result document."""
    from sara_service.math.reward_levels import plan_levels

    args = parse(argv)
    logging.getLogger("sara").setLevel(logging.ERROR)
    rewards = [float(x) for x in args.reward_levels.split(",")]
    pool = make_pool(args.prompts, len(rewards), args.concentration, args.seed)
    plan = plan_levels("sara", args.k, len(rewards), 1.0, 0.5)
    figures = exact(pool, args.k, plan.after_failures)
    started = time.perf_counter()
    rows = [asyncio.run(run_method(m, pool, rewards, args)) for m in args.methods.split(",")]
    doc = {"command": " ".join(["python", "bench/reward_levels.py", *(argv or sys.argv[1:])]),
           "commit": git_state(), "machine": _machine(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "seconds": time.perf_counter() - started,
           "args": {k: str(v) for k, v in vars(args).items()}, "threshold": plan.after_failures,
           "exact": figures, "rows": rows}
    lines = _report(doc)
    print("\n".join(lines))
    if args.out:
        args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _machine() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{platform.node()} {os.cpu_count()} cores, load average {load} at start"


def _report(doc: dict) -> list[str]:
    f = doc["exact"]
    return [f"$ {doc['command']}", f"{doc['date']}; commit {doc['commit']}; {doc['machine']}; "
            f"{doc['seconds']:.0f} s",
            f"P(not all equal) over the pool = {f['p_not_all_equal']:.4f}; SARA's threshold: "
            f"abandon after {doc['threshold']} equal rewards; exact DS = {f['ds']:.3f} "
            "(the DS estimate's target)",
            f"best fixed threshold, knowing every prompt's chances: abandon after "
            f"{f['best_fixed_threshold']} ({f['best_fixed']:.3f} rollouts per effective group)",
            *[f"{r['method']}: threshold in force at the end: {r['auto_threshold']}"
              for r in doc["rows"] if r.get("auto_threshold") is not None],
            *_table(doc["rows"], f)]


if __name__ == "__main__":
    main()

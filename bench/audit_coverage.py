#!/usr/bin/env python
"""Does the live DS estimate's 95% interval contain what Dynamic Sampling really spends?

Each run serves one seeded pool through the real scheduler (`sara_client.alocal()`: the FastAPI
app and Lua scripts on an embedded redis-server) under SARA with audit sampling, plays the
workers (reward ~ Bernoulli(γ) of the prompt) and the trainer (takes and acks every batch), and
stops after `--groups` decided groups. It then reads `/stats` and compares
`derived.ds_rollouts_per_effective_group` and its interval with the exact figure for the pool:
DS fills every group to k, so it spends k / q rollouts per effective group, q the pool's mean
P(mixed) = mean of 1 - γ^k - (1-γ)^k.

The pool is not one the scheduler was tuned on: a third of prompts nearly hopeless
(γ ~ U(0, 0.12)), a quarter nearly solved (γ ~ U(0.9, 1)), the rest γ ~ Beta(1.5, 1.5), each
drawn afresh per seed.

Usage:
    python bench/audit_coverage.py                      # 20 seeds, k 8 and 16, default audit 5%
    python bench/audit_coverage.py --audit 0.1 --groups 1500 --k 8 --seeds 20
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import random
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import git_state  # noqa: E402  (bench/ is not a package)
from sara_client import alocal  # noqa: E402
from sara_client.limits import MAX_RESULTS_PER_CALL, MAX_ROLLOUTS_PER_LEASE  # noqa: E402
from sara_client.models import RolloutResult  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def make_gammas(n: int, seed: int) -> list[float]:
    """The pool's true success rates (see the module docstring)."""
    rng = random.Random(f"audit-pool:{seed}")
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 1 / 3:
            out.append(rng.uniform(0.0, 0.12))
        elif u < 1 / 3 + 1 / 4:
            out.append(rng.uniform(0.9, 1.0))
        else:
            out.append(rng.betavariate(1.5, 1.5))
    return out


def exact_ds(gammas: list[float], k: int) -> float:
    """Rollouts per effective group Dynamic Sampling spends on this pool: k / mean P(mixed)."""
    q = sum(1 - g**k - (1 - g) ** k for g in gammas) / len(gammas)
    return k / q


async def _work_round(client, gammas: dict[str, float], rng: random.Random) -> int:
    """Lease everything there is, answer it, report it; returns how many rollouts ran."""
    done = 0
    while True:
        lease = await client.lease("audit-bench", MAX_ROLLOUTS_PER_LEASE)
        if not lease.rollouts:
            return done
        results = [RolloutResult(rollout_id=r.rollout_id, completion_tokens=1,
                                 reward=float(rng.random() < gammas[r.prompt_id]))
                   for r in lease.rollouts]
        for i in range(0, len(results), MAX_RESULTS_PER_CALL):
            await client.report("audit-bench", results[i:i + MAX_RESULTS_PER_CALL])
        done += len(results)


async def _drain_batches(client) -> None:
    while (batch := await client.next_batch()) is not None:
        await client.ack(batch.batch_id)


def _decided(c) -> int:
    return c.groups_committed + c.groups_abandoned + c.groups_completed_pure


async def run_once(seed: int, k: int, groups: int, audit: float, prompts: int = 1000,
                   tau_low: float = 0.5) -> dict:
    """One seeded run; the estimate, its interval and the exact DS figure."""
    gammas = make_gammas(prompts, seed)
    by_id = {f"q{i}": g for i, g in enumerate(gammas)}
    rng = random.Random(f"outcomes:{seed}")
    async with alocal(group_size=k, tau_low=tau_low, audit_fraction=audit, seed=seed,
                      batch_size=32, prefetch_batches=4) as client:
        await client.add_prompts([{"id": pid, "prompt": pid} for pid in by_id])
        while True:
            ran = await _work_round(client, by_id, rng)
            await _drain_batches(client)
            stats = await client.stats()
            if _decided(stats.counters) >= groups or not ran:
                break
    d, c = stats.derived, stats.counters
    exact = exact_ds(gammas, k)
    covered = (d.ds_rollouts_per_effective_group_low is not None
               and d.ds_rollouts_per_effective_group_high is not None
               and d.ds_rollouts_per_effective_group_low <= exact
               <= d.ds_rollouts_per_effective_group_high)
    width = (None if d.ds_rollouts_per_effective_group_high is None
             else d.ds_rollouts_per_effective_group_high - d.ds_rollouts_per_effective_group_low)
    return {"seed": seed, "k": k, "audit": audit, "groups": _decided(c), "exact": exact,
            "point": d.ds_rollouts_per_effective_group,
            "low": d.ds_rollouts_per_effective_group_low,
            "high": d.ds_rollouts_per_effective_group_high, "covered": covered,
            "relative_width": width / exact if width is not None else None,
            "audited": c.audits_mixed + c.audits_pure, "abandoned": c.groups_abandoned,
            "false_abandon_rate": d.false_abandon_rate,
            "audit_cost_fraction": d.audit_cost_fraction,
            "net_saving_vs_ds": d.net_saving_vs_ds,
            "net_saving_vs_ds_low": d.net_saving_vs_ds_low,
            "net_saving_vs_ds_high": d.net_saving_vs_ds_high,
            "own_rollouts_per_mixed_group": c.rollouts_completed / max(1, c.groups_committed)}


def summarise(rows: list[dict]) -> dict:
    """Coverage and interval width over the runs of one k."""
    widths = sorted(r["relative_width"] for r in rows if r["relative_width"] is not None)
    return {"runs": len(rows), "covered": sum(r["covered"] for r in rows),
            "median_relative_width": widths[len(widths) // 2] if widths else None,
            "max_relative_width": widths[-1] if widths else None,
            "mean_audited": sum(r["audited"] for r in rows) / len(rows),
            "mean_audit_cost_fraction": sum(r["audit_cost_fraction"] or 0 for r in rows) / len(rows)}


def format_rows(rows: list[dict]) -> str:
    lines = ["  seed  k  groups audited   exact    estimate [95% interval]     covered  "
             "width  false-abandon  audit cost  net saving vs DS [95%]"]
    for r in rows:
        est = "-" if r["point"] is None else f"{r['point']:.2f}"
        high = "inf" if r["high"] is None else f"{r['high']:.2f}"
        saving = ("-" if r["net_saving_vs_ds"] is None else
                  f"{r['net_saving_vs_ds']:+.1%} [{(r['net_saving_vs_ds_low'] or 0):+.1%}, "
                  f"{(r['net_saving_vs_ds_high'] or 0):+.1%}]")
        lines.append(
            f"  {r['seed']:4d} {r['k']:2d} {r['groups']:7d} {r['audited']:7d} {r['exact']:7.2f}  "
            f"{est:>7} [{r['low']:.2f}, {high}]  {'yes' if r['covered'] else 'NO ':>7}  "
            f"{(r['relative_width'] or 0):5.1%}  {(r['false_abandon_rate'] or 0):12.3f}  "
            f"{(r['audit_cost_fraction'] or 0):10.1%}  {saving}")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--k", default="8,16", help="comma list of group sizes")
    p.add_argument("--groups", type=int, default=3000, help="decided groups per run")
    p.add_argument("--audit", type=float, default=0.05, help="audit fraction")
    p.add_argument("--no-write", action="store_true")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> dict:
    out = {}
    for k in [int(x) for x in args.k.split(",")]:
        rows = []
        for seed in range(args.seeds):
            rows.append(await run_once(seed, k, args.groups, args.audit))
            print(format_rows(rows[-1:]).splitlines()[1], flush=True)
        out[k] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    start = time.time()
    by_k = asyncio.run(_main(args))
    text = ["Coverage of the live DS estimate (bench/audit_coverage.py)",
            f"date:     {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
            f"code:     {git_state()}",
            f"command:  python bench/audit_coverage.py {shlex.join(argv)}",
            f"machine:  {platform.machine()}, Python {platform.python_version()}; "
            f"{time.time() - start:.0f}s",
            f"setup:    SARA tau_low 0.5, uniform prior, epoch selection, audit fraction "
            f"{args.audit}, {args.groups} decided groups per run, 1000 prompts per pool"]
    for k, rows in by_k.items():
        s = summarise(rows)
        text += ["", f"k = {k}: interval covers the exact DS figure in {s['covered']}/{s['runs']} "
                     f"runs; relative width median {s['median_relative_width']:.1%}, max "
                     f"{s['max_relative_width']:.1%}; {s['mean_audited']:.0f} audited groups per "
                     f"run, audit cost {s['mean_audit_cost_fraction']:.2%} of rollouts",
                 format_rows(rows)]
    print("\n".join(text))
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "audit_coverage.txt").write_text("\n".join(text) + "\n")
        (RESULTS / "audit_coverage.json").write_text(json.dumps(
            {str(k): {"summary": summarise(r), "runs": r} for k, r in by_k.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

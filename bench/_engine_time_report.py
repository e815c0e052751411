"""The figures of `bench/engine_time.py` from its rounds: JSON, the text table and a chart.

Each figure is computed per round and summarised over rounds as a mean with its 95% t-interval
(`_stats.mean_ci`); ratios against DS are taken per round (policy and DS of the same round
ran back to back) and summarised the same way.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from _provenance import git_state
from _stats import mean_ci

SAVING_SHARE = 0.95   # item 3: the engine must keep this share of the allocation's saving


def round_figures(r) -> dict[str, float | None]:
    """One round's figures (see bench/engine_time.py's docstring for each)."""
    window = r.in_window()
    gens = len(r.records)
    cpu_s = (r.cores.get("worker", 0.0) + r.cores.get("scheduler", 0.0)) * r.total_seconds
    out: dict[str, float | None] = {
        "cpu_ms_per_rollout": 1000.0 * cpu_s / gens if gens else None,
        "engine_occupancy": r.occupancy,
        "rollouts_per_s": len(window) / r.seconds if r.seconds else None,
        "engine_waiting": r.cores.get("engine-waiting"),
    }
    out.update(cache_figures(r.records))
    if r.policy == "raw":
        return out
    tokens = sum(g.tokens for g in window)
    out.update({
        "effective_groups_per_engine_s": r.effective / r.seconds,
        "effective_groups_per_token": r.effective / tokens if tokens else None,
        "tokens_per_effective_group": tokens / r.effective,
        "rollouts_per_effective_group": len(window) / r.effective,
        "scheduler_rollouts_per_effective_group": r.batch_rollouts / r.effective,
        "wasted_tokens_at_abort": float(sum(g.tokens for g in window
                                            if g.finish_reason == "abort")),
        "aborted_rollouts": float(sum(g.finish_reason == "abort" for g in window)),
    })
    out.update(age_figures(r))
    return out


def age_figures(r) -> dict[str, float | None]:
    """How many batches reached the trainer while each delivered group was in the making, from
    its first rollout's start to its own batch. This bench's trainer takes each batch at once;
    one that published a policy version per batch would see that many versions of staleness,
    and `max_staleness` 1 (the default) would drop the groups over 1 (`stale_share_at_1`), 2
    those over 2."""
    started: dict[str, float] = {}
    for g in r.records:
        started[g.group_id] = min(started.get(g.group_id, g.started), g.started)
    ages = [sum(arrived > started[gid] for arrived, _ in r.batches[:b])
            for b, (_, gids) in enumerate(r.batches) for gid in gids if gid in started]
    if not ages:
        return {"batches_in_flight": None, "stale_share_at_1": None, "stale_share_at_2": None}
    return {"batches_in_flight": sum(ages) / len(ages),
            "stale_share_at_1": sum(a > 1 for a in ages) / len(ages),
            "stale_share_at_2": sum(a > 2 for a in ages) / len(ages)}


def cache_figures(records) -> dict[str, float | None]:
    """Prefix-cache hit rates: of commit waves (started after a rollout of the same group had
    finished) and of every rollout; cached prompt tokens / prompt tokens."""
    first_done: dict[str, float] = {}
    for g in records:
        first_done[g.group_id] = min(first_done.get(g.group_id, g.finished), g.finished)

    def rate(chosen) -> float | None:
        prompt = sum(g.prompt_tokens or 0 for g in chosen)
        cached = sum(g.cached_tokens or 0 for g in chosen)
        return cached / prompt if prompt else None

    wave = [g for g in records if g.started > first_done[g.group_id]]
    return {"prefix_cache_hit_rate": rate(wave), "prefix_cache_hit_rate_all": rate(records),
            "commit_wave_rollouts": float(len(wave))}


def summarise(rounds, policies: list[str], exact: dict[str, float | None]) -> dict[str, Any]:
    """Per policy: every figure's mean and interval over rounds, series, and ratios to DS."""
    per_round = {p: [round_figures(r) for r in rounds if r.policy == p]
                 for p in ["raw", *policies]}
    out: dict[str, Any] = {}
    for policy, figures in per_round.items():
        entry: dict[str, Any] = {}
        for key in figures[0] if figures else ():
            mean, half = mean_ci([f[key] for f in figures if f[key] is not None])
            entry[key] = _num(mean)
            entry[f"{key}_ci95"] = _num(half)
        entry["rounds"] = len(figures)
        entry["occupancy_series"] = [r.series for r in rounds if r.policy == policy]
        if policy != "raw":
            entry["exact_rollouts_per_effective_group"] = exact.get(policy)
        out[policy] = entry
    if "ds" in policies:
        add_ratios(out, rounds, policies)
    return out


def add_ratios(out: dict[str, Any], rounds, policies: list[str]) -> None:
    """Per policy, per round against that round's DS: the engine's gain (effective groups per
    engine-second) and the allocation's (DS's rollouts per effective group over the policy's)."""
    ds = [round_figures(r) for r in rounds if r.policy == "ds"]
    for policy in policies:
        mine = [round_figures(r) for r in rounds if r.policy == policy]
        engine = [m["effective_groups_per_engine_s"] / d["effective_groups_per_engine_s"]
                  for m, d in zip(mine, ds)]
        alloc = [d["rollouts_per_effective_group"] / m["rollouts_per_effective_group"]
                 for m, d in zip(mine, ds)]
        kept = [e / a for e, a in zip(engine, alloc)]
        for key, values in (("engine_gain_vs_ds", engine), ("allocation_gain_vs_ds", alloc),
                            ("saving_kept", kept)):
            mean, half = mean_ci(values)
            out[policy][key], out[policy][f"{key}_ci95"] = _num(mean), _num(half)


def _num(x: float) -> float | None:
    return None if x != x else round(x, 6)


def cpu_added(summary: dict[str, Any], policies: list[str]) -> dict[str, float | None]:
    """ms of CPU per rollout the service path adds over driving the engine directly."""
    raw = summary.get("raw", {}).get("cpu_ms_per_rollout")
    out = {}
    for p in policies:
        mine = summary[p].get("cpu_ms_per_rollout")
        out[p] = None if raw is None or mine is None else round(mine - raw, 4)
    return out


def result_json(args, summary, command: str, load: str, model: str | None) -> dict[str, Any]:
    """The issue's schema: {"policies": {...}, "cpu_ms_added_per_rollout": ...} and context."""
    added = cpu_added(summary, args.policies)
    known = [v for v in added.values() if v is not None]
    return {
        "policies": {p: summary[p] for p in args.policies},
        "raw_engine": summary.get("raw"),
        "cpu_ms_added_per_rollout": round(statistics.median(known), 4) if known else None,
        "cpu_ms_added_per_rollout_by_policy": added,
        "setup": setup(args, model),
        "provenance": {"command": command, "commit": git_state(),
                       "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
                               " UTC", "load_average_before": load,
                       "load_average_after": _load(),
                       "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                                  f"{platform.python_version()}, vllm {_vllm_version()}"},
    }


def setup(args, model: str | None) -> dict[str, Any]:
    return {"k": args.k, "rounds": args.rounds, "effective_groups_per_round":
            args.effective_groups, "max_num_seqs": args.concurrency,
            "worker_capacity": args.capacity, "max_tokens": args.max_tokens,
            "batch_size": args.batch_size, "prefetch_batches": args.prefetch_batches,
            "work_floor": args.work_floor,
            "pool": str(args.prompts or f"standard, {args.pool_size} prompts"),
            "model": model or "tiny GPT-2 (sara_trainer.tiny)", "dtype": args.dtype,
            "max_model_len": args.max_model_len, "raw_rollouts_per_round": args.raw_rollouts}


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _vllm_version() -> str:
    try:
        import vllm
        return vllm.__version__
    except ImportError:
        return "n/a"


def _pm(entry: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    value, half = entry.get(key), entry.get(f"{key}_ci95")
    if value is None:
        return "n/a"
    text = format(value * scale, fmt)
    return text if not half else f"{text}±{format(half * scale, fmt)}"


def table(result: dict[str, Any]) -> str:
    """The text report: provenance, the per-policy table, the checks."""
    prov, s = result["provenance"], result["setup"]
    lines = ["SARA engine time (bench/engine_time.py)",
             f"date:    {prov['date']}", f"command: {prov['command']}",
             f"commit:  {prov['commit']}",
             f"machine: {prov['machine']}; load average before {prov['load_average_before']}, "
             f"after {prov['load_average_after']}",
             f"setup:   {s['model']} ({s['dtype']}, max_model_len {s['max_model_len']}); pool "
             f"{s['pool']}; k={s['k']}; {s['rounds']} rounds of {s['effective_groups_per_round']}"
             f" effective groups per policy; max_num_seqs {s['max_num_seqs']}, worker capacity "
             f"{s['worker_capacity']}, max_tokens {s['max_tokens']}, batches of "
             f"{s['batch_size']} groups; prefetch_batches {s['prefetch_batches'] or 'default'}, "
             f"work_floor {s.get('work_floor') or 'default'}",
             "", "  mean ± 95% t-interval over rounds; ratios per round against the same round's "
             "DS", ""]
    head = (f"  {'policy':10} {'eff/engine-s':>13} {'eff/1k tok':>11} {'rollouts/eff':>13} "
            f"{'exact':>6} {'occupancy':>10} {'commit-wave cache':>17} {'abort tok/round':>15}"
            f" {'CPU ms/rollout':>14} {'engine gain':>12} {'alloc gain':>11} {'kept':>10}"
            f" {'age':>9} {'stale@1':>8} {'stale@2':>8}")
    lines += [head, "  " + "-" * (len(head) - 2)]
    for policy, e in result["policies"].items():
        exact = e.get("exact_rollouts_per_effective_group")
        lines.append(
            f"  {policy:10} {_pm(e, 'effective_groups_per_engine_s', '.2f'):>13} "
            f"{_pm(e, 'effective_groups_per_token', '.2f', 1000):>11} "
            f"{_pm(e, 'rollouts_per_effective_group', '.1f'):>13} "
            f"{'n/a' if exact is None else format(exact, '.1f'):>6} "
            f"{_pm(e, 'engine_occupancy', '.0%'):>10} {_pm(e, 'prefix_cache_hit_rate', '.0%'):>17} "
            f"{_pm(e, 'wasted_tokens_at_abort', '.0f'):>15} "
            f"{_pm(e, 'cpu_ms_per_rollout', '.2f'):>14} {_pm(e, 'engine_gain_vs_ds', '.3f'):>12} "
            f"{_pm(e, 'allocation_gain_vs_ds', '.3f'):>11} {_pm(e, 'saving_kept', '.2f'):>10} "
            f"{_pm(e, 'batches_in_flight', '.2f'):>9} {_pm(e, 'stale_share_at_1', '.0%'):>8} "
            f"{_pm(e, 'stale_share_at_2', '.0%'):>8}")
    raw = result.get("raw_engine") or {}
    lines += ["", f"  raw engine: {_pm(raw, 'rollouts_per_s', '.1f')} rollouts/s, occupancy "
              f"{_pm(raw, 'engine_occupancy', '.0%')}, this process "
              f"{_pm(raw, 'cpu_ms_per_rollout', '.2f')} ms CPU per rollout",
              f"  CPU the service path adds per rollout (worker + sara serve + Redis - raw "
              f"driver), median over policies: {result['cpu_ms_added_per_rollout']} ms (target "
              "<= 0.8)"]
    lines += checks(result)
    return "\n".join(lines) + "\n"


def checks(result: dict[str, Any]) -> list[str]:
    """Item 3's check, per policy that abandons: is the saving kept on the engine?"""
    out = ["", f"  saving kept = engine gain / allocation gain (target >= {SAVING_SHARE:.0%}):"]
    for policy, e in result["policies"].items():
        if policy in ("ds", "uniform") or e.get("saving_kept") is None:
            continue
        kept, half = e["saving_kept"], e.get("saving_kept_ci95") or 0.0
        verdict = ("met" if kept - half >= SAVING_SHARE else "NOT met" if kept + half
                   < SAVING_SHARE else "within noise of the target")
        out.append(f"    {policy}: {kept:.3f} ± {half:.3f}: {verdict}")
    return out


def chart(result: dict[str, Any], path: Path) -> bool:
    """Engine occupancy over each policy's rounds (one line per round)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart", file=sys.stderr)
        return False
    series = {"raw": (result.get("raw_engine") or {}).get("occupancy_series", []),
              **{p: e["occupancy_series"] for p, e in result["policies"].items()}}
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 1.6 * len(series)), sharex=True,
                             squeeze=False)
    for ax, (policy, runs) in zip(axes.flat, series.items()):
        for run in runs:
            ax.plot(range(len(run)), [100 * v for v in run], lw=1)
        ax.set_ylim(0, 105)
        ax.set_ylabel(f"{policy}\n% full", fontsize=8)
    axes.flat[-1].set_xlabel("seconds into the round")
    fig.suptitle("engine occupancy: min(requests held, max_num_seqs) / max_num_seqs",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_outputs(args, rounds, exact, command: str, load: str, model: str | None) -> None:
    """Print the table; unless --no-write, write the text, the JSON and the chart."""
    summary = summarise(rounds, args.policies, exact)
    result = result_json(args, summary, command, load, model)
    text = table(result)
    print("\n" + text)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        png = args.out.with_suffix(".png")
        if chart(result, png):
            print(f"chart: {png}")
        print(f"written: {args.out}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"written: {args.json}")

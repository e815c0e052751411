#!/usr/bin/env python
"""End-to-end RL on the demo task under uniform, DS, SARA and SARA + DPS, over seeds and group
sizes: rollouts (and tokens, and wall seconds) to reach a target held-out accuracy.

Every run is the product path of ``sara demo`` (``sara_demo.demo.run_demo`` without its DS
arm): the real scheduler on an embedded redis-server, an hf-backend worker on the tiny GPT-2 and
the GRPO trainer pulling effective batches. All runs start from the warm start shipped in the
package (the same bytes everywhere) and train on the task's natural prompt mix (every bucket
equally; ``--pool probe`` keeps the old probe-weighted pool, an offline predictor that removes
saturated prompts). What differs between methods is only the scheduler's settings:

    uniform    policy uniform            k rollouts for every prompt, saturated groups delivered
    ds         policy dynamic_sampling   k for every prompt, saturated groups dropped (DAPO's DS)
    sara       policy sara               sequential allocation, abandons below tau_low (0.5)
    sara+dps   policy sara, selection dps   SARA on the prompts DPS predicts mixed

For each k and seed, the targets are read off DS's own run: its final accuracy, and a lower one
halfway from the warm start to it. Each method's rollouts to a target come from its evaluation
curve (linear between evaluations); the table gives the mean over seeds with a 95% t-interval,
and each method's ratio to DS (per seed, then averaged).

The learning testbed and its fair protocol (every method at its own learning rate, B groups a
step, uniform also at matched signal, eleven methods) are ``--testbed`` (``bench/_testbed_cli.py``
says how; docs/results.md has the recorded run).

Usage:
    python bench/e2e.py --testbed --seeds 0,1,2,3,4 --methods ds,sara --out PREFIX
    python bench/e2e.py                                  # k 8 and 16, seeds 0-2, 4 methods
    python bench/e2e.py --k 8 --seeds 0 --methods ds,sara
    python bench/e2e.py --quick                          # smoke run for CI

Writes ``bench/results/e2e.txt`` (header, tables), ``e2e.json`` (every run's curve) and
``e2e.png`` (accuracy against rollouts, one panel per k), or under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import git_state  # noqa: E402  (bench/ is not a package)
from _stats import mean_ci  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

METHODS: dict[str, dict[str, str]] = {
    "uniform": {"policy": "uniform", "selection": "epoch"},
    "ds": {"policy": "dynamic_sampling", "selection": "epoch"},
    "sara": {"policy": "sara", "selection": "epoch"},
    "sara+dps": {"policy": "sara", "selection": "dps"},
}
LABELS = {"uniform": "uniform (GRPO)", "ds": "Dynamic Sampling", "sara": "SARA",
          "sara+dps": "SARA + DPS"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma list of: " + ", ".join(METHODS))
    p.add_argument("--k", default=None, help="comma list of group sizes (default 8,16)")
    p.add_argument("--seeds", default=None, help="comma list of seeds (default 0,1,2)")
    p.add_argument("--rollouts", type=int, default=None,
                   help="rollout budget per run (default 20000; quick 3000)")
    p.add_argument("--eval-points", type=int, default=None,
                   help="held-out evaluations per run (default 10; quick 2)")
    p.add_argument("--eval-size", type=int, default=None,
                   help="held-out problems (default 1000; quick 300)")
    p.add_argument("--pool", default="flat", choices=("flat", "probe"),
                   help="'flat': the task's natural mix (default); 'probe': weighted by a probe "
                   "of mixed groups (an offline predictor)")
    p.add_argument("--start-from", default=None,
                   help="a checkpoint to start from instead of the shipped warm start")
    p.add_argument("--quick", action="store_true", help="CI smoke run (tiny budget)")
    p.add_argument("--testbed", action="store_true", help="the learning testbed and its fair "
                   "protocol instead (its own options: --testbed --help)")
    p.add_argument("--out", default=None, help="result directory (default bench/results, or a "
                   "temporary one with --quick)")
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {"rollouts": 3000 if quick else 20_000, "eval_points": 2 if quick else 10,
                "eval_size": 300 if quick else 1000, "k": "8" if quick else "8,16",
                "seeds": "0" if quick else "0,1,2"}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        p.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    args.k = [int(k) for k in str(args.k).split(",")]
    args.seeds = [int(x) for x in str(args.seeds).split(",")]
    if args.rollouts < 1 or args.eval_points < 1 or min(args.k) < 2:
        p.error("--rollouts and --eval-points must be >= 1, every k >= 2")
    return args


def demo_config(args: argparse.Namespace, method: str, k: int, seed: int, out: Path):
    """The ``sara demo`` configuration of one run (one method, k and seed; no DS arm)."""
    from sara_demo.config import DemoConfig

    return DemoConfig(seed=seed, out=str(out), progress=False, start_from=args.start_from,
                      pool=args.pool, group_size=k, rl_steps=100_000, compare=False,
                      rollout_budget=args.rollouts,
                      eval_every_rollouts=max(1, args.rollouts // args.eval_points),
                      eval_size=args.eval_size, time_budget_s=6 * 3600.0,
                      batch_groups=16 if args.quick else 64,
                      batch_timeout_s=300.0, **METHODS[method])


def run_one(args: argparse.Namespace, method: str, k: int, seed: int, work: Path
            ) -> dict[str, Any]:
    """One run; returns its evaluation curve and totals."""
    from sara_demo.demo import run_demo

    started = time.perf_counter()
    summary = run_demo(demo_config(args, method, k, seed, work / f"{method}-k{k}-s{seed}"))
    sched, history = summary["scheduler"], summary["history"]
    seconds = time.perf_counter() - started
    rl_seconds = history[-1]["seconds_cum"] if history else 0.0
    effective = sum(h["groups_mixed"] for h in history)
    return {
        "method": method, "label": LABELS[method], "k": k, "seed": seed, **METHODS[method],
        "steps": summary["rl"]["steps"], "seconds": seconds,
        "accuracy_before": summary["accuracy"]["before_rl"],
        "accuracy_after": summary["accuracy"]["after_rl"],
        "evals": summary["evals"],
        "rollouts": sched["rollouts_spent"], "tokens": sched["tokens_spent"],
        "groups_effective": effective, "trainer_seconds": rl_seconds,
        "rollouts_per_effective_group": sched["rollouts_spent"] / max(1, effective),
    }


def targets(rows: list[dict[str, Any]], k: int, seed: int) -> dict[str, float] | None:
    """DS's final accuracy and the halfway target for one (k, seed), from DS's own run."""
    ds = [r for r in rows if r["method"] == "ds" and r["k"] == k and r["seed"] == seed]
    if not ds:
        return None
    final, start = ds[0]["accuracy_after"], ds[0]["accuracy_before"]
    return {"ds_final": final, "halfway": start + (final - start) / 2}


def to_target(row: dict[str, Any], target: float, key: str) -> float | None:
    from sara_demo.compare import crossing

    return crossing(row["evals"], target, key=key)


def summarise(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per (k, method): rollouts / tokens / seconds to each target (mean, 95% CI, how many seeds
    reached it), the ratio to DS, and accuracy at half and all of the budget."""
    out = []
    for k in args.k:
        for method in args.methods.split(","):
            runs = [r for r in rows if r["k"] == k and r["method"] == method]
            entry: dict[str, Any] = {"k": k, "method": method, "label": LABELS[method],
                                     "seeds": len(runs)}
            for name in ("ds_final", "halfway"):
                for key in ("rollouts_cum", "tokens_cum", "seconds_cum"):
                    got, ratios = [], []
                    for r in runs:
                        t = targets(rows, k, r["seed"])
                        value = to_target(r, t[name], key) if t else None
                        if value is None:
                            continue
                        got.append(value)
                        ds = [d for d in rows if d["method"] == "ds" and d["k"] == k
                              and d["seed"] == r["seed"]]
                        base = to_target(ds[0], t[name], key) if ds else None
                        if base:
                            ratios.append(value / base)
                    entry[f"{name}_{key}"] = mean_ci(got) + (len(got),)
                    entry[f"{name}_{key}_ratio"] = mean_ci(ratios) + (len(ratios),)
            for frac in (0.5, 1.0):
                accs = [accuracy_at(r["evals"], frac * args.rollouts) for r in runs]
                entry[f"acc_at_{frac:g}"] = mean_ci([a for a in accs if a is not None])
            entry["rollouts_per_effective_group"] = mean_ci(
                [r["rollouts_per_effective_group"] for r in runs])
            out.append(entry)
    return out


def accuracy_at(evals: list[dict[str, Any]], spent: float, key: str = "rollouts_cum"
                ) -> float | None:
    """Held-out accuracy interpolated at `spent` rollouts (or tokens); None past the curve."""
    points = sorted((e[key], e["accuracy"]) for e in evals)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= spent <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (spent - x0) / (x1 - x0)
    return None


def format_table(summary: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def ci(v: tuple, scale: float = 1.0, fmt: str = ",.0f") -> str:
        mean, half = v[0], v[1]
        if mean != mean:   # nan: no seed reached it
            return "not reached"
        return f"{format(mean * scale, fmt)} ± {format(half * scale, fmt)}"

    def reached(v: tuple) -> str:
        return f"{v[2]}/{args_seeds}"

    args_seeds = len(args.seeds)
    lines = []
    for name, title in (("ds_final", "DS's final accuracy"),
                        ("halfway", "halfway from the warm start to DS's final accuracy")):
        head = (f"{'k':>3} {'method':<17}{'rollouts to target':>22}{'x DS':>15}{'seeds':>7}"
                f"{'tokens to target':>24}{'x DS':>15}{'RL seconds':>16}")
        lines += [f"to {title} (mean ± 95% CI over seeds; x DS: per-seed ratio to DS)", head,
                  "-" * len(head)]
        for e in summary:
            r, t, w = (e[f"{name}_rollouts_cum"], e[f"{name}_tokens_cum"],
                       e[f"{name}_seconds_cum"])
            lines.append(
                f"{e['k']:>3} {e['label']:<17}{ci(r):>22}"
                f"{ci(e[f'{name}_rollouts_cum_ratio'], 1, '.2f'):>15}{reached(r):>7}"
                f"{ci(t):>24}{ci(e[f'{name}_tokens_cum_ratio'], 1, '.2f'):>15}"
                f"{ci(w, 1, '.0f'):>16}")
        lines.append("")
    head = (f"{'k':>3} {'method':<17}{'acc @ half budget':>20}{'acc @ budget':>18}"
            f"{'rollouts per mixed group':>27}")
    lines += ["accuracy at equal rollouts (mean ± 95% CI over seeds)", head, "-" * len(head)]
    for e in summary:
        lines.append(f"{e['k']:>3} {e['label']:<17}{ci(e['acc_at_0.5'], 100, '.1f'):>20}"
                     f"{ci(e['acc_at_1'], 100, '.1f'):>18}"
                     f"{ci(e['rollouts_per_effective_group'], 1, '.1f'):>27}")
    lines += ["", "rollouts per mixed group: rollouts spent per group with a non-zero advantage "
              "the trainer got; RL seconds: the steps' wall time (worker and trainer together, "
              "held-out evaluations excluded); x DS below 1 means fewer than DS."]
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def chart(rows: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> bool:
    """Held-out accuracy against rollouts, one panel per k, one line per run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no chart (pip install 'sara-rollout[bench]')")
        return False
    colors = {"uniform": "tab:gray", "ds": "tab:red", "sara": "tab:blue", "sara+dps": "tab:green"}
    fig, axes = plt.subplots(1, len(args.k), figsize=(6.5 * len(args.k), 4.4), sharey=True,
                             squeeze=False)
    for ax, k in zip(axes[0], args.k):
        for r in (r for r in rows if r["k"] == k):
            ax.plot([e["rollouts_cum"] for e in r["evals"]],
                    [100 * e["accuracy"] for e in r["evals"]], marker="o", ms=2.5, lw=1,
                    color=colors.get(r["method"]), alpha=0.8,
                    label=r["label"] if r["seed"] == args.seeds[0] else None)
        ax.set_title(f"k = {k} ({len(args.seeds)} seeds each)")
        ax.set_xlabel("rollouts spent")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0][0].set_ylabel("held-out greedy accuracy (%)")
    fig.suptitle("CPU RL on the arith task from the shipped warm start: accuracy per rollout")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def header(args: argparse.Namespace, argv: list[str], seconds: float) -> str:
    shape = demo_config(args, "sara", args.k[0], 0, Path("."))
    start = args.start_from or "the shipped warm start"
    return "\n".join([
        "End-to-end RL through the real service: rollouts to a target accuracy (bench/e2e.py)",
        f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"code:      {git_state(('service', 'client', 'worker', 'trainer'))}",
        f"command:   {shlex.join(['python', 'bench/e2e.py', *argv])}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {seconds / 60:.1f} min in all; load average at the end "
        f"{os.getloadavg()[0]:.1f}",
        f"setup:     sara demo's RL phase per run (alocal scheduler, hf worker, GRPO trainer, "
        f"{shape.batch_groups} mixed groups per batch, lr {shape.lr:g}) from {start}; "
        f"{args.pool} prompt pool; k {args.k}; seeds {args.seeds}; budget "
        f"{args.rollouts:,} rollouts per run; held-out {args.eval_size} problems, "
        f"{args.eval_points} evaluations per run",
        "",
    ])


def say(message: str) -> None:
    print(message, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--testbed" in argv:
        from _testbed_cli import main as testbed_main

        return testbed_main([a for a in argv if a != "--testbed"])
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="sara-e2e-out-"))
                                           if args.quick else RESULTS)
    work = Path(args.work or tempfile.mkdtemp(prefix="sara-e2e-"))
    methods = args.methods.split(",")
    if "ds" not in methods:
        methods = ["ds", *methods]   # the targets come from DS's runs
        args.methods = ",".join(methods)
    runs = [(k, seed, m) for k in args.k for seed in args.seeds for m in methods]
    rows = []
    for i, (k, seed, method) in enumerate(runs, 1):
        row = run_one(args, method, k, seed, work)
        rows.append(row)
        say(f"[{i}/{len(runs)}] k={k} seed {seed} {LABELS[method]}: {row['steps']} steps, "
            f"{row['rollouts']:,} rollouts, accuracy {_pct(row['accuracy_before'])} -> "
            f"{_pct(row['accuracy_after'])} ({row['seconds'] / 60:.1f} min)")
    summary = summarise(rows, args)
    text = header(args, argv, time.perf_counter() - started) + format_table(summary, args)
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.txt").write_text(text + "\n")
    (out / "e2e.json").write_text(json.dumps(
        {"argv": argv, "rollout_budget": args.rollouts, "k": args.k, "seeds": args.seeds,
         "code": git_state(("service", "client", "worker", "trainer")), "summary": summary,
         "runs": rows}, indent=2) + "\n")
    drew = chart(rows, args, out / "e2e.png")
    say(f"wrote {out / 'e2e.txt'}, {out / 'e2e.json'}" + (f", {out / 'e2e.png'}" if drew else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

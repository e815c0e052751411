#!/usr/bin/env python
"""End-to-end RL on the demo task under uniform, DS, SARA and SARA + DPS: held-out accuracy
against the rollouts and the tokens each spent.

Every method runs the whole product path of ``sara demo`` (``sara_trainer.demo.run_demo``): the
real scheduler on an embedded redis-server (``sara_client.alocal``), an hf-backend worker on the
tiny character-level GPT-2, and the GRPO trainer pulling effective batches, checkpointing and
publishing each step. What differs between methods is only the scheduler's ``policy`` and
``selection`` settings:

    uniform    policy uniform            k rollouts for every prompt, saturated groups delivered
    ds         policy dynamic_sampling   k for every prompt, saturated groups dropped (DAPO's DS)
    sara       policy sara               sequential allocation, abandons below tau_low (0.5)
    sara+dps   policy sara, selection dps   SARA on the prompts DPS predicts mixed

All methods start from one SFT checkpoint (trained here by steps, so every machine gets the same
weights), use the same seed, prompt pool, learning rate and batch shape (64 groups x k = 8), and
train until they have spent the same rollout budget. The held-out set (greedy, 1,000 problems
by default) is evaluated every ``budget / eval-points`` rollouts.

Usage:
    python bench/e2e.py                       # full run, about 35 min on 2 cores
    python bench/e2e.py --start-from DIR      # reuse an SFT checkpoint (skips the warm start)
    python bench/e2e.py --quick               # smoke run for CI: easy buckets, tiny budget

Writes ``bench/results/e2e.txt`` (header, table), ``e2e.json`` (every eval point) and
``e2e.png`` (accuracy vs rollouts and vs tokens), or under ``--out``.
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
    p.add_argument("--rollouts", type=int, default=None,
                   help="rollout budget per method (default 200000; quick 1500)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="trainer steps cap per method (default 400; quick 6)")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="supervised warm-start steps (default 900; quick 120)")
    p.add_argument("--start-from", default=None, help="an SFT checkpoint: skip the warm start")
    p.add_argument("--eval-points", type=int, default=None,
                   help="held-out evaluations per method (default 8; quick 2)")
    p.add_argument("--eval-size", type=int, default=None,
                   help="held-out problems (default 1000; quick 150)")
    p.add_argument("--pool", default="probe", choices=("probe", "flat"),
                   help="training prompts per bucket: 'probe' as sara demo (weighted by how "
                   "often a probe group came out mixed), 'flat' (equal: many saturated prompts)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="CI smoke run (easy buckets, tiny budget)")
    p.add_argument("--out", default=None, help="result directory (default bench/results, or a "
                   "temporary one with --quick)")
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--replot", default=None, metavar="E2E_JSON",
                   help="only redraw the chart of a recorded run, next to its JSON")
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {"rollouts": 1500 if quick else 200_000, "max_steps": 6 if quick else 400,
                "sft_steps": 120 if quick else 900, "eval_points": 2 if quick else 8,
                "eval_size": 150 if quick else 1000}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        p.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    if args.rollouts < 1 or args.max_steps < 1 or args.eval_points < 1:
        p.error("--rollouts, --max-steps and --eval-points must be >= 1")
    return args


def demo_config(args: argparse.Namespace, method: str, sft_dir: str | None, out: Path):
    """The ``sara demo`` configuration of one method's run."""
    from sara_trainer.demo import DemoConfig

    common = dict(seed=args.seed, out=str(out), progress=False, start_from=sft_dir, pool=args.pool,
                  rl_steps=args.max_steps, rollout_budget=args.rollouts,
                  eval_every_rollouts=max(1, args.rollouts // args.eval_points),
                  eval_size=args.eval_size, time_budget_s=6 * 3600.0,
                  batch_timeout_s=300.0, **METHODS[method])
    if args.quick:
        return DemoConfig.quick_defaults(**common)
    return DemoConfig(**common)


def warm_start(args: argparse.Namespace, work: Path) -> str:
    """The SFT checkpoint every method starts from: ``--start-from``, or trained here by steps."""
    if args.start_from:
        return args.start_from
    import torch
    from sara_trainer.checkpoint import save_checkpoint
    from sara_trainer.demo import QUICK_BUCKETS, auto_threads
    from sara_trainer.policy import load_policy
    from sara_trainer.sft import sft
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    torch.set_num_threads(auto_threads())
    torch.manual_seed(args.seed)
    build_tiny_policy(work / "init", TinyConfig(seed=args.seed))
    model, tokenizer = load_policy(work / "init")
    result = sft(model, tokenizer, max_steps=args.sft_steps, seed=args.seed,
                 buckets=list(QUICK_BUCKETS) if args.quick else None, progress=False)
    path = save_checkpoint(work / "sft", model, tokenizer, step=0, policy_version=0,
                           extra={"sft": result.to_dict()})
    say(f"SFT warm start: {result.steps} steps in {result.seconds:.0f}s -> {path}")
    return str(path)


def run_method(args: argparse.Namespace, method: str, sft_dir: str, work: Path
               ) -> dict[str, Any]:
    """One method's RL run; returns its eval curve and scheduler totals."""
    from sara_trainer.demo import run_demo

    started = time.perf_counter()
    summary = run_demo(demo_config(args, method, sft_dir, work / method))
    sched = summary["scheduler"]
    effective = sum(h["groups_mixed"] for h in summary["history"])
    return {
        "method": method, "label": LABELS[method], **METHODS[method],
        "steps": summary["rl"]["steps"], "seconds": time.perf_counter() - started,
        "accuracy_before": summary["accuracy"]["before_rl"],
        "accuracy_after": summary["accuracy"]["after_rl"],
        "evals": summary["evals"],
        "rollouts": sched["rollouts_spent"], "tokens": sched["tokens_spent"],
        "groups_delivered": sched["groups_delivered"],
        "groups_committed": sched["groups_committed"],
        "groups_abandoned": sched["groups_abandoned"],
        "groups_dropped": sched["groups_dropped"],
        # effective = mixed (a non-zero GRPO advantage), counted in the batches the trainer got:
        # under uniform the scheduler also delivers saturated groups, so its own figures count
        # them as delivered
        "groups_effective": effective,
        "useful_fraction": (sum(h["rollouts_mixed"] for h in summary["history"])
                            / max(1, sched["rollouts_spent"])),
        "rollouts_per_effective_group": sched["rollouts_spent"] / max(1, effective),
    }


def accuracy_at(evals: list[dict[str, Any]], spent: float, key: str = "rollouts_cum"
                ) -> float | None:
    """Held-out accuracy interpolated at `spent` rollouts (or tokens); None past the curve."""
    points = sorted((e[key], e["accuracy"]) for e in evals)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= spent <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (spent - x0) / (x1 - x0)
    return None


def format_table(rows: list[dict[str, Any]], budget: int) -> str:
    marks = [budget // 4, budget // 2, budget]
    head = (f"{'method':<18}{'steps':>6}{'rollouts':>10}{'tokens':>10}{'useful':>8}"
            f"{'r/eff':>7}{'acc@0':>8}" + "".join(f"{'acc@' + _k(m):>10}" for m in marks)
            + f"{'final':>8}{'minutes':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        at = [accuracy_at(r["evals"], m) for m in marks]
        lines.append(
            f"{r['label']:<18}{r['steps']:>6}{r['rollouts']:>10,}{r['tokens']:>10,}"
            f"{_pct(r['useful_fraction']):>8}{_num(r['rollouts_per_effective_group']):>7}"
            f"{_pct(r['accuracy_before']):>8}" + "".join(f"{_pct(a):>10}" for a in at)
            + f"{_pct(r['accuracy_after']):>8}{r['seconds'] / 60:>9.1f}")
    lines += ["", "useful: share of rollouts spent that the trainer got inside mixed groups "
              "(a non-zero advantage); r/eff: rollouts spent per mixed group trained on; acc@N: "
              "held-out greedy accuracy after N rollouts (linear between evaluations)."]
    return "\n".join(lines)


def _k(n: int) -> str:
    return f"{n / 1000:g}k" if n >= 1000 else str(n)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def chart(rows: list[dict[str, Any]], path: Path) -> bool:
    """Accuracy against rollouts and against tokens, one line per method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no chart (pip install 'sara-rollout[bench]')")
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    for r in rows:
        for ax, key in zip(axes, ("rollouts_cum", "tokens_cum", "step")):
            xs = [e[key] for e in r["evals"]]
            ax.plot(xs, [100 * e["accuracy"] for e in r["evals"]], marker="o", ms=3,
                    label=r["label"])
    axes[0].set_xlabel("rollouts spent")
    axes[1].set_xlabel("tokens generated")
    axes[2].set_xlabel("trainer steps (64 groups each; uniform's include saturated groups)")
    axes[0].set_ylabel("held-out greedy accuracy (%)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("CPU RL on the arith task (tiny GPT-2, k = 8): accuracy per unit of compute")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def header(args: argparse.Namespace, argv: list[str], seconds: float) -> str:
    shape = demo_config(args, "sara", None, Path("."))
    return "\n".join([
        "End-to-end RL through the real service, per method (bench/e2e.py)",
        f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"code:      {git_state(('service', 'client', 'worker', 'trainer'))}",
        f"command:   {shlex.join(['python', 'bench/e2e.py', *argv])}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {seconds / 60:.1f} min in all; load average at the end "
        f"{os.getloadavg()[0]:.1f}",
        f"setup:     sara demo's RL phase per method (alocal scheduler, hf worker, GRPO trainer, "
        f"{shape.batch_groups} groups x k={shape.group_size} per batch, lr {shape.lr:g}); "
        f"SFT {args.sft_steps} steps"
        + (f" (reused {args.start_from})" if args.start_from else "")
        + f"; {args.pool} prompt pool; budget {args.rollouts:,} rollouts or {args.max_steps} "
        f"steps; held-out "
        f"{args.eval_size} problems; seed {args.seed}",
        "",
    ])


def say(message: str) -> None:
    print(message, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.replot:
        recorded = Path(args.replot)
        chart(json.loads(recorded.read_text())["methods"], recorded.with_suffix(".png"))
        return 0
    started = time.perf_counter()
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="sara-e2e-out-"))
                                           if args.quick else RESULTS)
    work = Path(args.work or tempfile.mkdtemp(prefix="sara-e2e-"))
    sft_dir = warm_start(args, work)
    rows = []
    methods = args.methods.split(",")
    for i, method in enumerate(methods, 1):
        say(f"[{i}/{len(methods)}] {LABELS[method]}: RL until {args.rollouts:,} rollouts "
            f"or {args.max_steps} steps ...")
        row = run_method(args, method, sft_dir, work)
        rows.append(row)
        say(f"    {row['steps']} steps, {row['rollouts']:,} rollouts, accuracy "
            f"{_pct(row['accuracy_before'])} -> {_pct(row['accuracy_after'])} "
            f"({row['seconds'] / 60:.1f} min)")
    text = header(args, argv, time.perf_counter() - started) + format_table(rows, args.rollouts)
    print("\n" + text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.txt").write_text(text + "\n")
    (out / "e2e.json").write_text(json.dumps(
        {"argv": argv, "sft_checkpoint": sft_dir, "rollout_budget": args.rollouts,
         "code": git_state(("service", "client", "worker", "trainer")), "methods": rows},
        indent=2) + "\n")
    drew = chart(rows, out / "e2e.png")
    say(f"wrote {out / 'e2e.txt'}, {out / 'e2e.json'}" + (f", {out / 'e2e.png'}" if drew else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

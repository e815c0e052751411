"""``sara demo``: scheduler, worker and trainer end to end on this CPU, nothing downloaded.

1. build the tiny character-level GPT-2 (``sara_trainer.tiny``) and warm it up with SFT on the
   ``arith`` task (``sft_steps`` of teacher forcing, or ``sft_seconds`` when steps are None);
2. evaluate it greedily on held-out problems (**before**);
3. start the scheduler in-process (``sara_client.alocal``: the real app and Lua scripts on an
   embedded Redis, policy ``sara``), load the arith training prompts (``meta.reversed_answer``);
4. run a worker (``WorkerLoop`` with the ``hf`` backend, or ``vllm`` when asked and importable) on
   the same event loop, and the trainer (``sara_trainer.loop.Trainer``, GRPO) on a thread, for
   ``rl_steps`` steps; each step checkpoints and publishes a policy version the worker reloads;
5. evaluate again (**after**), print the summary table, write ``summary.json`` and ``chart.png``.

The RL phase (step 3-4) is in :mod:`sara_trainer.demo_rl`.

``summary.json`` holds: ``seed``, ``backend``, ``quick``, ``wall_seconds``, ``sft`` (steps,
seconds, final loss), ``accuracy`` (``before_rl``, ``after_rl``, ``n``, by bucket),
``rl`` (steps, policy version, batches acked, losses finite, worker policy loads, ...),
``scheduler`` (rollouts and tokens spent, groups committed / abandoned / delivered / dropped,
rollouts saved against Dynamic Sampling, useful fraction, rollouts per effective group), and
``history`` (one entry per step) and ``evals`` (held-out accuracy every ``eval_every`` steps).
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("sara.demo")

QUICK_BUCKETS = ("add1", "add2", "sub1")


@dataclass
class DemoConfig:
    sft_steps: int | None = 900         # by steps: the same weights on any machine
    sft_seconds: float = 210.0          # the warm start's time budget when sft_steps is None
    rl_steps: int = 120
    seed: int = 0
    out: str = "./sara-demo"
    backend: str = "hf"
    quick: bool = False
    prompts: int = 5000                 # training prompts registered with the scheduler
    eval_size: int = 2000               # held-out problems, greedy
    eval_every: int = 10                # held-out evaluation every this many RL steps
    group_size: int = 8                 # k
    batch_groups: int = 64              # effective groups per trainer batch
    lr: float = 1e-4                    # 3e-4 dipped held-out accuracy for ~70 steps first
    lr_warmup_steps: int = 10
    max_new_tokens: int = 8
    threads: int | None = None          # torch threads for SFT/eval; None: 2, or 1 on a busy box
    rl_threads: int = 1                 # per torch thread in RL (trainer and worker run at once)
    time_budget_s: float = 520.0        # RL stops early so the whole demo ends within this
    batch_timeout_s: float = 120.0      # give up when no batch comes for this long
    progress: bool = True
    buckets: tuple[str, ...] | None = None   # None: every arith bucket
    start_from: str | None = None       # an SFT'd checkpoint to start RL from (skips SFT)
    prefetch_batches: int = 1           # the scheduler keeps this many batches in the making
    max_staleness: int = 1              # policy versions a delivered group may lag
    probe_per_bucket: int = 24          # prompts per bucket sampled k times to weight the pool
    bucket_floor: float = 0.01          # every bucket keeps at least this weight
    pool: str = "probe"                 # "probe": buckets weighted as above; "flat": equal
    policy: str = "sara"                # the scheduler's allocation policy
    selection: str = "epoch"            # the scheduler's prompt selection
    advantage_estimator: str = "grpo"   # the trainer's; "gae" trains a critic (PPO)
    rollout_budget: int | None = None   # RL also stops once it has spent this many rollouts
    eval_every_rollouts: int | None = None   # evaluate by rollouts spent instead of by steps
    trainer_options: dict[str, Any] = field(default_factory=dict)  # more TrainerConfig fields

    @classmethod
    def quick_defaults(cls, **over: Any) -> DemoConfig:
        """Tiny budgets for tests: easy buckets only, small batches, short SFT."""
        base = dict(sft_steps=None, sft_seconds=25.0, rl_steps=3, prompts=300, eval_size=150, eval_every=1,
                    batch_groups=8, lr=5e-4, buckets=QUICK_BUCKETS, batch_timeout_s=60.0,
                    quick=True)
        base.update({k: v for k, v in over.items() if v is not None})
        return cls(**base)


def _say(cfg: DemoConfig, message: str) -> None:
    if cfg.progress:
        from rich.console import Console

        Console().print(message, highlight=False)
    log.info(message)


def _accuracy(model, tokenizer, eval_set, max_new_tokens: int) -> dict[str, Any]:
    from .policy import greedy_accuracy

    was = model.training
    try:
        return greedy_accuracy(model, tokenizer, eval_set, max_new_tokens=max_new_tokens)
    finally:
        model.train(was)


def prompt_pool(model, tokenizer, cfg: DemoConfig, buckets: list[str] | None
                ) -> tuple[list[dict], dict[str, float]]:
    """The RL training prompts, spread over the buckets by how often a group of k samples comes
    out mixed on a small probe (a bucket-level predictor, measured on training problems; SARA still
    decides every group). A policy that has learnt only some buckets then spends its rollouts
    where groups can be effective, whatever SFT reached on this machine in its time budget.

    Returns (prompts, {bucket: weight}); weights are the mixed fraction plus ``bucket_floor``,
    or equal with ``pool="flat"`` (no probe: the allocator alone meets the saturated buckets).
    """
    import torch

    from .policy import group_outcomes
    from .tasks.arith import BUCKET_NAMES, make_split

    names = list(buckets or BUCKET_NAMES)
    if cfg.pool == "flat":
        return _pool(cfg, {b: 1.0 / len(names) for b in names})
    probe = [p for b in names
             for p in make_split(min(cfg.probe_per_bucket, _capacity(b)),
                                 seed=cfg.seed + 1, buckets=[b])]
    spread = group_outcomes(model, tokenizer, probe, k=cfg.group_size, temperature=1.0,
                            max_new_tokens=cfg.max_new_tokens,
                            generator=torch.Generator().manual_seed(cfg.seed))
    weights = {b: spread["by_bucket"].get(b, {}).get("mixed", 0.0) + cfg.bucket_floor
               for b in names}
    total = sum(weights.values())
    return _pool(cfg, {b: weights[b] / total for b in names})


def _pool(cfg: DemoConfig, shares: dict[str, float]) -> tuple[list[dict], dict[str, float]]:
    """``cfg.prompts`` training prompts split over the buckets by `shares`, shuffled."""
    import random

    from .tasks.arith import make_split

    prompts: list[dict] = []
    for b, share in shares.items():
        n = max(1, round(cfg.prompts * share))
        prompts.extend(make_split(min(n, _capacity(b)), seed=cfg.seed, buckets=[b]))
    random.Random(cfg.seed).shuffle(prompts)
    return prompts, shares


def _capacity(bucket: str) -> int:
    """Training problems a bucket holds (big buckets: more than any demo asks for)."""
    from .tasks.arith import get_bucket, split_size

    if get_bucket(bucket).size() > 20_000:
        return 1 << 30
    return split_size(bucket, "train")


def auto_threads() -> int:
    """2 torch threads (this project's 2-core box), or 1 when the machine is already busy:
    OpenMP threads on an oversubscribed CPU wait on each other (10x slower steps measured)."""
    import os

    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0] > cores - 0.5
    except OSError:
        busy = False
    return 1 if busy or cores < 2 else 2


def _quiet() -> None:
    """No per-load tqdm bars from transformers between our own progress bars."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the whole demo; returns the summary (also written to ``out/summary.json``)."""
    import torch

    started = time.perf_counter()
    deadline = started + cfg.time_budget_s
    _quiet()
    threads = cfg.threads or auto_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    work = out / "sara-demo-work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)

    from .checkpoint import save_checkpoint
    from .demo_rl import run_rl
    from .policy import load_policy
    from .sft import SFTResult, sft
    from .tasks.arith import make_eval_set
    from .tiny import TinyConfig, build_tiny_policy

    buckets = list(cfg.buckets) if cfg.buckets else None
    build_tiny_policy(work / "init", TinyConfig(seed=cfg.seed))
    model, tokenizer = load_policy(work / "init")
    eval_set = make_eval_set(cfg.eval_size, seed=cfg.seed, buckets=buckets)
    length = f"{cfg.sft_steps} steps" if cfg.sft_steps else f"{cfg.sft_seconds:.0f}s"
    _say(cfg, f"[bold]1/4 SFT warm start[/] ({length}, tiny GPT-2 "
              f"{sum(p.numel() for p in model.parameters()):,} params)")
    if cfg.start_from:
        model, tokenizer = load_policy(cfg.start_from)
        sft_result = SFTResult(steps=0, seconds=0.0, answer_tokens=0, total_tokens=0)
    else:
        sft_result = sft(model, tokenizer, max_seconds=None if cfg.sft_steps else cfg.sft_seconds,
                         max_steps=cfg.sft_steps, seed=cfg.seed,
                         buckets=buckets, progress=cfg.progress)
    sft_dir = save_checkpoint(work / "sft", model, tokenizer, step=0, policy_version=0,
                              extra={"sft": sft_result.to_dict()})
    _say(cfg, "[bold]2/4 held-out evaluation before RL[/]")
    eval_seconds = time.perf_counter()
    before = _accuracy(model, tokenizer, eval_set, cfg.max_new_tokens)
    eval_seconds = time.perf_counter() - eval_seconds
    _say(cfg, f"    greedy accuracy {100 * before['accuracy']:.1f}% on {before['n']} problems")
    prompts, pool_weights = prompt_pool(model, tokenizer, cfg, buckets)
    _say(cfg, "    RL prompt pool by bucket (mixed-group probe): " + ", ".join(
        f"{b} {100 * w:.0f}%" for b, w in pool_weights.items()))
    del model

    _say(cfg, f"[bold]3/4 RL with {cfg.policy}[/] ({cfg.rl_steps} steps, {cfg.batch_groups} "
              f"groups x k={cfg.group_size}, backend {cfg.backend})")
    torch.set_num_threads(cfg.rl_threads)
    # leave time for the final evaluation, the chart and shutting down
    rl_deadline = deadline - 2 * eval_seconds - 15
    result = asyncio.run(run_rl(cfg, work, str(sft_dir), prompts, eval_set, before, rl_deadline))
    torch.set_num_threads(threads)
    trainer, stats, worker_counters, history, evals = result

    _say(cfg, "[bold]4/4 held-out evaluation after RL[/]")
    after = _accuracy(trainer.model, tokenizer, eval_set, cfg.max_new_tokens)
    if not evals or evals[-1]["step"] != trainer.step:
        last = history[-1] if history else {}
        evals.append({"step": trainer.step, "accuracy": after["accuracy"],
                      "rollouts_cum": last.get("rollouts_cum", 0),
                      "tokens_cum": last.get("tokens_cum", 0)})
    c, d = stats.counters, stats.derived
    reports = trainer.reports
    summary = {
        "seed": cfg.seed, "backend": cfg.backend, "quick": cfg.quick,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "wall_seconds": time.perf_counter() - started,
        "prompt_pool": {"prompts": len(prompts), "bucket_weights": pool_weights},
        "sft": {"steps": sft_result.steps, "seconds": sft_result.seconds,
                "final_loss": sft_result.final_loss},
        "accuracy": {"before_rl": before["accuracy"],
                     "after_rl": after["accuracy"], "n": after["n"],
                     "by_bucket_before": before["by_bucket"],
                     "by_bucket_after": after["by_bucket"]},
        "rl": {"steps": trainer.step, "policy_version": trainer.version,
               "published_version": stats.policy.version,
               "checkpoint": trainer.checkpoint,
               "batches_acked": len(trainer.acked),
               "every_batch_acked": [r.batch_id for r in reports] == trainer.acked,
               "losses_finite": all(math.isfinite(r.loss) for r in reports),
               "worker_policy_loads": worker_counters.policy_loads,
               "worker_errors": worker_counters.errors,
               "mean_reward_first": reports[0].mean_reward if reports else None,
               "mean_reward_last": reports[-1].mean_reward if reports else None,
               "seconds": sum(r.seconds for r in reports)},
        "scheduler": {
            "rollouts_spent": c.rollouts_completed, "tokens_spent": c.tokens_generated,
            "rollouts_issued": c.rollouts_issued, "rollouts_cancelled": c.rollouts_cancelled,
            "groups_opened": c.groups_opened, "groups_committed": c.groups_committed,
            "groups_abandoned": c.groups_abandoned, "groups_delivered": c.groups_delivered,
            "groups_dropped": c.groups_dropped_saturated + c.groups_dropped_stale,
            "rollouts_saved_vs_ds": c.rollouts_saved_vs_ds,
            "useful_fraction": d.useful_fraction,
            "rollouts_per_effective_group": d.rollouts_per_effective_group,
            "ds_rollouts_per_effective_group": d.ds_rollouts_per_effective_group,
            "expected_false_abandons": c.expected_false_abandons},
        "history": history, "evals": evals,
    }
    from .report import plot_chart, print_summary, write_json

    summary["files"] = {"summary": str(out / "summary.json"), "chart": str(out / "chart.png")}
    plot_chart(summary, out / "chart.png")
    summary["wall_seconds"] = time.perf_counter() - started
    write_json(summary, out / "summary.json")
    if cfg.progress:
        print_summary(summary)
        _say(cfg, f"wrote {out / 'summary.json'} and {out / 'chart.png'}")
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m sara_trainer.demo``: the same as ``sara demo``."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sft-seconds", type=float, default=None)
    p.add_argument("--sft-steps", type=int, default=None)
    p.add_argument("--rl-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="./sara-demo")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--start-from", default=None, help="SFT'd checkpoint: skip SFT")
    args = p.parse_args(argv)
    cfg = make_config(args.sft_seconds, args.rl_steps, args.seed, args.out, args.backend,
                      args.quick, not args.no_progress, sft_steps=args.sft_steps)
    cfg.start_from = args.start_from
    return run_demo(cfg)


def make_config(sft_seconds: float | None, rl_steps: int | None, seed: int, out: str,
                backend: str, quick: bool, progress: bool = True,
                sft_steps: int | None = None) -> DemoConfig:
    """The demo's configuration from its command-line options (None: the default)."""
    over = {"sft_seconds": sft_seconds, "rl_steps": rl_steps, "seed": seed, "out": str(out),
            "backend": backend, "progress": progress, "sft_steps": sft_steps}
    if quick:
        cfg = DemoConfig.quick_defaults(**over)
    else:
        cfg = DemoConfig(**{k: v for k, v in over.items() if v is not None})
    if sft_seconds is not None and sft_steps is None:
        cfg.sft_steps = None  # a time budget was asked for: warm up by time
    return cfg


if __name__ == "__main__":
    main()

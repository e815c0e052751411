"""``sara demo``: scheduler, worker and trainer end to end on this CPU, nothing downloaded, and
SARA measured against Dynamic Sampling in the same run.

1. **warm start**: the tiny character-level GPT-2 shipped in the package
   (:mod:`sara_trainer.warmstart`, checked by SHA-256, so every machine starts from the same
   weights); it imitated arithmetic demonstrations of which a share forget the carry, so greedy
   decoding gets many carry problems wrong while sampling often gets them right. ``sft_steps`` /
   ``sft_seconds`` warm up here instead, ``start_from`` starts from a given checkpoint;
2. evaluate it greedily on held-out problems (**before**);
3. **SARA arm**: the scheduler in-process (``sara_client.alocal``: the real app and Lua scripts on
   an embedded Redis, policy ``sara``) with the arith training prompts in the task's own mix, a
   worker (``WorkerLoop``, ``hf`` backend, or ``vllm`` when asked) and the GRPO trainer, until the
   rollout budget is spent; each step checkpoints and publishes a policy version the worker
   reloads; held-out evaluations along the way;
4. **Dynamic Sampling arm** (unless ``compare`` is off): the same from the same warm start, seed
   and prompts, to the rollouts SARA spent;
5. print the side-by-side table, write ``summary.json`` and ``chart.png``.

The arms are run by :mod:`sara_trainer.demo_arms`, one RL phase by :mod:`sara_trainer.demo_rl`,
the comparison figures by :mod:`sara_trainer.demo_compare`.

``summary.json`` holds: ``seed``, ``backend``, ``quick``, ``wall_seconds``, ``warm_start``,
``accuracy`` (``before_rl``, ``after_rl`` of the SARA arm, ``n``, standard errors, by bucket),
``rl`` and ``scheduler`` (the SARA arm's trainer and scheduler counters), ``history`` and ``evals``
(the SARA arm's steps and held-out evaluations), ``arms`` (each arm's measured figures and
evaluation curve), and ``comparison`` (DS's final accuracy, the rollouts and tokens SARA needed
to reach it, rollouts per mixed group of each) or, without the DS arm, ``estimate`` (the
scheduler's own estimate of DS's rollouts per mixed group, named as one).
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
    sft_steps: int | None = None        # SFT here for this many steps instead of the shipped start
    sft_seconds: float | None = None    # or for this long
    rl_steps: int = 1000                # a cap: the rollout budget ends each arm first
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
    time_budget_s: float = 480.0        # each arm stops early so the whole demo ends within this
    batch_timeout_s: float = 120.0      # give up when no batch comes for this long
    progress: bool = True
    buckets: tuple[str, ...] | None = None   # None: every arith bucket
    start_from: str | None = None       # an SFT'd checkpoint to start RL from (skips SFT)
    prefetch_batches: int = 1           # the scheduler keeps this many batches in the making
    max_staleness: int = 1              # policy versions a delivered group may lag
    probe_per_bucket: int = 24          # prompts per bucket sampled k times to weight the pool
    bucket_floor: float = 0.01          # every bucket keeps at least this weight
    pool: str = "flat"                  # "flat": the task's own mix; "probe": weighted as above
    policy: str = "sara"                # the scheduler's allocation policy
    selection: str = "epoch"            # the scheduler's prompt selection
    advantage_estimator: str = "grpo"   # the trainer's; "gae" trains a critic (PPO)
    rollout_budget: int | None = 15_000  # each arm stops once it has spent this many rollouts
    eval_every_rollouts: int | None = 1_000  # held-out evaluation every this many rollouts
    compare: bool = True                # run Dynamic Sampling after SARA, to the same rollouts
    trainer_options: dict[str, Any] = field(default_factory=dict)  # more TrainerConfig fields
    report_to: str = "none"             # experiment tracking of each arm, as sara train's

    @classmethod
    def quick_defaults(cls, **over: Any) -> DemoConfig:
        """Small budgets for tests (about a minute and a half on 2 cores): the shipped warm
        start, both arms to 8,000 rollouts of 16-group batches, 600 held-out problems."""
        base = dict(rollout_budget=8_000, eval_every_rollouts=2_000, prompts=1_000,
                    eval_size=600, batch_groups=16, lr=3e-4, batch_timeout_s=60.0, quick=True)
        base.update(over)   # None given here means None (no budget, no evaluations, ...)
        return cls(**base)


def say(cfg: DemoConfig, message: str) -> None:
    """Print a progress line (when ``cfg.progress``) and log it."""
    if cfg.progress:
        from rich.console import Console

        Console().print(message, highlight=False)
    log.info(message)


def heldout_accuracy(model, tokenizer, eval_set, max_new_tokens: int) -> dict[str, Any]:
    """Greedy accuracy on `eval_set` (overall and by bucket), leaving the model's mode as it was."""
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

    from .demo_arms import build_summary, run_arms
    from .tasks.arith import make_eval_set

    buckets = list(cfg.buckets) if cfg.buckets else None
    model, tokenizer, start_dir, warm = warm_start(cfg, work, buckets)
    eval_set = make_eval_set(cfg.eval_size, seed=cfg.seed, buckets=buckets)
    say(cfg, "[bold]2/4 held-out evaluation before RL[/]")
    eval_seconds = time.perf_counter()
    before = heldout_accuracy(model, tokenizer, eval_set, cfg.max_new_tokens)
    eval_seconds = time.perf_counter() - eval_seconds
    say(cfg, f"    greedy accuracy {100 * before['accuracy']:.1f}% on {before['n']} problems")
    prompts, pool_weights = prompt_pool(model, tokenizer, cfg, buckets)
    say(cfg, "    RL prompt pool by bucket: " + ", ".join(
        f"{b} {100 * w:.0f}%" for b, w in pool_weights.items()))
    del model

    torch.set_num_threads(cfg.rl_threads)
    arms = run_arms(cfg, work, start_dir, prompts, eval_set, before, deadline, eval_seconds)
    torch.set_num_threads(threads)
    summary = build_summary(cfg, arms, before, warm, prompts, pool_weights)
    from .report import plot_chart, print_summary, write_json

    summary["files"] = {"summary": str(out / "summary.json"), "chart": str(out / "chart.png")}
    plot_chart(summary, out / "chart.png")
    summary["wall_seconds"] = time.perf_counter() - started
    write_json(summary, out / "summary.json")
    if cfg.progress:
        print_summary(summary)
        say(cfg, f"wrote {out / 'summary.json'} and {out / 'chart.png'}")
    return summary


def warm_start(cfg: DemoConfig, work: Path, buckets: list[str] | None):
    """(model, tokenizer, directory RL starts from, description) of the warm start: a given
    checkpoint (``start_from``), SFT here (``sft_steps`` or ``sft_seconds``), or by default the
    warm start shipped in the package (checked against its SHA-256: the same on every machine)."""
    from .checkpoint import save_checkpoint
    from .policy import load_policy
    from .sft import sft
    from .tiny import TinyConfig, build_tiny_policy
    from .warmstart import file_sha256, read_manifest, verified_warmstart

    if cfg.start_from:
        say(cfg, f"[bold]1/4 warm start[/] from {cfg.start_from}")
        model, tokenizer = load_policy(cfg.start_from)
        return model, tokenizer, str(cfg.start_from), {"source": "checkpoint",
                                                        "path": str(cfg.start_from)}
    if cfg.sft_steps is None and cfg.sft_seconds is None:
        directory = verified_warmstart()
        manifest = read_manifest(directory)
        say(cfg, f"[bold]1/4 warm start[/]: the shipped tiny GPT-2 ({manifest['sft']['steps']} "
                  "SFT steps on arith demonstrations, some of which forget the carry; "
                  f"SHA-256 {manifest['sha256']['model.safetensors'][:12]})")
        model, tokenizer = load_policy(directory)
        return model, tokenizer, str(directory), {
            "source": "shipped", "path": str(directory), "sha256": file_sha256(
                directory / "model.safetensors"), "recipe": manifest["recipe"],
            "sft": manifest["sft"]}
    build_tiny_policy(work / "init", TinyConfig(seed=cfg.seed))
    model, tokenizer = load_policy(work / "init")
    length = f"{cfg.sft_steps} steps" if cfg.sft_steps else f"{cfg.sft_seconds:.0f}s"
    say(cfg, f"[bold]1/4 SFT warm start[/] ({length}, tiny GPT-2 "
              f"{sum(p.numel() for p in model.parameters()):,} params)")
    result = sft(model, tokenizer, max_seconds=None if cfg.sft_steps else cfg.sft_seconds,
                 max_steps=cfg.sft_steps, seed=cfg.seed, buckets=buckets, progress=cfg.progress)
    sft_dir = save_checkpoint(work / "sft", model, tokenizer, step=0, policy_version=0,
                              extra={"sft": result.to_dict()})
    return model, tokenizer, str(sft_dir), {"source": "sft", "steps": result.steps,
                                            "seconds": result.seconds,
                                            "final_loss": result.final_loss}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m sara_trainer.demo``: the same as ``sara demo``."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sft-seconds", type=float, default=None)
    p.add_argument("--sft-steps", type=int, default=None)
    p.add_argument("--rl-steps", type=int, default=None)
    p.add_argument("--rollouts", type=int, default=None, help="rollout budget of each arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="./sara-demo")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-compare", action="store_true", help="skip the Dynamic Sampling arm")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--start-from", default=None, help="SFT'd checkpoint: skip SFT")
    args = p.parse_args(argv)
    cfg = make_config(args.quick, sft_seconds=args.sft_seconds, sft_steps=args.sft_steps,
                      rl_steps=args.rl_steps, rollout_budget=args.rollouts, seed=args.seed,
                      out=args.out, backend=args.backend, progress=not args.no_progress,
                      compare=not args.no_compare, start_from=args.start_from)
    return run_demo(cfg)


def make_config(quick: bool = False, **options: Any) -> DemoConfig:
    """The demo's configuration from its command-line options (an option given as None keeps
    its default; ``quick`` starts from :meth:`DemoConfig.quick_defaults`)."""
    given = {k: (str(v) if k == "out" else v) for k, v in options.items() if v is not None}
    if quick:
        return DemoConfig.quick_defaults(**given)
    return DemoConfig(**given)


if __name__ == "__main__":
    main()

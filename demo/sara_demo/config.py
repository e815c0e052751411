"""The demo's configuration (:class:`DemoConfig`) and its progress lines."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
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
    scheduler_options: dict[str, Any] = field(default_factory=dict)  # more scheduler settings
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


def make_config(quick: bool = False, **options: Any) -> DemoConfig:
    """The demo's configuration from its command-line options (an option given as None keeps
    its default; ``quick`` starts from :meth:`DemoConfig.quick_defaults`)."""
    given = {k: (str(v) if k == "out" else v) for k, v in options.items() if v is not None}
    if quick:
        return DemoConfig.quick_defaults(**given)
    return DemoConfig(**given)

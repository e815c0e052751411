"""The trainer's configuration: one flat dataclass, round-tripped through plain dicts (JSON) so it
travels inside every checkpoint's ``trainer_state.json``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# "gae": PPO with a learned critic (verl's name); the others need no critic
ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class TrainerConfig:
    # policy
    model: str = "./sara-data/tiny-policy"      # HF directory (or checkpoint root) to start from
    device: str = "cpu"                         # cpu, cuda, cuda:N, or auto (cuda if present)
    dtype: str = "auto"                         # auto: fp32 weights, bf16 autocast on CUDA
    gradient_checkpointing: bool = False        # recompute activations in backward
    threads: int = 2                            # torch intra-op threads on CPU
    seed: int = 0
    task: str = "arith"
    # RL optimisation
    lr: float = 1e-4
    lr_warmup_steps: int = 0                    # linear warm-up of the RL learning rate
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    k: int = 8                                  # rollouts per group
    batch_groups: int = 32                      # groups per trainer batch
    micro_batch_rollouts: int = 256             # rollouts per forward/backward pass (at most)
    micro_batch_tokens: int = 0                 # padded tokens per pass (at most); 0: no budget
    logprob_chunk_rows: int = 1024              # completion positions per output-head chunk
    updates_per_batch: int = 1                  # optimiser steps per batch (> 1: off-policy PPO)
    advantage_estimator: str = "grpo"
    advantage_eps: float = 1e-6
    std_unbiased: bool = True                   # Bessel-corrected std in GRPO / Reinforce++
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28                 # DAPO clip-higher
    kl_coef: float = 0.0                        # k3 KL to the reference (initial) policy
    loss_aggregation: str = "token-mean"
    # PPO critic (advantage_estimator "gae")
    gamma: float = 1.0                          # discount over completion tokens
    gae_lambda: float = 0.95
    critic_lr: float = 1e-4
    value_clip_eps: float = 0.2                 # 0: unclipped value loss
    normalize_values: bool = True               # the critic predicts running-normalised returns
    whiten_advantages: bool = True              # mean 0, std 1 over the batch's tokens
    critic_warmup_steps: int = 0                # first steps train only the critic
    # sampling (sent to the workers with each policy)
    max_new_tokens: int = 8
    temperature: float = 1.0
    # steps and checkpoints
    max_steps: int = 200
    checkpoint_dir: str = "./sara-data/checkpoints"
    checkpoint_every: int = 10                  # full resume checkpoints (with the optimiser)
    publish_every: int = 0                      # weights-only policy versions; 0: = checkpoint_every
    keep_checkpoints: int = 3
    eval_every: int = 10
    eval_size: int = 1000
    # SFT warm start
    sft_steps: int | None = None
    sft_seconds: float | None = 240.0
    sft_lr: float = 3e-3
    sft_batch_size: int = 256
    sft_schedule: str = "cosine"
    sft_warmup_steps: int = 20
    # service
    service_url: str = "http://127.0.0.1:8000"
    batch_wait_s: float = 30.0
    extra: dict[str, Any] = field(default_factory=dict)   # free-form, kept verbatim

    def __post_init__(self) -> None:
        problems = []
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            problems.append(f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS}")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            problems.append(f"loss_aggregation must be one of {LOSS_AGGREGATIONS}")
        if self.sft_schedule not in LR_SCHEDULES:
            problems.append(f"sft_schedule must be one of {LR_SCHEDULES}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            problems.append("dtype must be auto, float32, bfloat16 or float16")
        for name in ("lr", "critic_lr", "sft_lr", "k", "batch_groups", "micro_batch_rollouts",
                     "updates_per_batch", "max_new_tokens", "sft_batch_size", "threads",
                     "logprob_chunk_rows"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        for name in ("clip_eps_low", "clip_eps_high", "kl_coef", "temperature", "weight_decay",
                     "advantage_eps", "grad_clip", "sft_warmup_steps", "max_steps",
                     "value_clip_eps", "critic_warmup_steps", "lr_warmup_steps",
                     "micro_batch_tokens", "publish_every"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.clip_eps_low >= 1:
            problems.append("clip_eps_low must be < 1")
        for name in ("gamma", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be in [0, 1]")
        if self.k < 2:
            problems.append("k must be >= 2 (a group of one has no advantage)")
        if problems:
            raise ValueError("invalid TrainerConfig: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], strict: bool = True) -> TrainerConfig:
        """Build from a dict; unknown keys are a ValueError when `strict`, else ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown and strict:
            raise ValueError(f"unknown TrainerConfig fields: {', '.join(unknown)}")
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self, **changes: Any) -> TrainerConfig:
        return dataclasses.replace(self, **changes)

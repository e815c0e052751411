"""The trainer's configuration: one flat dataclass, round-tripped through plain dicts (JSON) so it
travels inside every checkpoint's ``trainer_state.json``.

Only what the trainer reads is here. The group size, the batch size and the sampling parameters
(temperature, top_p, max_tokens) are the scheduler's settings, the one source of truth: each
batch arrives with its groups and each rollout with the sampling it was generated with."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# "gae": PPO with a learned critic (verl's name); the others need no critic
ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae")
# names a user may reach for that belong to the scheduler (the error for them says so)
SCHEDULER_SETTINGS = frozenset({"k", "group_size", "batch_groups", "batch_size", "temperature",
                                "top_p", "max_tokens", "max_new_tokens"})
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass
class TrainerConfig:
    # policy
    model: str = "./sara-data/tiny-policy"      # HF directory (or checkpoint root) to start from
    device: str = "cpu"                         # cpu, cuda, cuda:N, or auto (cuda if present)
    dtype: str = "auto"                         # auto: fp32 weights, bf16 autocast on CUDA
    gradient_checkpointing: bool = False        # recompute activations in backward
    threads: int = 2                            # torch intra-op threads on CPU
    seed: int = 0
    # RL optimisation
    lr: float = 1e-4
    lr_warmup_steps: int = 0                    # linear warm-up of the RL learning rate
    weight_decay: float = 0.0
    grad_clip: float = 1.0
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
    # steps and checkpoints
    max_steps: int = 200
    checkpoint_dir: str = "./sara-data/checkpoints"
    checkpoint_every: int = 10                  # full resume checkpoints (with the optimiser)
    publish_every: int = 0                      # weights-only policy versions; 0: = checkpoint_every
    keep_checkpoints: int = 3
    # service
    batch_wait_s: float = 30.0                  # long poll for the next batch
    extra: dict[str, Any] = field(default_factory=dict)   # free-form, kept verbatim

    def __post_init__(self) -> None:
        problems = []
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            problems.append(f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS}")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            problems.append(f"loss_aggregation must be one of {LOSS_AGGREGATIONS}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            problems.append("dtype must be auto, float32, bfloat16 or float16")
        for name in ("lr", "critic_lr", "micro_batch_rollouts", "updates_per_batch", "threads",
                     "logprob_chunk_rows"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be > 0")
        for name in ("clip_eps_low", "clip_eps_high", "kl_coef", "weight_decay",
                     "advantage_eps", "grad_clip", "max_steps", "batch_wait_s",
                     "value_clip_eps", "critic_warmup_steps", "lr_warmup_steps",
                     "micro_batch_tokens", "publish_every"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.clip_eps_low >= 1:
            problems.append("clip_eps_low must be < 1")
        for name in ("gamma", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be in [0, 1]")
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
            hint = ""
            if set(unknown) & SCHEDULER_SETTINGS:
                hint = ("; group size, batch size and sampling are the scheduler's settings "
                        "(SARA_GROUP_SIZE, SARA_BATCH_SIZE, SARA_TEMPERATURE, SARA_TOP_P, "
                        "SARA_MAX_TOKENS), which each batch brings to the trainer")
            raise ValueError(f"unknown TrainerConfig fields: {', '.join(unknown)}{hint}")
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self, **changes: Any) -> TrainerConfig:
        return dataclasses.replace(self, **changes)

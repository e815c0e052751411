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


# The fields by group, in the order `sara train --help` shows them (a panel each) and
# docs/settings.md lists them; every field but `extra` is in exactly one.
CONFIG_GROUPS: dict[str, tuple[str, ...]] = {
    "Policy": ("model", "device", "dtype", "gradient_checkpointing", "threads", "seed"),
    "RL optimisation": (
        "lr", "lr_warmup_steps", "weight_decay", "grad_clip", "micro_batch_rollouts",
        "micro_batch_tokens", "logprob_chunk_rows", "updates_per_batch", "advantage_estimator",
        "advantage_eps", "std_unbiased", "drawn_baseline", "skip_zero_advantage", "clip_eps_low",
        "clip_eps_high", "kl_coef", "loss_aggregation"),
    "PPO critic (estimator gae)": (
        "gamma", "gae_lambda", "critic_lr", "value_clip_eps", "normalize_values",
        "whiten_advantages", "critic_warmup_steps"),
    "Steps and checkpoints": ("max_steps", "checkpoint_dir", "checkpoint_every",
                              "publish_every", "keep_checkpoints"),
    "Service": ("batch_wait_s",),
}


def doc(help_text: str) -> dict[str, str]:
    """A field's help, where `sara train --help` reads it (``metadata["help"]``)."""
    return {"help": help_text}


@dataclass
class TrainerConfig:
    # policy
    model: str = field(
        default="./sara-data/tiny-policy",
        metadata=doc("HF directory (or checkpoint root) to start from"))
    device: str = field(default="auto",
                        metadata=doc("auto (cuda when torch sees a GPU, else cpu), cpu, cuda, "
                                     "cuda:N"))
    dtype: str = field(default="auto", metadata=doc("auto: fp32 weights, bf16 autocast on CUDA"))
    gradient_checkpointing: bool = field(
        default=False, metadata=doc("recompute activations in backward"))
    threads: int = field(default=2, metadata=doc("torch intra-op threads on CPU"))
    seed: int = field(default=0, metadata=doc("torch seed"))
    # RL optimisation
    lr: float = field(default=1e-4, metadata=doc("AdamW learning rate"))
    lr_warmup_steps: int = field(default=0, metadata=doc("linear warm-up of the RL learning rate"))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW weight decay"))
    grad_clip: float = field(default=1.0, metadata=doc("gradient norm clip"))
    micro_batch_rollouts: int = field(
        default=256, metadata=doc("rollouts per forward/backward pass (at most)"))
    micro_batch_tokens: int = field(
        default=0, metadata=doc("padded tokens per pass (at most); 0: no budget"))
    logprob_chunk_rows: int = field(
        default=1024, metadata=doc("completion positions per output-head chunk"))
    updates_per_batch: int = field(
        default=1, metadata=doc("optimiser steps per batch (> 1: off-policy PPO)"))
    advantage_estimator: str = field(
        default="grpo",
        metadata=doc("grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline or gae"))
    advantage_eps: float = field(
        default=1e-6, metadata=doc("added to the std that normalises advantages"))
    std_unbiased: bool = field(
        default=True, metadata=doc("Bessel-corrected std in GRPO / Reinforce++"))
    drawn_baseline: bool = field(
        default=True, metadata=doc("grpo/dr_grpo: a group delivered with the rewards it drew "
                                   "(Reinforce-Ada's kept rollouts) takes its mean and std over "
                                   "all of them, its paper's global statistics"))
    skip_zero_advantage: bool = field(
        default=True, metadata=doc("skip the passes of rows whose advantage is 0 (saturated "
                                   "groups); the gradient is the same. Off with a KL term or "
                                   "a critic"))
    clip_eps_low: float = field(default=0.2, metadata=doc("PPO ratio clip below 1"))
    clip_eps_high: float = field(default=0.28, metadata=doc("DAPO clip-higher"))
    kl_coef: float = field(default=0.0, metadata=doc("k3 KL to the reference (initial) policy"))
    loss_aggregation: str = field(
        default="token-mean",
        metadata=doc("token-mean, seq-mean-token-mean or seq-mean-token-sum-norm"))
    # PPO critic (advantage_estimator "gae")
    gamma: float = field(default=1.0, metadata=doc("discount over completion tokens"))
    gae_lambda: float = field(default=0.95, metadata=doc("GAE lambda (gae only)"))
    critic_lr: float = field(default=1e-4, metadata=doc("the critic's learning rate (gae only)"))
    value_clip_eps: float = field(
        default=0.2, metadata=doc("PPO value clip; 0: unclipped value loss"))
    normalize_values: bool = field(
        default=True, metadata=doc("the critic predicts running-normalised returns"))
    whiten_advantages: bool = field(
        default=True, metadata=doc("mean 0, std 1 over the batch's tokens"))
    critic_warmup_steps: int = field(default=0, metadata=doc("first steps train only the critic"))
    # steps and checkpoints
    max_steps: int = field(
        default=200, metadata=doc("total optimiser steps to reach (a resumed run counts on)"))
    checkpoint_dir: str = field(
        default="./sara-data/checkpoints", metadata=doc("where checkpoints go"))
    checkpoint_every: int = field(
        default=10, metadata=doc("full resume checkpoints (with the optimiser)"))
    publish_every: int = field(
        default=1, metadata=doc("steps between weights-only policy versions for the workers "
                                "(bf16 on CUDA); 0: at checkpoints only"))
    keep_checkpoints: int = field(
        default=3, metadata=doc("full checkpoints kept (older ones are removed)"))
    # service
    batch_wait_s: float = field(default=30.0, metadata=doc("long poll for the next batch"))
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

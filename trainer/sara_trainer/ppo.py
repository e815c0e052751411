"""The trainer's PPO critic (``advantage_estimator = "gae"``): per-token advantages for the policy
update from a learned value model, and the critic's own update.

Per batch (the allocator's effective groups, cut into the trainer's micro-batches):

1. **values**: the critic's raw outputs for every completion token (no gradient), denormalised;
2. **GAE**: each rollout's reward on its last token, ``gamma`` / ``gae_lambda``, V = 0 after the
   last token; returns = advantages + values; advantages whitened over the batch's tokens
   (``whiten_advantages``);
3. the policy update uses those per-token advantages (the trainer's clipped PG loss);
4. **critic update**: the return normaliser takes in the returns, then ``updates_per_batch``
   AdamW steps (``critic_lr``) on the clipped value loss against the normalised returns, with the
   policy's micro-batching, aggregation and gradient clipping.

The critic (weights, normaliser, optimizer state) is written into every checkpoint's ``critic/``
and comes back on resume; a checkpoint without one (a run that switched to gae) starts a fresh
critic from its policy weights.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import TrainerConfig
from .fit import resolve_device
from .critic import (CRITIC_DIR, CRITIC_OPTIMIZER_FILE, ValueModel, explained_variance, gae,
                     has_critic, outcome_rewards, value_loss, whiten)

log = logging.getLogger("sara.trainer")


@dataclass
class CriticTargets:
    """What the PPO update of one batch needs, one entry per micro-batch."""

    advantages: list[torch.Tensor]        # [b, T] per-token advantages for the policy loss
    old_values: list[torch.Tensor]        # [b, T] raw critic outputs before the update
    targets: list[torch.Tensor]           # [b, T] normalised returns (the critic's targets)
    metrics: dict[str, float] = field(default_factory=dict)


def _stack(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Micro-batch tensors [b_i, T_i] as one zero-padded [sum b_i, max T_i]."""
    width = max(p.shape[-1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[-1])) for p in parts])


def _split(whole: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Undo :func:`_stack`: rows and columns of each micro-batch back out of `whole`."""
    out, start = [], 0
    for part in like:
        rows, width = part.shape
        out.append(whole[start:start + rows, :width])
        start += rows
    return out


class PPOCritic:
    """A :class:`ValueModel` with its optimizer, driven by the trainer's config."""

    def __init__(self, config: TrainerConfig, model: ValueModel) -> None:
        self.config, self.model = config, model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.critic_lr,
                                           weight_decay=config.weight_decay)

    @classmethod
    def create(cls, config: TrainerConfig, resumed: str | Path | None = None) -> PPOCritic:
        """The critic saved in checkpoint `resumed`, else a fresh one on the policy's weights
        (`resumed`'s when given, the configured model's otherwise)."""
        config = config.replace(device=resolve_device(config.device))
        if resumed is not None and has_critic(resumed):
            model = ValueModel.load(resumed, device=config.device)
            if model.normalizer.enabled != config.normalize_values:
                log.warning("the checkpoint's critic was trained with normalize_values=%s: "
                            "keeping that (its outputs are on that scale)",
                            model.normalizer.enabled)
            critic = cls(config, model)
            state = Path(resumed) / CRITIC_DIR / CRITIC_OPTIMIZER_FILE
            if state.is_file():
                critic.optimizer.load_state_dict(torch.load(state, map_location=config.device))
            return critic
        if resumed is not None:
            log.warning("checkpoint %s has no critic: starting one from its policy", resumed)
        source = resumed if resumed is not None else config.model
        return cls(config, ValueModel.from_policy(source, device=config.device,
                                                  normalize=config.normalize_values))

    def write(self, directory: str | Path) -> None:
        """Save into a checkpoint directory (``save_checkpoint``'s ``extra_writers`` hook)."""
        self.model.save(directory, optimizer=self.optimizer)

    @torch.no_grad()
    def targets(self, batches: Sequence, scores: Sequence[torch.Tensor]) -> CriticTargets:
        """Old values, GAE advantages and normalised returns for micro-batches `batches` whose
        rollouts scored `scores` ([b] each); updates the return normaliser."""
        cfg, norm = self.config, self.model.normalizer
        raw = [self.model(b) for b in batches]
        masks = [b.completion_mask for b in batches]
        mask, old = _stack(masks), _stack(raw)
        values = norm.denormalize(old) * mask
        rewards = outcome_rewards(torch.cat(list(scores)).to(mask.device), mask)
        advantages, returns = gae(rewards, values, mask, cfg.gamma, cfg.gae_lambda)
        metrics = _value_metrics(values, returns, advantages, mask)
        if cfg.whiten_advantages:
            advantages = whiten(advantages, mask)
        norm.update(returns, mask)
        targets = norm.normalize(returns) * mask
        return CriticTargets(_split(advantages, raw), raw, _split(targets, raw), metrics)

    def fit(self, batches: Sequence, data: CriticTargets, max_tokens: int | None = None
            ) -> dict[str, float]:
        """``updates_per_batch`` optimiser steps of the clipped value loss; the last one's
        metrics (``vf_loss``, ``vf_clip_frac``, ``critic_grad_norm``, ``critic_skipped``).
        ``max_tokens``: the sampling's completion horizon, which Dr. GRPO's aggregation divides
        by (None: the batch's longest completion)."""
        cfg = self.config
        tokens = float(sum(float(b.completion_mask.sum()) for b in batches))
        rows = float(sum(b.completion_mask.shape[0] for b in batches))
        normalizer = max(tokens if cfg.loss_aggregation == "token-mean" else rows, 1.0)
        self.model.train()
        metrics: dict[str, float] = {}
        skipped = 0
        for _ in range(cfg.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            metrics = {"vf_loss": 0.0, "vf_clip_frac": 0.0}
            for batch, old, target in zip(batches, data.old_values, data.targets):
                loss, m = value_loss(self.model(batch), old, target, batch.completion_mask,
                                     cfg.value_clip_eps, aggregation=cfg.loss_aggregation,
                                     normalizer=normalizer, max_tokens=max_tokens)
                loss.backward()
                metrics["vf_loss"] += m["vf_loss"]             # already batch-normalised
                metrics["vf_clip_frac"] += m["vf_clip_frac"] * float(
                    batch.completion_mask.sum()) / max(tokens, 1.0)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                             cfg.grad_clip or float("inf")))
            metrics["critic_grad_norm"] = grad_norm
            if math.isfinite(metrics["vf_loss"]) and math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                skipped += 1
                log.error("non-finite value loss or gradient: critic step skipped")
        self.optimizer.zero_grad(set_to_none=True)
        metrics["critic_skipped"] = float(skipped > 0)
        return metrics


def _value_metrics(values: torch.Tensor, returns: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor) -> dict[str, float]:
    """How well the critic's values (before this batch's update) predicted the returns."""
    count = max(float(mask.sum()), 1.0)
    return {"value_mean": float((values * mask).sum()) / count,
            "return_mean": float((returns * mask).sum()) / count,
            "gae_adv_mean": float((advantages * mask).sum()) / count,
            "explained_variance": explained_variance(values, returns, mask)}

"""Where a trained step goes: full resume checkpoints, weights-only policy versions for the
workers, and publishing them to the scheduler. The trainer owns one `Publisher` and keeps the
step, the policy version and the last checkpoint itself."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from .checkpoint import save_checkpoint
from .config import TrainerConfig

log = logging.getLogger("sara.trainer")

PUBLISHED = "published"     # weights-only versions, under checkpoint_dir
PUBLISHED_KEEP = 3          # a worker may still be reading the one before the newest


class Publisher:
    """Writes the policy (with the optimiser, critic and trainer state in a full checkpoint) and
    publishes it as a new version to the scheduler `client`."""

    def __init__(self, client: Any, config: TrainerConfig, model: Any, tokenizer: Any,
                 optimizer: torch.optim.Optimizer, critic: Any, reference_path: str) -> None:
        self.client, self.config = client, config
        self.model, self.tokenizer, self.optimizer = model, tokenizer, optimizer
        self.critic, self.reference_path = critic, reference_path

    def save(self, step: int, version: int, trained_ids: list[str]) -> str:
        """A full resume checkpoint of `step` as policy `version` (with the ids of the batches
        trained lately, which a redelivery after a crash is checked against); its path."""
        cfg = self.config
        path = save_checkpoint(cfg.checkpoint_dir, self.model, self.tokenizer, step=step,
                               policy_version=version, config=cfg, optimizer=self.optimizer,
                               extra={"reference": self.reference_path,
                                      "trained_batches": trained_ids},
                               keep=cfg.keep_checkpoints or None,
                               extra_writers=[self.critic.write] if self.critic else [])
        return str(Path(path).resolve())

    def save_weights(self, step: int, version: int) -> str:
        """Weights only (bf16 on CUDA: what the workers load) under ``checkpoint_dir/published``,
        for a policy version between full checkpoints; resume never reads these."""
        cfg = self.config
        cuda = torch.device(cfg.device).type == "cuda"
        path = save_checkpoint(Path(cfg.checkpoint_dir) / PUBLISHED, self.model, self.tokenizer,
                               step=step, policy_version=version, config=cfg,
                               keep=PUBLISHED_KEEP, weights_dtype=torch.bfloat16 if cuda else None)
        return str(Path(path).resolve())

    def save_step(self, step: int, version: int, last: bool, trained_ids: list[str]
                  ) -> str | None:
        """A full checkpoint every ``checkpoint_every`` steps (and at the last), else weights only
        every ``publish_every`` steps, as policy `version`; its path, or None when this step
        writes nothing."""
        cfg = self.config
        full = max(1, cfg.checkpoint_every)
        publish = cfg.publish_every or full
        if step % full == 0 or last:
            return self.save(step, version, trained_ids)
        if step % publish == 0:
            return self.save_weights(step, version)
        return None

    def publish(self, version: int, checkpoint: str) -> int:
        """Publish `checkpoint` as policy `version`; the version it was published as (one past
        the scheduler's when the scheduler refused `version`, e.g. after another trainer's)."""
        from sara_client import ConflictError

        try:
            self.client.publish_policy(version, checkpoint=checkpoint)
            return version
        except ConflictError:
            current = self.client.get_policy().version
            log.warning("policy v%d refused (scheduler at v%d): publishing v%d", version,
                        current, current + 1)
            self.client.publish_policy(current + 1, checkpoint=checkpoint)
            return current + 1

"""Where a trained step goes: full resume checkpoints, weights-only policy versions for the
workers, and publishing them to the scheduler (a mixin of :class:`sara_trainer.loop.Trainer`)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .checkpoint import save_checkpoint

log = logging.getLogger("sara.trainer")

PUBLISHED = "published"     # weights-only versions, under checkpoint_dir
PUBLISHED_KEEP = 3          # a worker may still be reading the one before the newest


class Publishing:
    """Checkpoint and publish methods; the host class provides ``config``, ``model``,
    ``tokenizer``, ``optimizer``, ``critic``, ``client``, ``step``, ``version``,
    ``reference_path`` and ``_trained_ids``."""

    def save(self, version: int) -> str:
        """Write a checkpoint for the current step as policy ``version``; returns its path."""
        cfg = self.config
        path = save_checkpoint(cfg.checkpoint_dir, self.model, self.tokenizer, step=self.step,
                               policy_version=version, config=cfg, optimizer=self.optimizer,
                               extra={"reference": self.reference_path,
                                      "trained_batches": self._trained_ids},
                               keep=cfg.keep_checkpoints or None,
                               extra_writers=[self.critic.write] if self.critic else [])
        self.checkpoint = str(Path(path).resolve())
        self.version = version
        return self.checkpoint

    def _save_or_publish(self, last: bool) -> str | None:
        """A full checkpoint every ``checkpoint_every`` steps (and at the last), else weights only
        every ``publish_every`` steps; the path to publish as the next version, or None."""
        cfg = self.config
        full = max(1, cfg.checkpoint_every)
        publish = cfg.publish_every or full
        if self.step % full == 0 or last:
            return self.save(self.version + 1)
        if self.step % publish == 0:
            return self.save_weights(self.version + 1)
        return None

    def save_weights(self, version: int) -> str:
        """Weights only (bf16 on CUDA: what the workers load) under ``checkpoint_dir/published``,
        for a policy version between full checkpoints; resume never reads these."""
        cfg = self.config
        cuda = torch.device(cfg.device).type == "cuda"
        path = save_checkpoint(Path(cfg.checkpoint_dir) / PUBLISHED, self.model, self.tokenizer,
                               step=self.step, policy_version=version, config=cfg,
                               keep=PUBLISHED_KEEP, weights_dtype=torch.bfloat16 if cuda else None)
        self.checkpoint = str(Path(path).resolve())
        self.version = version
        return self.checkpoint

    def _publish(self, checkpoint: str) -> None:
        from sara_client import ConflictError

        try:
            self.client.publish_policy(self.version, checkpoint=checkpoint)
        except ConflictError:
            current = self.client.get_policy().version
            log.warning("policy v%d refused (scheduler at v%d): publishing v%d", self.version,
                        current, current + 1)
            self.version = current + 1
            self.client.publish_policy(self.version, checkpoint=checkpoint)

"""The trainer loop behind ``sara train``: batch in, update, checkpoint, new policy version out.

One step:

1. **pull** an effective batch through the SDK (``next_batch(wait_s=...)``, long-polled);
2. **advantages** from each group's rewards (``advantage_estimator``: grpo, dr_grpo, rloo, ...),
   or per token from a learned critic with GAE (``gae``: PPO, see :mod:`sara_trainer.ppo`; the
   critic is trained after the policy on the same batch and checkpointed with it);
3. **update**: clipped policy-gradient loss, token-level aggregation, optional k3 KL to a frozen
   reference (the starting policy), micro-batched, one or more optimiser steps (steps 2 and 3
   are :mod:`sara_trainer.updating`'s ``Updater``, which the ``Trainer`` owns);
4. **checkpoint**: every ``checkpoint_every`` steps (and at the last) a full resume checkpoint
   (safetensors weights, optimiser, tokenizer, trainer config, step and policy version, written
   atomically under ``checkpoint_dir``); between them, every ``publish_every`` steps, weights only
   (bf16 on CUDA) under ``checkpoint_dir/published`` for the workers (an fp32 AdamW checkpoint of a
   0.5B model is ~6 GB: too much to fsync every step);
5. **ack** the batch (after the update, and after the checkpoint that holds it);
6. **publish** the checkpoint as the next policy version (``publish_policy(v, checkpoint=dir)``),
   which the workers load before their next generations.

Training rows are the prompt's tokens (``tokenizer(prompt)``, as the workers encode it) followed by
the completion's ``token_ids`` when the worker sent them, else the re-tokenised completion text
(plus eos when it stopped on one). When rollouts carry the behaviour policy's logprobs (the hf and
vllm backends send them: raw logprobs, i.e. temperature 1) they are the importance ratio's
denominator; otherwise the update is on-policy only (ratio 1, said once in the log) and staleness
is bounded by the scheduler's ``max_staleness``.

Resume: a trainer started on a ``checkpoint_dir`` that holds a checkpoint continues from it (model,
optimizer, step, policy version, recently trained batch ids); ``max_steps`` is the total to reach.
A batch that was trained and checkpointed but not acked before a crash is redelivered; its id is
in the checkpoint, so it is acked without training it twice.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .checkpoint import OPTIMIZER_FILE, latest_checkpoint
from .config import TrainerConfig
from .fit import autocast_dtype, prepare_model, resolve_device, resolve_dtype
from .memory import PROBE_TOKENS, ActivationModel, FirstStepMemory
from .policy import disable_dropout, load_checkpoint, load_policy
from .ppo import PPOCritic
from .publishing import Publisher
from .updating import Updater

log = logging.getLogger("sara.trainer")

NO_BATCH_NOTE_S = 60.0      # a log line every this long without a batch
REMEMBERED_BATCHES = 32     # trained batch ids kept in the checkpoint (redelivery after a crash)


def say(line: str) -> None:
    """A line for the trainer's log and its stdout (also where no logging is configured)."""
    log.info("%s", line)
    print(f"sara: {line}", flush=True)


@dataclass
class StepReport:
    """What one training step did (also what ``on_step`` receives)."""

    step: int
    policy_version: int
    batch_id: str
    batch_policy_version: int
    groups: int
    rollouts: int
    tokens: int
    mean_reward: float
    loss: float
    metrics: dict[str, float]
    batch_stats: dict[str, Any]
    checkpoint: str | None
    seconds: float
    skipped: bool = False           # a non-finite loss: no optimiser step was taken
    # the batch's groups in order: their prompts and mean rewards (which prompts a run keeps
    # training on, and how hard they were for the policy that sampled them)
    prompt_ids: list[str] = field(default_factory=list)
    group_mean_rewards: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Trainer:
    """The loop over a sync SDK client (``SaraClient`` or anything with its trainer methods):
    batches in, an ``Updater`` updates the policy, a ``Publisher`` checkpoints and publishes it;
    the trainer keeps the step, the policy version and the batches it trained."""

    def __init__(self, client: Any, config: TrainerConfig, *,
                 on_step: Callable[[StepReport], None] | None = None,
                 batch_size: Callable[[], int | None] | None = None) -> None:
        """``batch_size``, when given, is asked before each pull for the number of groups to
        request (None: the scheduler's own batch size), e.g. to keep the expected number of
        mixed groups per step constant under the uniform policy."""
        # "auto" is settled once, here: the critic and every tensor below read config.device
        config = config.replace(device=resolve_device(config.device))
        self.client, self.config, self.on_step = client, config, on_step
        self.batch_size = batch_size
        self.dtype = resolve_dtype(config.dtype, config.device)
        self.autocast = autocast_dtype(config.dtype, config.device)
        torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.reports: list[StepReport] = []
        self.acked: list[str] = []
        self._trained_ids: list[str] = []
        self._load()

    # --- set-up and resume ------------------------------------------------------------------------

    def _load(self) -> None:
        cfg = self.config
        resumed = latest_checkpoint(cfg.checkpoint_dir)
        self.optimizer: torch.optim.Optimizer
        if resumed is not None:
            self.model, self.tokenizer, state = load_checkpoint(resumed, device=cfg.device,
                                                                dtype=self.dtype)
            self.step, self.version = int(state["step"]), int(state["policy_version"])
            extra = state.get("extra") or {}
            self.reference_path = str(extra.get("reference") or cfg.model)
            self._trained_ids = list(extra.get("trained_batches") or [])
            self.checkpoint: str | None = str(Path(resumed).resolve())
            log.info("resuming from %s: step %d, policy v%d", resumed, self.step, self.version)
        else:
            self.model, self.tokenizer = load_policy(cfg.model, device=cfg.device,
                                                     dtype=self.dtype)
            self.step, self.version, self.checkpoint = 0, 0, None
            self.reference_path = str(cfg.model)
        disable_dropout(self.model)
        activations = self._prepare()
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        if resumed is not None and (Path(resumed) / OPTIMIZER_FILE).is_file():
            self.optimizer.load_state_dict(torch.load(Path(resumed) / OPTIMIZER_FILE,
                                                      map_location=cfg.device))
        self.critic = PPOCritic.create(cfg, resumed) if cfg.advantage_estimator == "gae" else None
        critic = sum(p.numel() for p in self.critic.model.parameters()) if self.critic else 0
        self.memory = FirstStepMemory(self.model, activations, cfg.device, cfg.kl_coef > 0, say,
                                      critic)
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference, _ = load_policy(self.reference_path, device=cfg.device,
                                            dtype=self.dtype)
            self.reference.eval().requires_grad_(False)
        self.updater = Updater(cfg, self.model, self.tokenizer, self.optimizer,
                               reference=self.reference, critic=self.critic,
                               autocast=self.autocast, memory=self.memory)
        self.publisher = Publisher(self.client, cfg, self.model, self.tokenizer, self.optimizer,
                                   self.critic, self.reference_path)
        self._sync_policy()

    def _prepare(self) -> ActivationModel:
        """The model readied for training (its activation memory probed first), and the
        trainer's first line: device, dtypes and what a token's activations weigh."""
        activations = prepare_model(self.model, self.config, self.autocast)
        weights = str(self.dtype).removeprefix("torch.")
        compute = str(self.autocast or self.dtype).removeprefix("torch.")
        at = PROBE_TOKENS
        say(f"trainer on {self.config.device}: weights {weights}, compute {compute}; activations "
            f"{activations.row_bytes(at) / at / 1024:.1f} KiB a token in rows of {at} "
            f"(measured); the memory estimate comes with the first batch")
        return activations

    def _sync_policy(self) -> None:
        """Agree with the scheduler on the policy version before the first step."""
        current = self.client.get_policy()
        if current.version > self.version:
            log.warning("the scheduler is at policy v%d, ahead of this trainer (v%d): "
                        "continuing from v%d", current.version, self.version, current.version)
            self.version = current.version
        elif current.version < self.version and self.checkpoint is not None:
            # saved but not published before a crash: publish it now so workers catch up
            self.client.publish_policy(self.version, checkpoint=self.checkpoint)
            log.info("published policy v%d (%s) on resume", self.version, self.checkpoint)

    # --- the loop ---------------------------------------------------------------------------------

    def run(self, max_steps: int | None = None, *, stop: threading.Event | None = None,
            timeout_s: float | None = None) -> list[StepReport]:
        """Train until ``max_steps`` (total, default ``config.max_steps``), ``stop`` is set or no
        batch came for ``timeout_s``; returns this run's step reports."""
        target = self.config.max_steps if max_steps is None else max_steps
        done: list[StepReport] = []
        while self.step < target and not (stop is not None and stop.is_set()):
            batch = self.next_batch(stop=stop, timeout_s=timeout_s)
            if batch is None:
                break
            report = self.train_on(batch, last=self.step + 1 >= target)
            if report is not None:
                done.append(report)
        return done

    def next_batch(self, *, stop: threading.Event | None = None,
                   timeout_s: float | None = None):
        """Long-poll the scheduler for a batch (the SDK's ``wait_for_batch``); None when stopped
        or after ``timeout_s``. ``stop`` is looked at between polls; a line is logged every
        NO_BATCH_NOTE_S without a batch."""
        poll = max(0.0, self.config.batch_wait_s)
        # with a stop event, one poll per call so that it is seen promptly
        chunk = max(poll, 1.0) if stop is not None else NO_BATCH_NOTE_S
        started = time.monotonic()
        while not (stop is not None and stop.is_set()):
            left = None if timeout_s is None else timeout_s - (time.monotonic() - started)
            if left is not None and left <= 0:
                return None
            size = self.batch_size() if self.batch_size is not None else None
            batch = self.client.wait_for_batch(
                size, timeout_s=chunk if left is None else min(chunk, left), poll_s=poll)
            if batch is not None:
                return batch
            waited = time.monotonic() - started
            if waited // NO_BATCH_NOTE_S > (waited - chunk) // NO_BATCH_NOTE_S:
                log.info("no batch for %.0fs (are workers running and prompts loaded?)", waited)
        return None

    def train_on(self, batch: Any, last: bool = False) -> StepReport | None:
        """One step on ``batch``: update, checkpoint, ack, publish. None for a batch this trainer
        already trained (redelivered after a crash): it is only acked."""
        if batch.batch_id in self._trained_ids:
            log.warning("batch %s was trained before the restart: acking it only", batch.batch_id,
                        extra={"batch_id": batch.batch_id})
            self._ack(batch.batch_id)
            return None
        started = time.perf_counter()
        lags = [self.version - r.policy_version for g in batch.groups for r in g.rollouts]
        metrics = self.updater.update(batch.groups, batch.sampling, self.step)
        mixed = [g for g in batch.groups if len({r.reward for r in g.rollouts}) > 1]
        metrics["groups_mixed"] = float(len(mixed))     # non-zero advantage under grpo
        metrics["rollouts_mixed"] = float(sum(len(g.rollouts) for g in mixed))
        metrics["staleness_max"] = float(max(lags, default=0))
        metrics["staleness_mean"] = sum(lags) / len(lags) if lags else 0.0
        self.step += 1
        self._trained_ids = (self._trained_ids + [batch.batch_id])[-REMEMBERED_BATCHES:]
        checkpoint = self.publisher.save_step(self.step, self.version + 1, last,
                                              self._trained_ids)
        if checkpoint is not None:
            self.version, self.checkpoint = self.version + 1, checkpoint
        self._ack(batch.batch_id)
        if checkpoint is not None:
            self.version = self.publisher.publish(self.version, checkpoint)
        rewards = [r.reward for g in batch.groups for r in g.rollouts]
        stats = batch.stats.model_dump() if hasattr(batch.stats, "model_dump") else {}
        report = StepReport(
            step=self.step, policy_version=self.version, batch_id=batch.batch_id,
            batch_policy_version=batch.policy_version, groups=len(batch.groups),
            rollouts=len(rewards), tokens=int(metrics.get("tokens", 0)),
            mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            loss=metrics.get("loss", math.nan), metrics=metrics, batch_stats=stats,
            checkpoint=checkpoint, seconds=time.perf_counter() - started,
            skipped=bool(metrics.get("skipped", 0.0)),
            prompt_ids=[g.prompt_id for g in batch.groups],
            group_mean_rewards=[sum(r.reward for r in g.rollouts) / max(1, len(g.rollouts))
                                for g in batch.groups])
        self.reports.append(report)
        log.info("step %d v%d: %d groups, reward %.3f, loss %.4f, %.2fs", report.step,
                 report.policy_version, report.groups, report.mean_reward, report.loss,
                 report.seconds, extra={"batch_id": batch.batch_id, "step": report.step,
                                        "policy_version": report.policy_version})
        if self.on_step is not None:
            self.on_step(report)
        return report

    def _ack(self, batch_id: str) -> None:
        self.client.ack(batch_id)
        self.acked.append(batch_id)


def train(config: TrainerConfig, url: str, token: str | None = None,
          on_step: Callable[[StepReport], None] | None = None) -> Trainer:
    """``sara train``: connect, resume or start, train ``config.max_steps`` steps."""
    from sara_client import SaraClient

    with SaraClient(url, token=token) as client:
        trainer = Trainer(client, config, on_step=on_step)
        trainer.run()
    return trainer

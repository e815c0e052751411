"""The trainer loop behind ``sara train``: batch in, update, checkpoint, new policy version out.

One step:

1. **pull** an effective batch through the SDK (``next_batch(wait_s=...)``, long-polled);
2. **advantages** from each group's rewards (``advantage_estimator``: grpo, dr_grpo, rloo, ...),
   or per token from a learned critic with GAE (``gae``: PPO, see :mod:`sara_trainer.ppo`; the
   critic is trained after the policy on the same batch and checkpointed with it);
3. **update**: clipped policy-gradient loss, token-level aggregation, optional k3 KL to a frozen
   reference (the starting policy), micro-batched, one or more optimiser steps;
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from sara_client.chat import render_prompt

from .advantages import compute_advantages
from .checkpoint import OPTIMIZER_FILE, latest_checkpoint
from .config import TrainerConfig
from .fit import autocast_dtype, prepare_model, resolve_device, resolve_dtype, token_chunks
from .logprobs import chunked_completion_logprobs
from .loss import policy_loss
from .policy import context_size, disable_dropout, load_checkpoint, load_policy, make_batch
from .ppo import PPOCritic
from .publishing import Publishing

log = logging.getLogger("sara.trainer")

NO_BATCH_NOTE_S = 60.0      # a log line every this long without a batch
REMEMBERED_BATCHES = 32     # trained batch ids kept in the checkpoint (redelivery after a crash)


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Rows:
    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    behaviour: list[list[float] | None] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


class Trainer(Publishing):
    """The loop over a sync SDK client (``SaraClient`` or anything with its trainer methods)."""

    def __init__(self, client: Any, config: TrainerConfig, *,
                 on_step: Callable[[StepReport], None] | None = None) -> None:
        # "auto" is settled once, here: the critic and every tensor below read config.device
        config = config.replace(device=resolve_device(config.device))
        self.client, self.config, self.on_step = client, config, on_step
        self.dtype = resolve_dtype(config.dtype, config.device)
        self.autocast = autocast_dtype(config.dtype, config.device)
        torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.reports: list[StepReport] = []
        self.acked: list[str] = []
        self._warned_off_policy = False
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
        estimate = prepare_model(self.model, cfg)
        compute = str(self.autocast or self.dtype).removeprefix("torch.")
        line = (f"trainer on {cfg.device}: weights {str(self.dtype).removeprefix('torch.')}, "
                f"compute {compute}; {estimate.line()}")
        log.info("%s", line)
        print(f"sara: {line}", flush=True)   # also where no logging is configured
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        if resumed is not None and (Path(resumed) / OPTIMIZER_FILE).is_file():
            self.optimizer.load_state_dict(torch.load(Path(resumed) / OPTIMIZER_FILE,
                                                      map_location=cfg.device))
        self.critic = PPOCritic.create(cfg, resumed) if cfg.advantage_estimator == "gae" else None
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference, _ = load_policy(self.reference_path, device=cfg.device,
                                            dtype=self.dtype)
            self.reference.eval().requires_grad_(False)
        self._sync_policy()

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
            batch = self.client.wait_for_batch(
                timeout_s=chunk if left is None else min(chunk, left), poll_s=poll)
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
        metrics = self.update(batch.groups)
        mixed = [g for g in batch.groups if len({r.reward for r in g.rollouts}) > 1]
        metrics["groups_mixed"] = float(len(mixed))     # non-zero advantage under grpo
        metrics["rollouts_mixed"] = float(sum(len(g.rollouts) for g in mixed))
        metrics["staleness_max"] = float(max(lags, default=0))
        metrics["staleness_mean"] = sum(lags) / len(lags) if lags else 0.0
        self.step += 1
        self._trained_ids = (self._trained_ids + [batch.batch_id])[-REMEMBERED_BATCHES:]
        checkpoint = self._save_or_publish(last)
        self._ack(batch.batch_id)
        if checkpoint is not None:
            self._publish(checkpoint)
        rewards = [r.reward for g in batch.groups for r in g.rollouts]
        stats = batch.stats.model_dump() if hasattr(batch.stats, "model_dump") else {}
        report = StepReport(
            step=self.step, policy_version=self.version, batch_id=batch.batch_id,
            batch_policy_version=batch.policy_version, groups=len(batch.groups),
            rollouts=len(rewards), tokens=int(metrics.get("tokens", 0)),
            mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            loss=metrics.get("loss", math.nan), metrics=metrics, batch_stats=stats,
            checkpoint=checkpoint, seconds=time.perf_counter() - started,
            skipped=bool(metrics.get("skipped", 0.0)))
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

    # --- the update -------------------------------------------------------------------------------

    def rows(self, groups: Sequence[Any]) -> _Rows:
        """Training rows (prompt ids, completion ids, behaviour logprobs, advantage) of groups."""
        cfg, tok = self.config, self.tokenizer
        rewards = [[float(r.reward) for r in g.rollouts] for g in groups]
        if cfg.advantage_estimator == "gae":      # per token, from the critic, in update()
            adv = [0.0] * sum(len(r) for r in rewards)
        else:
            adv = compute_advantages(rewards, cfg.advantage_estimator, eps=cfg.advantage_eps,
                                     unbiased=cfg.std_unbiased)
        # render_prompt is what the worker generated from: text as is, chat through the template
        prompts = [render_prompt(tok, g.prompt) for g in groups]
        limit = context_size(self.model)
        eos = tok.eos_token_id
        out, i = _Rows(), 0
        for group, prompt_ids in zip(groups, prompts):
            prompt_ids = list(prompt_ids) or ([tok.bos_token_id or eos])
            room = max(0, limit - len(prompt_ids))
            for r in group.rollouts:
                ids, behaviour = (list(r.token_ids), r.logprobs) if r.token_ids is not None \
                    else (self._encode_completion(r), None)
                if behaviour is not None and len(behaviour) != len(ids):
                    behaviour = None
                out.prompt_ids.append(prompt_ids)
                out.completion_ids.append(ids[:room])
                out.behaviour.append(None if behaviour is None else list(behaviour[:room]))
                out.advantages.append(float(adv[i]))
                out.rewards.append(float(r.reward))
                i += 1
        return out

    def _encode_completion(self, rollout: Any) -> list[int]:
        tok = self.tokenizer
        ids = list(tok(rollout.completion, add_special_tokens=False)["input_ids"])
        if getattr(rollout, "finish_reason", "stop") == "stop" and tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        return ids

    def update(self, groups: Sequence[Any]) -> dict[str, float]:
        """Advantages and ``updates_per_batch`` optimiser steps on ``groups``; returns metrics."""
        cfg = self.config
        rows = self.rows(groups)
        n = len(rows.advantages)
        if n == 0:
            return {"loss": 0.0, "tokens": 0.0, "skipped": 1.0}
        chunks, batches = self._micro_batches(rows)
        use_behaviour = self._uses_behaviour(rows)
        tokens = float(sum(b.completion_mask.sum().item() for b in batches))
        lr = self._lr()
        critic, advs = self._advantages(rows, chunks, batches)
        if critic is not None and self.step < cfg.critic_warmup_steps:
            totals, skipped = {"policy_frozen": 1.0}, 0   # critic warm-up: the policy waits
        else:
            olds = [self._old_logprobs(b, [rows.behaviour[i] for i in c], use_behaviour)
                    for b, c in zip(batches, chunks)]
            refs = [self._ref_logprobs(b) for b in batches]
            totals, skipped = self._policy_steps(batches, olds, refs, advs, tokens, n, lr)
        if critic is not None:
            totals.update(critic.metrics)
            totals.update(self.critic.fit(batches, critic))
            totals.setdefault("loss", totals["vf_loss"])
        totals.update(tokens=tokens, rollouts=float(n), skipped=float(skipped > 0),
                      off_policy=float(use_behaviour), lr=lr)
        return totals

    def _micro_batches(self, rows: _Rows) -> tuple[list[list[int]], list[Any]]:
        """The rows split into micro-batches (by rollouts and padded tokens): (the row indices
        of each, its TokenBatch)."""
        cfg, tok = self.config, self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        chunks = token_chunks([len(p) for p in rows.prompt_ids],
                              [len(c) for c in rows.completion_ids],
                              max(1, cfg.micro_batch_rollouts), cfg.micro_batch_tokens)
        batches = [make_batch([rows.prompt_ids[i] for i in c], [rows.completion_ids[i] for i in c],
                              pad, cfg.device) for c in chunks]
        return chunks, batches

    def _uses_behaviour(self, rows: _Rows) -> bool:
        """Whether the worker's logprobs are the ratio's denominator (warns once when not)."""
        cfg = self.config
        use_behaviour = cfg.temperature == 1.0 and any(b is not None for b in rows.behaviour)
        if not use_behaviour and not self._warned_off_policy:
            self._warned_off_policy = True
            why = ("the rollouts carry no behaviour logprobs" if cfg.temperature == 1.0 else
                   "sampling temperature != 1 (worker logprobs are raw)")
            log.warning("on-policy only: %s; the ratio is 1 and staleness is bounded by the "
                        "scheduler's max_staleness", why)
        return use_behaviour

    def _advantages(self, rows: _Rows, chunks: list[list[int]], batches: list[Any]
                    ) -> tuple[Any, list[torch.Tensor]]:
        """(the critic's targets or None, each micro-batch's advantages): per token from the
        critic's values under PPO, else per rollout as ``rows`` computed them."""
        if self.critic is not None:
            scores = [torch.tensor([rows.rewards[i] for i in c]) for c in chunks]
            critic = self.critic.targets(batches, scores)
            return critic, critic.advantages
        return None, [torch.tensor([rows.advantages[i] for i in c], dtype=torch.float32,
                                   device=self.config.device) for c in chunks]

    def _policy_steps(self, batches: list, olds: list, refs: list, advs: list[torch.Tensor],
                      tokens: float, n: int, lr: float) -> tuple[dict[str, float], int]:
        """``updates_per_batch`` clipped-PG optimiser steps; the last one's metrics and how many
        steps were skipped for a non-finite loss or gradient."""
        cfg = self.config
        normalizer = tokens if cfg.loss_aggregation == "token-mean" else float(n)
        totals: dict[str, float] = {}
        skipped = 0
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        for _ in range(cfg.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            for batch, old, ref, adv in zip(batches, olds, refs, advs):
                logp, entropy = self._logprobs(self.model, batch, with_entropy=True)
                loss, m = policy_loss(
                    logp, adv, batch.completion_mask, old_logp=old, ref_logp=ref,
                    clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                    kl_coef=cfg.kl_coef, aggregation=cfg.loss_aggregation,
                    normalizer=max(normalizer, 1.0), max_tokens=cfg.max_new_tokens,
                    entropy=entropy)
                loss.backward()
                _accumulate(sums, m, m["tokens"] / max(tokens, 1.0))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                       cfg.grad_clip or float("inf"))
            sums["grad_norm"] = float(grad_norm)
            if math.isfinite(sums.get("loss", math.nan)) and math.isfinite(sums["grad_norm"]):
                self.optimizer.step()
            else:
                skipped += 1
                log.error("non-finite loss or gradient at step %d: optimiser step skipped",
                          self.step + 1)
            totals = sums
        self.optimizer.zero_grad(set_to_none=True)
        return totals, skipped

    def _lr(self) -> float:
        """The learning rate of the next step: linear warm-up over ``lr_warmup_steps`` steps,
        then ``lr``. Adam's first steps move every weight by about lr whatever its gradient; a
        warm-up keeps that from knocking an SFT'd policy back (measured: the tiny policy's
        held-out accuracy dipped 3-9 points over the first 10 steps without one)."""
        cfg = self.config
        # checkpoints written before the field existed kept it in `extra`
        warmup = cfg.lr_warmup_steps or int(cfg.extra.get("lr_warmup_steps", 0) or 0)
        if warmup <= 0:
            return cfg.lr
        return cfg.lr * min(1.0, (self.step + 1) / warmup)

    @torch.no_grad()
    def _old_logprobs(self, batch, behaviour: list[list[float] | None],
                      use_behaviour: bool) -> torch.Tensor | None:
        """Behaviour logprobs laid out like ``batch``'s completions; rows without them get the
        current policy's (ratio 1). None when fully on-policy with a single update."""
        if not use_behaviour and self.config.updates_per_batch == 1:
            return None
        current = None
        if not use_behaviour or any(b is None for b in behaviour):
            current, _ = self._logprobs(self.model, batch)
        if not use_behaviour:
            return current
        old = torch.zeros_like(batch.completion_mask)
        for row, values in enumerate(behaviour):
            if values is None:
                old[row] = current[row]
            elif values:
                old[row, :len(values)] = torch.tensor(values, dtype=old.dtype)
        return old

    @torch.no_grad()
    def _ref_logprobs(self, batch) -> torch.Tensor | None:
        if self.reference is None:
            return None
        logp, _ = self._logprobs(self.reference, batch)
        return logp

    def _logprobs(self, model, batch, with_entropy: bool = False):
        device = torch.device(self.config.device).type
        with torch.autocast(device, dtype=self.autocast or torch.float32,
                            enabled=self.autocast is not None):
            return chunked_completion_logprobs(model, batch, self.config.temperature,
                                               with_entropy,
                                               chunk_rows=self.config.logprob_chunk_rows)


def _accumulate(sums: dict[str, float], metrics: dict[str, float], weight: float) -> None:
    """Add one micro-batch's metrics to the step's: losses summed (already batch-normalised),
    ratio_max the largest, the rest weighted by the micro-batch's share of tokens."""
    for key, value in metrics.items():
        if key in ("loss", "pg_loss"):
            sums[key] = sums.get(key, 0.0) + value
        elif key == "ratio_max":
            sums[key] = max(sums.get(key, 0.0), value)
        elif key != "tokens":
            sums[key] = sums.get(key, 0.0) + value * weight


def train(config: TrainerConfig, url: str, token: str | None = None,
          on_step: Callable[[StepReport], None] | None = None) -> Trainer:
    """``sara train``: connect, resume or start, train ``config.max_steps`` steps."""
    from sara_client import SaraClient

    with SaraClient(url, token=token) as client:
        trainer = Trainer(client, config, on_step=on_step)
        trainer.run()
    return trainer

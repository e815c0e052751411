"""The trainer's update: a batch's groups as training rows, their advantages, and the clipped
policy-gradient (and, under PPO, critic) steps. The trainer owns one `Updater`, built over the
model, optimiser, reference and critic it loaded."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from sara_client.chat import render_prompt

from .advantages import DRAWN_BASELINE, compute_advantages
from .config import TrainerConfig
from .fit import resolve_device, token_chunks
from .logprobs import chunked_completion_logprobs
from .loss import policy_loss
from .policy import context_size, make_batch

log = logging.getLogger("sara.trainer")


@dataclass(frozen=True)
class Sampled:
    """What the update needs of the sampling its rollouts came from (the scheduler's settings,
    sent with each batch): the temperature logprobs are taken at, and the completion horizon
    Dr. GRPO's normaliser divides by (None: the batch's longest completion)."""

    temperature: float = 1.0
    max_tokens: int | None = None

    @classmethod
    def of(cls, sampling: Any) -> Sampled:
        """From a batch's ``sampling`` (a SamplingParams, or None from a scheduler that sends
        none: temperature 1, the batch's own horizon)."""
        if sampling is None:
            return cls()
        return cls(float(sampling.temperature), int(sampling.max_tokens))


@dataclass
class Rows:
    """Training rows of a batch, one per rollout, in batch order."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    behaviour: list[list[float] | None] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


def learning_rate(config: TrainerConfig, step: int) -> float:
    """The learning rate of the step after `step` steps: linear warm-up over ``lr_warmup_steps``
    steps, then ``lr``. Adam's first steps move every weight by about lr whatever its gradient;
    a warm-up keeps that from knocking an SFT'd policy back (measured: the tiny policy's
    held-out accuracy dipped 3-9 points over the first 10 steps without one)."""
    if config.lr_warmup_steps <= 0:
        return config.lr
    return config.lr * min(1.0, (step + 1) / config.lr_warmup_steps)


def drawn_pools(config: TrainerConfig, groups: Sequence[Any]) -> list[Any] | None:
    """Per group, the rewards its baseline is taken over when it was delivered with more than
    it holds (``drawn_baseline``; Reinforce-Ada's kept groups); None when no group was, or the
    estimator takes none."""
    drawn = [getattr(g, "drawn_rewards", None) for g in groups]
    if (not config.drawn_baseline or config.advantage_estimator not in DRAWN_BASELINE
            or all(d is None for d in drawn)):
        return None
    return drawn


class Updater:
    """Updates the policy it holds on a batch's groups (see the module docstring)."""

    def __init__(self, config: TrainerConfig, model: Any, tokenizer: Any,
                 optimizer: torch.optim.Optimizer, *, reference: Any = None, critic: Any = None,
                 autocast: torch.dtype | None = None, memory: Any = None) -> None:
        """`reference`: the frozen starting policy of the KL term (None without one); `critic`:
        PPO's value model (None unless ``gae``); `autocast`: the compute dtype (None: the
        weights'); `memory`: the first-step memory check (None: none)."""
        # "auto" settled here too: an updater built without the loop still names a real device
        config = config.replace(device=resolve_device(config.device))
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.optimizer, self.reference, self.critic = optimizer, reference, critic
        self.autocast, self.memory = autocast, memory
        self.warned_off_policy = False   # the on-policy notice is said once

    def rows(self, groups: Sequence[Any]) -> Rows:
        """Training rows (prompt ids, completion ids, behaviour logprobs, advantage) of groups."""
        cfg, tok = self.config, self.tokenizer
        rewards = [[float(r.reward) for r in g.rollouts] for g in groups]
        if cfg.advantage_estimator == "gae":      # per token, from the critic, in update()
            adv = [0.0] * sum(len(r) for r in rewards)
        else:
            adv = compute_advantages(rewards, cfg.advantage_estimator, eps=cfg.advantage_eps,
                                     unbiased=cfg.std_unbiased, drawn=drawn_pools(cfg, groups))
        # render_prompt is what the worker generated from: text as is, chat through the template
        prompts = [render_prompt(tok, g.prompt) for g in groups]
        limit = context_size(self.model)
        eos = tok.eos_token_id
        out, i = Rows(), 0
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

    def update(self, groups: Sequence[Any], sampling: Any = None, step: int = 0
               ) -> dict[str, float]:
        """Advantages and ``updates_per_batch`` optimiser steps on ``groups``, generated with
        ``sampling`` (the batch's SamplingParams), after `step` steps; returns metrics."""
        cfg, sampled = self.config, Sampled.of(sampling)
        rows = self.rows(groups)
        n = len(rows.advantages)
        if n == 0:
            return {"loss": 0.0, "tokens": 0.0, "skipped": 1.0}
        # every row's tokens: the loss's normaliser, whichever rows the passes run
        tokens = float(sum(len(c) for c in rows.completion_ids))
        active = self._rows_with_gradient(rows)
        chunks, batches = self._micro_batches(rows, active)
        if self.memory is not None:
            self.memory.before(batches, optimizer_ready=bool(self.optimizer.state))
        use_behaviour = self._uses_behaviour(rows, sampled.temperature)
        lr = learning_rate(cfg, step)
        critic, advs = self._advantages(rows, chunks, batches)
        if critic is not None and step < cfg.critic_warmup_steps:
            totals, skipped = {"policy_frozen": 1.0}, 0   # critic warm-up: the policy waits
        else:
            olds = [self._old_logprobs(b, [rows.behaviour[i] for i in c], use_behaviour,
                                       sampled.temperature) for b, c in zip(batches, chunks)]
            refs = [self._ref_logprobs(b, sampled.temperature) for b in batches]
            totals, skipped = self._policy_steps(batches, olds, refs, advs, tokens, n, lr, sampled,
                                                 step)
        if critic is not None:
            totals.update(critic.metrics)
            totals.update(self.critic.fit(batches, critic, sampled.max_tokens))
            totals.setdefault("loss", totals["vf_loss"])
        totals.update(tokens=tokens, rollouts=float(n), skipped=float(skipped > 0),
                      off_policy=float(use_behaviour), lr=lr,
                      rows_without_gradient=float(n - len(active)))
        if self.memory is not None:
            self.memory.after()
        return totals

    def _rows_with_gradient(self, rows: Rows) -> list[int]:
        """The indices of the rows a pass must run. A row whose advantage is exactly 0 adds 0 to
        the clipped loss and its gradient, so without a KL term or a critic (whose terms do not
        vanish with it) its forward and backward are skipped (``skip_zero_advantage``): plain
        GRPO's saturated groups, most of a uniform batch. The gradient is the same, since the
        normaliser still counts those rows. At least one row is kept: a step whose gradient is
        all 0 still takes the optimiser step it took before (Adam's momentum moves the weights)."""
        cfg = self.config
        every = list(range(len(rows.advantages)))
        if (not cfg.skip_zero_advantage or self.critic is not None
                or (self.reference is not None and cfg.kl_coef > 0)):
            return every
        active = [i for i in every if rows.advantages[i] != 0.0]
        return active or every[:1]

    def _micro_batches(self, rows: Rows, indices: list[int]) -> tuple[list[list[int]], list[Any]]:
        """The rows at `indices` split into micro-batches (by rollouts and padded tokens): (the
        row indices of each, its TokenBatch)."""
        cfg, tok = self.config, self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        spans = token_chunks([len(rows.prompt_ids[i]) for i in indices],
                             [len(rows.completion_ids[i]) for i in indices],
                             max(1, cfg.micro_batch_rollouts), cfg.micro_batch_tokens)
        chunks = [[indices[j] for j in span] for span in spans]
        batches = [make_batch([rows.prompt_ids[i] for i in c], [rows.completion_ids[i] for i in c],
                              pad, cfg.device) for c in chunks]
        return chunks, batches

    def _uses_behaviour(self, rows: Rows, temperature: float) -> bool:
        """Whether the worker's logprobs are the ratio's denominator (warns once when not)."""
        use_behaviour = temperature == 1.0 and any(b is not None for b in rows.behaviour)
        if not use_behaviour and not self.warned_off_policy:
            self.warned_off_policy = True
            why = ("the rollouts carry no behaviour logprobs" if temperature == 1.0 else
                   "sampling temperature != 1 (worker logprobs are raw)")
            log.warning("on-policy only: %s; the ratio is 1 and staleness is bounded by the "
                        "scheduler's max_staleness", why)
        return use_behaviour

    def _advantages(self, rows: Rows, chunks: list[list[int]], batches: list[Any]
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
                      tokens: float, n: int, lr: float, sampled: Sampled, step: int
                      ) -> tuple[dict[str, float], int]:
        """``updates_per_batch`` clipped-PG optimiser steps; the last one's metrics and how many
        steps were skipped for a non-finite loss or gradient."""
        cfg = self.config
        normalizer = tokens if cfg.loss_aggregation == "token-mean" else float(n)
        # the metrics are means over the tokens the passes ran (rows with a gradient)
        passed = float(sum(b.completion_mask.sum().item() for b in batches))
        totals: dict[str, float] = {}
        skipped = 0
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        for _ in range(cfg.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            for batch, old, ref, adv in zip(batches, olds, refs, advs):
                logp, entropy = self._logprobs(self.model, batch, sampled.temperature,
                                               with_entropy=True)
                loss, m = policy_loss(
                    logp, adv, batch.completion_mask, old_logp=old, ref_logp=ref,
                    clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                    kl_coef=cfg.kl_coef, aggregation=cfg.loss_aggregation,
                    normalizer=max(normalizer, 1.0), max_tokens=sampled.max_tokens,
                    entropy=entropy)
                loss.backward()
                _accumulate(sums, m, m["tokens"] / max(passed, 1.0))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                       cfg.grad_clip or float("inf"))
            sums["grad_norm"] = float(grad_norm)
            if math.isfinite(sums.get("loss", math.nan)) and math.isfinite(sums["grad_norm"]):
                self.optimizer.step()
            else:
                skipped += 1
                log.error("non-finite loss or gradient at step %d: optimiser step skipped",
                          step + 1)
            totals = sums
        self.optimizer.zero_grad(set_to_none=True)
        return totals, skipped

    @torch.no_grad()
    def _old_logprobs(self, batch, behaviour: list[list[float] | None],
                      use_behaviour: bool, temperature: float) -> torch.Tensor | None:
        """Behaviour logprobs laid out like ``batch``'s completions; rows without them get the
        current policy's (ratio 1). None when fully on-policy with a single update."""
        if not use_behaviour and self.config.updates_per_batch == 1:
            return None
        current = None
        if not use_behaviour or any(b is None for b in behaviour):
            current, _ = self._logprobs(self.model, batch, temperature)
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
    def _ref_logprobs(self, batch, temperature: float) -> torch.Tensor | None:
        if self.reference is None:
            return None
        logp, _ = self._logprobs(self.reference, batch, temperature)
        return logp

    def _logprobs(self, model, batch, temperature: float, with_entropy: bool = False):
        device = torch.device(self.config.device).type
        with torch.autocast(device, dtype=self.autocast or torch.float32,
                            enabled=self.autocast is not None):
            return chunked_completion_logprobs(model, batch, temperature,
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

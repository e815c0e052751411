"""The clipped policy-gradient loss with token-level aggregation and an optional k3 KL penalty.

Per completion token t of rollout b (mask 1):

    ratio    = exp(logp − logp_old)            (logp_old absent: exp(logp − logp.detach()), = 1)
    pg       = max(−A·ratio, −A·clip(ratio, 1 − ε_low, 1 + ε_high))
    k3       = exp(logp_ref − logp) − (logp_ref − logp) − 1        (≥ 0, = 0 where they match)
    loss     = agg(pg) + kl_coef · agg(k3)

``agg`` is ``token-mean`` by default (DAPO: the sum over every completion token of the batch
divided by the number of those tokens; pass ``normalizer`` = the whole batch's token count when
the batch is cut into micro-batches so the gradients add up to the full batch's),
``seq-mean-token-mean`` (mean over rollouts of each rollout's token mean) or
``seq-mean-token-sum-norm`` (Dr. GRPO: token sum / (rollouts × ``max_tokens``)).

Only ``logp`` carries gradient: old and reference logprobs, advantages and entropies are detached.
The log-ratios are clamped to ±20 before ``exp`` so a stray token cannot overflow.
"""

from __future__ import annotations

from typing import Any

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π ‖ π_ref) from samples of π: e^(ref−logp) − (ref−logp) − 1."""
    log_r = (ref_logp.detach() - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(log_r) - log_r - 1.0


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              normalizer: float | None = None, max_tokens: int | None = None) -> torch.Tensor:
    """Reduce per-token `values` [B, T] under `mask` to a scalar (see the module doc).

    `normalizer` replaces the denominator so micro-batches add up to the full batch: the full
    batch's token count for ``token-mean``, its number of rollouts for the two seq-mean modes.
    """
    mask = mask.to(values.dtype)
    values = torch.where(mask > 0, values, torch.zeros_like(values))  # padding may hold NaN/inf
    if mode == "token-mean":
        denom = float(normalizer) if normalizer is not None else mask.sum().clamp(min=1.0)
        return (values * mask).sum() / denom
    if mode == "seq-mean-token-mean":
        per_seq_tokens = mask.sum(-1)
        per_seq = (values * mask).sum(-1) / per_seq_tokens.clamp(min=1.0)
        rows = (per_seq_tokens > 0).to(values.dtype)
        denom = float(normalizer) if normalizer is not None else rows.sum().clamp(min=1.0)
        return (per_seq * rows).sum() / denom
    if mode == "seq-mean-token-sum-norm":
        horizon = max_tokens if max_tokens is not None else values.shape[-1]
        rows = float(normalizer) if normalizer is not None else values.shape[0]
        return (values * mask).sum() / (max(rows, 1.0) * horizon)
    raise ValueError(f"unknown aggregation {mode!r}; choose from {', '.join(AGGREGATIONS)}")


def policy_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None, *,
                clip_eps_low: float = 0.2, clip_eps_high: float = 0.28, kl_coef: float = 0.0,
                aggregation: str = "token-mean", normalizer: float | None = None,
                max_tokens: int | None = None, entropy: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped PG loss and its metrics.

    Args:
        logp: [B, T] log-probabilities of the completion tokens under the current policy (grad).
        advantages: [B] per rollout (broadcast over tokens) or [B, T] per token.
        mask: [B, T], 1 for real completion tokens, 0 for padding.
        old_logp: [B, T] behaviour-policy logprobs; None → on-policy (ratio 1, gradient A·∇logp).
        ref_logp: [B, T] reference-policy logprobs for the KL term (needed when kl_coef > 0).
        entropy: optional [B, T] exact per-token entropy for the metric; otherwise the
            metric is the sampled estimate mean(−logp).

    Returns (loss, metrics); metrics are floats: ``pg_loss``, ``kl`` (token-mean k3; 0 without a
    reference), ``clip_frac`` (tokens where the clipped branch is the active one), ``clip_frac_low``,
    ``clip_frac_high``, ``ratio_mean``, ``ratio_max``, ``entropy``, ``tokens``, ``adv_mean``.
    """
    _check_inputs(logp, mask, clip_eps_low, clip_eps_high)
    mask = mask.to(logp.dtype).detach()
    old, adv, ref_logp = _clean_inputs(logp, advantages, mask, old_logp, ref_logp)
    log_ratio = (logp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    pg = torch.maximum(-adv * ratio, -adv * clipped)
    pg_loss = aggregate(pg, mask, aggregation, normalizer, max_tokens)

    loss = pg_loss
    if ref_logp is not None:
        kl_tok = k3_kl(logp, ref_logp)
        kl_agg = aggregate(kl_tok, mask, aggregation, normalizer, max_tokens)
        if kl_coef:
            loss = loss + kl_coef * kl_agg
        kl_value = _masked_mean(kl_tok.detach(), mask)
    elif kl_coef:
        raise ValueError("kl_coef > 0 needs ref_logp")
    else:
        kl_value = 0.0
    metrics = _metrics(loss, pg_loss, kl_value, logp, ratio, adv, mask, entropy,
                       clip_eps_low, clip_eps_high)
    return loss, metrics


def _check_inputs(logp: torch.Tensor, mask: torch.Tensor, clip_eps_low: float,
                  clip_eps_high: float) -> None:
    if logp.dim() != 2:
        raise ValueError("logp must be [batch, tokens]")
    if mask.shape != logp.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logp shape {tuple(logp.shape)}")
    if clip_eps_low < 0 or clip_eps_high < 0 or clip_eps_low >= 1:
        raise ValueError("need 0 <= clip_eps_low < 1 and clip_eps_high >= 0")


def _clean_inputs(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(behaviour logprobs, per-token advantages, reference logprobs), detached, in logp's
    dtype, [B, T], with padding replaced: it may hold anything (NaN, -inf), and no NaN may reach
    the gradient."""
    adv = advantages.detach().to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(logp)
    old = logp.detach() if old_logp is None else old_logp.detach().to(logp.dtype)
    on = mask > 0
    old = torch.where(on, old, logp.detach())
    adv = torch.where(on, adv, torch.zeros_like(adv))
    if ref_logp is not None:
        ref_logp = torch.where(on, ref_logp.detach().to(logp.dtype), logp.detach())
    return old, adv, ref_logp


@torch.no_grad()
def _metrics(loss: torch.Tensor, pg_loss: torch.Tensor, kl_value: float, logp: torch.Tensor,
             ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
             entropy: torch.Tensor | None, clip_eps_low: float, clip_eps_high: float
             ) -> dict[str, Any]:
    on = mask > 0
    high = (adv > 0) & (ratio > 1.0 + clip_eps_high)
    low = (adv < 0) & (ratio < 1.0 - clip_eps_low)
    ent = entropy.detach() if entropy is not None else -logp.detach()
    return {
        "loss": float(loss.detach()),
        "pg_loss": float(pg_loss.detach()),
        "kl": kl_value,
        "clip_frac": _masked_mean((high | low).to(logp.dtype), mask),
        "clip_frac_high": _masked_mean(high.to(logp.dtype), mask),
        "clip_frac_low": _masked_mean(low.to(logp.dtype), mask),
        "ratio_mean": _masked_mean(ratio, mask),
        "ratio_max": float(ratio[on].max()) if bool(on.any()) else 1.0,
        "entropy": _masked_mean(ent.to(logp.dtype), mask),
        "tokens": float(mask.sum()),
        "adv_mean": _masked_mean(adv, mask),
    }


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    total = float(mask.sum())
    values = torch.where(mask > 0, values, torch.zeros_like(values))
    return float((values * mask).sum()) / total if total > 0 else 0.0

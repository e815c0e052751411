"""PPO's learned critic: GAE, the clipped value loss, advantage whitening, a running return
normaliser and the value model itself.

Layout is the trainer's (see :mod:`sara_trainer.policy`): per-token tensors are [B, T] over the
completion tokens, ``mask`` is 1 for real tokens and is a prefix of ones in each row (a row may
have none). ``values[b, t]`` is V(s_t), the value of the state *before* completion token t, and
``rewards[b, t]`` the reward for emitting token t; the state after a row's last real token is
terminal (value 0). Outcome rewards (one verifier score per rollout) sit on the last real token.

The critic predicts *normalised* returns: ``ValueNormalizer`` keeps the running mean and variance
of every return seen, GAE runs on denormalised values, and the value loss compares the critic's
raw output with normalised returns. Switched off, the normaliser is the identity.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from sara_client.hf_kernels import fuse_gelu

from .loss import aggregate

CRITIC_DIR = "critic"
HEAD_FILE = "value_head.safetensors"
NORMALIZER_FILE = "normalizer.json"
CRITIC_OPTIMIZER_FILE = "optimizer.pt"


# ---------------------------------------------------------------------------------------------
# advantages


def _zero_padding(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # padding may hold anything (NaN from a padded forward pass): it must not leak into sums
    return torch.where(mask > 0, values, torch.zeros_like(values))


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over completion tokens.

    ``delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)`` with V = 0 after a row's last real token,
    ``A_t = delta_t + gamma * lam * A_{t+1}``; returns ``(advantages, returns = A + V)``, both
    [B, T] and 0 at padding. No gradient flows (the inputs are treated as constants).
    """
    if rewards.shape != values.shape or mask.shape != values.shape:
        raise ValueError("rewards, values and mask must have the same [B, T] shape")
    mask = mask.to(values.dtype)
    rewards, values = _zero_padding(rewards, mask), _zero_padding(values, mask)
    # one extra all-padding column: the state after the last column is terminal as well
    zeros = torch.zeros_like(values[..., :1])
    next_values = torch.cat([values, zeros], -1)[..., 1:]
    next_real = torch.cat([mask, zeros], -1)[..., 1:]
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[..., 0])
    for t in reversed(range(values.shape[-1])):
        # next_real is 0 past a row's last token: V(terminal) = 0 and the recursion restarts
        delta = rewards[..., t] + gamma * next_values[..., t] * next_real[..., t] - values[..., t]
        running = delta + gamma * lam * next_real[..., t] * running
        advantages[..., t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def outcome_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards [B, T]: each rollout's score on its last real token, 0 elsewhere
    (a row with no tokens gets nothing)."""
    mask = mask.to(torch.float32)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    lengths = mask.sum(-1).long()
    rows = torch.nonzero(lengths > 0).squeeze(-1)
    out[rows, lengths[rows] - 1] = scores.to(out)[rows]
    return out


def _masked_moments(values: torch.Tensor, mask: torch.Tensor, unbiased: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, variance) of `values` over `mask`."""
    mask = mask.to(values.dtype)
    values = _zero_padding(values, mask)
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1.0)
    dof = count - 1.0 if unbiased else count
    var = (((values - mean) * mask) ** 2).sum() / dof.clamp(min=1.0)
    return count, mean, var


@torch.no_grad()
def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
           eps: float = 1e-8) -> torch.Tensor:
    """Masked whitening (PPO's advantage normalisation): mean 0 and (Bessel) std 1 over the real
    tokens, 0 at padding. ``shift_mean=False`` only rescales."""
    _, mean, var = _masked_moments(values, mask, unbiased=True)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return _zero_padding(out, mask.to(values.dtype))


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over real tokens: 1 is a perfect critic, 0 one no better than the
    mean return, negative a worse one; NaN when the returns do not vary."""
    _, _, var_r = _masked_moments(returns, mask, unbiased=False)
    _, _, var_err = _masked_moments(returns - values, mask, unbiased=False)
    return float(1.0 - var_err / var_r) if float(var_r) > 0 else math.nan


# ---------------------------------------------------------------------------------------------
# the value loss


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip_eps: float | None = 0.2, *,
               aggregation: str = "token-mean", normalizer: float | None = None,
               max_tokens: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, ±eps) - R)^2)``,
    reduced like the policy loss (:func:`sara_trainer.loss.aggregate`, same `aggregation`,
    `normalizer`, `max_tokens`). ``clip_eps`` None or 0: the unclipped ``0.5 * (V - R)^2``.

    Only `values` carries gradient. Metrics: ``vf_loss``, ``vf_clip_frac`` (tokens where the
    clipped branch is the larger one), ``value_mean``, ``explained_variance``.
    """
    if values.shape != returns.shape or mask.shape != values.shape:
        raise ValueError("values, returns and mask must have the same [B, T] shape")
    mask = mask.to(values.dtype).detach()
    values = _zero_padding(values, mask)   # a NaN at padding would turn its zero gradient to NaN
    returns = _zero_padding(returns.detach().to(values.dtype), mask)
    old = torch.where(mask > 0, old_values.detach().to(values.dtype), values.detach())
    unclipped = (values - returns) ** 2
    if clip_eps:
        clipped_values = old + (values - old).clamp(-clip_eps, clip_eps)
        clipped = (clipped_values - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clip_hits = (clipped > unclipped).to(values.dtype)
    else:
        per_token, clip_hits = unclipped, torch.zeros_like(unclipped)
    loss = 0.5 * aggregate(per_token, mask, aggregation, normalizer, max_tokens)
    with torch.no_grad():
        count = float(mask.sum())
        metrics = {
            "vf_loss": float(loss.detach()),
            "vf_clip_frac": float((clip_hits * mask).sum()) / count if count else 0.0,
            "value_mean": float((values.detach() * mask).sum()) / count if count else 0.0,
            "explained_variance": explained_variance(values.detach(), returns, mask),
        }
    return loss, metrics


# ---------------------------------------------------------------------------------------------
# the return normaliser


class ValueNormalizer:
    """Running mean and variance (population) of every return seen, merged batch by batch with
    Chan et al.'s parallel update, so the result equals the statistics of all the data at once.

    ``normalize(x) = (x - mean) / std`` and ``denormalize`` its inverse; before any data (or when
    ``enabled`` is False) both are the identity.
    """

    def __init__(self, enabled: bool = True, eps: float = 1e-4) -> None:
        self.enabled, self.eps = bool(enabled), float(eps)
        self.mean, self.var, self.count = 0.0, 1.0, 0.0

    @property
    def std(self) -> float:
        # a floor keeps a batch of identical returns from blowing the targets up
        return max(math.sqrt(self.var), self.eps)

    @torch.no_grad()
    def update(self, values: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Merge the real entries of `values` into the running statistics."""
        if not self.enabled:
            return
        values = values.detach().double()
        mask = torch.ones_like(values) if mask is None else mask.detach().double()
        count, mean, var = (float(x) for x in _masked_moments(values, mask, unbiased=False))
        if count <= 0:
            return
        if self.count <= 0:
            self.mean, self.var, self.count = mean, var, count
            return
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta * delta * self.count * count / total
        self.mean, self.var, self.count = self.mean + delta * count / total, m2 / total, total

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        if not self.enabled or self.count <= 0:
            return values
        return (values - self.mean) / self.std

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        if not self.enabled or self.count <= 0:
            return values
        return values * self.std + self.mean

    def state_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "eps": self.eps, "mean": self.mean, "var": self.var,
                "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.enabled = bool(state.get("enabled", self.enabled))
        self.eps = float(state.get("eps", self.eps))
        self.mean, self.var = float(state["mean"]), float(state["var"])
        self.count = float(state["count"])


# ---------------------------------------------------------------------------------------------
# the value model


def _model_dir(path: str | Path) -> Path:
    """A directory ``from_pretrained`` reads: `path` itself, or a checkpoint root's latest."""
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    from .checkpoint import latest_checkpoint

    resolved = latest_checkpoint(path)
    if resolved is None:
        raise FileNotFoundError(f"no model or complete checkpoint at {path}")
    return resolved


def _load_backbone(path: Path, device: str | torch.device):
    from transformers import AutoModel

    from .policy import disable_dropout

    # as load_policy loads the policy: eager attention on CPU (SDPA is much slower there for
    # short rows) and gelu_new as the fused kernel
    kwargs = {"attn_implementation": "eager"} if torch.device(device).type == "cpu" else {}
    backbone = AutoModel.from_pretrained(path, dtype=torch.float32, **kwargs).to(device)
    fuse_gelu(backbone)
    return disable_dropout(backbone)


class ValueModel(torch.nn.Module):
    """A separate critic: a transformer backbone (initialised from the policy, as PPO commonly
    does from the SFT model) and a zero-initialised ``Linear(hidden, 1)`` head, with the return
    normaliser its outputs are expressed in."""

    def __init__(self, backbone: torch.nn.Module, normalize: bool = True) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(int(backbone.config.hidden_size), 1)
        # a zero head predicts V = 0 everywhere at first: GAE then starts as plain returns
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.head.to(next(backbone.parameters()).device)
        self.normalizer = ValueNormalizer(enabled=normalize)

    @classmethod
    def from_policy(cls, path: str | Path, device: str | torch.device = "cpu",
                    normalize: bool = True) -> ValueModel:
        """A fresh critic on the backbone of the causal LM at `path` (HF dir or checkpoint)."""
        return cls(_load_backbone(_model_dir(path), device), normalize=normalize)

    def forward(self, batch) -> torch.Tensor:
        """Raw (normalised-scale) values [B, Tc] of the states before each completion token:
        the hidden states at positions P-1 .. P-1+Tc, as ``completion_logprobs`` reads logits;
        0 at padding."""
        out = self.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            position_ids=batch.position_ids, use_cache=False)
        p, tc = batch.prompt_width, batch.completion_ids.shape[1]
        hidden = out.last_hidden_state[:, p - 1:p - 1 + tc].float()
        return _zero_padding(self.head(hidden).squeeze(-1), batch.completion_mask)

    def save(self, directory: str | Path, optimizer: torch.optim.Optimizer | None = None
             ) -> Path:
        """Write ``directory/critic/`` (backbone, head, normaliser, optimizer); returns it. The
        policy at ``directory`` still loads with ``from_pretrained``: it ignores subfolders."""
        from safetensors.torch import save_file

        out = Path(directory) / CRITIC_DIR
        out.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(out, safe_serialization=True)
        head = {k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()}
        save_file(head, str(out / HEAD_FILE))
        (out / NORMALIZER_FILE).write_text(json.dumps(self.normalizer.state_dict(), indent=2))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), out / CRITIC_OPTIMIZER_FILE)
        return out

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> ValueModel:
        """The critic saved under ``directory/critic/`` (or `directory` itself if it is one)."""
        from safetensors.torch import load_file

        source = Path(directory)
        if not (source / HEAD_FILE).is_file():
            source = source / CRITIC_DIR
        if not (source / HEAD_FILE).is_file():
            raise FileNotFoundError(f"no critic at {directory}")
        model = cls(_load_backbone(source, device))
        model.head.load_state_dict(load_file(str(source / HEAD_FILE), device=str(device)))
        model.normalizer.load_state_dict(json.loads((source / NORMALIZER_FILE).read_text()))
        return model


def has_critic(directory: str | Path) -> bool:
    """Whether a checkpoint directory holds a saved critic."""
    return (Path(directory) / CRITIC_DIR / HEAD_FILE).is_file()


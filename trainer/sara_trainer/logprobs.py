"""Completion log-probabilities and entropies without full-vocabulary tensors for the batch.

The naive path (``model(...).logits`` then ``log_softmax``) holds [B, T, V] logits, a float32
copy and a log-softmax of the same size, and autograd keeps them all for backward: with Qwen's
151,936-token vocabulary that is tens of GB per micro-batch. Here the model's body runs once to
hidden states; the output head then runs on ``chunk_rows`` completion positions at a time, and each
chunk's log-probability of the chosen token is ``logit[token] - logsumexp(logits)``. Each chunk
runs under activation checkpointing, so backward recomputes that chunk's logits instead of
keeping them: peak extra memory is one chunk's [chunk_rows, V] logits, whatever the batch.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_ROWS = 1024


def head_and_body(model):
    """(body, head) when the model splits into a base model and a plain output projection."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = getattr(model, "base_model", None)
    if head is None or body is None or body is model:
        return None, None
    # heads that post-process logits (soft-capping, scaling) need the model's own forward
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None, None
    return body, head


def _chunk_stats(head, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp of `tokens`, entropy) for rows of `hidden` [N, H]; logits exist only in here."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    with torch.no_grad():
        # H = logsumexp - sum(p * logits), p = softmax: no [N, V] log-softmax kept
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def _rows_stats(head, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                with_entropy: bool, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    logps, entropies = [], []
    grad = torch.is_grad_enabled() and hidden.requires_grad
    for start in range(0, hidden.shape[0], chunk_rows):
        h, t = hidden[start:start + chunk_rows], tokens[start:start + chunk_rows]
        if grad:   # recompute this chunk's logits in backward instead of storing them
            lp, ent = checkpoint(_chunk_stats, head, h, t, temperature, with_entropy,
                                 use_reentrant=False)
        else:
            lp, ent = _chunk_stats(head, h, t, temperature, with_entropy)
        logps.append(lp)
        entropies.append(ent.detach())
    return torch.cat(logps), torch.cat(entropies)


def chunked_completion_logprobs(model, batch, temperature: float = 1.0,
                                with_entropy: bool = False,
                                chunk_rows: int = DEFAULT_CHUNK_ROWS
                                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log p(completion token | prefix) [B, Tc] with the gradient, 0 at padding, and
    with `with_entropy` the exact per-token entropy (no gradient); equal to the naive
    full-vocabulary computation (see the module docstring for why it is done this way)."""
    p, tc = batch.prompt_width, batch.completion_ids.shape[1]
    kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  position_ids=batch.position_ids, use_cache=False)
    body, head = head_and_body(model)
    if body is not None:
        hidden = body(**kwargs).last_hidden_state[:, p - 1:p - 1 + tc]
    else:   # no separable head: full logits, but the softmax work is still chunked
        hidden = model(**kwargs).logits[:, p - 1:p - 1 + tc]
        head = torch.nn.Identity()
    rows, width = hidden.shape[0], hidden.shape[1]
    flat = hidden.reshape(rows * width, hidden.shape[-1])
    logp, entropy = _rows_stats(head, flat, batch.completion_ids.reshape(-1), temperature,
                                with_entropy, max(1, chunk_rows))
    mask = batch.completion_mask
    logp = logp.view(rows, width) * mask
    return logp, (entropy.view(rows, width) * mask if with_entropy else None)

"""Next-token sampling for the hf backend: temperature, top-p, one uniform per row.

Apart from the model so it can be checked on hand-made logits (tests/backends/test_hf_sampling.py).
"""

from __future__ import annotations

import math
from typing import Any, Callable


def sample(logits: Any, temperatures: list[float], top_ps: list[float],
           uniforms: Callable[[list[int]], Any]) -> list[tuple[int, float]]:
    """One token per row of `logits` and its raw logprob (log-softmax before temperature and
    top-p: the behaviour policy's, as vLLM reports by default).

    A row with temperature <= 0 is greedy. The others draw by inverting the CDF of the
    temperature-scaled, top-p-truncated distribution at `uniforms(rows)[i]`, a uniform in [0, 1)
    for each sampled row (a seeded request supplies its own). A -inf logprob stays -inf.
    """
    import torch

    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    temps = torch.tensor(temperatures, device=logits.device)
    tokens = logits.argmax(dim=-1)
    sampled_rows = (~(temps <= 0)).nonzero().flatten().tolist()
    if sampled_rows:
        index = torch.tensor(sampled_rows, device=logits.device)
        sub = logits.index_select(0, index) / temps.index_select(0, index).unsqueeze(1)
        probs = torch.softmax(sub, dim=-1)
        top_p = torch.tensor([top_ps[i] for i in sampled_rows], device=logits.device)
        if bool((top_p < 1).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            before = sorted_p.cumsum(dim=-1) - sorted_p
            sorted_p = sorted_p.masked_fill(before >= top_p.unsqueeze(1), 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        cdf = probs.cumsum(dim=-1)
        target = (uniforms(sampled_rows).to(logits.device) * cdf[:, -1]).unsqueeze(1)
        picked = torch.searchsorted(cdf, target, right=True).squeeze(1)
        tokens = tokens.index_copy(0, index, picked.clamp(max=logits.shape[-1] - 1))
    chosen = raw.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return [(int(t), float(lp) if math.isfinite(float(lp)) else -math.inf)
            for t, lp in zip(tokens.tolist(), chosen.tolist())]

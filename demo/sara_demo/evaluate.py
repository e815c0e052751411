"""Held-out evaluation of a policy on the demo's task: greedy accuracy and the spread of k
samples per prompt (all-fail / mixed / all-success), overall and by difficulty bucket. Rewards
come from the worker's verifiers (:func:`sara_worker.verifiers.score`), the same rule the
workers apply during RL."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from sara_trainer.policy import PromptLike, prompt_text, sample

def _score(prompt: PromptLike, completion: str) -> float:
    from .tasks import score

    if isinstance(prompt, Mapping):
        return score(prompt, completion)
    return score({"prompt": prompt, "task": "arith"}, completion)


def _bucket(prompt: PromptLike) -> str:
    if isinstance(prompt, Mapping):
        meta = prompt.get("meta") or {}
        if meta.get("bucket"):
            return str(meta["bucket"])
        if prompt.get("task", "arith") != "arith":
            return str(prompt.get("task"))
    from .tasks.arith import bucket_of

    return bucket_of(prompt_text(prompt)) or "other"


def _ordered(keys) -> list[str]:
    from .tasks.arith import BUCKET_NAMES

    order = {name: i for i, name in enumerate(BUCKET_NAMES)}
    return sorted(keys, key=lambda name: (order.get(name, len(order)), name))


def greedy_accuracy(model, tokenizer, eval_set: Sequence[PromptLike], max_new_tokens: int = 8,
                    batch_size: int = 1024) -> dict[str, Any]:
    """Greedy (temperature 0) accuracy over `eval_set`, overall and by bucket.

    Returns ``{"accuracy": float, "n": int, "by_bucket": {bucket: accuracy},
    "counts": {bucket: n}}``; buckets in difficulty order.
    """
    # decoded shortest prompt first: a batch decodes until its longest answer is done, and
    # short prompts have short answers, so like lengths together cut the steps and the padding
    # (8,000 arith test problems: 3.2 s against 5.0 s on one thread). Greedy decoding is per
    # row, so the order changes no answer
    ordered = sorted(eval_set, key=lambda prompt: len(prompt_text(prompt)))
    samples = sample(model, tokenizer, ordered, k=1, max_new_tokens=max_new_tokens,
                     temperature=0.0, batch_size=batch_size)
    hits: dict[str, list[float]] = defaultdict(list)
    for prompt, completion in zip(ordered, samples.completions):
        hits[_bucket(prompt)].append(_score(prompt, completion))
    total = [h for values in hits.values() for h in values]
    names = _ordered(hits)
    return {"accuracy": sum(total) / len(total) if total else 0.0, "n": len(total),
            "by_bucket": {b: sum(hits[b]) / len(hits[b]) for b in names},
            "counts": {b: len(hits[b]) for b in names}}


def group_kinds(model, tokenizer, prompts: Sequence[PromptLike], k: int = 8,
                temperature: float = 1.0, max_new_tokens: int = 8,
                generator: torch.Generator | None = None, batch_size: int = 1024) -> list[str]:
    """Sample k per prompt; each prompt's group as ``all_fail``, ``mixed`` or ``all_success``
    (a reward of at least 0.5 is a success), in the order of `prompts`."""
    samples = sample(model, tokenizer, prompts, k=k, max_new_tokens=max_new_tokens,
                     temperature=temperature, generator=generator, batch_size=batch_size)
    kinds = []
    for i, prompt in enumerate(prompts):
        s = sum(_score(prompt, c) >= 0.5 for c in samples.group(i))
        kinds.append("all_fail" if s == 0 else "all_success" if s == k else "mixed")
    return kinds


def group_outcomes(model, tokenizer, prompts: Sequence[PromptLike], k: int = 8,
                   temperature: float = 1.0, max_new_tokens: int = 8,
                   generator: torch.Generator | None = None, batch_size: int = 1024
                   ) -> dict[str, Any]:
    """Sample k per prompt and classify each group: all-fail, mixed (effective) or all-success.

    Returns ``{"all_fail", "mixed", "all_success"}`` fractions, ``mean_reward``, ``n`` and
    ``by_bucket: {bucket: {"all_fail", "mixed", "all_success", "mean_reward", "n"}}``.
    """
    samples = sample(model, tokenizer, prompts, k=k, max_new_tokens=max_new_tokens,
                     temperature=temperature, generator=generator, batch_size=batch_size)
    kinds: dict[str, list[str]] = defaultdict(list)
    rewards: dict[str, list[float]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        rs = [_score(prompt, c) for c in samples.group(i)]
        s = sum(r > 0.5 for r in rs)
        kind = "all_fail" if s == 0 else "all_success" if s == k else "mixed"
        bucket = _bucket(prompt)
        kinds[bucket].append(kind)
        rewards[bucket].extend(rs)

    def summary(ks: list[str], rs: list[float]) -> dict[str, Any]:
        n = len(ks)
        return {"all_fail": ks.count("all_fail") / n if n else 0.0,
                "mixed": ks.count("mixed") / n if n else 0.0,
                "all_success": ks.count("all_success") / n if n else 0.0,
                "mean_reward": sum(rs) / len(rs) if rs else 0.0, "n": n}

    every_kind = [x for b in kinds for x in kinds[b]]
    every_reward = [x for b in rewards for x in rewards[b]]
    out = summary(every_kind, every_reward)
    out["by_bucket"] = {b: summary(kinds[b], rewards[b]) for b in _ordered(kinds)}
    return out


def heldout_accuracy(model, tokenizer, eval_set, max_new_tokens: int) -> dict[str, Any]:
    """Greedy accuracy on `eval_set` (overall and by bucket), leaving the model's mode as it was."""
    was = model.training
    try:
        return greedy_accuracy(model, tokenizer, eval_set, max_new_tokens=max_new_tokens)
    finally:
        model.train(was)

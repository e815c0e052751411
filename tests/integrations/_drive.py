"""A stand-in rollout engine for the integration tests: deterministic tokens and coin-flip
rewards, so SARA (the real app on the tests' real Redis) commits mixed groups and abandons
saturated ones exactly as it would with a real engine."""

from __future__ import annotations

import random
from typing import Any

PROMPTS = [{"id": f"p{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i), "task": "exact"}
           for i in range(40)]


def encode(prompt: Any) -> list[int]:
    """A character 'tokenizer' (ids 4..), the same for every caller."""
    return [4 + (ord(c) % 60) for c in str(prompt)]


def fake_generate(rollouts: Any, rng: random.Random, version: int) -> list[dict[str, Any]]:
    """One result per leased rollout: 1..5 tokens ending in eos (2), reward 0/1 by coin flip."""
    out = []
    for r in rollouts:
        toks = [4 + rng.randrange(60) for _ in range(rng.randrange(0, 4))] + [2]
        out.append({"rollout_id": r.rollout_id, "reward": float(rng.random() < 0.5),
                    "completion": "x" * len(toks), "token_ids": toks,
                    "completion_tokens": len(toks), "finish_reason": "stop",
                    "logprobs": [-0.5] * len(toks), "policy_version": version})
    return out


def next_batch(sara: Any, size: int, seed: int = 0, worker: str = "w0") -> Any:
    """Lease, generate, report until SARA delivers a batch of `size` groups."""
    rng = random.Random(seed)
    version = sara.get_policy().version
    for _ in range(500):
        batch = sara.next_batch(size=size)
        if batch is not None:
            return batch
        lease = sara.lease(worker, max_rollouts=16)
        if lease.rollouts:
            sara.report(worker, fake_generate(lease.rollouts, rng, version))
    raise AssertionError("no batch after 500 leases")

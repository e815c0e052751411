"""Synthetic prompt pools for the sim worker backend, which reads `meta.p_success` as a prompt's
latent success rate γ. Pure functions: the same (n, seed) always gives the same pool.
"""

from __future__ import annotations

import random

# The "standard pool": the mix of hopeless, solved and learnable prompts that SARA is measured on.
STANDARD_FRACTIONS = {"zero": 0.30, "one": 0.25, "beta": 0.45}


def standard_pool(n: int, seed: int = 0) -> list[dict]:
    """`n` sim prompts with ids `p0 … p{n-1}`: 30% with γ = 0, 25% with γ = 1 and the rest with
    γ ~ Beta(2, 2). The counts are exact (rounded), the kinds shuffled over the ids by `seed`."""
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(seed)
    n_zero = round(STANDARD_FRACTIONS["zero"] * n)
    n_one = round(STANDARD_FRACTIONS["one"] * n)
    kinds = ["zero"] * n_zero + ["one"] * n_one + ["beta"] * (n - n_zero - n_one)
    rng.shuffle(kinds)
    pool = []
    for i, kind in enumerate(kinds):
        gamma = 0.0 if kind == "zero" else 1.0 if kind == "one" else rng.betavariate(2.0, 2.0)
        pool.append({
            "id": f"p{i}",
            "prompt": f"sim prompt {i}",
            "task": "sim",
            "meta": {"p_success": gamma, "kind": kind},
        })
    return pool

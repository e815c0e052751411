#!/usr/bin/env python
"""Writes mostly_mixed.jsonl beside this file: a pool where SARA's allocation saves little over
Dynamic Sampling (15% of prompts never solved, 10% always, 75% with a success chance drawn from
Beta(2, 2); k = 8, tau_low 0.5: DS spends 11.95 rollouts per mixed group, SARA 11.47, 1.04x),
for `bench/engine_time.py --prompts bench/pools/mostly_mixed.jsonl`: whether the engine keeps
SARA's small saving too. Each prompt is 150 characters, as engine_time's standard pool's are, so
it fills one KV block of the CPU engine.

    python bench/pools/mostly_mixed.py        # the same 512 lines every time (seed 1)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

FILLER = " Think it through step by step and give the final answer at the end."


def prompts(n: int = 512, seed: int = 1) -> list[dict]:
    """The pool's POST /prompts objects, each with meta.p_success."""
    rng = random.Random(seed)
    gammas = [0.0] * int(0.15 * n) + [1.0] * int(0.10 * n)
    gammas += [rng.betavariate(2, 2) for _ in range(n - len(gammas))]
    return [{"id": f"mm{i}", "prompt": (f"Problem mm{i}:" + FILLER * 3)[:150], "task": "sim",
             "meta": {"p_success": round(gamma, 6)}} for i, gamma in enumerate(gammas)]


if __name__ == "__main__":
    out = Path(__file__).with_suffix(".jsonl")
    out.write_text("".join(json.dumps(p) + "\n" for p in prompts()))
    print(f"wrote {out}")

"""``sim``: the reward a simulation decided.

- A completion from the sim backend ends in ``<sim reward=1>``: that is the reward.
- A sim backend's other endings (``<sim aborted>``, ``<sim error=...>``): 0.
- Any other completion (a real engine's text, in a benchmark of engine time) is rewarded 1 with
  probability ``meta["p_success"]``, drawn afresh for each call, so the pool's statistics are
  known exactly whatever the engine wrote. :func:`seed` makes the draws repeatable.
- Neither: 0.
"""

from __future__ import annotations

import math
import random
import re

from ..verifiers import register

_SIM = re.compile(r"<sim reward=([01])>")
_rng = random.Random()


def seed(value: int | None) -> None:
    """Seed the draws of untagged completions (None: from the OS)."""
    _rng.seed(value)


def _p_success(meta: dict) -> float | None:
    value = meta.get("p_success")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


@register("sim")
def sim(completion: str, answer: str | None, meta: dict) -> float:
    found = _SIM.findall(completion[-256:])
    if found:
        return float(found[-1])
    p = None if "<sim " in completion else _p_success(meta)
    if p is None:
        return 0.0
    return 1.0 if _rng.random() < p else 0.0

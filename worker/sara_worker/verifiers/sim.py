"""``sim``: read back the reward the sim backend decided (``<sim reward=1>``)."""

from __future__ import annotations

import re

from . import register

_SIM = re.compile(r"<sim reward=([01])>")


@register("sim")
def sim(completion: str, answer: str | None, meta: dict) -> float:
    found = _SIM.findall(completion[-256:])
    return float(found[-1]) if found else 0.0

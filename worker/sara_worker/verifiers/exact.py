"""``exact``: the completion, whitespace-normalised, equals the answer."""

from __future__ import annotations

from . import register
from ._text import normalize_ws


@register("exact")
def exact(completion: str, answer: str | None, meta: dict) -> float:
    if answer is None:
        return 0.0
    return float(normalize_ws(completion) == normalize_ws(str(answer)))

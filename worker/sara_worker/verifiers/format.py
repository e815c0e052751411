"""``format:<verifier>``: any verifier, plus a bonus for a well-formed answer.

The task ``format:countdown`` scores a completion with ``countdown`` and adds
``meta["format_bonus"]`` (default 0.1) when the completion is well formed, never lifting the
reward above ``meta["format_cap"]`` (default 1.0) and never lowering one already above it:
``max(inner, min(inner + bonus, cap))``. With the defaults and a 0/1 verifier that is the common
shaped reward: 1.0 correct, 0.1 well formatted but wrong, 0.0 otherwise.

Well formed: the completion ends with a non-empty ``<answer>…</answer>`` (trailing whitespace
allowed), or, when the prompt gives ``meta["format_pattern"]``, that regular expression is found
in it (the last 100,000 characters, as every verifier reads; the pattern comes from whoever
registered the prompt, so keep it simple).

Such rewards are not 0/1: run the scheduler with ``SARA_EFFECTIVE=reward`` and a
``SARA_REWARD_TOLERANCE`` below the bonus, or groups that differ only in format are dropped.
"""

from __future__ import annotations

import re

from ._text import tail

PREFIX = "format:"
DEFAULT_BONUS, DEFAULT_CAP = 0.1, 1.0
_WELL_FORMED = re.compile(r"<answer>\s*\S.*?</answer>\s*$", re.DOTALL | re.IGNORECASE)


def well_formed(completion: str, meta: dict) -> bool:
    """Whether the completion has the expected shape (see the module docstring)."""
    pattern = meta.get("format_pattern")
    text = tail(completion)
    if isinstance(pattern, str) and pattern:
        return re.search(pattern, text, re.DOTALL) is not None
    return _WELL_FORMED.search(text) is not None


def with_bonus(inner: float, formed: bool, bonus: float, cap: float) -> float:
    """The inner reward with the format bonus applied."""
    if not formed:
        return inner
    return max(inner, min(inner + bonus, cap))


def wrap(inner):
    """The ``format:`` verifier around ``inner`` (a Verifier)."""

    def formatted(completion: str, answer: str | None, meta: dict) -> float:
        reward = float(inner(completion, answer, meta))
        bonus = float(meta.get("format_bonus", DEFAULT_BONUS))
        cap = float(meta.get("format_cap", DEFAULT_CAP))
        return with_bonus(reward, well_formed(completion, meta), bonus, cap)

    return formatted

"""``arith``: the CPU demo's synthetic arithmetic. The completion's final integer is the answer.

With ``meta["reversed_answer"]`` true the model writes the answer's digits in reverse (least
significant first, which tiny models learn more easily): ``"12+34="`` answered ``"64"`` is right.
A minus sign may stand on either side of the digits. Anything unparsable scores 0.
"""

from __future__ import annotations

import re

from . import register
from ._text import tail

_INT = re.compile(r"(-?)(\d+)(-?)")
_MAX_DIGITS = 4000  # int() refuses longer strings by default


def _gold(answer: str | None) -> int | None:
    if answer is None:
        return None
    text = str(answer).strip().replace(",", "").replace("_", "")
    if not re.fullmatch(r"[+-]?\d{1,4000}", text):
        return None
    return int(text)


def final_integer(completion: str, reversed_digits: bool = False) -> int | None:
    """The last integer written in ``completion`` (digits reversed first if asked); or None."""
    found = _INT.findall(tail(completion))
    if not found:
        return None
    lead, digits, trail = found[-1]
    if len(digits) > _MAX_DIGITS:
        return None
    negative = lead == "-" or (reversed_digits and trail == "-")
    value = int(digits[::-1] if reversed_digits else digits)
    return -value if negative else value


@register("arith")
def arith(completion: str, answer: str | None, meta: dict) -> float:
    gold = _gold(answer)
    if gold is None:
        return 0.0
    got = final_integer(completion, bool(meta.get("reversed_answer", False)))
    return float(got is not None and got == gold)

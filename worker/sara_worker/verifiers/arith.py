"""``arith``: the CPU demo's synthetic arithmetic. The whole completion is the answer.

With ``meta["reversed_answer"]`` true the model writes the answer's digits in reverse (least
significant first, which tiny models learn more easily): ``"12+34="`` answered ``"64"`` is right,
and a negative result carries its minus sign after the digits (``"21-"`` is -12). The text up to a
first ``<eos>``, spaces around it ignored, must be exactly that integer. This is the one arith rule:
the demo's task (``sara_demo.tasks.arith.reward``) scores with this function too.
Anything else (extra text, two numbers, a misplaced sign) scores 0.
"""

from __future__ import annotations

import re

from . import register

_EOS = "<eos>"
_PLAIN = re.compile(r"(-?)(\d+)")
_REVERSED = re.compile(r"(\d+)(-?)")
_MAX_DIGITS = 4000  # int() refuses longer strings by default


def _gold(answer: str | None) -> int | None:
    if answer is None:
        return None
    text = str(answer).strip().replace(",", "").replace("_", "")
    if not re.fullmatch(r"[+-]?\d{1,4000}", text):
        return None
    return int(text)


def final_integer(completion: str, reversed_digits: bool = False) -> int | None:
    """The integer ``completion`` consists of (digits reversed first if asked); or None."""
    text = completion.split(_EOS, 1)[0].strip()
    if reversed_digits:
        match = _REVERSED.fullmatch(text)
        digits, negative = (match.group(1), match.group(2) == "-") if match else ("", False)
    else:
        match = _PLAIN.fullmatch(text)
        digits, negative = (match.group(2), match.group(1) == "-") if match else ("", False)
    if not match or len(digits) > _MAX_DIGITS:
        return None
    value = int(digits[::-1] if reversed_digits else digits)
    return -value if negative else value


@register("arith")
def arith(completion: str, answer: str | None, meta: dict) -> float:
    gold = _gold(answer)
    if gold is None:
        return 0.0
    got = final_integer(completion, bool(meta.get("reversed_answer", False)))
    return float(got is not None and got == gold)

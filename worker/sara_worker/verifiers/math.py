"""``math``: answer equivalence with math-verify (``pip install math-verify``).

The completion's answer is what math-verify extracts: the last ``\\boxed{…}`` or a final
answer in plain text or LaTeX. The reference answer is parsed as LaTeX (wrapped in
``\\boxed{}`` unless it already carries ``$`` or ``\\boxed``). Equivalent forms match
(``\\frac{1}{2}``, ``0.5``, ``1/2``). Any failure, timeouts included, scores 0.

math-verify bounds its work with SIGALRM, which only the main thread may use; in any other thread
(the worker loop runs this verifier in one) it runs without that bound.
"""

from __future__ import annotations

import threading

from . import register
from ._text import tail

TIMEOUT_S = 5
MAX_CHARS = 20_000


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _gold_text(answer: str) -> str:
    text = answer.strip()
    return text if ("$" in text or "\\boxed" in text) else f"\\boxed{{{text}}}"


@register("math", blocking=True)
def math_verifier(completion: str, answer: str | None, meta: dict) -> float:
    if answer is None or not str(answer).strip() or not completion.strip():
        return 0.0
    try:
        from math_verify import parse, verify

        timeout = _timeout()
        gold = parse(_gold_text(str(answer)), parsing_timeout=timeout)
        pred = parse(tail(completion)[-MAX_CHARS:], parsing_timeout=timeout)
        if not gold or not pred:
            return 0.0
        return float(bool(verify(gold, pred, timeout_seconds=timeout)))
    except Exception:
        return 0.0

"""``countdown``: combine the given numbers with + - * / to reach a target.

``meta["numbers"]`` (list of ints) and ``meta["target"]`` (int; ``answer`` is used when absent).
The expression is the last ``<answer>…</answer>`` of the completion, else its last non-empty
line; a trailing ``= …`` is ignored. It must use only integer literals combined by binary
+, -, *, / and parentheses, each given number at most once (exactly once with
``meta["use_all"]``), and equal the target exactly (rational arithmetic). It is parsed with
``ast`` and evaluated by walking the tree: nothing is ever ``eval``-ed. Division by zero, any
other node (names, calls, unary minus, powers, floats) or a parse error scores 0.

``countdown_close`` is the same puzzle with partial credit: a valid expression that misses the
target scores up to ``meta["close_credit"]`` (0.5), the closer the more (`closeness_credit`).
"""

from __future__ import annotations

import ast
import math
import operator
from collections import Counter
from fractions import Fraction

from . import register
from ._text import answer_tag, last_line, tail

MAX_EXPRESSION_CHARS = 1000
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}
_UNICODE = str.maketrans({"×": "*", "·": "*", "÷": "/", "−": "-", "–": "-"})


class _Invalid(Exception):
    pass


def expression_of(completion: str) -> str:
    """The candidate expression text of a completion."""
    text = tail(completion)
    found = answer_tag(text)
    expr = found if found is not None else last_line(text)
    return expr.split("=")[0].translate(_UNICODE).strip()


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Invalid("division by zero")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise _Invalid(f"not allowed: {type(node).__name__}")


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def value_of(expression: str, numbers: list[int], use_all: bool = False) -> Fraction | None:
    """The exact value of a valid ``expression`` over ``numbers`` (rules above), else None."""
    if not expression or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    try:
        used: list[int] = []
        value = _evaluate(ast.parse(expression, mode="eval"), used)
    except (_Invalid, SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None
    if Counter(used) - Counter(numbers):
        return None  # a number not given, or given fewer times than used
    if use_all and Counter(used) != Counter(numbers):
        return None
    return value


def check(expression: str, numbers: list[int], target: int, use_all: bool = False) -> bool:
    """Whether ``expression`` reaches ``target`` with ``numbers`` under the rules above."""
    value = value_of(expression, numbers, use_all)
    return value is not None and value == target


def _puzzle(answer: str | None, meta: dict) -> tuple[list[int], int] | None:
    raw = meta.get("numbers")
    numbers = [_as_int(n) for n in raw] if isinstance(raw, (list, tuple)) else []
    target = _as_int(meta.get("target", answer))
    if not numbers or None in numbers or target is None:
        return None
    return numbers, target  # type: ignore[return-value]


@register("countdown")
def countdown(completion: str, answer: str | None, meta: dict) -> float:
    puzzle = _puzzle(answer, meta)
    if puzzle is None:
        return 0.0
    return float(check(expression_of(completion), *puzzle, bool(meta.get("use_all", False))))


def closeness_credit(value: Fraction, target: int, most: float, step: float) -> float:
    """Partial credit for a valid expression that misses: ``most`` at distance 0 falling
    linearly to 0 at a distance of |target| (at least 1), rounded down to a multiple of
    ``step`` so that the rewards take few levels (SARA_REWARD_TOLERANCE bins them)."""
    scale = max(1, abs(target))
    share = max(Fraction(0), 1 - abs(value - target) / scale)
    credit = float(share) * most
    return round(math.floor(credit / step + 1e-9) * step, 10) if step > 0 else credit


@register("countdown_close")
def countdown_close(completion: str, answer: str | None, meta: dict) -> float:
    """``countdown`` with credit for closeness: 1.0 on the target; a valid expression that
    misses gets `closeness_credit` (``meta["close_credit"]``, default 0.5, at the most;
    ``meta["close_step"]``, default 0.05); anything else 0."""
    puzzle = _puzzle(answer, meta)
    if puzzle is None:
        return 0.0
    numbers, target = puzzle
    value = value_of(expression_of(completion), numbers, bool(meta.get("use_all", False)))
    if value is None:
        return 0.0
    if value == target:
        return 1.0
    most = min(1.0, max(0.0, float(meta.get("close_credit", 0.5))))
    return closeness_credit(value, target, most, float(meta.get("close_step", 0.05)))

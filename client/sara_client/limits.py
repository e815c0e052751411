"""Bounds on everything a request may store, and the checks that enforce them at the door.

Every value the service stores must read back through every later reader: Redis' Lua scripts
hold numbers as doubles (an integer past 2**53 comes back as `1e+17`), Python's serialisers stop at
a nesting depth, and JSON cannot carry NaN or infinities. A request that would store something
beyond these bounds is a 422 that names the field and says what to send instead.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field

MAX_PROMPT_CHARS = 64_000
# A chat prompt: at most this many messages, their contents together at most MAX_PROMPT_CHARS.
MAX_CHAT_MESSAGES = 256
MAX_COMPLETION_CHARS = 256_000
MAX_TOKENS_PER_ROLLOUT = 65_536
MAX_PROMPTS_PER_CALL = 10_000
MAX_ROLLOUTS_PER_LEASE = 4_096
MAX_RESULTS_PER_CALL = 4_096
MAX_WAIT_S = 60.0
# Largest integer a Lua double holds exactly: policy versions, token ids, any stored count.
MAX_STORED_INT = 2 ** 53 - 1
# `meta` is free-form JSON: nested at most this deep, at most this many bytes once encoded.
MAX_META_DEPTH = 32
MAX_META_BYTES = 64_000
# A logprob JSON cannot carry (-inf, NaN) is a 422; send this floor instead (the SDK's worker does).
FLOOR_LOGPROB = -1e4
# Letters, digits and _.:- ; not made only of dots ("." and ".." cannot be fetched by URL).
ID_PATTERN = r"^[A-Za-z0-9_.:\-]{0,127}[A-Za-z0-9_:\-][A-Za-z0-9_.:\-]{0,127}$"
MAX_ID_CHARS = 128


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0, `{}` is 1), found without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_META_DEPTH:
            return deepest  # deep enough to refuse: walking further only costs time
        stack.extend((child, depth + 1) for child in children)
    return deepest


def meta_problem(meta: Any) -> str | None:
    """Why `meta` could not be stored and read back (None when it can)."""
    if json_depth(meta) > MAX_META_DEPTH:
        return f"nested more than {MAX_META_DEPTH} levels deep; flatten it"
    try:
        json.dumps(meta, allow_nan=False, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return "holds a lone surrogate (such as \\ud800), which is not valid UTF-8"
    except ValueError:
        return "holds NaN or an infinity, which JSON cannot carry"
    return None


def _bounded_meta(meta: dict[str, Any]) -> dict[str, Any]:
    problem = meta_problem(meta)
    if problem:
        raise ValueError(problem)
    size = len(json.dumps(meta, ensure_ascii=False).encode())
    if size > MAX_META_BYTES:
        raise ValueError(f"{size} bytes once encoded, over {MAX_META_BYTES} bytes")
    return meta


def _finite_logprobs(values: list[float] | None) -> list[float] | None:
    for i, v in enumerate(values or ()):
        if not math.isfinite(v):
            raise ValueError(f"item {i} is {v}: logprobs must be finite; send the floor "
                             "-1e4 for -inf (the SDK's worker does) and no NaN")
    return values


Identifier = Annotated[str, Field(pattern=ID_PATTERN, min_length=1, max_length=MAX_ID_CHARS,
                                  description="1-128 letters, digits and _.:- ; not only dots.")]
StoredInt = Annotated[int, Field(ge=0, le=MAX_STORED_INT)]
TokenId = Annotated[int, Field(ge=0, le=MAX_STORED_INT)]
Meta = Annotated[dict[str, Any], AfterValidator(_bounded_meta)]
Logprobs = Annotated[list[float] | None, AfterValidator(_finite_logprobs)]

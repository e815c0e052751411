"""How the store reads back what it wrote, and what older releases wrote.

Every reader of stored data decodes it here, so a value an older release let in (an integer Lua
wrote as `1e+17`, a logprob stored as null, a `meta` too deep to serialise) degrades to a readable
answer instead of a 500 on every later call.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

from sara_client.limits import FLOOR_LOGPROB, MAX_STORED_INT, meta_problem


def text(value: Any) -> str:
    """A value as Redis answered it (bytes), as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def stored_int(value: Any, default: int = 0) -> int:
    """An integer as stored; also one Lua wrote as a double ('1e+17') or an older release let
    past 2**53 ('inf'), clamped to what the door now accepts, so a reader never fails on it."""
    if value is None or value == b"" or value == "":
        return default
    raw = text(value)
    try:
        return int(raw)
    except ValueError:
        number = float(raw)  # a ValueError here is data no release wrote
    if math.isnan(number):
        return default
    return int(max(-MAX_STORED_INT, min(MAX_STORED_INT, number)))


def decode_prompt(raw: Any) -> dict[str, Any]:
    """Stored prompt content; a `meta` an older release let in that cannot be serialised (too
    deep, a lone surrogate, NaN) is replaced by a note, so the prompt can still be read and
    leased."""
    content = json.loads(raw)
    problem = meta_problem(content.get("meta"))
    if problem:
        content["meta"] = {"sara_note": f"meta dropped: it {problem}; register the prompt "
                                        "again under a new id"}
    return content


# `decode_prompt`, cached. A prompt is read once per rollout of its group when leased, and again
# when its group is delivered: decoding (and checking its meta) once per stored content, not per
# read, was most of a lease's CPU. Keyed by the stored bytes, so new content is a new entry; the
# dict is shared between callers, who must only read it.
shared_prompt = functools.lru_cache(maxsize=4096)(decode_prompt)


def decode_result(raw: Any) -> dict[str, Any]:
    """A stored rollout result; a logprob an older release stored as null (it was -inf or NaN)
    reads as FLOOR_LOGPROB."""
    result = json.loads(raw)
    if result.get("logprobs"):
        result["logprobs"] = [FLOOR_LOGPROB if x is None else x for x in result["logprobs"]]
    return result

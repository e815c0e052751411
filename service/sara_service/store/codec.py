"""How the store reads back what it wrote.

Every reader of stored data decodes it here. Lua writes an integer past 2**53 as a double
(`1e+17`): `stored_int` reads it. What was stored before the door refused it (a null logprob, a
`meta` too deep to serialise) is repaired once by the format migration (store/migrate.py), not
by every reader.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from sara_client.limits import MAX_STORED_INT

from .redis_format import PosteriorField


def text(value: Any) -> str:
    """A value as Redis answered it (bytes), as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def texts(raw: dict) -> dict[str, str]:
    """A Redis hash as Redis answered it, as text on both sides."""
    return {text(a): text(b) for a, b in raw.items()}


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
    """Stored prompt content (its meta was checked at the door, and by the format migration for
    what was stored before the door checked it)."""
    return json.loads(raw)


# `decode_prompt`, cached. A prompt is read once per rollout of its group when leased, and again
# when its group is delivered: decoding (and checking its meta) once per stored content, not per
# read, was most of a lease's CPU. Keyed by the stored bytes, so new content is a new entry; the
# dict is shared between callers, who must only read it.
shared_prompt = functools.lru_cache(maxsize=4096)(decode_prompt)


def decode_result(raw: Any) -> dict[str, Any]:
    """A stored rollout result (RolloutResult's JSON)."""
    return json.loads(raw)


@dataclass(frozen=True, slots=True)
class StoredPosterior:
    """A prompt's posterior and history as apply_results.lua keeps them (the JSON field names are
    redis_format.PosteriorField), decoded once here so no reader names a field. A prompt with
    nothing stored reads as ``StoredPosterior()``: no evidence (`alpha` None), no history."""

    alpha: float | None = None   # Beta(alpha, beta) as last updated, the prior included
    beta: float | None = None
    version: int | None = None   # the policy version at that update
    clock: float | None = None   # the pool's clock in epochs then (store.prompts.pool_clock)
    groups: int = 0
    committed: int = 0
    abandoned: int = 0
    saturated: int = 0
    rollouts: int = 0
    successes: int = 0
    last_group: str | None = None
    # [version, 'F'|'M'|'S'] per decided group, [version, 'F'|'S', q] for an abandoned one
    observations: list = field(default_factory=list)
    level_counts: dict[str, float] = field(default_factory=dict)   # the reward view's counts

    @property
    def has_evidence(self) -> bool:
        """True once the prompt's Beta posterior is stored (at registration, then per result)."""
        return self.alpha is not None and self.beta is not None

    def age(self, version: int, clock: float) -> tuple[int, float]:
        """(policy versions, epochs of the pool) since the last update, at `version` and `clock`
        now; 0 for what was never recorded (a posterior from before the pool clock existed)."""
        versions = max(0, version - self.version) if self.version is not None else 0
        epochs = max(0.0, clock - self.clock) if self.clock is not None else 0.0
        return versions, epochs


def decode_posterior(raw: Any) -> StoredPosterior:
    """A stored posterior JSON (None or empty: nothing stored) as a StoredPosterior."""
    post = json.loads(raw) if raw else {}
    f = PosteriorField

    def number(name: str) -> float | None:
        value = post.get(name)
        return float(value) if value is not None else None

    def count(name: str) -> int:
        value = post.get(name)   # cjson writes a large integer as a double: stored_int reads it
        return value if type(value) is int else stored_int(value)

    version = post.get(f.version)
    last = post.get(f.last_group)
    return StoredPosterior(
        alpha=number(f.alpha), beta=number(f.beta),
        version=count(f.version) if version is not None else None, clock=number(f.clock),
        groups=count(f.groups), committed=count(f.committed), abandoned=count(f.abandoned),
        saturated=count(f.saturated), rollouts=count(f.rollouts), successes=count(f.successes),
        last_group=str(last) if last is not None else None,
        observations=list(post.get(f.observations) or []),
        level_counts=dict(post.get(f.level_counts) or {}))

"""The sim backend: no model, a latent success rate per prompt. For benchmarks and tests.

A rollout succeeds with probability γ = ``rollout.meta["p_success"]``; its length is lognormal,
with a larger median for failures (wrong answers ramble), capped at ``sampling.max_tokens``
(a capped rollout finishes with ``"length"``). The outcome of a rollout depends only on
``(seed, rollout_id, sampling.seed)``, never on scheduling order, so a re-issued rollout gets the
same outcome on any worker. The completion is ``<sim reward=1>`` or ``<sim reward=0>``, which the
``sim`` verifier reads back. A prompt without a usable ``p_success`` gets an ``error`` result
(reward 0), not a crash.

With ``per_token_s > 0`` generation takes time, in steps of ``step_tokens`` tokens, and
``abort`` stops it between steps with the tokens produced so far (``finish_reason="abort"``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from sara_client.models import Rollout

from ..backends.base import BaseBackend, Generation


@dataclass(frozen=True)
class SimOutcome:
    """What a rollout will produce: success (None: error), length, finish reason, error text."""

    success: bool | None
    tokens: int
    finish_reason: str
    error: str | None = None


def rollout_rng(seed: int, rollout_id: str, sampling_seed: int | None = None) -> random.Random:
    """A generator that depends on nothing but (seed, rollout id, sampling seed)."""
    key = f"{seed}\0{rollout_id}\0{'' if sampling_seed is None else sampling_seed}".encode()
    return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))


def p_success_of(meta: dict[str, Any]) -> float:
    """γ from a prompt's meta; ValueError saying what is wrong when it is missing or invalid."""
    if "p_success" not in meta:
        raise ValueError("prompt has no meta.p_success (the sim backend's success rate)")
    gamma = meta["p_success"]
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma <= 1:
        raise ValueError(f"meta.p_success must be a number in [0, 1], not {gamma!r}")
    return float(gamma)


class SimBackend(BaseBackend):
    """Simulated generation; see the module docstring.

    ``success_median`` and ``failure_median`` are the median lengths as fractions of
    ``sampling.max_tokens``; ``sigma`` is the lognormal's shape. ``sleep`` is injectable.
    """

    name = "sim"

    def __init__(self, seed: int = 0, per_token_s: float = 0.0, step_tokens: int = 16,
                 success_median: float = 0.2, failure_median: float = 0.45, sigma: float = 0.5,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep, **_: Any) -> None:
        super().__init__()
        if per_token_s < 0 or step_tokens < 1 or sigma < 0:
            raise ValueError("per_token_s >= 0, step_tokens >= 1 and sigma >= 0 are required")
        if not (0 < success_median and 0 < failure_median):
            raise ValueError("the median lengths must be positive fractions of max_tokens")
        self.seed, self.per_token_s, self.step_tokens = int(seed), float(per_token_s), step_tokens
        self.success_median, self.failure_median, self.sigma = success_median, failure_median, sigma
        self._sleep = sleep

    def outcome(self, rollout: Rollout) -> SimOutcome:
        """The outcome this rollout will have (pure: same rollout, same outcome)."""
        try:
            gamma = p_success_of(rollout.meta)
        except ValueError as exc:
            return SimOutcome(None, 0, "error", str(exc))
        rng = rollout_rng(self.seed, rollout.rollout_id, rollout.sampling.seed)
        success = rng.random() < gamma
        max_tokens = max(1, rollout.sampling.max_tokens)
        median = (self.success_median if success else self.failure_median) * max_tokens
        length = max(1, round(rng.lognormvariate(math.log(median), self.sigma)))
        if length >= max_tokens:
            return SimOutcome(success, max_tokens, "length")
        return SimOutcome(success, length, "stop")

    async def generate(self, rollout: Rollout, policy_version: int) -> Generation:
        planned = self.outcome(rollout)
        if planned.success is None:
            return Generation(f"<sim error={planned.error}>", 0, "error")
        with self.track(rollout.rollout_id) as aborted:
            produced = await self._produce(planned.tokens, aborted)
        if produced < planned.tokens:
            return Generation("<sim aborted>", produced, "abort")
        return Generation(f"<sim reward={int(planned.success)}>", produced, planned.finish_reason)

    async def _produce(self, tokens: int, aborted: asyncio.Event) -> int:
        """Tokens produced before the end or an abort, paced at per_token_s."""
        if self.per_token_s <= 0:
            return tokens
        produced = 0
        while produced < tokens and not aborted.is_set():
            step = min(self.step_tokens, tokens - produced)
            if not await self._pause(step * self.per_token_s, aborted):
                break
            produced += step
        return produced

    async def _pause(self, seconds: float, aborted: asyncio.Event) -> bool:
        """Sleep ``seconds`` unless aborted first; True when the whole pause elapsed."""
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        waiter = asyncio.ensure_future(aborted.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()
        return not aborted.is_set()

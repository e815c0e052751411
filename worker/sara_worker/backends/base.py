"""The interface every worker backend implements, and a base class with abort bookkeeping.

A backend turns one leased rollout into one :class:`Generation`. The worker loop drives every
backend the same way:

- ``await generate(rollout, policy_version)`` for each rollout, many at once (one asyncio task per
  rollout, up to the worker's capacity). ``rollout`` is a :class:`sara_client.models.Rollout`
  (``prompt``, ``sampling.{temperature, top_p, max_tokens, seed}``, ``meta``, ...);
  ``policy_version`` is the version of the weights loaded when generation starts, which the loop
  tags the result with.
- ``await abort(rollout_id)`` while that rollout is being generated: the in-flight ``generate``
  must return soon after with ``finish_reason="abort"`` and the tokens it had so far. Aborting an
  id that is not in flight (finished, never started) is a no-op.
- ``await load_policy(version, checkpoint)`` when the scheduler's policy version moves. The loop
  calls it only while no ``generate`` is running, and starts no new one until it returns, so a
  backend never sees a generation span two versions. Raising makes the loop retry a few times
  and then stop with an error.
- ``await close()`` once, at the end, to free the engine.

A ``generate`` that raises is reported as ``finish_reason="error"`` with reward 0; it does not
stop the worker. Backends are constructed with keyword options only (``create_backend(name,
**options)``); ``model`` and ``base_url`` are the conventional names for what they say.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

from sara_client.models import Rollout

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass
class Generation:
    """What a backend produced for one rollout."""

    completion: str
    completion_tokens: int
    finish_reason: str = "stop"
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # what the engine says of the prompt, where it says it (vllm): its length in tokens and how
    # many of them came from the prefix cache
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None


@runtime_checkable
class Backend(Protocol):
    """What the worker loop needs from a generation engine (see the module docstring)."""

    name: str

    async def generate(self, rollout: Rollout, policy_version: int) -> Generation: ...

    async def abort(self, rollout_id: str) -> None: ...

    async def load_policy(self, version: int, checkpoint: str | None) -> None: ...

    async def close(self) -> None: ...


class BaseBackend:
    """Optional base: tracks in-flight rollouts and their abort requests.

    A subclass wraps its generation in ``with self.track(rollout_id) as aborted:`` and checks
    ``aborted.is_set()`` (or awaits ``aborted.wait()``) to stop early; :meth:`abort` sets the event.
    ``load_policy`` records the version; ``close`` does nothing.
    """

    name = "base"

    def __init__(self) -> None:
        self._inflight: dict[str, asyncio.Event] = {}
        self.policy_version: int | None = None
        self.checkpoint: str | None = None

    def track(self, rollout_id: str) -> _Tracked:
        """Context manager registering ``rollout_id`` as in flight; yields its abort event."""
        return _Tracked(self._inflight, rollout_id)

    def inflight_ids(self) -> set[str]:
        """Rollout ids being generated right now."""
        return set(self._inflight)

    async def abort(self, rollout_id: str) -> None:
        event = self._inflight.get(rollout_id)
        if event is not None:
            event.set()

    async def load_policy(self, version: int, checkpoint: str | None) -> None:
        self.policy_version, self.checkpoint = version, checkpoint

    async def close(self) -> None:
        return None


class _Tracked:
    def __init__(self, inflight: dict[str, asyncio.Event], rollout_id: str) -> None:
        self._inflight, self._id = inflight, rollout_id
        self.event = asyncio.Event()

    def __enter__(self) -> asyncio.Event:
        self._inflight[self._id] = self.event
        return self.event

    def __exit__(self, *exc_info: object) -> None:
        if self._inflight.get(self._id) is self.event:
            del self._inflight[self._id]


class ObservableProgress:
    """Mixin for backends that stream tokens: tests and benchmarks wait on generation progress
    (``wait_tokens``, ``wait_until``) instead of sleeping. The backend calls :meth:`_notify`
    whenever a rollout makes progress or finishes, and implements :meth:`tokens_so_far`."""

    _changed: asyncio.Event | None = None

    def _notify(self) -> None:
        # wake every waiter at once, then arm a fresh event for the next change
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()

    def tokens_so_far(self, rollout_id: str) -> int | None:
        """Tokens generated so far by an in-flight rollout; None when it is not in flight."""
        raise NotImplementedError

    async def wait_tokens(self, rollout_ids: list[str], tokens: int, timeout: float) -> bool:
        """Wait until every rollout in ``rollout_ids`` is in flight with at least ``tokens``."""

        def ready() -> bool:
            counts = [self.tokens_so_far(r) for r in rollout_ids]
            return all(c is not None and c >= tokens for c in counts)

        return await self.wait_until(ready, timeout)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds, re-checked whenever generation makes progress."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            left = deadline - loop.time()
            if left <= 0:
                return False
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return predicate()
        return True

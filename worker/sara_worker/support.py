"""Configuration, counters and small helpers of the worker loop (:mod:`sara_worker.loop`)."""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal

from sara_client import (
    MAX_COMPLETION_CHARS, MAX_TOKENS_PER_ROLLOUT, AuthenticationError, BadRequestError,
    PermissionDeniedError, RetryPolicy, RolloutResult, SaraConnectionError, SaraError,
)

from .backends.base import Generation

# A logprob that JSON cannot carry (-inf, nan) is sent as this instead.
FLOOR_LOGPROB = -1e4


def default_worker_id() -> str:
    """``hostname-pid``, reduced to the characters the scheduler accepts in ids."""
    raw = f"{socket.gethostname() or 'worker'}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_.:\-]", "-", raw)[-128:]


@dataclass
class WorkerConfig:
    """How one worker behaves. Times are seconds.

    - ``capacity``: most rollouts held at once (queued or generating); leases ask for the rest.
      ``sara worker`` fits it to a vllm engine (:func:`sara_worker.process.fitted_capacity`).
    - ``engine_slots``: requests the engine runs at once (vLLM's ``max_num_seqs``, set where
      the capacity is fitted; None: ``capacity``): what each lease's engine occupancy is a share
      of (:mod:`sara_worker.occupancy`).
    - ``lease_min_size``: while rollouts are still held, lease again only once this many slots
      are free (default a quarter of ``capacity``): a lease costs a round trip to the scheduler
      whatever its size, and the rollouts still held keep the engine busy meanwhile.
    - ``lease_wait_s``: how long a lease long-polls on the scheduler when nothing is ready;
      ``idle_poll_s``: pause after an empty answer before asking again.
    - ``report_batch`` / ``flush_interval_s``: results are sent when this many are waiting, when
      the oldest has waited this long, or at once when nothing else is being generated.
    - ``heartbeat_interval_s``: default ``lease_ttl_s / 3`` (set ``lease_ttl_s`` to the
      scheduler's ``SARA_LEASE_TTL_S``).
    - ``backoff_*``: bounded exponential backoff while the scheduler is unreachable;
      ``give_up_after_s``: once it has been unreachable this long, the worker fails (None or 0:
      it retries for ever).
    - ``idle_notice_s``: once leases have come back empty this long, the worker asks the
      scheduler why (GET /run) and logs it, again every ``log_interval_s`` while idle.
    - ``checkpoint_root``: load policy checkpoints only under this directory; one published
      elsewhere is refused and the weights loaded stay (None: any).
    - ``max_rollouts``: lease no more than this many in total, then finish and return.
    - ``on_stop``: what :meth:`WorkerLoop.stop` does with rollouts being generated: ``finish``
      them (up to ``drain_timeout_s``), or ``abort`` them. Aborted-by-us rollouts are not
      reported (a partial completion is not a result): their leases expire and the scheduler
      issues them again.
    """

    worker_id: str = field(default_factory=default_worker_id)
    backend_name: str | None = None
    capacity: int = 64
    lease_min_size: int | None = None  # None: capacity // 4
    lease_wait_s: float = 5.0
    idle_poll_s: float = 0.05
    report_batch: int = 16
    flush_interval_s: float = 0.1
    lease_ttl_s: float = 60.0
    heartbeat_interval_s: float | None = None
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    log_interval_s: float = 30.0
    max_rollouts: int | None = None
    on_stop: Literal["finish", "abort"] = "finish"
    drain_timeout_s: float = 60.0
    initial_policy_version: int = 0
    policy_load_attempts: int = 3
    give_up_after_s: float | None = 120.0
    idle_notice_s: float = 10.0
    checkpoint_root: str | None = None
    engine_slots: int | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.report_batch < 1:
            raise ValueError("capacity and report_batch must be at least 1")
        if self.lease_min_size is not None and self.lease_min_size < 1:
            raise ValueError("lease_min_size must be at least 1")
        if self.on_stop not in ("finish", "abort"):
            raise ValueError("on_stop is 'finish' or 'abort'")
        if self.max_rollouts is not None and self.max_rollouts < 0:
            raise ValueError("max_rollouts must be >= 0")

    @property
    def heartbeat_every_s(self) -> float:
        return self.heartbeat_interval_s or self.lease_ttl_s / 3

    @property
    def lease_min(self) -> int:
        """Free slots a lease waits for while rollouts are held: ``lease_min_size``, or a
        quarter of ``capacity``."""
        if self.lease_min_size is not None:
            return self.lease_min_size
        return max(1, self.capacity // 4)


@dataclass
class WorkerCounters:
    """What a worker has done; logged periodically and returned by ``run``."""

    leases: int = 0
    leased: int = 0
    generated: int = 0
    tokens: int = 0
    aborted: int = 0
    cancelled: int = 0
    errors: int = 0
    reported: int = 0
    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    released: int = 0
    dropped: int = 0
    heartbeats: int = 0
    policy_loads: int = 0
    transient_errors: int = 0
    stale_refusals: int = 0  # leases refused with 409 stale_weights (then reloaded)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


class Backoff:
    """The SDK's backoff (:class:`sara_client.RetryPolicy`: initial, 2x, 4x, ... up to
    ``maximum``, jittered down by at most half) with the failure count of one retry loop."""

    def __init__(self, initial: float, maximum: float, rng: random.Random | None = None) -> None:
        self._policy = RetryPolicy(base_delay_s=initial, max_delay_s=maximum, jitter=0.5)
        self._rng = rng or random.Random()
        self._failures = 0

    def next(self) -> float:
        self._failures += 1
        return self._policy.delay(self._failures, self._rng)

    def reset(self) -> None:
        self._failures = 0


class Reachability:
    """How long the scheduler has been unreachable (connection errors in a row), and the
    deadline after which the worker gives up (`give_up_after_s`; None or 0: never)."""

    def __init__(self, url: str, give_up_after_s: float | None,
                 clock: Callable[[], float]) -> None:
        self.url, self.limit, self.clock = url, give_up_after_s or None, clock
        self.since: float | None = None

    def reached(self) -> None:
        self.since = None

    def left_s(self, exc: SaraError) -> float | None:
        """Note a failed call; the seconds left before giving up, 0 once they have run out
        (None: no limit, or not a connection error)."""
        if not isinstance(exc, SaraConnectionError) or self.limit is None:
            return None
        now = self.clock()
        self.since = now if self.since is None else self.since
        return max(0.0, self.since + self.limit - now)

    def giving_up(self, exc: SaraError) -> str:
        """The line a worker fails with once `left_s` has run out."""
        gone = self.clock() - (self.since if self.since is not None else self.clock())
        return (f"cannot reach the scheduler at {self.url} for {gone:.0f} s ({exc.message}); "
                "giving up (--give-up-after)")


def checkpoint_refusal(checkpoint: str | None, root: str | None) -> str | None:
    """Why a policy checkpoint may not be loaded under `checkpoint_root` (None: it may): it
    must resolve, symbolic links followed, to a path inside the root."""
    if root is None or checkpoint is None:
        return None
    resolved, under = Path(checkpoint).resolve(), Path(root).resolve()
    if resolved == under or under in resolved.parents:
        return None
    return f"checkpoint {checkpoint} is outside the checkpoint root {under}"


def is_fatal(exc: SaraError) -> bool:
    """Errors that retrying cannot fix: bad credentials or a request the scheduler rejects."""
    return isinstance(exc, (AuthenticationError, PermissionDeniedError, BadRequestError))


def _finite(values: list[float] | None) -> list[float] | None:
    if values is None:
        return None
    out = [float(v) if math.isfinite(v) else FLOOR_LOGPROB for v in values]
    return out[:MAX_TOKENS_PER_ROLLOUT]


def make_result(rollout_id: str, gen: Generation, reward: float, policy_version: int,
                policy_version_end: int | None = None) -> RolloutResult:
    """A result the scheduler will accept: sizes clamped to its limits, numbers finite.
    `policy_version`: the version generation started at; `policy_version_end`: where it ended."""
    token_ids = None if gen.token_ids is None else list(gen.token_ids)[:MAX_TOKENS_PER_ROLLOUT]
    return RolloutResult(
        rollout_id=rollout_id,
        reward=min(max(reward, -1e6), 1e6) if math.isfinite(reward) else 0.0,
        completion=(gen.completion or "")[:MAX_COMPLETION_CHARS],
        completion_tokens=min(max(int(gen.completion_tokens), 0), MAX_TOKENS_PER_ROLLOUT),
        finish_reason=(gen.finish_reason or "stop")[:32],
        policy_version=max(int(policy_version), 0),
        policy_version_end=None if policy_version_end is None else max(int(policy_version_end), 0),
        token_ids=token_ids,
        logprobs=_finite(gen.logprobs),
    )


class Pulse:
    """Injected time plus a broadcast "something changed", which tasks wait on instead of polling.

    ``notify()`` wakes every ``wait()``; ``stopped`` is set once, by a stop request, and cuts
    ``pause()`` short; ``closed`` tells periodic tasks to end (a cancellation alone is not enough:
    some libraries swallow one that lands mid-call).
    """

    def __init__(self, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[Any]]) -> None:
        self.clock, self.sleep = clock, sleep
        self._changed = asyncio.Event()
        self.stopped = asyncio.Event()
        self.closed = False

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def race(self, waiter: Awaitable[Any], timeout: float | None) -> None:
        """Await ``waiter`` for at most ``timeout`` s (None: no limit); the loser is cancelled."""
        first = asyncio.ensure_future(waiter)
        if timeout is None:
            await first
            return
        sleeper = asyncio.ensure_future(self.sleep(max(timeout, 0.0)))
        try:
            await asyncio.wait({first, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
            sleeper.cancel()

    async def wait(self, timeout: float | None = None) -> None:
        """Until the next ``notify()`` (or ``timeout``)."""
        await self.race(self._changed.wait(), timeout)

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, cut short by a stop request."""
        await self.race(self.stopped.wait(), seconds)

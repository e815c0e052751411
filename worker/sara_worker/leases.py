"""The leases a worker holds unreported rollouts of, kept alive by heartbeats."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from sara_client import AsyncSaraClient, ConflictError, NotFoundError, SaraError

from .reporter import WorkerError
from .support import Pulse, WorkerConfig, WorkerCounters, is_fatal

log = logging.getLogger("sara.worker")


class Leases:
    """Which lease each unreported rollout belongs to; heartbeats every lease that has one.

    A heartbeat extends the lease and answers the worker's cancel list (``on_cancel``). A lease
    the scheduler answers 404 (or 409) for holds none of its rollouts any more: each was answered
    elsewhere, or expired and went to another worker. They are handed to ``on_lost``, which gives
    them up without a report (a result would only be a duplicate, or a stale copy racing the
    worker that holds the slot now).
    """

    def __init__(self, client: AsyncSaraClient, config: WorkerConfig, counters: WorkerCounters,
                 pulse: Pulse, on_cancel: Callable[[list[str]], Awaitable[None]],
                 on_lost: Callable[[set[str]], Awaitable[None]]) -> None:
        self.client, self.config, self.counters, self.pulse = client, config, counters, pulse
        self._on_cancel, self._on_lost = on_cancel, on_lost
        self._lease_of: dict[str, str] = {}
        self.members: dict[str, set[str]] = {}

    def track(self, lease_id: str, rollout_id: str) -> None:
        """``rollout_id`` now belongs to ``lease_id`` (a re-issued rollout moves to its new one)."""
        self.untrack(rollout_id)
        self._lease_of[rollout_id] = lease_id
        self.members.setdefault(lease_id, set()).add(rollout_id)

    def untrack(self, rollout_id: str) -> None:
        """``rollout_id`` is reported (or given up): its lease needs no heartbeat for it."""
        lease_id = self._lease_of.pop(rollout_id, None)
        members = self.members.get(lease_id or "")
        if members is not None:
            members.discard(rollout_id)
            if not members:
                del self.members[lease_id or ""]

    async def run(self) -> None:
        """Heartbeat every live lease every ``config.heartbeat_every_s``, until closed."""
        while not self.pulse.closed:
            await self.pulse.sleep(self.config.heartbeat_every_s)
            for lease_id in list(self.members):
                if not self.pulse.closed:
                    await self.heartbeat(lease_id)

    async def heartbeat(self, lease_id: str) -> None:
        try:
            answer = await self.client.heartbeat(lease_id, self.config.worker_id)
        except (NotFoundError, ConflictError) as exc:
            lost = self.members.pop(lease_id, set())
            log.info("lease %s lost (%s): giving up %d rollouts", lease_id, exc, len(lost),
                     extra={"lease_id": lease_id})
            for rollout_id in lost:
                self._lease_of.pop(rollout_id, None)
            await self._on_lost(lost)
            return
        except SaraError as exc:
            if is_fatal(exc):
                raise WorkerError(f"heartbeat rejected by the scheduler: {exc}") from exc
            self.counters.transient_errors += 1
            return
        self.counters.heartbeats += 1
        await self._on_cancel(answer.cancel)
        self.pulse.notify()

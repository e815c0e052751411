"""The worker's outbox: results wait here and go to the scheduler in small batches."""

from __future__ import annotations

import logging
import uuid
from typing import Awaitable, Callable

from sara_client import (
    AsyncSaraClient, AuthenticationError, BadRequestError, PayloadTooLargeError,
    PermissionDeniedError, RolloutResult, SaraError,
)

from .support import Backoff, Pulse, WorkerConfig, WorkerCounters

log = logging.getLogger("sara.worker")


class WorkerError(RuntimeError):
    """The worker cannot go on: bad credentials, a rejected request, a policy it cannot load."""


class Reporter:
    """Sends the outbox: ``report_batch`` results at a time, when that many wait, when the oldest
    has waited ``flush_interval_s``, or at once when ``idle()`` (nothing else is generating).

    A failed call keeps the results and backs off (bounded), then sends the same batch again
    with the same report id (its answer, cancels included, may have been lost after the scheduler
    applied it: the scheduler then answers it again); a batch the scheduler refuses (422,
    413) is sent one result at a time and what is still refused is dropped. Each answer's cancel
    list goes to ``on_cancel``; ``on_reported(rollout_id)`` follows every result sent.
    """

    def __init__(self, client: AsyncSaraClient, config: WorkerConfig, counters: WorkerCounters,
                 pulse: Pulse, on_cancel: Callable[[list[str]], Awaitable[None]],
                 on_reported: Callable[[str], None]) -> None:
        self.client, self.config, self.counters, self.pulse = client, config, counters, pulse
        self._on_cancel, self._on_reported = on_cancel, on_reported
        self.outbox: dict[str, tuple[float, RolloutResult]] = {}
        # the batch whose report failed, and its report id: sent again as it was, so that if the
        # failed call was applied after all the scheduler answers it again, cancels included
        self._unanswered: tuple[list[str], str] | None = None

    def add(self, result: RolloutResult) -> None:
        self.outbox[result.rollout_id] = (self.pulse.clock(), result)
        self.pulse.notify()

    def _oldest(self) -> float | None:
        return next(iter(self.outbox.values()))[0] if self.outbox else None

    def due(self, idle: bool) -> bool:
        oldest = self._oldest()
        if oldest is None:
            return False
        return (len(self.outbox) >= self.config.report_batch or idle
                or self.pulse.clock() - oldest >= self.config.flush_interval_s)

    async def run(self, finished: Callable[[], bool], idle: Callable[[], bool]) -> None:
        """Flush until ``finished()`` (nothing more will come and the outbox is empty)."""
        backoff = Backoff(self.config.backoff_initial_s, self.config.backoff_max_s)
        while not finished():
            if not self.due(idle()):
                oldest = self._oldest()
                flush_at = None if oldest is None else oldest + self.config.flush_interval_s
                await self.pulse.wait(None if flush_at is None else flush_at - self.pulse.clock())
                continue
            if await self._send(*self._next_batch(), backoff):
                backoff.reset()

    def _next_batch(self) -> tuple[list[RolloutResult], str]:
        """The results to send and their report id: a failed report again, unchanged, while all
        of it is still waiting; else the oldest ``report_batch`` under a new id."""
        if self._unanswered is not None:
            ids, report_id = self._unanswered
            if all(i in self.outbox for i in ids):
                return [self.outbox[i][1] for i in ids], report_id
            self._unanswered = None
        batch = [r for _, r in list(self.outbox.values())[:self.config.report_batch]]
        return batch, "r" + uuid.uuid4().hex

    async def _send(self, batch: list[RolloutResult], report_id: str | None,
                    backoff: Backoff) -> bool:
        try:
            answer = await self.client.report(self.config.worker_id, batch, report_id=report_id)
        except (AuthenticationError, PermissionDeniedError) as exc:
            raise WorkerError(f"results rejected by the scheduler: {exc}") from exc
        except (BadRequestError, PayloadTooLargeError) as exc:
            await self._refused(batch, exc, backoff)
            return True
        except SaraError as exc:
            if report_id is not None:
                self._unanswered = ([r.rollout_id for r in batch], report_id)
            self.counters.transient_errors += 1
            delay = backoff.next()
            log.warning("report failed (%s); %d results kept, retrying in %.2fs", exc,
                        len(self.outbox), delay)
            self.pulse.notify()
            await self.pulse.sleep(delay)
            return False
        self._unanswered = None
        self._done(batch, answer.accepted, answer.duplicates, answer.late)
        self.counters.dropped += len(answer.unknown_rollout_ids)
        await self._on_cancel(answer.cancel)
        return True

    async def _refused(self, batch: list[RolloutResult], exc: SaraError, backoff: Backoff) -> None:
        if len(batch) == 1:
            log.error("result %s refused, dropped: %s", batch[0].rollout_id, exc)
            self.counters.dropped += 1
            self._done(batch)
            return
        self._unanswered = None
        for result in batch:
            await self._send([result], None, backoff)

    def _done(self, batch: list[RolloutResult], accepted: int = 0, duplicates: int = 0,
              late: int = 0) -> None:
        for result in batch:
            self.outbox.pop(result.rollout_id, None)
            self._on_reported(result.rollout_id)
        self.counters.reported += len(batch)
        self.counters.accepted += accepted
        self.counters.duplicates += duplicates
        self.counters.late += late
        self.pulse.notify()

"""Asynchronous client for the SARA scheduler."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx

from ._base import (
    DEFAULT_BASE_URL,
    DEFAULT_TIMEOUT_S,
    BaseSaraClient,
    Call,
    ReadyResponse,
    ReportResponse,
    RetryPolicy,
    error_from_transport,
)
from ._runctl import AsyncRunControl
from .errors import NotFoundError, SaraError
from .models import (AckResponse, AddPromptsResponse, Batch, GroupOut, HealthResponse,
                     HeartbeatResponse, EngineLoad, LeaseResponse, PolicyInfo, PromptIn, PromptOut,
                     RolloutResult, StatsResponse, WorkerGone)

T = TypeVar("T")
log = logging.getLogger("sara_client")


class AsyncSaraClient(AsyncRunControl, BaseSaraClient):
    """Asynchronous SARA client over ``httpx.AsyncClient``; same methods as :class:`SaraClient`.

    >>> async with AsyncSaraClient("http://scheduler:8000", token="...") as sara:
    ...     lease = await sara.lease("worker-0", wait_s=10)

    ``sleep`` may be a coroutine function (default ``asyncio.sleep``) or a plain function.
    ``transport`` is any async httpx transport (``httpx.MockTransport``, ``httpx.ASGITransport``).
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
        max_attempts: int | None = None,
        max_delay_s: float | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(base_url, token=token, timeout=timeout, retry=retry,
                         max_attempts=max_attempts, max_delay_s=max_delay_s, rng=rng,
                         clock=clock, headers=headers)
        self._sleep_fn = sleep
        self._http = httpx.AsyncClient(**self._httpx_options(transport))

    # --- plumbing --------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the underlying HTTP connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSaraClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _sleep(self, seconds: float) -> None:
        outcome = self._sleep_fn(seconds)
        if inspect.isawaitable(outcome):
            await outcome

    async def _send_once(self, call: Call[T]) -> T:
        try:
            response = await self._http.request(
                call.method, call.path, **call.body(),
                timeout=call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError as exc:
            raise error_from_transport(exc) from exc
        return call.parse(response)

    async def _send(self, call: Call[T]) -> T:
        attempt = 1
        while True:
            try:
                return await self._send_once(call)
            except SaraError as exc:
                delay = self._retry_delay(call, exc, attempt)
                if delay is None:
                    raise
                log.debug("%s %s failed (%s); retry %d in %.3fs",
                          call.method, call.path, exc, attempt, delay)
            await self._sleep(delay)
            attempt += 1

    # --- admin -----------------------------------------------------------------------------------

    async def add_prompts(
            self, prompts: Sequence[PromptIn | dict[str, Any]]) -> AddPromptsResponse:
        """Register prompts (idempotent on ``id``); returns their ids and how many were new."""
        return await self._send(self._add_prompts_call(prompts))

    async def get_prompt(self, prompt_id: str) -> PromptOut:
        """One prompt with its posterior and history."""
        return await self._send(self._get_prompt_call(prompt_id))

    # --- workers ---------------------------------------------------------------------------------

    async def lease(self, worker_id: str, max_rollouts: int = 64, wait_s: float = 0.0,
                    backend: str | None = None, policy_version: int | None = None,
                    engine: EngineLoad | None = None) -> LeaseResponse:
        """Lease up to ``max_rollouts`` rollouts, long-polling up to ``wait_s`` when none are ready.

        ``lease_id`` is None in the answer when nothing was leased. ``policy_version``: the
        version the caller's weights hold; too old (current minus max_staleness) raises
        :class:`StaleWeightsError`, which names the version and checkpoint to load.
        ``engine``: how full the caller's engine has been (/stats' engine occupancy).
        """
        return await self._send(self._lease_call(worker_id, max_rollouts, wait_s, backend,
                                                    policy_version, engine))

    async def deregister(self, worker_id: str) -> WorkerGone:
        """A worker that stops leaves the run: it no longer shows in /stats."""
        return await self._send(self._deregister_call(worker_id))

    async def heartbeat(self, lease_id: str, worker_id: str) -> HeartbeatResponse:
        """Extend a lease; the answer lists rollouts this worker should abort."""
        return await self._send(self._heartbeat_call(lease_id, worker_id))

    async def report(self, worker_id: str,
                     results: Sequence[RolloutResult | dict[str, Any]],
                     report_id: str | None = None) -> ReportResponse:
        """Send rollout results; returns the group decisions and rollouts to cancel.

        If the service answers 404 ``unknown_rollout`` naming ids in
        ``detail.unknown_rollout_ids``, those results are dropped and the rest resent once; the
        answer then is the resend's, with the dropped ids in ``unknown_rollout_ids`` (and
        ``accepted == 0`` when nothing remained to resend). Any other 404 is raised.

        Every try of one report carries the same ``report_id`` (a new one unless given): when a
        try was applied but its answer lost, the retry gets that answer, cancels included.
        """
        request = self._results_request(worker_id, results, report_id)
        try:
            return await self._send(self._report_call(request))
        except NotFoundError as exc:
            follow_up = self._report_follow_up(request, exc)
            if follow_up is None:
                raise
        if isinstance(follow_up, ReportResponse):
            return follow_up
        return await self._send(follow_up)

    # --- trainer ---------------------------------------------------------------------------------

    async def next_batch(self, size: int | None = None, wait_s: float = 0.0) -> Batch | None:
        """The next effective batch, long-polling up to ``wait_s``; None if none is ready."""
        return await self._send(self._next_batch_call(size, wait_s))

    async def wait_for_batch(self, size: int | None = None, timeout_s: float | None = None,
                             poll_s: float = 30.0) -> Batch | None:
        """Long-poll ``next_batch`` (``poll_s`` per call) until a batch comes.

        Returns None once ``timeout_s`` has passed without one (``None``: wait forever).
        """
        deadline = self._poll_deadline(timeout_s, poll_s)
        while True:
            wait = self._poll_wait(deadline, poll_s)
            started = self._clock()
            batch = await self.next_batch(size, wait_s=wait)
            if batch is not None:
                return batch
            pause = self._poll_pause(deadline, wait, started)
            if pause is None:
                return None
            if pause > 0:
                await self._sleep(pause)

    async def ack(self, batch_id: str) -> AckResponse:
        """Confirm delivery of a batch (an unacked batch is redelivered after its timeout)."""
        return await self._send(self._ack_call(batch_id))

    async def get_policy(self) -> PolicyInfo:
        """The current policy version and checkpoint."""
        return await self._send(self._get_policy_call())

    async def publish_policy(self, version: int, checkpoint: str | None = None) -> PolicyInfo:
        """Publish a new policy version (must exceed the current one)."""
        return await self._send(self._publish_policy_call(version, checkpoint))

    # --- operator --------------------------------------------------------------------------------

    async def get_group(self, group_id: str) -> GroupOut:
        """One group's state, counts, thresholds and rollouts."""
        return await self._send(self._get_group_call(group_id))

    async def stats(self) -> StatsResponse:
        """Counters, derived efficiency, queues, workers and recent batches."""
        return await self._send(self._stats_call())

    async def metrics(self) -> str:
        """Prometheus text exposition."""
        return await self._send(self._metrics_call())

    async def health(self) -> HealthResponse:
        """Liveness (/healthz); not retried."""
        return await self._send(self._health_call())

    async def ready(self) -> ReadyResponse:
        """Readiness (/readyz), Redis included; falsy when not ready. A 503 is an answer here."""
        return await self._send(self._ready_call())

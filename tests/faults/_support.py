"""Shared pieces of the fault tests: processes to kill, clients that fail over, a batch ledger and
the accounting checks run after every fault.

The scheduler processes (`ServeProcess`), the scripted Bernoulli worker and `load_synthetic` come
from the e2e harness (`tests/e2e/_harness.py`); what is here is what a fault adds to a run:

- `FailoverClient`: an SDK client per replica; a call that fails with a connection error (or a 503
  the SDK's own retries did not outlast) is sent again to the next replica. The SDK client has one
  base_url, so this is how a worker or a trainer survives the death of "its" replica.
- `CountingTransport`: an httpx transport that counts the HTTP status of every answer, to see the
  503s the SDK retries behind the caller's back.
- `Deliveries`: every batch the consumers received, by id and by group id, to find a group or a
  batch delivered twice.
- `worker_process`: `sara worker --backend sim` as a subprocess (its own session, dies with us).
- `check_accounting`, `check_drained`, `check_batches`, `drain`: the invariants every fault test
  ends with: issued = completed + cancelled + in flight by the /stats counters and slot by slot
  in the Redis slots hash, no batch and no group received twice, every group mixed with k slots.

Synchronisation is by polling a condition with a deadline (`poll_until`), never by sleeping a
fixed time.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from collections.abc import Callable
from typing import Any

import httpx
import redis
from sara_client import (
    AsyncSaraClient, Batch, RetryPolicy, SaraConnectionError, ServiceUnavailableError,
    StatsResponse,
)
from sara_service.store.keys import Keys, split_rollout_id
from sara_service.store.redis_format import decode_slot

from tests.e2e._harness import (
    SUCCESS_THRESHOLD, BernoulliWorker, ServeProcess, _die_with_parent, slot_counts,
)

SLOT_STATES = {"pending", "leased", "done", "cancelled"}


# --- waiting -------------------------------------------------------------------------------------


async def poll_until(predicate: Callable[[], Any], timeout_s: float, what: str,
                     interval_s: float = 0.05) -> Any:
    """Re-check `predicate` (plain or async) every `interval_s` until it is truthy; returns its
    value. AssertionError naming `what` once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


# --- clients -------------------------------------------------------------------------------------


class CountingTransport(httpx.AsyncBaseTransport):
    """Delegates to the default transport and counts the status code of every answer."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.status: collections.Counter[int] = collections.Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        self.status[response.status_code] += 1
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def sdk_client(url: str, *, transport: httpx.AsyncBaseTransport | None = None,
               max_attempts: int = 3, max_delay_s: float = 0.5) -> AsyncSaraClient:
    """An async SDK client whose own retries are short (faults are outlasted by the caller)."""
    return AsyncSaraClient(url, transport=transport, timeout=20.0,
                           retry=RetryPolicy(max_attempts=max_attempts, base_delay_s=0.05,
                                             max_delay_s=max_delay_s,
                                             max_retry_after_s=max_delay_s))


class FailoverClient:
    """The SDK methods a worker and a trainer use, over one client per replica.

    Calls go to the active replica; a connection error (refused, reset mid-request) or a 503 that
    outlasted the SDK's retries makes the next replica the active one and the call is sent again
    there. Resending is safe for every call used here: results are idempotent per rollout, an ack
    twice is harmless, and a lease or a batch whose answer was lost is re-issued by the scheduler
    (lease TTL, batch ack timeout).
    """

    def __init__(self, clients: list[AsyncSaraClient], *, max_switches: int = 20) -> None:
        self.clients = clients
        self.active = 0
        self.max_switches = max_switches
        self.switches: list[tuple[str, str, str]] = []  # (call, from url, error)
        self.calls: collections.Counter[str] = collections.Counter()  # base url -> calls answered

    @property
    def base_url(self) -> str:
        return self.clients[self.active].base_url

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        for _ in range(self.max_switches + 1):
            client = self.clients[self.active]
            try:
                answer = await getattr(client, name)(*args, **kwargs)
            except (SaraConnectionError, ServiceUnavailableError) as exc:
                self.switches.append((name, client.base_url, repr(exc)))
                self.active = (self.active + 1) % len(self.clients)
                continue
            self.calls[client.base_url] += 1
            return answer
        raise AssertionError(f"{name}: no replica answered after {self.max_switches} switches: "
                             f"{self.switches[-3:]}")

    async def lease(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("lease", *args, **kwargs)

    async def report(self, *args: Any, **kwargs: Any) -> Any:
        # one report id for every replica tried: a report applied by one whose answer was lost
        # is answered again by the next, cancels included
        kwargs.setdefault("report_id", "r" + uuid.uuid4().hex)
        return await self._call("report", *args, **kwargs)

    async def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("heartbeat", *args, **kwargs)

    async def next_batch(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("next_batch", *args, **kwargs)

    async def ack(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call("ack", *args, **kwargs)

    async def stats(self) -> StatsResponse:
        return await self._call("stats")

    async def aclose(self) -> None:
        for c in self.clients:
            await c.aclose()


# --- what the trainer received -------------------------------------------------------------------


@dataclasses.dataclass
class Received:
    batch: Batch
    consumer: str
    via: str
    at: float  # time.time() when it arrived


class Deliveries:
    """Every batch any consumer received (acked or not), in arrival order."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.acked: list[str] = []  # batch ids whose ack call returned

    def add(self, batch: Batch, consumer: str, via: str) -> None:
        self.received.append(Received(batch, consumer, via, time.time()))

    @property
    def batch_ids(self) -> collections.Counter[str]:
        return collections.Counter(r.batch.batch_id for r in self.received)

    @property
    def group_ids(self) -> collections.Counter[str]:
        return collections.Counter(g.group_id for r in self.received for g in r.batch.groups)

    def twice(self) -> tuple[list[str], list[str]]:
        """(batch ids received more than once, group ids received more than once)."""
        return ([b for b, n in self.batch_ids.items() if n > 1],
                [g for g, n in self.group_ids.items() if n > 1])

    def __len__(self) -> int:
        return len(self.received)


async def consume(client: Any, deliveries: Deliveries, name: str, stop: asyncio.Event,
                  n_batches: int, wait_s: float = 0.5) -> None:
    """Take batches and ack each until `n_batches` have been received in all (or `stop`)."""
    while not stop.is_set() and len(deliveries) < n_batches:
        batch = await client.next_batch(wait_s=wait_s)
        if batch is None:
            continue
        deliveries.add(batch, name, client.base_url)
        answer = await client.ack(batch.batch_id)
        assert answer.acked, answer
        deliveries.acked.append(batch.batch_id)


async def settle_batches(client: Any, deliveries: Deliveries, name: str,
                         timeout_s: float = 30.0) -> None:
    """Keep taking (and acking) batches until none is delivered and unacked: a batch whose
    answer was lost in a fault is redelivered once its ack timeout has run out."""

    async def settled() -> bool:
        if (await client.stats()).queues.unacked_batches == 0:
            return True
        batch = await client.next_batch(wait_s=0.5)
        if batch is not None:
            deliveries.add(batch, name, client.base_url)
            assert (await client.ack(batch.batch_id)).acked
            deliveries.acked.append(batch.batch_id)
        return False

    await poll_until(settled, timeout_s, "every delivered batch to be acked", interval_s=0.0)


def batch_content(batch: Batch) -> dict:
    """What a trainer trains on: everything but the delivery flag."""
    return batch.model_dump(mode="json", exclude={"redelivered"})


def check_batches(deliveries: Deliveries, *, k: int, batch_size: int) -> None:
    """No batch and no group received twice; every group mixed with exactly k distinct slots."""
    batches_twice, groups_twice = deliveries.twice()
    assert not batches_twice, f"batches received twice: {batches_twice}"
    assert not groups_twice, f"groups delivered twice: {groups_twice}"
    for r in deliveries.received:
        assert len(r.batch.groups) == batch_size, (r.batch.batch_id, len(r.batch.groups))
        for g in r.batch.groups:
            slots = sorted(split_rollout_id(ro.rollout_id) for ro in g.rollouts)
            assert slots == [(g.group_id, i) for i in range(k)], (g.group_id, slots)
            outcomes = {ro.reward >= SUCCESS_THRESHOLD for ro in g.rollouts}
            assert outcomes == {True, False}, f"{g.group_id} is saturated"


# --- accounting ----------------------------------------------------------------------------------


def check_accounting(stats: StatsResponse, slots: collections.Counter) -> None:
    """issued = completed + cancelled + in flight, by the counters and slot by slot in Redis.

    Every slot is one field of the slots hash, so a slot counted twice shows up as the counters
    and the hash disagreeing."""
    c, d = stats.counters, stats.derived
    assert c.rollouts_issued == c.rollouts_completed + c.rollouts_cancelled + d.rollouts_in_flight
    assert d.rollouts_in_flight >= 0
    assert set(slots) <= SLOT_STATES, slots
    assert sum(slots.values()) == c.rollouts_issued, (slots, c.rollouts_issued)
    assert slots["done"] == c.rollouts_completed, (slots, c.rollouts_completed)
    assert slots["cancelled"] == c.rollouts_cancelled, (slots, c.rollouts_cancelled)
    assert slots["pending"] + slots["leased"] == d.rollouts_in_flight, (slots, d)
    assert sum(w.rollouts_completed for w in stats.workers) == c.rollouts_completed
    assert c.groups_acked <= c.groups_delivered


def check_drained(stats: StatsResponse, slots: collections.Counter) -> None:
    """After `drain`: nothing in flight, every opened group decided, every committed group
    delivered or waiting ready."""
    check_accounting(stats, slots)
    c, q = stats.counters, stats.queues
    assert stats.derived.rollouts_in_flight == 0
    assert (q.pending, q.leased, q.open_groups) == (0, 0, 0), q
    assert c.groups_opened == c.groups_committed + c.groups_abandoned + c.groups_dropped_saturated
    assert c.groups_committed == c.groups_delivered + c.groups_dropped_stale + q.ready_groups


def count_slots(redis_url: str, namespace: str) -> collections.Counter:
    """Every rollout slot of the namespace by kind, straight from the slots hash (the e2e
    harness' `slot_counts`)."""
    return slot_counts(redis_url, namespace)


async def snapshot(client: Any, redis_url: str, namespace: str
                   ) -> tuple[StatsResponse, collections.Counter]:
    stats = await client.stats()
    return stats, count_slots(redis_url, namespace)


async def drain(workers: list[BernoulliWorker], client: Any, timeout_s: float = 30.0
                ) -> StatsResponse:
    """Report what the workers hold and lease what is left until nothing is in flight.

    Slots held under a lease nobody reports any more (a killed worker's, a lease whose answer was
    lost) come back when their lease expires; this polls until they have been re-issued and
    answered."""

    async def settled() -> StatsResponse | None:
        for w in workers:
            await w.flush()
        got = 0
        for w in workers:
            got += await w.lease_once(wait_s=0.0)
            await w.flush()
        if got:
            return None
        stats = await client.stats()
        return stats if stats.derived.rollouts_in_flight == 0 else None

    return await poll_until(settled, timeout_s, "the run to drain", interval_s=0.1)


def held_by(redis_url: str, namespace: str, worker_id: str) -> set[str]:
    """Rollout ids whose slot is leased to `worker_id`, straight from the slots hash."""
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.hgetall(Keys(namespace).slots)
    finally:
        client.close()
    slots = {rid.decode(): decode_slot(st.decode()) for rid, st in raw.items()}
    return {rid for rid, s in slots.items() if s.kind == "leased" and s.worker_id == worker_id}


def slot_states(redis_url: str, namespace: str, rollout_ids: list[str]) -> dict[str, str | None]:
    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.hmget(Keys(namespace).slots, rollout_ids) if rollout_ids else []
    finally:
        client.close()
    return {rid: (v.decode() if v is not None else None) for rid, v in zip(rollout_ids, raw)}


# --- processes -----------------------------------------------------------------------------------


def serve_process(log_dir: Path, redis_url: str, namespace: str, name: str, *, group_size: int,
                  batch_size: int, seed: int, prefetch_batches: int = 2,
                  **settings: Any) -> ServeProcess:
    """A `sara serve` (policy sara) with extra settings given as SARA_* env (lease_ttl_s=2 ->
    SARA_LEASE_TTL_S=2), as a deployment without CLI flags for them would set them."""
    server = ServeProcess(log_dir, redis_url=redis_url, namespace=namespace, policy="sara",
                          group_size=group_size, batch_size=batch_size,
                          prefetch_batches=prefetch_batches, seed=seed, name=name)
    server.env.update({f"SARA_{key.upper()}": str(value) for key, value in settings.items()})
    return server



def worker_process(url: str, worker_id: str, log_path: Path, *, lease_ttl_s: float,
                   per_token_ms: float, capacity: int, seed: int = 0) -> subprocess.Popen:
    """`sara worker --backend sim` as a subprocess, output to `log_path`."""
    cmd = [sys.executable, "-m", "sara_cli", "worker", "--backend", "sim", "--url", url,
           "--worker-id", worker_id, "--capacity", str(capacity), "--lease-ttl", str(lease_ttl_s),
           "--per-token-ms", str(per_token_ms), "--seed", str(seed), "--lease-wait", "1",
           "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
    env["PYTHONUNBUFFERED"] = "1"
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL and reap; the process must have been alive until now."""
    assert proc.poll() is None, f"process {proc.pid} exited before the fault: {proc.returncode}"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL


def end(proc: subprocess.Popen) -> None:
    """Clean-up: SIGKILL a process of ours if it still runs."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return f"--- {path} ---\n{path.read_text(errors='replace')[-chars:]}"
    except OSError:
        return f"({path} unreadable)"


async def finish(tasks: list[asyncio.Task]) -> None:
    """Wait for worker/consumer tasks that were told to stop; re-raise the first failure."""
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r

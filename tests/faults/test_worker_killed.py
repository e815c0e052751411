"""A worker SIGKILLed while it holds leases: its rollouts go to another worker, nothing is lost or
counted twice.

Worker A is a real `sara worker --backend sim` process, slow enough (100 ms per simulated token)
that it sits on its leased rollouts, heartbeating them, when it is killed. Worker B (the scripted
Bernoulli worker of the e2e harness) and a trainer keep running against the same `sara serve`
(lease TTL 2 s). Once A's leases expire its rollouts are issued again, B answers them, and the run
completes with every count consistent.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.e2e._harness import BernoulliWorker, Ledger, RewardScript, load_synthetic

from ._support import (
    Deliveries, check_accounting, check_batches, check_drained, consume, drain, end, finish,
    held_by, poll_until, sdk_client, serve_process, sigkill, slot_states, snapshot, tail,
    worker_process,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

K, BATCH_SIZE, N_PROMPTS, SEED = 4, 4, 200, 11
LEASE_TTL_S = 2.0
N_BATCHES = 8


def _answered(slot_state: str | None) -> bool:
    """Done ('d', or 'd|<worker>' when a re-issued copy was cancelled) or cancelled ('c')."""
    return slot_state is not None and slot_state[0] in "dc"


def _done_by(stats, worker_id: str) -> int:
    return next((w.rollouts_completed for w in stats.workers if w.worker_id == worker_id), 0)


def test_worker_killed_mid_lease_its_rollouts_go_to_another_worker(redis_server, tmp_path):
    namespace = f"fault-worker-{uuid.uuid4().hex[:8]}"
    server = serve_process(tmp_path, redis_server.url, namespace, "serve", group_size=K,
                           batch_size=BATCH_SIZE, seed=SEED, lease_ttl_s=LEASE_TTL_S)
    worker_log = tmp_path / "worker-A.log"
    proc = None
    try:
        server.start()
        load_synthetic(server.url, N_PROMPTS, SEED)
        proc = worker_process(server.url, "wA", worker_log, lease_ttl_s=LEASE_TTL_S,
                              per_token_ms=100, capacity=8, seed=SEED)
        asyncio.run(_scenario(server.url, redis_server.url, namespace, proc))
        assert server.alive
    finally:
        if proc is not None:
            end(proc)
        server.stop()
        print(server.log_tail(), tail(worker_log))  # shown when the test fails


async def _scenario(url: str, redis_url: str, namespace: str, proc) -> None:
    client = sdk_client(url)
    ledger = Ledger()
    worker_b = BernoulliWorker("wB", [client], RewardScript(SEED), ledger, lease_size=8,
                               report_size=4)
    deliveries = Deliveries()
    stop = asyncio.Event()
    try:
        # A leases and starts generating (each rollout takes seconds).
        await poll_until(lambda: len(held_by(redis_url, namespace, "wA")) >= 4, 30,
                         "worker A to hold at least 4 rollouts")
        tasks = [asyncio.ensure_future(worker_b.run(stop)),
                 asyncio.ensure_future(consume(client, deliveries, "trainer", stop, N_BATCHES))]
        await poll_until(lambda: len(deliveries) >= 2 or any(t.done() for t in tasks), 30,
                         "two batches before the kill")

        sigkill(proc)
        # A may have had a /results call in flight: read its count first, then what it held, so a
        # result landing after the kill is one the count difference below accounts for.
        done_by_a_at_kill = _done_by(await client.stats(), "wA")
        held_a = sorted(held_by(redis_url, namespace, "wA"))
        assert len(held_a) >= 1, "worker A held nothing when it was killed"

        # Its leases expire (TTL 2 s), the slots are issued again and B answers them.
        await poll_until(lambda: not held_by(redis_url, namespace, "wA"), 20,
                         "worker A's leases to expire")
        await poll_until(lambda: all(_answered(s) for s in
                                     slot_states(redis_url, namespace, held_a).values())
                         or any(t.done() for t in tasks), 30,
                         "worker A's rollouts to be answered or cancelled")
        await poll_until(lambda: len(deliveries) >= N_BATCHES or any(t.done() for t in tasks),
                         60, f"{N_BATCHES} batches")
        stop.set()
        await finish(tasks)
        await worker_b.collect_cancels()

        # Stopped mid-stream: the counts agree with the slots, B holds exactly what is leased.
        stats, slots = await snapshot(client, redis_url, namespace)
        check_accounting(stats, slots)
        assert slots["leased"] == len(worker_b.held) == stats.queues.leased

        await drain([worker_b], client)
        final, slots = await snapshot(client, redis_url, namespace)
        check_drained(final, slots)
    finally:
        await client.aclose()

    c = final.counters
    print(f"A held {len(held_a)} at the kill, {c.rollouts_reissued} re-issued, "
          f"{sum(1 for r in held_a if ledger.leased[r])} of A's went to B; "
          f"A completed {_done_by(final, 'wA')}, B {ledger.results_accepted}")
    assert len(deliveries) == N_BATCHES
    check_batches(deliveries, k=K, batch_size=BATCH_SIZE)

    # A's rollouts were issued again and went to B; none is still with the dead worker.
    assert c.rollouts_reissued >= 1
    states = slot_states(redis_url, namespace, held_a)
    assert all(_answered(s) for s in states.values()), states
    to_b = [rid for rid in held_a if ledger.leased[rid]]
    assert to_b, f"none of A's rollouts {held_a} was leased to B"
    # a slot of A's that ended done was answered by B, or by a result of A's that was already
    # on its way when A died (then it counts in A's completed rollouts after the kill)
    done_not_by_b = [rid for rid in held_a
                     if states[rid].startswith("d") and rid not in ledger.reported]
    assert len(done_not_by_b) <= _done_by(final, "wA") - done_by_a_at_kill, done_not_by_b

    # Nothing counted twice: one accepted result per done slot, no duplicates, and what the
    # trainer got for a re-issued rollout is B's answer.
    assert c.results_duplicate == 0
    assert ledger.results_accepted + _done_by(final, "wA") == c.rollouts_completed
    assert {w.worker_id for w in final.workers} == {"wA", "wB"}
    delivered = {ro.rollout_id: ro for r in deliveries.received for g in r.batch.groups
                 for ro in g.rollouts}
    for rid in to_b:
        if rid in delivered and rid in ledger.reported:
            assert delivered[rid].reward == ledger.reported[rid], rid
    assert c.groups_delivered == c.groups_acked == N_BATCHES * BATCH_SIZE
    assert c.batches_redelivered == 0

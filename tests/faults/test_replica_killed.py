"""One of two scheduler replicas SIGKILLed under load: the other carries on, nothing is lost.

Two `sara serve` processes share one Redis and one namespace (lease TTL 2 s, batch ack timeout
2 s). Four scripted workers and two trainers are spread over them, each with its own replica and a
`FailoverClient` that switches to the other replica on a connection error. Replica A is SIGKILLed
mid-run, with requests in flight: a lease or a batch whose answer died with A comes back when its
lease or ack timeout runs out, a result sent again to B counts as a duplicate, never twice.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.e2e._harness import BernoulliWorker, Ledger, RewardScript, load_synthetic

from ._support import (
    Deliveries, FailoverClient, check_accounting, check_batches, check_drained, consume, drain,
    finish, poll_until, sdk_client, serve_process, settle_batches, sigkill, snapshot,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

K, BATCH_SIZE, N_PROMPTS, SEED = 4, 4, 200, 12
LEASE_TTL_S = ACK_TIMEOUT_S = 2.0
N_BATCHES = 14
KILL_AFTER = 4  # batches received before replica A is killed


def test_replica_killed_under_load_the_other_carries_on(redis_server, tmp_path):
    namespace = f"fault-replica-{uuid.uuid4().hex[:8]}"
    servers = [serve_process(tmp_path, redis_server.url, namespace, f"replica-{name}",
                             group_size=K, batch_size=BATCH_SIZE, seed=SEED,
                             lease_ttl_s=LEASE_TTL_S, batch_ack_timeout_s=ACK_TIMEOUT_S)
               for name in "AB"]
    try:
        for s in servers:
            s.start()
        load_synthetic(servers[1].url, N_PROMPTS, SEED)
        asyncio.run(_scenario(servers, redis_server.url, namespace))
        assert not servers[0].alive and servers[1].alive
    finally:
        codes = [s.stop() for s in servers]
        print(*(s.log_tail() for s in servers))  # shown when the test fails
    assert codes[1] == 0, codes


async def _scenario(servers, redis_url: str, namespace: str) -> None:
    url_a, url_b = servers[0].url, servers[1].url

    def failover(primary: str, other: str) -> FailoverClient:
        return FailoverClient([sdk_client(primary, max_attempts=2), sdk_client(other)])

    clients = {name: failover(url_a, url_b) if name.endswith("A") else failover(url_b, url_a)
               for name in ("w0A", "w1A", "w2B", "w3B", "trainerA", "trainerB")}
    ledger = Ledger()
    script = RewardScript(SEED)
    workers = [BernoulliWorker(name, [clients[name]], script, ledger, lease_size=8,
                               report_size=4) for name in ("w0A", "w1A", "w2B", "w3B")]
    deliveries = Deliveries()
    stop = asyncio.Event()
    observer = FailoverClient([sdk_client(url_b)])
    try:
        tasks = [asyncio.ensure_future(w.run(stop)) for w in workers]
        tasks += [asyncio.ensure_future(consume(clients[name], deliveries, name, stop, N_BATCHES))
                  for name in ("trainerA", "trainerB")]
        await poll_until(lambda: len(deliveries) >= KILL_AFTER or any(t.done() for t in tasks),
                         30, f"{KILL_AFTER} batches before the kill")
        # each client so far talked to its own replica only
        served = {name: dict(c.calls) for name, c in clients.items()}
        sigkill(servers[0].process)
        received_at_kill = len(deliveries)

        await poll_until(lambda: len(deliveries) >= N_BATCHES or any(t.done() for t in tasks),
                         60, f"{N_BATCHES} batches")
        stop.set()
        await finish(tasks)
        await settle_batches(clients["trainerB"], deliveries, "trainerB")
        for w in workers:
            await w.collect_cancels()
        stats, slots = await snapshot(observer, redis_url, namespace)
        check_accounting(stats, slots)

        await drain(workers, observer)
        final, slots = await snapshot(observer, redis_url, namespace)
        check_drained(final, slots)
    finally:
        for c in [*clients.values(), observer]:
            await c.aclose()

    # Replica A was doing its share before it died; afterwards everyone is on B.
    for name, calls in served.items():
        assert set(calls) <= {url_a if name.endswith("A") else url_b}, (name, calls)
    assert served["w0A"] and served["w1A"], served
    for name, c in clients.items():
        assert c.base_url == url_b, (name, c.switches)
        if name.endswith("A"):
            assert c.switches, f"{name} never failed over"
    # An answer A wrote before it died can still be read afterwards (it was in the socket), so
    # trainerA may take one batch from A after the kill, its first; everything else comes from B.
    after_kill = deliveries.received[received_at_kill:]
    from_a = [r for r in after_kill if r.via == url_a]
    assert len(from_a) <= 1 and all(r.consumer == "trainerA" for r in from_a), from_a
    first_of_trainer_a = next((r for r in after_kill if r.consumer == "trainerA"), None)
    assert not from_a or from_a[0] is first_of_trainer_a, after_kill
    assert any(r.via == url_b for r in after_kill), after_kill

    # All batches complete, no group twice, nothing lost: every rollout slot answered or
    # cancelled, every committed group delivered or ready.
    assert len(deliveries) >= N_BATCHES
    check_batches(deliveries, k=K, batch_size=BATCH_SIZE)
    c = final.counters
    assert c.groups_delivered == c.groups_acked == len(deliveries) * BATCH_SIZE
    # each rollout the workers answered counts once, as completed or (cancelled first) late; a
    # result sent again to B after A died with the answer counts as a duplicate, never twice
    assert c.rollouts_completed + c.results_late == len(ledger.reported)
    assert ledger.results_accepted <= c.rollouts_completed
    print(f"switches {sum(len(cl.switches) for cl in clients.values())}, "
          f"reissued {c.rollouts_reissued}, duplicates {c.results_duplicate}, "
          f"redelivered {c.batches_redelivered}")

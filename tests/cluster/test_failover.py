"""Redis Cluster failover under load: a master SIGKILLed mid-run, its replica promoted by the
cluster itself, and the run goes on with nothing committed lost and no group delivered twice.

A cluster of its own (three masters, one replica each, node timeout 2 s: tests/cluster/_local.py)
and `sara serve` on it (`redis+cluster://`), two scripted workers and a trainer through the SDK.
After a few acked batches the master that owns the run's hash slot is killed with SIGKILL. The
cluster marks it failed and its replica takes over its slots (no CLUSTER FAILOVER: the kill and
the wait are the real thing); meanwhile the scheduler answers 503 and the clients retry (or, on
a loaded box, its own Redis retries outlast the outage and no client sees it: that the right
master died is checked on the cluster, before and after). Then the run is driven to more batches
and drained, and:

- every batch acked before the kill is still acked, with the groups and results delivered;
- every result a worker had an answer for (before or after the kill) is in Redis: its slot done
  with the reported reward, or cancelled (a late result);
- no batch and no group was received twice; the counters and the slots hash agree.

Replication is asynchronous in Redis: a write answered in the last instant before the kill could
in principle miss the replica. On loopback the master sends the replica each write in the same
event-loop turn as the answer, so that window is microseconds wide; the checks are strict.
Synchronisation is by polling a condition with a deadline, never by a fixed sleep.
"""

from __future__ import annotations

import asyncio
import collections
import json
import uuid

import pytest

from sara_service.store.keys import Keys, split_rollout_id
from sara_service.store.redis_format import decode_slot
from tests.cluster._local import LocalCluster, sync_client
from tests.e2e._harness import BernoulliWorker, Ledger, RewardScript, load_synthetic
from tests.faults._support import (
    CountingTransport, Deliveries, check_accounting, check_batches, check_drained, consume,
    drain, finish, poll_until, sdk_client, serve_process, settle_batches, sigkill,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

K, BATCH_SIZE, N_PROMPTS, SEED = 4, 4, 200, 29
LEASE_TTL_S, ACK_TIMEOUT_S = 2.0, 2.0
KILL_AFTER = 4  # batches acked before the master is killed
N_BATCHES = 12
PROMOTION_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three masters and three replicas of this module's own (the failover kills one)."""
    base = tmp_path_factory.mktemp("failover-cluster")
    cluster = LocalCluster(base, replicas=1, node_timeout_ms=2000).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_the_failover_cluster_has_a_linked_replica_per_master(cluster):
    roles = collections.Counter(cluster.roles().values())
    assert roles == {"master": 3, "replica": 3}
    for client in cluster.clients[3:]:
        info = client.info("replication")
        assert info["master_link_status"] == "up"
        assert f"{info['master_host']}:{info['master_port']}" in {
            f"{n.host}:{n.port}" for n in cluster.nodes[:3]}


def test_master_killed_under_load_failover_keeps_every_commit(tmp_path, cluster):
    namespace = f"failover-{uuid.uuid4().hex[:8]}"
    server = serve_process(tmp_path, cluster.url, namespace, "serve", group_size=K,
                           batch_size=BATCH_SIZE, seed=SEED, lease_ttl_s=LEASE_TTL_S,
                           batch_ack_timeout_s=ACK_TIMEOUT_S)
    try:
        server.start()
        load_synthetic(server.url, N_PROMPTS, SEED)
        asyncio.run(_scenario(server.url, namespace, cluster))
        assert server.alive, "the scheduler died with a Redis master"
    finally:
        server.stop()
        print(server.log_tail())  # shown when the test fails


async def _scenario(url: str, namespace: str, cluster: LocalCluster) -> None:
    transport = CountingTransport()
    # the SDK's own retries outlast the failover: 503s (Retry-After capped at 0.5 s)
    client = sdk_client(url, transport=transport, max_attempts=400, max_delay_s=0.5)
    ledger = Ledger()
    workers = [BernoulliWorker(f"w{i}", [client], RewardScript(SEED), ledger, lease_size=8,
                               report_size=4) for i in range(2)]
    deliveries = Deliveries()
    stop = asyncio.Event()
    try:
        tasks = [asyncio.ensure_future(w.run(stop)) for w in workers]
        tasks.append(asyncio.ensure_future(consume(client, deliveries, "trainer", stop,
                                                   N_BATCHES)))
        await poll_until(lambda: len(deliveries.acked) >= KILL_AFTER
                         or any(t.done() for t in tasks),
                         60, f"{KILL_AFTER} acked batches before the kill")
        # what is committed at the kill: taken, and the kill done, without yielding to the loop
        committed = {r.batch.batch_id: r.batch for r in deliveries.received
                     if r.batch.batch_id in set(deliveries.acked)}
        reported_before = dict(ledger.reported)
        victim, heir = _kill_owner(cluster, Keys(namespace).stats)
        await poll_until(lambda: _promoted(cluster, namespace, heir), PROMOTION_TIMEOUT_S,
                         f"the replica {heir} to take over from {victim}", interval_s=0.1)
        assert not any(t.done() for t in tasks), [t for t in tasks if t.done()]
        _check_committed(cluster, namespace, committed)
        await poll_until(lambda: len(deliveries) >= N_BATCHES or any(t.done() for t in tasks),
                         90, f"{N_BATCHES} batches")
        stop.set()
        await finish(tasks)
        await settle_batches(client, deliveries, "trainer")
        for w in workers:
            await w.collect_cancels()
        check_accounting(await client.stats(), _slot_counts(cluster, namespace))
        await drain(workers, client)
        final = await client.stats()
        check_drained(final, _slot_counts(cluster, namespace))
    finally:
        await client.aclose()

    assert len(deliveries) >= N_BATCHES and len(ledger.reported) > len(reported_before)
    check_batches(deliveries, k=K, batch_size=BATCH_SIZE)
    _check_committed(cluster, namespace, committed)
    _check_reported(cluster, namespace, ledger.reported)
    c = final.counters
    assert c.groups_delivered == c.groups_acked == len(deliveries) * BATCH_SIZE
    # 0 503s is possible under load (see the module docstring); the number says how it went
    print(f"503s seen by clients {transport.status[503]}; reissued {c.rollouts_reissued}, "
          f"duplicates {c.results_duplicate}, redelivered {c.batches_redelivered}")


def _kill_owner(cluster: LocalCluster, key: str) -> tuple[str, str]:
    """SIGKILL the master serving `key`; (its address, the address of its replica)."""
    victim = cluster.owner_of(key)
    (heir,) = [address for address, client in _replicas(cluster)
               if _master_of(client) == victim]
    node = cluster.node_at(victim)
    sigkill(node.process)
    node.process = None
    return victim, heir


def _replicas(cluster: LocalCluster):
    for client, node in zip(cluster.clients, cluster.nodes):
        if node.running and client.info("replication")["role"] == "slave":
            yield f"{node.host}:{node.port}", client


def _master_of(client) -> str:
    info = client.info("replication")
    return f"{info['master_host']}:{info['master_port']}"


def _promoted(cluster: LocalCluster, namespace: str, heir: str) -> bool:
    """The heir is a master, owns the run's slot, and every live node says the cluster is ok."""
    if cluster.roles().get(heir) != "master":
        return False
    if any(c.cluster("INFO").get("cluster_state") != "ok" for c in cluster.live_clients()):
        return False
    return cluster.owner_of(Keys(namespace).stats) == heir


def _slot_counts(cluster: LocalCluster, namespace: str) -> collections.Counter:
    client = sync_client(cluster.url)
    try:
        return collections.Counter(decode_slot(v.decode()).kind
                                   for v in client.hvals(Keys(namespace).slots))
    finally:
        client.close()


def _check_committed(cluster: LocalCluster, namespace: str, committed: dict) -> None:
    """Each batch acked before the kill: still acked, same groups, each group acked with the
    results the trainer received."""
    keys = Keys(namespace)
    client = sync_client(cluster.url)
    try:
        for batch_id, batch in committed.items():
            row = {k.decode(): v.decode() for k, v in client.hgetall(keys.batch(batch_id)).items()}
            assert row.get("state") == "acked", (batch_id, row)
            assert row["groups"].split(",") == [g.group_id for g in batch.groups]
            for g in batch.groups:
                assert client.hget(keys.group_states, g.group_id) == b"acked", g.group_id
                stored = client.hgetall(keys.group(g.group_id))
                for ro in g.rollouts:
                    field = f"r:{split_rollout_id(ro.rollout_id)[1]}".encode()
                    result = json.loads(stored[field])
                    assert (result["reward"], result["completion"]) == (ro.reward, ro.completion)
    finally:
        client.close()


def _check_reported(cluster: LocalCluster, namespace: str, reported: dict[str, float]) -> None:
    """Every result a worker was answered for is in Redis: done with its reward, or cancelled."""
    keys = Keys(namespace)
    client = sync_client(cluster.url)
    try:
        ids = sorted(reported)
        states = dict(zip(ids, client.hmget(keys.slots, ids)))
        lost = [rid for rid, raw in states.items()
                if raw is None or decode_slot(raw.decode()).kind not in ("done", "cancelled")]
        assert not lost, f"{len(lost)} answered results not in Redis: {lost[:5]}"
        for rid, raw in states.items():
            if decode_slot(raw.decode()).kind == "done":
                group_id, slot = split_rollout_id(rid)
                stored = json.loads(client.hget(keys.group(group_id), f"r:{slot}"))
                assert stored["reward"] == reported[rid], rid
    finally:
        client.close()

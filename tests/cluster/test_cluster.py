"""The README's claim that one Redis Cluster holds many runs, on a real three-master cluster.

tests/store and tests/api run whole on the cluster too (their `redis_url` is parametrized
"single" / "cluster"); this module adds what only a cluster can show: each run's keys share one
slot, two runs whose slots live on different masters progress at once, each touching only its
own master, blocking reads of a run's key (what long polls may wait on) wake through the
cluster client, and an unreachable cluster is a 503 like an unreachable server.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools

import httpx
import pytest
from redis.crc import key_slot

from sara_service.http.app import create_app
from sara_service.embedded import free_port
from sara_service.store.keys import Keys
from sara_service.store.redis_client import cluster_node_url, connect
from sara_service.settings import Settings
from sara_service.core.wake import Wakeups
from sara_service.store.wake_stream import WakeStream
from tests.api.conftest import BASE_URL, DEFAULTS, Api, prompt_spec, result_for
from tests.cluster._local import MASTERS, SLOTS, slot_ranges

# ids as clients may send them: with the key separator and with hash-tag braces
AWKWARD_IDS = ("g1", "a:b:3", "{x}", "}{", "w{1}:", "", "é")


def every_key(keys: Keys) -> list[str]:
    """Every key name Keys builds: each property, and each id-built key for AWKWARD_IDS."""
    names = []
    for name, member in inspect.getmembers(type(keys)):
        if isinstance(member, property) and name != "prefix":
            names.append(getattr(keys, name))
        elif inspect.isfunction(member) and not name.startswith("_"):
            arity = len(inspect.signature(member).parameters) - 1
            for ids in itertools.product(AWKWARD_IDS, repeat=arity):
                names.append(getattr(keys, name)(*ids))
    return names


@pytest.mark.parametrize("namespace", ["default", "run-a", "x", "a.b_c-9"])
def test_every_key_of_a_run_hashes_to_the_runs_slot(namespace):
    keys = every_key(Keys(namespace))
    assert len(keys) > 30  # the properties and every id-built kind were found
    assert {key_slot(k.encode()) for k in keys} == {key_slot(namespace.encode())}


def test_the_fixture_formed_three_masters_that_split_the_slots(redis_cluster):
    nodes = redis_cluster.clients[0].cluster("NODES")
    assert len(nodes) == MASTERS and all("master" in n["flags"] for n in nodes.values())
    owned = sorted(tuple(int(x) for x in r) for n in nodes.values() for r in n["slots"])
    assert owned == [(r.start, r.stop - 1) for r in slot_ranges()]
    assert owned[0][0] == 0 and owned[-1][1] == SLOTS - 1
    for client in redis_cluster.clients:
        assert client.cluster("INFO")["cluster_state"] == "ok"


def two_namespaces_on_different_masters(cluster) -> tuple[str, str]:
    first = "run-a"
    owner = cluster.owner_of(Keys(first).stats)
    for i in itertools.count():
        other = f"run-b{i}"
        if cluster.owner_of(Keys(other).stats) != owner:
            return first, other
    raise AssertionError("unreachable")


async def _one_run_to_a_batch(api: Api, n_prompts: int) -> dict:
    """Add prompts, lease and report every rollout, take a batch and ack it."""
    await api.add(*(prompt_spec(f"p{i}", "mixed") for i in range(n_prompts)))
    for _ in range(20):
        lease = await api.lease("w1", 8)
        if not lease["rollouts"]:
            break
        await api.report("w1", [result_for(r) for r in lease["rollouts"]])
        await asyncio.sleep(0)  # let the other run's requests interleave with this one's
    r = await api.next_batch()
    assert r.status_code == 200, r.text
    batch = r.json()
    await api.ok("POST", f"/batches/{batch['batch_id']}/ack")
    return batch


@pytest.mark.anyio
async def test_two_runs_on_different_masters_progress_at_once(redis_cluster, redis_cluster_url,
                                                             fake_clock):
    names = two_namespaces_on_different_masters(redis_cluster)
    slots = [int(redis_cluster.clients[0].cluster("KEYSLOT", Keys(ns).stats)) for ns in names]
    owners = [redis_cluster.owner_of(Keys(ns).stats) for ns in names]
    assert slots[0] != slots[1] and owners[0] != owners[1], (slots, owners)

    apps = [create_app(Settings(**{**DEFAULTS, "redis_url": redis_cluster_url, "namespace": ns,
                                   "group_size": 4, "batch_size": 2}), clock=fake_clock)
            for ns in names]
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL)
               for app in apps]
    try:
        apis = [Api(app, http, fake_clock) for app, http in zip(apps, clients)]
        batches = await asyncio.gather(*(_one_run_to_a_batch(api, 3) for api in apis))
        for api, batch in zip(apis, batches):
            assert len(batch["groups"]) == 2 and all(
                len(g["rollouts"]) == 4 for g in batch["groups"])
            counters = await api.counters()
            assert counters["batches_acked"] == 1 and counters["groups_delivered"] == 2
    finally:
        for app, http in zip(apps, clients):
            await http.aclose()
            await app.state.scheduler.store.redis.aclose()

    # each run's keys all sit on the master that owns its slot, and nowhere else
    by_node = {f"{n.host}:{n.port}": c for n, c in zip(redis_cluster.nodes, redis_cluster.clients)}
    for ns, owner in zip(names, owners):
        pattern = Keys(ns).prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        found = {address: client.keys(pattern) for address, client in by_node.items()}
        assert found[owner] and not any(v for a, v in found.items() if a != owner), found
        assert {key_slot(k.encode()) for k in found[owner]} == {slots[names.index(ns)]}


@pytest.mark.anyio
async def test_a_cluster_no_node_of_which_answers_is_503(fake_clock):
    app = create_app(Settings(**{**DEFAULTS, "redis_url": f"redis+cluster://127.0.0.1:"
                                                          f"{free_port()}"}), clock=fake_clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url=BASE_URL) as http:
        r = await http.post("/leases", json={"worker_id": "w1", "max_rollouts": 1, "wait_s": 0})
        assert r.status_code == 503, r.text
        assert (await http.get("/readyz")).status_code == 503
    await app.state.scheduler.store.redis.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("command", ["xread", "blpop"])
async def test_a_blocking_read_of_a_runs_key_wakes_through_the_cluster_client(redis_cluster_url,
                                                                              command):
    """Long polls may block on a run's key (a stream or a list): through the service's cluster
    client such a read goes to the key's master and returns when another client writes."""
    key = Keys("run-a").prefix + "wake-test"
    reader = connect(redis_cluster_url, socket_timeout=5)
    writer = connect(redis_cluster_url, socket_timeout=5)
    try:
        if command == "xread":
            await writer.xadd(key, {"k": "old"})
            read = asyncio.create_task(reader.xread({key: "$"}, block=3000))
        else:
            read = asyncio.create_task(reader.blpop([key], timeout=3))
        await writer.initialize()
        node = writer.get_node_from_key(key)
        for _ in range(300):  # the read is parked once the key's master lists a blocked client
            if (await writer.info("clients", target_nodes=node))["blocked_clients"]:
                break
            await asyncio.sleep(0.01)
        if command == "xread":
            await writer.xadd(key, {"k": "new"})
        else:
            await writer.rpush(key, "new")
        got = await asyncio.wait_for(read, 5)
        if command == "xread":
            [[stream, [(_, fields)]]] = got
            assert (stream, fields) == (key.encode(), {b"k": b"new"})
        else:
            assert tuple(got) == (key.encode(), b"new")
    finally:
        await reader.aclose()
        await writer.aclose()


def test_the_url_forms():
    assert cluster_node_url("redis+cluster://h:7000") == "redis://h:7000"
    assert cluster_node_url("rediss+cluster://u:p@h:7000") == "rediss://u:p@h:7000"
    assert cluster_node_url("REDIS+CLUSTER://h:1") == "redis://h:1"
    for single in ("redis://h:6379/0", "rediss://h:6380", "unix:///tmp/r.sock", "h:1"):
        assert cluster_node_url(single) is None
    assert type(connect("redis://h:1")).__name__ == "Redis"
    assert type(connect("redis+cluster://h:1")).__name__ == "RedisCluster"


@pytest.mark.anyio
async def test_the_wake_listener_blocks_for_less_than_the_cluster_sockets_timeout(
        redis_cluster_url):
    """A cluster client has no pool of its own to give the listener, so its blocking read runs on
    connections with the service's 5 s socket timeout: a 5 s block would time out every idle round
    and leave long polls on their fallback timer. The read must end well before the timeout."""
    client = connect(redis_cluster_url, socket_timeout=5)
    wake = Wakeups(WakeStream(client, Keys("run-a").wake))
    try:
        wake.release(await wake.ticket("lease"))  # the first ticket starts the listener
        assert wake.read_block_s <= 5 - 2
    finally:
        await wake.aclose()
        await client.aclose()

"""A real three-master Redis Cluster on loopback, formed with the cluster commands themselves.

`LocalCluster(base_dir).start()` starts three `redis-server --cluster-enabled yes` (the same
binary as the other fixtures, each an EmbeddedRedis in its own directory on a free port), gives
each master a third of the 16384 slots, introduces them with CLUSTER MEET and returns once every
node reports `cluster_state:ok` and knows all three. No redis-cli needed. `.url` is the
service's cluster URL (`redis+cluster://`, see sara_service.store.redis_client).

`LocalCluster(base_dir, replicas=1)` adds one replica per master (CLUSTER REPLICATE) and returns
once each replica's link to its master is up: what the failover test kills a master of.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from sara_service.embedded import EmbeddedRedis, free_port
from sara_service.store.redis_client import cluster_node_url

SLOTS = 16384
MASTERS = 3
FORM_TIMEOUT_S = 60.0
BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000
MAX_PORT = 65535 - BUS_OFFSET
ATTEMPTS = 50


def _is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def slot_ranges(masters: int = MASTERS) -> list[range]:
    """The slots each master owns: consecutive, near-equal thirds of 0..16383."""
    bounds = [SLOTS * i // masters for i in range(masters + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(masters)]


def sync_client(url: str) -> redis.Redis | RedisCluster:
    """A blocking client for a test to look at Redis directly, on either kind of URL."""
    node = cluster_node_url(url)
    return RedisCluster.from_url(node) if node else redis.Redis.from_url(url)


class LocalCluster:
    """Three cluster-mode redis-servers in `base_dir`; `.url`, `.nodes`, `.clients`."""

    def __init__(self, base_dir: str | Path, *, replicas: int = 0,
                 node_timeout_ms: int = 5000) -> None:
        self.base_dir = Path(base_dir)
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[EmbeddedRedis] = []  # masters first, then replicas
        self.clients: list[redis.Redis] = []

    @property
    def url(self) -> str:
        """The cluster URL, through the first node still running."""
        first = next(n for n in self.nodes if n.running)
        return f"redis+cluster://{first.host}:{first.port}"

    def start(self) -> "LocalCluster":
        try:
            for i in range(MASTERS * (1 + self.replicas)):
                node = self._start_node(self.base_dir / f"node{i}", self.node_timeout_ms)
                self.nodes.append(node)
                self.clients.append(redis.Redis(host=node.host, port=node.port,
                                                decode_responses=True))
            self._form()
            if self.replicas:
                self._attach_replicas()
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _start_node(data_dir: Path, node_timeout_ms: int = 5000) -> EmbeddedRedis:
        """A cluster-mode server on a free port whose bus port (port + 10000, which Redis 6
        cannot move) is free and valid too; a port taken meanwhile means another try."""
        for _ in range(ATTEMPTS):
            port = free_port()
            if port > MAX_PORT or not _is_free(port + BUS_OFFSET):
                continue
            node = EmbeddedRedis(data_dir, port=port, extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms), "--appendonly", "no"))
            try:
                return node.start()
            except RuntimeError:
                continue
        raise RuntimeError(f"no cluster node started in {data_dir} after {ATTEMPTS} ports")

    def _form(self) -> None:
        for epoch, (client, slots) in enumerate(zip(self.clients, slot_ranges()), start=1):
            # distinct config epochs up front, so the nodes need not resolve a collision
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
            client.execute_command("CLUSTER ADDSLOTS", *slots)  # Redis 6.2: no ADDSLOTSRANGE
        for node in self.nodes[1:]:
            self.clients[0].execute_command("CLUSTER MEET", node.host, node.port)
        self.wait_until_ok()

    def _attach_replicas(self) -> None:
        """Node MASTERS + i replicates master i % MASTERS; returns once every link is up."""
        masters = [c.execute_command("CLUSTER MYID") for c in self.clients[:MASTERS]]
        for i, client in enumerate(self.clients[MASTERS:]):
            client.execute_command("CLUSTER REPLICATE", masters[i % MASTERS])
        self.wait_until_ok()

    def wait_until_ok(self, timeout_s: float = FORM_TIMEOUT_S) -> None:
        """Return once every live node says cluster_state:ok, knows every node and sees every
        slot assigned, and every replica's link to its master is up; AssertionError with the
        last answers after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            infos = [c.cluster("INFO") for c in self.live_clients()]
            if all(i.get("cluster_state") == "ok"
                   and i.get("cluster_known_nodes") == str(len(self.nodes))
                   and i.get("cluster_slots_assigned") == str(SLOTS) for i in infos) \
                    and self._replicas_linked():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster did not form in {timeout_s:g}s: {infos}")
            time.sleep(0.05)  # a poll interval: the loop ends on the condition above

    def live_clients(self) -> list[redis.Redis]:
        return [c for c, n in zip(self.clients, self.nodes) if n.running]

    def _replicas_linked(self) -> bool:
        for client in self.live_clients():
            info = client.info("replication")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def roles(self) -> dict[str, str]:
        """host:port -> "master" or "replica", for every node still running."""
        return {f"{n.host}:{n.port}": "master" if c.info("replication")["role"] == "master"
                else "replica" for c, n in zip(self.clients, self.nodes) if n.running}

    def node_at(self, address: str) -> EmbeddedRedis:
        (node,) = [n for n in self.nodes if f"{n.host}:{n.port}" == address]
        return node

    def owner_of(self, key: str) -> str:
        """host:port of the master that serves `key`'s slot (from CLUSTER NODES)."""
        client = self.live_clients()[0]
        slot = int(client.cluster("KEYSLOT", key))
        for address, node in client.cluster("NODES").items():
            if "master" in node["flags"] and "fail" not in node["flags"] \
                    and any(int(lo) <= slot <= int(hi) for lo, hi in node["slots"]):
                return address.split("@")[0]
        raise AssertionError(f"no node serves slot {slot} of {key!r}")

    def flush(self) -> None:
        """Empty every master (FLUSHALL is per node in a cluster; replicas follow)."""
        for client in self.live_clients():
            if client.info("replication")["role"] == "master":
                client.flushall()

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.clients = []
        for node in self.nodes:
            node.stop()

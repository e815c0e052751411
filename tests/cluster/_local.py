"""A real three-master Redis Cluster on loopback, formed with the cluster commands themselves.

`LocalCluster(base_dir).start()` starts three `redis-server --cluster-enabled yes` (the same
binary as the other fixtures, each an EmbeddedRedis in its own directory on a free port), gives
each master a third of the 16384 slots, introduces them with CLUSTER MEET and returns once every
node reports `cluster_state:ok` and knows all three. No redis-cli needed. `.url` is the
service's cluster URL (`redis+cluster://`, see sara_service.redis_client).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from sara_service.embedded import EmbeddedRedis, free_port
from sara_service.redis_client import cluster_node_url

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

    def __init__(self, base_dir: str | Path) -> None:
        self.base_dir = Path(base_dir)
        self.nodes: list[EmbeddedRedis] = []
        self.clients: list[redis.Redis] = []

    @property
    def url(self) -> str:
        first = self.nodes[0]
        return f"redis+cluster://{first.host}:{first.port}"

    def start(self) -> "LocalCluster":
        try:
            for i in range(MASTERS):
                node = self._start_node(self.base_dir / f"node{i}")
                self.nodes.append(node)
                self.clients.append(redis.Redis(host=node.host, port=node.port,
                                                decode_responses=True))
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _start_node(data_dir: Path) -> EmbeddedRedis:
        """A cluster-mode server on a free port whose bus port (port + 10000, which Redis 6
        cannot move) is free and valid too; a port taken meanwhile means another try."""
        for _ in range(ATTEMPTS):
            port = free_port()
            if port > MAX_PORT or not _is_free(port + BUS_OFFSET):
                continue
            node = EmbeddedRedis(data_dir, port=port, extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000", "--appendonly", "no"))
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

    def wait_until_ok(self, timeout_s: float = FORM_TIMEOUT_S) -> None:
        """Return once every node says cluster_state:ok with all masters known and every slot
        assigned; AssertionError with the last answers after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            infos = [c.cluster("INFO") for c in self.clients]
            if all(i.get("cluster_state") == "ok" and i.get("cluster_known_nodes") == str(MASTERS)
                   and i.get("cluster_slots_assigned") == str(SLOTS) for i in infos):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster did not form in {timeout_s:g}s: {infos}")
            time.sleep(0.05)  # a poll interval: the loop ends on the condition above

    def owner_of(self, key: str) -> str:
        """host:port of the master that serves `key`'s slot (from CLUSTER NODES)."""
        slot = int(self.clients[0].cluster("KEYSLOT", key))
        for address, node in self.clients[0].cluster("NODES").items():
            if any(int(lo) <= slot <= int(hi) for lo, hi in node["slots"]):
                return address
        raise AssertionError(f"no node serves slot {slot} of {key!r}")

    def flush(self) -> None:
        """Empty every master (FLUSHALL is per node in a cluster)."""
        for client in self.clients:
            client.flushall()

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.clients = []
        for node in self.nodes:
            node.stop()

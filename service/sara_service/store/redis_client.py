"""The service's Redis client, built from `SARA_REDIS_URL`: one server or a Redis Cluster.

- `redis://host:port/db` (or `rediss://`, `unix://`): one Redis server.
- `redis+cluster://host:port` (or `rediss+cluster://` for TLS): a Redis Cluster, reached through
  any one of its nodes; the client discovers the others and routes each command to the master that
  owns its key's slot. A cluster has database 0 only.

Both clients take the same commands, scripts and pipelines: every key of one run carries the
run's hash tag (see keys.py), so each Lua script and each pipeline of the store lands on a single
master, and different runs spread over the masters by their tags.
"""

from __future__ import annotations

import functools
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

try:
    import hiredis
except ImportError:  # the service extra installs it; without it redis-py packs in Python
    hiredis = None

# the cluster schemes and the plain scheme each stands for
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def cluster_node_url(url: str) -> str | None:
    """The plain URL of the node a `redis+cluster://` URL names; None for a single-server URL."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower()) if sep else None
    return f"{plain}://{rest}" if plain else None


def connect(url: str, **options: Any) -> aioredis.Redis | RedisCluster:
    """An asyncio client for `url`: a RedisCluster for a cluster URL, else a Redis.
    `options` (timeouts, ...) apply to every connection either opens."""
    node = cluster_node_url(url)
    if node is not None:
        return RedisCluster.from_url(node, **options)
    client = aioredis.Redis.from_url(url, **options)
    if hiredis is not None:
        pool = client.connection_pool
        pool.connection_class = _hiredis_packing(pool.connection_class)
    return client


class HiredisPacking:
    """Mixed in front of a redis-py asyncio connection class: commands are packed by hiredis (C),
    as redis-py's sync connections already do. The asyncio one packs in Python, joining bytes
    per argument: half the client CPU of a script call with ~60 arguments. Arguments are encoded
    by the connection's own encoder first, so the bytes sent are the same."""

    def pack_command(self, *args: Any) -> list[bytes]:
        """The command in the Redis protocol, as one buffer."""
        if isinstance(args[0], str):  # 'CONFIG GET': the words go as separate arguments
            args = tuple(args[0].encode().split()) + args[1:]
        elif b" " in args[0]:
            args = tuple(args[0].split()) + args[1:]
        encode = self.encoder.encode  # type: ignore[attr-defined]
        return [hiredis.pack_command(tuple(
            bytes(x) if isinstance(x, memoryview) else x for x in map(encode, args)))]


@functools.lru_cache(maxsize=None)
def _hiredis_packing(base: type) -> type:
    """`base` (Connection, UnixDomainSocketConnection, SSLConnection) with HiredisPacking."""
    return type(f"Hiredis{base.__name__}", (HiredisPacking, base), {})

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

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

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
    return aioredis.Redis.from_url(url, **options)

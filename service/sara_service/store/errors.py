"""Turn Redis being unreachable or read-only into StoreUnavailable (the API answers 503)."""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, TypeVar

import redis.exceptions

from ..errors import StoreUnavailable

T = TypeVar("T")
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
_CLUSTER_UNAVAILABLE = (redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError,
                        redis.exceptions.SlotNotCoveredError)


def unavailable_on_redis_error(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Turn Redis being unreachable or read-only into StoreUnavailable (the API answers 503)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.BusyLoadingError, redis.exceptions.ReadOnlyError,
                OSError) as exc:
            raise StoreUnavailable(f"Redis is unavailable: {exc}") from exc
        except _CLUSTER_UNAVAILABLE as exc:  # a cluster down, resharding or failing over
            raise StoreUnavailable(f"Redis Cluster is unavailable: {exc}") from exc
        except redis.exceptions.RedisClusterException as exc:
            # a cluster client that reaches no node says so with the connection error as cause
            if isinstance(exc.__cause__, _UNREACHABLE):
                raise StoreUnavailable(f"Redis Cluster is unreachable: {exc}") from exc
            raise
        except redis.exceptions.ResponseError as exc:
            # a script's write on a replica (failover in progress) fails with READONLY
            if "READONLY" in str(exc):
                raise StoreUnavailable(f"Redis is read-only (failover?): {exc}") from exc
            raise

    return wrapper

"""What /healthz and /readyz know about Redis.

Readiness is "Redis answers now". Liveness is "this process is worth keeping": it fails once Redis
has been unreachable for longer than `redis_down_limit_s` (an orchestrator then restarts the
process, which may be all it takes, e.g. when its embedded Redis is gone), or at once when the
embedded Redis exited and could not be started again. A short outage, a Redis restart or a stall,
is not a reason to restart: /readyz reports it, /healthz stays 200.

Observations come from /readyz (a PING) and from the upkeep loop (every round).
"""

from __future__ import annotations

from typing import Any, Callable


class RedisHealth:
    """Redis reachability over time, on the scheduler's clock."""

    def __init__(self, clock: Callable[[], float], down_limit_s: float,
                 embedded: Any = None) -> None:
        self.clock = clock
        self.down_limit_s = down_limit_s
        self.embedded = embedded  # an EmbeddedRedis under supervision, or None
        self.down_since: float | None = None

    def observe(self, reachable: bool) -> None:
        """Record one attempt to reach Redis."""
        if reachable:
            self.down_since = None
        elif self.down_since is None:
            self.down_since = self.clock()

    def liveness_problem(self) -> str | None:
        """Why this process should be restarted, or None while it is worth keeping."""
        if self.embedded is not None and getattr(self.embedded, "restart_failed", False):
            return "the embedded redis-server exited and could not be restarted"
        if self.down_since is not None:
            down_for = self.clock() - self.down_since
            if down_for > self.down_limit_s:
                return (f"Redis unreachable for {down_for:.0f}s (limit "
                        f"SARA_REDIS_DOWN_LIMIT_S={self.down_limit_s:g}s)")
        return None

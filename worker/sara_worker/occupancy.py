"""How full the worker's engine has been, as the scheduler's /stats shows it.

The worker knows how many of its rollouts the backend is generating at every moment; the share
of the engine's slots they fill, integrated over time, is the engine's occupancy as the worker
sees it. Each lease carries the mean since the previous one (`EngineOccupancy.take`), so an
operator sees an engine that idles without running a bench. The clock is injected.
"""

from __future__ import annotations

from typing import Callable

from sara_client.models import EngineLoad


class EngineOccupancy:
    """Time-weighted min(generating, slots) / slots since the last :meth:`take`."""

    def __init__(self, slots: int, clock: Callable[[], float]) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots, self.clock = slots, clock
        self._since = self._last = clock()
        self._generating = 0
        self._area = 0.0   # slot-seconds in use since `_since`

    def generating(self, count: int) -> None:
        """The backend now generates `count` rollouts (called on every change)."""
        self._advance()
        self._generating = max(0, count)

    def take(self) -> EngineLoad | None:
        """The load since the previous call, and start a new interval; None when no time
        passed (nothing to average)."""
        self._advance()
        span = self._last - self._since
        area, self._area, self._since = self._area, 0.0, self._last
        if span <= 0:
            return None
        return EngineLoad(occupancy=min(1.0, area / (span * self.slots)), slots=self.slots)

    def _advance(self) -> None:
        now = self.clock()
        if now > self._last:
            self._area += (now - self._last) * min(self._generating, self.slots)
            self._last = now

"""Why a worker has no work: once its leases have come back empty for a while, it asks the
scheduler (GET /run, which any role may read) what holds the run up and logs the answer, e.g.
"waiting for a trainer" when ready groups fill flow control and nobody pulls batches. Without
it a worker that found nothing to do would say nothing at all."""

from __future__ import annotations

import logging
from typing import Any, Callable

from sara_client import SaraError

log = logging.getLogger("sara.worker")


class IdleNotice:
    """Counts a worker's idle time from its leases and says why it idles, first after
    `after_s` and then every `every_s` while it lasts (clock injected)."""

    def __init__(self, client: Any, url: str, clock: Callable[[], float], after_s: float,
                 every_s: float) -> None:
        self.client, self.url, self.clock = client, url, clock
        self.after_s, self.every_s = after_s, every_s
        self.since: float | None = None   # when leases started coming back empty
        self.said_at: float | None = None

    async def note(self, working: bool) -> None:
        """Note, after a lease, whether the worker has work (leased some, or still holds some);
        logs why it idles when it is time to."""
        now = self.clock()
        if working:
            if self.said_at is not None and self.since is not None:
                log.info("work again after %.0f s without any", now - self.since)
            self.since = self.said_at = None
            return
        self.since = now if self.since is None else self.since
        if now - self.since < self.after_s:
            return
        if self.said_at is not None and now - self.said_at < self.every_s:
            return
        self.said_at = now
        log.warning("no work for %.0f s from %s: %s", now - self.since, self.url,
                    await self.reason())

    async def reason(self) -> str:
        """What the scheduler says holds the run up, or its state when nothing does."""
        try:
            status = await self.client.run_status()
        except SaraError as exc:
            return f"the scheduler did not say why ({exc})"
        if status.warnings:
            return "; ".join(status.warnings)
        if status.state != "running":
            return f"the run is {status.state} (`sara run status`)"
        return "nothing holds the run up: the pool may be used up (`sara stats`)"

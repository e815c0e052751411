"""Batches in Redis: forming one from ready groups, the figures it carries, its ack, and reading
it back for a redelivery."""

from __future__ import annotations

import json

from ..errors import NotFound
from .codec import text, texts
from .errors import unavailable_on_redis_error
from .redis_format import Reply
from .runner import ResourceStore


class BatchStore(ResourceStore):
    """Batches: form, note, ack, read."""

    @unavailable_on_redis_error
    async def form_batch(self, now: float, size: int, ack_deadline: float, max_staleness: int,
                         rollout_cap: int | None, batch_id: str, retention_s: float
                         ) -> tuple[str, str | None]:
        """('new'|'redeliver', batch id) or ('none', None)."""
        out = await self.runner.run(
            "form_batch", dict(now=now, size=size, ack_deadline=ack_deadline,
                               max_staleness=max_staleness, rollout_cap=rollout_cap or 0,
                               batch_id=batch_id, retention_s=retention_s),
            dict(batch=self.keys.batch(batch_id)))
        kind = text(out[0])
        return kind, (text(out[1]) if len(out) > 1 else None)

    @unavailable_on_redis_error
    async def note_batch_estimate(self, batch_id: str, estimate: dict) -> None:
        """Record, once, figures as they stood when the batch was formed: a redelivery of the
        batch then carries the same ones."""
        await self.redis.hsetnx(self.keys.batch(batch_id), "estimate", json.dumps(estimate))

    @unavailable_on_redis_error
    async def ack(self, now: float, batch_id: str, retention_s: float) -> bool:
        """Ack a batch; True when it was acked before. NotFound if unknown."""
        out = text(await self.runner.run(
            "ack_batch", dict(now=now, batch_id=batch_id, retention_s=retention_s),
            dict(batch=self.keys.batch(batch_id))))
        if out == Reply.UNKNOWN:
            raise NotFound("unknown_batch", f"no batch with id {batch_id!r}")
        return out == Reply.ALREADY

    @unavailable_on_redis_error
    async def read_batch(self, batch_id: str) -> dict[str, str]:
        """The batch hash; NotFound when it does not exist."""
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        if not raw:
            raise NotFound("unknown_batch", f"no batch with id {batch_id!r}")
        return texts(raw)

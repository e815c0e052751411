"""The policy in Redis: the version and checkpoint the trainer published, and GRESO's skip
rates, which step once per policy version."""

from __future__ import annotations

from sara_client.models import PolicyInfo

from ..errors import Conflict
from ..math.selection import GresoParams
from .codec import stored_int, text, texts
from .errors import unavailable_on_redis_error
from .redis_format import Reply
from .runner import ResourceStore


class PolicyStore(ResourceStore):
    """The published policy, and what moves with its version."""

    @unavailable_on_redis_error
    async def publish_policy(self, now: float, version: int, checkpoint: str | None) -> PolicyInfo:
        """Publish a strictly newer version; Conflict otherwise."""
        out = await self.runner.run("publish_policy",
                                    dict(version=version, checkpoint=checkpoint or "", now=now))
        if text(out[0]) == Reply.STALE:
            raise Conflict("stale_policy_version",
                           f"version {version} is not newer than the current "
                           f"{stored_int(out[1])}")
        return PolicyInfo(version=version, checkpoint=checkpoint)

    @unavailable_on_redis_error
    async def get_policy(self) -> PolicyInfo:
        """The current policy version and checkpoint (version 0 before any publish)."""
        raw = await self.redis.hmget(self.keys.policy, ["version", "checkpoint"])
        checkpoint = text(raw[1]) if raw[1] else None
        return PolicyInfo(version=stored_int(raw[0]), checkpoint=checkpoint or None)

    @unavailable_on_redis_error
    async def greso_state(self) -> dict[str, float]:
        """GRESO's rates in force and the version they were stepped at (empty before the first
        draw), read without stepping them."""
        raw = texts(await self.redis.hgetall(self.keys.greso))
        return {name: float(raw[field]) for name, field in
                (("p_easy", "p_easy"), ("p_hard", "p_hard"), ("stepped_at_version", "v"))
                if field in raw}

    @unavailable_on_redis_error
    async def greso_rates(self, version: int, adapt: bool, params: GresoParams
                          ) -> tuple[float, float]:
        """GRESO's (p_easy, p_hard) at policy `version`, stepped once when the version moved on
        (and `adapt`), atomically across replicas (greso_step.lua)."""
        out = await self.runner.run("greso_step", dict(
            version=version, adapt=int(adapt), p_start=repr(params.p_start),
            p_min=repr(params.p_min), p_max=repr(params.p_max), step=repr(params.step),
            target_easy=repr(params.target_easy), target_hard=repr(params.target_hard)))
        return float(text(out[0])), float(text(out[1]))

"""Leases in Redis: handing pending rollouts to workers (opening groups in the same call when
the queue runs short), heartbeats, re-queueing what expired, and the slots' states. The results
workers report are applied by `results.ResultsStore`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sara_client.models import EngineLoad, PolicyInfo

from . import redis_format as rf
from ..errors import Conflict, NotFound
from ..math.allocation import GroupPlan
from .codec import shared_prompt, stored_int, text, texts
from .errors import unavailable_on_redis_error
from .keys import split_rollout_id
from .redis_format import Reply
from .runner import ResourceStore


@dataclass
class LeasedRollout:
    rollout_id: str
    group_id: str
    prompt_id: str
    prompt: dict[str, Any]
    priority: int = 0   # 1: the rest of a committed group, for the engine to run first


# what a leased rollout carries when its prompt's content is gone (neither stored nor retired)
NO_PROMPT: dict[str, Any] = {"prompt": "", "meta": {"sara_note": "prompt content not found"}}


@dataclass
class LeaseGrant:
    """What one lease.lua call gave: the rollouts, the worker's cancel list, the policy in
    force, whether flow control has room to open groups now (False when not asked), and whether
    groups opened by the lease found the epoch queue short (`dry`: start the next epoch)."""

    rollouts: list[LeasedRollout]
    cancel: list[str]
    policy: PolicyInfo
    room: bool
    dry: bool = False


@dataclass(frozen=True)
class Opening:
    """What a lease needs to open groups itself when the queue cannot fill it: the one plan of
    a uniform-prior run, the commit mode, the audit draw (as open_groups takes it) and ids for
    the groups, as many as it may open."""

    plan: GroupPlan
    commit: str
    audit_fraction: float
    seed: int
    group_ids: tuple[str, ...]


class LeaseStore(ResourceStore):
    """Leases, heartbeats, expiry and slot states."""

    @unavailable_on_redis_error
    async def expire_leases(self, now: float, limit: int = 1000) -> int:
        """Re-queue rollouts whose lease expired; returns how many."""
        return int(await self.runner.run("expire_leases", dict(now=now, limit=limit)))

    @unavailable_on_redis_error
    async def lease(self, now: float, worker_id: str, lease_id: str, max_rollouts: int,
                    expires_at: float, key_ttl_s: int, backend: str | None
                    ) -> tuple[list[LeasedRollout], list[str]]:
        """Lease pending rollouts to a worker; returns (rollouts, cancel list)."""
        grant = await self.lease_with_policy(now, worker_id, lease_id, max_rollouts, expires_at,
                                             key_ttl_s, backend)
        return grant.rollouts, grant.cancel

    @unavailable_on_redis_error
    async def lease_with_policy(self, now: float, worker_id: str, lease_id: str,
                                max_rollouts: int, expires_at: float, key_ttl_s: int,
                                backend: str | None, expire_limit: int = 0,
                                flow_target: int = 0, opening: Opening | None = None, *,
                                floor_target: float = 0.0, floor_ready: int = 0,
                                engine: EngineLoad | None = None) -> LeaseGrant:
        """`lease`, plus the policy in force, after first re-queueing up to `expire_limit`
        rollouts whose lease expired (as `expire_leases`): one round trip where a lease call
        took three. With a `flow_target`, also whether open_groups could open a group now; with
        an `opening` too, groups are opened on the epoch queue's next prompts for what the queue
        could not fill, and leased, in the same call. `floor_target` and `floor_ready` are the
        work floor, as `GroupStore.open_groups` takes them. `engine`: the worker's engine load,
        kept for /stats."""
        gids = opening.group_ids if opening else ()
        flat, prompts, cancel, version, checkpoint, room, dry, committed = await self.runner.run(
            "lease", dict(now=now, worker_id=worker_id, lease_id=lease_id,
                          max_rollouts=max_rollouts, expires_at=expires_at, key_ttl_s=key_ttl_s,
                          backend=backend or "", requeue_limit=expire_limit,
                          flow_target=flow_target,
                          plan=rf.plan_spec_json(opening.plan, opening.commit) if opening else "",
                          audit_fraction=repr(float(opening.audit_fraction)) if opening else 0,
                          seed=opening.seed if opening else 0, group_ids=" ".join(gids),
                          floor_target=repr(float(floor_target)), floor_ready=floor_ready,
                          engine_occupancy=repr(engine.occupancy) if engine else "",
                          engine_slots=engine.slots if engine else ""),
            self._lease_keys(lease_id), more_keys=[self.keys.group(gid) for gid in gids])
        content = {prompts[i]: prompts[i + 1] for i in range(0, len(prompts), 2)}
        first = set(rf.split_ids(text(committed)))
        rollouts = []
        for i in range(0, len(flat), 2):
            rid, pid = text(flat[i]), flat[i + 1]
            group_id, _ = split_rollout_id(rid)  # type: ignore[misc]
            raw = content[pid]
            rollouts.append(LeasedRollout(rid, group_id, text(pid),
                                          shared_prompt(raw) if raw else NO_PROMPT,
                                          int(group_id in first)))
        policy = PolicyInfo(version=stored_int(version), checkpoint=text(checkpoint) or None)
        return LeaseGrant(rollouts, rf.split_ids(text(cancel)), policy, int(room) == 1,
                          int(dry) == 1)

    def _lease_keys(self, lease_id: str) -> dict[str, str]:
        return dict(lease=self.keys.lease(lease_id),
                    lease_rollouts=self.keys.lease_rollouts(lease_id))

    @unavailable_on_redis_error
    async def heartbeat(self, now: float, worker_id: str, lease_id: str,
                        expires_at: float, key_ttl_s: int) -> list[str]:
        """Extend a lease; returns the worker's cancel list."""
        out = await self.runner.run(
            "heartbeat", dict(now=now, worker_id=worker_id, lease_id=lease_id,
                              expires_at=expires_at, key_ttl_s=key_ttl_s),
            self._lease_keys(lease_id))
        status = text(out[0])
        if status == Reply.UNKNOWN:
            raise NotFound("unknown_lease", f"no lease with id {lease_id!r} (it may have expired)")
        if status == Reply.NOT_YOURS:
            raise Conflict("lease_owner", f"lease {lease_id!r} belongs to worker {text(out[1])!r}")
        return rf.split_ids(text(out[1]))

    @unavailable_on_redis_error
    async def slot_states(self, rollout_ids: list[str]) -> list[rf.Slot]:
        """Decoded slot state of each rollout id (kind 'unissued' where there is none)."""
        if not rollout_ids:
            return []
        raw = await self.redis.hmget(self.keys.slots, rollout_ids)
        return [rf.decode_slot(text(r) if r else None) for r in raw]

    @unavailable_on_redis_error
    async def all_slots(self) -> dict[str, rf.Slot]:
        """Every slot of the namespace, decoded (for checks that count them; HGETALL)."""
        raw = await self.redis.hgetall(self.keys.slots)
        return {rid: rf.decode_slot(st) for rid, st in texts(raw).items()}

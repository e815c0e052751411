"""Leases in Redis: handing pending rollouts to workers (opening groups in the same call when
the queue runs short), heartbeats, re-queueing what expired, and applying the results workers
report, which is where SARA's decisions are taken (apply_results.lua)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from sara_client.models import EngineLoad, PolicyInfo, RolloutResult

from . import redis_format as rf
from ..errors import Conflict, NotFound, UnknownRollouts
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


@dataclass
class AppliedResults:
    accepted: int
    duplicates: int
    late: int
    decisions: list[tuple[str, str]]
    cancel: list[str]
    released: int = 0
    replayed: bool = False  # the stored answer of a report id applied before


def _applied(out: list) -> AppliedResults:
    """apply_results.lua's answer (or the stored answer it replays) as AppliedResults."""
    if text(out[0]) == Reply.UNKNOWN:
        raise UnknownRollouts([text(x) for x in out[1]])
    replayed = text(out[0]) == Reply.REPLAY
    if replayed:  # the stored answer: cjson writes an empty list as {}
        out = [Reply.OK, *[v or [] if isinstance(v, (list, dict)) else v
                       for v in json.loads(text(out[1]))]]
    flat = [text(x) for x in out[4]]
    decisions = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
    return AppliedResults(int(out[1]), int(out[2]), int(out[3]), decisions,
                          rf.split_ids(text(out[5])), int(out[6]), replayed)


class LeaseStore(ResourceStore):
    """Leases, heartbeats, expiry and results."""

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
    async def apply_results(self, now: float, worker_id: str, results: list[RolloutResult],
                            successes: list[int], decay: float, alpha0: float, beta0: float,
                            retention_s: float, half_life: float = math.inf, *,
                            report_id: str | None = None, report_ttl_s: int = 0,
                            holder_only: bool = False, levels: list[str] | None = None,
                            levels_in_use: int = 2) -> AppliedResults:
        """Apply results atomically; UnknownRollouts (nothing applied) if any id is unknown.

        Posteriors decay by `decay` per policy version and halve every `half_life` epochs of
        the pool (see `pool_clock`; inf: never).

        `successes` holds 1/0 per result, -1 for an aborted rollout (no outcome learned) or -2
        for a worker error (no outcome, until the third on one slot: then a failure). With a
        `report_id`, the answer is kept `report_ttl_s` in the same script, and a report sent again
        with that id gets it back (`replayed`) and changes nothing. `holder_only` (an
        authenticated worker id) ignores results for rollouts another worker holds. `levels`
        (SARA_EFFECTIVE=reward): each result's reward level, groups decided on whether those
        differ, among `levels_in_use` (the Dirichlet's size).
        """
        versions = await self._lease_versions(worker_id, results)
        packed = rf.results_arg(results, successes, versions, levels)
        if packed.unknown:
            raise UnknownRollouts(packed.unknown)
        out = await self.runner.run(
            "apply_results",
            # Lua cannot read "inf" portably: 0 stands for no half-life
            dict(now=now, worker_id=worker_id, decay=decay, alpha0=alpha0, beta0=beta0,
                 retention_s=retention_s,
                 half_life=repr(half_life) if math.isfinite(half_life) else 0,
                 count=len(results), report_ttl_s=report_ttl_s if report_id else 0,
                 holder_only=int(holder_only), results=packed.rows,
                 levels=0 if levels is None else max(2, levels_in_use)),
            # without a report id the script never touches KEYS[16]: any key of the run will do
            dict(report=self.keys.report(worker_id, report_id) if report_id else self.keys.stats),
            more_keys=[self.keys.group(g) for g in packed.groups], more_args=packed.blobs)
        return _applied(out)

    async def _lease_versions(self, worker_id: str, results: list[RolloutResult]) -> list[int]:
        """Each result's policy version: its own, else the version its lease was granted under
        (the current one when the worker no longer holds that rollout)."""
        missing = [r.rollout_id for r in results if r.policy_version is None]
        if not missing:
            return [r.policy_version for r in results]  # type: ignore[misc]
        states = await self.slot_states(missing)
        leases = {rid: slot.lease_id for rid, slot in zip(missing, states)
                  if slot.kind == "leased" and slot.worker_id == worker_id}
        # one read per lease, not per rollout: a report's results mostly share one lease
        lease_ids = list(dict.fromkeys(leases.values()))
        pipe = self.redis.pipeline(transaction=False)
        for lid in lease_ids:
            pipe.hget(self.keys.lease(lid), "policy_version")
        pipe.hget(self.keys.policy, "version")
        *granted, current = await pipe.execute()
        by_lease = dict(zip(lease_ids, granted))
        return [r.policy_version if r.policy_version is not None else
                stored_int(by_lease.get(leases.get(r.rollout_id, "")) or current)
                for r in results]

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

"""Redis store: one Lua script per state transition, plus the reads the API needs.

The store is the only reader and writer of Redis: the transitions are here, the run control in
`runctl.py`, the plain reads in `reads.py`, the stored format's version and migration in
`migrate.py`; what each stored value means, and each script's KEYS/ARGV order, is in
`redis_format`, and every script call is built from that table by name.

Every method takes `now` from the caller (the scheduler's injected clock), so scripts never read
Redis' own TIME and tests can move time by hand. Domain errors are raised here; Redis being
unreachable surfaces as `StoreUnavailable`.

It is past 400 lines because it holds one method per state-changing script, and those belong
together: each is a thin call of its script, and reading them side by side shows every write.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Sequence

import orjson
import redis.asyncio as aioredis

from sara_client.models import PolicyInfo, PromptIn, RolloutResult, prompt_json

from . import redis_format as rf
from ..math.allocation import GroupPlan
from ..math.selection import GresoParams
from ..errors import Conflict, NotFound, UnknownRollouts
from .keys import Keys, rollout_id, split_rollout_id
from .redis_format import SCRIPTS, GroupField, Reply
from .codec import shared_prompt, stored_int, text
from .errors import unavailable_on_redis_error
from .migrate import ensure_format
from .reads import StoreReads
from .runctl import RunControl


def script_source(name: str) -> str:
    """A script's text as Redis runs it: the shared prelude (lua/_prelude.lua), the shared files
    its spec names (`ScriptSpec.library`), then the script."""
    lua = resources.files("sara_service.store") / "lua"
    parts = ["_prelude", *(f"_{lib}" for lib in SCRIPTS[name].library), name]
    return "".join((lua / f"{part}.lua").read_text() for part in parts)


@dataclass
class LeasedRollout:
    rollout_id: str
    group_id: str
    prompt_id: str
    prompt: dict[str, Any]


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


class Store(RunControl, StoreReads):
    """All Redis access of one namespace."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.redis = client
        self.keys = Keys(namespace)
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPTS}
        # one epoch refill at a time per process: when the queue runs dry, every lease in flight
        # finds it short at once, and each reading and shuffling the whole pool cost more than
        # the leases themselves (replicas still refill once between them: refill_epoch.lua)
        self._refill_lock = asyncio.Lock()

    async def _script(self, name: str, args: dict[str, Any], per_id: dict[str, str] | None = None,
                      more_keys: Sequence[str] = (), more_args: Sequence[Any] = ()) -> Any:
        """Run one script with its KEYS and ARGV built by name from redis_format.SCRIPTS."""
        spec = SCRIPTS[name]
        return await self._scripts[name](keys=spec.key_list(self.keys, more_keys, **(per_id or {})),
                                         args=spec.arg_list(more_args, **args))

    async def ensure_format(self) -> str:
        """Make the stored format this release's (store/migrate.py): 'current', 'fresh' or
        'migrated'; UnknownFormat for one it does not read."""
        return await ensure_format(self)

    @unavailable_on_redis_error
    async def migrate_run_wide(self, renamed_json: str, max_int: int) -> list[int]:
        """migrate_format.lua, the migration's run-wide steps: [counters renamed, policy
        version reset, open yield written]."""
        out = await self._script("migrate_format", dict(renamed=renamed_json, max_int=max_int))
        return [int(x) for x in out]

    @unavailable_on_redis_error
    async def ping(self) -> bool:
        """True when Redis answers."""
        return bool(await self.redis.ping())

    # --- prompts ---------------------------------------------------------------------------------

    @unavailable_on_redis_error
    async def add_prompts(self, prompts: list[tuple[str, PromptIn]], alpha0: float,
                          beta0: float, version: int) -> tuple[int, list[str]]:
        """Register prompts (id, content); returns (how many were new, ids already stored with
        other content, which was kept)."""
        k = self.keys
        initial = json.dumps(rf.initial_posterior(alpha0, beta0, version))
        contents = [(pid, dict(zip(rf.PROMPT_FIELDS, (prompt_json(p.prompt), p.answer, p.task,
                                                      p.meta)))) for pid, p in prompts]
        pairs = [x for pid, content in contents for x in (pid, json.dumps(content))]
        created, maybe = await self._script("add_prompts", dict(initial_posterior=initial),
                                            more_args=pairs)
        maybe = list(dict.fromkeys(text(x) for x in maybe))
        stored = dict(zip(maybe, await self.redis.hmget(k.prompts, maybe) if maybe else []))
        return int(created), [pid for pid in maybe if stored[pid] is None or any(
            json.loads(stored[pid]) != content for other, content in contents if other == pid)]

    @unavailable_on_redis_error
    async def pop_epoch(self, count: int, seed: int,
                        shuffle: Callable[[list[str], int], list[str]]) -> list[str]:
        """Up to `count` prompt ids from the epoch queue, starting a new epoch when it runs dry."""
        got = await self._lpop_epoch(count)
        if len(got) < count:  # at most one refill per call: a tiny pool gives fewer than asked
            async with self._refill_lock:
                got += await self._lpop_epoch(count - len(got))  # refilled while we waited?
                if len(got) < count and await self._refill_epoch(seed, shuffle):
                    got += await self._lpop_epoch(count - len(got))
        return got

    async def _lpop_epoch(self, count: int) -> list[str]:
        return [text(x) for x in (await self.redis.lpop(self.keys.epoch_queue, count) or [])]

    async def _refill_epoch(self, seed: int,
                            shuffle: Callable[[list[str], int], list[str]]) -> bool:
        """Queue the next epoch (unless another replica just did); False when the pool is empty."""
        k = self.keys
        epoch = int(await self.redis.get(k.epoch) or 0)
        ids = sorted(text(x) for x in await self.redis.hkeys(k.prompts))
        if not ids:
            return False
        order = shuffle(ids, seed * 1_000_003 + epoch)
        await self._script("refill_epoch", dict(seen_epoch=epoch, prompt_ids=" ".join(order)))
        return True

    @unavailable_on_redis_error
    async def unpop_epoch(self, pids: list[str]) -> None:
        """Give back prompt ids that were popped but not opened (front of the queue, in order)."""
        if pids:
            await self.redis.lpush(self.keys.epoch_queue, *reversed(pids))

    # --- groups and leases ----------------------------------------------------------------------

    @unavailable_on_redis_error
    async def open_groups(self, now: float, flow_target: int,
                          groups: list[tuple[str, str, GroupPlan]], commit: str,
                          skipped: int = 0, audit_fraction: float = 0.0, seed: int = 0) -> int:
        """Open (group id, prompt id, plan) in order while flow control allows; returns how many
        were consumed (opened, or passed over as disabled/deleted): 0 while paused or draining.

        About `audit_fraction` of them (chosen by a hash of seed, prompt and visit) run on to k
        where SARA would abandon them, so the run measures what abandoning loses.
        """
        specs = [rf.group_spec(gid, pid, plan, commit) for gid, pid, plan in groups]
        args = dict(now=now, flow_target=flow_target, specs=orjson.dumps(specs), skipped=skipped,
                    audit_fraction=repr(float(audit_fraction)), seed=seed)
        return int(await self._script("open_groups", args, more_keys=[
            self.keys.group(gid) for gid, _, _ in groups]))

    @unavailable_on_redis_error
    async def expire_leases(self, now: float, limit: int = 1000) -> int:
        """Re-queue rollouts whose lease expired; returns how many."""
        return int(await self._script("expire_leases", dict(now=now, limit=limit)))

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
                                flow_target: int = 0, opening: Opening | None = None
                                ) -> LeaseGrant:
        """`lease`, plus the policy in force, after first re-queueing up to `expire_limit`
        rollouts whose lease expired (as `expire_leases`): one round trip where a lease call
        took three. With a `flow_target`, also whether open_groups could open a group now; with
        an `opening` too, groups are opened on the epoch queue's next prompts for what the queue
        could not fill, and leased, in the same call."""
        gids = opening.group_ids if opening else ()
        flat, prompts, cancel, version, checkpoint, room, dry = await self._script(
            "lease", dict(now=now, worker_id=worker_id, lease_id=lease_id,
                          max_rollouts=max_rollouts, expires_at=expires_at, key_ttl_s=key_ttl_s,
                          backend=backend or "", requeue_limit=expire_limit,
                          flow_target=flow_target,
                          plan=rf.plan_spec_json(opening.plan, opening.commit) if opening else "",
                          audit_fraction=repr(float(opening.audit_fraction)) if opening else 0,
                          seed=opening.seed if opening else 0, group_ids=" ".join(gids)),
            self._lease_keys(lease_id), more_keys=[self.keys.group(gid) for gid in gids])
        content = {prompts[i]: prompts[i + 1] for i in range(0, len(prompts), 2)}
        rollouts = []
        for i in range(0, len(flat), 2):
            rid, pid = text(flat[i]), flat[i + 1]
            group_id, _ = split_rollout_id(rid)  # type: ignore[misc]
            raw = content[pid]
            rollouts.append(LeasedRollout(rid, group_id, text(pid),
                                          shared_prompt(raw) if raw else NO_PROMPT))
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
        out = await self._script(
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
        out = await self._script(
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

    # --- batches and policy ---------------------------------------------------------------------

    @unavailable_on_redis_error
    async def form_batch(self, now: float, size: int, ack_deadline: float, max_staleness: int,
                         rollout_cap: int | None, batch_id: str, retention_s: float
                         ) -> tuple[str, str | None]:
        """('new'|'redeliver', batch id) or ('none', None)."""
        out = await self._script(
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
        out = text(await self._script("ack_batch",
                                      dict(now=now, batch_id=batch_id, retention_s=retention_s),
                                      dict(batch=self.keys.batch(batch_id))))
        if out == Reply.UNKNOWN:
            raise NotFound("unknown_batch", f"no batch with id {batch_id!r}")
        return out == Reply.ALREADY

    @unavailable_on_redis_error
    async def publish_policy(self, now: float, version: int, checkpoint: str | None) -> PolicyInfo:
        """Publish a strictly newer version; Conflict otherwise."""
        out = await self._script("publish_policy",
                                 dict(version=version, checkpoint=checkpoint or "", now=now))
        if text(out[0]) == Reply.STALE:
            raise Conflict("stale_policy_version",
                           f"version {version} is not newer than the current "
                           f"{stored_int(out[1])}")
        return PolicyInfo(version=version, checkpoint=checkpoint)

    @unavailable_on_redis_error
    async def greso_rates(self, version: int, adapt: bool, params: GresoParams
                          ) -> tuple[float, float]:
        """GRESO's (p_easy, p_hard) at policy `version`, stepped once when the version moved on
        (and `adapt`), atomically across replicas (greso_step.lua)."""
        out = await self._script("greso_step", dict(
            version=version, adapt=int(adapt), p_start=repr(params.p_start),
            p_min=repr(params.p_min), p_max=repr(params.p_max), step=repr(params.step),
            target_easy=repr(params.target_easy), target_hard=repr(params.target_hard)))
        return float(text(out[0])), float(text(out[1]))

    @unavailable_on_redis_error
    async def collect_garbage(self, now: float, limit: int = 200) -> int:
        """Delete finished groups whose retention ran out; returns how many."""
        k = self.keys
        due = [text(g) for g in await self.redis.zrangebyscore(k.gc, "-inf", now, 0, limit)]
        if not due:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for gid in due:
            pipe.hget(k.group(gid), GroupField.issued)
        issued = await pipe.execute()
        # one command per key for the whole round, not five per group
        slots = [rollout_id(gid, i) for gid, n in zip(due, issued) for i in range(int(n or 0))]
        pipe = self.redis.pipeline(transaction=False)
        if slots:
            pipe.hdel(k.slots, *slots)
        pipe.delete(*(k.group(gid) for gid in due))
        pipe.hdel(k.group_states, *due)
        pipe.hdel(k.group_prompt, *due)
        pipe.zrem(k.gc, *due)
        await pipe.execute()
        return len(due)

    @unavailable_on_redis_error
    async def prune_workers(self, seen_before: float, limit: int = 200) -> int:
        """Forget workers last seen before `seen_before` (set, info, cancel list); how many."""
        return int(await self._script("prune_workers",
                                      dict(seen_before=seen_before, limit=limit)))

"""Redis store: one Lua script per state transition, plus the reads the API needs.

Every method takes `now` from the caller (the scheduler's injected clock), so scripts never read
Redis' own TIME and tests can move time by hand. Domain errors are raised here; Redis being
unreachable surfaces as `StoreUnavailable`.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable

import redis.asyncio as aioredis

from sara_client.models import PolicyInfo, PromptIn, RolloutResult, prompt_json

from .allocation import GroupPlan
from .errors import Conflict, NotFound, UnknownRollouts
from .keys import Keys, split_rollout_id
from .store_errors import _unavailable_on_redis_error  # noqa: F401 - re-exported
from .store_runctl import RunControl
from .store_codec import _s, decode_prompt, decode_result, stored_int  # noqa: F401 - re-exported

SCRIPTS = ("open_groups", "lease", "expire_leases", "heartbeat", "apply_results", "form_batch",
           "ack_batch", "publish_policy", "add_prompts", "refill_epoch", "prune_workers",
           "prompt_state")

def script_source(name: str) -> str:
    """A script's text as Redis runs it: the shared prelude (lua/_prelude.lua), then the script."""
    lua = resources.files("sara_service") / "lua"
    return (lua / "_prelude.lua").read_text() + (lua / f"{name}.lua").read_text()


# A prompt is leased once per rollout of its group: decoding (and checking its meta) once per
# stored content, not per rollout, was most of a lease's CPU. Keyed by the stored bytes, so
# new content is a new entry; callers only read the dict.
_leased_prompt = functools.lru_cache(maxsize=4096)(decode_prompt)


@dataclass
class LeasedRollout:
    rollout_id: str
    group_id: str
    prompt_id: str
    prompt: dict[str, Any]


@dataclass
class AppliedResults:
    accepted: int
    duplicates: int
    late: int
    decisions: list[tuple[str, str]]
    cancel: list[str]
    released: int = 0
    replayed: bool = False  # the stored answer of a report id applied before


def _result_args(results: list[RolloutResult], successes: list[int], args: list[Any],
                 base: int) -> dict[str, int]:
    """Append apply_results.lua's last ARGV, every result in one JSON list (packing six
    arguments per result cost the client more than the script's work); returns group id -> its
    KEYS position (from `base`). UnknownRollouts for an id that is no rollout id at all."""
    group_index: dict[str, int] = {}
    unknown: list[str] = []
    rows = []
    for r, ok in zip(results, successes):
        parsed = split_rollout_id(r.rollout_id)
        if parsed is None:
            unknown.append(r.rollout_id)
            continue
        idx = group_index.setdefault(parsed[0], base + len(group_index))
        rows.append([r.rollout_id, idx, ok, r.completion_tokens, r.policy_version,
                     r.model_dump_json(exclude_none=True)])
    if unknown:
        raise UnknownRollouts(unknown)
    args.append(json.dumps(rows, ensure_ascii=False))
    return group_index


class Store(RunControl):
    """All Redis access of one namespace (run control: see store_runctl)."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.redis = client
        self.keys = Keys(namespace)
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPTS}

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts[name](keys=keys, args=args)

    @_unavailable_on_redis_error
    async def ping(self) -> bool:
        """True when Redis answers."""
        return bool(await self.redis.ping())

    # --- prompts ---------------------------------------------------------------------------------

    @_unavailable_on_redis_error
    async def add_prompts(self, prompts: list[tuple[str, PromptIn]], alpha0: float,
                          beta0: float, version: int) -> tuple[int, list[str]]:
        """Register prompts (id, content); returns (how many were new, ids already stored with
        other content, which was kept)."""
        k = self.keys
        initial = json.dumps({"a": alpha0, "b": beta0, "v": version})
        args: list[Any] = [initial]
        contents = [(pid, {"prompt": prompt_json(p.prompt), "answer": p.answer, "task": p.task,
                           "meta": p.meta}) for pid, p in prompts]
        for pid, content in contents:
            args += [pid, json.dumps(content)]
        created, maybe = await self._run(
            "add_prompts", [k.prompts, k.posteriors, k.prompts_off, k.prompts_retired, k.wake],
            args)
        maybe = list(dict.fromkeys(_s(x) for x in maybe))
        stored = dict(zip(maybe, await self.redis.hmget(k.prompts, maybe) if maybe else []))
        return int(created), [pid for pid in maybe if stored[pid] is None or any(
            json.loads(stored[pid]) != content for other, content in contents if other == pid)]

    @_unavailable_on_redis_error
    async def get_prompt(self, pid: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(content, posterior JSON) of one prompt; NotFound if unknown."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.prompts, pid)
        pipe.hget(self.keys.posteriors, pid)
        content, posterior = await pipe.execute()
        if content is None:
            raise NotFound("unknown_prompt", f"no prompt with id {pid!r}")
        return decode_prompt(content), json.loads(posterior or "{}")

    @_unavailable_on_redis_error
    async def posteriors(self, pids: list[str]) -> list[dict[str, Any] | None]:
        """Posterior JSON of each prompt id (None where unknown)."""
        if not pids:
            return []
        raw = await self.redis.hmget(self.keys.posteriors, pids)
        return [json.loads(r) if r else None for r in raw]

    @_unavailable_on_redis_error
    async def pool_clock(self) -> float:
        """Epochs of the pool so far: prompts consumed (groups opened + prompts skipped) per
        prompt, the clock posterior half-lives run on (apply_results.lua computes the same).
        Adding prompts slows it; it never runs backwards for a posterior (each keeps its max)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.keys.prompts)
        pipe.hmget(self.keys.stats, ["groups_opened", "groups_skipped"])
        n, (opened, skipped) = await pipe.execute()
        return (int(opened or 0) + int(skipped or 0)) / n if n else 0.0

    @_unavailable_on_redis_error
    async def sample_posteriors(self, limit: int) -> list[dict[str, Any]]:
        """Every prompt's posterior JSON when there are at most `limit`, else `limit` at random."""
        key = self.keys.posteriors
        if await self.redis.hlen(key) <= limit:
            raw = list((await self.redis.hgetall(key)).values())
        else:
            pairs = await self.redis.hrandfield(key, limit, withvalues=True) or []
            raw = pairs[1::2]
        return [json.loads(r) for r in raw]

    @_unavailable_on_redis_error
    async def counter_values(self, fields: tuple[str, ...]) -> dict[str, int]:
        """Integer counters from the stats hash (0 where unset)."""
        raw = await self.redis.hmget(self.keys.stats, list(fields))
        return {f: int(float(v)) if v is not None else 0 for f, v in zip(fields, raw)}

    @_unavailable_on_redis_error
    async def pop_epoch(self, count: int, seed: int,
                        shuffle: Callable[[list[str], int], list[str]]) -> list[str]:
        """Up to `count` prompt ids from the epoch queue, starting a new epoch when it runs dry."""
        k = self.keys
        got = [_s(x) for x in (await self.redis.lpop(k.epoch_queue, count) or [])]
        if len(got) < count:  # at most one refill per call: a tiny pool gives fewer than asked
            epoch = int(await self.redis.get(k.epoch) or 0)
            ids = sorted(_s(x) for x in await self.redis.hkeys(k.prompts))
            if not ids:
                return got
            await self._run("refill_epoch", [k.epoch_queue, k.epoch],
                            [epoch, *shuffle(ids, seed * 1_000_003 + epoch)])
            more = await self.redis.lpop(k.epoch_queue, count - len(got)) or []
            got += [_s(x) for x in more]
        return got

    @_unavailable_on_redis_error
    async def random_prompts(self, count: int) -> list[str]:
        """Up to `count` distinct prompt ids drawn uniformly (a candidate pool for dps/mopps)."""
        return [_s(x) for x in await self.redis.hrandfield(self.keys.prompts, count) or []]

    @_unavailable_on_redis_error
    async def unpop_epoch(self, pids: list[str]) -> None:
        """Give back prompt ids that were popped but not opened (front of the queue, in order)."""
        if pids:
            await self.redis.lpush(self.keys.epoch_queue, *reversed(pids))

    # --- groups and leases ----------------------------------------------------------------------

    @_unavailable_on_redis_error
    async def open_groups(self, now: float, flow_target: int,
                          groups: list[tuple[str, str, GroupPlan]], commit: str,
                          skipped: int = 0, audit_fraction: float = 0.0, seed: int = 0) -> int:
        """Open (group id, prompt id, plan) in order while flow control allows; returns how many
        were consumed (opened, or passed over as disabled/deleted): 0 while paused or draining.

        About `audit_fraction` of them (chosen by a hash of seed, prompt and visit) run on to k
        where SARA would abandon them, so the run measures what abandoning loses.
        """
        k = self.keys
        specs = [{"gid": gid, "pid": pid, "k": plan.k, "thr_f": plan.after_failures,
                  "thr_s": plan.after_successes, "issue": plan.initial_issue,
                  "pf": [repr(x) for x in plan.p_eff_fail],
                  "ps": [repr(x) for x in plan.p_eff_success],
                  "deliver_sat": int(plan.deliver_saturated), "commit": commit}
                 for gid, pid, plan in groups]
        keys = [k.stats, k.open_groups, k.ready, k.pending, k.slots, k.group_states,
                k.group_prompt, k.posteriors, k.run_state, k.prompts_off, k.open_yield, k.wake,
                *(k.group(gid) for gid, _, _ in groups)]
        return int(await self._run("open_groups", keys,
                                   [now, flow_target, json.dumps(specs), skipped,
                                    repr(float(audit_fraction)), seed]))

    @_unavailable_on_redis_error
    async def expire_leases(self, now: float, limit: int = 1000) -> int:
        """Re-queue rollouts whose lease expired; returns how many."""
        k = self.keys
        return int(await self._run("expire_leases", [k.inflight, k.slots, k.pending, k.stats,
                                                    k.wake],
                                   [now, limit]))

    @_unavailable_on_redis_error
    async def lease(self, now: float, worker_id: str, lease_id: str, max_rollouts: int,
                    expires_at: float, key_ttl_s: int, backend: str | None
                    ) -> tuple[list[LeasedRollout], list[str]]:
        """Lease pending rollouts to a worker; returns (rollouts, cancel list)."""
        rollouts, cancel, _ = await self.lease_with_policy(now, worker_id, lease_id, max_rollouts,
                                                           expires_at, key_ttl_s, backend)
        return rollouts, cancel

    @_unavailable_on_redis_error
    async def lease_with_policy(self, now: float, worker_id: str, lease_id: str,
                                max_rollouts: int, expires_at: float, key_ttl_s: int,
                                backend: str | None, expire_limit: int = 0
                                ) -> tuple[list[LeasedRollout], list[str], PolicyInfo]:
        """`lease`, plus the policy in force, after first re-queueing up to `expire_limit`
        rollouts whose lease expired (as `expire_leases`): one round trip where a lease call
        took three."""
        k = self.keys
        keys = [k.pending, k.slots, k.inflight, k.stats, k.cancels, k.lease(lease_id),
                k.lease_rollouts(lease_id), k.workers, k.group_prompt, k.prompts, k.worker_info,
                k.policy, k.run_state, k.prompts_retired, k.wake]
        flat, cancel, version, checkpoint = await self._run(
            "lease", keys, [now, worker_id, lease_id, max_rollouts, expires_at, key_ttl_s,
                            backend or "", expire_limit])
        rollouts = []
        for i in range(0, len(flat), 3):
            rid, pid = _s(flat[i]), _s(flat[i + 1])
            group_id, _ = split_rollout_id(rid)  # type: ignore[misc]
            rollouts.append(LeasedRollout(rid, group_id, pid, _leased_prompt(flat[i + 2])))
        policy = PolicyInfo(version=stored_int(version), checkpoint=_s(checkpoint) or None)
        return rollouts, _s(cancel).split(), policy

    @_unavailable_on_redis_error
    async def heartbeat(self, now: float, worker_id: str, lease_id: str,
                        expires_at: float, key_ttl_s: int) -> list[str]:
        """Extend a lease; returns the worker's cancel list."""
        k = self.keys
        keys = [k.lease(lease_id), k.lease_rollouts(lease_id), k.inflight, k.slots, k.cancels,
                k.workers]
        out = await self._run("heartbeat", keys, [now, worker_id, lease_id, expires_at,
                                                  key_ttl_s])
        status = _s(out[0])
        if status == "unknown":
            raise NotFound("unknown_lease", f"no lease with id {lease_id!r} (it may have expired)")
        if status == "not_yours":
            raise Conflict("lease_owner", f"lease {lease_id!r} belongs to worker {_s(out[1])!r}")
        return _s(out[1]).split()

    @_unavailable_on_redis_error
    async def apply_results(self, now: float, worker_id: str, results: list[RolloutResult],
                            successes: list[int], decay: float, alpha0: float, beta0: float,
                            retention_s: float, half_life: float = math.inf, *,
                            report_id: str | None = None, report_ttl_s: int = 0,
                            holder_only: bool = False, group_size: int = 0) -> AppliedResults:
        """Apply results atomically; UnknownRollouts (nothing applied) if any id is unknown.

        Posteriors decay by `decay` per policy version and halve every `half_life` epochs of
        the pool (see `pool_clock`; inf: never).

        `successes` holds 1/0 per result, -1 for an aborted rollout (no outcome learned) or -2
        for a worker error (no outcome, until the third on one slot: then a failure). With a
        `report_id`, the answer is kept `report_ttl_s` in the same script, and a report sent again
        with that id gets it back (`replayed`) and changes nothing. `holder_only` (an
        authenticated worker id) ignores results for rollouts another worker holds.
        """
        k = self.keys
        results = await self._with_lease_versions(worker_id, results)
        ttl = report_ttl_s if report_id else 0
        # Lua cannot read "inf" portably: 0 stands for no half-life
        lua_half_life = repr(half_life) if math.isfinite(half_life) else 0
        args: list[Any] = [now, worker_id, decay, alpha0, beta0, retention_s, lua_half_life,
                           len(results), ttl, int(holder_only)]
        group_index = _result_args(results, successes, args, base=19)  # KEYS 1..18: below
        args.append(group_size)  # the p_eff tables up to k come with each group's one read
        keys = [k.slots, k.inflight, k.pending, k.stats, k.open_groups, k.ready, k.posteriors,
                k.cancels, k.abandon_hist, k.workers, k.worker_info, k.policy, k.gc,
                k.group_states, k.prompts, k.report(worker_id, report_id or ""), k.open_yield,
                k.wake, *(k.group(g) for g in group_index)]
        out = await self._run("apply_results", keys, args)
        if _s(out[0]) == "unknown":
            raise UnknownRollouts([_s(x) for x in out[1]])
        replayed = _s(out[0]) == "replay"
        if replayed:  # the stored answer: cjson writes an empty list as {}
            out = ["ok", *[v or [] if isinstance(v, (list, dict)) else v
                           for v in json.loads(_s(out[1]))]]
        flat = [_s(x) for x in out[4]]
        decisions = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        return AppliedResults(int(out[1]), int(out[2]), int(out[3]), decisions,
                              _s(out[5]).split(), int(out[6]), replayed)

    async def _with_lease_versions(self, worker_id: str, results: list[RolloutResult]
                                   ) -> list[RolloutResult]:
        """`results`, each without a policy_version given the version its lease was granted
        under (the current one when the worker no longer holds that rollout)."""
        missing = [r.rollout_id for r in results if r.policy_version is None]
        if not missing:
            return results
        states = await self.slot_states(missing)
        leases = {rid: st.split("|")[1] for rid, st in zip(missing, states)
                  if st and st.startswith("l|") and st.split("|", 2)[2] == worker_id}
        pipe = self.redis.pipeline(transaction=False)
        for lid in leases.values():
            pipe.hget(self.keys.lease(lid), "policy_version")
        pipe.hget(self.keys.policy, "version")
        *granted, current = await pipe.execute()
        versions = dict(zip(leases, granted))
        return [r if r.policy_version is not None else r.model_copy(update={
                    "policy_version": stored_int(versions.get(r.rollout_id) or current)})
                for r in results]

    # --- batches and policy ---------------------------------------------------------------------

    @_unavailable_on_redis_error
    async def form_batch(self, now: float, size: int, ack_deadline: float, max_staleness: int,
                         rollout_cap: int | None, batch_id: str, retention_s: float
                         ) -> tuple[str, str | None]:
        """('new'|'redeliver', batch id) or ('none', None)."""
        k = self.keys
        keys = [k.ready, k.unacked, k.stats, k.policy, k.batch(batch_id), k.batch_window,
                k.recent_batches, k.group_states, k.gc, k.run_state, k.open_groups, k.wake]
        out = await self._run("form_batch", keys, [now, size, ack_deadline, max_staleness,
                                                   rollout_cap or 0, batch_id, retention_s])
        kind = _s(out[0])
        return kind, (_s(out[1]) if len(out) > 1 else None)

    @_unavailable_on_redis_error
    async def read_batch(self, batch_id: str) -> dict[str, str]:
        """The batch hash; NotFound when it does not exist."""
        raw = await self.redis.hgetall(self.keys.batch(batch_id))
        if not raw:
            raise NotFound("unknown_batch", f"no batch with id {batch_id!r}")
        return {_s(a): _s(b) for a, b in raw.items()}

    @_unavailable_on_redis_error
    async def note_batch_estimate(self, batch_id: str, estimate: dict) -> None:
        """Record, once, figures as they stood when the batch was formed: a redelivery of the
        batch then carries the same ones."""
        await self.redis.hsetnx(self.keys.batch(batch_id), "estimate", json.dumps(estimate))

    @_unavailable_on_redis_error
    async def read_groups(self, group_ids: list[str]) -> list[dict[str, str]]:
        """Raw hash of each group (empty dict for a group that no longer exists)."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in group_ids:
            pipe.hgetall(self.keys.group(gid))
        rows = await pipe.execute()
        return [{_s(a): _s(b) for a, b in row.items()} for row in rows]

    @_unavailable_on_redis_error
    async def read_group_results(self, group_ids: list[str], k: int
                                 ) -> list[tuple[str, list[dict[str, Any]]]]:
        """(prompt id, results in slot order) per group: only what a batch carries."""
        fields = ["prompt_id", *(f"r:{i}" for i in range(k))]
        pipe = self.redis.pipeline(transaction=False)
        for gid in group_ids:
            pipe.hmget(self.keys.group(gid), fields)
        rows = await pipe.execute()
        return [(_s(row[0] or b""), [decode_result(r) for r in row[1:] if r is not None])
                for row in rows]

    @_unavailable_on_redis_error
    async def read_prompts(self, pids: list[str]) -> list[dict[str, Any] | None]:
        """Prompt content of each id (None where unknown)."""
        if not pids:
            return []
        raw = await self.redis.hmget(self.keys.prompts, pids)
        if any(r is None for r in raw):  # a deleted prompt's groups in flight still deliver
            retired = await self.redis.hmget(self.keys.prompts_retired, pids)
            raw = [r if r is not None else old for r, old in zip(raw, retired)]
        return [decode_prompt(r) if r else None for r in raw]

    @_unavailable_on_redis_error
    async def ack(self, now: float, batch_id: str, retention_s: float) -> bool:
        """Ack a batch; True when it was acked before. NotFound if unknown."""
        k = self.keys
        out = _s(await self._run("ack_batch", [k.batch(batch_id), k.unacked, k.stats,
                                               k.group_states, k.gc],
                                 [now, batch_id, retention_s]))
        if out == "unknown":
            raise NotFound("unknown_batch", f"no batch with id {batch_id!r}")
        return out == "already"

    @_unavailable_on_redis_error
    async def get_policy(self) -> PolicyInfo:
        """The current policy version and checkpoint (version 0 before any publish)."""
        raw = await self.redis.hmget(self.keys.policy, ["version", "checkpoint"])
        checkpoint = _s(raw[1]) if raw[1] else None
        return PolicyInfo(version=stored_int(raw[0]), checkpoint=checkpoint or None)

    @_unavailable_on_redis_error
    async def publish_policy(self, now: float, version: int, checkpoint: str | None) -> PolicyInfo:
        """Publish a strictly newer version; Conflict otherwise."""
        out = await self._run("publish_policy", [self.keys.policy],
                              [version, checkpoint or "", now])
        if _s(out[0]) == "stale":
            raise Conflict("stale_policy_version",
                           f"version {version} is not newer than the current "
                           f"{stored_int(out[1])}")
        return PolicyInfo(version=version, checkpoint=checkpoint)

    @_unavailable_on_redis_error
    async def group_state(self, group_ids: list[str]) -> list[str | None]:
        """Lifecycle state of each group (None where unknown)."""
        if not group_ids:
            return []
        raw = await self.redis.hmget(self.keys.group_states, group_ids)
        return [_s(r) if r else None for r in raw]

    @_unavailable_on_redis_error
    async def slot_states(self, rollout_ids: list[str]) -> list[str | None]:
        """Raw slot state of each rollout id."""
        if not rollout_ids:
            return []
        raw = await self.redis.hmget(self.keys.slots, rollout_ids)
        return [_s(r) if r else None for r in raw]

    @_unavailable_on_redis_error
    async def collect_garbage(self, now: float, limit: int = 200) -> int:
        """Delete finished groups whose retention ran out; returns how many."""
        k = self.keys
        due = [_s(g) for g in await self.redis.zrangebyscore(k.gc, "-inf", now, 0, limit)]
        if not due:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for gid in due:
            pipe.hget(k.group(gid), "issued")
        issued = await pipe.execute()
        # one command per key for the whole round, not five per group
        slots = [f"{gid}:{i}" for gid, n in zip(due, issued) for i in range(int(n or 0))]
        pipe = self.redis.pipeline(transaction=False)
        if slots:
            pipe.hdel(k.slots, *slots)
        pipe.delete(*(k.group(gid) for gid in due))
        pipe.hdel(k.group_states, *due)
        pipe.hdel(k.group_prompt, *due)
        pipe.zrem(k.gc, *due)
        await pipe.execute()
        return len(due)

    @_unavailable_on_redis_error
    async def prune_workers(self, seen_before: float, limit: int = 200) -> int:
        """Forget workers last seen before `seen_before` (set, info, cancel list); how many."""
        k = self.keys
        return int(await self._run("prune_workers", [k.workers, k.worker_info, k.cancels],
                                   [seen_before, limit]))

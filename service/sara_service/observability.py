"""What operators read: one group's state and /stats as JSON (/metrics renders the same snapshot:
see `metrics`)."""

from __future__ import annotations

import json
from typing import Any

from sara_client.models import (
    Counters, Derived, GroupOut, GroupSlot, PolicyInfo, Queues, StatsResponse, WorkerStats,
)

from . import ds_estimate as ds
from .errors import NotFound
from .keys import rollout_id
from .settings import Settings
from .store import Store, _s, _unavailable_on_redis_error, stored_int

_SLOT_STATES = {"p": "pending", "d": "done", "c": "cancelled"}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


async def group_view(store: Store, group_id: str) -> GroupOut:
    """One group's state, counters, thresholds and per-slot rollouts."""
    (row,) = await store.read_groups([group_id])
    (state,) = await store.group_state([group_id])
    if not row or state is None:
        raise NotFound("unknown_group", f"no group with id {group_id!r} (it may have expired)")
    k = int(row["k"])
    rids = [rollout_id(group_id, i) for i in range(k)]
    slots = []
    for i, (rid, raw) in enumerate(zip(rids, await store.slot_states(rids))):
        worker, reward = None, None
        if raw is None:
            kind = "unissued"
        elif raw.startswith("l|"):
            kind, worker = "leased", raw.split("|", 2)[2]
        else:
            kind = _SLOT_STATES[raw[0]]
        if f"r:{i}" in row:
            reward = json.loads(row[f"r:{i}"]).get("reward")
        slots.append(GroupSlot(rollout_id=rid, state=kind, worker_id=worker, reward=reward))
    return GroupOut(group_id=group_id, prompt_id=row["prompt_id"], state=state, k=k,
                    issued=int(row["issued"]), done=int(row["done"]), successes=int(row["s"]),
                    failures=int(row["f"]), cancelled=int(row["cancelled"]),
                    abandon_after_failures=int(row["thr_f"]),
                    abandon_after_successes=int(row["thr_s"]), p_eff=float(row["p_eff"]),
                    created_at=float(row["created_at"]), rollouts=slots)


@_unavailable_on_redis_error
async def _read_raw(store: Store) -> list[Any]:
    k = store.keys
    pipe = store.redis.pipeline(transaction=False)
    pipe.hgetall(k.stats)
    pipe.hgetall(k.abandon_hist)
    pipe.zcard(k.inflight)
    pipe.zrange(k.open_groups, 0, -1, withscores=True)
    pipe.llen(k.ready)
    pipe.zcard(k.unacked)
    pipe.zrange(k.workers, 0, -1, withscores=True)
    pipe.hgetall(k.worker_info)
    pipe.lrange(k.recent_batches, 0, 19)
    return await pipe.execute()


# counters renamed for what they hold; a namespace written by an older release keeps its figures
_RENAMED = {"rollouts_saved_vs_ds": "rollouts_not_spent_on_abandoned_groups"}


def _counters(raw: dict) -> Counters:
    fields = {_s(a): _s(b) for a, b in raw.items()}
    for old, new in _RENAMED.items():
        if old in fields and new not in fields:
            fields[new] = fields.pop(old)
    known = Counters.model_fields
    return Counters(**{f: (float(v) if known[f].annotation is float else stored_int(v))
                       for f, v in fields.items() if f in known})


def ds_estimate(c: Counters, k: int) -> ds.Interval:
    """What Dynamic Sampling would spend per effective group on this run's prompts, with its
    95% interval, from the decided groups and the audited ones (see `ds_estimate`)."""
    return ds.ds_rollouts_per_effective_group(_tally(c), k)


@_unavailable_on_redis_error
async def read_counters(store: Store) -> Counters:
    """The namespace's counters as they stand."""
    return _counters(await store.redis.hgetall(store.keys.stats))


def _tally(c: Counters) -> ds.GroupTally:
    return ds.tally_from_counters(c.groups_committed, c.groups_abandoned, c.groups_completed_pure,
                                  c.audits_mixed, c.audits_pure)


def derive(c: Counters, k: int) -> Derived:
    """Efficiency figures from the counters (DESIGN.md section 4).

    The DS figure and the net saving are estimates from audit sampling, each with its 95%
    interval; the false-abandon rate is measured on the audited groups. The prior's bound and
    the posterior model's estimate of false abandons stay beside them for comparison.
    """
    decided = c.groups_committed + c.groups_abandoned + c.groups_completed_pure
    tally = _tally(c)
    ds_figure = ds.ds_rollouts_per_effective_group(tally, k)
    saving = ds.net_saving(c.rollouts_completed, c.groups_committed, ds_figure)
    saved = ds.net_rollouts_saved(c.rollouts_completed, c.groups_committed, ds_figure)
    false_abandons = ds.false_abandon_rate(tally)
    return Derived(
        rollouts_in_flight=c.rollouts_issued - c.rollouts_completed - c.rollouts_cancelled,
        useful_fraction=_ratio(c.rollouts_delivered, c.rollouts_completed),
        rollouts_per_effective_group=_ratio(c.rollouts_completed, c.groups_delivered),
        ds_rollouts_per_effective_group=ds_figure.point,
        ds_rollouts_per_effective_group_low=ds_figure.low,
        ds_rollouts_per_effective_group_high=ds_figure.high,
        net_saving_vs_ds=saving.point, net_saving_vs_ds_low=saving.low,
        net_saving_vs_ds_high=saving.high,
        net_rollouts_saved_vs_ds=saved.point, net_rollouts_saved_vs_ds_low=saved.low,
        net_rollouts_saved_vs_ds_high=saved.high,
        false_abandon_rate=false_abandons.point, false_abandon_rate_low=false_abandons.low,
        false_abandon_rate_high=false_abandons.high,
        audit_cost_fraction=_ratio(c.audit_rollouts, c.rollouts_completed),
        abandon_rate=_ratio(c.groups_abandoned, decided),
        expected_false_abandon_rate=_ratio(c.expected_false_abandons, c.groups_abandoned),
        estimated_false_abandon_rate=_ratio(c.estimated_false_abandons, c.groups_abandoned))


def _workers(scores: list, info_raw: dict, now: float, stale_s: float) -> list[WorkerStats]:
    info = {_s(a): _s(b) for a, b in info_raw.items()}
    out = []
    for wid_raw, last_seen in scores:
        wid = _s(wid_raw)
        completed = stored_int(info.get(f"{wid}|completed"))
        tokens = stored_int(info.get(f"{wid}|tokens"))
        first = float(info.get(f"{wid}|first_seen", last_seen))
        # a rate over a few milliseconds of activity says nothing: wait for a second of it
        span = last_seen - first if last_seen - first >= 1.0 else 0.0
        version = info.get(f"{wid}|policy_version")
        out.append(WorkerStats(
            worker_id=wid, backend=info.get(f"{wid}|backend"), last_seen=last_seen,
            policy_version=stored_int(version) if version not in (None, "-1") else None,
            stale=now - last_seen > stale_s, rollouts_completed=completed,
            tokens_generated=tokens, leases=stored_int(info.get(f"{wid}|leases")),
            rollouts_per_s=_ratio(completed, span), tokens_per_s=_ratio(tokens, span)))
    return out


async def stats_view(store: Store, settings: Settings, now: float,
                     auto: Any = None) -> StatsResponse:
    """Everything /stats shows, read in one pipelined round trip; `auto` is the scheduler's
    AutoPricer under tau_low=auto (its price and thresholds in force)."""
    (stats, hist, leased, open_scores, ready, unacked, worker_scores, worker_info,
     recent) = await _read_raw(store)
    counters = _counters(stats)
    derived = derive(counters, settings.group_size)
    queues = Queues(pending=max(0, derived.rollouts_in_flight - leased), leased=leased,
                    open_groups=len(open_scores),
                    expected_yield_open=sum(score for _, score in open_scores),
                    ready_groups=ready, unacked_batches=unacked,
                    flow_target=settings.prefetch_batches * settings.batch_size)
    policy: PolicyInfo = await store.get_policy()
    return StatsResponse(
        namespace=settings.namespace, run_state=await store.run_state(), now=now, policy=policy,
        config=settings.public_config(),
        counters=counters, derived=derived, queues=queues,
        abandon_histogram={_s(a): int(b) for a, b in sorted(hist.items(), key=lambda x: int(x[0]))},
        workers=_workers(worker_scores, worker_info, now, settings.worker_stale_s),
        recent_batches=[json.loads(r) for r in recent],
        auto_thresholds=auto.snapshot() if auto is not None else None)

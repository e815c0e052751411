"""What operators read: one group's state and /stats as JSON (/metrics renders the same snapshot:
see `metrics`). Everything is read through the store's public reads (`store_reads`); the field
names come from `redis_format`."""

from __future__ import annotations

import json
from typing import Any

from sara_client.models import (GroupOut, GroupSlot, PolicyInfo, Counters, Derived, Queues,
                                StatsResponse, WorkerStats)

from ..math import ds_estimate as ds
from ..errors import NotFound
from ..store.keys import rollout_id
from ..store.redis_format import GroupField as G
from ..math.reward_levels import non_binary_warning
from ..settings import Settings
from ..store.store import Store
from ..store.codec import stored_int
from ..store.run import StatsSnapshot, WorkerRow


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


async def group_view(store: Store, group_id: str) -> GroupOut:
    """One group's state, counters, thresholds and per-slot rollouts."""
    (row,) = await store.groups.read_groups([group_id])
    (state,) = await store.groups.group_state([group_id])
    if not row or state is None:
        raise NotFound("unknown_group", f"no group with id {group_id!r} (it may have expired)")
    k = int(row[G.k])
    rids = [rollout_id(group_id, i) for i in range(k)]
    slots = []
    for i, (rid, slot) in enumerate(zip(rids, await store.leases.slot_states(rids))):
        # a done slot's worker_id names the holder of a cancelled copy, not who answered it
        worker = slot.worker_id if slot.kind == "leased" else None
        result = row.get(G.result(i))
        reward = json.loads(result).get("reward") if result is not None else None
        slots.append(GroupSlot(rollout_id=rid, state=slot.kind, worker_id=worker, reward=reward))
    return GroupOut(group_id=group_id, prompt_id=row[G.prompt_id], state=state, k=k,
                    issued=int(row[G.issued]), done=int(row[G.done]),
                    successes=int(row[G.successes]), failures=int(row[G.failures]),
                    cancelled=int(row[G.cancelled]),
                    abandon_after_failures=int(row[G.abandon_after_failures]),
                    abandon_after_successes=int(row[G.abandon_after_successes]),
                    p_eff=float(row[G.p_eff]), created_at=float(row[G.created_at]),
                    rollouts=slots)


def _counters(fields: dict[str, str]) -> Counters:
    known = Counters.model_fields
    return Counters(**{f: (float(v) if known[f].annotation is float else stored_int(v))
                       for f, v in fields.items() if f in known})


def ds_estimate(c: Counters, k: int) -> ds.Interval:
    """What Dynamic Sampling would spend per effective group on this run's prompts, with its
    95% interval, from the decided groups and the audited ones (see `ds_estimate`)."""
    return ds.ds_rollouts_per_effective_group(_tally(c), k)


async def read_counters(store: Store) -> Counters:
    """The namespace's counters as they stand."""
    return _counters(await store.run.counters())


def _tally(c: Counters) -> ds.GroupTally:
    return ds.tally_from_counters(c.groups_committed, c.groups_abandoned, c.groups_completed_pure,
                                  c.audits_mixed, c.audits_pure)


def committed_groups_of_k(c: Counters, k: int) -> float:
    """Committed groups in DS's unit, groups of k: each weighs the mean delivered group size over
    k, so a Pilot-Commit group of 4k counts 4 and a var_k or partial group of n counts n / k
    (the count itself when every group is k). DS's figure is per group of k."""
    if not c.groups_delivered:
        return float(c.groups_committed)
    return c.groups_committed * c.rollouts_delivered / (c.groups_delivered * k)


def derive(c: Counters, k: int) -> Derived:
    """Efficiency figures from the counters (docs/architecture.md, "Counters and figures").

    The DS figure and the net saving are estimates from audit sampling, each with its 95%
    interval; the false-abandon rate is measured on the audited groups. The prior's bound and
    the posterior model's estimate of false abandons stay beside them for comparison.
    """
    decided = c.groups_committed + c.groups_abandoned + c.groups_completed_pure
    tally = _tally(c)
    ds_figure = ds.ds_rollouts_per_effective_group(tally, k)
    committed = committed_groups_of_k(c, k)
    saving = ds.net_saving(c.rollouts_completed, committed, ds_figure)
    saved = ds.net_rollouts_saved(c.rollouts_completed, committed, ds_figure)
    false_abandons = ds.false_abandon_rate(tally)
    return Derived(
        rollouts_in_flight=c.rollouts_issued - c.rollouts_completed - c.rollouts_cancelled,
        useful_fraction=_ratio(c.rollouts_delivered, c.rollouts_completed),
        rollouts_per_effective_group=_ratio(c.rollouts_completed, c.groups_delivered),
        delivered_age_versions=_ratio(c.delivered_lag_versions, c.groups_delivered),
        rollouts_per_group_of_k=_ratio(c.rollouts_completed * k, c.rollouts_delivered),
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


def _workers(rows: list[WorkerRow], now: float, stale_s: float) -> list[WorkerStats]:
    out = []
    for row in rows:
        info, last_seen = row.info, row.last_seen
        completed = stored_int(info.get("completed"))
        tokens = stored_int(info.get("tokens"))
        first = float(info.get("first_seen", last_seen))
        # stopped on request (stop_worker.lua) and not seen since
        stopped = float(info.get("stopped_at", "-inf")) >= last_seen
        stale = not stopped and now - last_seen > stale_s
        # a rate over a few milliseconds of activity says nothing: wait for a second of it; a
        # stale or stopped worker produces nothing now, whatever it did while it was seen
        span = last_seen - first if last_seen - first >= 1.0 and not (stale or stopped) else 0.0
        version = info.get("policy_version")
        live = not (stale or stopped)
        out.append(WorkerStats(
            worker_id=row.worker_id, backend=info.get("backend"), last_seen=last_seen,
            last_seen_ago_s=max(0.0, now - last_seen),
            policy_version=stored_int(version) if version not in (None, "-1") else None,
            stale=stale, stopped=stopped, rollouts_completed=completed,
            tokens_generated=tokens, leases=stored_int(info.get("leases")),
            rollouts_per_s=_ratio(completed, span), tokens_per_s=_ratio(tokens, span),
            engine_occupancy=float(info["occupancy"]) if live and "occupancy" in info else None,
            engine_slots=stored_int(info["slots"]) if "slots" in info else None))
    return out


def fleet_occupancy(workers: list[WorkerStats]) -> tuple[float | None, int]:
    """The live workers' engines as they report them: occupancy weighted by slots, and the
    slots (None and 0 while none has reported)."""
    loads = [(w.engine_occupancy, w.engine_slots) for w in workers
             if w.engine_occupancy is not None and w.engine_slots]
    slots = sum(s for _, s in loads)
    return (sum(o * s for o, s in loads) / slots if slots else None), slots


def small_pool_warning(enabled_prompts: int, batch_size: int) -> str | None:
    """What to change when the pool cannot fill a batch: a batch holds `batch_size` groups of
    distinct prompts and a prompt has one group open at a time, so fewer enabled prompts than
    that never make a batch (None when the pool is large enough)."""
    if enabled_prompts >= batch_size:
        return None
    return (f"only {enabled_prompts} enabled prompts, fewer than SARA_BATCH_SIZE={batch_size}: "
            "a batch holds groups of distinct prompts and a prompt has one group open at a "
            "time, so no batch can form; add prompts (sara load, POST /prompts), enable "
            f"disabled ones, or lower SARA_BATCH_SIZE to at most {enabled_prompts}")


def _warnings(snap: StatsSnapshot, settings: Settings) -> list[str]:
    """The outcome view's warning once a reward other than 0/1 has arrived, and the pool's
    when it is too small for a batch."""
    out = []
    if snap.non_binary_reward is not None and settings.effective == "outcome":
        out.append(non_binary_warning(snap.non_binary_reward))
    if snap.enabled_prompts is not None:
        small = small_pool_warning(snap.enabled_prompts, settings.batch_size)
        if small:
            out.append(small)
    return out


async def stats_view(store: Store, settings: Settings, now: float,
                     auto: Any = None, strategy: dict[str, Any] | None = None) -> StatsResponse:
    """Everything /stats shows, read in one pipelined round trip; `auto` is the scheduler's
    AutoPricer under tau_low=auto (its price and thresholds in force), `strategy` what the
    scheduler's strategies add (Scheduler.strategy_stats)."""
    snap = await store.run.stats_snapshot()
    counters = _counters(snap.counters)
    derived = derive(counters, settings.group_size)
    workers = _workers(snap.workers, now, settings.stale_after_s)
    occupancy, slots = fleet_occupancy(workers)
    queues = Queues(pending=max(0, derived.rollouts_in_flight - snap.leased), leased=snap.leased,
                    open_groups=len(snap.open_group_scores),
                    expected_yield_open=sum(snap.open_group_scores),
                    ready_groups=snap.ready_groups, unacked_batches=snap.unacked_batches,
                    flow_target=settings.prefetch_batches * settings.batch_size,
                    engine_occupancy=occupancy, engine_slots=slots)
    policy: PolicyInfo = await store.policy.get_policy()
    view = StatsResponse(
        namespace=settings.namespace, run_state=await store.run.run_state(), now=now, policy=policy,
        config=settings.public_config(),
        counters=counters, derived=derived, queues=queues,
        abandon_histogram=dict(sorted(snap.abandon_hist.items(), key=lambda x: int(x[0]))),
        workers=workers,
        recent_batches=snap.recent_batches,
        reward_levels=dict(sorted(snap.reward_levels.items(), key=lambda x: int(x[0]))),
        warnings=_warnings(snap, settings),
        auto_thresholds=auto.snapshot() if auto is not None else None,
        strategy=strategy or {})
    view.warnings += await run_warnings(store, settings, now)
    return view


def trainer_wait_warning(ready_groups: int, batch_size: int, trainer_seen: float | None,
                         now: float, warn_after_s: float) -> str | None:
    """'waiting for a trainer' when a batch's worth of groups is ready and no trainer has asked
    for a batch (or acked one) for `warn_after_s`: workers then idle once flow control is full,
    and nothing in their logs would say why. None otherwise."""
    if ready_groups < batch_size:
        return None
    idle = None if trainer_seen is None else now - trainer_seen
    if idle is not None and idle < warn_after_s:
        return None
    since = "no trainer has asked for a batch yet" if idle is None else \
        f"no trainer has asked for a batch for {idle:.0f} s"
    return (f"waiting for a trainer: {ready_groups} groups are ready (a batch is {batch_size}) "
            f"and {since}; workers idle once flow control is full. Start one that pulls and "
            "acks batches: `sara consume` (prints them), `sara train --model DIR`, or your "
            "trainer through the SDK")


def scarce_effective_warning(ready_groups: int, batch_size: int, trainer_seen: float | None,
                             last_batch: float | None, committed: int, decided: int,
                             now: float, warn_after_s: float) -> str | None:
    """'waiting for mixed groups' when a trainer is asking for a batch, fewer than a batch of
    groups is ready, no batch has formed for `warn_after_s` (or ever), and fewer than half of the
    groups decided so far (at least a batch's worth) came out mixed: the pool holds few prompts
    the policy gets right only sometimes. The run waits (nothing is lost); this says why. None
    otherwise."""
    asking = trainer_seen is not None and now - trainer_seen < warn_after_s
    stalled = last_batch is None or now - last_batch >= warn_after_s
    if not (asking and stalled) or ready_groups >= batch_size or decided < batch_size \
            or committed >= decided / 2:
        return None   # too early to say, or mixed groups come and generation is the wait
    return (f"waiting for mixed groups: a trainer asks for a batch of {batch_size}, "
            f"{ready_groups} groups are ready, and {committed} of the {decided} groups decided "
            f"so far came out mixed ({100 * committed / decided:.0f}%; the rest all-fail or "
            "all-success). Nothing is lost and the run goes on; add prompts the policy solves "
            "only sometimes to make batches faster")


async def run_warnings(store: Store, settings: Settings, now: float) -> list[str]:
    """What holds the run up now (GET /run, /stats): ready groups no trainer pulls, or a trainer
    waiting on a pool that gives few mixed groups."""
    ready, seen = await store.run.trainer_activity()
    last_batch, committed, decided = await store.run.batch_supply()
    found = (trainer_wait_warning(ready, settings.batch_size, seen, now,
                                  settings.trainer_wait_warn_s),
             scarce_effective_warning(ready, settings.batch_size, seen, last_batch, committed,
                                      decided, now, settings.trainer_wait_warn_s))
    return [w for w in found if w]

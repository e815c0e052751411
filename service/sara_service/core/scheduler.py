"""The scheduler: turns API calls into store transitions, using the pure allocation math.

It holds no state of its own beyond caches derived from settings, so any number of replicas can
serve one namespace. The clock is injected (tests move it by hand); a long poll waits for the
run's wake stream (see `wake`), re-checking at least every `poll_interval_s`, until its deadline.

The strategies are objects it dispatches to, each behind one small interface: the allocation
policy (`allocators`: how a group is planned, committed, delivered), the prompt selection
(`selections`: which prompts are drawn), the group sizing (`sizing`) and the plans (`planning`:
posteriors now, the reward levels in use, the price under tau_low=auto). What a result does to a
group runs in Redis, in the policy's Lua library (`store/lua/_policy_*.lua`).

It is past 400 lines because the four resources it serves (prompts, leases, results, batches)
share the long-poll machinery (tickets on the wake stream, deadlines, shutdown) and the
opening path; what is not shared lives in those modules and in `answers` and `observability`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
from typing import Any, Callable

from sara_client.models import (AckResponse, AddPromptsRequest, AddPromptsResponse, Batch,
                                BatchStats, GroupDecision, HeartbeatResponse, LeaseRequest,
                                LeaseResponse, NextBatchRequest, PromptIn, ResultsRequest,
                                ResultsResponse, SamplingParams, prompt_json)

from ..errors import Conflict, Unfillable
from ..math.allocation import GroupPlan
from ..math.reward_levels import first_non_binary, level_of, non_binary_warning
from ..settings import Settings
from ..store.codec import stored_int
from ..store.leases import Opening
from ..store.redis_format import FORMAT_VERSION, split_ids
from ..store.results import Learning, Report
from ..store.store import Store
from ..store.wake_stream import WakeStream
from .allocators import allocator_for
from .answers import batch_answer, lease_answer
from .observability import ds_estimate, read_counters, small_pool_warning
from .planning import Planner
from .selections import selection_for
from .sizing import sizing_for
from .wake import Ticket, Wakeups

log = logging.getLogger("sara.service")
Clock = Callable[[], float]
# results that carry no outcome, as apply_results.lua codes them: an aborted rollout (-1) and a
# worker's own error (-2: engine died, server unreachable), which says nothing about the prompt
_NO_OUTCOME = {"abort": -1, "error": -2}
# draws of prompts one lease may make when a selection skipped all of the previous one
SKIP_REDRAWS = 8
EXPIRE_BATCH = 1000  # expired leases a lease call re-queues first (upkeep takes the rest)


def _new_id(prefix: str) -> str:
    """64 random bits in hex: ids minted by many replicas must not collide (a uuid4 object cost
    several times as much, for the same 16 characters)."""
    return prefix + os.urandom(8).hex()


def prompt_id_for(prompt: PromptIn) -> str:
    """A stable id from the content, so re-adding the same prompt without an id is a no-op."""
    content = [prompt.task, prompt_json(prompt.prompt), prompt.answer]  # text: ids as before
    digest = hashlib.sha256(json.dumps(content).encode())
    return "p" + digest.hexdigest()[:20]


class Scheduler:
    """API-level operations of one namespace."""

    def __init__(self, settings: Settings, store: Store, clock: Clock | None = None) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock or time.time
        self.stopping = False  # set on SIGTERM: long polls answer at once, empty
        self.wakeups = Wakeups(WakeStream(store.redis, store.keys.wake))
        rng = random.Random(settings.seed)  # Thompson samples and tie-breaks
        self.allocator = allocator_for(settings)
        self.planner = Planner(settings, self.allocator)
        self.auto = self.planner.auto   # the price under tau_low=auto (None otherwise)
        self.selection = selection_for(settings, store, self.planner, rng)
        self.draws = self.selection.draws
        self.sizing = sizing_for(settings, self.planner)
        # how posteriors learn: fixed by the settings, so built once, not on every report
        self._learning = Learning(settings.prior_alpha, settings.prior_beta,
                                  settings.posterior_decay, settings.posterior_half_life)
        self._known_levels: set[str] = set()  # levels this process has reported or read
        self._warned_non_binary = False  # this process has told the store (the log says it once)
        self._sampling = SamplingParams(temperature=settings.temperature, top_p=settings.top_p,
                                        max_tokens=settings.max_tokens)
        self.format_checked = False  # the stored format is this release's (check_format)
        self._pool_warning: str | None = None  # the small-pool warning last logged

    @property
    def _one_plan_in_order(self) -> bool:
        """Every prompt drawn opens a group under the run's one plan, with no read of its
        history: a uniform prior, and no strategy that reads prompts' posteriors."""
        return self.settings.prior == "uniform" and not any(
            part.reads_history for part in (self.allocator, self.selection, self.sizing))

    async def strategy_stats(self) -> dict[str, Any]:
        """/stats' `strategy`: each strategy's name and what it adds (see their `stats`)."""
        s = self.settings
        out: dict[str, Any] = {"policy": s.policy, "selection": s.selection,
                               "group_sizing": s.group_sizing}
        for part in (self.allocator, self.selection, self.sizing):
            out.update(await part.stats())
        return out

    @property
    def flow_target(self) -> int:
        """Expected effective groups to keep ready or in the making."""
        return self.settings.prefetch_batches * self.settings.batch_size

    @property
    def work_floor(self) -> dict[str, float]:
        """The work floor as the store takes it: the target a short lease may open up to while
        fewer than a batch of groups is ready."""
        return dict(floor_target=self.settings.work_floor * self.flow_target,
                    floor_ready=self.settings.batch_size)

    def begin_shutdown(self) -> None:
        """Answer every long poll now, and every later one at once: the process is stopping.
        Safe from a signal handler."""
        self.stopping = True
        self.wakeups.stop()

    async def _ticket(self, kind: str, deadline: float, need: int = 1) -> Ticket | None:
        """A claim on the next wake-up, taken before the store is checked; None when this
        call will not wait (no time left, or shutting down)."""
        if self.stopping or self.clock() >= deadline:
            return None
        return await self.wakeups.ticket(kind, need)

    async def _wait_for_wake(self, ticket: Ticket | None, kind: str, deadline: float) -> bool:
        """Wait until something of `kind` changes in Redis (any replica), at most
        poll_interval_s; False when the deadline has passed or shutdown has begun."""
        if ticket is None or self.stopping or self.clock() >= deadline:
            self.wakeups.release(ticket)
            return False
        timeout = min(self.settings.poll_interval_s, max(0.0, deadline - self.clock()))
        return await self.wakeups.wait(ticket, kind, timeout) != "stopped"

    # --- prompts ---------------------------------------------------------------------------------

    async def add_prompts(self, req: AddPromptsRequest) -> AddPromptsResponse:
        """Register prompts: ids in request order, how many were new, and which ids were
        already registered with other content (kept as it was)."""
        pairs = [(p.id or prompt_id_for(p), p) for p in req.prompts]
        version = (await self.store.policy.get_policy()).version
        created, differs = await self.store.prompts.add_prompts(pairs, self.settings.prior_alpha,
                                                        self.settings.prior_beta, version)
        return AddPromptsResponse(ids=[pid for pid, _ in pairs], created=created,
                                  content_differs=differs)

    # --- opening groups --------------------------------------------------------------------------

    async def _plans_for(self, pids: list[str]) -> tuple[list[tuple[str, str, GroupPlan]], int]:
        """(group id, prompt id, plan) for the prompts to open, and how many were skipped: by
        the selection's filter, by the allocator's exclusion, or by a plan that skips."""
        await self.planner.refresh_levels(self.store)
        await self.planner.refresh_price(self.store)
        if self._one_plan_in_order:
            plan = self.planner.prior_plan
            if plan.skip:   # Settings refuse this; never open a group issuing nothing
                return [], len(pids)
            return [(_new_id("g"), pid, plan) for pid in pids], 0
        version = (await self.store.policy.get_policy()).version
        clock = await self.store.prompts.pool_clock()
        posts = await self.store.prompts.posteriors(pids)
        keeps = await self.selection.kept(posts, version, clock)
        drawn = [(pid, post) for pid, post, kept in zip(pids, posts, keeps)
                 if kept and not self.allocator.excludes(post)]
        planned, unplanned = self.sizing.plans(drawn, version, clock)
        return ([(_new_id("g"), pid, plan) for pid, plan in planned],
                len(pids) - len(drawn) + unplanned)

    def _opening(self, max_rollouts: int) -> Opening | None:
        """What a lease needs to open groups itself; None unless every group gets the run's one
        plan in epoch order (a uniform prior, epoch selection, a fixed tau_low)."""
        s, plan = self.settings, self.planner.prior_plan
        if not self._one_plan_in_order or self.auto is not None or plan.skip:
            return None
        count = min(self.flow_target, math.ceil(max_rollouts / max(1, plan.initial_issue)))
        return Opening(plan, self.allocator.commit, s.audit_fraction, s.seed,
                       tuple(_new_id("g") for _ in range(count)))

    async def open_groups_for(self, now: float, rollouts_wanted: int) -> int:
        """Open enough new groups to supply about `rollouts_wanted` rollouts, flow permitting.
        When a selection skipped every prompt of a draw (history, GRESO), it draws again, up to
        SKIP_REDRAWS times, so a filter that skips most prompts does not answer a lease empty
        while the epoch still holds prompts it would keep."""
        per_group = max(1, self.planner.prior_plan.initial_issue)
        count = self.sizing.draw_count(rollouts_wanted, per_group, self.flow_target)
        for _ in range(SKIP_REDRAWS):
            pids, ranked_at = await self.selection.draw(count)
            if not pids:
                await self._count_busy(now)
                return 0
            plans, skipped = await self._plans_for(pids)
            opened = await self.store.groups.open_groups(
                now, self.flow_target, plans, self.allocator.commit, skipped,
                self.settings.audit_fraction, self.settings.seed, **self.work_floor,
                skipped_busy=self.draws.take_busy_count())
            await self.selection.give_back([pid for _, pid, _ in plans[opened:]], ranked_at)
            if plans or not skipped:
                return opened
        return 0

    async def _count_busy(self, now: float) -> None:
        """Count the busy prompts a draw passed over when it found nothing to open."""
        busy = self.draws.take_busy_count()
        if busy:
            await self.store.groups.open_groups(now, self.flow_target, [],
                                                self.allocator.commit, 0, skipped_busy=busy)

    # --- workers ---------------------------------------------------------------------------------

    async def lease(self, req: LeaseRequest) -> LeaseResponse:
        """Lease rollouts to a worker, opening groups on demand; long-polls up to wait_s."""
        return LeaseResponse.model_validate_json(await self.lease_json(req))

    async def lease_json(self, req: LeaseRequest) -> bytes:
        """`lease`, answered as the LeaseResponse JSON the route sends (see `answers`)."""
        s = self.settings
        if req.policy_version is not None:
            await self._check_weights(req.policy_version)
        lease_id = _new_id("l")
        deadline = self.clock() + req.wait_s
        key_ttl = self._lease_key_ttl()
        while True:
            ticket = await self._ticket("lease", deadline)
            now = self.clock()
            expires_at = now + s.lease_ttl_s
            # expired leases go back to the queue in the same script (EXPIRE_BATCH at a time);
            # under one plan for every group, the script also opens groups for what the queue
            # lacks; else (or when the epoch ran out) they are opened here, when the script saw
            # room for them, and leased by a second call
            opening = self._opening(req.max_rollouts)
            grant = await self.store.leases.lease_with_policy(
                now, req.worker_id, lease_id, req.max_rollouts, expires_at, key_ttl, req.backend,
                expire_limit=EXPIRE_BATCH, flow_target=self.flow_target, opening=opening,
                engine=req.engine, **self.work_floor)
            leased, cancel, policy = grant.rollouts, grant.cancel, grant.policy
            if len(leased) < req.max_rollouts and grant.room and (opening is None or grant.dry):
                if await self.open_groups_for(now, req.max_rollouts - len(leased)):
                    more = await self.store.leases.lease_with_policy(
                        now, req.worker_id, lease_id, req.max_rollouts - len(leased), expires_at,
                        key_ttl, req.backend)
                    leased += more.rollouts
                    cancel += more.cancel
                    policy = more.policy
            if leased or cancel:
                self.wakeups.release(ticket)
                break
            if not await self._wait_for_wake(ticket, "lease", deadline):
                break
        return lease_answer(lease_id if leased else None, expires_at if leased else None,
                            policy, leased, cancel, self._sampling)

    async def _check_weights(self, version: int) -> None:
        """409 stale_weights when weights at `version` are older than max_staleness allows:
        whatever they generated would be dropped at delivery. The detail says what to load."""
        policy = await self.store.policy.get_policy()
        oldest = policy.version - self.settings.max_staleness
        if version < oldest:
            raise Conflict(
                "stale_weights",
                f"weights at policy version {version} are older than the oldest accepted "
                f"({oldest}: current {policy.version} minus max_staleness "
                f"{self.settings.max_staleness}); load {policy.checkpoint or 'the current policy'}"
                f" (version {policy.version}), then lease again",
                {"current_version": policy.version, "checkpoint": policy.checkpoint,
                 "policy_version": version, "max_staleness": self.settings.max_staleness})

    def _lease_key_ttl(self) -> int:
        """Seconds a lease's keys live past their last lease or heartbeat."""
        return int(self.settings.lease_ttl_s * 4 + self.settings.retention_s)

    async def heartbeat(self, lease_id: str, worker_id: str) -> HeartbeatResponse:
        """Extend a lease by lease_ttl_s from now."""
        now = self.clock()
        expires_at = now + self.settings.lease_ttl_s
        cancel = await self.store.leases.heartbeat(now, worker_id, lease_id, expires_at,
                                            self._lease_key_ttl())
        return HeartbeatResponse(lease_id=lease_id, expires_at=expires_at, cancel=cancel)

    async def report(self, req: ResultsRequest, holder_only: bool = False) -> ResultsResponse:
        """Apply results; a reward at or above success_threshold counts as a success.

        An aborted rollout (finish_reason "abort") still held by the reporting worker is
        released for immediate re-issue; elsewhere it only counts its tokens. A worker error
        (finish_reason "error") is released the same way, except that the third error on one
        rollout slot counts as a failure. A `report_id` seen before answers what it answered then.
        `holder_only` (the worker id is authenticated) ignores results for rollouts another
        worker holds, as duplicates.
        """
        s = self.settings
        # neither carries an outcome: -1 and -2 keep them out of counts and posteriors
        successes = [_NO_OUTCOME.get(r.finish_reason, int(r.reward >= s.success_threshold))
                     for r in req.results]
        levels = None
        if self.planner.reward_view:
            levels = [str(level_of(r.reward, s.reward_tolerance)) for r in req.results]
        else:
            await self._warn_non_binary(req.results)
        applied = await self.store.results.apply(self.clock(), Report(
            req.worker_id, req.results, successes, self._learning, s.retention_s,
            report_id=req.report_id, report_ttl_s=max(1, math.ceil(s.report_ttl_s)),
            holder_only=holder_only, levels=levels, levels_in_use=self.planner.levels))
        if levels is not None and not self._known_levels.issuperset(levels):
            self._known_levels.update(levels)
            await self.planner.refresh_levels(self.store)
        return ResultsResponse(
            accepted=applied.accepted, duplicates=applied.duplicates, late=applied.late,
            released=applied.released,
            decisions=[GroupDecision(group_id=g, decision=d) for g, d in applied.decisions],
            cancel=applied.cancel)

    async def _warn_non_binary(self, results: list) -> None:
        """Under the outcome view, say once per run (the store keeps the first such reward for
        /stats; the replica that stored it logs) that rewards are not 0/1."""
        if self._warned_non_binary:
            return
        reward = first_non_binary([r.reward for r in results
                                   if r.finish_reason not in _NO_OUTCOME])
        if reward is None:
            return
        self._warned_non_binary = True
        if await self.store.run.note_non_binary_reward(reward):
            log.warning(non_binary_warning(reward))

    # --- trainer ---------------------------------------------------------------------------------

    async def next_batch(self, req: NextBatchRequest) -> Batch | None:
        """A batch of ready groups (or an expired unacked one), or None after wait_s."""
        answer = await self.next_batch_json(req)
        return None if answer is None else Batch.model_validate_json(answer)

    async def next_batch_json(self, req: NextBatchRequest) -> bytes | None:
        """`next_batch`, answered as the Batch JSON the route sends (see `answers`)."""
        s = self.settings
        size = req.size or s.batch_size
        if size > self.flow_target and s.max_rollouts_per_batch is None:
            # only flow_target groups are ever ready or in the making: it would never fill
            raise Unfillable(message=(
                f"size {size} is more than the {self.flow_target} groups this scheduler keeps "
                f"ready or in the making (prefetch_batches {s.prefetch_batches} x batch_size "
                f"{s.batch_size}): ask for at most that, or raise SARA_BATCH_SIZE or "
                "SARA_PREFETCH_BATCHES"), detail={"size": size, "flow_target": self.flow_target})
        deadline = self.clock() + req.wait_s
        while True:
            # under a rollout cap a batch may close with fewer groups: wake on any ready group
            need = size if s.max_rollouts_per_batch is None else 1
            ticket = await self._ticket("batch", deadline, need)
            now = self.clock()
            kind, batch_id = await self.store.batches.form_batch(
                now, size, now + s.batch_ack_timeout_s, s.max_staleness,
                s.max_rollouts_per_batch, _new_id("b"), s.retention_s)
            if kind == "new" and batch_id:
                await self._note_estimate(batch_id)
            if kind != "none" and batch_id:
                self.wakeups.release(ticket)
                return await self._load_batch(batch_id, redelivered=kind == "redeliver")
            if not await self._wait_for_wake(ticket, "batch", deadline):
                return None

    async def _note_estimate(self, batch_id: str) -> None:
        # a window's own counts are too few for an estimate: the run's so far goes with them
        estimate = ds_estimate(await read_counters(self.store), self.settings.group_size)
        await self.store.batches.note_batch_estimate(batch_id, {
            "ds_rollouts_per_effective_group": estimate.point,
            "ds_rollouts_per_effective_group_low": estimate.low,
            "ds_rollouts_per_effective_group_high": estimate.high})

    async def _load_batch(self, batch_id: str, redelivered: bool) -> bytes:
        meta = await self.store.batches.read_batch(batch_id)
        gids = split_ids(meta["groups"], ",")
        # stored results stay JSON bytes: the answer splices them in (answers.stored_result)
        rows = await self.store.groups.read_group_results(gids, self.settings.group_size,
                                                   decode=bytes)
        prompts = await self.store.prompts.read_prompts([pid for pid, _ in rows])
        groups = [(gid, pid, prompt or {}, *self.allocator.delivered(results))
                  for gid, (pid, results), prompt in zip(gids, rows, prompts)]
        stats = BatchStats.model_validate_json(meta["stats"])
        stats = stats.model_copy(update=json.loads(meta.get("estimate") or "{}"))
        return batch_answer(batch_id, stored_int(meta["policy_version"]),
                            float(meta["created_at"]), redelivered, groups, stats,
                            self._sampling)

    async def ack(self, batch_id: str) -> AckResponse:
        """Confirm a batch; acking twice is harmless."""
        already = await self.store.batches.ack(self.clock(), batch_id, self.settings.retention_s)
        return AckResponse(batch_id=batch_id, acked=True, already_acked=already)

    async def check_format(self) -> None:
        """Make the namespace's stored format this release's, migrating one written before
        formats were versioned (store/migrate.py); UnknownFormat for one it cannot read."""
        outcome = await self.store.run.ensure_format()
        if outcome == "migrated":
            log.warning("namespace %r: moved to stored format %s", self.settings.namespace,
                        FORMAT_VERSION)
        self.format_checked = True

    async def maintain(self, gc_batch: int = 200, gc_rounds: int = 50) -> tuple[int, int]:
        """Periodic upkeep: re-issue expired leases, delete finished groups past retention,
        forget workers unseen for as long.

        Collection runs in bounded rounds until nothing is overdue: one round per tick could not
        keep up with a busy run's group turnover, and memory would grow without end.
        """
        now = self.clock()
        if not self.format_checked:   # Redis was down when the process started
            await self.check_format()
        await self.planner.refresh_levels(self.store)
        expired = await self.store.leases.expire_leases(now)
        collected = 0
        for _ in range(gc_rounds):
            done = await self.store.groups.collect_garbage(now, gc_batch)
            collected += done
            if done < gc_batch:
                break
        await self.store.run.prune_workers(now - self.settings.retention_s, gc_batch)
        await self._check_pool()
        return expired, collected

    async def _check_pool(self) -> None:
        """Log, once each time it changes, that the pool is too small to fill a batch of distinct
        prompts (/stats shows it in `warnings` meanwhile). An empty pool is a run whose prompts
        are not loaded yet: /stats says so, the log does not."""
        enabled = await self.store.prompts.enabled_count()
        warning = small_pool_warning(enabled, self.settings.batch_size) if enabled else None
        if warning != self._pool_warning:
            if warning:
                log.warning(warning)
            self._pool_warning = warning

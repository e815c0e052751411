"""The scheduler: turns API calls into store transitions, using the pure allocation math.

It holds no state of its own beyond caches derived from settings, so any number of replicas can
serve one namespace. The clock is injected (tests move it by hand); a long poll waits for the
run's wake stream (see `wake`), re-checking at least every `poll_interval_s`, until its deadline.

It is past 400 lines because every call that opens groups shares its plan, level and selection
caches (plans per prompt, the reward levels seen, the selection modes' scores); the pure parts
already live in `allocation`, `reward_levels` and `selection`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
from typing import Callable

from sara_client.models import (AckResponse, AddPromptsRequest, AddPromptsResponse, Batch,
                                BatchStats, GroupDecision, HeartbeatResponse, LeaseRequest,
                                LeaseResponse, NextBatchRequest, PromptIn, ResultsRequest,
                                ResultsResponse, SamplingParams, prompt_json)

from ..math.allocation import GroupPlan, decay_posterior, decay_weight, p_eff, plan_group
from .answers import batch_answer, lease_answer
from .autoprice import AutoPricer
from .draws import PromptDraws
from ..errors import Conflict, Unfillable
from .observability import ds_estimate, read_counters, small_pool_warning
from ..store.codec import StoredPosterior, stored_int
from ..store.redis_format import FORMAT_VERSION, split_ids
from ..math.reward_levels import (
    first_non_binary, level_of, levels_in_use, non_binary_warning, p_eff_levels, plan_levels,
    plan_levels_history,
)
from ..math.knapsack import KnapsackParams, estimated_rate, sized_plan, split_budget
from ..math.pilot_commit import excluded, pilot_band, plan_pilot
from ..math.reinforce_ada import keep_slots, plan_rounds, round_rule
from ..math.selection import (
    DpsParams, GresoParams, dps_mixed_probability, dps_observations, greso_keep_chance,
    greso_streak, mopps_levels_score, mopps_score,
)
from ..settings import Settings
from ..store.leases import Opening
from ..store.store import Store
from ..store.wake_stream import WakeStream
from .wake import Ticket, Wakeups

log = logging.getLogger("sara.service")
Clock = Callable[[], float]
# results that carry no outcome, as apply_results.lua codes them: an aborted rollout (-1) and a
# worker's own error (-2: engine died, server unreachable), which says nothing about the prompt
_NO_OUTCOME = {"abort": -1, "error": -2}
# selection modes that take prompts in epoch order (the others score a random candidate pool)
EPOCH_ORDER = ("epoch", "history", "greso")
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
        self._rng = random.Random(settings.seed)  # Thompson samples and tie-breaks
        s = settings
        # Under SARA_EFFECTIVE=reward plans are the Dirichlet's over the levels in use, which
        # grow as the run sees new ones (`_refresh_levels`); under prior=history each prompt's
        # plan is its own Dirichlet's (`plan_levels_history`), with fixed τ only.
        self.reward_view = s.effective == "reward"
        self._levels = levels_in_use(s.reward_levels, 0)
        # Under tau_low=auto the plans follow the pool's price (see autoprice); the baselines
        # ignore τ, so they keep the fixed plan.
        self.auto = (AutoPricer(s, self._levels if self.reward_view else None)
                     if s.tau_low == "auto" and s.policy == "sara" else None)
        self._known_levels: set[str] = set()  # levels this process has reported or read
        self._warned_non_binary = False  # this process has told the store (the log says it once)
        # With a uniform prior every group of a run has the same plan: compute it once (under
        # auto, once per price: `_plans_for` refreshes it).
        self._prior_plan = self.auto.fresh_plan() if self.auto else self._fixed_plan()
        self._greso = GresoParams(target=s.greso_target, p_start=s.greso_p_start,
                                  p_min=s.greso_p_min, p_max=s.greso_p_max, step=s.greso_step)
        self._knapsack = KnapsackParams(min_n=s.vk_min, max_n=s.vk_max,
                                        confidence=s.vk_confidence)
        self._sampling = SamplingParams(temperature=s.temperature, top_p=s.top_p,
                                        max_tokens=s.max_tokens)
        self.format_checked = False  # the stored format is this release's (check_format)
        self.draws = PromptDraws(s, store, self._scores, self._rng)
        self._pool_warning: str | None = None  # the small-pool warning last logged

    def _fixed_plan(self) -> GroupPlan:
        """The plan of every group under a uniform prior and a fixed tau_low."""
        s = self.settings
        if s.policy == "reinforce_ada":
            return plan_rounds(s.group_size, s.prior_alpha, s.prior_beta,
                               round_rule(s.ada_round, s.ada_keep, s.ada_rule))
        if s.policy == "pilot_commit":
            return plan_pilot(s.group_size, s.prior_alpha, s.prior_beta,
                              pilot_band(s.pc_pilot, s.pc_band_low, s.pc_band_high),
                              s.pc_tau_low)
        if self.reward_view:
            return plan_levels(s.policy, s.group_size, self._levels, s.prior_alpha,
                               float(s.tau_low))
        return plan_group(s.policy, s.group_size, s.prior_alpha, s.prior_beta, s.tau_low,
                          tau_fail=s.tau_low_fail)

    @property
    def commit(self) -> str:
        """How committed groups are filled: Reinforce-Ada's are delivered as they stand (each
        stops at the end of a round), Pilot-Commit's filled to k (its commit is the budget),
        every other policy's as SARA_COMMIT says."""
        policy = self.settings.policy
        if policy == "reinforce_ada":
            return "partial"
        return "complete" if policy == "pilot_commit" else self.settings.commit

    @property
    def _one_plan_in_order(self) -> bool:
        """Every prompt drawn opens a group under the run's one plan, with no read of its
        history: a uniform prior, epoch selection, and no solved prompts to exclude."""
        s = self.settings
        return (s.prior == "uniform" and s.selection == "epoch" and s.group_sizing == "fixed"
                and not (s.policy == "pilot_commit" and s.pc_exclude_solved))

    async def _refresh_levels(self) -> None:
        """Under the reward view, plan for every level the run has seen (the set only grows):
        one more level makes a pure prefix less telling, so groups are abandoned later. Called
        when a report brings a level this process has not seen, by the upkeep loop (levels other
        replicas saw) and before opening groups, never on a plain lease: it is one round trip."""
        if not self.reward_view:
            return
        seen = await self.store.run.reward_level_count()
        levels = levels_in_use(self.settings.reward_levels, seen)
        if levels != self._levels:
            self._levels = levels
            if self.auto is not None:
                self.auto.set_levels(levels)
                self._prior_plan = self.auto.fresh_plan()
            else:
                self._prior_plan = self._fixed_plan()

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

    def _posterior_now(self, post: StoredPosterior, version: int, clock: float
                       ) -> tuple[float, float]:
        """The posterior decayed to now: `version` and the pool's `clock` (store.pool_clock)."""
        s = self.settings
        if not post.has_evidence:
            return s.prior_alpha, s.prior_beta
        versions, epochs = post.age(version, clock)
        return decay_posterior(post.alpha, post.beta, s.prior_alpha, s.prior_beta,
                               s.posterior_decay, versions, s.posterior_half_life, epochs)

    async def _plans_for(self, pids: list[str]) -> tuple[list[tuple[str, str, GroupPlan]], int]:
        """(group id, prompt id, plan) for the prompts to open, and how many were skipped."""
        s = self.settings
        await self._refresh_levels()
        if self.auto is not None:
            await self.auto.refresh(self.store, (await self.store.policy.get_policy()).version)
            self._prior_plan = self.auto.fresh_plan()
        if self._one_plan_in_order:
            if self._prior_plan.skip:   # Settings refuse this; never open a group issuing nothing
                return [], len(pids)
            return [(_new_id("g"), pid, self._prior_plan) for pid in pids], 0
        version = (await self.store.policy.get_policy()).version
        clock = await self.store.prompts.pool_clock()
        posts = await self.store.prompts.posteriors(pids)
        keeps = (await self._greso_keeps(posts, version, clock) if s.selection == "greso"
                 else [True] * len(pids))
        chosen, sized, skipped = [], [], 0
        for pid, post, kept in zip(pids, posts, keeps):
            if not kept or self._excluded(post):
                skipped += 1
                continue
            a, b = self._posterior_now(post, version, clock)
            if s.selection == "history" and self._start_chance(post, a, b, version,
                                                               clock) < s.tau_skip:
                skipped += 1
                continue
            if s.group_sizing == "var_k":
                sized.append((pid, post, a, b))
                continue
            plan = (self._level_plan_for(post, version, clock) if self.reward_view
                    else self._plan_for(a, b))
            if plan.skip:
                skipped += 1
                continue
            chosen.append((_new_id("g"), pid, plan))
        return (self._sized_plans(sized) if sized else chosen), skipped

    def _sized_plans(self, prompts: list[tuple[str, StoredPosterior, float, float]]
                     ) -> list[tuple[str, str, GroupPlan]]:
        """Under var_k, the draw's budget of k per prompt split by expected value
        (math.knapsack), each prompt planned for its own size. A size whose SARA plan would
        skip the prompt runs whole instead: the split chose the prompt."""
        s = self.settings
        rates = [estimated_rate(greso_streak(post.observations)[0] if post.observations
                                else None, a - s.prior_alpha, b - s.prior_beta)
                 for _, post, a, b in prompts]
        sizes = split_budget(rates, s.group_size, self._knapsack)
        plans = []
        for (pid, _, a, b), size in zip(prompts, sizes):
            if s.prior == "uniform":
                a, b = s.prior_alpha, s.prior_beta
            plans.append((_new_id("g"), pid, sized_plan(s.policy, size, a, b, s.tau_low)))
        return plans

    def _excluded(self, post: StoredPosterior) -> bool:
        """Under pilot_commit, a prompt whose last pilot was solved is not sampled again."""
        s = self.settings
        return (s.policy == "pilot_commit" and s.pc_exclude_solved
                and excluded(*greso_streak(post.observations)))

    async def _greso_keeps(self, posts: list[StoredPosterior], version: int, clock: float
                           ) -> list[bool]:
        """GRESO's pre-rollout filter, prompt by prompt: kept with chance max(p^c, floor) after
        c zero-variance groups in a row (selection.greso_keep_chance); the rates adapt once per
        policy version, from the pool's second epoch on, as GRESO's do from its second."""
        params = self._greso
        p_easy, p_hard = await self.store.policy.greso_rates(version, clock >= 1.0, params)
        return [self._rng.random() < greso_keep_chance(
                    *greso_streak(post.observations),
                    p_easy, p_hard, params) for post in posts]

    def _start_chance(self, post: StoredPosterior, a: float, b: float, version: int,
                      clock: float) -> float:
        """P(a new group of the prompt comes out effective): its Beta(a, b) p_eff, or under the
        reward view its Dirichlet's (see :meth:`_level_alphas`)."""
        s = self.settings
        if not self.reward_view:
            return p_eff(0, 0, s.group_size, a, b)
        alphas = self._level_alphas(post, version, clock)
        return p_eff_levels([0] * len(alphas), s.group_size, alphas)

    def _level_counts(self, post: StoredPosterior, version: int, clock: float
                      ) -> dict[str, float]:
        """The prompt's rollouts per reward level, decayed to now as a and b are."""
        s = self.settings
        versions, epochs = post.age(version, clock)
        weight = decay_weight(s.posterior_decay, versions, s.posterior_half_life, epochs)
        return {level: weight * c for level, c in post.level_counts.items()}

    def _level_alphas(self, post: StoredPosterior, version: int, clock: float) -> list[float]:
        """The prompt's Dirichlet over reward levels now: alpha0 per level in use plus its level
        counts, decayed to now as a and b are."""
        s = self.settings
        alphas = [s.prior_alpha + c for c in self._level_counts(post, version, clock).values()]
        return alphas + [s.prior_alpha] * max(0, self._levels - len(alphas))

    def _level_plan_for(self, post: StoredPosterior, version: int, clock: float) -> GroupPlan:
        """Under the reward view, the plan of one prompt: the run's plan under a uniform
        prior, else its own Dirichlet's (a threshold per level it has produced)."""
        s = self.settings
        if s.prior == "uniform":
            return self._prior_plan
        return plan_levels_history(s.policy, s.group_size, self._level_counts(post, version, clock),
                                   self._levels, s.prior_alpha, float(s.tau_low))

    def _plan_for(self, a: float, b: float) -> GroupPlan:
        """The plan of one prompt whose posterior is Beta(a, b) now."""
        s = self.settings
        if s.prior == "uniform":
            return self._prior_plan
        if self.auto is not None:
            return self.auto.plan_for(a, b)
        return plan_group(s.policy, s.group_size, a, b, s.tau_low, tau_fail=s.tau_low_fail)

    async def _select_prompts(self, count: int) -> tuple[list[str], int]:
        """The next `count` prompts with no group in flight (core.draws), and the policy
        version a predictive selection ranked them at (-1 for epoch order)."""
        s = self.settings
        if s.selection in EPOCH_ORDER:
            return (await self.draws.free_from_epoch(count)).pids, -1
        version = (await self.store.policy.get_policy()).version
        return await self.draws.ranked(count, version), version

    async def _scores(self, pids: list[str], posts: list[StoredPosterior], version: int
                      ) -> list[float]:
        """dps's P(mixed) or mopps's Thompson-sampled score of each candidate at `version`."""
        s = self.settings
        if s.selection == "dps":
            params = DpsParams(decay=s.dps_decay, prior=s.dps_prior)
            return [dps_mixed_probability(dps_observations(p.observations, s.dps_censored),
                                          version, params) for p in posts]
        clock = await self.store.prompts.pool_clock()
        if self.reward_view:
            return [mopps_levels_score(self._level_alphas(p, version, clock), s.group_size,
                                       self._rng) for p in posts]
        return [mopps_score(*self._posterior_now(p, version, clock), self._rng, s.mopps_target)
                for p in posts]

    def _opening(self, max_rollouts: int) -> Opening | None:
        """What a lease needs to open groups itself; None unless every group gets the run's one
        plan in epoch order (a uniform prior, epoch selection, a fixed tau_low)."""
        s, plan = self.settings, self._prior_plan
        if not self._one_plan_in_order or self.auto is not None or plan.skip:
            return None
        count = min(self.flow_target, math.ceil(max_rollouts / max(1, plan.initial_issue)))
        return Opening(plan, self.commit, s.audit_fraction, s.seed,
                       tuple(_new_id("g") for _ in range(count)))

    async def open_groups_for(self, now: float, rollouts_wanted: int) -> int:
        """Open enough new groups to supply about `rollouts_wanted` rollouts, flow permitting.
        When a selection skipped every prompt of a draw (history, GRESO), it draws again, up to
        SKIP_REDRAWS times, so a filter that skips most prompts does not answer a lease empty
        while the epoch still holds prompts it would keep."""
        per_group = max(1, self._prior_plan.initial_issue)
        count = min(self.flow_target, math.ceil(rollouts_wanted / per_group))
        if self.settings.group_sizing == "var_k":   # the split needs its whole draw
            count = self.settings.vk_batch
        for _ in range(SKIP_REDRAWS):
            pids, ranked_at = await self._select_prompts(count)
            if not pids:
                await self._count_busy(now)
                return 0
            plans, skipped = await self._plans_for(pids)
            opened = await self.store.groups.open_groups(
                now, self.flow_target, plans, self.commit, skipped,
                self.settings.audit_fraction, self.settings.seed, **self.work_floor,
                skipped_busy=self.draws.take_busy_count())
            unopened = [pid for _, pid, _ in plans[opened:]]
            if self.settings.selection in EPOCH_ORDER:
                await self.store.prompts.unpop_epoch(unopened)
            else:
                self.draws.give_back(unopened, ranked_at)
            if plans or not skipped:
                return opened
        return 0

    async def _count_busy(self, now: float) -> None:
        """Count the busy prompts a draw passed over when it found nothing to open."""
        busy = self.draws.take_busy_count()
        if busy:
            await self.store.groups.open_groups(now, self.flow_target, [], self.commit, 0,
                                                skipped_busy=busy)

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
        if self.reward_view:
            levels = [str(level_of(r.reward, s.reward_tolerance)) for r in req.results]
        else:
            await self._warn_non_binary(req.results)
        applied = await self.store.leases.apply_results(
            self.clock(), req.worker_id, req.results, successes, s.posterior_decay,
            s.prior_alpha, s.prior_beta, s.retention_s, s.posterior_half_life,
            report_id=req.report_id, report_ttl_s=max(1, math.ceil(s.report_ttl_s)),
            holder_only=holder_only, levels=levels, levels_in_use=self._levels)
        if levels is not None and not self._known_levels.issuperset(levels):
            self._known_levels.update(levels)
            await self._refresh_levels()
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
        groups = [(gid, pid, prompt or {}, *self._kept(results))
                  for gid, (pid, results), prompt in zip(gids, rows, prompts)]
        stats = BatchStats.model_validate_json(meta["stats"])
        stats = stats.model_copy(update=json.loads(meta.get("estimate") or "{}"))
        return batch_answer(batch_id, stored_int(meta["policy_version"]),
                            float(meta["created_at"]), redelivered, groups, stats,
                            self._sampling)

    def _kept(self, results: list[bytes]) -> tuple[list[bytes], list[float] | None]:
        """A group's results as delivered, and every reward it drew when those are fewer: under
        reinforce_ada down-sampled to SARA_ADA_KEEP (`reinforce_ada.keep_slots`), every one
        (and None) otherwise."""
        s = self.settings
        if s.policy != "reinforce_ada":
            return results, None
        rewards = [float(json.loads(raw)["reward"]) for raw in results]
        kept = keep_slots([r >= s.success_threshold for r in rewards], s.ada_keep)
        return [results[i] for i in kept], (rewards if len(kept) < len(results) else None)

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
        await self._refresh_levels()
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

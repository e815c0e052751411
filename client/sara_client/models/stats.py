"""Wire models of `GET /stats`: a namespace's counters, the figures derived from them, its queues
and workers (docs/architecture.md, "Counters and figures")."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import AnswerModel
from .policy import PolicyInfo


class Counters(AnswerModel):
    """Monotone counters of one namespace (docs/architecture.md, "Counters and figures")."""

    rollouts_issued: int = 0
    rollouts_completed: int = 0
    rollouts_cancelled: int = 0
    rollouts_reissued: int = Field(
        0, description="Re-queued: their lease expired, or their holder aborted or failed them.")
    rollouts_errored: int = Field(0, description="Results a worker reported as errors.")
    results_duplicate: int = 0
    results_late: int = Field(0, description="Results for cancelled rollouts: they teach the posterior only, once per slot.")
    tokens_generated: int = 0
    groups_opened: int = 0
    groups_skipped: int = Field(0, description="Prompts skipped before any rollout.")
    prompts_skipped_busy: int = Field(
        0, description="Prompts passed over when groups opened because a group of theirs was "
                       "still open, committed or ready: one group per prompt at a time.")
    groups_committed: int = 0
    groups_abandoned: int = 0
    groups_dropped_saturated: int = 0
    groups_dropped_stale: int = 0
    groups_delivered: int = 0
    delivered_lag_versions: int = Field(
        0, description="Sum over delivered groups of the policy versions their oldest result "
                       "lagged the version their batch formed at.")
    groups_acked: int = 0
    rollouts_delivered: int = Field(0, description="Rollouts inside delivered groups.")
    rollouts_not_spent_on_abandoned_groups: int = Field(
        0, description="Sum over abandoned groups of k - issued. Not a saving against DS: the "
                       "mixed groups that false abandons lose are not in it.")
    groups_completed_pure: int = Field(
        0, description="Groups that reached k all-fail or all-success (delivered or dropped).")
    groups_ended_all_fail: int = Field(
        0, description="Groups that ended all-fail: completed so, or abandoned on a failing prefix.")
    groups_ended_all_success: int = Field(
        0, description="Groups that ended all-success: completed so, or abandoned on a "
                       "succeeding prefix.")
    groups_ended_mixed: int = Field(0, description="Groups that ended mixed (committed).")
    groups_audited: int = Field(
        0, description="Groups SARA would have abandoned that ran on to k to be measured.")
    audits_mixed: int = Field(0, description="Audited groups that ended mixed (delivered).")
    audits_pure: int = Field(0, description="Audited groups that ended all-fail/all-success.")
    audit_rollouts: int = Field(0, description="Rollouts issued past abandonment by audits.")
    expected_false_abandons: float = Field(
        0.0, description="Sum of p_eff under the group's prior at abandonment: the bound.")
    estimated_false_abandons: float = Field(
        0.0, description="Sum of P(mixed had it run to k) under each prompt's learned posterior.")
    decisions_commit: int = 0
    decisions_abandon: int = 0
    decisions_continue: int = 0
    batches_formed: int = 0
    batches_redelivered: int = 0
    batches_acked: int = 0
    leases_granted: int = 0


class Derived(AnswerModel):
    rollouts_in_flight: int
    useful_fraction: float | None = Field(description="Rollouts in delivered groups / completed.")
    rollouts_per_effective_group: float | None
    delivered_age_versions: float | None = Field(
        None, description="Policy versions a delivered group lagged, on average over the run: "
                          "its batch's version minus its oldest result's.")
    rollouts_per_group_of_k: float | None = Field(
        None, description="Rollouts completed per k rollouts delivered: a delivered group of n "
                          "counts as n / k groups of k, so runs whose groups differ in size "
                          "(Pilot-Commit's, SARA_GROUP_SIZING=var_k's) read in DS's unit. The "
                          "same as rollouts_per_effective_group when every group has k.")
    ds_rollouts_per_effective_group: float | None = Field(
        description="ESTIMATE of what Dynamic Sampling would spend per effective group on the "
                    "same prompts: k / P(mixed), P(mixed) from the decided groups and the audited "
                    "ones (None while groups were abandoned and none audited yet).")
    ds_rollouts_per_effective_group_low: float | None = Field(
        None, description="Lower end of its 95% interval.")
    ds_rollouts_per_effective_group_high: float | None = Field(
        None, description="Upper end of its 95% interval (None while unbounded).")
    net_saving_vs_ds: float | None = Field(
        None, description="ESTIMATE: 1 - rollouts per mixed group here / DS's.")
    net_saving_vs_ds_low: float | None = Field(None, description="Lower end of its 95% interval.")
    net_saving_vs_ds_high: float | None = Field(None, description="Upper end of its 95% interval.")
    net_rollouts_saved_vs_ds: float | None = Field(
        None, description="ESTIMATE: what DS would have spent on the mixed groups committed here, "
                          "less the rollouts completed here.")
    net_rollouts_saved_vs_ds_low: float | None = Field(None, description="95% interval, low.")
    net_rollouts_saved_vs_ds_high: float | None = Field(None, description="95% interval, high.")
    false_abandon_rate: float | None = Field(
        None, description="Measured: audited would-abandon groups that ended mixed / audited.")
    false_abandon_rate_low: float | None = Field(None, description="Wilson 95% interval, low.")
    false_abandon_rate_high: float | None = Field(None, description="Wilson 95% interval, high.")
    audit_cost_fraction: float | None = Field(
        None, description="Rollouts issued past abandonment by audits / rollouts completed.")
    abandon_rate: float | None
    expected_false_abandon_rate: float | None = Field(
        description="The bound: mean prior p_eff at abandonment.")
    estimated_false_abandon_rate: float | None = Field(
        None, description="Model-based: mean P(mixed) under each prompt's learned posterior.")


class Queues(AnswerModel):
    pending: int = Field(description="Rollouts issued and waiting for a worker.")
    leased: int
    open_groups: int
    expected_yield_open: float = Field(description="Sum of p_eff over open groups.")
    ready_groups: int
    unacked_batches: int
    flow_target: int = Field(description="prefetch_batches x batch_size.")
    engine_occupancy: float | None = Field(
        None, description="The live workers' engines, as they report them with each lease: the "
                          "share of their slots generating, weighted by slots (null: none "
                          "reported). Below 1, the engine waits on the scheduler.")
    engine_slots: int = Field(0, description="The live reporting workers' engine slots.")


class WorkerStats(AnswerModel):
    worker_id: str
    backend: str | None = None
    policy_version: int | None = None
    last_seen: float
    last_seen_ago_s: float = Field(0.0, description="Seconds since the worker last leased, "
                                                    "heartbeated or reported.")
    stale: bool = Field(description="Unseen for SARA_WORKER_STALE_S (unset: SARA_LEASE_TTL_S, "
                                    "three heartbeat intervals); its rates are then null.")
    stopped: bool = Field(False, description="It stopped on request and said so (not stale, "
                                             "not live; its rates are null) until seen again.")
    rollouts_completed: int = 0
    tokens_generated: int = 0
    leases: int = 0
    rollouts_per_s: float | None = None
    tokens_per_s: float | None = None
    engine_occupancy: float | None = Field(
        None, description="Time-weighted share of its engine's slots generating, since its "
                          "previous lease (what it reported then); null while stale or stopped.")
    engine_slots: int | None = Field(None, description="Its engine's slots, as it reported them.")


class StatsResponse(AnswerModel):
    namespace: str
    run_state: str = Field("running", description="running | paused | draining | drained.")
    now: float
    policy: PolicyInfo
    config: dict[str, Any]
    counters: Counters
    derived: Derived
    queues: Queues
    abandon_histogram: dict[str, int] = Field(
        default_factory=dict, description="Rollouts done at abandonment -> groups.")
    workers: list[WorkerStats] = Field(default_factory=list)
    recent_batches: list[dict[str, Any]] = Field(default_factory=list)
    reward_levels: dict[str, int] = Field(
        default_factory=dict, description="Under SARA_EFFECTIVE=reward: reward level (the "
                                          "reward / SARA_REWARD_TOLERANCE grid point) -> rollouts.")
    warnings: list[str] = Field(
        default_factory=list, description="What the run should know about its configuration "
                                          "and what holds it up: rewards other than 0/1 under "
                                          "SARA_EFFECTIVE=outcome, ready groups waiting for a "
                                          "trainer.")
    auto_thresholds: dict[str, Any] | None = Field(
        None, description="Under tau_low=auto: the price rho in force (rollouts per effective "
                          "group), its live and model parts, and the fresh-prompt thresholds.")
    strategy: dict[str, Any] = Field(
        default_factory=dict, description="The run's strategies (policy, selection, "
                                          "group_sizing) and what each adds: GRESO's "
                                          "exploration rates in force, the ranked selections' "
                                          "round on the replica that answered.")

"""End to end: `sara serve` subprocesses on a real Redis, a Bernoulli worker and a batch consumer.

Each scenario (policy x number of replicas) runs once per module and is shared by the tests below;
see `_harness.py` for what a run does. Scenarios:

- one replica under `sara` and under `dynamic_sampling`, same seed and pool (common random numbers),
- two replicas on one Redis and one namespace, two workers each alternating between the replicas
  and a consumer that fetches a batch on one replica and acks it on the other.

Whenever a test fails, the serve processes' output is printed with it.
"""

from __future__ import annotations

import collections

import pytest
from sara_service.store.keys import split_rollout_id
from sara_worker.sim.pool import standard_pool

from ._harness import SUCCESS_THRESHOLD, RunResult, run_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SEED = 1234
K = 8
BATCH_SIZE = 8
N_BATCHES = 20
N_PROMPTS = 200
FILTERING = ("sara", "dynamic_sampling")
SCENARIOS = [(policy, replicas) for replicas in (1, 2) for policy in FILTERING]
SCENARIO_IDS = [f"{p}-{r}replica{'s' if r > 1 else ''}" for p, r in SCENARIOS]


@pytest.fixture(scope="module")
def run(redis_server, tmp_path_factory):
    """`run(policy, replicas)`: the RunResult of that scenario, run on first use."""
    log_dir = tmp_path_factory.mktemp("e2e-serve")
    done: dict[tuple[str, int], RunResult | Exception] = {}

    def get(policy: str, replicas: int) -> RunResult:
        key = (policy, replicas)
        if key not in done:
            try:
                done[key] = run_scenario(log_dir, redis_server.url, policy=policy,
                                         replicas=replicas, n_workers=replicas,
                                         n_batches=N_BATCHES, n_prompts=N_PROMPTS,
                                         group_size=K, batch_size=BATCH_SIZE, seed=SEED)
            except Exception as exc:  # do not rerun a failed scenario for every test
                done[key] = exc
        outcome = done[key]
        if isinstance(outcome, Exception):
            raise outcome
        print(outcome.logs)  # shown by pytest only when the test fails
        return outcome

    return get


def _is_success(reward: float) -> bool:
    return reward >= SUCCESS_THRESHOLD


# --- what the trainer receives -------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "replicas"), SCENARIOS, ids=SCENARIO_IDS)
def test_every_delivered_group_is_mixed_complete_and_delivered_once(run, policy, replicas):
    r = run(policy, replicas)
    assert len(r.batches) == N_BATCHES
    assert len({b.batch_id for b in r.batches}) == N_BATCHES
    assert not any(b.redelivered for b in r.batches)
    pool = {p["id"]: p for p in standard_pool(N_PROMPTS, SEED)}
    seen_groups: set[str] = set()
    for batch in r.batches:
        assert len(batch.groups) == BATCH_SIZE, batch.batch_id
        assert batch.policy_version == 0
        for g in batch.groups:
            assert g.group_id not in seen_groups, f"group {g.group_id} delivered twice"
            seen_groups.add(g.group_id)
            assert g.prompt_id in pool and g.prompt == pool[g.prompt_id]["prompt"]
            ids = [ro.rollout_id for ro in g.rollouts]
            assert len(ids) == K, f"{g.group_id}: {len(ids)} rollouts, want {K}"
            assert len(set(ids)) == K, f"{g.group_id}: repeated rollout ids {ids}"
            slots = sorted(split_rollout_id(i) for i in ids)
            assert slots == [(g.group_id, s) for s in range(K)], slots
            outcomes = {_is_success(ro.reward) for ro in g.rollouts}
            assert outcomes == {True, False}, f"{g.group_id} is saturated: {ids}"
            gamma = pool[g.prompt_id]["meta"]["p_success"]
            assert 0.0 < gamma < 1.0, f"{g.group_id}: a mixed group from a γ={gamma} prompt"


@pytest.mark.parametrize(("policy", "replicas"), SCENARIOS, ids=SCENARIO_IDS)
def test_delivered_rollouts_carry_what_the_worker_reported(run, policy, replicas):
    r = run(policy, replicas)
    twice = [rid for rid, n in r.ledger.leased.items() if n > 1]
    assert not twice, f"rollouts leased more than once: {twice[:5]}"
    for g in r.groups:
        for ro in g.rollouts:
            assert ro.rollout_id in r.ledger.reported, ro.rollout_id
            assert ro.reward == r.ledger.reported[ro.rollout_id], ro.rollout_id
            assert ro.completion == f"c{split_rollout_id(ro.rollout_id)[1]}"
            assert ro.completion_tokens == 3 and ro.policy_version == 0


# --- accounting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("policy", "replicas"), SCENARIOS, ids=SCENARIO_IDS)
def test_accounting_while_the_worker_holds_rollouts(run, policy, replicas):
    """Stopped mid-stream: issued = completed + cancelled + in flight, and in flight is exactly
    the pending slots plus the rollouts the workers hold unreported."""
    r = run(policy, replicas)
    stats, slots = r.stop.stats, r.stop.slots
    c, d, q = stats.counters, stats.derived, stats.queues
    assert c.rollouts_issued == c.rollouts_completed + c.rollouts_cancelled + d.rollouts_in_flight
    # The same figures counted slot by slot in Redis, independently of the counters.
    assert set(slots) <= {"pending", "leased", "done", "cancelled"}, slots
    assert sum(slots.values()) == c.rollouts_issued
    assert slots["done"] == c.rollouts_completed
    assert slots["cancelled"] == c.rollouts_cancelled
    assert slots["leased"] == r.stop.held == q.leased
    assert slots["pending"] + slots["leased"] == d.rollouts_in_flight
    assert q.pending == slots["pending"]
    assert c.groups_delivered == N_BATCHES * BATCH_SIZE == len(r.groups)


@pytest.mark.parametrize(("policy", "replicas"), SCENARIOS, ids=SCENARIO_IDS)
def test_accounting_when_drained(run, policy, replicas):
    """After the workers have reported everything and nothing is left to issue."""
    r = run(policy, replicas)
    stats, slots = r.final.stats, r.final.slots
    c, d, q = stats.counters, stats.derived, stats.queues
    assert r.final.held == 0
    assert d.rollouts_in_flight == 0
    assert c.rollouts_issued == c.rollouts_completed + c.rollouts_cancelled
    assert (q.pending, q.leased, q.open_groups) == (0, 0, 0)
    assert slots == collections.Counter({"done": c.rollouts_completed,
                                         "cancelled": c.rollouts_cancelled}) + collections.Counter()
    assert c.rollouts_reissued == 0 and c.results_duplicate == 0
    # every result the worker sent was accepted once, or arrived after its rollout was cancelled
    assert len(r.ledger.reported) == c.rollouts_completed + c.results_late
    assert r.ledger.results_accepted == c.rollouts_completed
    assert r.ledger.results_late == c.results_late
    assert len(r.ledger.cancels_received) <= c.rollouts_cancelled
    assert sum(w.rollouts_completed for w in stats.workers) == c.rollouts_completed
    assert {w.worker_id for w in stats.workers} == {f"w{i}" for i in range(replicas)}
    assert c.tokens_generated == 3 * len(r.ledger.reported)
    # every opened group was decided; the committed ones were delivered or wait ready
    assert c.groups_opened == c.groups_committed + c.groups_abandoned + c.groups_dropped_saturated
    assert c.groups_committed == c.groups_delivered + q.ready_groups
    assert q.ready_groups >= q.flow_target  # flow control is what stopped the drain
    # the trainer's side
    assert c.groups_delivered == c.groups_acked == len(r.groups) == N_BATCHES * BATCH_SIZE
    assert c.batches_formed == c.batches_acked == N_BATCHES
    assert c.batches_redelivered == 0 and q.unacked_batches == 0
    assert c.rollouts_delivered == K * c.groups_delivered
    assert sum(b.stats.rollouts_spent for b in r.batches) <= r.stop.stats.counters.rollouts_completed




def test_leases_granted_counts_each_lease_once(run):
    # under sara a 16-rollout lease almost always needs new groups opened mid-call
    r = run("sara", 1)
    stats = r.final.stats
    assert stats.counters.leases_granted == sum(r.worker_leases.values()), \
        (stats.counters.leases_granted, r.worker_leases)
    assert {w.worker_id: w.leases for w in stats.workers} == r.worker_leases


@pytest.mark.parametrize(("policy", "replicas"), SCENARIOS, ids=SCENARIO_IDS)
def test_policy_counters(run, policy, replicas):
    c = run(policy, replicas).final.stats.counters
    if policy == "sara":
        assert c.groups_abandoned > 0 and c.decisions_abandon == c.groups_abandoned
        # only audited groups (would-be abandons run on to k) can end pure and be dropped
        assert c.groups_audited > 0 and c.groups_dropped_saturated == c.audits_pure
        assert c.rollouts_not_spent_on_abandoned_groups > 0
    else:
        assert c.groups_abandoned == 0 and c.rollouts_not_spent_on_abandoned_groups == 0
        assert c.groups_audited == 0  # nothing is ever abandoned, so nothing is audited
        assert c.groups_dropped_saturated > 0
        assert c.rollouts_cancelled == 0


def test_sara_spends_fewer_rollouts_per_effective_group_than_dynamic_sampling(run):
    """The product's claim at small scale: same pool, seed and reward draws, fewer rollouts per
    effective group under sara."""
    sara, ds = run("sara", 1), run("dynamic_sampling", 1)
    s_stop, d_stop = sara.stop.stats.derived, ds.stop.stats.derived
    print(f"rollouts per effective group at stop: sara {s_stop.rollouts_per_effective_group:.2f}"
          f" dynamic_sampling {d_stop.rollouts_per_effective_group:.2f}")
    assert sara.stop.stats.counters.groups_abandoned > 0
    assert s_stop.rollouts_per_effective_group < d_stop.rollouts_per_effective_group
    # drained, every completed rollout belongs to a decided group: the exact cost per effective
    # (committed) group, with no groups still in the making
    s_c, d_c = sara.final.stats.counters, ds.final.stats.counters
    s_cost = s_c.rollouts_completed / s_c.groups_committed
    d_cost = d_c.rollouts_completed / d_c.groups_committed
    print(f"rollouts per committed group, drained: sara {s_cost:.2f} dynamic_sampling {d_cost:.2f}")
    assert s_cost < d_cost
    assert sara.final.stats.derived.rollouts_per_effective_group < \
        ds.final.stats.derived.rollouts_per_effective_group




def test_sara_run_brackets_what_dynamic_sampling_really_spends(run):
    """A SARA run estimates what DS would have spent from its audited groups (would-be abandons
    run on to k) and gives a 95% interval; the DS run on the same pool must land inside it."""
    sara, ds = run("sara", 1), run("dynamic_sampling", 1)
    s_c, d_c = sara.final.stats.counters, ds.final.stats.counters
    derived = sara.final.stats.derived
    sara_cost = s_c.rollouts_completed / s_c.groups_committed
    ds_measured = d_c.rollouts_completed / d_c.groups_committed
    print(f"sara {sara_cost:.2f}; DS measured {ds_measured:.2f}, estimated from "
          f"{s_c.audits_mixed + s_c.audits_pure} audited groups "
          f"{derived.ds_rollouts_per_effective_group:.2f} in "
          f"[{derived.ds_rollouts_per_effective_group_low:.2f}, "
          f"{derived.ds_rollouts_per_effective_group_high:.2f}]")
    assert (derived.ds_rollouts_per_effective_group_low <= ds_measured
            <= derived.ds_rollouts_per_effective_group_high)
    assert (derived.ds_rollouts_per_effective_group_low
            <= derived.ds_rollouts_per_effective_group
            <= derived.ds_rollouts_per_effective_group_high)
    assert sara_cost < ds_measured


# --- two replicas --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", FILTERING)
def test_two_replicas_share_the_work(run, policy):
    """Both replicas served batches and both workers leased (the invariants above are checked
    for the two-replica runs by the parametrised tests)."""
    r = run(policy, 2)
    assert len(set(r.delivered_via)) == 2, r.delivered_via
    workers = {w.worker_id: w for w in r.final.stats.workers}
    assert set(workers) == {"w0", "w1"}
    assert all(w.rollouts_completed > 0 and w.leases > 0 for w in workers.values())
    assert r.final.stats.counters.leases_granted >= sum(w.leases for w in workers.values())

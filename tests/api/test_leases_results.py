"""POST /leases, POST /results: issuing, decisions, posteriors, duplicates, late results.

Policy sara, k=8, tau_low=0.5, uniform prior: a group abandons after 4 all-fail or 4
all-success outcomes, so a new group gets 4 rollouts at once.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from sara_service.store.redis_client import connect

from .conftest import prompt_spec, result_for, slot_of

pytestmark = pytest.mark.anyio


def by_slot(rollouts):
    return sorted(rollouts, key=lambda r: slot_of(r["rollout_id"]))


async def test_lease_shape_and_policy(api):
    await api.add(prompt_spec("m", "mixed"))
    lease = await api.lease("w1", 4)
    assert lease["lease_id"] and lease["expires_at"] == api.clock() + api.settings.lease_ttl_s
    assert lease["policy"] == {"version": 0, "checkpoint": None}
    assert lease["cancel"] == []
    r = lease["rollouts"][0]
    assert r["prompt_id"] == "m" and r["prompt"] == "question m" and r["answer"] == "42"
    assert r["task"] == "exact" and r["meta"] == {"script": "mixed"}
    assert r["rollout_id"].startswith(r["group_id"] + ":")
    assert r["sampling"]["temperature"] == 1.0 and r["sampling"]["max_tokens"] == 256


async def test_empty_lease_has_no_lease_id(api):
    lease = await api.lease("w1", 4)
    assert lease["rollouts"] == [] and lease["lease_id"] is None and lease["expires_at"] is None


async def test_a_new_group_gets_exactly_four_rollouts(api):
    await api.add(prompt_spec("a", "mixed"), prompt_spec("b", "fail"), prompt_spec("c", "success"))
    lease = await api.lease("w1", 64)
    groups = defaultdict(list)
    for r in lease["rollouts"]:
        groups[r["group_id"]].append(slot_of(r["rollout_id"]))
    assert groups and all(sorted(s) == [0, 1, 2, 3] for s in groups.values())
    c = await api.counters()
    assert c["rollouts_issued"] == 4 * len(groups) == 4 * c["groups_opened"]
    view = await api.group(next(iter(groups)))
    assert (view["issued"], view["k"]) == (4, 8)
    assert [s["state"] for s in view["rollouts"]] == ["leased"] * 4 + ["unissued"] * 4


async def test_first_mixed_result_commits_and_issues_the_rest(api):
    await api.add(prompt_spec("m", "mixed"))
    rs = by_slot((await api.lease("w1", 4))["rollouts"])
    gid = rs[0]["group_id"]

    first = await api.report("w1", [result_for(rs[0])])  # slot 0 fails
    assert first["accepted"] == 1
    assert first["decisions"] == [{"group_id": gid, "decision": "continue"}]
    second = await api.report("w1", [result_for(rs[1])])  # slot 1 succeeds: mixed
    assert second["decisions"] == [{"group_id": gid, "decision": "commit"}]
    view = await api.group(gid)
    assert view["state"] == "committed" and view["issued"] == 8 and view["p_eff"] == 1.0

    more = await api.lease("w2", 4)  # the 4 new rollouts come first, no new group is opened
    assert sorted(slot_of(r["rollout_id"]) for r in more["rollouts"]) == [4, 5, 6, 7]
    assert {r["group_id"] for r in more["rollouts"]} == {gid}
    assert (await api.counters())["groups_opened"] == 1

    await api.report("w1", [result_for(r) for r in rs[2:]])
    last = await api.report("w2", [result_for(r) for r in more["rollouts"]])
    assert last["decisions"] == [{"group_id": gid, "decision": "commit"}]
    view = await api.group(gid)
    assert (view["state"], view["done"], view["successes"], view["failures"]) == ("ready", 8, 4, 4)
    c = await api.counters()
    assert (c["groups_committed"], c["decisions_commit"], c["decisions_continue"]) == (1, 1, 1)
    history = (await api.prompt("m"))["history"]
    assert (history["committed"], history["rollouts"], history["successes"]) == (1, 8, 4)


@pytest.mark.parametrize("script, reward", [("fail", 0.0), ("success", 1.0)])
async def test_four_pure_outcomes_abandon_and_move_the_posterior(api, script, reward):
    await api.add(prompt_spec("p", script))
    rs = by_slot((await api.lease("w1", 4))["rollouts"])
    gid = rs[0]["group_id"]
    for r in rs[:3]:
        out = await api.report("w1", [result_for(r)])
        assert out["decisions"] == [{"group_id": gid, "decision": "continue"}]
    out = await api.report("w1", [result_for(rs[3])])
    assert out["decisions"] == [{"group_id": gid, "decision": "abandon"}]
    assert all(result_for(r)["reward"] == reward for r in rs)

    view = await api.group(gid)
    assert view["state"] == "abandoned" and view["issued"] == 4 and view["done"] == 4
    assert view["p_eff"] == pytest.approx(4 / 9)
    c = await api.counters()
    assert (c["groups_abandoned"], c["decisions_abandon"], c["rollouts_not_spent_on_abandoned_groups"]) == (1, 1, 4)
    assert c["expected_false_abandons"] == pytest.approx(4 / 9)
    assert (await api.stats())["abandon_histogram"] == {"4": 1}

    got = await api.prompt("p")
    expected = {"alpha": 5.0, "beta": 1.0} if reward else {"alpha": 1.0, "beta": 5.0}
    assert {k: got["posterior"][k] for k in ("alpha", "beta")} == expected
    h = got["history"]
    assert (h["groups"], h["abandoned"], h["rollouts"], h["last_group_id"]) == (1, 1, 4, gid)
    assert h["successes"] == (4 if reward else 0)


async def test_duplicate_result_is_200_and_counted_once(api):
    await api.add(prompt_spec("f", "fail"))
    r0 = by_slot((await api.lease("w1", 4))["rollouts"])[0]
    assert (await api.report("w1", [result_for(r0)]))["accepted"] == 1
    again = await api.report("w1", [result_for(r0)])
    assert (again["accepted"], again["duplicates"], again["late"]) == (0, 1, 0)
    assert again["decisions"] == []
    c = await api.counters()
    assert (c["rollouts_completed"], c["results_duplicate"]) == (1, 1)
    assert (await api.prompt("f"))["posterior"]["beta"] == 2.0
    assert (await api.group(r0["group_id"]))["done"] == 1


async def test_duplicate_within_one_call(api):
    await api.add(prompt_spec("f", "fail"))
    r0 = (await api.lease("w1", 4))["rollouts"][0]
    out = await api.report("w1", [result_for(r0), result_for(r0)])
    assert (out["accepted"], out["duplicates"]) == (1, 1)
    assert (await api.counters())["rollouts_completed"] == 1


async def test_expired_lease_is_reissued_to_another_worker(api):
    await api.add(prompt_spec("m", "mixed"))
    first = await api.lease("w1", 4)
    api.clock.advance(api.settings.lease_ttl_s + 1)
    second = await api.lease("w2", 4)
    assert sorted(r["rollout_id"] for r in second["rollouts"]) == \
        sorted(r["rollout_id"] for r in first["rollouts"])
    assert second["lease_id"] != first["lease_id"]
    c = await api.counters()
    assert (c["rollouts_reissued"], c["rollouts_issued"], c["groups_opened"]) == (4, 4, 1)
    view = await api.group(first["rollouts"][0]["group_id"])
    assert {s["worker_id"] for s in view["rollouts"][:4]} == {"w2"}


async def test_first_result_for_a_slot_wins(api):
    await api.add(prompt_spec("f", "fail"))
    first = await api.lease("w1", 4)
    api.clock.advance(api.settings.lease_ttl_s + 1)
    second = await api.lease("w2", 4)
    r0 = by_slot(second["rollouts"])[0]
    win = await api.report("w2", [result_for(r0, reward=1.0, completion="from w2")])
    lose = await api.report("w1", [result_for(r0, reward=0.0, completion="from w1")])
    assert (win["accepted"], lose["accepted"], lose["duplicates"]) == (1, 0, 1)
    view = await api.group(r0["group_id"])
    assert view["rollouts"][0]["reward"] == 1.0 and (view["successes"], view["failures"]) == (1, 0)
    assert (await api.counters())["rollouts_completed"] == 1
    assert first["lease_id"] != second["lease_id"]


@pytest.mark.parametrize("channel", ["lease", "results", "heartbeat"])
async def test_worker_holding_an_answered_copy_is_told_to_cancel(api, channel):
    await api.add(prompt_spec("f", "fail"), prompt_spec("g", "fail"))
    old = by_slot((await api.lease("w1", 4))["rollouts"])
    api.clock.advance(api.settings.lease_ttl_s + 1)
    new = await api.lease("w2", 4)  # the re-issued copies
    assert {r["rollout_id"] for r in new["rollouts"]} == {r["rollout_id"] for r in old}
    out = await api.report("w1", [result_for(r) for r in old])  # the old holder answers first
    assert out["accepted"] == 4 and out["decisions"][0]["decision"] == "abandon"
    if channel == "lease":
        cancel = (await api.lease("w2", 1))["cancel"]
    elif channel == "heartbeat":
        # every copy the lease held was answered elsewhere: the lease holds nothing, so the
        # heartbeat says it is gone (abort all of it) and the next call still drains the ids
        r = await api.heartbeat(new["lease_id"], "w2")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_lease"
        cancel = (await api.lease("w2", 1))["cancel"]
    else:
        other = await api.lease("w3", 1)
        cancel = (await api.report("w2", [result_for(other["rollouts"][0])]))["cancel"]
    assert sorted(cancel) == sorted(r["rollout_id"] for r in old)
    assert (await api.lease("w2", 1))["cancel"] == []  # drained once delivered


async def test_cancelled_copy_reported_anyway_is_late_and_teaches_nothing_twice(make_api):
    # one slot is one sample; its copy's answer must not count again.
    # w2's lease opens another group of the one-prompt pool, an epoch later: no half-life, so
    # the posterior counts plainly (the half-life is tested in tests/store)
    api = await make_api(posterior_half_life=float("inf"))
    await api.add(prompt_spec("f", "fail"))
    old = by_slot((await api.lease("w1", 4))["rollouts"])
    api.clock.advance(api.settings.lease_ttl_s + 1)
    new = by_slot((await api.lease("w2", 4))["rollouts"])
    await api.report("w1", [result_for(r) for r in old])
    assert (await api.lease("w2", 1))["cancel"]
    out = await api.report("w2", [result_for(new[0])])
    assert (out["late"], out["duplicates"]) == (1, 0)
    assert (await api.prompt("f"))["posterior"]["beta"] == 5.0


async def test_a_result_from_a_non_holder_never_counts_twice_in_the_posterior(api):
    # w2 answers a rollout w1 holds (no lease expired); w1's own answer
    # then is late and must not add the same slot to the posterior a second time
    await api.add(prompt_spec("m", "mixed"))
    r0 = by_slot((await api.lease("w1", 4))["rollouts"])[0]
    await api.report("w2", [result_for(r0, reward=0.0)])
    out = await api.report("w1", [result_for(r0, reward=0.0)])
    assert (out["accepted"], out["late"]) == (0, 1)
    posterior = (await api.prompt("m"))["posterior"]
    assert (posterior["alpha"], posterior["beta"]) == (1.0, 2.0)


async def test_a_late_result_repeated_counts_once_in_the_posterior(api, redis_url):
    await api.add(prompt_spec("m", "mixed"))
    rs = by_slot((await api.lease("w1", 4))["rollouts"])
    raw = connect(redis_url)
    keys = api.app.state.scheduler.store.keys
    await raw.hset(keys.slots, rs[3]["rollout_id"], "c")
    await raw.zrem(keys.inflight, rs[3]["rollout_id"])
    await raw.aclose()
    for _ in range(3):
        await api.report("w1", [result_for(rs[3], reward=1.0)])
    assert (await api.prompt("m"))["posterior"]["alpha"] == 2.0


async def test_result_for_a_cancelled_slot_is_late_and_only_updates_the_posterior(api, redis_url):
    # No API sequence under sara leaves a probe in flight at abandonment (every issued probe
    # is needed to reach the threshold), so put one slot in the cancelled state directly.
    await api.add(prompt_spec("m", "mixed"))
    rs = by_slot((await api.lease("w1", 4))["rollouts"])
    gid = rs[0]["group_id"]
    raw = connect(redis_url)
    keys = api.app.state.scheduler.store.keys
    await raw.hset(keys.slots, rs[3]["rollout_id"], "c")
    await raw.zrem(keys.inflight, rs[3]["rollout_id"])
    await raw.aclose()
    before_c, before_g = await api.counters(), await api.group(gid)
    out = await api.report("w1", [result_for(rs[3], reward=1.0)])
    assert (out["accepted"], out["duplicates"], out["late"]) == (0, 0, 1)
    after_c, after_g = await api.counters(), await api.group(gid)
    assert after_g == before_g
    changed = {k for k in after_c if after_c[k] != before_c[k]}
    assert changed == {"results_late", "tokens_generated"}
    assert (await api.prompt("m"))["posterior"]["alpha"] == 2.0


async def test_heartbeat_extends_the_lease(api):
    await api.add(prompt_spec("m", "mixed"), prompt_spec("n", "mixed"))
    lease = await api.lease("w1", 4)
    ttl = api.settings.lease_ttl_s
    api.clock.advance(ttl * 0.75)
    r = await api.heartbeat(lease["lease_id"], "w1")
    assert r.status_code == 200
    body = r.json()
    assert body == {"lease_id": lease["lease_id"], "expires_at": api.clock() + ttl, "cancel": []}
    api.clock.advance(ttl * 0.75)  # past the first expiry, within the extended one
    other = await api.lease("w2", 4)
    assert not {x["rollout_id"] for x in other["rollouts"]} & \
        {x["rollout_id"] for x in lease["rollouts"]}
    assert (await api.counters())["rollouts_reissued"] == 0


async def test_heartbeat_for_unknown_lease_is_404(api):
    r = await api.heartbeat("l-nope", "w1")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_lease"


async def test_heartbeat_for_another_workers_lease_is_409(api):
    await api.add(prompt_spec("m", "mixed"))
    lease = await api.lease("w1", 4)
    r = await api.heartbeat(lease["lease_id"], "w2")
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "lease_owner" and "w1" in err["message"]


async def test_heartbeat_after_the_lease_was_reissued_is_404(api):
    await api.add(prompt_spec("m", "mixed"))
    lease = await api.lease("w1", 4)
    api.clock.advance(api.settings.lease_ttl_s + 1)
    assert len((await api.lease("w2", 4))["rollouts"]) == 4
    r = await api.heartbeat(lease["lease_id"], "w1")
    assert r.status_code == 404


async def test_a_worker_error_is_released_for_another_try_and_teaches_nothing(api):
    await api.add(prompt_spec("m", "mixed"))
    rs = by_slot((await api.lease("w1", 4))["rollouts"])
    answer = await api.report("w1", [result_for(rs[0], reward=0.0, finish_reason="error")])
    assert (answer["accepted"], answer["released"]) == (0, 1)
    again = (await api.lease("w2", 1))["rollouts"]
    assert [r["rollout_id"] for r in again] == [rs[0]["rollout_id"]]
    c = await api.counters()
    assert c["rollouts_errored"] == 1 and c["rollouts_completed"] == 0
    await api.report("w1", [result_for(rs[1], reward=1.0)])
    posterior = (await api.prompt("m"))["posterior"]
    assert (posterior["alpha"], posterior["beta"]) == (2.0, 1.0)  # the success, not the error


async def test_a_lower_failing_threshold_probes_a_failing_prompt_longer(make_api):
    """SARA_TAU_LOW_FAIL=0.3 at k = 8: 4 failures continue (p_eff 4/9), the group is issued up
    to 6, and 6 failures abandon it (2/9), where tau_low 0.5 alone abandons at 4."""
    api = await make_api(tau_low_fail=0.3)
    await api.add(prompt_spec("f", "fail"))
    probe = await api.lease("w1", 64)
    assert len(probe["rollouts"]) == 4
    answer = await api.report("w1", [result_for(r) for r in probe["rollouts"]])
    assert [d["decision"] for d in answer["decisions"]] == ["continue"]
    more = await api.lease("w1", 64)
    assert len(more["rollouts"]) == 2
    answer = await api.report("w1", [result_for(r) for r in more["rollouts"]])
    assert [d["decision"] for d in answer["decisions"]] == ["abandon"]
    assert (await api.stats())["abandon_histogram"] == {"6": 1}


async def test_the_rest_of_a_committed_group_is_leased_first_in_line_for_the_engine(api):
    """A committed group's remaining rollouts carry priority 1 (an engine scheduling by
    priority runs them before new groups' probes); a group's first rollouts carry 0."""
    await api.add(prompt_spec("m", "mixed"), prompt_spec("m2", "mixed"))
    probe = await api.lease("w1", 4)
    assert len(probe["rollouts"]) == 4 and {r["priority"] for r in probe["rollouts"]} == {0}
    await api.report("w1", [result_for(r) for r in probe["rollouts"]])   # commits
    rest = await api.lease("w1", 8)
    committed = probe["rollouts"][0]["group_id"]
    by_group = {(r["group_id"], r["priority"]) for r in rest["rollouts"]}
    assert (committed, 1) in by_group
    assert all(p == 0 for g, p in by_group if g != committed)   # a new group's probe

"""GET /stats, /metrics and /groups/{id} after scripted runs."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import prompt_spec, result_for, slot_of

pytestmark = pytest.mark.anyio

PROMPTS = [prompt_spec("m1", "mixed"), prompt_spec("m2", "mixed"), prompt_spec("f1", "fail"),
           prompt_spec("s1", "success")]


async def scripted_run(make_api, **overrides):
    """w1 works until 2 groups are ready; the trainer takes and acks them; w2 then leases 8
    rollouts and reports 3, leaving 5 in flight. Returns (api, batch, w1 completed)."""
    api = await make_api(batch_size=2, prefetch_batches=1, **overrides)
    await api.add(*PROMPTS)
    await api.work("w1", 8)
    w1_done = (await api.counters())["rollouts_completed"]
    batch = (await api.next_batch()).json()
    await api.ok("POST", f"/batches/{batch['batch_id']}/ack")
    api.clock.advance(10)
    lease = await api.lease("w2", 8)
    assert len(lease["rollouts"]) == 8
    await api.report("w2", [result_for(r) for r in lease["rollouts"][:3]])
    return api, batch, w1_done


async def test_counters_add_up(make_api):
    api, batch, _ = await scripted_run(make_api)
    s = await api.stats()
    c, d, q = s["counters"], s["derived"], s["queues"]
    assert c["rollouts_issued"] == c["rollouts_completed"] + c["rollouts_cancelled"] + \
        d["rollouts_in_flight"]
    assert d["rollouts_in_flight"] == q["pending"] + q["leased"] == 5
    assert q["leased"] == 5 and q["unacked_batches"] == 0 and q["flow_target"] == 2
    assert d["useful_fraction"] == pytest.approx(c["rollouts_delivered"] / c["rollouts_completed"])
    assert d["rollouts_per_effective_group"] == \
        pytest.approx(c["rollouts_completed"] / c["groups_delivered"])
    assert d["rollouts_per_group_of_k"] == d["rollouts_per_effective_group"]   # groups of k
    decided = c["groups_committed"] + c["groups_abandoned"] + c["groups_dropped_saturated"]
    assert d["abandon_rate"] == pytest.approx(c["groups_abandoned"] / decided)
    assert d["expected_false_abandon_rate"] == pytest.approx(4 / 9)
    assert c["groups_abandoned"] * 4 == c["rollouts_not_spent_on_abandoned_groups"]
    assert (c["groups_delivered"], c["rollouts_delivered"], c["groups_acked"]) == (2, 16, 2)
    assert c["decisions_commit"] == c["groups_committed"]
    assert c["decisions_abandon"] == c["groups_abandoned"]
    assert c["tokens_generated"] == 5 * c["rollouts_completed"]
    assert sum(s["abandon_histogram"].values()) == c["groups_abandoned"]
    assert s["policy"] == {"version": 0, "checkpoint": None}
    assert s["config"]["group_size"] == 8 and s["config"]["auth_enabled"] is False
    assert not {"worker_token", "admin_token", "redis_url"} & set(s["config"])


async def test_per_worker_rows_and_recent_batches(make_api):
    api, batch, w1_done = await scripted_run(make_api)
    s = await api.stats()
    rows = {w["worker_id"]: w for w in s["workers"]}
    assert set(rows) == {"w1", "w2"}
    assert rows["w1"]["rollouts_completed"] == w1_done and rows["w2"]["rollouts_completed"] == 3
    assert rows["w2"]["tokens_generated"] == 15 and rows["w2"]["leases"] == 1
    assert rows["w1"]["leases"] >= 2 and rows["w2"]["policy_version"] == 0
    assert rows["w2"]["last_seen"] == api.clock() and not rows["w2"]["stale"]
    assert sum(w["rollouts_completed"] for w in rows.values()) == \
        s["counters"]["rollouts_completed"]
    (recent,) = s["recent_batches"]
    assert recent["batch_id"] == batch["batch_id"]
    assert (recent["groups"], recent["rollouts"], recent["policy_version"]) == (2, 16, 0)
    # the batch adds the run-so-far DS estimate to the window's counts the list records
    window = {f: v for f, v in batch["stats"].items() if not f.startswith("ds_")}
    assert recent["stats"] == window


async def test_stale_worker_is_flagged(make_api):
    api = await make_api(worker_stale_s=30)
    await api.lease("idle", 1)
    api.clock.advance(31)
    (row,) = (await api.stats())["workers"]
    assert row["worker_id"] == "idle" and row["stale"] is True


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


async def test_metrics_is_prometheus_text_with_the_namespace_label(make_api):
    api, _, _ = await scripted_run(make_api, namespace="run_a")
    r = await api.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = families(r.text)
    counters = (await api.stats())["counters"]
    issued = fams["sara_rollouts_issued"]
    assert issued.type == "counter"
    (sample,) = [x for x in issued.samples if x.name == "sara_rollouts_issued_total"]
    assert sample.labels == {"namespace": "run_a"} and sample.value == counters["rollouts_issued"]
    for name, value in counters.items():
        (got,) = [x for x in fams[f"sara_{name}"].samples if x.name.endswith("_total")]
        assert got.value == pytest.approx(value), name
    assert fams["sara_queue_leased"].samples[0].value == 5
    assert fams["sara_policy_version"].samples[0].value == 0


async def test_metrics_with_several_workers_keeps_each_family_together(make_api):
    api, _, _ = await scripted_run(make_api)
    fams = list(text_string_to_metric_families((await api.get("/metrics")).text))
    names = [f.name for f in fams]
    assert len(names) == len(set(names))
    assert all(f.type != "unknown" for f in fams)
    completed = next(f for f in fams if f.name == "sara_worker_rollouts_completed")
    assert {x.labels["worker"] for x in completed.samples} == {"w1", "w2"}


async def test_group_view_shows_slots_and_thresholds(api):
    await api.add(prompt_spec("m", "mixed"))
    rs = sorted((await api.lease("w1", 4))["rollouts"], key=lambda r: slot_of(r["rollout_id"]))
    gid = rs[0]["group_id"]
    view = await api.group(gid)
    assert view["state"] == "open" and view["p_eff"] == pytest.approx(7 / 9)
    assert (view["abandon_after_failures"], view["abandon_after_successes"]) == (4, 4)
    assert view["created_at"] == api.clock() and view["prompt_id"] == "m"
    await api.report("w1", [result_for(r) for r in rs[:2]])
    view = await api.group(gid)
    assert (view["state"], view["k"], view["issued"], view["done"]) == ("committed", 8, 8, 2)
    assert (view["successes"], view["failures"], view["cancelled"]) == (1, 1, 0)
    slots = view["rollouts"]
    assert [s["rollout_id"] for s in slots] == [f"{gid}:{i}" for i in range(8)]
    assert [s["state"] for s in slots] == ["done"] * 2 + ["leased"] * 2 + ["pending"] * 4
    assert [s["reward"] for s in slots[:3]] == [0.0, 1.0, None]
    assert [s["worker_id"] for s in slots[1:4]] == [None, "w1", "w1"]


async def test_group_view_of_a_baseline_has_never_abandon_thresholds(make_api):
    api = await make_api(policy="uniform")
    await api.add(prompt_spec("m", "mixed"))
    lease = await api.lease("w1", 8)
    view = await api.group(lease["rollouts"][0]["group_id"])
    assert (view["abandon_after_failures"], view["abandon_after_successes"]) == (9, 9)
    assert view["issued"] == 8 and [s["state"] for s in view["rollouts"]] == ["leased"] * 8


async def test_unknown_group_is_404(api):
    r = await api.get("/groups/g-nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_group"


async def test_namespaces_are_isolated_and_replicas_share_state(make_api):
    run_a, run_b = await make_api(namespace="run_a"), await make_api(namespace="run_b")
    replica = await make_api(namespace="run_a")
    await run_a.add(prompt_spec("m", "mixed"))
    assert (await run_b.get("/prompts/m")).status_code == 404
    lease = await replica.lease("w1", 4)  # another replica of run_a sees the prompt
    assert len(lease["rollouts"]) == 4
    assert (await run_a.report("w1", [result_for(r) for r in lease["rollouts"]]))["accepted"] == 4
    assert (await run_a.counters())["rollouts_completed"] == 4
    assert (await run_b.counters())["rollouts_completed"] == 0
    assert (await run_b.lease("w1", 4))["rollouts"] == []
    assert (await run_b.stats())["namespace"] == "run_b"


async def test_metrics_count_requests_by_route_template_not_raw_path(make_api):
    api, _, _ = await scripted_run(make_api)
    await api.get("/groups/g-one")
    await api.get("/groups/g-two")
    await api.get("/no/such/path/123")
    fams = families((await api.get("/metrics")).text)
    samples = fams["sara_http_requests"].samples
    by_route = {(s.labels["route"], s.labels["status"]): s.value for s in samples
                if s.name == "sara_http_requests_total"}
    assert by_route[("/groups/{group_id}", "404")] == 2
    assert by_route[("unmatched", "404")] == 1
    assert not any("g-one" in route or "/no/such" in route for route, _ in by_route)
    assert by_route[("/leases", "200")] >= 1 and by_route[("/results", "200")] >= 1
    assert fams["sara_http_request_duration_seconds"].type == "histogram"
    assert "process_cpu_seconds" in fams and "python_info" in fams


async def test_engine_occupancy_is_what_live_workers_report_weighted_by_slots(make_api):
    api = await make_api(worker_stale_s=30)
    await api.add(prompt_spec("m", "mixed"))
    for worker, occupancy, slots in (("big", 0.9, 64), ("small", 0.3, 16)):
        await api.ok("POST", "/leases", {"worker_id": worker, "max_rollouts": 1, "wait_s": 0,
                                         "engine": {"occupancy": occupancy, "slots": slots}})
    await api.lease("silent", 1)            # reports no engine load: not counted
    stats = await api.stats()
    q, rows = stats["queues"], {w["worker_id"]: w for w in stats["workers"]}
    assert q["engine_slots"] == 80
    assert q["engine_occupancy"] == pytest.approx((0.9 * 64 + 0.3 * 16) / 80)
    assert (rows["big"]["engine_occupancy"], rows["big"]["engine_slots"]) == (0.9, 64)
    assert rows["silent"]["engine_occupancy"] is None
    fams = families((await api.get("/metrics")).text)
    assert fams["sara_queue_engine_occupancy"].samples[0].value == pytest.approx(
        q["engine_occupancy"])
    # a stale worker's engine no longer counts
    api.clock.advance(20)
    await api.ok("POST", "/leases", {"worker_id": "small", "max_rollouts": 1, "wait_s": 0,
                                     "engine": {"occupancy": 0.5, "slots": 16}})
    api.clock.advance(15)                    # "big" last seen 35 s ago: stale
    q = (await api.stats())["queues"]
    assert (q["engine_occupancy"], q["engine_slots"]) == (0.5, 16)


async def test_an_engine_load_out_of_bounds_is_refused_at_the_door(api):
    r = await api.post("/leases", {"worker_id": "w", "max_rollouts": 1,
                                   "engine": {"occupancy": 1.5, "slots": 8}})
    assert r.status_code == 422 and "occupancy" in r.text

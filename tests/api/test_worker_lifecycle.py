"""A worker's presence and its limits, against the real scheduler (create_app on a real Redis,
fake clock) through the SDK:

- one that stops on request shows as stopped at once (with what it did), not live; one that is
  killed stays live until it is stale, which it is once unseen for three heartbeat intervals
  (the lease TTL), and /stats says how long ago it was seen;
- one that finds no work says why (GET /run): "waiting for a trainer";
- one that cannot reach its URL names it and gives up after `give_up_after_s`;
- one told `checkpoint_root` refuses a policy published outside it and keeps its weights.
"""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from sara_client import AsyncSaraClient
from sara_service.embedded import free_port
from sara_worker.loop import WorkerLoop
from sara_worker.reporter import WorkerError
from sara_worker.sim.backend import SimBackend
from sara_worker.support import checkpoint_refusal
from tests.api.conftest import prompt_spec, result_for, sdk_for
from tests.api.test_worker_loop import Consumer, Gate, RecordingSim, config, sim_prompts

pytestmark = pytest.mark.anyio
SMALL = dict(policy="uniform", group_size=2, batch_size=2, prefetch_batches=2)


def _rows(stats) -> dict[str, dict]:
    return {w["worker_id"]: w for w in stats["workers"]}


async def test_a_worker_that_stops_shows_stopped_at_once_one_killed_goes_stale(make_api):
    api = await make_api(**SMALL)
    await api.add(*sim_prompts(8))
    client = sdk_for(api.app)
    try:
        stopped = WorkerLoop(client, SimBackend(seed=0), config("stopped", max_rollouts=4))
        assert (await asyncio.wait_for(stopped.run(), timeout=30)).reported == 4
        backend = SimBackend(seed=1, per_token_s=0.001, sleep=Gate())   # holds what it leases
        killed = WorkerLoop(client, backend, config("killed", capacity=2))
        task = asyncio.ensure_future(killed.run())
        assert await killed.wait_for(lambda: len(backend.inflight_ids()) == 2, timeout=30)
        task.cancel()   # a kill: nothing more is sent
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await client.aclose()
    rows = _rows(await api.stats())
    assert rows["stopped"]["stopped"] and not rows["stopped"]["stale"]
    assert rows["stopped"]["rollouts_completed"] == 4   # what it did still shows
    assert rows["stopped"]["rollouts_per_s"] is None
    assert not rows["killed"]["stopped"] and not rows["killed"]["stale"]   # until unseen long
    api.clock.advance(61.0)
    rows = _rows(await api.stats())
    assert rows["killed"]["stale"] and not rows["stopped"]["stale"]


async def test_a_stopped_worker_seen_again_is_live_again(make_api):
    api = await make_api(**SMALL)
    await api.add(*[prompt_spec(f"p{i}", "mixed") for i in range(8)])
    await api.lease("w1", 2)
    assert await api.ok("DELETE", "/workers/w1") == {"worker_id": "w1", "known": True}
    assert _rows(await api.stats())["w1"]["stopped"]
    api.clock.advance(1.0)
    await api.lease("w1", 2)
    assert not _rows(await api.stats())["w1"]["stopped"]
    assert await api.ok("DELETE", "/workers/nobody") == {"worker_id": "nobody", "known": False}


async def test_a_worker_unseen_for_three_heartbeat_intervals_is_stale(make_api):
    api = await make_api(**SMALL, lease_ttl_s=60.0)   # heartbeats every 20 s
    await api.add(*[prompt_spec(f"p{i}", "mixed") for i in range(8)])
    lease = await api.lease("w1", 2)
    api.clock.advance(5.0)
    await api.report("w1", [result_for(r) for r in lease["rollouts"]])
    held = await api.lease("w1", 2)
    live = _rows(await api.stats())["w1"]
    assert not live["stale"] and live["last_seen_ago_s"] == 0.0 and live["rollouts_per_s"]
    for _ in range(3):   # heartbeats keep it live past the TTL
        api.clock.advance(20.0)
        assert (await api.heartbeat(held["lease_id"], "w1")).status_code == 200
    assert not _rows(await api.stats())["w1"]["stale"]
    api.clock.advance(59.0)
    row = _rows(await api.stats())["w1"]
    assert not row["stale"] and row["last_seen_ago_s"] == 59.0
    api.clock.advance(2.0)   # 3 x 20 s and more unseen: stale, and no rate claimed for it
    row = _rows(await api.stats())["w1"]
    assert row["stale"] and row["last_seen_ago_s"] == 61.0
    assert row["rollouts_per_s"] is None and row["rollouts_completed"] == 2


async def test_an_idle_worker_says_it_is_waiting_for_a_trainer(make_app, caplog):
    app = make_app(**SMALL)
    client = sdk_for(app)
    caplog.set_level(logging.WARNING, logger="sara.worker")
    try:
        await client.add_prompts(sim_prompts(8))
        loop = WorkerLoop(client, SimBackend(seed=0), config("w1", idle_notice_s=0.0))
        said = lambda: any("waiting for a trainer" in r.getMessage()  # noqa: E731
                           for r in caplog.records)
        await loop.run_until(said)
    finally:
        await client.aclose()
    (line,) = [r.getMessage() for r in caplog.records if "waiting for a trainer" in
               r.getMessage()]
    assert line.startswith("no work for") and "http://test" in line
    assert "4 groups are ready" in line and "sara consume" in line


async def test_an_unreachable_scheduler_is_named_and_given_up_on(caplog):
    url = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    client = AsyncSaraClient(url, max_attempts=1)
    caplog.set_level(logging.WARNING, logger="sara.worker")
    loop = WorkerLoop(client, SimBackend(seed=0), config("w1", give_up_after_s=0.3,
                                                         backoff_initial_s=0.01,
                                                         backoff_max_s=0.05))
    try:
        with pytest.raises(WorkerError, match="giving up") as failed:
            await asyncio.wait_for(loop.run(), timeout=30)
    finally:
        await client.aclose()
    assert f"cannot reach the scheduler at {url}" in str(failed.value)
    warnings = [r.getMessage() for r in caplog.records if "lease failed" in r.getMessage()]
    assert warnings and all(url in w and "giving up in" in w for w in warnings)


async def test_a_checkpoint_outside_the_root_is_refused_and_the_weights_stay(make_api, tmp_path,
                                                                            caplog):
    root = tmp_path / "checkpoints"
    (root / "v2").mkdir(parents=True)
    api = await make_api(**SMALL, max_staleness=1)
    await api.add(*sim_prompts(8))
    backend = RecordingSim(seed=0)
    client = sdk_for(api.app)
    caplog.set_level(logging.ERROR, logger="sara.worker")
    loop = WorkerLoop(client, backend, config("w1", checkpoint_root=str(root)))
    consumer = Consumer(client, loop)
    run = asyncio.ensure_future(loop.run())
    try:
        await consumer.take(1)
        assert (await api.publish(1, str(tmp_path / "elsewhere"))).status_code == 200
        await consumer.take(4)   # work goes on, on the weights it has
        assert loop.policy_version == 0
        assert not [e for e in backend.events if e[0] == "load"]
        (refusal,) = [r.getMessage() for r in caplog.records]
        assert refusal.startswith("refusing policy v1: checkpoint") and str(root) in refusal
        assert (await api.publish(2, str(root / "v2"))).status_code == 200   # under the root
        await loop.wait_for(lambda: loop.policy_version == 2, timeout=30)
        assert [e for e in backend.events if e[0] == "load"] == [("load", 2, str(root / "v2"))]
    finally:
        loop.stop()
        await run
        await client.aclose()


async def test_the_scheduler_insisting_on_a_refused_checkpoint_stops_the_worker(make_api,
                                                                               tmp_path):
    api = await make_api(**SMALL, max_staleness=0)
    await api.add(*sim_prompts(8))
    client = sdk_for(api.app)
    loop = WorkerLoop(client, RecordingSim(seed=0),
                      config("w1", checkpoint_root=str(tmp_path)))
    assert (await api.publish(1, "/elsewhere/v1")).status_code == 200
    try:
        with pytest.raises(WorkerError, match="needs policy v1, refused: checkpoint"):
            await asyncio.wait_for(loop.run(), timeout=30)
    finally:
        await client.aclose()
    assert loop.policy_version == 0


def test_checkpoint_refusal_follows_links_and_dot_dots(tmp_path):
    root = tmp_path / "root"
    (root / "v1").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", root / "link")
    assert checkpoint_refusal(str(root / "v1"), str(root)) is None
    assert checkpoint_refusal(str(root / "v1"), None) is None
    assert checkpoint_refusal(None, str(root)) is None
    for bad in (tmp_path / "outside", root / ".." / "outside", root / "link"):
        assert "outside the checkpoint root" in checkpoint_refusal(str(bad), str(root))

"""The worker loop against the real scheduler (create_app on a real Redis) through the SDK.

The scheduler runs on the fake clock (leases expire only when a test moves it); the worker keeps
real time but every wait in these tests is on the loop's own state (`loop.wait_for`), not a sleep.
Generation that must stay in flight uses a sim backend whose injected sleep blocks until released.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from sara_client import AsyncSaraClient, Batch
from sara_worker.sim.backend import SimBackend
from sara_worker.loop import WorkerLoop
from sara_worker.support import WorkerConfig
from sara_worker.verifiers import score

pytestmark = pytest.mark.anyio
BASE_URL = "http://scheduler"
GAMMAS = (0.0, 1.0, 0.3, 0.5, 0.7, 0.5)


def sim_prompts(n: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "prompt": f"sim prompt {i}", "task": "sim",
             "meta": {"p_success": GAMMAS[i % len(GAMMAS)]}} for i in range(n)]


def sdk(app, transport: httpx.AsyncBaseTransport | None = None, **kw: Any) -> AsyncSaraClient:
    return AsyncSaraClient(BASE_URL, transport=transport or httpx.ASGITransport(app=app), **kw)


def config(worker_id: str, **kw: Any) -> WorkerConfig:
    base = dict(worker_id=worker_id, capacity=16, lease_wait_s=0, idle_poll_s=0.001,
                flush_interval_s=0.01, report_batch=8, backoff_initial_s=0.001,
                backoff_max_s=0.004)
    return WorkerConfig(**{**base, **kw})


class Gate:
    """An injected sleep that returns only once `open()` is called (or never)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()

    def open(self) -> None:
        self._open.set()

    async def __call__(self, seconds: float) -> None:
        await self._open.wait()


class RecordingSim(SimBackend):
    """A sim backend that logs load_policy and generate calls in order."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.events: list[tuple] = []

    async def generate(self, rollout, policy_version):
        self.events.append(("generate", rollout.rollout_id, policy_version))
        return await super().generate(rollout, policy_version)

    async def load_policy(self, version, checkpoint):
        self.events.append(("load", version, checkpoint))
        await super().load_policy(version, checkpoint)

    def generated(self) -> dict[str, int]:
        return {e[1]: e[2] for e in self.events if e[0] == "generate"}


class Consumer:
    """A trainer stand-in: pulls (and acks) batches, waiting on the worker's reports."""

    def __init__(self, client: AsyncSaraClient, loop: WorkerLoop) -> None:
        self.client, self.loop = client, loop
        self.batches: list[Batch] = []

    async def take(self, n: int, on_batch=None) -> list[Batch]:
        while len(self.batches) < n:
            seen = self.loop.counters.reported
            batch = await self.client.next_batch(wait_s=0)
            if batch is None:
                await self.loop.wait_for(lambda s=seen: self.loop.counters.reported != s)
                continue
            await self.client.ack(batch.batch_id)
            self.batches.append(batch)
            if on_batch is not None:
                await on_batch(batch)
        return self.batches


def assert_effective(batches: list[Batch], k: int) -> None:
    assert batches
    for batch in batches:
        for group in batch.groups:
            rewards = [r.reward for r in group.rollouts]
            assert len(rewards) == k, group
            assert 0 < sum(rewards) < k, f"saturated group delivered: {rewards}"
            for r in group.rollouts:
                assert r.reward == score("sim", r.completion, None, {})
                assert r.finish_reason in ("stop", "length") and r.completion_tokens > 0


async def run_with(loop: WorkerLoop, consumer: Consumer, n: int, timeout: float = 30.0,
                   on_batch=None):
    async def scenario():
        taker = asyncio.ensure_future(consumer.take(n, on_batch))
        counters = await loop.run_until(lambda: len(consumer.batches) >= n)
        await taker
        return counters

    return await asyncio.wait_for(scenario(), timeout)


async def server_counters(client: AsyncSaraClient):
    return (await client.stats()).counters


# --- the happy path ------------------------------------------------------------------------------


async def test_sim_worker_fills_batches_of_mixed_groups(make_app):
    app = make_app(policy="sara", group_size=4, batch_size=4, prefetch_batches=1)
    client = sdk(app)
    await client.add_prompts(sim_prompts(60))
    loop = WorkerLoop(client, SimBackend(seed=1), config("w-sim"))
    consumer = Consumer(sdk(app), loop)
    counters = await run_with(loop, consumer, 3)
    assert_effective(consumer.batches, k=4)
    assert all(r.policy_version == 0 for b in consumer.batches for g in b.groups
               for r in g.rollouts)
    server = await server_counters(client)
    assert counters.reported == counters.accepted == server.rollouts_completed > 0
    assert counters.transient_errors == counters.dropped == counters.aborted == 0
    assert not loop.held_ids() and not loop.outbox_ids()
    assert server.groups_abandoned > 0  # SARA cut saturated groups short along the way


async def test_the_worker_reports_its_engines_load_with_each_lease(make_app):
    """Every lease carries the share of the worker's slots generating since its previous one,
    so /stats shows the engine's occupancy as the worker sees it."""
    app = make_app(policy="sara", group_size=4, batch_size=4, prefetch_batches=1)
    client = sdk(app)
    await client.add_prompts(sim_prompts(60))
    sent, lease = [], client.lease

    async def recorded(*args, **kw):
        sent.append(kw.get("engine"))
        if sent[-1] is not None and len(sent) > 2:   # seen by /stats while the worker is live
            stats.append(await client.stats())
        return await lease(*args, **kw)

    stats: list = []
    client.lease = recorded
    loop = WorkerLoop(client, SimBackend(seed=1), config("w-load", engine_slots=8))
    await run_with(loop, Consumer(sdk(app), loop), 2)
    loads = [e for e in sent if e is not None]
    assert loads and all(e.slots == 8 and 0.0 <= e.occupancy <= 1.0 for e in loads)
    assert any(e.occupancy > 0 for e in loads)
    (row,) = [w for w in stats[-1].workers if w.worker_id == "w-load"]
    assert row.engine_slots == 8 and row.engine_occupancy is not None
    assert stats[-1].queues.engine_slots == 8


async def test_max_rollouts_ends_the_run(make_app):
    app = make_app(policy="uniform", group_size=4, batch_size=8)
    client = sdk(app)
    await client.add_prompts(sim_prompts(10))
    loop = WorkerLoop(client, SimBackend(), config("w-max", capacity=3, max_rollouts=10))
    counters = await asyncio.wait_for(loop.run(), 30)
    assert counters.leased == counters.reported == 10
    assert (await server_counters(client)).rollouts_completed == 10


# --- cancel lists --------------------------------------------------------------------------------


async def reissued_to_worker(make_app, fake_clock, capacity: int, heartbeat_s: float):
    """A slow worker leases a 4-rollout group and lets its lease run out; a worker loop gets the
    re-issued slots and generates them forever. Returns (client, loop, backend, run, ids)."""
    app = make_app(policy="uniform", group_size=4, batch_size=1, prefetch_batches=1,
                   lease_ttl_s=10)
    client = sdk(app)
    await client.add_prompts(sim_prompts(4)[3:])  # one prompt, γ = 0.5
    slow = await client.lease("slow", max_rollouts=4)
    ids = sorted(r.rollout_id for r in slow.rollouts)
    assert len(ids) == 4
    fake_clock.advance(11)  # the slow worker's lease runs out: the slots are issued again
    backend = SimBackend(seed=0, per_token_s=0.001, sleep=Gate())  # generation never ends
    loop = WorkerLoop(client, backend, config("w-fast", capacity=capacity,
                                              heartbeat_interval_s=heartbeat_s))
    run = asyncio.ensure_future(loop.run())
    assert await loop.wait_for(lambda: set(ids) <= backend.inflight_ids(), 10)
    return client, loop, backend, run, ids


async def slow_answers(client: AsyncSaraClient, ids: list[str]) -> None:
    """The slow worker answers after all: first result wins, re-issued copies are pointless."""
    results = [{"rollout_id": rid, "reward": float(i % 2), "completion": "slow",
                "completion_tokens": 3} for i, rid in enumerate(ids)]
    assert (await client.report("slow", results)).accepted == len(ids)


async def test_cancel_list_in_lease_answers_aborts_reissued_copies(make_app, fake_clock):
    # room for more work: the loop keeps leasing, and a lease answer brings the cancel list
    client, loop, backend, run, ids = await reissued_to_worker(make_app, fake_clock, 64, 100.0)
    await slow_answers(client, ids)
    assert await loop.wait_for(lambda: loop.counters.reported == 4, 10), loop.counters

    assert not set(ids) & backend.inflight_ids() and not set(ids) & loop.held_ids()
    assert loop.counters.cancelled == loop.counters.aborted == 4
    # the slots were answered already: counted (late or duplicate), never accepted
    assert loop.counters.accepted == 0
    assert loop.counters.duplicates + loop.counters.late == 4
    loop.stop(abort=True)  # other groups' rollouts may be in flight, and never end
    await asyncio.wait_for(run, 10)
    server = await server_counters(client)
    assert server.results_duplicate + server.results_late == 4
    assert server.rollouts_completed == 4
    batch = await client.next_batch(wait_s=0)
    assert batch is not None
    assert [r.completion for r in batch.groups[0].rollouts] == ["slow"] * 4


async def test_cancel_list_in_heartbeat_answers_aborts_reissued_copies(make_app, fake_clock):
    # full: the loop does not lease, only heartbeats bring the cancel list
    client, loop, backend, run, ids = await reissued_to_worker(make_app, fake_clock, 4, 0.005)
    await slow_answers(client, ids[:2])
    assert await loop.wait_for(lambda: loop.counters.reported == 2, 10), loop.counters
    assert loop.counters.heartbeats > 0 and loop.counters.leases == 1
    assert loop.counters.cancelled == loop.counters.aborted == 2
    assert backend.inflight_ids() == set(ids[2:]) == loop.held_ids()
    loop.stop(abort=True)
    counters = await asyncio.wait_for(run, 10)
    assert counters.released == 2 and counters.reported == 2
    assert backend.inflight_ids() == set()


async def test_lease_lost_at_heartbeat_gives_its_rollouts_up(make_app, fake_clock):
    # every slot of the lease answered elsewhere: the heartbeat answers 404, the copies go
    client, loop, backend, run, ids = await reissued_to_worker(make_app, fake_clock, 4, 0.005)
    await slow_answers(client, ids)
    assert await loop.wait_for(lambda: loop.counters.released == 4, 10), loop.counters
    assert backend.inflight_ids() == set() and not loop.held_ids()
    assert loop.counters.aborted == 4 and loop.counters.reported == 0  # nothing to say
    loop.stop()
    await asyncio.wait_for(run, 10)
    server = await server_counters(client)
    assert server.rollouts_completed == 4 and server.results_late == 0


# --- policy versions -----------------------------------------------------------------------------


async def test_policy_bump_loads_weights_and_tags_later_results(make_app):
    app = make_app(policy="sara", group_size=4, batch_size=2, prefetch_batches=1)
    client = sdk(app)
    await client.add_prompts(sim_prompts(80))
    backend = RecordingSim(seed=3)
    loop = WorkerLoop(client, backend, config("w-policy", capacity=8))
    consumer = Consumer(sdk(app), loop)

    async def publish_after_first(batch: Batch) -> None:
        if len(consumer.batches) == 1:
            await client.publish_policy(1, "ckpt-1")

    def saw_v1() -> bool:
        return any(r.policy_version == 1 for b in consumer.batches for g in b.groups
                   for r in g.rollouts)

    async def scenario():
        while not saw_v1():
            await consumer.take(len(consumer.batches) + 1, publish_after_first)
            assert len(consumer.batches) < 30, "no result of policy v1 ever delivered"
        loop.stop()

    driver = asyncio.ensure_future(scenario())
    await asyncio.wait_for(loop.run(), 30)
    await driver

    loads = [e for e in backend.events if e[0] == "load"]
    assert loads == [("load", 1, "ckpt-1")]
    at = backend.events.index(loads[0])
    assert all(e[2] == 0 for e in backend.events[:at] if e[0] == "generate")
    assert all(e[2] == 1 for e in backend.events[at:] if e[0] == "generate")
    assert loop.policy_version == 1 and loop.counters.policy_loads == 1
    versions = backend.generated()
    for batch in consumer.batches:
        for group in batch.groups:
            for r in group.rollouts:
                assert r.policy_version == versions[r.rollout_id]
    assert_effective(consumer.batches, k=4)


# --- failures ------------------------------------------------------------------------------------


async def test_killed_worker_loses_nothing(make_app, fake_clock):
    app = make_app(policy="sara", group_size=4, batch_size=2, prefetch_batches=1,
                   lease_ttl_s=30)
    client = sdk(app)
    await client.add_prompts(sim_prompts(40))
    backend1 = SimBackend(seed=5, per_token_s=0.001, sleep=Gate())
    loop1 = WorkerLoop(client, backend1, config("w-doomed", capacity=6))
    run1 = asyncio.ensure_future(loop1.run())
    assert await loop1.wait_for(lambda: len(backend1.inflight_ids()) == 6, 10)
    held = loop1.held_ids()
    run1.cancel()  # SIGKILL: gone without a word
    with pytest.raises(asyncio.CancelledError):
        await run1
    assert (await server_counters(client)).rollouts_completed == 0

    fake_clock.advance(31)
    backend2 = RecordingSim(seed=5)
    loop2 = WorkerLoop(client, backend2, config("w-heir"))
    consumer = Consumer(sdk(app), loop2)
    await run_with(loop2, consumer, 3)
    assert held <= set(backend2.generated())
    assert_effective(consumer.batches, k=4)
    server = await server_counters(client)
    assert server.rollouts_reissued >= len(held)


async def test_stop_finishes_and_reports_what_it_held(make_app):
    app = make_app(policy="uniform", group_size=4, batch_size=8)
    client = sdk(app)
    await client.add_prompts(sim_prompts(4))
    gate = Gate()
    backend = SimBackend(seed=2, per_token_s=0.001, sleep=gate)
    loop = WorkerLoop(client, backend, config("w-term", capacity=5))
    run = asyncio.ensure_future(loop.run())
    assert await loop.wait_for(lambda: len(backend.inflight_ids()) == 5, 10)
    loop.stop()  # what SIGTERM does
    leased = loop.counters.leased
    gate.open()  # the generations in flight run to their end
    counters = await asyncio.wait_for(run, 10)
    assert counters.leased == leased == 5  # nothing leased after the stop
    assert counters.reported == counters.accepted == 5 and counters.aborted == 0
    assert (await server_counters(client)).rollouts_completed == 5


async def test_stop_with_abort_releases_in_flight_rollouts(make_app, fake_clock):
    app = make_app(policy="uniform", group_size=4, batch_size=8, lease_ttl_s=10)
    client = sdk(app)
    await client.add_prompts(sim_prompts(4))
    backend = SimBackend(seed=2, per_token_s=0.001, sleep=Gate())
    loop = WorkerLoop(client, backend, config("w-abort", capacity=5, on_stop="abort"))
    run = asyncio.ensure_future(loop.run())
    assert await loop.wait_for(lambda: len(backend.inflight_ids()) == 5, 10)
    held = loop.held_ids()
    loop.stop()
    counters = await asyncio.wait_for(run, 10)
    assert backend.inflight_ids() == set()
    assert counters.aborted == counters.released == 5 and counters.reported == 0
    # a partial completion is not a result: nothing was recorded, and the slots come back
    assert (await server_counters(client)).rollouts_completed == 0
    fake_clock.advance(11)
    again = await client.lease("w-next", max_rollouts=16)
    assert held <= {r.rollout_id for r in again.rollouts}


class Flaky(httpx.AsyncBaseTransport):
    """The scheduler's transport, refusing connections while `down` (or for `fail_results`
    POST /results calls)."""

    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.down, self.fail_results, self.refused = False, 0, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down or (self.fail_results and request.url.path == "/results"):
            if not self.down:
                self.fail_results -= 1
            self.refused += 1
            raise httpx.ConnectError("connection refused", request=request)
        return await self.inner.handle_async_request(request)


async def test_worker_outlives_a_scheduler_outage(make_app):
    app = make_app(policy="sara", group_size=4, batch_size=2, prefetch_batches=1)
    admin = sdk(app)
    await admin.add_prompts(sim_prompts(40))
    flaky = Flaky(app)

    async def no_wait(seconds: float) -> None:
        return None

    client = sdk(app, transport=flaky, max_attempts=2, sleep=no_wait)
    loop = WorkerLoop(client, SimBackend(seed=4), config("w-flaky"))
    consumer = Consumer(admin, loop)
    flaky.down = True

    async def scenario():
        # down far longer than the SDK's own retries: the loop keeps backing off
        assert await loop.wait_for(lambda: loop.counters.transient_errors >= 5, 10)
        assert loop.counters.leased == 0
        flaky.down, flaky.fail_results = False, 6  # back, but reports fail a while longer
        await consumer.take(3)

    driver = asyncio.ensure_future(scenario())
    counters = await asyncio.wait_for(loop.run_until(lambda: driver.done()), 30)
    await driver
    assert flaky.refused >= 16 and flaky.fail_results == 0
    assert counters.dropped == 0 and counters.reported == counters.accepted
    assert (await server_counters(admin)).rollouts_completed == counters.accepted
    assert_effective(consumer.batches, k=4)


async def test_heartbeats_keep_long_generations_leased(make_app, fake_clock):
    app = make_app(policy="uniform", group_size=4, batch_size=8, lease_ttl_s=10)
    client = sdk(app)
    await client.add_prompts(sim_prompts(1))
    gate = Gate()
    backend = SimBackend(seed=0, per_token_s=0.001, sleep=gate)
    loop = WorkerLoop(client, backend, config("w-long", capacity=4, heartbeat_interval_s=0.005))
    run = asyncio.ensure_future(loop.run())
    assert await loop.wait_for(lambda: len(backend.inflight_ids()) == 4, 10)
    for _ in range(3):  # 3 x 8 s > the 10 s TTL, with a heartbeat in between each time
        fake_clock.advance(8)
        beats = loop.counters.heartbeats
        # the second heartbeat from now surely started after the clock moved
        assert await loop.wait_for(lambda b=beats: loop.counters.heartbeats >= b + 2, 10)
    held = loop.held_ids()
    thief = await client.lease("w-thief", max_rollouts=8)
    assert not held & {r.rollout_id for r in thief.rollouts}
    gate.open()
    loop.stop()
    counters = await asyncio.wait_for(run, 10)
    assert counters.accepted == 4
    assert (await server_counters(client)).rollouts_reissued == 0


# --- the `sara worker` command -------------------------------------------------------------------


def test_cli_worker_runs_and_exits_0():
    from typer.testing import CliRunner

    from sara_cli import main as cli

    # --max-rollouts 0: builds the backend and the loop, leases nothing, shuts down cleanly
    result = CliRunner().invoke(cli.app, ["worker", "--backend", "sim", "--max-rollouts", "0",
                                          "--url", "http://127.0.0.1:9", "-o", "step_tokens=4",
                                          "--worker-id", "cli-test"])
    assert result.exit_code == 0, result.output
    assert "worker cli-test stopped" in result.output


@pytest.mark.parametrize("args,message", [
    (["--backend", "no-such-backend"], "unknown backend"),
    (["--on-stop", "later"], "--on-stop"),
    (["-o", "novalue"], "KEY=VALUE"),
])
def test_cli_worker_rejects_bad_options_with_exit_2(args, message):
    from typer.testing import CliRunner

    from sara_cli import main as cli

    result = CliRunner().invoke(cli.app, ["worker", "--max-rollouts", "0", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


class LosesAnswers(httpx.AsyncBaseTransport):
    """The scheduler's transport; the first `lose` POST /results calls are applied and then
    time out, as when the answer is lost on the way back (not retried by the SDK itself)."""

    def __init__(self, app, lose: int) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.lose = lose

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if self.lose and request.url.path == "/results":
            self.lose -= 1
            await response.aread()
            raise httpx.ReadTimeout("answer lost", request=request)
        return response


async def test_a_report_whose_answer_was_lost_is_resent_as_it_was(make_app):
    # the worker's own retry sends the same batch with the same report id,
    # so the scheduler answers it again (accepted, cancels) instead of counting duplicates
    app = make_app(policy="sara", group_size=4, batch_size=2, prefetch_batches=1)
    admin = sdk(app)
    await admin.add_prompts(sim_prompts(40))
    lossy = LosesAnswers(app, lose=3)
    loop = WorkerLoop(sdk(app, transport=lossy), SimBackend(seed=5), config("w-lossy"))
    consumer = Consumer(admin, loop)
    driver = asyncio.ensure_future(consumer.take(2))
    counters = await asyncio.wait_for(loop.run_until(lambda: driver.done()), 30)
    await driver
    assert lossy.lose == 0 and counters.transient_errors >= 3
    assert counters.duplicates == 0
    assert counters.reported == counters.accepted + counters.late
    assert (await server_counters(admin)).rollouts_completed == counters.accepted


class HeldBackend(SimBackend):
    """Each generation waits until the test releases it (by rollout id)."""

    def __init__(self) -> None:
        super().__init__()
        self.release: dict[str, asyncio.Event] = {}

    async def generate(self, rollout, policy_version):
        gate = self.release.setdefault(rollout.rollout_id, asyncio.Event())
        await gate.wait()
        return await super().generate(rollout, policy_version)


async def test_worker_leases_again_only_once_a_lease_worth_of_slots_is_free(make_app):
    """While rollouts are held, a lease waits for lease_min_size free slots: a lease is a
    round trip to the scheduler whatever its size."""
    app = make_app(policy="uniform", group_size=4, batch_size=8)
    client = sdk(app)
    await client.add_prompts(sim_prompts(40))
    backend = HeldBackend()
    loop = WorkerLoop(client, backend, config("w-min", capacity=8, lease_min_size=4))
    runner = asyncio.ensure_future(loop.run())
    try:
        assert await loop.wait_for(lambda: len(loop.held_ids()) == 8, 10)
        assert loop.counters.leases == 1
        first = sorted(loop.held_ids())
        for rid in first[:3]:
            backend.release[rid].set()
        assert await loop.wait_for(lambda: loop.counters.accepted == 3, 10)
        assert loop.counters.leases == 1 and len(loop.held_ids()) == 5   # 3 free < 4: wait
        backend.release[first[3]].set()
        assert await loop.wait_for(lambda: loop.counters.leases == 2, 10)
        assert await loop.wait_for(lambda: len(loop.held_ids()) == 8, 10)
    finally:
        loop.stop(abort=True)
        for gate in backend.release.values():
            gate.set()
        await asyncio.wait_for(runner, 30)


def test_lease_min_size_defaults_to_a_quarter_of_capacity():
    assert WorkerConfig(capacity=64).lease_min == 16
    assert WorkerConfig(capacity=3).lease_min == 1
    assert WorkerConfig(capacity=64, lease_min_size=5).lease_min == 5
    with pytest.raises(ValueError, match="lease_min_size"):
        WorkerConfig(lease_min_size=0)

"""The Ray worker fleet (sara_worker.fleet) on a local Ray cluster on CPU: an actor killed while
it holds a lease is restarted by Ray and runs its loop again, the rollouts it held are issued
again once their lease expires and end answered, and a drain stops the fleet with nothing held.

`sara serve` on the session's real Redis, two actors running the sim backend (slow enough per
token that leases are held for a while), the trainer taking batches through the SDK. Ray is
started with two CPUs and stopped at the end. Synchronisation is by polling a condition with a
deadline, never by a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from sara_service.store.redis_format import decode_slot
from tests._need import need
from tests.e2e._harness import load_synthetic

from ._support import (
    Deliveries, check_accounting, check_batches, count_slots, held_by, serve_process,
    slot_states,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

K, BATCH_SIZE, N_PROMPTS, SEED = 4, 2, 200, 5
LEASE_TTL_S = 2.0
N_BATCHES = 6
KILL_AFTER = 2  # batches received before the actor is killed


@pytest.fixture(scope="module")
def ray_cpu():
    ray = need("ray", "ray is not installed (.ci/run installs it for verl)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    """Re-check `predicate` until truthy (its value), or AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)  # a poll interval: the loop ends on the condition
    return value


def test_fleet_actor_killed_mid_lease_loses_nothing(tmp_path, redis_url, ray_cpu):
    from sara_client import SaraClient
    from sara_worker.fleet import Fleet, FleetSpec

    namespace = f"fleet-{uuid.uuid4().hex[:8]}"
    server = serve_process(tmp_path, redis_url, namespace, "serve", group_size=K,
                           batch_size=BATCH_SIZE, seed=SEED, lease_ttl_s=LEASE_TTL_S)
    fleet = None
    try:
        server.start()
        load_synthetic(server.url, N_PROMPTS, SEED)
        fleet = Fleet(FleetSpec(
            url=server.url, backend="sim", options={"seed": SEED, "per_token_s": 0.005},
            actors=2, cpus_per_actor=0.5, name="fleet",
            worker={"capacity": 8, "lease_wait_s": 0.5, "lease_ttl_s": LEASE_TTL_S,
                    "drain_timeout_s": 30.0, "flush_interval_s": 0.05})).start()
        with SaraClient(server.url) as trainer:
            deliveries = Deliveries()
            _take(trainer, deliveries, fleet, KILL_AFTER)
            orphaned, old_pid = _kill_mid_lease(fleet, redis_url, namespace, trainer, deliveries)
            # Ray restarts the process and the fleet runs the loop again, same worker id
            wait_for(lambda: fleet.poll() or fleet.restarts[0] == 1, 60, "the fleet to see it")
            assert fleet.restarts == [1, 0]
            assert wait_for(lambda: _pid_when_up(fleet, 0), 60, "the restarted actor") != old_pid
            _take(trainer, deliveries, fleet, N_BATCHES)
            # the killed actor's rollouts: issued again after their lease expired, answered
            answered = wait_for(lambda: _answered(redis_url, namespace, orphaned, fleet), 60,
                                "the killed actor's rollouts to be answered")
            counters = fleet.drain(timeout_s=60)
            stats = trainer.stats()
    finally:
        if fleet is not None and fleet.actors:
            fleet.shutdown()
        server.stop()
        print(server.log_tail())  # shown when the test fails

    assert sorted(counters) == [0, 1] and all(c["reported"] > 0 for c in counters.values())
    assert stats.queues.leased == 0, "a drained fleet holds no lease"
    check_accounting(stats, count_slots(redis_url, namespace))
    check_batches(deliveries, k=K, batch_size=BATCH_SIZE)
    # an orphaned rollout can only be done through being issued again (or cancelled, when its
    # group was decided meanwhile)
    assert stats.counters.rollouts_reissued >= answered.count("done")
    workers = {w.worker_id for w in stats.workers}
    assert {"fleet-0", "fleet-1"} <= workers


def _pid_when_up(fleet, index: int) -> int | None:
    """The actor's pid, or None while Ray is still restarting it."""
    import ray

    try:
        return fleet.info(index)["pid"]
    except ray.exceptions.ActorUnavailableError:
        return None


def _take_one(trainer, deliveries: Deliveries, wait_s: float) -> None:
    """Take and ack one batch if one is ready within `wait_s`."""
    batch = trainer.next_batch(wait_s=wait_s)
    if batch is not None:
        deliveries.add(batch, "trainer", trainer.base_url)
        assert trainer.ack(batch.batch_id).acked
        deliveries.acked.append(batch.batch_id)


def _take(trainer, deliveries: Deliveries, fleet, n: int) -> None:
    """Take and ack batches until `n` have arrived, supervising the fleet in between."""
    def one() -> bool:
        assert not fleet.poll(), f"the fleet stopped: {fleet.counters}"
        _take_one(trainer, deliveries, 0.5)
        return len(deliveries) >= n

    wait_for(one, 120, f"{n} batches", interval_s=0.0)


def _kill_mid_lease(fleet, redis_url: str, namespace: str, trainer,
                    deliveries: Deliveries) -> tuple[set[str], int]:
    """Wait until actor 0 holds several leased rollouts, then ray.kill it (Ray restarts it):
    the rollouts still leased to it after the kill, which no process of it will answer, and
    the pid it had."""
    pid = fleet.info(0)["pid"]
    def holding() -> set[str]:
        # the trainer keeps taking batches meanwhile: with none taken, flow control would let
        # the queue run dry and no actor would hold anything
        _take_one(trainer, deliveries, 0.0)
        h = held_by(redis_url, namespace, "fleet-0")
        return h if len(h) >= 4 else set()

    held = wait_for(holding, 30, "actor 0 to hold a lease of 4")
    fleet.kill(0, restart=True)
    wait_for(lambda: not _alive(pid), 30, f"actor 0's process {pid} to be gone")
    # a new process of actor 0 leases again only after Ray restarted it; what is still leased to
    # "fleet-0" among `held` now was held by the dead process
    orphaned = held & held_by(redis_url, namespace, "fleet-0")
    assert orphaned, "actor 0 answered everything before the kill landed"
    return orphaned, pid


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie is dead, not yet reaped
    except (FileNotFoundError, ProcessLookupError):
        return False


def _answered(redis_url: str, namespace: str, rollout_ids: set[str], fleet) -> list[str]:
    """The kinds (done, cancelled) of `rollout_ids` once none is pending or leased, else []."""
    fleet.poll()
    states = slot_states(redis_url, namespace, sorted(rollout_ids))
    kinds = [decode_slot(s).kind if s is not None else "missing" for s in states.values()]
    return kinds if all(k in ("done", "cancelled") for k in kinds) else []


def test_sara_fleet_joins_a_running_ray_cluster_and_drains_on_sigterm(tmp_path, redis_url,
                                                                      ray_cpu):
    """`sara fleet --address` (the entry point) joins the Ray cluster this test started, its
    actor works for the scheduler, and SIGTERM drains it: exit 0, no lease left behind."""
    from sara_client import SaraClient

    namespace = f"fleet-cli-{uuid.uuid4().hex[:8]}"
    server = serve_process(tmp_path, redis_url, namespace, "serve", group_size=K,
                           batch_size=BATCH_SIZE, seed=SEED, lease_ttl_s=LEASE_TTL_S)
    address = ray_cpu.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "sara_cli", "fleet", "--address", address, "--actors", "1",
           "--cpus-per-actor", "0.5", "--name", "cli", "--backend", "sim", "--option",
           "per_token_s=0.01", "--capacity", "4", "--drain-timeout", "20", "--log-level",
           "warning"]
    log = tmp_path / "fleet.log"
    proc = None
    try:
        server.start()
        load_synthetic(server.url, 40, SEED)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SARA_")},
               "SARA_URL": server.url, "SARA_LEASE_TTL_S": str(LEASE_TTL_S)}
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        with SaraClient(server.url) as client:
            wait_for(lambda: _completed_by(client, "cli-0") >= 8 or proc.poll() is not None, 90,
                     "the fleet's actor to complete rollouts")
            assert proc.poll() is None, log.read_text()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, log.read_text()
            stats = client.stats()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        server.stop()
    assert "drained" in log.read_text()
    assert stats.queues.leased == 0, "the drain left a lease behind"
    check_accounting(stats, count_slots(redis_url, namespace))


def _completed_by(client, worker_id: str) -> int:
    return sum(w.rollouts_completed for w in client.stats().workers if w.worker_id == worker_id)


def test_a_loop_that_fails_for_good_is_raised_not_restarted(ray_cpu):
    """An error of the loop itself (here: an unknown backend) ends the fleet's wait with that
    error; only a dead process is restarted."""
    from sara_worker.fleet import Fleet, FleetSpec

    fleet = Fleet(FleetSpec(url="http://127.0.0.1:9", backend="no-such-backend", actors=1,
                            cpus_per_actor=0.5, name="bad")).start()
    try:
        with pytest.raises(ValueError, match="no-such-backend"):
            fleet.wait(timeout_s=60)
        assert fleet.restarts == [0]
    finally:
        fleet.shutdown()


def test_fleet_spec_refuses_an_empty_fleet_and_names_each_worker():
    from sara_worker.fleet import FleetSpec

    with pytest.raises(ValueError, match="at least one actor"):
        FleetSpec(url="http://x", actors=0)
    with pytest.raises(ValueError):
        FleetSpec(url="http://x", gpus_per_actor=-1)
    spec = FleetSpec(url="http://x", backend="sim", name="gpu", worker={"capacity": 3})
    config = spec.worker_config(2)
    assert (config.worker_id, config.backend_name, config.capacity) == ("gpu-2", "sim", 3)

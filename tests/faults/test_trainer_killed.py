"""The trainer SIGKILLed after it took a batch and before it acked: the batch is redelivered, once,
to the next trainer, with the same id and content.

A trainer subprocess (`_trainer_proc.py`) takes one batch, writes what it got to a file and hangs;
it is killed there. With `SARA_BATCH_ACK_TIMEOUT_S=2` the batch comes back to one of two trainers
that start after the kill, flagged `redelivered`, not before its ack timeout, and after their ack
it is never delivered again: it is acked in Redis and out of the unacked set, the only place a
redelivery comes from.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from sara_client import Batch
from sara_service.store.keys import Keys

from tests.e2e._harness import BernoulliWorker, Ledger, RewardScript, _die_with_parent, \
    load_synthetic

from ._support import (
    Deliveries, batch_content, check_accounting, check_batches, check_drained, consume, drain,
    end, finish, poll_until, sdk_client, serve_process, settle_batches, sigkill, snapshot, tail,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

K, BATCH_SIZE, N_PROMPTS, SEED = 4, 4, 200, 14
ACK_TIMEOUT_S = 2.0
N_BATCHES = 8  # taken by the trainers that come after the killed one
TRAINER = Path(__file__).with_name("_trainer_proc.py")


def test_trainer_killed_before_ack_batch_redelivered_exactly_once(redis_server, tmp_path):
    namespace = f"fault-trainer-{uuid.uuid4().hex[:8]}"
    server = serve_process(tmp_path, redis_server.url, namespace, "serve", group_size=K,
                           batch_size=BATCH_SIZE, seed=SEED, batch_ack_timeout_s=ACK_TIMEOUT_S)
    trainer_log = tmp_path / "trainer.log"
    out = tmp_path / "taken.json"
    proc = None
    try:
        server.start()
        load_synthetic(server.url, N_PROMPTS, SEED)
        with trainer_log.open("wb") as log:
            proc = subprocess.Popen([sys.executable, str(TRAINER), server.url, str(out)],
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        asyncio.run(_scenario(server.url, redis_server.url, namespace, proc, out))
        assert server.alive
    finally:
        if proc is not None:
            end(proc)
        server.stop()
        print(server.log_tail(), tail(trainer_log))  # shown when the test fails


async def _scenario(url: str, redis_url: str, namespace: str, proc, out: Path) -> None:
    client = sdk_client(url)
    trainers = [sdk_client(url), sdk_client(url)]
    worker = BernoulliWorker("w0", [client], RewardScript(SEED), Ledger(), lease_size=8,
                             report_size=4)
    deliveries = Deliveries()
    stop, stop_worker = asyncio.Event(), asyncio.Event()
    try:
        worker_task = asyncio.ensure_future(worker.run(stop_worker))
        await poll_until(lambda: out.exists() or proc.poll() is not None or worker_task.done(),
                         30, "the first trainer to take a batch")
        assert proc.poll() is None, "the trainer exited instead of holding its batch"
        sigkill(proc)
        taken = Batch.model_validate_json(out.read_text())
        assert not taken.redelivered

        tasks = [asyncio.ensure_future(consume(t, deliveries, f"trainer{i}", stop, N_BATCHES))
                 for i, t in enumerate(trainers)]
        await poll_until(lambda: len(deliveries) >= N_BATCHES or any(t.done() for t in tasks)
                         or worker_task.done(), 60, f"{N_BATCHES} batches")
        stop.set()
        await finish(tasks)
        await settle_batches(trainers[0], deliveries, "trainer0")
        stop_worker.set()
        await finish([worker_task])
        await worker.collect_cancels()
        stats, slots = await snapshot(client, redis_url, namespace)
        check_accounting(stats, slots)
        await drain([worker], client)
        final, slots = await snapshot(client, redis_url, namespace)
        check_drained(final, slots)
    finally:
        for c in [client, *trainers]:
            await c.aclose()

    # Redelivered exactly once, to one of the next trainers, same id and content, and not before
    # its ack timeout ran out.
    again = [r for r in deliveries.received if r.batch.batch_id == taken.batch_id]
    assert len(again) == 1, [(r.consumer, r.batch.redelivered) for r in again]
    assert again[0].batch.redelivered
    assert batch_content(again[0].batch) == batch_content(taken)
    assert again[0].at - taken.created_at >= ACK_TIMEOUT_S - 0.05
    assert [r.batch.batch_id for r in deliveries.received if r.batch.redelivered] == \
        [taken.batch_id]

    # Acked now: it cannot come back.
    keys = Keys(namespace)
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert store.hget(keys.batch(taken.batch_id), "state") == "acked"
        assert store.zscore(keys.unacked, taken.batch_id) is None
        assert store.zcard(keys.unacked) == 0
    finally:
        store.close()

    # No group twice, the killed trainer's groups included (they came once, in the redelivery).
    check_batches(deliveries, k=K, batch_size=BATCH_SIZE)
    c = final.counters
    assert c.batches_redelivered == 1
    assert c.batches_formed == c.batches_acked == len(deliveries)
    assert c.groups_delivered == c.groups_acked == len(deliveries) * BATCH_SIZE

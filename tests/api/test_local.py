"""sara_client.local(): the real scheduler in-process, behind the ordinary client."""

from __future__ import annotations

import random

import pytest

import sara_client
from sara_client import SaraClient


def _drive(sara, rounds: int = 60, seed: int = 0) -> list:
    """A caller's own loop: lease, 'generate' Bernoulli(0.5) rewards, report, collect batches."""
    rng = random.Random(seed)
    batches = []
    for _ in range(rounds):
        lease = sara.lease("me", max_rollouts=16)
        if lease.rollouts:
            sara.report("me", [{"rollout_id": r.rollout_id, "reward": float(rng.random() < 0.5)}
                               for r in lease.rollouts])
        batch = sara.next_batch()
        if batch is not None:
            batches.append(batch)
            sara.ack(batch.batch_id)
    return batches


def test_local_runs_the_scheduler_in_process_and_delivers_only_effective_groups(tmp_path):
    with sara_client.local(data_dir=tmp_path, group_size=4, batch_size=2) as sara:
        assert isinstance(sara, SaraClient)
        sara.add_prompts([{"id": f"p{i}", "prompt": f"q{i}"} for i in range(20)])
        batches = _drive(sara)
        stats = sara.stats()
    assert len(batches) >= 3
    for batch in batches:
        for group in batch.groups:
            rewards = [r.reward for r in group.rollouts]
            assert len(rewards) == 4 and 0 < sum(rewards) < 4
    assert stats.counters.groups_acked == sum(len(b.groups) for b in batches)
    assert stats.config["redis"] == "embedded"
    assert (tmp_path / "appendonlydir").exists() or any(tmp_path.glob("*.aof"))


def test_local_keeps_state_across_restarts_of_the_same_data_dir(tmp_path):
    with sara_client.local(data_dir=tmp_path) as sara:
        sara.add_prompts([{"id": "kept", "prompt": "q"}])
    with sara_client.local(data_dir=tmp_path) as sara:
        assert sara.get_prompt("kept").prompt == "q"


@pytest.mark.anyio
async def test_alocal_serves_the_async_client_on_the_callers_loop(tmp_path):
    # k = 2 needs tau_low below 1/3: a uniform prior gives P(mixed) = 1/3 before any rollout
    async with sara_client.alocal(data_dir=tmp_path, group_size=2, batch_size=1,
                                  tau_low=0.3) as sara:
        await sara.add_prompts([{"id": "a", "prompt": "q"}])
        lease = await sara.lease("me", max_rollouts=2)
        out = await sara.report("me", [{"rollout_id": r.rollout_id, "reward": float(i)}
                                       for i, r in enumerate(lease.rollouts)])
        assert [d.decision for d in out.decisions] == ["commit"]
        batch = await sara.next_batch()
        assert batch is not None and len(batch.groups[0].rollouts) == 2

"""When a batch's worth of groups is ready and no trainer has asked for one for a while, /stats
and GET /run say "waiting for a trainer" (workers then idle once flow control is full, and
nothing else would say why); a trainer that asks or acks clears it. Fake clock, real Redis."""

from __future__ import annotations

import pytest

from sara_service.core.observability import scarce_effective_warning, trainer_wait_warning

from .conftest import prompt_spec, result_for

pytestmark = pytest.mark.anyio
SETTINGS = dict(policy="uniform", group_size=2, batch_size=2, prefetch_batches=2,
                trainer_wait_warn_s=30.0)
WAITING = "waiting for a trainer"


async def _fill(api) -> None:
    """Prompts and a worker's results until flow control is full (two batches ready)."""
    await api.add(*[prompt_spec(f"p{i}", "mixed") for i in range(8)])
    await api.work("w1", n=4)


async def _warnings(api) -> tuple[list[str], list[str]]:
    stats = await api.stats()
    run = await api.ok("GET", "/run")
    return stats["warnings"], run["warnings"]


async def test_ready_groups_with_no_trainer_yet_are_waiting_for_a_trainer(make_api):
    api = await make_api(**SETTINGS)
    await _fill(api)
    stats, run = await _warnings(api)
    assert (await api.stats())["queues"]["ready_groups"] == 4
    (warning,) = [w for w in stats if WAITING in w]
    assert run == [warning]
    assert "4 groups are ready" in warning and "no trainer has asked for a batch yet" in warning
    assert "sara consume" in warning


async def test_a_trainer_that_asks_clears_it_until_it_is_gone_a_while(make_api):
    api = await make_api(**SETTINGS)
    await _fill(api)
    batch = (await api.next_batch()).json()
    await api.ok("POST", f"/batches/{batch['batch_id']}/ack")
    await api.work("w1", n=4)   # flow control full again: a batch's worth ready
    assert (await api.stats())["queues"]["ready_groups"] >= SETTINGS["batch_size"]
    assert await _warnings(api) == ([], [])
    api.clock.advance(29.0)
    assert await _warnings(api) == ([], [])
    api.clock.advance(2.0)
    stats, run = await _warnings(api)
    assert run == stats and "no trainer has asked for a batch for 31 s" in run[0]


async def test_fewer_ready_groups_than_a_batch_is_not_waiting(make_api):
    api = await make_api(**SETTINGS)
    await api.add(*[prompt_spec(f"p{i}", "mixed") for i in range(8)])
    lease = await api.lease("w1", 2)   # one group of k=2
    await api.report("w1", [result_for(r) for r in lease["rollouts"]])
    assert (await api.stats())["queues"]["ready_groups"] == 1
    assert await _warnings(api) == ([], [])


def test_the_warning_rule():
    assert trainer_wait_warning(1, 2, None, 0.0, 30.0) is None        # not a batch yet
    assert WAITING in trainer_wait_warning(2, 2, None, 0.0, 30.0)     # never asked
    assert trainer_wait_warning(64, 32, 100.0, 129.0, 30.0) is None   # asked 29 s ago
    assert "for 30 s" in trainer_wait_warning(64, 32, 100.0, 130.0, 30.0)


async def test_a_trainer_waiting_on_a_pool_that_gives_few_mixed_groups_is_told_why(make_api):
    """Scarce good prompts: the trainer's request waits (no error, nothing lost), and once no
    batch has formed for a while /stats and GET /run say what it waits for."""
    api = await make_api(policy="sara", group_size=8, batch_size=4, prefetch_batches=2,
                         trainer_wait_warn_s=30.0)
    await api.add(*[prompt_spec(f"f{i}", "fail") for i in range(12)],
                  prompt_spec("m0", "mixed"))
    for _ in range(6):
        await api.work("w1", n=16, rounds=2)
    assert (await api.next_batch()).status_code == 204        # waits, no error
    stats, run = await _warnings(api)
    (warning,) = [w for w in stats if "waiting for mixed groups" in w]
    assert run == stats
    assert "a trainer asks for a batch of 4" in warning and "came out mixed" in warning
    assert "Nothing is lost" in warning


def test_the_scarce_rule():
    # (ready, batch, trainer seen, last batch, committed, decided, now, after)
    assert scarce_effective_warning(1, 4, 95.0, None, 2, 40, 100.0, 30.0)      # asking, stalled
    assert not scarce_effective_warning(1, 4, 50.0, None, 2, 40, 100.0, 30.0)  # nobody asking
    assert not scarce_effective_warning(1, 4, 95.0, 90.0, 2, 40, 100.0, 30.0)  # a recent batch
    assert not scarce_effective_warning(4, 4, 95.0, None, 2, 40, 100.0, 30.0)  # a batch is ready
    assert not scarce_effective_warning(1, 4, 95.0, None, 2, 3, 100.0, 30.0)   # too few decided
    assert not scarce_effective_warning(1, 4, 95.0, None, 30, 40, 100.0, 30.0)  # mixed enough

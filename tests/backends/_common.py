"""Scenarios every generation backend goes through, against the real scheduler where it applies.

Each takes the backend plus small callbacks for what differs between engines:

- `pause()` / `resume()`: freeze generation so that rollouts stay in flight while the test acts
  (vLLM: `pause_generation(mode="keep")`; a vLLM server: `POST /pause?mode=keep`; hf: block its
  torch thread). Nothing here waits on wall-clock time: every wait is on a condition
  (`backend.wait_tokens`, `loop.wait_for`) with a generous deadline.
- `while_paused(aborted_ids, running_ids)`: checks on the engine's own state after the aborted
  rollouts have returned and before the paused ones resume (only called when the backend answers
  an abort while paused; hf drops aborted rows at its next step, so it answers after `resume`).
- `started(backend, ids)`: how to know the rollouts are being generated (default: the backend has
  produced 2 tokens of each). An engine runs ahead of the client reading its output, by as much
  as its CPU share allows: the rollouts a test freezes mid-way are LONG_TOKENS long, and a
  server whose API process can lag by seconds behind its engine is frozen before they start.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Callable

from sara_client import Batch
from sara_client.models import Rollout, SamplingParams
from sara_worker.backends.base import Generation
from sara_worker.loop import WorkerLoop
from sara_worker.support import WorkerConfig

Callback = Callable[[], Awaitable[Any]]
Started = Callable[[Any, list[str]], Awaitable[bool]]


async def two_tokens_each(backend: Any, ids: list[str]) -> bool:
    return await backend.wait_tokens(ids, 2, TIMEOUT)
MAX_TOKENS = 60  # default length of the rollouts a test aborts mid-way
# Positions of the test policies: room for rollouts long enough (LONG_TOKENS) that a test can
# freeze an engine mid-way through them even when the client reads its stream late.
CONTEXT = 2048
LONG_TOKENS = 1500
TIMEOUT = 120.0


def rollout(rid: str, prompt: str, **sampling: Any) -> Rollout:
    group = rid.rsplit(":", 1)[0]
    return Rollout(rollout_id=rid, group_id=group, prompt_id="p", prompt=prompt, task="exact",
                   sampling=SamplingParams(**sampling))


def config(worker_id: str, **kw: Any) -> WorkerConfig:
    base = dict(worker_id=worker_id, capacity=4, lease_wait_s=0, idle_poll_s=0.01,
                flush_interval_s=0.01, report_batch=4, backoff_initial_s=0.01,
                backoff_max_s=0.05, drain_timeout_s=60)
    return WorkerConfig(**{**base, **kw})


def token_of(backend_dir: Path, char: str) -> int:
    from transformers import AutoTokenizer

    (token,) = AutoTokenizer.from_pretrained(backend_dir)(char)["input_ids"]
    return token


class Recorder:
    """A backend proxy that keeps every Generation by rollout id."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.name = backend, backend.name
        self.results: dict[str, Generation] = {}

    async def generate(self, rollout: Rollout, policy_version: int) -> Generation:
        gen = await self.backend.generate(rollout, policy_version)
        self.results[rollout.rollout_id] = gen
        return gen

    async def abort(self, rollout_id: str) -> None:
        await self.backend.abort(rollout_id)

    async def load_policy(self, version: int, checkpoint: str | None) -> None:
        await self.backend.load_policy(version, checkpoint)

    async def close(self) -> None:
        return None


def assert_well_formed(gen: Generation, max_tokens: int, logprobs: bool = True) -> None:
    assert gen.finish_reason in ("stop", "length"), gen
    assert 1 <= gen.completion_tokens <= max_tokens, gen
    assert gen.token_ids is not None and len(gen.token_ids) == gen.completion_tokens, gen
    if logprobs:
        assert gen.logprobs is not None and len(gen.logprobs) == gen.completion_tokens, gen
        assert all(lp <= 1e-4 for lp in gen.logprobs), gen
    if gen.finish_reason == "length":
        assert gen.completion_tokens == max_tokens, gen


# --- direct: generate, seeds -----------------------------------------------------------------


async def check_generation(backend: Any, version: int = 0) -> dict[str, Generation]:
    """Concurrent rollouts: well formed; a seed reproduces a sample; greedy is deterministic."""
    specs = {
        "s:0": rollout("s:0", "12+30=", temperature=1.0, top_p=0.9, max_tokens=16, seed=7),
        "s:1": rollout("s:1", "12+30=", temperature=1.0, top_p=0.9, max_tokens=16, seed=7),
        "s:2": rollout("s:2", "12+30=", temperature=1.0, max_tokens=16, seed=8),
        "g:0": rollout("g:0", "7*6=", temperature=0.0, max_tokens=12),
        "g:1": rollout("g:1", "7*6=", temperature=0.0, max_tokens=12),
    }
    gens = await asyncio.wait_for(
        asyncio.gather(*(backend.generate(r, version) for r in specs.values())), TIMEOUT)
    out = dict(zip(specs, gens))
    for rid, gen in out.items():
        assert_well_formed(gen, specs[rid].sampling.max_tokens)
    assert out["s:0"].token_ids == out["s:1"].token_ids  # same seed, same sample
    assert out["s:0"].completion == out["s:1"].completion
    assert out["s:0"].token_ids != out["s:2"].token_ids  # another seed: another sample
    assert out["g:0"].token_ids == out["g:1"].token_ids
    return out


# --- direct: abort ---------------------------------------------------------------------------


async def check_direct_abort(backend: Any, char: str, char_token: int, pause: Callback,
                             resume: Callback,
                             while_paused: Callable[[list[str], list[str]], Awaitable[None]]
                             | None = None, n: int = 6, max_tokens: int = MAX_TOKENS,
                             started: Started = two_tokens_each) -> dict[str, Generation]:
    """Abort half of n long rollouts mid-generation (a constant policy is loaded).

    The aborted ones return early with finish_reason "abort" and exactly the tokens they had;
    the others run to max_tokens.
    """
    ids = [f"ab:{i}" for i in range(n)]
    tasks = {rid: asyncio.ensure_future(backend.generate(
        rollout(rid, "xyz", temperature=1.0, max_tokens=max_tokens), 1)) for rid in ids}
    aborted, running = ids[: n // 2], ids[n // 2:]
    try:
        assert await started(backend, ids), "rollouts did not start"
        await pause()
        paused = True
        try:
            for rid in aborted:
                await backend.abort(rid)
            if while_paused is not None:
                done, _ = await asyncio.wait([tasks[r] for r in aborted], timeout=TIMEOUT)
                assert len(done) == len(aborted), "aborted rollouts did not return while paused"
                assert all(not tasks[r].done() for r in running)
                await while_paused(aborted, running)
        finally:
            if paused:
                await resume()
        results = dict(zip(ids, await asyncio.wait_for(asyncio.gather(*tasks.values()),
                                                       TIMEOUT)))
    finally:
        for task in tasks.values():
            task.cancel()
    for rid in aborted:
        gen = results[rid]
        assert gen.finish_reason == "abort", gen
        assert 1 <= gen.completion_tokens < max_tokens, gen
        assert gen.completion == char * gen.completion_tokens, gen  # what it had, kept
        assert gen.token_ids == [char_token] * gen.completion_tokens, gen
    for rid in running:
        gen = results[rid]
        assert gen.finish_reason == "length" and gen.completion_tokens == max_tokens, gen
        assert gen.token_ids == [char_token] * max_tokens
        assert gen.completion == char * max_tokens
    assert all(backend.tokens_so_far(r) is None for r in ids)  # nothing left in flight
    return results


async def abort_unknown_is_noop(backend: Any) -> None:
    await backend.abort("never:0")  # not in flight: nothing happens, nothing raises


# --- through the scheduler: the loop's cancel list -------------------------------------------


async def check_cancel_list(backend: Any, make_scheduler: Callable[..., Any], const_dir: Path,
                            char_token: int, pause: Callback, resume: Callback,
                            while_paused: Callable[[list[str], list[str]], Awaitable[None]]
                            | None = None, max_tokens: int = MAX_TOKENS,
                            started: Started = two_tokens_each,
                            pause_first: bool = False) -> list[Generation]:
    """A worker's re-issued copies are cancelled when the original holder answers first.

    A ghost worker leases a group of 4 and goes quiet; its lease expires (fake clock) and the
    rollouts are issued again to a real worker loop. While they are being generated the ghost
    answers two of them: the scheduler cancels the real worker's copies, the loop's heartbeat
    brings the cancel list and the loop aborts them in the engine, which stops them before
    max_tokens. The late answers are reported with finish_reason "abort" (counted late).

    ``pause_first``: freeze the engine before the copies arrive (they are admitted but make no
    token until ``resume``), for engines whose progress the test cannot watch closely enough.
    Returns the generations of the two aborted copies.
    """
    sched = make_scheduler(policy="uniform", group_size=4, batch_size=1, prefetch_batches=1,
                           lease_ttl_s=30, max_tokens=max_tokens, temperature=1.0)
    admin, ghost, worker = sched.client(), sched.client(), sched.client()
    await admin.add_prompts([{"id": "p0", "prompt": "go:", "task": "exact", "answer": "x"}])
    await admin.publish_policy(1, str(const_dir))
    lease = await ghost.lease("ghost", 4)
    ids = [r.rollout_id for r in lease.rollouts]
    assert len(ids) == 4
    sched.clock.advance(31)  # the ghost's lease expires

    recorder = Recorder(backend)
    paused = False
    if pause_first:
        await backend.load_policy(1, str(const_dir))  # the loop's own load is then a no-op
        await pause()
        paused = True
    loop = WorkerLoop(worker, recorder, config("w-copy", heartbeat_interval_s=0.02,
                                               lease_ttl_s=30, max_rollouts=4))
    run = asyncio.ensure_future(loop.run())  # leases the 4 copies, finishes them, returns
    try:
        assert await loop.wait_for(lambda: set(ids) <= loop.held_ids(), TIMEOUT)
        assert await started(backend, ids), "copies did not start"
        if not paused:
            await pause()
            paused = True
        answered = [{"rollout_id": rid, "reward": 0.0, "completion": "ghost",
                     "completion_tokens": 3, "policy_version": 1} for rid in ids[:2]]
        reply = await ghost.report("ghost", answered)
        assert reply.accepted == 2, (reply, loop.counters.line(),
                                     {r: backend.tokens_so_far(r) for r in ids})
        assert await loop.wait_for(lambda: loop.counters.cancelled >= 2, TIMEOUT)
        if while_paused is not None:
            assert await loop.wait_for(lambda: loop.counters.aborted >= 2, TIMEOUT)
            await while_paused(ids[:2], ids[2:])
        await resume()
        paused = False
        counters = await asyncio.wait_for(run, TIMEOUT)
    finally:
        run.cancel()
        if paused:
            await resume()
    assert counters.cancelled == 2 and counters.aborted == 2, counters.line()
    assert counters.late == 2 and counters.accepted == 2, counters.line()
    least = 0 if pause_first else 1
    for rid in ids[:2]:
        gen = recorder.results[rid]
        assert gen.finish_reason == "abort" and least <= gen.completion_tokens < max_tokens, gen
    for rid in ids[2:]:
        gen = recorder.results[rid]
        assert gen.finish_reason == "length" and gen.completion_tokens == max_tokens, gen
        assert gen.token_ids == [char_token] * max_tokens
    stats = (await admin.stats()).counters
    assert stats.results_late == 2
    return [recorder.results[rid] for rid in ids[:2]]


# --- through the scheduler: policy versions and weights --------------------------------------


async def _take_batches(client: Any, loop: WorkerLoop, batches: list[Batch],
                        until: Callable[[], bool]) -> None:
    while not until():
        seen = loop.counters.reported
        batch = await client.next_batch(wait_s=0)
        if batch is None:
            assert await loop.wait_for(lambda seen=seen: loop.counters.reported != seen, TIMEOUT)
            continue
        await client.ack(batch.batch_id)
        batches.append(batch)


async def check_policy_switch(backend: Any, make_scheduler: Callable[..., Any], base_dir: Path,
                              constant_policies: dict[str, Path], tokens: int = 6) -> None:
    """New policy versions reach the engine: rollouts carry the version whose weights made them.

    v0 is the random tiny model; v1 always writes "a" (the answer: reward 1), v2 always "b".
    Greedy sampling through the scheduler's sampling params, batches pulled like a trainer.
    """
    await backend.load_policy(0, str(base_dir))  # a shared backend may hold other weights
    sched = make_scheduler(policy="uniform", group_size=2, batch_size=2, prefetch_batches=1,
                           temperature=0.0, max_tokens=tokens, max_staleness=2)
    admin, trainer, worker = sched.client(), sched.client(), sched.client()
    answer = "a" * tokens
    await admin.add_prompts([{"id": f"q{i}", "prompt": f"{i}+{i}=", "task": "exact",
                              "answer": answer} for i in range(6)])
    loop = WorkerLoop(worker, backend, config("w-policy"))
    batches: list[Batch] = []
    by_version: dict[int, list[Any]] = {}

    def versions_seen() -> set[int]:
        by_version.clear()
        for batch in batches:
            for group in batch.groups:
                for r in group.rollouts:
                    by_version.setdefault(r.policy_version, []).append(r)
        return set(by_version)

    async def drive() -> None:
        await _take_batches(trainer, loop, batches, lambda: 0 in versions_seen())
        await admin.publish_policy(1, str(constant_policies["a"]))
        await _take_batches(trainer, loop, batches, lambda: 1 in versions_seen())
        await admin.publish_policy(2, str(constant_policies["b"]))
        await _take_batches(trainer, loop, batches, lambda: 2 in versions_seen())

    driver = asyncio.ensure_future(drive())
    try:
        counters = await asyncio.wait_for(loop.run_until(driver.done), TIMEOUT)
        await driver
    finally:
        driver.cancel()
    assert counters.policy_loads == 2, counters.line()
    assert loop.policy_version == 2
    versions_seen()
    a_token = token_of(base_dir, "a")
    b_token = token_of(base_dir, "b")
    for r in by_version[0]:
        assert r.completion != answer and r.reward == 0.0, r
    for r in by_version[1]:
        assert r.completion == answer and r.reward == 1.0, r
        assert r.token_ids == [a_token] * tokens and r.completion_tokens == tokens
        assert r.logprobs is not None and all(lp > -1e-3 for lp in r.logprobs), r
    for r in by_version[2]:
        assert r.completion == "b" * tokens and r.reward == 0.0, r
        assert r.token_ids == [b_token] * tokens

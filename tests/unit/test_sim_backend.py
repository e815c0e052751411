"""The sim backend: deterministic per (seed, rollout), success rate γ, long failures, aborts."""

from __future__ import annotations

import asyncio
import math
from statistics import mean

import pytest

from sara_client.models import Rollout, SamplingParams
from sara_worker.backends import Backend, available, backend_factory, create_backend
from sara_worker.sim.backend import SimBackend
from sara_worker.verifiers import score

pytestmark = pytest.mark.anyio


def rollout(rid: str, gamma: float | None = 0.5, max_tokens: int = 256, **meta) -> Rollout:
    if gamma is not None:
        meta["p_success"] = gamma
    return Rollout(rollout_id=rid, group_id=rid.split(":")[0], prompt_id="p", prompt="q",
                   task="sim", meta=meta, sampling=SamplingParams(max_tokens=max_tokens))


async def generate_all(backend: SimBackend, rollouts: list[Rollout]):
    return [await backend.generate(r, 0) for r in rollouts]


class StepSleep:
    """An injected sleep that lets the first `allowed` pauses through and holds every later one
    until cancelled: generation stops mid-way, deterministically, without real time."""

    def __init__(self, allowed: int) -> None:
        self.allowed, self.calls = allowed, 0
        self.blocked = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.calls += 1
        if self.calls > self.allowed:
            self.blocked.set()
            await asyncio.Event().wait()


def test_registry_builds_sim_by_name_and_it_satisfies_the_protocol():
    assert {"sim", "hf", "openai", "vllm"} <= set(available())
    assert backend_factory("sim") is SimBackend
    backend = create_backend("sim", seed=3, per_token_s=0.0)
    assert isinstance(backend, Backend) and backend.seed == 3
    with pytest.raises(ValueError, match="unknown backend"):
        create_backend("no-such-backend")


async def test_same_seed_same_outcomes_whatever_the_order():
    rollouts = [rollout(f"g{i}:{j}") for i in range(20) for j in range(4)]
    first = await generate_all(SimBackend(seed=7), rollouts)
    second = await generate_all(SimBackend(seed=7), list(reversed(rollouts)))
    assert first == list(reversed(second))
    other = await generate_all(SimBackend(seed=8), rollouts)
    assert first != other


async def test_outcome_ignores_everything_but_seed_and_rollout_id():
    a = await SimBackend(seed=1).generate(rollout("g:0", 0.5), policy_version=0)
    b = await SimBackend(seed=1).generate(rollout("g:0", 0.5), policy_version=9)
    assert a == b


async def test_success_rate_matches_gamma_within_binomial_tolerance():
    n, backend = 4000, SimBackend(seed=0)
    for gamma in (0.0, 0.2, 0.5, 0.9, 1.0):
        gens = await generate_all(backend, [rollout(f"g{gamma}:{i}", gamma) for i in range(n)])
        rate = mean(score("sim", g.completion, None, {}) for g in gens)
        tolerance = 4 * math.sqrt(gamma * (1 - gamma) / n) + 1e-9  # 4 sigma
        assert abs(rate - gamma) <= tolerance, (gamma, rate)


async def test_failures_run_longer_and_lengths_respect_max_tokens():
    backend = SimBackend(seed=0)
    gens = await generate_all(backend, [rollout(f"g:{i}", 0.5, max_tokens=200)
                                        for i in range(3000)])
    wins = [g.completion_tokens for g in gens if g.completion == "<sim reward=1>"]
    losses = [g.completion_tokens for g in gens if g.completion == "<sim reward=0>"]
    assert len(wins) > 1000 and len(losses) > 1000
    assert mean(losses) > 1.5 * mean(wins)
    assert all(1 <= g.completion_tokens <= 200 for g in gens)
    capped = [g for g in gens if g.completion_tokens == 200]
    assert capped and all(g.finish_reason == "length" for g in capped)
    assert {g.finish_reason for g in gens} <= {"stop", "length"}


@pytest.mark.parametrize("meta", [{}, {"p_success": "high"}, {"p_success": 1.5},
                                  {"p_success": True}])
async def test_missing_or_bad_p_success_is_an_error_result(meta):
    r = Rollout(rollout_id="g:0", group_id="g", prompt_id="p", prompt="q", task="sim", meta=meta,
                sampling=SamplingParams())
    gen = await SimBackend().generate(r, 0)
    assert gen.finish_reason == "error" and gen.completion_tokens == 0
    assert "p_success" in gen.completion
    assert score("sim", gen.completion, None, {}) == 0.0


async def test_latency_paces_generation_through_the_injected_sleep():
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    backend = SimBackend(seed=0, per_token_s=0.001, step_tokens=10, sleep=record)
    gen = await backend.generate(rollout("g:0", 1.0), 0)
    assert gen.finish_reason in ("stop", "length")
    assert math.isclose(sum(slept), gen.completion_tokens * 0.001)
    assert all(s <= 10 * 0.001 + 1e-12 for s in slept)


async def test_abort_mid_generation_returns_the_partial_tokens():
    sleep = StepSleep(allowed=3)
    backend = SimBackend(seed=0, per_token_s=0.01, step_tokens=4, sleep=sleep)
    r = rollout("g:0", 0.0, max_tokens=1000)  # a failure: hundreds of tokens
    full = backend.outcome(r).tokens
    assert full > 12
    task = asyncio.ensure_future(backend.generate(r, 0))
    await sleep.blocked.wait()
    assert backend.inflight_ids() == {"g:0"}
    await backend.abort("g:0")
    gen = await task
    assert gen.finish_reason == "abort"
    assert gen.completion_tokens == 12  # three whole steps of 4
    assert backend.inflight_ids() == set()
    assert score("sim", gen.completion, None, {}) == 0.0


async def test_abort_of_unknown_or_finished_rollout_is_a_no_op():
    backend = SimBackend(seed=0)
    gen = await backend.generate(rollout("g:0", 1.0), 0)
    await backend.abort("g:0")
    await backend.abort("never-seen")
    assert gen.finish_reason != "abort" and backend.inflight_ids() == set()


async def test_load_policy_and_close():
    backend = SimBackend()
    await backend.load_policy(3, "ckpt-3")
    assert (backend.policy_version, backend.checkpoint) == (3, "ckpt-3")
    await backend.close()


def test_invalid_options_are_rejected():
    with pytest.raises(ValueError):
        SimBackend(per_token_s=-1)
    with pytest.raises(ValueError):
        SimBackend(step_tokens=0)

"""sara_worker.process: the worker process's main that `sara worker` calls (the CLI only turns
flags into its arguments)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

import sara_client
import sara_worker
from sara_worker.sim.backend import SimBackend
from sara_worker.process import backend_options, run_until_signalled


def test_backend_options_name_only_what_applies_and_extra_wins():
    assert backend_options("sim", seed=3, per_token_ms=20.0) == {"seed": 3, "per_token_s": 0.02}
    assert backend_options("hf", model="m", per_token_ms=20.0,
                           gpu_memory_utilization=0.3) == {"model": "m"}
    assert backend_options("vllm", model="m", gpu_memory_utilization=0.3,
                           extra={"dtype": "float32", "model": "n"}) == {
        "model": "n", "gpu_memory_utilization": 0.3, "dtype": "float32"}


def test_the_package_exports_its_api_lazily():
    assert set(sara_worker.__all__) >= {"main", "run", "WorkerLoop", "WorkerConfig",
                                        "create_backend"}
    assert callable(sara_worker.main) and sara_worker.WorkerLoop.__name__ == "WorkerLoop"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = sara_worker.nope


@pytest.mark.anyio
async def test_sigterm_stops_the_worker_and_gives_the_signal_back(tmp_path):
    prompts = [{"id": f"p{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]
    async with sara_client.alocal(data_dir=tmp_path, group_size=4, batch_size=2,
                                  prefetch_batches=1) as sara:
        await sara.add_prompts(prompts)
        config = sara_worker.WorkerConfig(worker_id="w", backend_name="sim", capacity=8,
                                          lease_wait_s=0.0, log_interval_s=3600.0)
        loop = sara_worker.WorkerLoop(sara, SimBackend(seed=0), config)
        before = signal.getsignal(signal.SIGTERM)
        # runs once run_until_signalled has put its handler in and the loop waits on I/O
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)
        counters = await run_until_signalled(loop)
        # the handler the in-process scheduler put in is back
        assert signal.getsignal(signal.SIGTERM) == before
    assert counters is loop.counters


class _EngineStandIn:
    """Stands in for an engine backend (vllm needs its engine started): only its slots."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots

    async def engine_slots(self) -> int | None:
        return self.slots


@pytest.mark.anyio
async def test_capacity_fits_the_engine_slots_and_half_as_many_ahead():
    from sara_worker.process import fitted_capacity

    assert await fitted_capacity(_EngineStandIn(64)) == 96
    assert await fitted_capacity(_EngineStandIn(1)) == 2
    assert await fitted_capacity(_EngineStandIn(None)) is None   # no model to start on yet
    assert await fitted_capacity(SimBackend(seed=0)) is None     # no engine to fill


@pytest.mark.anyio
async def test_a_fitted_capacity_keeps_lease_min_a_quarter_of_it_unless_set():
    from sara_worker.process import with_fitted_capacity as fit

    fitted = await fit(_EngineStandIn(64), sara_worker.WorkerConfig(capacity=64))
    assert (fitted.capacity, fitted.lease_min) == (96, 24)
    kept = await fit(_EngineStandIn(64), sara_worker.WorkerConfig(lease_min_size=5))
    assert (kept.capacity, kept.lease_min) == (96, 5)
    unchanged = sara_worker.WorkerConfig(capacity=64)
    assert await fit(SimBackend(seed=0), unchanged) is unchanged


@pytest.mark.anyio
@pytest.mark.parametrize("fit, capacity", [(True, 12), (False, 64)])
async def test_a_fleet_actor_fits_its_capacity_to_its_engine_when_told(monkeypatch, fit, capacity):
    """`sara fleet` without --capacity: each actor fits its own engine, as `sara worker` does."""
    import sara_worker.backends as backends
    import sara_worker.loop as loop_module
    from sara_worker.fleet import FleetSpec, FleetWorker

    class Engine(_EngineStandIn):
        async def close(self) -> None:
            return None

    class Loop:  # stands in for the loop: this test is about the config it is given
        def __init__(self, client, backend, config) -> None:
            seen.append(config.capacity)

        async def run(self) -> sara_worker.WorkerCounters:
            return sara_worker.WorkerCounters()

    seen: list[int] = []
    monkeypatch.setattr(backends, "create_backend", lambda name, **options: Engine(8))
    monkeypatch.setattr(loop_module, "WorkerLoop", Loop)
    await FleetWorker(FleetSpec(url="http://127.0.0.1:9", backend="vllm", fit_capacity=fit),
                      0).run()
    assert seen == [capacity]

"""A worker process's main: the backend built by name, a client to the scheduler, and the loop
run until SIGTERM or SIGINT (the first finishes or aborts what is in flight as the config says,
a second aborts it), with backend and client closed after. `sara worker` calls it; a program
that runs its own worker process calls it the same way."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from typing import Any

from sara_client import AsyncSaraClient

from .backends import create_backend
from .loop import WorkerLoop
from .support import WorkerConfig, WorkerCounters

log = logging.getLogger("sara.worker")


def backend_options(backend: str, *, model: str | None = None, base_url: str | None = None,
                    seed: int | None = None, per_token_ms: float = 0.0,
                    gpu_memory_utilization: float | None = None,
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The backend's keyword options: the named ones that apply to it (unset ones left out),
    then `extra` (a plug-in's own options), which wins."""
    options: dict[str, Any] = {"model": model, "base_url": base_url, "seed": seed}
    if backend == "sim":
        options["per_token_s"] = per_token_ms / 1000.0
    if backend == "vllm" and gpu_memory_utilization is not None:
        options["gpu_memory_utilization"] = gpu_memory_utilization
    options = {k: v for k, v in options.items() if v is not None}
    options.update(extra or {})
    return options


# Rollouts held beyond the engine's slots, as a share of them: queued in the engine, they fill
# the slots that free up while the next lease is on its way back. The worker leases again once a
# quarter of its capacity is free, when it still holds 1.125 times the slots.
LEASE_AHEAD = 0.5


def capacity_for_slots(slots: int) -> int:
    """The capacity that keeps an engine of `slots` requests at once full: its slots and half
    as many again leased ahead."""
    return slots + max(1, int(slots * LEASE_AHEAD))


async def engine_slots(backend: Any) -> int | None:
    """The backend's engine's most requests at once (``engine_slots()``); None for a backend
    without slots to fill (sim, hf, openai) or an engine not startable yet."""
    slots_of = getattr(backend, "engine_slots", None)
    slots = await slots_of() if slots_of is not None else None
    return slots or None


async def fitted_capacity(backend: Any) -> int | None:
    """`capacity_for_slots` of the backend's engine (:func:`engine_slots`); None without one."""
    slots = await engine_slots(backend)
    return None if not slots else capacity_for_slots(slots)


async def run(backend_name: str, options: dict[str, Any], config: WorkerConfig, url: str,
              token: str | None = None, *, fit_capacity: bool = False) -> WorkerCounters:
    """Run one worker against the scheduler at `url` until a signal (or `config.max_rollouts`);
    its counters. With `fit_capacity`, `config.capacity` is replaced by `fitted_capacity` where
    the backend has an engine to fill (and kept otherwise). A ValueError for an unknown backend
    or bad options; the loop's WorkerError when the scheduler refuses it for good."""
    backend = create_backend(backend_name, **options)
    client = AsyncSaraClient(url, token=token)
    try:
        if fit_capacity:
            config = await with_fitted_capacity(backend, config)
        loop = WorkerLoop(client, backend, config)
        return await run_until_signalled(loop)
    finally:
        await backend.close()
        await client.aclose()


async def with_fitted_capacity(backend: Any, config: WorkerConfig) -> WorkerConfig:
    """`config` with `fitted_capacity(backend)` as its capacity, or `config` itself where the
    backend has no engine to fill."""
    slots = await engine_slots(backend)
    if slots is None:
        return config
    capacity = capacity_for_slots(slots)
    log.info("capacity %d: the engine's max_num_seqs and half as many leased ahead", capacity)
    return dataclasses.replace(config, capacity=capacity, engine_slots=slots)


async def run_until_signalled(loop: WorkerLoop) -> WorkerCounters:
    """`loop.run()` with SIGTERM and SIGINT stopping it: the first as its config says, a second
    aborting what is in flight. The process's own handlers are back afterwards (asyncio alone
    would leave the defaults)."""
    signals_seen = []

    def on_signal() -> None:
        signals_seen.append(1)
        loop.stop(abort=True if len(signals_seen) > 1 else None)

    aio = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        aio.add_signal_handler(sig, on_signal)
    try:
        return await loop.run()
    finally:
        for sig, handler in previous.items():
            aio.remove_signal_handler(sig)
            signal.signal(sig, handler)


def main(backend_name: str, options: dict[str, Any], config: WorkerConfig, url: str,
         token: str | None = None, *, fit_capacity: bool = False) -> WorkerCounters:
    """`run` in a fresh event loop: the whole of a worker process."""
    return asyncio.run(run(backend_name, options, config, url, token, fit_capacity=fit_capacity))

"""A fleet of `sara worker`s as Ray actors, on a Ray cluster that is already running.

    from sara_worker.fleet import Fleet, FleetSpec

    fleet = Fleet(FleetSpec(url="http://scheduler:8000", token=..., backend="vllm",
                            options={"model": "/models/Qwen2.5-0.5B-Instruct"},
                            actors=8, gpus_per_actor=1))
    fleet.start()                 # ray.init(address=...) unless Ray is already initialised
    fleet.wait(timeout_s=None)    # supervise: a dead actor is restarted and its loop run again
    fleet.drain(timeout_s=120)    # stop leasing, finish what is held, report it; counters

`sara fleet` (sara_cli.fleet) is the same as a command. Each actor runs one
:class:`~sara_worker.loop.WorkerLoop` with its own SDK client and backend, on the GPUs Ray gives
it (``num_gpus``: Ray sets CUDA_VISIBLE_DEVICES for the actor), with the worker id
``{name}-{index}`` (kept across restarts, so /stats shows one line per actor).

Failure: an actor's process that dies (OOM, a node lost, ``ray.kill``) is restarted by Ray up to
``max_restarts`` times (-1: always), and the fleet runs its loop again. The leases the dead
process held are not lost: the scheduler issues their rollouts again when the leases expire
(SARA_LEASE_TTL_S). A loop that fails for good (credentials refused, a model that does not load)
is not restarted: :meth:`Fleet.wait` raises its error.

Drain: :meth:`Fleet.drain` tells every actor to stop leasing; each finishes the rollouts it holds
(``WorkerConfig.drain_timeout_s``), reports them and returns its counters.

Ray is imported only here, when a fleet starts (it is not a dependency of the worker extra).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

from .support import WorkerConfig

log = logging.getLogger("sara.worker.fleet")

POLL_S = 0.2  # how often wait/drain look at the actors' loops


@dataclasses.dataclass
class FleetSpec:
    """What the fleet runs: N actors of one worker configuration.

    ``worker`` holds :class:`~sara_worker.support.WorkerConfig` fields (all but ``worker_id``
    and ``backend_name``, which the fleet sets)."""

    url: str
    backend: str = "sim"
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    token: str | None = None
    actors: int = 1
    gpus_per_actor: float = 0.0
    cpus_per_actor: float = 1.0
    max_restarts: int = -1
    name: str = "fleet"
    worker: dict[str, Any] = dataclasses.field(default_factory=dict)
    address: str | None = None  # ray.init(address=...); None: RAY_ADDRESS or "auto"
    fit_capacity: bool = False  # each actor's capacity fitted to its engine, as `sara worker`

    def __post_init__(self) -> None:
        if self.actors < 1:
            raise ValueError("a fleet has at least one actor")
        if self.gpus_per_actor < 0 or self.cpus_per_actor < 0:
            raise ValueError("gpus_per_actor and cpus_per_actor are >= 0")

    def worker_config(self, index: int) -> WorkerConfig:
        return WorkerConfig(**{**self.worker, "worker_id": f"{self.name}-{index}",
                               "backend_name": self.backend})


class FleetWorker:
    """The actor: one worker loop, run by :meth:`run`, stopped by :meth:`drain`."""

    def __init__(self, spec: FleetSpec, index: int) -> None:
        self.spec, self.index = spec, index
        self.loop: Any = None
        self.draining = False

    async def run(self) -> dict[str, int]:
        """Work until drained; the loop's counters."""
        from sara_client import AsyncSaraClient

        from .backends import create_backend
        from .loop import WorkerLoop
        from .process import with_fitted_capacity

        backend = create_backend(self.spec.backend, **self.spec.options)
        client = AsyncSaraClient(self.spec.url, token=self.spec.token)
        try:
            config = self.spec.worker_config(self.index)
            if self.spec.fit_capacity:
                config = await with_fitted_capacity(backend, config)
            self.loop = WorkerLoop(client, backend, config)
            if self.draining:
                self.loop.stop()
            return (await self.loop.run()).as_dict()
        finally:
            await backend.close()
            await client.aclose()

    async def drain(self) -> bool:
        """Stop leasing; the running loop finishes what it holds. True once asked."""
        self.draining = True
        if self.loop is not None:
            self.loop.stop()
        return True

    async def info(self) -> dict[str, Any]:
        """pid, worker id and the rollouts held now, for operators and tests."""
        held = sorted(self.loop.held_ids() | self.loop.outbox_ids()) if self.loop else []
        return {"pid": os.getpid(), "worker_id": f"{self.spec.name}-{self.index}",
                "held": held, "draining": self.draining}


class Fleet:
    """Starts and supervises the actors of a :class:`FleetSpec`."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.actors: list[Any] = []
        self.restarts: list[int] = []
        self.counters: dict[int, dict[str, int]] = {}
        self._runs: dict[int, Any] = {}  # actor index -> ObjectRef of its running loop
        self._draining = False

    def start(self) -> "Fleet":
        """Connect to Ray (unless connected) and start every actor's loop."""
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.spec.address or os.environ.get("RAY_ADDRESS") or "auto")
        remote = ray.remote(FleetWorker).options(
            num_gpus=self.spec.gpus_per_actor, num_cpus=self.spec.cpus_per_actor,
            max_restarts=self.spec.max_restarts, max_task_retries=0)
        self.actors = [remote.remote(self.spec, i) for i in range(self.spec.actors)]
        self.restarts = [0] * self.spec.actors
        for i in range(self.spec.actors):
            self._runs[i] = self.actors[i].run.remote()
        log.info("fleet %s: %d actors (%g GPU, %g CPU each) -> %s", self.spec.name,
                 self.spec.actors, self.spec.gpus_per_actor, self.spec.cpus_per_actor,
                 self.spec.url)
        return self

    def poll(self) -> bool:
        """Collect the loops that ended; run a dead actor's loop again (unless draining).
        True once every loop has ended. Raises the error of a loop that failed."""
        ray = _ray()
        if self._runs:
            done, _ = ray.wait(list(self._runs.values()), num_returns=len(self._runs), timeout=0)
            for ref in done:
                self._collect(ref)
        return not self._runs

    def _collect(self, ref: Any) -> None:
        ray = _ray()
        (index,) = [i for i, r in self._runs.items() if r == ref]
        try:
            self.counters[index] = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            if self._draining or not self._may_restart(index):
                log.warning("fleet actor %d died and is not restarted: %s", index, exc)
                del self._runs[index]
                return
            self.restarts[index] += 1
            log.warning("fleet actor %d died (restart %d): %s", index, self.restarts[index], exc)
            self._runs[index] = self.actors[index].run.remote()
            return
        del self._runs[index]

    def _may_restart(self, index: int) -> bool:
        limit = self.spec.max_restarts
        return limit < 0 or self.restarts[index] < limit

    def wait(self, timeout_s: float | None = None) -> bool:
        """Supervise until every loop has ended (True) or `timeout_s` has passed (False)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.poll():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            _ray().wait(list(self._runs.values()), num_returns=1, timeout=POLL_S)
        return True

    def drain(self, timeout_s: float | None = None) -> dict[int, dict[str, int]]:
        """Stop leasing everywhere, let the held rollouts finish and be reported; the counters
        of every loop. TimeoutError if some loop is still running after `timeout_s`."""
        ray = _ray()
        self._draining = True
        for i in list(self._runs):
            try:
                ray.get(self.actors[i].drain.remote())
            except ray.exceptions.RayActorError:
                pass  # dead for good: poll() below collects its loop
        if not self.wait(timeout_s):
            raise TimeoutError(f"fleet {self.spec.name}: {len(self._runs)} actors still "
                               f"running after {timeout_s}s")
        return dict(self.counters)

    def info(self, index: int) -> dict[str, Any]:
        return _ray().get(self.actors[index].info.remote())

    def kill(self, index: int, restart: bool = True) -> None:
        """ray.kill the actor's process (Ray restarts it when `restart`)."""
        _ray().kill(self.actors[index], no_restart=not restart)

    def shutdown(self) -> None:
        """Kill every actor for good (no drain: their leases expire)."""
        self._draining = True
        for actor in self.actors:
            _ray().kill(actor, no_restart=True)
        self._runs.clear()


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - the message is the point
        raise ImportError("a fleet runs on Ray: pip install 'ray>=2.41'") from e
    return ray

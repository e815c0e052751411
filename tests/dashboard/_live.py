"""A real scheduler (uvicorn in a thread, on a socket bound to a free port) and a scripted
workload driving it through the SDK: Bernoulli workers and a trainer that pulls and acks batches.
"""

from __future__ import annotations

import random
import socket
import threading
from typing import Any

import uvicorn

from sara_client import SaraClient
from sara_client.models import EngineLoad
from sara_service.http.app import create_app
from sara_worker.sim.pool import standard_pool
from sara_service.settings import Settings

from ._cdp import wait_until


class LiveServer:
    """`create_app(settings)` served by uvicorn on 127.0.0.1:<free port> until `stop()`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # Config configures uvicorn's loggers: attach handlers to them after this line.
        config = uvicorn.Config(create_app(settings), log_level="info", access_log=True,
                                lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="uvicorn", daemon=True)

    def start(self, timeout_s: float = 15.0) -> LiveServer:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), timeout_s,
                   "uvicorn to start")
        if not self.server.started:
            raise RuntimeError("uvicorn did not start")
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()


class Workload:
    """Scripted Bernoulli workers (reward 1 with the prompt's meta.p_success) and a trainer.

    The trainer acks every batch and publishes a new policy version every `publish_every`
    batches; the workers tag results with the version their lease named. `idle_worker` leases
    once at the start and is never seen again (so it goes stale)."""

    def __init__(self, url: str, *, admin: str, worker: str, trainer: str, prompts: int = 600,
                 workers: tuple[str, ...] = ("sim-a", "sim-b"), idle_worker: str = "sim-idle",
                 publish_every: int = 4, seed: int = 0) -> None:
        self.url, self.worker_token, self.trainer_token = url, worker, trainer
        self.worker_ids, self.idle_worker, self.publish_every = workers, idle_worker, publish_every
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.batches = 0
        self.seed = seed
        with SaraClient(url, token=admin) as c:
            c.add_prompts(standard_pool(prompts, seed))
        self.threads = [threading.Thread(target=self._guard, args=(self._work, wid, i),
                                         name=f"worker-{wid}", daemon=True)
                        for i, wid in enumerate(workers)]
        self.threads.append(threading.Thread(target=self._guard, args=(self._train,),
                                             name="trainer", daemon=True))

    def start(self) -> Workload:
        with SaraClient(self.url, token=self.worker_token) as c:
            self._one_round(c, self.idle_worker, random.Random(-1), max_rollouts=1)
        for t in self.threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop leasing and pulling; every thread finishes its call in hand and exits."""
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout_s)
            assert not t.is_alive(), f"{t.name} did not stop"
        if self.errors:
            raise self.errors[0]

    def _guard(self, fn, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # surfaced by stop()
            self.errors.append(e)

    @staticmethod
    def _one_round(c: SaraClient, wid: str, rng: random.Random, max_rollouts: int = 32,
                   wait_s: float = 0.0) -> int:
        # a scripted engine of 16 slots, reporting a load as a worker's engine would
        lease = c.lease(wid, max_rollouts=max_rollouts, wait_s=wait_s, backend="scripted",
                        engine=EngineLoad(occupancy=rng.uniform(0.5, 1.0), slots=16))
        if not lease.rollouts:
            return 0
        results = [{"rollout_id": r.rollout_id,
                    "reward": float(rng.random() < float(r.meta.get("p_success", 0.5))),
                    "completion": "…", "completion_tokens": rng.randint(8, 64),
                    "finish_reason": "stop", "policy_version": lease.policy.version}
                   for r in lease.rollouts]
        c.report(wid, results)
        return len(results)

    def _work(self, wid: str, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        with SaraClient(self.url, token=self.worker_token) as c:
            while not self.stop_event.is_set():
                if self._one_round(c, wid, rng, max_rollouts=16, wait_s=0.2):
                    self.stop_event.wait(0.01)  # pacing: a worker is not infinitely fast

    def _train(self) -> None:
        with SaraClient(self.url, token=self.trainer_token) as c:
            version = c.get_policy().version
            while not self.stop_event.is_set():
                batch = c.next_batch(wait_s=0.3)
                if batch is None:
                    continue
                c.ack(batch.batch_id)
                self.batches += 1
                if self.batches % self.publish_every == 0:
                    version += 1
                    c.publish_policy(version, f"ckpt-{version}")
                self.stop_event.wait(0.15)  # pacing: a training step takes time

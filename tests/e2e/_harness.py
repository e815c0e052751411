"""End-to-end harness: real `sara serve` processes, a scripted Bernoulli worker, a batch consumer.

Everything here talks to the scheduler over HTTP through the SDK, exactly as a deployment would;
the only thing read behind its back is the slots hash in Redis, to count every rollout slot's state
independently of the service's own counters.

A run:

1. `ServeProcess`es (one per replica) on one Redis and one namespace; each is waited for on /readyz.
2. The standard synthetic pool is loaded with `sara load --synthetic N --seed S`.
3. Workers lease, draw rewards Bernoulli(meta.p_success) and report in small chunks, dropping what
   the scheduler cancels; a consumer pulls `n_batches` batches and acks each. Calls alternate
   between replicas when there are several.
4. `stop` snapshot: the workers stop where they are (holding whatever they leased and have not
   reported), collect their cancel lists with a heartbeat, and the stats and slot states are read.
5. `final` snapshot: the workers report what they hold and lease until the scheduler has nothing
   left to issue (flow control closes once the ready groups reach the target); then nothing is in
   flight and every opened group has been decided.

Rewards use common random numbers: the reward of slot i of the j-th group of a prompt is a pure
function of (seed, prompt, j, i), so runs under different policies see the same outcomes and their
rollout costs can be compared with little noise.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis
from sara_client import AsyncSaraClient, Batch, NotFoundError, StatsResponse
from sara_service.embedded import free_port
from sara_service.store.keys import Keys, split_rollout_id
from sara_service.store.redis_format import decode_slot

SUCCESS_THRESHOLD = 0.5  # the service's default success_threshold: reward >= this is a success


# --- the scheduler process -----------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the test process dies, so that a killed
    pytest leaves no scheduler behind."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except Exception:
        pass


class ServeProcess:
    """`sara serve` as a subprocess on a free port, its output in `log_path`."""

    def __init__(self, log_dir: Path, *, redis_url: str, namespace: str, policy: str,
                 group_size: int, batch_size: int, prefetch_batches: int = 2, seed: int = 0,
                 name: str = "serve") -> None:
        self.log_path = Path(log_dir) / f"{name}.log"
        self.name = name
        self.args = ["--redis-url", redis_url, "--namespace", namespace, "--policy", policy,
                     "--group-size", str(group_size), "--batch-size", str(batch_size),
                     "--log-level", "warning"]
        # Settings without a CLI flag come from the environment, like in a deployment.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
        self.env.update({"SARA_PREFETCH_BATCHES": str(prefetch_batches), "SARA_SEED": str(seed),
                         "PYTHONUNBUFFERED": "1"})
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ServeProcess:
        """Start and return once /readyz answers ok; RuntimeError with the log if it does not."""
        for _ in range(3):  # a free port can be taken between free_port() and bind(): retry
            self.port = free_port()
            cmd = [sys.executable, "-m", "sara_cli", "serve", "--port", str(self.port),
                   *self.args]
            with self.log_path.open("ab") as log:
                log.write(f"$ {' '.join(cmd)}\n".encode())
                log.flush()
                self.process = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=self.env, start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            if self._wait_ready(timeout_s):
                return self
            if self.process.poll() is None:
                break  # still running but never ready: not a port clash
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready:\n{self.log_tail()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)  # start-up polling with a deadline, not synchronisation
        return False

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s; returns the exit code. Idempotent."""
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"({self.log_path} unreadable)"
        return f"--- {self.name} output ({self.log_path}) ---\n{text[-chars:]}"


# --- worker and consumer -------------------------------------------------------------------------


class RewardScript:
    """Bernoulli(p_success) rewards with common random numbers across runs (see module doc)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._ordinal: dict[str, int] = {}  # group id -> its ordinal among its prompt's groups
        self._groups_seen: collections.Counter[str] = collections.Counter()

    def reward(self, prompt_id: str, group_id: str, slot: int, p_success: float) -> float:
        if group_id not in self._ordinal:
            self._ordinal[group_id] = self._groups_seen[prompt_id]
            self._groups_seen[prompt_id] += 1
        rng = random.Random(f"{self.seed}/{prompt_id}/{self._ordinal[group_id]}/{slot}")
        return 1.0 if rng.random() < p_success else 0.0


@dataclasses.dataclass
class Ledger:
    """What the workers did, shared by all workers of a run (one event loop: no locks needed)."""

    leased: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reported: dict[str, float] = dataclasses.field(default_factory=dict)
    cancels_received: set[str] = dataclasses.field(default_factory=set)
    results_late: int = 0
    results_duplicate: int = 0
    results_accepted: int = 0


class BernoulliWorker:
    """Leases up to `lease_size` rollouts, reports them `report_size` at a time, drops cancelled
    ones. With several clients it alternates between them, one call each."""

    def __init__(self, worker_id: str, clients: list[AsyncSaraClient], script: RewardScript,
                 ledger: Ledger, *, lease_size: int = 16, report_size: int = 4) -> None:
        self.worker_id = worker_id
        self.clients = clients
        self.script = script
        self.ledger = ledger
        self.lease_size = lease_size
        self.report_size = report_size
        self.held: dict[str, tuple[str, Any]] = {}  # rollout id -> (lease id, rollout)
        self.calls = 0
        self.leases = 0

    def _client(self) -> AsyncSaraClient:
        self.calls += 1
        return self.clients[self.calls % len(self.clients)]

    def _cancel(self, ids: list[str]) -> None:
        self.ledger.cancels_received.update(ids)
        for rid in ids:
            self.held.pop(rid, None)

    async def lease_once(self, wait_s: float) -> int:
        answer = await self._client().lease(self.worker_id, self.lease_size, wait_s=wait_s,
                                            backend="e2e-bernoulli")
        self._cancel(answer.cancel)
        for r in answer.rollouts:
            self.ledger.leased[r.rollout_id] += 1
            self.held[r.rollout_id] = (answer.lease_id, r)
        if answer.rollouts:
            self.leases += 1
        return len(answer.rollouts)

    async def report_some(self, limit: int | None = None) -> int:
        """Report up to `limit` (default report_size) held rollouts, oldest first."""
        chunk = list(self.held.items())[: limit or self.report_size]
        if not chunk:
            return 0
        results = []
        for rid, (_, r) in chunk:
            _, slot = split_rollout_id(rid)
            reward = self.script.reward(r.prompt_id, r.group_id, slot,
                                        float(r.meta.get("p_success", 0.0)))
            results.append({"rollout_id": rid, "reward": reward, "completion": f"c{slot}",
                            "completion_tokens": 3, "finish_reason": "stop",
                            "policy_version": 0})
        answer = await self._client().report(self.worker_id, results)
        for rid, _ in chunk:
            self.held.pop(rid, None)
        for res in results:
            self.ledger.reported[res["rollout_id"]] = res["reward"]
        self.ledger.results_accepted += answer.accepted
        self.ledger.results_late += answer.late
        self.ledger.results_duplicate += answer.duplicates
        self._cancel(answer.cancel)
        return len(chunk)

    async def run(self, stop: asyncio.Event) -> None:
        """Lease and report until `stop` is set; stops between two calls, holding what is left."""
        while not stop.is_set():
            if not self.held:
                await self.lease_once(wait_s=0.2)
                continue
            await self.report_some()

    async def collect_cancels(self) -> None:
        """Heartbeat every lease still held: drops rollouts cancelled by other workers' results,
        and, as `sara worker` does, the rollouts of a lease the scheduler no longer knows (it
        expired, say while Redis failed over): the scheduler has reissued them."""
        for lease_id in sorted({lid for lid, _ in self.held.values()}):
            try:
                answer = await self._client().heartbeat(lease_id, self.worker_id)
            except NotFoundError:
                self.held = {rid: held for rid, held in self.held.items() if held[0] != lease_id}
                continue
            self._cancel(answer.cancel)

    async def flush(self) -> None:
        while self.held:
            await self.report_some()


@dataclasses.dataclass
class Snapshot:
    stats: StatsResponse
    slots: collections.Counter  # 'pending' / 'leased' / 'done' / 'cancelled' -> count
    held: int  # rollouts the workers hold, leased and neither reported nor cancelled


@dataclasses.dataclass
class RunResult:
    policy: str
    namespace: str
    group_size: int
    batch_size: int
    replicas: int
    batches: list[Batch]
    delivered_via: list[str]  # replica URL each batch was fetched from
    ledger: Ledger
    stop: Snapshot
    final: Snapshot
    logs: str
    seconds: float
    worker_leases: dict[str, int] = dataclasses.field(default_factory=dict)  # non-empty leases

    @property
    def groups(self):
        return [g for b in self.batches for g in b.groups]


def load_synthetic(url: str, n: int, seed: int) -> None:
    """`sara load --synthetic n --seed seed` against `url`: the standard pool, through the CLI."""
    cmd = [sys.executable, "-m", "sara_cli", "load", "--synthetic", str(n), "--seed",
           str(seed), "--url", url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert out.returncode == 0, f"{cmd} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert f"loaded {n} prompts ({n} new)" in out.stdout, out.stdout


def slot_values(redis_url: str, namespace: str) -> list[bytes]:
    """Every rollout slot's raw state in the namespace, straight from the slots hash."""
    client = redis.Redis.from_url(redis_url)
    try:
        return client.hvals(Keys(namespace).slots)
    finally:
        client.close()


def slot_counts(redis_url: str, namespace: str) -> collections.Counter:
    """Count every rollout slot of the namespace by kind (pending, leased, done, cancelled:
    redis_format.decode_slot; 'd|<worker>', answered while <worker> held a cancelled copy, is
    done), straight from the slots hash of the serve processes' Redis."""
    return collections.Counter(decode_slot(v.decode()).kind
                               for v in slot_values(redis_url, namespace))


async def _consume(clients: list[AsyncSaraClient], n_batches: int, batches: list[Batch],
                   via: list[str]) -> None:
    i = 0
    while len(batches) < n_batches:
        fetch, ack = clients[i % len(clients)], clients[(i + 1) % len(clients)]
        i += 1
        batch = await fetch.next_batch(wait_s=2.0)
        if batch is None:
            continue
        batches.append(batch)
        via.append(fetch.base_url)
        answer = await ack.ack(batch.batch_id)
        assert answer.acked and not answer.already_acked, answer


async def _snapshot(client: AsyncSaraClient, redis_url: str, namespace: str,
                    workers: list[BernoulliWorker]) -> Snapshot:
    return Snapshot(stats=await client.stats(), slots=slot_counts(redis_url, namespace),
                    held=sum(len(w.held) for w in workers))


async def _drive(urls: list[str], redis_url: str, namespace: str, *, n_batches: int,
                 n_prompts: int, seed: int, n_workers: int, deadline_s: float
                 ) -> tuple[list[Batch], list[str], Ledger, Snapshot, Snapshot, dict[str, int]]:
    clients = [AsyncSaraClient(u, timeout=15.0) for u in urls]
    try:
        await asyncio.to_thread(load_synthetic, urls[-1], n_prompts, seed)
        ledger, script = Ledger(), RewardScript(seed)
        # Worker i starts on replica i and alternates; the consumer fetches and acks on
        # different replicas when there are several.
        workers = [BernoulliWorker(f"w{i}", clients[i:] + clients[:i], script, ledger)
                   for i in range(n_workers)]
        batches: list[Batch] = []
        via: list[str] = []
        stop = asyncio.Event()
        tasks = [asyncio.create_task(w.run(stop)) for w in workers]
        consumer = asyncio.create_task(_consume(clients, n_batches, batches, via))
        try:
            # a worker that fails ends the run at once, with its error
            await asyncio.wait([consumer, *tasks], timeout=deadline_s,
                               return_when=asyncio.FIRST_COMPLETED)
            for t in (consumer, *tasks):
                if t.done() and t.exception() is not None:
                    raise t.exception()
            if not consumer.done():
                raise TimeoutError(f"the consumer got {len(batches)} of {n_batches} batches in "
                                   f"{deadline_s:.0f}s")
        finally:
            consumer.cancel()
            stop.set()
            await asyncio.gather(consumer, *tasks, return_exceptions=True)
        for w in workers:
            await w.collect_cancels()
        at_stop = await _snapshot(clients[-1], redis_url, namespace, workers)

        async def drain() -> None:
            for w in workers:
                await w.flush()
            while True:  # one worker at a time: an empty lease then means nothing is left
                got = 0
                for w in workers:
                    got += await w.lease_once(wait_s=0.0)
                    await w.flush()
                if not got:
                    return

        await asyncio.wait_for(drain(), deadline_s)
        at_end = await _snapshot(clients[0], redis_url, namespace, workers)
        return batches, via, ledger, at_stop, at_end, {w.worker_id: w.leases for w in workers}
    finally:
        for c in clients:
            await c.aclose()


def run_scenario(log_dir: Path, redis_url: str, *, policy: str, replicas: int = 1,
                 n_workers: int = 1, n_batches: int = 20, n_prompts: int = 200,
                 group_size: int = 8, batch_size: int = 8, prefetch_batches: int = 2,
                 seed: int = 1234, deadline_s: float = 40.0) -> RunResult:
    """Start `replicas` serve processes on one namespace, drive them, stop them; see module doc."""
    namespace = f"e2e-{policy}-{replicas}r-{uuid.uuid4().hex[:8]}"
    servers = [ServeProcess(log_dir, redis_url=redis_url, namespace=namespace, policy=policy,
                            group_size=group_size, batch_size=batch_size,
                            prefetch_batches=prefetch_batches, seed=seed,
                            name=f"{namespace}-replica{i}") for i in range(replicas)]
    started = time.monotonic()
    try:
        for s in servers:
            s.start()
        try:
            batches, via, ledger, at_stop, at_end, leases = asyncio.run(_drive(
                [s.url for s in servers], redis_url, namespace, n_batches=n_batches,
                n_prompts=n_prompts, seed=seed, n_workers=n_workers, deadline_s=deadline_s))
        except BaseException as exc:
            logs = "\n".join(s.log_tail() for s in servers)
            raise RuntimeError(f"e2e run {namespace} failed: {exc!r}\n{logs}") from exc
        for s in servers:
            assert s.alive, f"{s.name} died during the run:\n{s.log_tail()}"
    finally:
        codes = [s.stop() for s in servers]
    logs = "\n".join(s.log_tail() for s in servers)
    assert all(c == 0 for c in codes), f"serve exit codes {codes}:\n{logs}"
    return RunResult(policy=policy, namespace=namespace, group_size=group_size,
                     batch_size=batch_size, replicas=replicas, batches=batches,
                     delivered_via=via, ledger=ledger, stop=at_stop, final=at_end, logs=logs,
                     seconds=time.monotonic() - started, worker_leases=leases)

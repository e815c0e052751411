#!/usr/bin/env python
"""Scheduler throughput and latency: rollout results per second and /leases, /results latency.

Recorded, not asserted. Everything runs on this machine: an embedded redis-server (AOF on, as in
production), one or more `sara serve` processes, and the load generator (this process: async SDK
clients over httpx, or bare httpx with `--client raw`). On a 2-core box all of them share the same
two cores; the table says how much CPU each took, and how much went to other processes.

What it does:

1. Topology sweep (uniform policy, `--sweep-duration` s each): one serve process, one process with
   `--workers 2` uvicorn workers, two serve processes (clients split between them). The best
   results/s wins and is used below.
2. For each `--policy` (default: uniform, the pure-throughput figure, then sara, the realistic one),
   on a fresh namespace with `--prompts` synthetic prompts (the standard pool):
   - Phase A, max throughput: `--clients` closed-loop workers, each lease(64) -> report the 64
     results (reward Bernoulli(meta.p_success)) -> lease again, for `--duration` s, with
     `--trainers` consumers pulling and acking `--batch-size`-group batches so flow control keeps
     opening groups.
   - Phase B, paced: open-loop arrivals of lease(64) -> report at `--rate` results/s for
     `--duration` s; latency is measured from each cycle's scheduled start (no coordinated omission)
     for /leases and from the moment the results are sent for /results.
3. `redis-benchmark` against the same redis-server: EVALSHA of a trivial script (the ceiling on
   script calls per second) and of the real `lease.lua` on an empty queue.
4. A table, printed and written to `--out` with the command and the date.

Usage: python bench/service_throughput.py [--duration 20] [--clients 16] [--rate 2000]
                                          [--policy uniform,sara] [--topology auto|1x1|1x2|2x1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from sara_client import AsyncSaraClient
from sara_service.embedded import EmbeddedRedis, free_port
from sara_worker.sim.pool import standard_pool
from sara_service.store.redis_format import SCRIPTS
from sara_service.store.runner import script_source

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "service_throughput.txt"
TOPOLOGIES = {  # name -> (serve processes, uvicorn workers per process)
    "1x1": (1, 1),
    "1x2": (1, 2),
    "2x1": (2, 1),
}
LEASE_WAIT_S = 5.0  # phase A's lease long-poll: sara_worker's default lease_wait_s
STARTUP_LINE = "no role tokens configured"  # logged once per uvicorn worker at start-up
TOPOLOGY_TEXT = {"1x1": "1 serve process", "1x2": "1 serve process, --workers 2",
                 "2x1": "2 serve processes"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- processes -----------------------------------------------------------------------------------


class Serve:
    """One `sara serve` subprocess (possibly with several uvicorn workers)."""

    def __init__(self, log_dir: Path, name: str, redis_url: str, namespace: str, policy: str,
                 workers: int, args: argparse.Namespace) -> None:
        self.name, self.workers = name, workers
        self.port = free_port()
        self.log_path = log_dir / f"{name}.log"
        self.cmd = [args.serve_python, "-m", "sara_cli", "serve", "--port", str(self.port),
                    "--redis-url", redis_url, "--namespace", namespace, "--policy", policy,
                    "--group-size", str(args.group_size), "--batch-size", str(args.batch_size),
                    "--workers", str(workers), "--log-level", "warning"]  # no access log
        env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
        env.update({"SARA_PREFETCH_BATCHES": str(args.prefetch_batches),
                    "PYTHONUNBUFFERED": "1"})
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Until /readyz answers and, with several uvicorn workers, each has started its app
        (each logs the open-API warning at start-up; 10 s after the first ready answer without
        them, go on anyway)."""
        deadline = time.monotonic() + timeout_s
        first_ok = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.tail()}")
            try:
                ok = httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200
            except httpx.TransportError:
                ok = False
            if ok:
                first_ok = first_ok or time.monotonic()
                started = self.log_path.read_text(errors="replace").count(STARTUP_LINE)
                if self.workers == 1 or started >= self.workers or \
                        time.monotonic() - first_ok > 10:
                    return
            time.sleep(0.1)  # start-up polling with a deadline
        raise RuntimeError(f"{self.name} not ready after {timeout_s}s:\n{self.tail()}")

    def pids(self) -> list[int]:
        """The serve process and its uvicorn worker children."""
        out = [self.proc.pid]
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            out += [int(p) for p in children.split()]
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU seconds of these processes so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


# --- load ----------------------------------------------------------------------------------------


@dataclass
class Tally:
    results: int = 0           # results sent in /results calls that answered
    accepted: int = 0          # results the service accepted (not late, not duplicate)
    leases: int = 0
    empty_leases: int = 0
    batches: int = 0
    groups: int = 0
    errors: int = 0
    lease_ms: list[float] = field(default_factory=list)
    results_ms: list[float] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    first_errors: list[str] = field(default_factory=list)

    def error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        if len(self.first_errors) < 3:
            self.first_errors.append(f"{where}: {type(exc).__name__}: {exc}"[:300])
            log(f"  error: {self.first_errors[-1]}")

    def freeze(self) -> Tally:
        """A copy of the counts now (the load keeps running a moment after a phase ends)."""
        return dataclasses.replace(self, lease_ms=list(self.lease_ms),
                                   results_ms=list(self.results_ms),
                                   batch_ms=list(self.batch_ms),
                                   first_errors=list(self.first_errors))


class SdkDriver:
    """Talks to one scheduler through the async SDK (pydantic models both ways), like a worker."""

    def __init__(self, url: str) -> None:
        self.client = AsyncSaraClient(url, timeout=30.0)

    async def lease(self, wid: str, n: int, wait_s: float = 0.0) -> list[tuple[str, float]]:
        answer = await self.client.lease(wid, n, wait_s=wait_s)
        return [(r.rollout_id, float(r.meta.get("p_success", 0.5))) for r in answer.rollouts]

    async def report(self, wid: str, results: list[dict]) -> int:
        return (await self.client.report(wid, results)).accepted

    async def next_batch(self, size: int) -> tuple[str, int] | None:
        batch = await self.client.next_batch(size, wait_s=0.5)
        return None if batch is None else (batch.batch_id, len(batch.groups))

    async def ack(self, batch_id: str) -> None:
        await self.client.ack(batch_id)

    async def aclose(self) -> None:
        await self.client.aclose()


class RawDriver(SdkDriver):
    """The same calls over bare httpx and the json module: a cheaper load generator, so more of
    the shared CPU goes to the service. It checks status codes and reads only the fields it
    needs; subclasses change the transport (`_call`) and the JSON codec."""

    dumps, loads = staticmethod(json.dumps), staticmethod(json.loads)

    def __init__(self, url: str) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=30.0,
                                      headers={"content-type": "application/json"})

    async def _transport(self, path: str, body: bytes | str) -> tuple[int, bytes]:
        response = await self.http.post(path, content=body)
        return response.status_code, response.content

    async def _call(self, path: str, body: dict) -> tuple[int, bytes]:
        status, data = await self._transport(path, self.dumps(body))
        if status >= 400:
            raise RuntimeError(f"{path}: HTTP {status} {data[:200]!r}")
        return status, data

    async def lease(self, wid: str, n: int, wait_s: float = 0.0) -> list[tuple[str, float]]:
        _, data = await self._call("/leases", {"worker_id": wid, "max_rollouts": n,
                                               "wait_s": wait_s})
        return [(r["rollout_id"], float(r["meta"].get("p_success", 0.5)))
                for r in self.loads(data)["rollouts"]]

    async def report(self, wid: str, results: list[dict]) -> int:
        _, data = await self._call("/results", {"worker_id": wid, "results": results})
        return self.loads(data)["accepted"]

    async def next_batch(self, size: int) -> tuple[str, int] | None:
        status, data = await self._call("/batches/next", {"size": size, "wait_s": 0.5})
        if status == 204:
            return None
        batch = self.loads(data)
        return batch["batch_id"], len(batch["groups"])

    async def ack(self, batch_id: str) -> None:
        await self._call(f"/batches/{batch_id}/ack", {})

    async def aclose(self) -> None:
        await self.http.aclose()


class LeanDriver(RawDriver):
    """The same calls over aiohttp and orjson: the cheapest well-kept client here, so that on a
    small box the load generator takes as little as possible of the CPU the service is measured
    on."""

    dumps, loads = staticmethod(orjson.dumps), staticmethod(orjson.loads)

    def __init__(self, url: str) -> None:
        import aiohttp  # the bench extra; only this driver needs it
        self.url = url.rstrip("/")
        self.session = aiohttp.ClientSession(
            headers={"content-type": "application/json"},
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=30.0))

    async def _transport(self, path: str, body: bytes | str) -> tuple[int, bytes]:
        async with self.session.post(self.url + path, data=body) as response:
            return response.status, await response.read()

    async def aclose(self) -> None:
        await self.session.close()


DRIVERS = {"sdk": SdkDriver, "raw": RawDriver, "lean": LeanDriver}
CLIENT_TEXT = {"sdk": "the async SDK, pydantic models both ways", "raw": "bare httpx + json",
               "lean": "aiohttp + orjson"}


@functools.lru_cache(maxsize=4)
def generated(tokens: int) -> dict:
    """What a worker that sends its tokens reports per result: `tokens` token ids and logprobs
    and ~4 characters of completion per token (one draw, shared by every result: the load
    generator's CPU stays on the wire, not on random numbers)."""
    rng = random.Random(tokens)
    return {"completion": "x" * (4 * tokens), "completion_tokens": tokens,
            "token_ids": [rng.randrange(150_000) for _ in range(tokens)],
            "logprobs": [round(-5 * rng.random(), 6) for _ in range(tokens)]}


def make_results(rollouts: list[tuple[str, float]], rng: random.Random,
                 tokens: int = 0) -> list[dict]:
    body = generated(tokens) if tokens else {"completion": "", "completion_tokens": 16}
    return [{"rollout_id": rid, "reward": 1.0 if rng.random() < p else 0.0, **body,
             "finish_reason": "stop", "policy_version": 0} for rid, p in rollouts]


async def cycle(driver: SdkDriver, wid: str, per_call: int, rng: random.Random,
                tally: Tally, t0: float | None = None, wait_s: float = 0.0,
                tokens: int = 0) -> int:
    """lease(per_call) -> report them. Latencies in ms; /leases from t0 (its scheduled start)."""
    start = time.perf_counter() if t0 is None else t0
    try:
        rollouts = await driver.lease(wid, per_call, wait_s)
    except Exception as exc:
        tally.error("/leases", exc)
        return 0
    t1 = time.perf_counter()
    tally.lease_ms.append((t1 - start) * 1e3)
    if not rollouts:
        tally.empty_leases += 1
        return 0
    tally.leases += 1
    results = make_results(rollouts, rng, tokens)
    t2 = time.perf_counter()
    try:
        accepted = await driver.report(wid, results)
    except Exception as exc:
        tally.error("/results", exc)
        return 0
    tally.results_ms.append((time.perf_counter() - t2) * 1e3)
    tally.results += len(results)
    tally.accepted += accepted
    return len(results)


async def trainer(driver: SdkDriver, size: int, stop: asyncio.Event, tally: Tally) -> None:
    """Pull and ack batches as fast as they come, so flow control keeps groups opening."""
    while not stop.is_set():
        t = time.perf_counter()
        try:
            got = await driver.next_batch(size)
            if got is None:
                continue
            await driver.ack(got[0])
        except Exception as exc:
            tally.error("/batches", exc)
            await asyncio.sleep(0.1)
            continue
        tally.batch_ms.append((time.perf_counter() - t) * 1e3)
        tally.batches += 1
        tally.groups += got[1]


async def progress(label: str, tally: Tally, started: float, duration: float,
                   stop: asyncio.Event) -> None:
    last_n, last_t = 0, started
    while not stop.is_set():
        await asyncio.sleep(1.0)
        now = time.perf_counter()
        rate = (tally.results - last_n) / (now - last_t)
        last_n, last_t = tally.results, now
        log(f"  {label} {now - started:5.1f}/{duration:.0f}s  {rate:9,.0f} results/s  "
            f"total {tally.results:,}  batches {tally.batches}  errors {tally.errors}")


def _drivers(urls: list[str], n: int, kind: str) -> list[SdkDriver]:
    """n drivers (each its own connection pool), spread over the serve processes."""
    return [DRIVERS[kind](urls[i % len(urls)]) for i in range(n)]


def machine_busy_cpu() -> float:
    """CPU seconds all processes on this machine have used (Linux /proc/stat), to tell how much
    of a phase went to processes other than the benchmark's."""
    with contextlib.suppress(OSError, ValueError):
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    return float("nan")


def redis_commandstats(url: str, reset: bool = False) -> dict[str, tuple[int, float]]:
    """{command: (calls, microseconds)} from INFO commandstats; RESETSTAT first if `reset`."""
    import redis as redis_py

    client = redis_py.Redis.from_url(url)
    try:
        if reset:
            client.config_resetstat()
            return {}
        info = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in info.items()}


def script_names() -> dict[str, str]:
    """sha1 -> script name of every service Lua script (how EVALSHA names them)."""
    return {hashlib.sha1(script_source(name).encode()).hexdigest(): name for name in SCRIPTS}


def slowlog_start(url: str) -> None:
    """Log every command's duration (SLOWLOG with a 0 us threshold) from now on."""
    import redis as redis_py

    client = redis_py.Redis.from_url(url)
    try:
        client.config_set("slowlog-max-len", 1_000_000)
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
    finally:
        client.close()


def slowlog_by_script(url: str) -> tuple[dict[str, tuple[int, float]], float]:
    """({script or command: (calls, microseconds)}, seconds covered) from the SLOWLOG since
    slowlog_start, then the SLOWLOG settings back to Redis' defaults. Redis 6 logs the commands a
    script runs too, so the log may wrap: rates are over the window it still covers."""
    import redis as redis_py

    names = script_names()
    client = redis_py.Redis.from_url(url)
    try:
        entries = client.slowlog_get(1_000_000)
        client.config_set("slowlog-log-slower-than", 10_000)
        client.config_set("slowlog-max-len", 128)
        client.slowlog_reset()
    finally:
        client.close()
    out: dict[str, list] = {}
    for e in entries:
        words = e["command"].split()
        name = words[0].decode().lower() if words else "?"
        if name == "evalsha" and len(words) > 1:
            name = names.get(words[1].decode(), "evalsha ?")
        calls_usec = out.setdefault(name, [0, 0.0])
        calls_usec[0] += 1
        calls_usec[1] += e["duration"]
    starts = [e["start_time"] for e in entries]
    window = (max(starts) - min(starts) + 1) if starts else 1
    return {k: (v[0], v[1]) for k, v in out.items()}, float(window)


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def phase_max(urls: list[str], args: argparse.Namespace, duration: float,
                    label: str) -> tuple[Tally, float, float]:
    """Closed loop: `args.clients` workers as fast as they go.
    Returns (tally, seconds, load generator CPU seconds)."""
    tally = Tally()
    workers = _drivers(urls, args.clients, args.client)
    trainers = _drivers(urls, args.trainers, args.client)
    stop = asyncio.Event()

    async def worker(i: int) -> None:
        # like sara_worker, a lease long-polls while flow control waits on the trainer, and the
        # scheduler answers it when room opens (a wake-up, not a retry loop)
        rng = random.Random(i)
        while not stop.is_set():
            if not await cycle(workers[i], f"bench-w{i}", args.per_call, rng, tally,
                               wait_s=LEASE_WAIT_S, tokens=args.result_tokens):
                await asyncio.sleep(0.005)  # a poll that ended empty (or an error)

    cpu0, started = own_cpu(), time.perf_counter()
    tasks = [asyncio.create_task(worker(i)) for i in range(args.clients)]
    tasks += [asyncio.create_task(trainer(t, args.batch_size, stop, tally)) for t in trainers]
    tasks.append(asyncio.create_task(progress(label, tally, started, duration, stop)))
    await asyncio.sleep(duration)
    frozen, elapsed, cpu = tally.freeze(), time.perf_counter() - started, own_cpu() - cpu0
    stop.set()
    await asyncio.gather(*tasks)
    for d in workers + trainers:
        await d.aclose()
    return frozen, elapsed, cpu


async def phase_paced(urls: list[str], args: argparse.Namespace, label: str) -> tuple[Tally, float]:
    """Open loop: a lease(64) -> report cycle starts every per_call/rate seconds, whatever the
    previous ones are doing."""
    tally = Tally()
    pool = _drivers(urls, len(urls), args.client)
    trainers = _drivers(urls, args.trainers, args.client)
    stop = asyncio.Event()
    interval = args.per_call / args.rate
    n_cycles = int(args.duration / interval)
    rng = random.Random(7)
    started = time.perf_counter()
    side = [asyncio.create_task(trainer(t, args.batch_size, stop, tally)) for t in trainers]
    side.append(asyncio.create_task(progress(label, tally, started, args.duration, stop)))
    inflight: set[asyncio.Task] = set()
    for i in range(n_cycles):
        t0 = started + i * interval
        delay = t0 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(cycle(pool[i % len(pool)], f"bench-p{i % 64}", args.per_call,
                                         rng, tally, t0=t0, tokens=args.result_tokens))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
    if inflight:
        await asyncio.wait(inflight, timeout=30)
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*side)
    for d in pool + trainers:
        await d.aclose()
    return tally, elapsed


async def load_prompts(url: str, n: int) -> None:
    async with AsyncSaraClient(url, timeout=120.0) as c:
        pool = standard_pool(n, seed=0)
        for i in range(0, n, 5000):
            await c.add_prompts(pool[i:i + 5000])


# --- redis-benchmark -----------------------------------------------------------------------------


def redis_benchmark(port: int, n: int) -> list[tuple[str, str]]:
    """(label, rate) rows from redis-benchmark EVALSHA runs against the bench's redis-server."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return [("redis-benchmark EVALSHA", "skipped: redis-benchmark not on PATH "
                 "(apt-get install redis-tools)")]
    import redis as redis_py
    from sara_service.store.keys import Keys

    client = redis_py.Redis(port=port)
    trivial = "return 1"
    lease_lua = script_source("lease")
    rows = []
    k = Keys("redis-benchmark")
    lease_keys = [k.pending, k.slots, k.inflight, k.stats, k.cancels, k.lease("lb"),
                  k.lease_rollouts("lb"), k.workers, k.group_prompt, k.prompts, k.worker_info,
                  k.policy, k.run_state, k.prompts_retired]
    for label, script, keys, argv in [
            ("EVALSHA `return 1`", trivial, [], []),
            ("EVALSHA lease.lua, empty queue", lease_lua, lease_keys,
             ["1", "rb", "lb", "64", "2", "60", ""])]:
        sha = client.script_load(script)
        assert sha == hashlib.sha1(script.encode()).hexdigest()
        cmd = [exe, "-p", str(port), "-n", str(n), "-c", "50", "-q", "evalsha", sha,
               str(len(keys)), *keys, *argv]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        text = (out.stdout + out.stderr).strip().splitlines()
        found = [m for ln in text if (m := re.search(r"([\d.]+) requests per second"
                                                    r"(?:, p50=([\d.]+) msec)?", ln))]
        rate = (f"{float(found[-1][1]):,.0f} calls/s" + (f", p50 {found[-1][2]} ms"
                                                      if found[-1][2] else "")
                if found else " | ".join(text[-2:]) or "no output")
        rows.append((f"same redis-server, redis-benchmark {label} (-c 50, -n {n})", rate))
    client.close()
    return rows


# --- report --------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def fmt_lat(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{pct(values, 0.5):6.1f} / {pct(values, 0.99):6.1f} ms (n={len(values)})"


@dataclass
class MaxRun:
    tally: Tally
    seconds: float
    loadgen_cpu: float   # CPU seconds of this process (the load generator) in the window
    serve_cpu: float     # of the serve processes and their uvicorn workers
    redis_cpu: float     # of redis-server
    machine_cpu: float = float("nan")  # of every process on the machine
    commands: dict[str, tuple[int, float]] = field(default_factory=dict)  # redis commandstats

    @property
    def other_cpu(self) -> float:
        """CPU seconds used by processes outside the benchmark (other jobs on a shared box)."""
        return max(0.0, self.machine_cpu - self.loadgen_cpu - self.serve_cpu - self.redis_cpu)

    @property
    def rate(self) -> float:
        return self.tally.results / self.seconds

    def cores(self, cpu: float) -> float:
        return cpu / self.seconds


async def run_topology(name: str, policy: str, redis: EmbeddedRedis, log_dir: Path,
                       args: argparse.Namespace, phases: list[str], duration: float,
                       profile_dir: Path | None = None) -> dict:
    """Start the topology on a fresh namespace, load prompts, run `phases` ('max', 'paced')."""
    procs, uv_workers = TOPOLOGIES[name]
    namespace = f"bench-{policy}-{name}-{int(time.time() * 1000) % 10**8}"
    servers = [Serve(log_dir, f"{namespace}-{i}", redis.url, namespace, policy, uv_workers, args)
               for i in range(procs)]
    out: dict = {"topology": name, "policy": policy}
    spy: list[subprocess.Popen] = []
    try:
        for s in servers:
            s.wait_ready()
        urls = [s.url for s in servers]
        await load_prompts(urls[0], args.prompts)
        pids = [p for s in servers for p in s.pids()]
        for phase in phases:
            label = f"[{policy} {name} {phase}]"
            if phase == "max":
                if profile_dir is not None:
                    spy = start_profiles(pids, profile_dir, f"{policy}-{name}", duration)
                serve0, redis0 = cpu_seconds(pids), cpu_seconds([redis.process.pid])
                machine0 = machine_busy_cpu()
                redis_commandstats(redis.url, reset=True)
                if args.script_costs:
                    slowlog_start(redis.url)
                tally, secs, loadgen = await phase_max(urls, args, duration, label)
                out["max"] = MaxRun(tally, secs, loadgen, cpu_seconds(pids) - serve0,
                                    cpu_seconds([redis.process.pid]) - redis0,
                                    machine_busy_cpu() - machine0,
                                    redis_commandstats(redis.url))
                if args.script_costs:
                    out["scripts"] = slowlog_by_script(redis.url)
                for p in spy:
                    p.wait(timeout=120)
            elif phase == "paced":
                out["paced"] = await phase_paced(urls, args, label)
    finally:
        for p in spy:
            if p.poll() is None:
                p.terminate()
        for s in servers:
            s.stop()
    return out


def start_profiles(pids: list[int], profile_dir: Path, label: str,
                   duration: float) -> list[subprocess.Popen]:
    spy = shutil.which("py-spy") or os.environ.get("PY_SPY")
    if not spy:
        log("  --profile: py-spy not found (pip install py-spy, or PY_SPY=/path/to/py-spy)")
        return []
    profile_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for pid in pids:
        for fmt, ext in (("speedscope", "json"), ("raw", "txt")):
            path = profile_dir / f"{label}-{pid}.{ext}"
            procs.append(subprocess.Popen(
                [spy, "record", "-p", str(pid), "-d", str(max(1, int(duration) - 2)), "-r", "200",
                 "-f", fmt, "-o", str(path), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    p.add_argument("--clients", type=int, default=16, help="closed-loop workers in phase A")
    p.add_argument("--rate", type=float, default=2000.0, help="results/s in phase B")
    p.add_argument("--policy", default="uniform,sara",
                   help="comma-separated: uniform, dynamic_sampling, sara")
    p.add_argument("--topology", default="auto",
                   help="auto (sweep, then the fastest) or one of " + ", ".join(TOPOLOGIES))
    p.add_argument("--sweep-duration", type=float, default=10.0, help="seconds per sweep run")
    p.add_argument("--client", choices=sorted(DRIVERS), default="sdk",
                   help="load generator: the async SDK; bare httpx (less client CPU); aiohttp + "
                        "orjson (least)")
    p.add_argument("--trainers", type=int, default=2, help="concurrent batch consumers")
    p.add_argument("--per-call", type=int, default=64, help="rollouts per lease and per report")
    p.add_argument("--result-tokens", type=int, default=0,
                   help="token ids and logprobs each result carries, as a worker feeding a "
                        "trainer that needs them sends (0: none, 16 tokens counted)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256, help="groups per trainer batch")
    p.add_argument("--prefetch-batches", type=int, default=8)
    p.add_argument("--prompts", type=int, default=10_000)
    p.add_argument("--redis-benchmark-n", type=int, default=200_000)
    p.add_argument("--serve-python", default=sys.executable,
                   help="interpreter for `sara serve` (e.g. a venv with uvloop and hiredis)")
    p.add_argument("--profile", type=Path, default=None,
                   help="write py-spy profiles of the serve processes in phase A to this dir")
    p.add_argument("--script-costs", action="store_true",
                   help="time every Lua script in phase A (Redis SLOWLOG at 0 us; small overhead)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the table")
    p.add_argument("--append", action="store_true", help="append to --out instead of replacing")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    args.load_before = _loadavg()
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else sys.argv[0]
    command = "python " + " ".join(shlex.quote(str(a)) for a in [shown, *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="sara-bench-") as tmp:
        tmp_path = Path(tmp)
        with EmbeddedRedis(tmp_path / "redis") as redis:
            log(f"redis-server on port {redis.port} (AOF on, in {tmp_path / 'redis'})")
            sweep: list[tuple[str, MaxRun]] = []
            topology = args.topology
            if topology == "auto":
                for name in TOPOLOGIES:
                    log(f"sweep: {TOPOLOGY_TEXT[name]} ({args.sweep_duration:.0f}s, uniform)")
                    r = await run_topology(name, "uniform", redis, tmp_path, args, ["max"],
                                           args.sweep_duration)
                    sweep.append((name, r["max"]))
                topology = max(sweep, key=lambda x: x[1].rate)[0]
                log(f"sweep: fastest is {TOPOLOGY_TEXT[topology]}")
            runs = []
            for policy in policies:
                log(f"{policy}: {TOPOLOGY_TEXT[topology]}, {args.clients} {args.client} clients")
                runs.append(await run_topology(topology, policy, redis, tmp_path, args,
                                               ["max", "paced"], args.duration, args.profile))
            log("redis-benchmark ...")
            rb_rows = redis_benchmark(redis.port, args.redis_benchmark_n)
    text = report(args, command, topology, sweep, runs, rb_rows)
    print(text)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.append and args.out.exists():
            text = args.out.read_text() + "\n" + "=" * 100 + "\n\n" + text
        args.out.write_text(text)
        log(f"written to {args.out}")
    return 0


def code_version() -> str:
    """HEAD commit, and whether service/ or client/ differ from it (what was measured)."""
    def git(*a: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True,
                             check=False)
        return out.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "service", "client")
    return head + (" + uncommitted changes in service/ or client/" if dirty else " (clean)")


def serve_stack(python: str) -> str:
    """Which optional speed-ups the serve interpreter has (uvicorn picks uvloop/httptools up,
    redis-py picks hiredis up, when installed)."""
    code = ("import importlib.util as u; print(' '.join(m + ('=yes' if u.find_spec(m) else '=no')"
            " for m in ('uvloop', 'httptools', 'hiredis', 'orjson')))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


NOT_WORK = ("evalsha", "eval", "config|resetstat", "config", "info")  # the calls, not their work


def _commands_per_result(m: MaxRun) -> float:
    """Redis commands per result reported in phase A, from the INFO commandstats delta: every
    command the scripts ran plus the service's own, not the script calls themselves."""
    inner = sum(calls for name, (calls, _) in m.commands.items() if name not in NOT_WORK)
    return inner / max(m.tally.results, 1)


def _tokens_text(tokens: int) -> str:
    if not tokens:
        return "results without token ids"
    return f"each result with {tokens} token ids and logprobs and {4 * tokens} characters"


def report(args: argparse.Namespace, command: str, topology: str,
           sweep: list[tuple[str, MaxRun]], runs: list[dict],
           rb_rows: list[tuple[str, str]]) -> str:
    now = datetime.datetime.now(datetime.UTC).astimezone()
    lines = [
        "SARA scheduler throughput (bench/service_throughput.py)",
        f"date:      {now:%Y-%m-%d %H:%M:%S %Z}",
        f"code:      {code_version()}",
        f"command:   {command}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; redis-server, serve processes and the load generator "
        "all share these CPUs",
        f"load:      1/5/15-min load average {args.load_before} at the start, "
        f"{_loadavg()} at the end (anything above the bench's own ~2 is other work)",
        f"setup:     k={args.group_size}, {args.per_call} rollouts per lease and per /results "
        f"call ({_tokens_text(args.result_tokens)}), trainer batch_size={args.batch_size}, prefetch_batches={args.prefetch_batches}, "
        f"{args.prompts} prompts (standard pool), embedded redis-server (AOF everysec), "
        f"serve under {args.serve_python} ({serve_stack(args.serve_python)}), "
        f"load generator: {args.client} clients ({CLIENT_TEXT[args.client]})",
        "",
    ]
    if sweep:
        lines.append(f"topology sweep (uniform, closed loop, {args.clients} clients, "
                     f"{args.sweep_duration:.0f}s each):")
        for name, m in sweep:
            mark = "  <- used below" if name == topology else ""
            lines.append(f"  {TOPOLOGY_TEXT[name]:30} {m.rate:8,.0f} results/s   CPU cores: "
                         f"serve {m.cores(m.serve_cpu):4.2f} redis {m.cores(m.redis_cpu):4.2f} "
                         f"loadgen {m.cores(m.loadgen_cpu):4.2f} other "
                         f"{m.cores(m.other_cpu):4.2f}{mark}")
        lines.append("")
    lines.append(f"topology: {TOPOLOGY_TEXT[topology]}; latency p50 / p99 as the client sees it")
    header = (f"  {'policy':16} {'phase':32} {'results/s':>9}  {'/leases p50 / p99':>29}  "
              f"{'/results p50 / p99':>29}")
    lines += [header, "  " + "-" * (len(header) - 2)]
    detail = []
    for r in runs:
        m: MaxRun = r["max"]
        t = m.tally
        lines.append(f"  {r['policy']:16} {'A max: ' + str(args.clients) + ' clients, closed loop':32}"
                     f" {m.rate:9,.0f}  {fmt_lat(t.lease_ms):>29}  {fmt_lat(t.results_ms):>29}")
        pt, psecs = r["paced"]
        lines.append(f"  {r['policy']:16} {'B paced: ' + format(args.rate, ',.0f') + ' results/s open loop':32}"
                     f" {pt.results / psecs:9,.0f}  {fmt_lat(pt.lease_ms):>29}  "
                     f"{fmt_lat(pt.results_ms):>29}")
        per = {name: cpu / max(t.results, 1) * 1e6 for name, cpu in
               (("serve", m.serve_cpu), ("redis", m.redis_cpu), ("loadgen", m.loadgen_cpu))}
        service_us = per["serve"] + per["redis"]
        detail.append(
            f"  {r['policy']:16} CPU cores used: serve {m.cores(m.serve_cpu):4.2f}, redis "
            f"{m.cores(m.redis_cpu):4.2f}, loadgen {m.cores(m.loadgen_cpu):4.2f}, other "
            f"processes on the box {m.cores(m.other_cpu):4.2f}")
        detail.append(
            f"  {'':16} CPU per result: serve {per['serve']:.0f} us + redis {per['redis']:.0f} us"
            f" (+ loadgen {per['loadgen']:.0f} us) -> 2 dedicated cores could carry at most "
            f"~{2e6 / (service_us + per['loadgen']):,.0f} results/s with this load generator on "
            f"them, ~{2e6 / service_us:,.0f} with it elsewhere")
        detail.append(
            f"  {'':16} {t.groups / m.seconds:,.0f} groups/s delivered in {t.batches} batches "
            f"(next+ack p50 {pct(t.batch_ms, 0.5):.0f} ms); "
            f"{t.accepted / max(t.results, 1):.1%} of results accepted (rest: late); "
            f"{t.empty_leases} empty leases (flow control waiting for the trainer); "
            f"{t.errors} errors")
    lines += [f"  {label}: {rate}" for label, rate in rb_rows]
    for r in runs:
        for where, t in (("A", r["max"].tally), ("B", r["paced"][0])):
            detail += [f"  {r['policy']:16} phase {where} error: {e}" for e in t.first_errors]
    lines += ["", "phase A detail:"] + detail + [""]
    for r in runs:
        m = r["max"]
        top = sorted(m.commands.items(), key=lambda kv: -kv[1][1])[:6]
        inner = _commands_per_result(m) * m.tally.results
        if m.commands and m.tally.results:
            lines.append(f"  {r['policy']:16} redis commands per result (INFO commandstats "
                         "delta over phase A: every command but EVALSHA/EVAL/CONFIG/INFO, the "
                         f"scripts' own included, / results reported): "
                         f"{inner / m.tally.results:.1f}; script calls per result: "
                         f"{m.commands.get('evalsha', (0, 0))[0] / m.tally.results:.3f}")
        if top:
            lines.append(f"  {r['policy']:16} redis commandstats (calls/s, us/call, share of a "
                         "core; evalsha includes the commands its scripts run): " + "; ".join(
                             f"{name} {calls / m.seconds:,.0f}/s {usec / max(calls, 1):.0f}us "
                             f"{usec / 1e6 / m.seconds:.0%}" for name, (calls, usec) in top))
    for r in runs:
        if "scripts" in r:
            costs, window = r["scripts"]
            scripts = {n: cu for n, cu in costs.items() if n in script_names().values()}
            lines.append(f"  {r['policy']:16} Lua scripts (--script-costs, last {window:.0f}s; "
                         "calls/s, us/call, share of a Redis core): " + "; ".join(
                             f"{name} {calls / window:,.0f}/s {usec / calls:,.0f}us "
                             f"{usec / 1e6 / window:.0%}" for name, (calls, usec) in
                             sorted(scripts.items(), key=lambda kv: -kv[1][1])))
    lines.append("")
    best = max(r["max"].rate for r in runs)
    p99 = ", ".join(f"{r['policy']} {pct(r['paced'][0].results_ms, 0.99):.1f} ms" for r in runs)
    per_result = ", ".join(
        f"{r['policy']} {_commands_per_result(r['max']):.1f}" for r in runs)
    lines.append(f"targets on 2 cores: >= 15,000 results/s: best {best:,.0f}; "
                 f"<= 12 redis commands per result: {per_result}; "
                 f"/results p99 < 20 ms at 2,000 results/s: {p99}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())

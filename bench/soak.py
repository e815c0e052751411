#!/usr/bin/env python
"""Soak: two scheduler replicas under a steady load for 10 minutes; is memory flat, is p99 steady?

Recorded, not asserted. Everything runs on this machine and is started and stopped by the script:

- an embedded redis-server (AOF on, `appendfsync everysec`, as `sara serve` runs it by default) in
  a temporary directory;
- two `sara serve` replicas on it, one namespace, `SARA_RETENTION_S` small (30 s) so that acked
  batches and finished groups are collected within the run, and `SARA_LEASE_TTL_S` 20 s;
- `--workers` simulated workers: the real worker loop (`sara_worker.loop.WorkerLoop`) with the sim
  backend, spread over `--worker-procs` processes, each worker on one replica (alternating);
  generation is paced by `--per-token-ms`, so the load is steady, not a closed loop at saturation;
  the workers lease with `wait_s=0` so that /leases latency is service time, not long-poll time;
- a trainer (this process) taking batches from the replicas in turn, acking each and publishing a
  new policy version every `--publish-every` batches (workers reload on it).

Every `--sample-s` seconds it records /stats counters, the RSS of each serve process and of
redis-server (/proc), Redis INFO (used_memory, AOF size), DBSIZE and the size of every
namespace-wide key (slots, group states, pending list, ...); every bucket (60 s, 5 s with
`--quick`) it counts the keys per kind with SCAN (lease:*, group:*, batch:*), and at the end it
estimates Redis memory per key kind (MEMORY USAGE of a sample of each). The worker processes time
every /leases, /results and heartbeat call and hand the timings over through a JSON-lines file.
Output: a table per bucket, the memory by key kind and a verdict (after warm-up: first half of
the window against the second, and the slope), printed and written to bench/results/soak.txt,
plus a chart bench/results/soak.png (when matplotlib is installed).

Usage:
    python bench/soak.py                    # the recorded run: 10 minutes
    python bench/soak.py --quick            # 30 s, 5 s buckets, prints only (unless --out)
    python bench/soak.py --duration 300 --workers 8 --per-token-ms 2
    # garbage collection against a high group turnover (see "gc overdue"):
    python bench/soak.py --quick --duration 60 --replicas 1 --policy uniform --group-size 2 \
        --per-token-ms 0.5 --retention 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "soak.txt"
NAMESPACE = "soak"
REPLICA_NAMES = "ABCDEFGH"
PATH_KIND = {"/leases": "lease", "/results": "results"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


# --- worker processes: the real worker loop with the sim backend --------------------------------


class TimingTransport(httpx.AsyncBaseTransport):
    """The default transport, timing each call from send to the last byte of the answer."""

    def __init__(self, timings: dict[str, list[float]], status: dict[str, int]) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.timings, self.status = timings, status

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        response = await self._inner.handle_async_request(request)
        await response.aread()
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        path = request.url.path
        kind = PATH_KIND.get(path) or ("heartbeat" if path.endswith("/heartbeat") else "other")
        self.timings[kind].append(elapsed_ms)
        key = f"{kind} {response.status_code}"
        self.status[key] = self.status.get(key, 0) + 1
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def worker_process_main(args: argparse.Namespace) -> None:
    """`--worker-proc`: run workers `first … first+count-1` until SIGTERM, writing timings."""
    import logging

    from sara_client import AsyncSaraClient
    from sara_worker.sim.backend import SimBackend
    from sara_worker.loop import WorkerConfig, WorkerLoop

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: "
                                                      "%(message)s")
    urls = args.urls.split(",")
    timings: dict[str, list[float]] = defaultdict(list)
    status: dict[str, int] = {}  # "<call> <HTTP status>" -> answers
    loops, clients = [], []
    for i in range(args.first, args.first + args.count):
        client = AsyncSaraClient(urls[i % len(urls)], timeout=60.0,
                                 transport=TimingTransport(timings, status))
        backend = SimBackend(seed=args.seed + i, per_token_s=args.per_token_ms / 1000.0,
                             step_tokens=64)
        config = WorkerConfig(worker_id=f"soak-w{i}", backend_name="sim",
                              capacity=args.capacity, lease_wait_s=0.0, idle_poll_s=0.05,
                              report_batch=16, flush_interval_s=0.05,
                              lease_ttl_s=args.lease_ttl, log_interval_s=3600.0)
        clients.append(client)
        loops.append(WorkerLoop(client, backend, config))
    stopping = asyncio.Event()
    aio = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aio.add_signal_handler(sig, stopping.set)
    out = open(args.stats_file, "a", encoding="utf-8")  # noqa: SIM115 (closed below)

    def flush() -> None:
        counters: dict[str, int] = defaultdict(int)
        for loop in loops:
            for key, value in loop.counters.as_dict().items():
                counters[key] += value
        line = {"t": time.time(), "proc": args.first, "timings": dict(timings),
                "status": dict(status), "counters": counters}
        out.write(json.dumps(line) + "\n")
        out.flush()
        timings.clear()

    runs = [asyncio.ensure_future(loop.run()) for loop in loops]
    try:
        while not stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), args.sample_s)
            flush()
            for run in runs:
                if run.done() and run.exception() is not None:
                    raise run.exception()
        for loop in loops:
            loop.stop(abort=True)
        await asyncio.wait(runs, timeout=30)
    finally:
        flush()
        out.close()
        for client in clients:
            await client.aclose()


# --- the scheduler, redis, /proc -----------------------------------------------------------------


class Serve:
    """One `sara serve` replica as a subprocess."""

    def __init__(self, log_dir: Path, name: str, redis_url: str, args: argparse.Namespace) -> None:
        from sara_service.embedded import free_port

        self.name = name
        self.port = free_port()
        self.log_path = log_dir / f"{name}.log"
        cmd = [sys.executable, "-m", "sara_cli", "serve", "--port", str(self.port),
               "--redis-url", redis_url, "--namespace", NAMESPACE, "--policy", args.policy,
               "--group-size", str(args.group_size), "--batch-size", str(args.batch_size),
               "--log-level", "warning"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
        env.update({"SARA_RETENTION_S": str(args.retention),
                    "SARA_LEASE_TTL_S": str(args.lease_ttl),
                    "SARA_PREFETCH_BATCHES": str(args.prefetch_batches),
                    "SARA_BATCH_ACK_TIMEOUT_S": "60", "PYTHONUNBUFFERED": "1"})
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)  # start-up polling with a deadline
        raise RuntimeError(f"{self.name} not ready after {timeout_s}s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def rss_mb(pid: int) -> float:
    """Resident memory of a process (VmRSS), MiB; nan when it is gone."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def cpu_seconds(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return float("nan")


def machine_busy_cpu() -> float:
    """CPU seconds all processes on this machine have used so far (/proc/stat, busy time)."""
    with contextlib.suppress(OSError, ValueError):
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    return float("nan")


def key_kind(key: str, prefix: str) -> str:
    """`sara:{soak}:lease:l0123…:rollouts` -> `lease:*:rollouts`; fixed names stay as they are."""
    name = key[len(prefix):] if key.startswith(prefix) else key
    return re.sub(r"^(lease|group|batch):[^:]+", r"\1:*", name)


# --- samples -------------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # seconds since the load started
    counters: dict[str, Any]
    queues: dict[str, Any]
    policy_version: int
    serve_rss: list[float]
    serve_cpu: list[float]
    redis_rss: float
    redis_cpu: float
    worker_rss: list[float]
    worker_cpu: float
    machine_cpu: float  # every process on the box, ours included
    own_cpu: float  # this process: trainer and sampler
    used_memory: float
    used_memory_rss: float
    aof_mb: float
    dbsize: int
    sizes: dict[str, int]  # namespace-wide keys: length of each
    kinds: dict[str, int] | None = None  # keys per kind (SCAN), at bucket ends
    memory: dict[str, tuple[int, float]] | None = None  # at the end: kind -> (keys, bytes)


@dataclass
class Tally:
    batches: int = 0
    groups: int = 0
    redelivered: int = 0
    publishes: int = 0
    errors: list[str] = field(default_factory=list)
    batch_ms: list[tuple[float, float]] = field(default_factory=list)  # (t, next+ack ms)


def namespace_sizes(r: Any, keys: Any) -> dict[str, int]:
    """Length of every namespace-wide key, one pipelined round trip."""
    spec = [("slots", "hlen", keys.slots), ("group_states", "hlen", keys.group_states),
            ("group_prompt", "hlen", keys.group_prompt), ("posteriors", "hlen", keys.posteriors),
            ("cancels", "hlen", keys.cancels), ("workers:info", "hlen", keys.worker_info),
            ("pending", "llen", keys.pending), ("ready", "llen", keys.ready),
            ("inflight", "zcard", keys.inflight), ("open", "zcard", keys.open_groups),
            ("gc", "zcard", keys.gc), ("unacked", "zcard", keys.unacked),
            ("workers", "zcard", keys.workers), ("recent_batches", "llen", keys.recent_batches)]
    pipe = r.pipeline(transaction=False)
    for _, op, key in spec:
        getattr(pipe, op)(key)
    pipe.zcount(keys.gc, "-inf", time.time())
    pipe.hvals(keys.cancels)
    values = pipe.execute()
    sizes = {name: int(v) for (name, _, _), v in zip(spec, values)}
    sizes["gc overdue"] = int(values[-2])  # finished groups past retention, not yet collected
    sizes["cancel ids"] = sum(len(v.split()) for v in values[-1])
    return sizes


def memory_by_kind(r: Any, prefix: str, per_kind: int = 200) -> dict[str, tuple[int, float]]:
    """{kind: (keys, estimated bytes)}: MEMORY USAGE of up to `per_kind` keys of each kind,
    averaged and scaled to the kind's key count."""
    keys: dict[str, list[bytes]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for key in r.scan_iter(match=f"{prefix}*", count=2000):
        kind = key_kind(key.decode(), prefix)
        counts[kind] += 1
        if len(keys[kind]) < per_kind:
            keys[kind].append(key)
    out = {}
    for kind, sample in keys.items():
        pipe = r.pipeline(transaction=False)
        for key in sample:
            pipe.memory_usage(key, samples=5)
        sizes = [v or 0 for v in pipe.execute()]
        out[kind] = (counts[kind], sum(sizes) / len(sizes) * counts[kind])
    return out


def scan_kinds(r: Any, prefix: str) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for key in r.scan_iter(match=f"{prefix}*", count=2000):
        counts[key_kind(key.decode(), prefix)] += 1
    return dict(counts)


# --- the run -------------------------------------------------------------------------------------


async def trainer(urls: list[str], tally: Tally, stop: asyncio.Event, t0: float,
                  args: argparse.Namespace) -> None:
    """Take batches from the replicas in turn, ack each, publish a policy every few batches."""
    from sara_client import AsyncSaraClient, SaraError

    clients = [AsyncSaraClient(u, timeout=60.0) for u in urls]
    version = 0
    i = 0
    try:
        while not stop.is_set():
            client = clients[i % len(clients)]
            i += 1
            started = time.perf_counter()
            try:
                batch = await client.next_batch(wait_s=1.0)
                if batch is None:
                    continue
                await client.ack(batch.batch_id)
            except SaraError as exc:
                tally.errors.append(f"trainer: {exc}")
                continue
            tally.batch_ms.append((time.monotonic() - t0, (time.perf_counter() - started) * 1e3))
            tally.batches += 1
            tally.groups += len(batch.groups)
            tally.redelivered += int(batch.redelivered)
            if tally.batches % args.publish_every == 0:
                version += 1
                try:
                    await client.publish_policy(version, f"soak-ckpt-{version}")
                    tally.publishes += 1
                except SaraError as exc:
                    tally.errors.append(f"publish: {exc}")
    finally:
        for c in clients:
            await c.aclose()


async def sampler(serves: list[Serve], redis_pid: int, worker_procs: list[subprocess.Popen],
                  redis_url: str, samples: list[Sample], stop: asyncio.Event, t0: float,
                  args: argparse.Namespace) -> None:
    import redis as redis_py
    from sara_client import AsyncSaraClient
    from sara_service.store.keys import Keys

    keys = Keys(NAMESPACE)
    r = redis_py.Redis.from_url(redis_url)
    client = AsyncSaraClient(serves[0].url, timeout=30.0)
    next_scan = args.bucket
    last_progress = -1e9
    try:
        while True:
            stats = await client.stats()
            info = r.info()
            sample = Sample(
                t=time.monotonic() - t0, counters=stats.counters.model_dump(),
                queues=stats.queues.model_dump(), policy_version=stats.policy.version,
                serve_rss=[rss_mb(s.proc.pid) for s in serves],
                serve_cpu=[cpu_seconds(s.proc.pid) for s in serves],
                redis_rss=rss_mb(redis_pid), redis_cpu=cpu_seconds(redis_pid),
                worker_rss=[rss_mb(p.pid) for p in worker_procs],
                worker_cpu=sum(cpu_seconds(p.pid) for p in worker_procs),
                machine_cpu=machine_busy_cpu(), own_cpu=time.process_time(),
                used_memory=info["used_memory"] / 2**20,
                used_memory_rss=info["used_memory_rss"] / 2**20,
                aof_mb=info.get("aof_current_size", 0) / 2**20, dbsize=r.dbsize(),
                sizes=namespace_sizes(r, keys))
            # the last sample before a bucket ends (the next one would be past it) counts keys
            if sample.t + args.sample_s >= next_scan or stop.is_set():
                sample.kinds = scan_kinds(r, keys.prefix)
                next_scan += args.bucket
            if stop.is_set():
                sample.memory = memory_by_kind(r, keys.prefix)
            samples.append(sample)
            if sample.t - last_progress >= args.progress_s or stop.is_set():
                last_progress = sample.t
                progress(samples)
            for p in worker_procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker process {p.pid} exited with {p.returncode}")
            if stop.is_set():
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), args.sample_s)
    finally:
        r.close()
        await client.aclose()


def progress(samples: list[Sample]) -> None:
    s = samples[-1]
    prev = next((p for p in reversed(samples[:-1]) if s.t - p.t >= 5), samples[0])
    dt = max(s.t - prev.t, 1e-9)
    rate = (s.counters["rollouts_completed"] - prev.counters["rollouts_completed"]) / dt
    log(f"  t={s.t:6.0f}s  {rate:7,.0f} results/s  batches {s.counters['batches_acked']:,}  "
        f"policy v{s.policy_version}  redis used {s.used_memory:6.1f} MiB  "
        f"serve RSS {'/'.join(f'{x:.0f}' for x in s.serve_rss)} MiB  DBSIZE {s.dbsize:,}  "
        f"slots {s.sizes['slots']:,}  gc {s.sizes['gc']:,}")


async def drive(args: argparse.Namespace, serves: list[Serve], redis_url: str, redis_pid: int,
                workdir: Path) -> tuple[list[Sample], Tally, list[dict], float]:
    from sara_client import AsyncSaraClient
    from sara_worker.sim.pool import standard_pool

    async with AsyncSaraClient(serves[0].url, timeout=60.0) as admin:
        pool = standard_pool(args.prompts, args.seed)
        for i in range(0, len(pool), 1000):
            await admin.add_prompts(pool[i:i + 1000])
    urls = [s.url for s in serves]
    per_proc = [len(range(i, args.workers, args.worker_procs)) for i in range(args.worker_procs)]
    procs, stats_files, first = [], [], 0
    for n, count in enumerate(per_proc):
        stats_file = workdir / f"workers-{n}.jsonl"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-proc", "--urls",
               ",".join(urls), "--first", str(first), "--count", str(count),
               "--stats-file", str(stats_file), "--capacity", str(args.capacity),
               "--per-token-ms", str(args.per_token_ms), "--lease-ttl", str(args.lease_ttl),
               "--sample-s", str(args.sample_s), "--seed", str(args.seed)]
        first += count
        with (workdir / f"workers-{n}.log").open("wb") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        stats_files.append(stats_file)
    t0 = time.monotonic()
    wall0 = time.time()
    stop = asyncio.Event()
    samples: list[Sample] = []
    tally = Tally()
    tasks = [asyncio.ensure_future(trainer(urls, tally, stop, t0, args)),
             asyncio.ensure_future(sampler(serves, redis_pid, procs, redis_url, samples, stop,
                                           t0, args))]
    try:
        done, _ = await asyncio.wait(tasks, timeout=args.duration,
                                     return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # a crash ends the run early, with its error
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in procs:
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    lines = []
    for f in stats_files:
        with contextlib.suppress(OSError):
            lines += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    for line in lines:
        line["t"] = line["t"] - wall0
    return samples, tally, lines, time.monotonic() - t0


# --- report --------------------------------------------------------------------------------------


@dataclass
class Bucket:
    index: int
    end: float
    results_per_s: float
    late_per_s: float
    leases_per_s: float
    results_ms: list[float]
    lease_ms: list[float]
    heartbeat_ms: list[float]
    batches: int
    last: Sample
    kinds: dict[str, int]
    cpu: dict[str, float]


def buckets_of(samples: list[Sample], lines: list[dict], tally: Tally, seconds: float,
               width: float) -> list[Bucket]:
    out = []
    n = int(seconds // width + (1 if seconds % width > width / 4 else 0))
    prev = samples[0]
    kinds: dict[str, int] = {}
    for b in range(n):
        lo, hi = b * width, (b + 1) * width
        inside = [s for s in samples if lo < s.t <= hi + 1e-6] or [prev]
        last = inside[-1]
        kinds = next((s.kinds for s in reversed(inside) if s.kinds), kinds)
        dt = max(last.t - prev.t, 1e-9)
        rate = (last.counters["rollouts_completed"] - prev.counters["rollouts_completed"]) / dt
        late = (last.counters["results_late"] - prev.counters["results_late"]) / dt
        leases = (last.counters["leases_granted"] - prev.counters["leases_granted"]) / dt
        timing: dict[str, list[float]] = defaultdict(list)
        for line in lines:
            if lo < line["t"] <= hi + 1e-6 or (b == n - 1 and line["t"] > hi):
                for kind, values in line["timings"].items():
                    timing[kind] += values
        cpu = {"serve": sum(last.serve_cpu) - sum(prev.serve_cpu),
               "redis": last.redis_cpu - prev.redis_cpu,
               "workers": last.worker_cpu - prev.worker_cpu}
        ours = sum(cpu.values()) + last.own_cpu - prev.own_cpu
        cpu["other"] = last.machine_cpu - prev.machine_cpu - ours
        cpu = {k: v / dt for k, v in cpu.items()}
        out.append(Bucket(b + 1, hi, rate, late, leases, timing["results"], timing["lease"],
                          timing["heartbeat"], sum(1 for t, _ in tally.batch_ms if lo < t <= hi),
                          last, dict(kinds), cpu))
        prev = last
    return out


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope."""
    if len(points) < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else float("nan")


def git_state() -> str:
    def git(*a: str) -> str:
        out = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "service", "client", "worker")
    return head + (" + uncommitted changes in service/, client/ or worker/" if dirty else
                   " (clean)")


def report(args: argparse.Namespace, samples: list[Sample], tally: Tally, lines: list[dict],
           seconds: float, command: str) -> tuple[str, list[Bucket]]:
    width = args.bucket
    unit = "min" if width == 60 else f"{width:g}s"
    buckets = buckets_of(samples, lines, tally, seconds, width)
    last = samples[-1]
    c = last.counters
    totals = _last_per_process(lines, "counters")
    out = [
        "SARA soak (bench/soak.py)",
        f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"code:      {git_state()}",
        f"command:   {command}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; redis-server, {args.replicas} serve replica(s), "
        f"{args.worker_procs} worker "
        "processes and the trainer all share these CPUs",
        f"setup:     {args.workers} sim workers (real WorkerLoop, capacity {args.capacity}, "
        f"{args.per_token_ms:g} ms/token, lease wait 0) on {args.replicas} `sara serve` replica(s) "
        f"(alternating), policy {args.policy}, k={args.group_size}, batch_size={args.batch_size}, "
        f"prefetch_batches={args.prefetch_batches}, {args.prompts} prompts (standard pool), "
        f"SARA_RETENTION_S={args.retention:g}, SARA_LEASE_TTL_S={args.lease_ttl:g}; trainer acks "
        f"every batch and publishes a policy version every {args.publish_every} batches; "
        "embedded redis-server (AOF everysec)",
        f"ran:       {seconds:.0f} s; {c['rollouts_completed']:,} results accepted "
        f"({c['rollouts_completed'] / seconds:,.0f}/s), {c['results_late']:,} late, "
        f"{c['results_duplicate']:,} duplicate; {c['batches_acked']:,} batches acked "
        f"({c['groups_acked']:,} groups, {tally.redelivered} redelivered), policy "
        f"v{last.policy_version}; groups opened {c['groups_opened']:,}, committed "
        f"{c['groups_committed']:,}, abandoned {c['groups_abandoned']:,}, dropped stale "
        f"{c['groups_dropped_stale']:,}; leases {c['leases_granted']:,}; rollouts re-issued "
        f"{c['rollouts_reissued']:,}",
        f"clients:   HTTP answers {dict(sorted(_last_per_process(lines, 'status').items()))}; "
        f"worker transient errors {totals.get('transient_errors', 0)}, trainer errors "
        f"{len(tally.errors)}",
        "",
        f"per {unit}: results/s = results accepted (rollouts_completed) per second; leases/s = "
        "leases granted per second; latencies as the workers see them (send to last byte); "
        f"memory and key counts at the end of the {unit}; lease keys = lease:* + "
        "lease:*:rollouts; CPU in cores (other: processes on the box that are not this "
        "benchmark's)",
    ]
    head = (f"{unit:>5} {'results/s':>9} {'leases/s':>8} {'/results p50/p99 ms':>19} "
            f"{'/leases p50/p99 ms':>18} "
            f"{'batches':>7} {'serve RSS MiB':>13} {'redis RSS':>9} {'used_mem':>8} "
            f"{'AOF MiB':>7} {'DBSIZE':>8} {'slots':>8} {'lease keys':>10} {'group keys':>10} "
            f"{'gc zset':>7} {'gc overdue':>10} {'CPU serve/redis/workers/other':>29}")
    out += [head, "-" * len(head)]
    for b in buckets:
        s = b.last
        lease_keys = b.kinds.get("lease:*", 0) + b.kinds.get("lease:*:rollouts", 0)
        out.append(
            f"{b.index:>5} {b.results_per_s:>9,.0f} {b.leases_per_s:>8,.0f} "
            f"{percentile(b.results_ms, 50):>8.1f} / {percentile(b.results_ms, 99):>7.1f} "
            f"{percentile(b.lease_ms, 50):>7.1f} / {percentile(b.lease_ms, 99):>7.1f} "
            f"{b.batches:>7} {'/'.join(f'{x:.0f}' for x in s.serve_rss):>13} "
            f"{s.redis_rss:>9.1f} {s.used_memory:>8.1f} {s.aof_mb:>7.1f} {s.dbsize:>8,} "
            f"{s.sizes['slots']:>8,} {lease_keys:>10,} {b.kinds.get('group:*', 0):>10,} "
            f"{s.sizes['gc']:>7,} {s.sizes['gc overdue']:>10,} "
            f"{b.cpu['serve']:>14.2f}/{b.cpu['redis']:.2f}/{b.cpu['workers']:.2f}/"
            f"{b.cpu['other']:.2f}")
    out += ["", f"namespace-wide keys at the end of each {unit} (entries):"]
    names = list(samples[-1].sizes)
    head2 = f"{unit:>5} " + " ".join(f"{n:>13}" for n in names)
    out += [head2, "-" * len(head2)]
    for b in buckets:
        out.append(f"{b.index:>5} " + " ".join(f"{b.last.sizes[n]:>13,}" for n in names))
    # kinds with one key per id (the namespace-wide keys are in the table above)
    kinds = sorted({k for b in buckets for k in b.kinds if "*" in k})
    singles = len({k for b in buckets for k in b.kinds} - set(kinds))
    out += ["", f"keys per kind (SCAN) at the end of each {unit}, besides the {singles} "
                "namespace-wide keys:"]
    head3 = f"{unit:>5} " + " ".join(f"{k:>16}" for k in kinds) + f" {'all keys':>8}"
    out += [head3, "-" * len(head3)]
    for b in buckets:
        out.append(f"{b.index:>5} " + " ".join(f"{b.kinds.get(k, 0):>16,}" for k in kinds)
                   + f" {sum(b.kinds.values()):>8,}")
    memory = samples[-1].memory or {}
    if memory:
        total = sum(b for _, b in memory.values())
        out += ["", "Redis memory by key kind at the end (MEMORY USAGE of up to 200 keys per "
                    f"kind, scaled; used_memory {samples[-1].used_memory:.1f} MiB, dataset "
                    f"estimate {total / 2**20:.1f} MiB):",
                f"  {'kind':<20} {'keys':>8} {'bytes/key':>10} {'MiB':>8} {'share':>6}"]
        for kind, (n, size) in sorted(memory.items(), key=lambda kv: -kv[1][1]):
            out.append(f"  {kind:<20} {n:>8,} {size / max(n, 1):>10,.0f} {size / 2**20:>8.2f} "
                       f"{size / total:>6.1%}")
    out += ["", *verdict(buckets, args), "", *("trainer error: " + e for e in tally.errors[:5])]
    return "\n".join(out).rstrip() + "\n", buckets


def _last_per_process(lines: list[dict], field_name: str) -> dict[str, int]:
    """A cumulative per-process figure (HTTP status counts, worker counters), summed over the
    worker processes: each process' last line holds its totals."""
    last: dict[int, dict] = {}
    for line in lines:
        last[line["proc"]] = line[field_name]
    totals: dict[str, int] = defaultdict(int)
    for values in last.values():
        for key, value in values.items():
            totals[str(key)] += value
    return dict(totals)


def verdict(buckets: list[Bucket], args: argparse.Namespace) -> list[str]:
    """Slopes after warm-up: is memory flat, are key counts flat, is p99 steady?"""
    warm = max(1, int(args.warmup // args.bucket))
    steady = [b for b in buckets[warm:] if b.end <= buckets[-1].end]
    if len(steady) < 2:
        return ["(too short for a verdict: fewer than 2 buckets after warm-up)"]
    per = 60.0 / args.bucket  # slopes per minute

    def line(label: str, values: list[float], unit: str) -> str:
        pts = [(b.index, v) for b, v in zip(steady, values)]
        s = slope(pts) * per
        half = len(values) // 2
        first, second = values[:half], values[half:]
        m1, m2 = sum(first) / len(first), sum(second) / len(second)
        change = (m2 - m1) / m1 if m1 else float("inf") if m2 else 0.0
        # grows: the second half's mean is >15% above the first half's and even its smallest
        # value is above the first half's mean (noise on a level does not do that)
        if change > 0.15 and min(second) > m1:
            flag = "GROWS"
        elif change < -0.15 and max(second) < m1:
            flag = "SHRINKS"
        else:
            flag = "flat"
        return (f"  {label:<22} {min(values):>10,.1f} .. {max(values):>10,.1f} {unit:<4} "
                f"half-to-half {change:>+6.0%}  slope {s:>+10,.2f} {unit}/min  {flag}")

    out = [f"after warm-up ({args.warmup:g} s): buckets {steady[0].index}..{steady[-1].index}"]
    out.append(line("redis used_memory", [b.last.used_memory for b in steady], "MiB"))
    out.append(line("redis RSS", [b.last.redis_rss for b in steady], "MiB"))
    for i in range(len(steady[0].last.serve_rss)):
        out.append(line(f"serve replica {REPLICA_NAMES[i]} RSS",
                        [b.last.serve_rss[i] for b in steady], "MiB"))
    out.append(line("DBSIZE", [float(b.last.dbsize) for b in steady], "keys"))
    out.append(line("slots (HLEN)", [float(b.last.sizes["slots"]) for b in steady], ""))
    out.append(line("pending (LLEN)", [float(b.last.sizes["pending"]) for b in steady], ""))
    out.append(line("gc zset", [float(b.last.sizes["gc"]) for b in steady], ""))
    out.append(line("gc overdue", [float(b.last.sizes["gc overdue"]) for b in steady], ""))
    lease_keys = [float(b.kinds.get("lease:*", 0) + b.kinds.get("lease:*:rollouts", 0))
                  for b in steady]
    out.append(line("lease keys", lease_keys, ""))
    # two keys per lease, each living a key TTL past its last lease or heartbeat: lease keys /
    # leases per second is flat (about 2 x the key TTL) when they are bounded by their TTL
    out.append(line("lease keys / leases/s", [k / max(b.leases_per_s, 1e-9)
                                              for k, b in zip(lease_keys, steady)], "s"))
    out.append(line("results/s", [b.results_per_s for b in steady], "/s"))
    out.append(line("/results p99", [percentile(b.results_ms, 99) for b in steady], "ms"))
    out.append(line("/leases p99", [percentile(b.lease_ms, 99) for b in steady], "ms"))
    return out


def chart(buckets: list[Bucket], samples: list[Sample], path: Path, title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no chart (pip install matplotlib)"
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    t = [s.t / 60 for s in samples]
    ends = [b.end / 60 for b in buckets]
    ax = axes[0][0]
    ax.plot(ends, [b.results_per_s for b in buckets], marker="o")
    ax.set_ylabel("results accepted / s")
    ax.set_ylim(bottom=0)
    ax = axes[0][1]
    ax.plot(ends, [percentile(b.results_ms, 99) for b in buckets], marker="o", label="/results p99")
    ax.plot(ends, [percentile(b.lease_ms, 99) for b in buckets], marker="o", label="/leases p99")
    ax.plot(ends, [percentile(b.results_ms, 50) for b in buckets], ls="--", label="/results p50")
    ax.plot(ends, [percentile(b.lease_ms, 50) for b in buckets], ls="--", label="/leases p50")
    ax.set_ylabel("latency, ms")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(t, [s.used_memory for s in samples], label="redis used_memory")
    ax.plot(t, [s.redis_rss for s in samples], label="redis RSS")
    for i in range(len(samples[0].serve_rss)):
        ax.plot(t, [s.serve_rss[i] for s in samples], label=f"serve {REPLICA_NAMES[i]} RSS")
    ax.set_ylabel("MiB")
    ax.set_xlabel("minutes")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax = axes[1][1]
    ax.plot(t, [s.dbsize for s in samples], label="DBSIZE")
    ax.plot(t, [s.sizes["slots"] for s in samples], label="slots (HLEN)")
    ax.plot(t, [s.sizes["group_states"] for s in samples], label="group states (HLEN)")
    ax.plot(t, [s.sizes["gc"] for s in samples], label="gc zset")
    ax.plot(t, [s.sizes["pending"] for s in samples], label="pending (LLEN)")
    ax.set_xlabel("minutes")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=None, help="seconds of load (600)")
    p.add_argument("--workers", type=int, default=16, help="simulated workers (16)")
    p.add_argument("--quick", action="store_true", help="30 s, 5 s buckets, print only")
    p.add_argument("--worker-procs", type=int, default=2, help="processes the workers run in (2)")
    p.add_argument("--replicas", type=int, default=2, choices=range(1, 9),
                   help="`sara serve` replicas (2)")
    p.add_argument("--policy", default="sara", help="uniform, dynamic_sampling or sara (sara)")
    p.add_argument("--group-size", type=int, default=8, help="k (8)")
    p.add_argument("--capacity", type=int, default=32, help="rollouts in flight per worker (32)")
    p.add_argument("--per-token-ms", type=float, default=4.0,
                   help="sim generation time per token, ms: sets the load (4)")
    p.add_argument("--batch-size", type=int, default=64, help="groups per batch (64)")
    p.add_argument("--prefetch-batches", type=int, default=4, help="flow-control depth (4)")
    p.add_argument("--prompts", type=int, default=5000, help="standard pool size (5000)")
    p.add_argument("--retention", type=float, default=30.0, help="SARA_RETENTION_S (30)")
    p.add_argument("--lease-ttl", type=float, default=20.0, help="SARA_LEASE_TTL_S (20)")
    p.add_argument("--publish-every", type=int, default=10,
                   help="batches between policy versions (10)")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between samples (5)")
    p.add_argument("--bucket", type=float, default=60.0, help="seconds per table row (60)")
    p.add_argument("--warmup", type=float, default=120.0,
                   help="seconds left out of the flatness verdict (120)")
    p.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None,
                   help=f"table file (default {DEFAULT_OUT.relative_to(ROOT)}; --quick: none)")
    p.add_argument("--no-write", action="store_true", help="print only")
    # internal: one worker process
    p.add_argument("--worker-proc", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--urls", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--stats-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.duration = args.duration or 30.0
        args.bucket, args.warmup, args.sample_s, args.progress_s = 5.0, 10.0, 1.0, 5.0
    args.duration = args.duration or 600.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_proc:
        asyncio.run(worker_process_main(args))
        return 0
    from sara_service.embedded import EmbeddedRedis

    command = "python bench/soak.py" + ("" if argv is None and len(sys.argv) == 1 else
                                        " " + shlex.join(sys.argv[1:] if argv is None else argv))
    out_path = args.out or (None if args.quick else DEFAULT_OUT)
    if args.no_write:
        out_path = None
    log(f"soak: {args.duration:g} s, {args.workers} workers in {args.worker_procs} processes, "
        f"{args.replicas} replica(s); table every {args.bucket:g} s")
    with tempfile.TemporaryDirectory(prefix="sara-soak-") as tmp:
        workdir = Path(tmp)
        redis_server = EmbeddedRedis(workdir / "redis").start()
        serves: list[Serve] = []
        try:
            serves = [Serve(workdir, f"replica-{n}", redis_server.url, args)
                      for n in REPLICA_NAMES[:args.replicas]]
            for s in serves:
                s.wait_ready()
            samples, tally, lines, seconds = asyncio.run(
                drive(args, serves, redis_server.url, redis_server.process.pid, workdir))
        except BaseException:
            for s in serves:
                log(f"--- {s.name} ---\n{s.tail()}")
            for f in sorted(workdir.glob("workers-*.log")):
                log(f"--- {f.name} ---\n{f.read_text(errors='replace')[-3000:]}")
            raise
        finally:
            for s in serves:
                s.stop()
            redis_server.stop()
    text, buckets = report(args, samples, tally, lines, seconds, command)
    print(text)
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text)
        png = out_path.with_suffix(".png")
        problem = chart(buckets, samples, png, f"{command}  ({datetime.date.today()})")
        shown = out_path.relative_to(ROOT) if out_path.is_relative_to(ROOT) else out_path
        log(problem or f"wrote {shown} and {png.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

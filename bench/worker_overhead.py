#!/usr/bin/env python
"""Worker overhead: rollouts/s through the service vs the same vLLM engine driven directly.

Recorded, not asserted. One in-process vLLM engine (``AsyncLLM``, via the ``vllm`` worker backend)
is started once and used by both paths, in alternating rounds:

- **engine**: this process submits the rollouts straight to the engine, ``--concurrency`` at a
  time, one request per rollout, with the exact ``SamplingParams`` the backend builds (n=1,
  temperature/top_p/max_tokens from the scheduler's settings, sampled-token logprobs, streamed
  deltas), and reads the outputs; nothing else.
- **service**: a ``sara serve`` process (its own embedded Redis, ``--policy uniform`` so every
  rollout is delivered: useful work) hands out the same prompts, ``--group-size`` rollouts each;
  a :class:`sara_worker.loop.WorkerLoop` with the vllm backend and ``capacity=--concurrency``
  leases, generates, verifies (``exact``) and reports them; a trainer task pulls and acks the
  batches so flow control never holds the worker back. The round ends when the worker has
  reported every rollout (``max_rollouts``).

Both paths run the same number of rollouts of the same prompts with the same sampling parameters
and the same number in flight. rollouts/s = rollouts / wall time of the round; the table gives
the median over ``--rounds`` rounds of each, and the median over rounds of service/engine in
back-to-back pairs (robust to other load drifting on a shared box; target: service >= 90%).
Tokens/s is shown too (rollout lengths are random: the model can stop early).

On a small shared CPU box the scheduler, Redis, the engine's process and this one share the
cores; the table reports the CPU count and load.

Rounds are 4,096 rollouts (about 11-14 s here) by default: at 1,024 (3-4 s) two runs of one commit
differed by 13 points in the median pair, more than the gap to the target, since a round's ramp-up
and tail and the box's own drift weigh on a few seconds.

Usage: python bench/worker_overhead.py [--rollouts 4096] [--concurrency 64] [--max-tokens 32]
                                       [--rounds 3] [--model DIR] [--out FILE | --no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_meter import (  # noqa: E402  (bench/ is not a package)
    CpuMeter, InflightSampler, ServeProcess, build_model, command_line, load_average,
    publish_report,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "worker_overhead.txt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=4096, help="rollouts per round")
    p.add_argument("--concurrency", type=int, default=64,
                   help="rollouts the engine runs at once (its max_num_seqs, both paths)")
    p.add_argument("--lease-ahead", type=int, default=64,
                   help="service path: rollouts the worker holds beyond --concurrency, queued "
                        "in the engine, to hide the lease round trip (0: none)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--group-size", type=int, default=8, help="k: rollouts per prompt")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each path, alternating")
    p.add_argument("--model", help="model directory (default: build the tiny test policy)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=128)
    p.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                   help="enforce_eager (the CPU build needs it)")
    p.add_argument("--scheduler", choices=("process", "inprocess"), default="process",
                   help="process: `sara serve` in its own process, reached over HTTP (as "
                        "deployed); inprocess: the same app in this process over "
                        "httpx.ASGITransport, with its own Redis")
    p.add_argument("--scheduler-nice", type=int, default=0,
                   help="run sara serve (and its Redis) at this nice level")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--append", action="store_true", help="append to --out instead of replacing")
    args = p.parse_args(argv)
    if args.rollouts % args.group_size:
        p.error("--rollouts must be a multiple of --group-size")
    return args


def prompts(n: int) -> list[tuple[str, str]]:
    """(prompt, answer) pairs: small sums."""
    return [(f"{i % 97}+{i // 97}=", str(i % 97 + i // 97)) for i in range(n)]


@dataclass
class Round:
    path: str
    rollouts: int
    tokens: int
    seconds: float
    cores: dict | None = None
    calls: str = ""
    inflight: float = 0.0  # mean requests in the engine while the round ran

    @property
    def rate(self) -> float:
        return self.rollouts / self.seconds

    @property
    def token_rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def per_engine_cpu(self) -> float:
        """Rollouts per CPU-second the engine's own processes got (None-safe)."""
        used = (self.cores or {}).get("engine", 0.0) * self.seconds
        return self.rollouts / used if used > 0 else float("nan")


# --- the engine alone ----------------------------------------------------------------------------


async def engine_round(backend, args, tag: str) -> Round:
    from sara_client.models import Rollout, SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                              max_tokens=args.max_tokens)
    pairs = prompts(args.rollouts // args.group_size)
    rollouts = [Rollout(rollout_id=f"{tag}{g}:{j}", group_id=f"{tag}{g}", prompt_id=f"p{g}",
                        prompt=prompt, task="exact", answer=answer, sampling=sampling)
                for g, (prompt, answer) in enumerate(pairs) for j in range(args.group_size)]
    engine = backend.engine
    gate = asyncio.Semaphore(args.concurrency)
    tokens = 0

    async def one(rollout) -> None:
        nonlocal tokens
        async with gate:
            prompt = await backend.engine_input(rollout.prompt)
            async for out in engine.generate(prompt, backend.sampling_params(rollout),
                                             rollout.rollout_id):
                tokens += len(out.outputs[0].token_ids)

    sampler = InflightSampler(engine)
    started = time.perf_counter()
    await asyncio.gather(*(one(r) for r in rollouts))
    elapsed = time.perf_counter() - started
    return Round("engine", len(rollouts), tokens, elapsed, inflight=sampler.stop())


# --- through the service -------------------------------------------------------------------------


class Scheduler(ServeProcess):
    """`sara serve` (embedded Redis) in a subprocess, uniform policy."""

    def __init__(self, args, work: Path) -> None:
        super().__init__(work, group_size=args.group_size, nice=args.scheduler_nice,
                         flags=["--policy", "uniform"],
                         env={"SARA_PREFETCH_BATCHES": "16",
                              "SARA_MAX_TOKENS": str(args.max_tokens),
                              "SARA_TEMPERATURE": str(args.temperature),
                              "SARA_TOP_P": str(args.top_p), "SARA_MAX_STALENESS": "100"})


class InProcessScheduler:
    """The scheduler app in this process (httpx.ASGITransport), on its own embedded Redis."""

    def __init__(self, args, work: Path) -> None:
        self.args, self.work = args, work
        self.redis = None
        self.app = None

    def start(self) -> "InProcessScheduler":
        from sara_service.http.app import create_app
        from sara_service.embedded import EmbeddedRedis
        from sara_service.settings import Settings

        self.redis = EmbeddedRedis(self.work / "redis").start()
        a = self.args
        self.app = create_app(Settings(
            redis_url=self.redis.url, policy="uniform", group_size=a.group_size, batch_size=8,
            prefetch_batches=16, max_tokens=a.max_tokens, temperature=a.temperature,
            top_p=a.top_p, max_staleness=100))
        return self

    def client(self):
        from sara_client import AsyncSaraClient

        return AsyncSaraClient("http://scheduler", transport=httpx.ASGITransport(app=self.app))

    def cpu_pid(self) -> int | None:
        process = getattr(self.redis, "process", None) or getattr(self.redis, "_process", None)
        return getattr(process, "pid", None)

    def stop(self) -> None:
        if self.redis is not None:
            self.redis.stop()


async def service_round(backend, args, scheduler, tag: str) -> Round:
    from sara_worker.loop import WorkerLoop
    from sara_worker.support import WorkerConfig

    admin, trainer, worker = scheduler.client(), scheduler.client(), scheduler.client()
    pairs = prompts(args.rollouts // args.group_size)
    await admin.add_prompts([{"id": f"{tag}p{i}", "prompt": p, "answer": a, "task": "exact"}
                             for i, (p, a) in enumerate(pairs)])
    config = WorkerConfig(worker_id=f"bench-{tag}", backend_name="vllm",
                          capacity=args.concurrency + args.lease_ahead,
                          max_rollouts=args.rollouts,
                          lease_wait_s=1.0, report_batch=32, flush_interval_s=0.05,
                          log_interval_s=3600)
    loop = WorkerLoop(worker, backend, config)
    stop = asyncio.Event()

    async def consume() -> None:
        # A trainer that takes each batch as it forms: a long poll, which the scheduler
        # answers when its wake stream says a batch is ready.
        while not stop.is_set():
            batch = await trainer.next_batch(wait_s=1)
            if batch is not None:
                await trainer.ack(batch.batch_id)

    consumer = asyncio.ensure_future(consume())
    sampler = InflightSampler(backend.engine)
    started = time.perf_counter()
    try:
        counters = await loop.run()
    finally:
        elapsed = time.perf_counter() - started
        stop.set()
        await asyncio.gather(consumer, return_exceptions=True)
        for client in (admin, trainer, worker):
            await client.aclose()
    if counters.accepted != args.rollouts:
        raise RuntimeError(f"service round: {counters.line()}")
    calls = (f"{counters.leases} leases with rollouts, {counters.reported} results in "
             f"reports of {config.report_batch}")
    return Round("service", counters.accepted, counters.tokens, elapsed, calls=calls,
                 inflight=sampler.stop())


# --- main ----------------------------------------------------------------------------------------


async def run(args, work: Path) -> tuple[list[Round], str]:
    from sara_worker.backends.vllm import VLLMBackend

    model = args.model or str(build_model(work, args.max_model_len))
    backend = VLLMBackend(model, dtype=args.dtype, enforce_eager=args.eager,
                          max_model_len=args.max_model_len, max_num_seqs=args.concurrency,
                          seed=0)
    kind = Scheduler if args.scheduler == "process" else InProcessScheduler
    scheduler = kind(args, work).start()
    rounds: list[Round] = []
    try:
        await backend.start()
        warm = argparse.Namespace(**{**vars(args), "rollouts": args.group_size * 8})
        await engine_round(backend, warm, "warm")  # first-request costs out of the way
        meter = CpuMeter(scheduler.cpu_pid())
        for i in range(args.rounds):
            for path in ("engine", "service") if i % 2 == 0 else ("service", "engine"):
                before = meter.sample()
                if path == "engine":
                    r = await engine_round(backend, args, f"e{i}-")
                else:
                    r = await service_round(backend, args, scheduler, f"s{i}-")
                r.cores = CpuMeter.cores(before, meter.sample(), r.seconds)
                rounds.append(r)
                print(f"round {i + 1} {r.path:8s} {r.rate:9.1f} rollouts/s "
                      f"{r.token_rate:10.0f} tokens/s ({r.seconds:.2f} s) engine holds "
                      f"{r.inflight:.1f} {cores_text(r)} {r.calls}", flush=True)
    finally:
        await backend.close()
        scheduler.stop()
    return rounds, model


def cores_text(r: Round) -> str:
    if not r.cores:
        return ""
    return " ".join(f"{k} {v:.2f}" for k, v in r.cores.items())


def report(args, rounds: list[Round], model: str, command: str) -> str:
    import vllm

    def med(path: str, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in rounds if r.path == path)

    def med_core(path: str, key: str = "engine-core") -> float:
        return statistics.median((r.cores or {}).get(key, 0.0) for r in rounds if r.path == path)

    def cpu_ms_per_rollout(path: str) -> float:
        return statistics.median(1000 * ((r.cores or {}).get("worker", 0.0)
                                         + (r.cores or {}).get("scheduler", 0.0)) / r.rate
                                 for r in rounds if r.path == path)

    added_ms = cpu_ms_per_rollout("service") - cpu_ms_per_rollout("engine")
    engine, service = med("engine", "rate"), med("service", "rate")
    pairs = [(rounds[i], rounds[i + 1]) for i in range(0, len(rounds) - 1, 2)]
    pair_ratios = [(b.rate / a.rate) if a.path == "engine" else (a.rate / b.rate)
                   for a, b in pairs]
    ratio = statistics.median(pair_ratios)
    lines = [
        "SARA worker overhead (bench/worker_overhead.py)",
        f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"command:   {command}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, vllm {vllm.__version__}; load average before the "
        f"report {load_average()} (the box is shared: other processes compete for the CPUs)",
        f"setup:     model {model if args.model else 'tiny GPT-2 (sara_trainer.tiny, 0.6M params)'}"
        f", dtype {args.dtype}, max_model_len {args.max_model_len}, enforce_eager {args.eager}; "
        f"{args.rollouts} rollouts per round = {args.rollouts // args.group_size} prompts x "
        f"k={args.group_size}, max_tokens {args.max_tokens}, temperature {args.temperature}, "
        f"top_p {args.top_p}; the engine runs {args.concurrency} at once (max_num_seqs) in both "
        f"paths: the engine path submits {args.concurrency} at a time, the worker holds "
        f"capacity {args.concurrency + args.lease_ahead} ({args.lease_ahead} queued in the "
        "engine while leases come back)",
        ("           service: sara serve (uniform policy, embedded Redis) in its own process, "
         "over HTTP" if args.scheduler == "process" else
         "           service: the scheduler app (uniform policy) in this process over "
         "httpx.ASGITransport, its Redis in another") +
        "; WorkerLoop(vllm backend) + a trainer task pulling batches; all on this box",
        "",
        "  CPU cores used: worker = this process (the worker loop and the engine's front end), "
        "engine = the engine's core and model processes, scheduler = sara serve and its Redis, "
        "other = everything else on the machine; engine-waiting = seconds per second the "
        "engine's threads were runnable but waiting for a CPU (Linux schedstat; > 0 means the "
        "engine is CPU-starved and the round measures its CPU share, not the worker); "
        "engine-core = vLLM's EngineCore process alone (it schedules every step; the model "
        "worker is pinned to one core by vLLM's CPU thread binding, the core process is not) "
        "and engine-core-waiting its wait for a CPU. "
        "rollouts/engine-CPU-s = rollouts per CPU-second the engine's processes got.",
        "",
        f"  {'round':>5}  {'path':8}  {'rollouts/s':>10}  {'tokens/s':>9}  {'seconds':>7}  "
        f"{'rollouts/engine-CPU-s':>21}  CPU cores used",
    ]
    for i, r in enumerate(rounds):
        lines.append(f"  {i // 2 + 1:>5}  {r.path:8}  {r.rate:10.1f}  {r.token_rate:9.0f}  "
                     f"{r.seconds:7.2f}  {r.per_engine_cpu:21.1f}  {cores_text(r)}")
    lines += [
        "",
        f"  median engine  {engine:8.1f} rollouts/s  {med('engine', 'token_rate'):8.0f} tokens/s",
        f"  median service {service:8.1f} rollouts/s  {med('service', 'token_rate'):8.0f} tokens/s",
        f"  service / engine per round (back-to-back pairs, so the load from other processes "
        f"is about the same): {', '.join(f'{r:.0%}' for r in pair_ratios)}",
        f"  engine work per rollout: median rollouts per engine CPU-second, engine "
        f"{med('engine', 'per_engine_cpu'):.1f}, service {med('service', 'per_engine_cpu'):.1f}",
        f"  CPU the service path adds per rollout: {added_ms:.2f} ms (median over rounds of "
        "(worker process + scheduler + Redis) CPU per rollout in the service path, minus the "
        "median of this process's CPU per rollout driving the engine directly; target <= 0.8)",
        f"  engine core process: median cores, engine {med_core('engine'):.2f}, service "
        f"{med_core('service'):.2f}; waiting for a CPU {med_core('engine', 'engine-core-waiting'):.2f} "
        f"against {med_core('service', 'engine-core-waiting'):.2f} s/s",
        f"  median of the pairs: service at {ratio:.1%} of the engine's own throughput "
        f"(target >= 90%): {'met' if ratio >= 0.9 else 'NOT met'}; ratio of the medians "
        f"{service / engine:.1%}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory(prefix="sara-bench-") as tmp:
        rounds, model = asyncio.run(run(args, Path(tmp)))
    text = report(args, rounds, model, command_line("worker_overhead.py", argv))
    publish_report(text, args.out, write=not args.no_write, append=args.append)


if __name__ == "__main__":
    main()

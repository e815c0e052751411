#!/usr/bin/env python
"""Worker capacity: the service path with a fixed capacity of 64 against the one `sara worker`
fits to the engine (its ``max_num_seqs`` and half as many leased ahead), alternating rounds.

Recorded, not asserted. One in-process vLLM engine at vLLM's own default ``max_num_seqs`` (none is
set, as `sara worker --backend vllm` starts it), one `sara serve` (uniform policy, embedded Redis)
and the worker loop with the vllm backend, as in ``bench/worker_overhead.py``'s service path; the
only difference between the two kinds of round is the worker's capacity. rollouts/s = rollouts /
wall time of the round; the table gives each round, then the median of each and of the
back-to-back pairs' ratios.

Usage: python bench/worker_capacity.py [--rounds 3] [--rollouts 4096] [--out FILE | --no-write]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _engine_meter import (  # noqa: E402  (bench/ is not a package)
    CpuMeter, build_model, command_line, load_average, publish_report,
)
from worker_overhead import Scheduler, cores_text, engine_round, service_round  # noqa: E402
from worker_overhead import parse_args as overhead_args  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "worker_capacity.txt"
FIXED = 64   # `sara worker`'s capacity for every backend before it was fitted


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of each capacity, alternating")
    p.add_argument("--rollouts", type=int, default=4096, help="rollouts per round")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.rollouts % 8:
        p.error("--rollouts must be a multiple of 8 (k)")
    return args


def round_args(rollouts: int, capacity: int) -> argparse.Namespace:
    """What worker_overhead's service round reads: k 8, its sampling, `capacity` held."""
    return overhead_args(["--rollouts", str(rollouts), "--concurrency", str(capacity),
                          "--lease-ahead", "0"])


async def run(args: argparse.Namespace, work: Path) -> tuple[int, list[tuple[str, int, object]]]:
    from sara_worker.backends.vllm import VLLMBackend
    from sara_worker.process import fitted_capacity

    backend = VLLMBackend(str(build_model(work, 128)), dtype="float32", enforce_eager=True,
                          max_model_len=128, seed=0)
    scheduler = Scheduler(round_args(args.rollouts, FIXED), work).start()
    rounds: list[tuple[str, int, object]] = []
    try:
        slots, fitted = await backend.engine_slots(), await fitted_capacity(backend)
        # first-request costs out of the way, so that the first round is not the slower for them
        await engine_round(backend, round_args(64, 64), "warm-")
        meter = CpuMeter(scheduler.cpu_pid())
        kinds = [("fixed", FIXED), ("fitted", fitted)]
        for i in range(args.rounds):
            for name, capacity in kinds if i % 2 == 0 else kinds[::-1]:
                before = meter.sample()
                r = await service_round(backend, round_args(args.rollouts, capacity), scheduler,
                                        f"{name}{i}-")
                r.cores = CpuMeter.cores(before, meter.sample(), r.seconds)
                rounds.append((name, capacity, r))
                print(f"round {i + 1} {name:6s} capacity {capacity:4d} {r.rate:8.1f} rollouts/s "
                      f"engine holds {r.inflight:6.1f} {cores_text(r)}", flush=True)
    finally:
        await backend.close()
        scheduler.stop()
    return slots, rounds


def report(args: argparse.Namespace, slots: int, rounds: list, command: str) -> str:
    import vllm

    def med(name: str, attr: str) -> float:
        return statistics.median(getattr(r, attr) for n, _, r in rounds if n == name)

    pairs = [rounds[i:i + 2] for i in range(0, len(rounds) - 1, 2)]
    ratios = [next(r.rate for n, _, r in p if n == "fitted") /
              next(r.rate for n, _, r in p if n == "fixed") for p in pairs]
    lines = [
        "SARA worker capacity (bench/worker_capacity.py)",
        f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"command:   {command}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, vllm {vllm.__version__}; load "
        f"average after the rounds {load_average()}",
        f"setup:     tiny GPT-2 (sara_trainer.tiny), float32, eager; engine max_num_seqs {slots} "
        f"(vLLM's default, none set); {args.rollouts} rollouts a round, k 8, max_tokens 32; "
        "sara serve (uniform) over HTTP",
        "",
        f"  {'round':>5}  {'capacity':>14}  {'rollouts/s':>10}  {'engine holds':>12}  CPU cores",
    ]
    for i, (name, capacity, r) in enumerate(rounds):
        lines.append(f"  {i // 2 + 1:>5}  {name:>6} {capacity:>7}  {r.rate:10.1f}  "
                     f"{r.inflight:12.1f}  {cores_text(r)}")
    lines += [
        "",
        f"  median fixed  {med('fixed', 'rate'):8.1f} rollouts/s, engine holds "
        f"{med('fixed', 'inflight'):.1f}",
        f"  median fitted {med('fitted', 'rate'):8.1f} rollouts/s, engine holds "
        f"{med('fitted', 'inflight'):.1f}",
        f"  fitted / fixed per pair: {', '.join(f'{x:.2f}' for x in ratios)}; median "
        f"{statistics.median(ratios):.2f}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory(prefix="sara-bench-") as tmp:
        slots, rounds = asyncio.run(run(args, Path(tmp)))
    text = report(args, slots, rounds, command_line("worker_capacity.py", argv))
    publish_report(text, args.out, write=not args.no_write)


if __name__ == "__main__":
    main()

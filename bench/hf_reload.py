#!/usr/bin/env python
"""What a published policy version costs the hf worker: ``HFBackend.load_policy`` timed for a
checkpoint of the same model (its weights copied into the loaded one) and for one that is not
(the model built again), on the testbed's shipped warm start.

Recorded, not asserted. Two copies of the warm start are made: ``same``, identical but for the
directory, and ``other``, whose config.json differs in one field that does not change the weights'
shapes (``layer_norm_epsilon``), so loading it takes the full path. The backend then loads
same / warm start alternately ``--rounds`` times (every load in place) and other / warm start
alternately (every load a full build), each timed around ``await load_policy``. The table gives
the median and the 10th-90th percentiles of each, and the machine's load.

Usage: python bench/hf_reload.py [--rounds 50] [--threads 1] [--out FILE | --no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _provenance import git_state


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=50, help="loads of each kind")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the backend")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "hf_reload.txt"))
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error("--rounds must be at least 2")
    return args


def copies(start: Path, root: Path) -> tuple[Path, Path]:
    """`same` (the warm start's files) and `other` (config.json changed in one field)."""
    same, other = root / "same", root / "other"
    shutil.copytree(start, same)
    shutil.copytree(start, other)
    config = json.loads((start / "config.json").read_text())
    config["layer_norm_epsilon"] = float(config.get("layer_norm_epsilon", 1e-5)) * 2
    (other / "config.json").write_text(json.dumps(config))
    return same, other


async def timed_loads(backend, first: Path, second: Path, rounds: int) -> list[float]:
    """Seconds of each `load_policy`, alternating `first` and `second`."""
    seconds = []
    for i in range(rounds):
        source = first if i % 2 == 0 else second
        started = time.perf_counter()
        await backend.load_policy(i + 1, str(source))
        seconds.append(time.perf_counter() - started)
    return seconds


def spread(values: list[float]) -> str:
    deciles = statistics.quantiles(values, n=10)
    return (f"median {1000 * statistics.median(values):7.2f} ms   "
            f"p10-p90 {1000 * deciles[0]:.2f}-{1000 * deciles[-1]:.2f} ms")


async def measure(args: argparse.Namespace) -> str:
    from sara_demo.testbed import verified_testbed
    from sara_worker.backends.hf import HFBackend

    start = verified_testbed()
    with tempfile.TemporaryDirectory(prefix="sara-hf-reload-") as root:
        same, other = copies(start, Path(root))
        backend = HFBackend(str(start), device="cpu", dtype="float32", threads=args.threads)
        try:
            await backend.load_policy(0, str(start))
            in_place = await timed_loads(backend, same, start, args.rounds)
            rebuilt = await timed_loads(backend, other, start, args.rounds)
        finally:
            await backend.close()
    return "\n".join([
        "hf worker: seconds of load_policy per published version (bench/hf_reload.py)",
        f"date:     {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC",
        f"code:     {git_state(('worker',))}",
        f"command:  python bench/hf_reload.py {' '.join(sys.argv[1:])}".rstrip(),
        f"machine:  {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}; torch threads {args.threads}; model: the testbed's warm start",
        "",
        f"same model (weights copied in):  {spread(in_place)}   ({args.rounds} loads)",
        f"another config (model rebuilt): {spread(rebuilt)}   ({args.rounds} loads)",
        f"rebuilt / copied (medians):     {statistics.median(rebuilt) / statistics.median(in_place):.1f}x",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    text = asyncio.run(measure(args))
    print(text)
    if not args.no_write:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

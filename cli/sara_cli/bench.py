"""`sara bench`: run a benchmark script from the source checkout's bench/."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import fail

BENCHMARKS = ("allocation", "e2e", "service_throughput", "worker_overhead", "soak")


def bench_dir(given: Path | None) -> Path:
    """The ``bench/`` scripts: `given`, else the source checkout this package runs from, else
    ``./bench``."""
    here = Path(__file__).resolve().parents[2] / "bench"
    for candidate in (given, here, Path.cwd() / "bench"):
        if candidate is not None and (candidate / "allocation.py").is_file():
            return candidate
    raise fail("sara bench: the bench/ scripts were not found; run it from a source checkout "
               "of this project or pass --bench-dir", 2)


def bench(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(
        help=f"one of {', '.join(BENCHMARKS)}; none: allocation --quick")] = None,
    bench_dir_: Annotated[Optional[Path], typer.Option(
        "--bench-dir", envvar="SARA_BENCH_DIR", help="where the bench/ scripts are")] = None,
) -> None:
    """Run a benchmark script from bench/; arguments after NAME go to it
    (`sara bench NAME -- --help` shows its own).

    `sara bench` alone compares uniform, Dynamic Sampling, SARA, DPS, MoPPS and SARA + DPS on
    the standard pool through the real scheduler in under a minute (`allocation --quick`).
    """
    import subprocess

    args = list(ctx.args)
    if name is None:
        name, args = "allocation", ["--quick", *args]
    if name not in BENCHMARKS:
        raise fail(f"sara bench: unknown benchmark {name!r}; choose from "
                   f"{', '.join(BENCHMARKS)}", 2)
    script = bench_dir(bench_dir_) / f"{name}.py"
    code = subprocess.call([sys.executable, str(script), *args])
    if code:
        raise typer.Exit(code)

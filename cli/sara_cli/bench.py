"""`sara bench`: run a benchmark script from the source checkout's bench/, writing its results
under the current folder (or --out), never into the checkout: the files in bench/results are the
recorded ones the docs cite, written only by running a script there on purpose."""

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


def out_args(name: str, args: list[str], out: Path) -> list[str]:
    """The script's own output option pointing under `out` (each names it its own way: a
    prefix, a folder or a file), unless the arguments already give one."""
    if any(a == "--out" or a.startswith("--out=") for a in args):
        return []
    if name == "allocation":
        return ["--out", str(out / ("allocation_quick" if "--quick" in args else "allocation"))]
    if name == "e2e":
        return ["--out", str(out / "e2e")]
    return ["--out", str(out / f"{name}.txt")]


def bench(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(
        help=f"one of {', '.join(BENCHMARKS)}; none: allocation --quick")] = None,
    out: Annotated[Path, typer.Option(
        help="where the results go (the current folder by default)")] = Path("."),
    bench_dir_: Annotated[Optional[Path], typer.Option(
        "--bench-dir", envvar="SARA_BENCH_DIR", help="where the bench/ scripts are")] = None,
) -> None:
    """Run a benchmark script from bench/; arguments after NAME go to it
    (`sara bench NAME -- --help` shows its own). Results are written under --out.

    `sara bench` alone compares uniform, Dynamic Sampling, SARA, DPS, MoPPS and SARA + DPS on
    the standard pool through the real scheduler in under a minute (`allocation --quick`),
    writing allocation_quick.txt, .json and .png.
    """
    import subprocess

    args = list(ctx.args)
    if name is None:
        name, args = "allocation", ["--quick", *args]
    if name not in BENCHMARKS:
        raise fail(f"sara bench: unknown benchmark {name!r}; choose from "
                   f"{', '.join(BENCHMARKS)}", 2)
    script = bench_dir(bench_dir_) / f"{name}.py"
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    code = subprocess.call([sys.executable, str(script), *args, *out_args(name, args, out)])
    if code:
        raise typer.Exit(code)

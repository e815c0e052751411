"""`sara demo`: scheduler, worker and trainer on this CPU (the sara_demo package)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .common import fail


def demo(
    sft_steps: Annotated[Optional[int], typer.Option(
        min=1, help="Warm up here with this many SFT steps instead of the shipped warm start.")
    ] = None,
    sft_seconds: Annotated[Optional[float], typer.Option(
        min=0.0, help="Warm up here by time instead, s (--quick: 25 s).")] = None,
    rl_steps: Annotated[Optional[int], typer.Option(
        min=1, help="RL steps cap of each arm (the rollout budget ends them first).")] = None,
    rollouts: Annotated[Optional[int], typer.Option(
        min=1, help="Rollout budget of each arm (default 15,000).")] = None,
    compare: Annotated[bool, typer.Option(
        help="After SARA, run Dynamic Sampling to the same rollouts and compare.")] = True,
    seed: Annotated[int, typer.Option(help="Seed of the data, sampling and training.")] = 0,
    out: Annotated[Path, typer.Option(help="Where summary.json and chart.png go.")] = Path(
        "./sara-demo"),
    backend: Annotated[str, typer.Option(help="Worker backend: hf or vllm.")] = "hf",
    quick: Annotated[bool, typer.Option(help="Tiny budgets (tests): about a minute.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars and the table.")] = True,
    report_to: Annotated[Optional[str], typer.Option(
        help="Experiment tracking of each arm, as `sara train --report-to` (steps and held-out "
             "evaluations, under OUT/runs/<policy>).")] = None,
) -> None:
    """Scheduler, worker and trainer on this CPU: RL with SARA, then with Dynamic Sampling."""
    _check_backend(backend)
    from sara_demo import demo as demo_module

    config = demo_module.make_config(
        quick, sft_seconds=sft_seconds, sft_steps=sft_steps, rl_steps=rl_steps,
        rollout_budget=rollouts, compare=compare, seed=seed, out=out, backend=backend,
        progress=progress, report_to=report_to)
    try:
        summary = demo_module.run_demo(config)
    except Exception as e:
        raise fail(f"sara demo failed: {e}", 1) from None
    typer.echo(f"{_result_line(summary)}; {out / 'summary.json'}")


def _check_backend(backend: str) -> None:
    if backend not in ("hf", "vllm"):
        raise fail("--backend is hf or vllm", 2)
    if backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise fail("--backend vllm: vllm is not installed here (try --backend hf)", 2)


def _result_line(summary: dict[str, Any]) -> str:
    acc = summary["accuracy"]
    line = (f"sara demo: held-out accuracy {100 * acc['before_rl']:.1f}% -> "
            f"{100 * acc['after_rl']:.1f}% with SARA")
    ds = (summary.get("arms") or {}).get("dynamic_sampling")
    if ds:
        line += f", {100 * ds['accuracy_after']:.1f}% with Dynamic Sampling"
    return f"{line} in {summary['wall_seconds']:.0f}s"

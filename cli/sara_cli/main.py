"""`sara`: the one command. serve, worker-token, load, stats, worker, fleet, train, consume, demo,
bench, and the prompts / run groups; one module of this package per command.

This package sits above the libraries (sara_service, sara_worker, sara_trainer, sara_demo,
sara_client), which never import it. Every heavy import (fastapi, uvicorn, redis, the client
SDK, torch, vllm) happens inside the command that needs it, so `sara --help` is fast and needs
none of them.
"""

from __future__ import annotations

import sys

import typer

from . import bench, consume, demo, fleet, load, runctl, serve, stats, train, worker
from .common import PASS_THROUGH

app = typer.Typer(
    name="sara",
    help="SARA: sequential adaptive rollout allocation for RL with verifiable rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(serve.serve)
app.command("worker-token")(serve.worker_token)
app.command()(load.load)
app.command()(stats.stats)
app.command()(worker.worker)
app.command()(fleet.fleet)
app.command()(train.train)
app.command()(consume.consume)
app.command()(demo.demo)
app.command(**PASS_THROUGH)(bench.bench)
app.add_typer(runctl.prompts_app, name="prompts")
app.add_typer(runctl.run_app, name="run")


def main() -> None:
    """Console entry point (`sara`)."""
    app(prog_name="sara")


if __name__ == "__main__":
    sys.exit(main())

"""`sara serve`: the scheduler (uvicorn), on an embedded Redis unless --redis-url is given."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sara_service import settings as service_settings

from .common import LogFormatOpt, LogLevelOpt, fail, setup_logging
from .generated import settings_flags, with_generated_flags

SELECTION_HELP = "epoch, history, dps or mopps (which open prompts a group is drawn from)."
NAMED = {"redis_url", "namespace", "policy", "selection", "group_size", "tau_low", "batch_size",
         "effective", "data_dir"}   # the settings `sara serve` presents first, with short help


@with_generated_flags(settings_flags(service_settings.Settings, skip=NAMED))
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    redis_url: Annotated[Optional[str], typer.Option(help="Redis URL; unset: embedded.")] = None,
    namespace: Annotated[Optional[str], typer.Option(help="Run namespace.")] = None,
    policy: Annotated[Optional[str], typer.Option(help="uniform, dynamic_sampling, sara.")] = None,
    selection: Annotated[Optional[str], typer.Option(help=SELECTION_HELP)] = None,
    group_size: Annotated[Optional[int], typer.Option(help="k, rollouts per group.")] = None,
    tau_low: Annotated[Optional[str], typer.Option(
        help='Abandonment threshold in [0, 1], or "auto" (cost-aware).')] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Groups per batch.")] = None,
    effective: Annotated[Optional[str], typer.Option(
        help="What makes a group effective: outcome (successes and failures mix) or reward "
             "(its rewards are not all equal).")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Embedded Redis data dir.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes.")] = 1,
    log_level: LogLevelOpt = "info",
    log_format: LogFormatOpt = None,
    generated: dict[str, Any] | None = None,
) -> None:
    """Run the scheduler. Flags override SARA_* environment variables; every setting but the
    role tokens has one (tokens only from the environment, where `ps` cannot read them)."""
    flags = {"redis_url": redis_url, "namespace": namespace, "policy": policy,
             "selection": selection, "group_size": group_size, "tau_low": tau_low,
             "batch_size": batch_size, "effective": effective, "data_dir": data_dir,
             **(generated or {})}
    overrides = {k: v for k, v in flags.items() if v is not None}
    settings = _settings(overrides)
    log_format = setup_logging(log_level, log_format, run=settings.namespace)
    # json: uvicorn's own loggers propagate to the root's JSON handler instead of its text ones
    uvicorn_logs: dict[str, Any] = {"log_config": None} if log_format == "json" else {}
    from sara_service.process import serve as run_scheduler

    run_scheduler(settings, host=host, port=port, workers=workers, overrides=overrides,
                  say=typer.echo, log_level=log_level, **uvicorn_logs)


def _settings(overrides: dict[str, Any]):
    """Settings from SARA_* and the flags given; exit 2 naming what is invalid."""
    from pydantic import ValidationError

    from sara_service.settings import Settings  # looked up at the call: tests replace it

    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise fail(f"invalid settings:\n{e}", 2) from None


def worker_token(
    worker_id: Annotated[str, typer.Argument(help="The worker id the token will act as.")],
) -> None:
    """Print a per-worker token derived from SARA_WORKER_SECRET: give it to that worker as
    SARA_WORKER_TOKEN (with the same --worker-id); it cannot act as any other worker."""
    from sara_service.http.credentials import worker_token as derive

    secret = os.environ.get("SARA_WORKER_SECRET")
    if not secret:
        raise fail("set SARA_WORKER_SECRET (the scheduler's) to derive worker tokens", 2)
    typer.echo(derive(secret, worker_id))

"""`sara serve`: the scheduler (uvicorn), on an embedded Redis unless --redis-url is given."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .common import LogFormatOpt, LogLevelOpt, fail, setup_logging

SELECTION_HELP = "epoch, history, dps or mopps (which open prompts a group is drawn from)."


def app_from_env():
    """uvicorn factory for --workers > 1: each worker process rebuilds Settings from SARA_* env."""
    from sara_service.app import create_app
    from sara_service.settings import Settings

    return create_app(Settings())


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # unwinds through `finally`, which stops the embedded Redis


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
) -> None:
    """Run the scheduler. Flags override SARA_* environment variables."""
    flags = {"redis_url": redis_url, "namespace": namespace, "policy": policy,
             "selection": selection, "group_size": group_size, "tau_low": tau_low,
             "batch_size": batch_size, "effective": effective, "data_dir": data_dir}
    overrides = {k: v for k, v in flags.items() if v is not None}
    settings = _settings(overrides)
    log_format = setup_logging(log_level, log_format, run=settings.namespace)
    # json: uvicorn's own loggers propagate to the root's JSON handler instead of its text ones
    uvicorn_logs: dict[str, Any] = {"log_config": None} if log_format == "json" else {}
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    embedded = None
    try:
        if settings.redis_url is None:
            embedded, settings = _start_embedded(settings)
        _announce(settings, host, port)
        _run_uvicorn(settings, embedded, overrides, host=host, port=port, workers=workers,
                     log_level=log_level, **uvicorn_logs)
    except KeyboardInterrupt:
        pass
    finally:
        if embedded is not None:
            embedded.stop()
            typer.echo("sara: embedded redis stopped")
        signal.signal(signal.SIGTERM, previous)


def _settings(overrides: dict[str, Any]):
    """Settings from SARA_* and the flags given; exit 2 naming what is invalid."""
    from pydantic import ValidationError

    from sara_service.settings import Settings

    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise fail(f"invalid settings:\n{e}", 2) from None


def _start_embedded(settings: Any) -> tuple[Any, Any]:
    """A supervised embedded Redis (restarted on the same port and data dir if it dies, a log
    line says so) and the settings pointing at it."""
    from sara_service.embedded import EmbeddedRedis

    embedded = EmbeddedRedis(settings.data_dir).start().supervise()
    typer.echo(f"sara: embedded redis at {embedded.url} (AOF in {embedded.data_dir})")
    return embedded, settings.model_copy(update={"redis_url": embedded.url,
                                                 "redis_embedded": True})


def _announce(settings: Any, host: str, port: int) -> None:
    """Who may do what (auth) and the run's allocation settings, one line each."""
    if settings.auth_enabled:
        roles = [r for r in ("worker", "trainer", "operator", "admin")
                 if getattr(settings, f"{r}_token") is not None]
        roles += ["per-worker (SARA_WORKER_SECRET)"] * (settings.worker_secret is not None)
        typer.echo(f"sara: auth on: bearer tokens for {', '.join(roles)}")
    else:
        typer.echo("sara: auth OPEN: no SARA_*_TOKEN set, anyone who can reach "
                   f"{host}:{port} can do everything")
    typer.echo(f"sara: namespace={settings.namespace} policy={settings.policy} "
               f"k={settings.group_size} tau_low={settings.tau_low} "
               f"batch_size={settings.batch_size}")


def _run_uvicorn(settings: Any, embedded: Any, overrides: dict[str, Any], *, workers: int,
                 **uvicorn_args: Any) -> None:
    import uvicorn

    grace = {"timeout_graceful_shutdown": settings.shutdown_grace_s}
    if workers == 1:
        from sara_service.app import create_app

        uvicorn.run(create_app(settings, embedded=embedded), **uvicorn_args, **grace)
        return
    # Worker processes inherit the environment: pass every override (and the embedded URL).
    for key, value in {**overrides, "redis_url": settings.redis_url}.items():
        os.environ[f"SARA_{key.upper()}"] = str(value)
    uvicorn.run(f"{__name__}:app_from_env", factory=True, workers=workers, **uvicorn_args,
                **grace)


def worker_token(
    worker_id: Annotated[str, typer.Argument(help="The worker id the token will act as.")],
) -> None:
    """Print a per-worker token derived from SARA_WORKER_SECRET: give it to that worker as
    SARA_WORKER_TOKEN (with the same --worker-id); it cannot act as any other worker."""
    from sara_service.credentials import worker_token as derive

    secret = os.environ.get("SARA_WORKER_SECRET")
    if not secret:
        raise fail("set SARA_WORKER_SECRET (the scheduler's) to derive worker tokens", 2)
    typer.echo(derive(secret, worker_id))

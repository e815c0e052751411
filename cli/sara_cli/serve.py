"""`sara serve`: the scheduler (uvicorn), on an embedded Redis unless --redis-url is given."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from sara_service import settings as service_settings
from sara_service.setting_groups import SETTING_GROUPS

from .common import fail, log_options, setup_logging
from .generated import settings_flags, with_generated_flags

PANELS = [(group.title, group.fields) for group in SETTING_GROUPS]
SERVER = "Server"   # the panel of the process's own options, shown first
ServerLogLevel, ServerLogFormat = log_options(SERVER)


@with_generated_flags(settings_flags(service_settings.Settings,
                                     skip=set(service_settings.INTERNAL_SETTINGS), groups=PANELS))
def serve(
    host: Annotated[str, typer.Option(
        help="Interface to listen on; other than loopback, tokens are needed (or --insecure).",
        rich_help_panel=SERVER)] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", rich_help_panel=SERVER)] = 8000,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes.",
                                         rich_help_panel=SERVER)] = 1,
    log_level: ServerLogLevel = "info",
    log_format: ServerLogFormat = None,
    generated: dict[str, Any] | None = None,
) -> None:
    """Run the scheduler. Every setting is a SARA_* environment variable (docs/settings.md), and
    a flag here that overrides it; the role tokens come from the environment only, where `ps`
    cannot read them."""
    overrides = dict(generated or {})
    settings = _settings(overrides)
    log_format = setup_logging(log_level, log_format, run=settings.namespace)
    # json: uvicorn's own loggers propagate to the root's JSON handler instead of its text ones
    uvicorn_logs: dict[str, Any] = {"log_config": None} if log_format == "json" else {}
    from sara_service.process import UnsafeBind, serve as run_scheduler

    try:
        run_scheduler(settings, host=host, port=port, workers=workers, overrides=overrides,
                      say=typer.echo, log_level=log_level, **uvicorn_logs)
    except UnsafeBind as refused:
        raise fail(f"sara serve: {refused}", 2) from None


def _settings(overrides: dict[str, Any]):
    """Settings from SARA_* and the flags given; exit 2 with a line per invalid setting."""
    from pydantic import ValidationError

    from sara_service.settings import Settings  # looked up at the call: tests replace it

    try:
        return Settings(**overrides)
    except ValidationError as e:
        lines = "\n".join(invalid_settings(e, set(overrides)))
        raise fail(f"sara serve: invalid settings:\n{lines}", 2) from None


def invalid_settings(error: Any, flags: set[str]) -> list[str]:
    """One line per setting a ValidationError refuses: the flag (when given as one) or the
    environment variable, the value, and what is allowed; a rule across settings is one line
    of its own (its message names the variables)."""
    by_field: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    lines = []
    for problem in error.errors():
        message = problem["msg"].removeprefix("Value error, ")
        if not problem["loc"]:
            lines.append(message)
            continue
        name = str(problem["loc"][0])
        values.setdefault(name, problem.get("input"))
        by_field.setdefault(name, []).append(message)
    for name, messages in by_field.items():
        where = ("--" + name.replace("_", "-") + " " if name in flags
                 else f"SARA_{name.upper()}=")
        lines.append(f"{where}{values[name]}: {_allowed(messages)}")
    return lines


def _allowed(messages: list[str]) -> str:
    """pydantic's messages for one value as one phrase: a union's branches joined by "or"."""
    unique = list(dict.fromkeys(messages))
    if all(m.startswith("Input should be ") for m in unique):
        return "must be " + " or ".join(m.removeprefix("Input should be ") for m in unique)
    return "; ".join(m[0].lower() + m[1:] for m in unique)


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

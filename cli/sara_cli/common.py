"""What every `sara` command shares: the --url/--token/--log-format options, one-line failures,
logging set-up, the SDK client and ``KEY=VALUE`` options.

Imports typer only: the heavy modules (the SDK, the service, torch) are imported by the command
that needs them, so `sara --help` stays fast.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

DEFAULT_URL = "http://127.0.0.1:8000"


def url_option(panel: str | None = None) -> Any:
    """The --url option type (SARA_URL), in help panel `panel`."""
    return Annotated[str, typer.Option("--url", envvar="SARA_URL", help="Scheduler base URL.",
                                       rich_help_panel=panel)]


UrlOpt = url_option()
TokenOpt = Annotated[Optional[str], typer.Option("--token", envvar="SARA_TOKEN",
                                                 help="Bearer token (admin or operator).")]


def log_options(panel: str | None = None) -> tuple[Any, Any]:
    """The --log-level and --log-format option types, in help panel `panel`."""
    level = Annotated[str, typer.Option(help="debug, info, warning, error.",
                                        rich_help_panel=panel)]
    fmt = Annotated[Optional[str], typer.Option(
        "--log-format", envvar="SARA_LOG_FORMAT", help="text or json (one object per line).",
        rich_help_panel=panel)]
    return level, fmt


LogLevelOpt, LogFormatOpt = log_options()
# a command that hands the arguments it does not know to something else (bench)
PASS_THROUGH = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True}}


def fail(message: str, code: int = 1) -> typer.Exit:
    """`message` on stderr and the exit to raise: ``raise fail("...", 2)``."""
    typer.echo(message, err=True)
    return typer.Exit(code)


def setup_logging(level: str, fmt: str | None, **fields: Any) -> str:
    """Configure logging as text or JSON lines (`fields` on every JSON line); exit 2 on a bad
    format. Returns the format chosen."""
    from sara_client.logs import configure_logging

    try:
        return configure_logging(level, fmt, **fields)
    except ValueError as e:
        raise fail(f"--log-format: {e}", 2) from None


def client(url: str, token: str | None):
    """The sync SDK client the operator commands use (tests replace it with a fake)."""
    from sara_client import SaraClient

    return SaraClient(url, token=token)


def close(obj: Any) -> None:
    """Close a client if it can be closed (fakes may not)."""
    getattr(obj, "close", lambda: None)()


def field(obj: Any, name: str) -> Any:
    """``obj[name]`` of a dict or ``obj.name`` of a model (fakes answer dicts)."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def option_values(pairs: list[str], flag: str = "--option") -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON is taken as such, else as a string."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise fail(f"{flag} wants KEY=VALUE, not {pair!r}", 2)
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options

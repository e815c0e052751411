"""The scheduler process's main: an embedded Redis when no `redis_url` is set (supervised, and
stopped on the way out), the app under uvicorn with one or more worker processes, and SIGTERM
unwinding through both. `sara serve` calls it; a program that runs its own scheduler process
calls it the same way."""

from __future__ import annotations

import ipaddress
import os
import signal
from collections.abc import Callable
from typing import Any

from .http.app import create_app
from .embedded import EmbeddedRedis
from .settings import Settings


class UnsafeBind(ValueError):
    """`serve` refused to listen where anyone could do everything: an address other than
    loopback with no role token set, and `insecure` off."""


def is_loopback(host: str) -> bool:
    """Whether `host` listens only for this machine (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:   # a host name: it may resolve to any interface
        return False


def check_bind(settings: Settings, host: str) -> None:
    """Refuse (UnsafeBind) to serve an open API on an address other machines can reach, as
    Redis's protected mode does: anyone there could publish a checkpoint every worker loads,
    delete prompts or drain the run. Tokens, a loopback address or `insecure` let it start."""
    if settings.auth_enabled or settings.insecure or is_loopback(host):
        return
    raise UnsafeBind(
        f"refusing to listen on {host} with no token set: anyone who can reach it could "
        "publish a policy checkpoint every worker loads, delete prompts or drain the run. "
        "Set the role tokens (SARA_WORKER_TOKEN, SARA_TRAINER_TOKEN, SARA_OPERATOR_TOKEN, "
        "SARA_ADMIN_TOKEN; `python3 scripts/init_env.py` writes random ones to .env, and "
        "`set -a; . ./.env; set +a` exports them), listen on 127.0.0.1, or accept the risk "
        "with --insecure (SARA_INSECURE=1)")


def app_from_env():
    """uvicorn's factory under more than one worker process: each rebuilds Settings from the
    SARA_* environment that `serve` wrote."""
    return create_app(Settings())


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
          overrides: dict[str, Any] | None = None, say: Callable[[str], None] = print,
          **uvicorn_args: Any) -> None:
    """Serve the scheduler until SIGTERM or Ctrl-C. `overrides`: the settings given other than
    by SARA_* variables, which extra worker processes get through their environment; `say`
    takes the lines a person reads (the embedded Redis's address and its stop). UnsafeBind,
    before anything starts, for an open API on an address others can reach (`check_bind`)."""
    check_bind(settings, host)
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    embedded = None
    try:
        if settings.redis_url is None:
            embedded, settings = start_embedded(settings)
            say(f"sara: embedded redis at {embedded.url} (AOF in {embedded.data_dir})")
        say(describe(settings, host, port))
        _run_uvicorn(settings, embedded, overrides or {}, host=host, port=port,
                     workers=workers, **uvicorn_args)
    except KeyboardInterrupt:
        pass
    finally:
        if embedded is not None:
            embedded.stop()
            say("sara: embedded redis stopped")
        signal.signal(signal.SIGTERM, previous)


def start_embedded(settings: Settings) -> tuple[EmbeddedRedis, Settings]:
    """A supervised embedded Redis (restarted on the same port and data dir if it dies, a log
    line says so) and the settings pointing at it."""
    embedded = EmbeddedRedis(settings.data_dir).start().supervise()
    return embedded, settings.on_embedded_redis(embedded.url)


def describe(settings: Settings, host: str, port: int) -> str:
    """Who may do what (auth) and the run's allocation settings, a line each."""
    if settings.auth_enabled:
        roles = [r for r in ("worker", "trainer", "operator", "admin")
                 if getattr(settings, f"{r}_token") is not None]
        roles += ["per-worker (SARA_WORKER_SECRET)"] * (settings.worker_secret is not None)
        auth = f"sara: auth on: bearer tokens for {', '.join(roles)}"
    else:
        auth = (f"sara: auth OPEN: no SARA_*_TOKEN set, anyone who can reach {host}:{port} can "
                "do everything" + (" (--insecure)" if not is_loopback(host) else ""))
    return (f"{auth}\nsara: namespace={settings.namespace} policy={settings.policy} "
            f"k={settings.group_size} tau_low={settings.tau_low} "
            f"batch_size={settings.batch_size}")


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # unwinds through `finally`, which stops the embedded Redis


def _run_uvicorn(settings: Settings, embedded: EmbeddedRedis | None, overrides: dict[str, Any],
                 *, workers: int, **uvicorn_args: Any) -> None:
    import uvicorn

    grace = {"timeout_graceful_shutdown": settings.shutdown_grace_s}
    if workers == 1:
        uvicorn.run(create_app(settings, embedded=embedded), **uvicorn_args, **grace)
        return
    # Worker processes inherit the environment: pass every override (and the embedded URL).
    for key, value in {**overrides, "redis_url": settings.redis_url}.items():
        os.environ[f"SARA_{key.upper()}"] = str(value)
    uvicorn.run(f"{__name__}:app_from_env", factory=True, workers=workers, **uvicorn_args,
                **grace)

"""`sara fleet`: N `sara worker` loops as Ray actors on a running Ray cluster (sara_worker.fleet)."""

from __future__ import annotations

import signal
from typing import Annotated, Optional

import typer

from .common import DEFAULT_URL, LogFormatOpt, LogLevelOpt, UrlOpt, fail, option_values, \
    setup_logging

POLL_S = 1.0


def fleet(
    actors: Annotated[int, typer.Option(min=1, help="Worker actors to start.")] = 1,
    gpus_per_actor: Annotated[float, typer.Option(min=0, help="GPUs Ray gives each actor.")] = 0,
    cpus_per_actor: Annotated[float, typer.Option(min=0, help="CPUs Ray gives each actor.")] = 1,
    max_restarts: Annotated[int, typer.Option(min=-1, help="Restarts of a dead actor "
                                                           "(-1: always).")] = -1,
    address: Annotated[Optional[str], typer.Option(
        envvar="RAY_ADDRESS", help="Ray cluster to join (default: auto).")] = None,
    name: Annotated[str, typer.Option(help="Worker ids are NAME-0 .. NAME-(N-1).")] = "fleet",
    backend: Annotated[str, typer.Option(help="sim, hf, openai, vllm (or a plug-in).")] = "sim",
    model: Annotated[Optional[str], typer.Option(help="Model name or path.")] = None,
    url: UrlOpt = DEFAULT_URL,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar=["SARA_WORKER_TOKEN", "SARA_TOKEN"], help="Worker bearer token.")] = None,
    capacity: Annotated[Optional[int], typer.Option(
        min=1, help="Rollouts in flight per actor (default: vllm, the engine's max_num_seqs and "
                    "half as many leased ahead; other backends 64).")] = None,
    lease_ttl: Annotated[float, typer.Option(envvar="SARA_LEASE_TTL_S", min=0.001,
                                             help="The scheduler's lease TTL, s.")] = 60.0,
    drain_timeout: Annotated[float, typer.Option(min=0, help="On SIGTERM: longest wait for "
                                                             "held rollouts, s.")] = 60.0,
    checkpoint_root: Annotated[Optional[str], typer.Option(
        envvar="SARA_CHECKPOINT_ROOT",
        help="Load policy checkpoints only under this directory (as `sara worker`).")] = None,
    option: Annotated[Optional[list[str]], typer.Option(
        "--option", "-o", help="Backend option KEY=VALUE (repeatable).")] = None,
    log_level: LogLevelOpt = "info",
    log_format: LogFormatOpt = None,
) -> None:
    """Run N worker loops as Ray actors (restarted when they die) until SIGTERM, then drain."""
    from sara_worker.fleet import Fleet, FleetSpec

    setup_logging(log_level, log_format)
    options = {"model": model} if model is not None else {}
    options.update(option_values(option or []))
    try:
        spec = FleetSpec(url=url, token=token, backend=backend, options=options, actors=actors,
                         gpus_per_actor=gpus_per_actor, cpus_per_actor=cpus_per_actor,
                         max_restarts=max_restarts, name=name, address=address,
                         worker={"lease_ttl_s": lease_ttl, "drain_timeout_s": drain_timeout,
                                 "checkpoint_root": checkpoint_root,
                                 **({"capacity": capacity} if capacity else {})},
                         fit_capacity=capacity is None)
        running = Fleet(spec).start()
    except (ValueError, ImportError) as e:
        raise fail(f"sara fleet: {e}", 2) from None
    typer.echo(f"sara: fleet {name}: {actors} actors, {gpus_per_actor:g} GPU each -> {url}")
    stop: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        while not stop and not running.wait(POLL_S):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    counters = running.drain(drain_timeout + 30.0)
    done = sum(c.get("reported", 0) for c in counters.values())
    typer.echo(f"sara: fleet {name} drained: {done} results reported, restarts {running.restarts}")

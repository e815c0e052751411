"""`sara worker`: lease, generate, verify and report rollouts until SIGTERM."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .common import DEFAULT_URL, fail, log_options, option_values, setup_logging, url_option

# help panels, in the order `sara worker --help` shows them
SCHEDULER, BACKEND, VLLM, LEASING, STOPPING, LOGGING = (
    "Scheduler", "Backend", "vLLM", "Leasing", "Stopping", "Logging")
WorkerUrl = url_option(SCHEDULER)
WorkerLogLevel, WorkerLogFormat = log_options(LOGGING)


def _opt(panel: str, *names: str, **kw) -> typer.models.OptionInfo:
    return typer.Option(*names, rich_help_panel=panel, **kw)


def worker(
    url: WorkerUrl = DEFAULT_URL,
    token: Annotated[Optional[str], _opt(
        SCHEDULER, "--token", envvar=["SARA_WORKER_TOKEN", "SARA_TOKEN"],
        help="Worker bearer token.")] = None,
    worker_id: Annotated[Optional[str], _opt(SCHEDULER, help="Default: hostname-pid.")] = None,
    lease_ttl: Annotated[float, _opt(SCHEDULER, envvar="SARA_LEASE_TTL_S", min=0.001,
                                     help="The scheduler's lease TTL, s; heartbeats every "
                                          "third of it.")] = 60.0,
    give_up_after: Annotated[float, _opt(
        SCHEDULER, min=0, help="Exit (status 1) once the scheduler has been unreachable this "
                               "long, s; 0: retry for ever.")] = 120.0,
    checkpoint_root: Annotated[Optional[str], _opt(
        SCHEDULER, envvar="SARA_CHECKPOINT_ROOT",
        help="Load policy checkpoints only under this directory: one published elsewhere is "
             "refused and the weights loaded stay.")] = None,
    backend: Annotated[str, _opt(BACKEND, help="sim, hf, openai, vllm (or a plug-in).")] = "sim",
    model: Annotated[Optional[str], _opt(BACKEND, help="Model name or path (hf, openai, "
                                                       "vllm).")] = None,
    backend_url: Annotated[Optional[str], _opt(BACKEND, help="Generation server URL "
                                                             "(openai).")] = None,
    seed: Annotated[Optional[int], _opt(BACKEND, help="Backend seed (sim: outcomes).")] = None,
    per_token_ms: Annotated[float, _opt(BACKEND, min=0, help="sim: simulated time per "
                                                             "token, ms.")] = 0.0,
    gpu_memory_utilization: Annotated[Optional[float], _opt(
        VLLM, envvar="SARA_VLLM_GPU_MEMORY_UTILIZATION",
        help="Share of the GPU's memory the engine may take, in (0, 1] (vLLM's default 0.9 "
             "leaves no room for a trainer on the same GPU; docs/gpu.md).")] = None,
    option: Annotated[Optional[list[str]], _opt(
        BACKEND, "--option", "-o", help="Backend option KEY=VALUE (repeatable).")] = None,
    capacity: Annotated[Optional[int], _opt(
        LEASING, min=1, help="Most rollouts in flight at once (default: vllm, the engine's "
                             "max_num_seqs and half as many leased ahead; others 64).")] = None,
    lease_min: Annotated[Optional[int], _opt(
        LEASING, min=1, help="While rollouts are held, lease once this many slots are free "
                             "(default: capacity / 4).")] = None,
    lease_wait: Annotated[float, _opt(LEASING, min=0, max=60, help="Lease long-poll, s.")] = 5.0,
    report_batch: Annotated[int, _opt(LEASING, min=1, help="Results per report call.")] = 16,
    flush_ms: Annotated[float, _opt(LEASING, min=0, help="Oldest result's wait before a "
                                                         "report is sent, ms.")] = 100.0,
    max_rollouts: Annotated[Optional[int], _opt(LEASING, min=0, help="Stop after leasing this "
                                                                     "many.")] = None,
    on_stop: Annotated[str, _opt(STOPPING, help="On SIGTERM: finish or abort in-flight "
                                                "rollouts.")] = "finish",
    drain_timeout: Annotated[float, _opt(STOPPING, min=0, help="Longest wait for in-flight "
                                                               "rollouts on stop, s.")] = 60.0,
    log_interval: Annotated[float, _opt(LOGGING, min=0.1, help="Counters logged every, s; "
                                                              "why it idles, too.")] = 30.0,
    log_level: WorkerLogLevel = "info",
    log_format: WorkerLogFormat = None,
) -> None:
    """Lease, generate, verify and report rollouts until SIGTERM (then finish, leave the run
    and exit 0)."""
    if on_stop not in ("finish", "abort"):
        raise fail("--on-stop is finish or abort", 2)
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise fail("--gpu-memory-utilization is a share of the GPU's memory, in (0, 1]", 2)
    from sara_worker.process import backend_options, main
    from sara_worker.support import WorkerConfig, default_worker_id

    options = backend_options(backend, model=model, base_url=backend_url, seed=seed,
                              per_token_ms=per_token_ms,
                              gpu_memory_utilization=gpu_memory_utilization,
                              extra=option_values(option or []))
    config = WorkerConfig(
        worker_id=worker_id or default_worker_id(), backend_name=backend,
        **({"capacity": capacity} if capacity else {}),
        lease_min_size=lease_min, lease_wait_s=lease_wait, report_batch=report_batch,
        flush_interval_s=flush_ms / 1000.0,
        lease_ttl_s=lease_ttl, max_rollouts=max_rollouts, on_stop=on_stop,  # type: ignore[arg-type]
        drain_timeout_s=drain_timeout, log_interval_s=log_interval,
        give_up_after_s=give_up_after, checkpoint_root=checkpoint_root)
    setup_logging(log_level, log_format, worker_id=config.worker_id)
    shown = capacity or f"{config.capacity}, or fitted to the engine"
    typer.echo(f"sara: worker {config.worker_id} backend={backend} capacity={shown} -> {url}")
    try:
        counters = main(backend, options, config, url, token, fit_capacity=capacity is None)
    except ValueError as e:  # unknown backend, bad backend options
        raise fail(f"sara worker: {e}", 2) from None
    except Exception as e:  # WorkerError: unreachable, credentials refused, policy refused ...
        raise fail(f"sara worker failed: {e}", 1) from None
    typer.echo(f"sara: worker {config.worker_id} stopped: {counters.line()}")

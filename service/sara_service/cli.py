"""`sara`: the one command (serve, load, stats; worker, train, demo and bench to come).

Every heavy import (fastapi, uvicorn, redis, the client SDK, torch, vllm) happens inside the
command that needs it, so `sara --help` is fast and needs none of them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

app = typer.Typer(
    name="sara",
    help="SARA: sequential adaptive rollout allocation for RL with verifiable rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

UrlOpt = Annotated[str, typer.Option("--url", envvar="SARA_URL", help="Scheduler base URL.")]
TokenOpt = Annotated[Optional[str], typer.Option("--token", envvar="SARA_TOKEN",
                                                 help="Bearer token (admin or operator).")]
LogFormatOpt = Annotated[Optional[str], typer.Option(
    "--log-format", envvar="SARA_LOG_FORMAT", help="text or json (one object per line).")]
DEFAULT_URL = "http://127.0.0.1:8000"
LOAD_CHUNK = 1000  # prompts per POST /prompts (the service accepts up to 10,000)


def _err(message: str, code: int = 1) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


# --- serve ---------------------------------------------------------------------------------------


def _app_from_env():
    """uvicorn factory for --workers > 1: each worker process rebuilds Settings from SARA_* env."""
    from sara_service.app import create_app
    from sara_service.settings import Settings

    return create_app(Settings())


def _logging(level: str, fmt: str | None, **fields: Any) -> str:
    """Configure logging as text or JSON lines (`fields` on every JSON line); exit 2 on a bad
    format. Returns the format chosen."""
    from sara_client.logs import configure_logging

    try:
        return configure_logging(level, fmt, **fields)
    except ValueError as e:
        raise _err(f"--log-format: {e}", 2) from None


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # unwinds through `finally`, which stops the embedded Redis


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    redis_url: Annotated[Optional[str], typer.Option(help="Redis URL; unset: embedded.")] = None,
    namespace: Annotated[Optional[str], typer.Option(help="Run namespace.")] = None,
    policy: Annotated[Optional[str], typer.Option(help="uniform, dynamic_sampling, sara.")] = None,
    selection: Annotated[Optional[str], typer.Option(help="epoch or history.")] = None,
    group_size: Annotated[Optional[int], typer.Option(help="k, rollouts per group.")] = None,
    tau_low: Annotated[Optional[str], typer.Option(
        help='Abandonment threshold in [0, 1], or "auto" (cost-aware).')] = None,
    batch_size: Annotated[Optional[int], typer.Option(help="Groups per batch.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(help="Embedded Redis data dir.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="uvicorn worker processes.")] = 1,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    log_format: LogFormatOpt = None,
) -> None:
    """Run the scheduler. Flags override SARA_* environment variables."""
    from pydantic import ValidationError

    from sara_service.settings import Settings

    flags = {"redis_url": redis_url, "namespace": namespace, "policy": policy,
             "selection": selection, "group_size": group_size, "tau_low": tau_low,
             "batch_size": batch_size, "data_dir": data_dir}
    overrides = {k: v for k, v in flags.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as e:
        raise _err(f"invalid settings:\n{e}", 2) from None
    log_format = _logging(log_level, log_format, run=settings.namespace)
    # json: uvicorn's own loggers propagate to the root's JSON handler instead of its text ones
    uvicorn_logs: dict[str, Any] = {"log_config": None} if log_format == "json" else {}

    previous = signal.signal(signal.SIGTERM, _raise_exit)
    embedded = None
    try:
        if settings.redis_url is None:
            from sara_service.embedded import EmbeddedRedis

            # supervised: restarted on the same port and data dir if it dies (a log line says so)
            embedded = EmbeddedRedis(settings.data_dir).start().supervise()
            typer.echo(f"sara: embedded redis at {embedded.url} (AOF in {embedded.data_dir})")
            settings = settings.model_copy(update={"redis_url": embedded.url,
                                                  "redis_embedded": True})
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

        import uvicorn

        if workers == 1:
            from sara_service.app import create_app

            uvicorn.run(create_app(settings, embedded=embedded), host=host, port=port,
                        log_level=log_level, **uvicorn_logs,
                        timeout_graceful_shutdown=settings.shutdown_grace_s)
        else:
            # Worker processes inherit the environment: pass every override (and the embedded URL).
            for key, value in {**overrides, "redis_url": settings.redis_url}.items():
                os.environ[f"SARA_{key.upper()}"] = str(value)
            uvicorn.run("sara_service.cli:_app_from_env", factory=True, host=host, port=port,
                        workers=workers, log_level=log_level, **uvicorn_logs,
                        timeout_graceful_shutdown=settings.shutdown_grace_s)
    except KeyboardInterrupt:
        pass
    finally:
        if embedded is not None:
            embedded.stop()
            typer.echo("sara: embedded redis stopped")
        signal.signal(signal.SIGTERM, previous)


@app.command("worker-token")
def worker_token_cmd(
    worker_id: Annotated[str, typer.Argument(help="The worker id the token will act as.")],
) -> None:
    """Print a per-worker token derived from SARA_WORKER_SECRET: give it to that worker as
    SARA_WORKER_TOKEN (with the same --worker-id); it cannot act as any other worker."""
    from sara_service.credentials import worker_token

    secret = os.environ.get("SARA_WORKER_SECRET")
    if not secret:
        raise _err("set SARA_WORKER_SECRET (the scheduler's) to derive worker tokens", 2)
    typer.echo(worker_token(secret, worker_id))


# --- load ----------------------------------------------------------------------------------------


def _read_source(source: str, recipe: str | None, fields: dict[str, Any], split: str,
                 config: str | None, limit: int | None) -> list[dict]:
    """Prompts from a file or dataset (sara_client.data does the work; this only reports)."""
    from sara_client.data import load_prompts, mapping_for

    try:
        # no recipe and no field option: rows are prompts already, as sara load always read them
        plain = recipe is None and all(v is None for v in fields.values())
        mapping = None if plain else mapping_for(recipe, **fields)
        loaded = load_prompts(source, mapping, split=split, config=config, limit=limit)
    except (ValueError, OSError) as e:  # bad row, unknown recipe, missing file or dataset
        raise _err(str(e), 2) from None
    if loaded.skipped:
        typer.echo(f"skipped {loaded.skipped} rows without a prompt or an extractable answer",
                   err=True)
    return loaded.prompts


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def _client(url: str, token: str | None):
    from sara_client import SaraClient

    return SaraClient(url, token=token)


_Opt = typer.Option  # short alias: load has many options


@app.command()
def load(
    source: Annotated[Optional[str], typer.Argument(
        metavar="PATH_OR_NAME", help="JSONL or parquet file, a directory saved with "
        "datasets.save_to_disk, or a Hugging Face dataset name.")] = None,
    recipe: Annotated[Optional[str], _Opt(help="Built-in mapping: gsm8k or math.")] = None,
    prompt_field: Annotated[Optional[str], _Opt(help="Field holding the prompt.")] = None,
    answer_field: Annotated[Optional[str], _Opt(help="Field holding the answer.")] = None,
    id_field: Annotated[Optional[str], _Opt(help="Field holding a stable id.")] = None,
    extract: Annotated[Optional[str], _Opt(help="Answer extraction: none, hashes, boxed.")] = None,
    task: Annotated[Optional[str], _Opt(help="Verifier name (exact, math, ...).")] = None,
    chat: Annotated[Optional[bool], _Opt("--chat/--no-chat", help="Wrap the prompt in a user "
                                        "message (chat template).")] = None,
    instruction: Annotated[Optional[str], _Opt(help="Text appended to a chat prompt.")] = None,
    split: Annotated[str, _Opt(help="Dataset split.")] = "train",
    config: Annotated[Optional[str], _Opt(help="Dataset config (gsm8k: main).")] = None,
    limit: Annotated[Optional[int], _Opt(min=1, help="Load at most N prompts.")] = None,
    synthetic: Annotated[Optional[int], typer.Option(min=1, help="Generate N sim prompts.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of --synthetic.")] = 0,
    dry_run: Annotated[bool, typer.Option(help="Print the prompts as JSONL, post none.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Register prompts from a file or dataset, or --synthetic N sim prompts.

    Without --recipe or field options, rows must be prompts in the service's shape (prompt,
    answer, task, id, meta). --recipe gsm8k / math map the public datasets' fields, extract the
    answer and wrap the question in a chat message with an instruction.

    --synthetic draws the standard pool: 30% γ=0, 25% γ=1, 45% γ~Beta(2,2), ids p0…p{N-1},
    meta.p_success = γ (what the sim worker backend reads)."""
    if (source is None) == (synthetic is None):
        raise _err("give either a file or dataset, or --synthetic N", 2)
    if synthetic is not None:
        from sara_service.pools import standard_pool

        prompts = standard_pool(synthetic, seed)
    else:
        fields = dict(prompt_field=prompt_field, answer_field=answer_field, id_field=id_field,
                      extract=extract, task=task, chat=chat, instruction=instruction)
        prompts = _read_source(source, recipe, fields, split, config, limit)
    if dry_run:
        for p in prompts:
            typer.echo(json.dumps(p))
        return
    if not prompts:
        raise _err("no prompts to load", 2)
    created = 0
    try:
        client = _client(url, token)
        try:
            for i in range(0, len(prompts), LOAD_CHUNK):
                created += _field(client.add_prompts(prompts[i:i + LOAD_CHUNK]), "created") or 0
        finally:
            getattr(client, "close", lambda: None)()
    except Exception as e:  # connection refused, 4xx/5xx: one line, not a traceback
        raise _err(f"load failed after {created} new prompts: {e}", 1) from None
    typer.echo(f"loaded {len(prompts)} prompts ({created} new) into {url}")


# --- stats ---------------------------------------------------------------------------------------

_COUNTERS = ("rollouts_issued", "rollouts_completed", "rollouts_cancelled", "groups_opened",
             "groups_committed", "groups_abandoned", "groups_delivered", "groups_audited",
             "audits_mixed", "audits_pure", "audit_rollouts",
             "rollouts_not_spent_on_abandoned_groups", "expected_false_abandons",
             "batches_formed", "batches_acked")


def _estimate_line(derived: dict) -> str:
    """The DS comparison in one line, each estimate with its 95% interval."""
    def ci(name: str, pct: bool = False) -> str:
        point, low, high = (derived.get(name + suffix) for suffix in ("", "_low", "_high"))
        show = (lambda v: "-" if v is None else f"{100 * v:+.1f}%") if pct else _fmt
        return f"{show(point)} (95% CI {show(low)} to {show(high) if high is not None else 'inf'})"

    return (f"ESTIMATE vs Dynamic Sampling: net saving {ci('net_saving_vs_ds', True)}; DS would "
            f"spend {ci('ds_rollouts_per_effective_group')} rollouts per effective group; "
            f"measured false-abandon rate {ci('false_abandon_rate')}")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _watch_stats(url: str, token: str | None, interval: float) -> None:
    """`sara stats --watch`: the live view of sara_service.watch until Ctrl-C."""
    from sara_service.watch import watch

    client = _client(url, token)
    try:
        watch(client.stats, interval)
    finally:
        getattr(client, "close", lambda: None)()


@app.command()
def stats(
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    watch_: Annotated[bool, typer.Option("--watch", "-w", help="Live view, refreshed every "
                                         "--interval seconds; Ctrl-C to quit.")] = False,
    interval: Annotated[float, typer.Option("--interval", "-n", min=0.1,
                                            help="Seconds between refreshes of --watch.")] = 1.0,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Show GET /stats as a compact table, or live with --watch (the /dashboard figures)."""
    if watch_:
        if as_json:
            raise _err("--json and --watch do not go together", 2)
        _watch_stats(url, token, interval)
        return
    try:
        client = _client(url, token)
        try:
            raw = client.stats()
        finally:
            getattr(client, "close", lambda: None)()
    except Exception as e:
        raise _err(f"stats failed: {e}", 1) from None
    data = raw.model_dump(mode="json") if hasattr(raw, "model_dump") else dict(raw)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    cfg = data.get("config") or {}
    console = Console()
    console.print(f"[bold]{url}[/]  ns={data.get('namespace')}  {cfg.get('policy', '?')} "
                  f"k={cfg.get('group_size', '?')}  policy "
                  f"v{(data.get('policy') or {}).get('version')}", highlight=False)
    console.print(_estimate_line(data.get("derived") or {}), highlight=False)
    table = Table()
    table.add_column("section")
    table.add_column("metric")
    table.add_column("value", justify="right")
    counters = data.get("counters") or {}
    for name in _COUNTERS:
        if name in counters:
            table.add_row("counters", name, _fmt(counters[name]))
    for section in ("derived", "queues"):
        for name, value in (data.get(section) or {}).items():
            table.add_row(section, name, _fmt(value))
    workers_ = data.get("workers") or []
    stale = sum(1 for w in workers_ if w.get("stale"))
    table.add_row("workers", "live / stale", f"{len(workers_) - stale} / {stale}")
    console.print(table)


_PASS_THROUGH = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True}}


def _option_values(pairs: list[str], flag: str = "--option") -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON is taken as such, else as a string."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise _err(f"{flag} wants KEY=VALUE, not {pair!r}", 2)
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


async def _work(backend_name: str, options: dict[str, Any], config: Any, url: str,
                token: Optional[str]) -> Any:
    """Run one worker until SIGTERM/SIGINT (a second signal aborts what is in flight)."""
    import asyncio

    from sara_client import AsyncSaraClient
    from sara_worker.backends import create_backend
    from sara_worker.loop import WorkerLoop

    backend = create_backend(backend_name, **options)
    client = AsyncSaraClient(url, token=token)
    loop = WorkerLoop(client, backend, config)
    signals_seen = []

    def on_signal() -> None:
        signals_seen.append(1)
        loop.stop(abort=True if len(signals_seen) > 1 else None)

    aio = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aio.add_signal_handler(sig, on_signal)
    try:
        return await loop.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            aio.remove_signal_handler(sig)
        await backend.close()
        await client.aclose()


@app.command()
def worker(
    backend: Annotated[str, typer.Option(help="sim, hf, openai, vllm (or a plug-in).")] = "sim",
    url: UrlOpt = DEFAULT_URL,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar=["SARA_WORKER_TOKEN", "SARA_TOKEN"], help="Worker bearer token.")] = None,
    worker_id: Annotated[Optional[str], typer.Option(help="Default: hostname-pid.")] = None,
    capacity: Annotated[int, typer.Option(min=1, help="Most rollouts in flight at once.")] = 64,
    lease_wait: Annotated[float, typer.Option(min=0, max=60, help="Lease long-poll, s.")] = 5.0,
    report_batch: Annotated[int, typer.Option(min=1, help="Results per report call.")] = 16,
    flush_ms: Annotated[float, typer.Option(min=0, help="Oldest result's wait before a "
                                                          "report is sent, ms.")] = 100.0,
    lease_ttl: Annotated[float, typer.Option(envvar="SARA_LEASE_TTL_S", min=0.001,
                                             help="The scheduler's lease TTL, s; "
                                                  "heartbeats every third of it.")] = 60.0,
    max_rollouts: Annotated[Optional[int], typer.Option(min=0, help="Stop after leasing this "
                                                                    "many.")] = None,
    on_stop: Annotated[str, typer.Option(help="On SIGTERM: finish or abort in-flight "
                                              "rollouts.")] = "finish",
    drain_timeout: Annotated[float, typer.Option(min=0, help="Longest wait for in-flight "
                                                             "rollouts on stop, s.")] = 60.0,
    log_interval: Annotated[float, typer.Option(min=0.1, help="Counters logged every, s.")] = 30.0,
    model: Annotated[Optional[str], typer.Option(help="Model name or path (hf, openai, "
                                                      "vllm).")] = None,
    backend_url: Annotated[Optional[str], typer.Option(help="Generation server URL "
                                                            "(openai).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Backend seed (sim: outcomes).")] = None,
    per_token_ms: Annotated[float, typer.Option(min=0, help="sim: simulated time per "
                                                            "token, ms.")] = 0.0,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(
        envvar="SARA_VLLM_GPU_MEMORY_UTILIZATION", min=0.01, max=1.0,
        help="vllm: share of the GPU's memory the engine may take (vLLM's default 0.9 leaves "
             "no room for a trainer on the same GPU; see docs/gpu.md).")] = None,
    option: Annotated[Optional[list[str]], typer.Option(
        "--option", "-o", help="Backend option KEY=VALUE (repeatable).")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    log_format: LogFormatOpt = None,
) -> None:
    """Lease, generate, verify and report rollouts until SIGTERM (then finish and exit 0)."""
    import asyncio

    if on_stop not in ("finish", "abort"):
        raise _err("--on-stop is finish or abort", 2)
    from sara_worker.support import WorkerConfig, default_worker_id

    options = {"model": model, "base_url": backend_url, "seed": seed}
    if backend == "sim":
        options["per_token_s"] = per_token_ms / 1000.0
    if backend == "vllm" and gpu_memory_utilization is not None:
        options["gpu_memory_utilization"] = gpu_memory_utilization
    options = {k: v for k, v in options.items() if v is not None}
    options.update(_option_values(option or []))
    config = WorkerConfig(
        worker_id=worker_id or default_worker_id(), backend_name=backend, capacity=capacity,
        lease_wait_s=lease_wait, report_batch=report_batch, flush_interval_s=flush_ms / 1000.0,
        lease_ttl_s=lease_ttl, max_rollouts=max_rollouts, on_stop=on_stop,  # type: ignore[arg-type]
        drain_timeout_s=drain_timeout, log_interval_s=log_interval)
    _logging(log_level, log_format, worker_id=config.worker_id)
    typer.echo(f"sara: worker {config.worker_id} backend={backend} capacity={capacity} -> {url}")
    try:
        counters = asyncio.run(_work(backend, options, config, url, token))
    except ValueError as e:  # unknown backend, bad backend options
        raise _err(f"sara worker: {e}", 2) from None
    except Exception as e:  # WorkerError: credentials refused, policy not loadable, ...
        raise _err(f"sara worker failed: {e}", 1) from None
    typer.echo(f"sara: worker {config.worker_id} stopped: {counters.line()}")


def _make_reporter(report_to: str, logging_dir: Path, run_name: str | None, config: Any):
    """The --report-to backends, or exit 2 naming the unknown backend or the missing extra."""
    from sara_trainer.tracking import make_reporter

    try:
        return make_reporter(report_to, logging_dir, run_name, config.to_dict())
    except (ValueError, ImportError) as e:
        raise _err(f"sara train: {e}", 2) from None


@app.command()
def train(
    model: Annotated[str, typer.Option(help="Hugging Face causal LM directory to start from.")],
    url: UrlOpt = DEFAULT_URL,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar=["SARA_TRAINER_TOKEN", "SARA_TOKEN"],
        help="Trainer bearer token.")] = None,
    checkpoint_dir: Annotated[Path, typer.Option(
        help="Where checkpoints go (workers must read it); resumes from its latest.")] = Path(
        "./sara-data/checkpoints"),
    steps: Annotated[int, typer.Option(min=1, help="Total steps to reach (resumes count).")] = 200,
    estimator: Annotated[str, typer.Option(
        help="grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, or gae (PPO: trains a "
             "critic, checkpointed with the policy).")] = "grpo",
    lr: Annotated[float, typer.Option(min=0.0, help="AdamW learning rate.")] = 1e-4,
    kl_coef: Annotated[float, typer.Option(min=0.0, help="k3 KL to the starting policy.")] = 0.0,
    seed: Annotated[int, typer.Option(help="torch seed.")] = 0,
    checkpoint_every: Annotated[int, typer.Option(
        min=1, help="Steps between full resume checkpoints (weights + optimiser).")] = 10,
    publish_every: Annotated[int, typer.Option(
        min=1, help="Steps between new policy versions for the workers (weights only, bf16 "
                    "on CUDA, between full checkpoints).")] = 1,
    device: Annotated[str, typer.Option(
        help="auto (cuda when torch sees a GPU, else cpu), cpu, cuda, cuda:1 ...")] = "auto",
    dtype: Annotated[str, typer.Option(
        help="auto (bf16 compute over fp32 weights on CUDA, fp32 on CPU), float32, "
             "bfloat16 (bf16 weights too: half the memory, but tiny updates round away).")
    ] = "auto",
    micro_batch_tokens: Annotated[int, typer.Option(
        min=0, help="Padded tokens per forward/backward pass (0: rollouts only).")] = 0,
    gradient_checkpointing: Annotated[bool, typer.Option(
        help="Recompute activations in backward (less memory, ~30% more compute).")] = False,
    threads: Annotated[int, typer.Option(min=1, help="torch CPU threads.")] = 2,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    log_format: LogFormatOpt = None,
    settings: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Any other TrainerConfig field as KEY=VALUE, repeatable: e.g. "
                      "critic_lr=1e-3, gae_lambda=0.95, critic_warmup_steps=5, "
                      "batch_groups=64.")] = None,
    report_to: Annotated[str, typer.Option(
        help="Experiment tracking, comma-separated: tensorboard, wandb, mlflow, jsonl, all or "
             "none (each but jsonl needs its extra; WANDB_MODE=offline works offline).")
    ] = "none",
    logging_dir: Annotated[Path, typer.Option(
        help="Where --report-to backends write (TensorBoard events, metrics.jsonl, ...).")
    ] = Path("./sara-data/runs"),
    run_name: Annotated[Optional[str], typer.Option(
        help="The run's name in W&B / MLflow.")] = None,
) -> None:
    """Pull effective batches, update the policy, checkpoint and publish each new version."""
    from sara_trainer.config import TrainerConfig

    _logging(log_level, log_format)
    fields = dict(model=model, checkpoint_dir=str(checkpoint_dir), max_steps=steps,
                  advantage_estimator=estimator, lr=lr, kl_coef=kl_coef, seed=seed,
                  checkpoint_every=checkpoint_every, publish_every=publish_every, device=device,
                  dtype=dtype, micro_batch_tokens=micro_batch_tokens,
                  gradient_checkpointing=gradient_checkpointing, threads=threads,
                  service_url=url)
    fields.update(_option_values(settings or [], "--set"))
    try:
        config = TrainerConfig.from_dict(fields)
    except (ValueError, TypeError) as e:
        raise _err(f"sara train: {e}", 2) from None
    from sara_trainer.loop import train as run_training

    reporter = _make_reporter(report_to, logging_dir, run_name, config)
    typer.echo(f"sara: trainer {model} -> {url}, checkpoints in {checkpoint_dir}")
    try:
        trainer = run_training(config, url, token, on_step=reporter.log_step)
    except KeyboardInterrupt:
        raise _err("sara train: interrupted; the next run resumes from the last checkpoint",
                   130) from None
    except Exception as e:  # connection refused, auth, unloadable model: one line
        raise _err(f"sara train failed: {e}", 1) from None
    finally:
        reporter.close()
    typer.echo(f"sara: trained to step {trainer.step}, policy v{trainer.version} "
               f"({trainer.checkpoint})")


@app.command()
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
    if backend not in ("hf", "vllm"):
        raise _err("--backend is hf or vllm", 2)
    if backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise _err("--backend vllm: vllm is not installed here (try --backend hf)", 2)
    from sara_trainer.demo import make_config, run_demo

    config = make_config(quick, sft_seconds=sft_seconds, sft_steps=sft_steps, rl_steps=rl_steps,
                         rollout_budget=rollouts, compare=compare, seed=seed, out=out,
                         backend=backend, progress=progress, report_to=report_to)
    try:
        summary = run_demo(config)
    except Exception as e:
        raise _err(f"sara demo failed: {e}", 1) from None
    acc = summary["accuracy"]
    line = (f"sara demo: held-out accuracy {100 * acc['before_rl']:.1f}% -> "
            f"{100 * acc['after_rl']:.1f}% with SARA")
    ds = (summary.get("arms") or {}).get("dynamic_sampling")
    if ds:
        line += f", {100 * ds['accuracy_after']:.1f}% with Dynamic Sampling"
    typer.echo(f"{line} in {summary['wall_seconds']:.0f}s; {out / 'summary.json'}")


BENCHMARKS = ("allocation", "e2e", "service_throughput", "worker_overhead", "soak")


def _bench_dir(given: Path | None) -> Path:
    """The ``bench/`` scripts: `given`, else the source checkout this package runs from, else
    ``./bench``."""
    here = Path(__file__).resolve().parents[2] / "bench"
    for candidate in (given, here, Path.cwd() / "bench"):
        if candidate is not None and (candidate / "allocation.py").is_file():
            return candidate
    raise _err("sara bench: the bench/ scripts were not found; run it from a source checkout "
               "of this project or pass --bench-dir", 2)


@app.command(**_PASS_THROUGH)
def bench(
    ctx: typer.Context,
    name: Annotated[Optional[str], typer.Argument(
        help=f"one of {', '.join(BENCHMARKS)}; none: allocation --quick")] = None,
    bench_dir: Annotated[Optional[Path], typer.Option(
        envvar="SARA_BENCH_DIR", help="where the bench/ scripts are")] = None,
) -> None:
    """Run a benchmark script from bench/; arguments after NAME go to it
    (`sara bench NAME -- --help` shows its own).

    `sara bench` alone compares uniform, Dynamic Sampling, SARA, DPS, MoPPS and SARA + DPS on
    the standard pool through the real scheduler in under a minute (`allocation --quick`).
    """
    import subprocess

    args = list(ctx.args)
    if name is None:
        name, args = "allocation", ["--quick", *args]
    if name not in BENCHMARKS:
        raise _err(f"sara bench: unknown benchmark {name!r}; choose from "
                   f"{', '.join(BENCHMARKS)}", 2)
    script = _bench_dir(bench_dir) / f"{name}.py"
    code = subprocess.call([sys.executable, str(script), *args])
    if code:
        raise typer.Exit(code)


def _add_run_control() -> None:
    from sara_service.cli_runctl import prompts_app, run_app  # typer only: keeps --help fast

    app.add_typer(prompts_app, name="prompts")
    app.add_typer(run_app, name="run")


_add_run_control()


def main() -> None:
    """Console entry point (`sara`)."""
    app(prog_name="sara")


if __name__ == "__main__":
    sys.exit(main())

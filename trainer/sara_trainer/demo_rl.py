"""The RL phase of ``sara demo``: the scheduler in-process, an hf (or vllm) worker on the same
event loop and the trainer on a thread, until ``rl_steps`` steps, the rollout budget or the time
budget; held-out evaluations along the way.

The trainer's SDK calls go to the in-process scheduler through a small sync-over-async adapter
(:class:`_SyncClient`), so nothing listens on a port.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from .demo import DemoConfig, heldout_accuracy, say

log = logging.getLogger("sara.demo")


class _SyncClient:
    """The trainer's sync SDK calls, run on the event loop that owns the async client."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._client, self._loop = client, loop

    def __getattr__(self, name: str):
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            future = asyncio.run_coroutine_threadsafe(method(*args, **kwargs), self._loop)
            return future.result()

        return call


class _Bars:
    """Rich progress for the RL phase (or nothing)."""

    def __init__(self, enabled: bool, total: int, label: str, unit: str) -> None:
        self._progress = None
        if not enabled:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn(f"[bold]RL {label}"), BarColumn(bar_width=20),
            TextColumn("{task.completed:,}/{task.total:,} " + unit),
            TextColumn("step {task.fields[step]}"), TextColumn("held-out {task.fields[acc]}"),
            TimeElapsedColumn())
        self._task = self._progress.add_task("rl", total=total, acc="-", step=0)
        self._progress.start()

    def update(self, **fields: Any) -> None:
        if self._progress is not None:
            self._progress.update(self._task, **fields)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _make_backend(cfg: DemoConfig, model_dir: str):
    from sara_worker.backends import create_backend

    if cfg.backend == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise RuntimeError("--backend vllm: vllm is not importable here") from exc
        import os

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny model needs little
        return create_backend("vllm", model=model_dir, seed=cfg.seed, dtype="float32",
                              enforce_eager=True, max_model_len=64)
    if cfg.backend != "hf":
        raise ValueError(f"backend is hf or vllm, not {cfg.backend!r}")
    return create_backend("hf", model=model_dir, device="cpu", dtype="float32", seed=cfg.seed,
                          max_batch=1024, batch_window_s=0.01, logprobs=True)


async def run_rl(cfg: DemoConfig, work: Path, sft_dir: str, prompts: list[dict], eval_set,
                 before: dict, deadline: float, label: str = "") -> tuple:
    """One RL run from `sft_dir` under ``cfg.policy``; returns (trainer, the scheduler's final
    stats, the worker's counters, one history entry per step, the held-out evaluations)."""
    import sara_client
    from sara_worker.loop import WorkerLoop
    from sara_worker.support import WorkerConfig

    from .config import TrainerConfig
    from .loop import Trainer
    from .tracking import make_reporter

    settings = dict(redis_url=None, policy=cfg.policy, selection=cfg.selection,
                    group_size=cfg.group_size,
                    batch_size=cfg.batch_groups, prefetch_batches=cfg.prefetch_batches,
                    max_staleness=cfg.max_staleness,
                    temperature=1.0, max_tokens=cfg.max_new_tokens, seed=cfg.seed,
                    lease_ttl_s=120.0, batch_ack_timeout_s=600.0)
    tcfg = TrainerConfig(
        model=sft_dir, checkpoint_dir=str(work / "checkpoints"), seed=cfg.seed,
        threads=cfg.rl_threads, lr=cfg.lr, k=cfg.group_size, batch_groups=cfg.batch_groups,
        micro_batch_rollouts=512, advantage_estimator=cfg.advantage_estimator,
        max_new_tokens=cfg.max_new_tokens,
        temperature=1.0, max_steps=cfg.rl_steps, checkpoint_every=1, keep_checkpoints=3,
        batch_wait_s=5.0, sft_seconds=cfg.sft_seconds,
        lr_warmup_steps=cfg.lr_warmup_steps, **cfg.trainer_options)
    history: list[dict[str, Any]] = []
    evals = [{"step": 0, "accuracy": before["accuracy"], "rollouts_cum": 0, "tokens_cum": 0,
              "seconds_cum": 0.0}]
    stop, budget_spent = threading.Event(), threading.Event()
    by_rollouts = bool(cfg.rollout_budget)
    bars = _Bars(cfg.progress, cfg.rollout_budget if by_rollouts else cfg.rl_steps, label,
                 "rollouts" if by_rollouts else "steps")
    # RL wall time without the held-out evaluations (they pause the trainer, not the worker)
    totals = {"rollouts": 0, "tokens": 0, "eval_s": 0.0, "start": time.perf_counter()}
    # each arm's own run, outside the work dir the next demo deletes: TensorBoard
    # (--logdir OUT/runs), W&B, ... chart SARA and DS side by side
    reporter = make_reporter(cfg.report_to, Path(cfg.out) / "runs" / cfg.policy,
                             run_name=cfg.policy, config=tcfg.to_dict())
    reporter.log_eval(0, {"heldout_accuracy": before["accuracy"]})

    def on_step(report) -> None:
        reporter.log_step(report)
        st = report.batch_stats
        totals["rollouts"] += st.get("rollouts_spent", 0)
        totals["tokens"] += st.get("tokens_spent", 0)
        entry = {"step": report.step, "policy_version": report.policy_version,
                 "mean_reward": report.mean_reward, "loss": report.loss,
                 "groups": report.groups, "rollouts": report.rollouts,
                 "groups_mixed": int(report.metrics.get("groups_mixed", report.groups)),
                 "rollouts_mixed": int(report.metrics.get("rollouts_mixed", report.rollouts)),
                 "rollouts_spent": st.get("rollouts_spent", 0),
                 "groups_abandoned": st.get("groups_abandoned", 0),
                 "rollouts_cum": totals["rollouts"], "tokens_cum": totals["tokens"],
                 "seconds": report.seconds,
                 "seconds_cum": time.perf_counter() - totals["start"] - totals["eval_s"],
                 "ratio_mean": report.metrics.get("ratio_mean"),
                 "clip_frac": report.metrics.get("clip_frac"),
                 "staleness_mean": report.metrics.get("staleness_mean"),
                 "staleness_max": report.metrics.get("staleness_max")}
        if _eval_due(cfg, report.step, totals["rollouts"], evals):
            eval_started = time.perf_counter()
            value = heldout_accuracy(trainer.model, trainer.tokenizer, eval_set,
                                     cfg.max_new_tokens)["accuracy"]
            totals["eval_s"] += time.perf_counter() - eval_started
            evals.append({"step": report.step, "accuracy": value,
                          "rollouts_cum": totals["rollouts"], "tokens_cum": totals["tokens"],
                          "seconds_cum": entry["seconds_cum"]})
            entry["heldout_accuracy"] = value
            reporter.log_eval(report.step, {"heldout_accuracy": value,
                                            "rollouts_cum": totals["rollouts"]})
        if cfg.rollout_budget and totals["rollouts"] >= cfg.rollout_budget:
            budget_spent.set()
            stop.set()
        acc = f"{100 * evals[-1]['accuracy']:.1f}%"
        history.append(entry)
        bars.update(completed=min(totals["rollouts"], cfg.rollout_budget) if by_rollouts
                    else report.step, step=report.step, acc=acc)

    loop = asyncio.get_running_loop()
    backend = _make_backend(cfg, sft_dir)
    async with sara_client.alocal(data_dir=work / "redis", **settings) as client:
        for i in range(0, len(prompts), 1000):
            await client.add_prompts(prompts[i:i + 1000])
        worker = WorkerLoop(client, backend, WorkerConfig(
            worker_id=f"demo-{cfg.backend}", backend_name=cfg.backend,
            capacity=cfg.batch_groups * cfg.group_size * 2, lease_wait_s=2.0, report_batch=128,
            flush_interval_s=0.02, lease_ttl_s=120.0, on_stop="abort", drain_timeout_s=10.0,
            log_interval_s=3600.0))
        # the trainer loads its model before the worker starts: transformers' from_pretrained
        # patches globals (tie_weights, default dtype) and two loads at once corrupt each other
        trainer = await asyncio.to_thread(Trainer, _SyncClient(client, loop), tcfg,
                                          on_step=on_step)
        worker_task = asyncio.ensure_future(worker.run())
        timer = loop.call_later(max(0.0, deadline - time.perf_counter()), stop.set)
        try:
            await asyncio.to_thread(trainer.run, stop=stop, timeout_s=cfg.batch_timeout_s)
        finally:
            timer.cancel()
            out_of_time = stop.is_set() and not budget_spent.is_set()
            stop.set()
            bars.close()
            reporter.close()
            worker.stop(abort=True)
            try:
                counters = await asyncio.wait_for(worker_task, 30.0)
            finally:
                await backend.close()
        stats = await client.stats()
    if trainer.step < cfg.rl_steps and out_of_time:
        log.warning("time budget reached: RL stopped after %d of %d steps", trainer.step,
                    cfg.rl_steps)
        say(cfg, f"    time budget reached: RL stopped after {trainer.step} of {cfg.rl_steps} "
                  "steps")
    elif trainer.step < cfg.rl_steps and not budget_spent.is_set():
        raise RuntimeError(f"RL stopped at step {trainer.step} of {cfg.rl_steps}: no batch for "
                           f"{cfg.batch_timeout_s:.0f}s (the policy may solve none or all of "
                           "the prompts)")
    return trainer, stats, counters, history, evals


def _eval_due(cfg: DemoConfig, step: int, rollouts: int, evals: list[dict]) -> bool:
    """Whether the held-out evaluation runs after this step (never after the last one: the
    final evaluation follows RL anyway)."""
    if step >= cfg.rl_steps or (cfg.rollout_budget and rollouts >= cfg.rollout_budget):
        return False
    if cfg.eval_every_rollouts:
        return rollouts // cfg.eval_every_rollouts > evals[-1]["rollouts_cum"] // \
            cfg.eval_every_rollouts
    return bool(cfg.eval_every) and step % cfg.eval_every == 0

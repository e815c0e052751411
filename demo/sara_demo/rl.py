"""The RL phase of ``sara demo``: the scheduler in-process, an hf (or vllm) worker on the same
event loop and the trainer on a thread, until ``rl_steps`` steps, the rollout budget or the time
budget; held-out evaluations along the way.

The trainer's SDK calls go to the in-process scheduler through the client's sync-over-async
bridge (:class:`sara_client.local.BlockingClient`), so nothing listens on a port.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

from .config import DemoConfig, say
from .evaluate import heldout_accuracy

log = logging.getLogger("sara.demo")


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
                 before: dict, deadline: float, label: str = "", *,
                 evaluator: Callable[[Any, Any], dict[str, Any]] | None = None,
                 batch_size: Callable[[list[dict]], int | None] | None = None,
                 on_end: Callable[[Any], Awaitable[None]] | None = None) -> tuple:
    """One RL run from `sft_dir` under ``cfg.policy``; returns (trainer, the scheduler's final
    stats, the worker's counters, one history entry per step, the held-out evaluations).

    ``evaluator(model, tokenizer)`` replaces the held-out evaluation (its dict, with at least
    ``accuracy``, goes into each evaluation record; or a ``concurrent.futures.Future`` of that
    dict, for an evaluation that runs elsewhere while training goes on: those are waited for
    after the last step, in order); ``batch_size(history)`` chooses how many
    groups each step asks for (see :class:`sara_trainer.loop.Trainer`); ``on_end(client)`` is
    awaited after the last step, while the scheduler still holds the run's state (per-prompt
    counts, say)."""
    import sara_client

    tcfg = _trainer_config(cfg, work, sft_dir)
    steps = _StepLog(cfg, tcfg, eval_set, before, label, evaluator)
    backend = _make_backend(cfg, sft_dir)
    steps.engine = backend
    async with sara_client.alocal(data_dir=work / "redis", **_scheduler_settings(cfg)) as client:
        for i in range(0, len(prompts), 1000):
            await client.add_prompts(prompts[i:i + 1000])
        trainer, counters, out_of_time = await _train_and_work(cfg, tcfg, client, backend, steps,
                                                               deadline, batch_size)
        await asyncio.to_thread(steps.resolve)
        if on_end is not None:
            await on_end(client)
        stats = await client.stats()
    _check_end(cfg, trainer, out_of_time, steps.budget_spent.is_set())
    return trainer, stats, counters, steps.history, steps.evals


def _scheduler_settings(cfg: DemoConfig) -> dict[str, Any]:
    """The in-process scheduler's settings (a fresh embedded Redis)."""
    base = dict(redis_url=None, policy=cfg.policy, selection=cfg.selection,
                group_size=cfg.group_size, batch_size=cfg.batch_groups,
                prefetch_batches=cfg.prefetch_batches, max_staleness=cfg.max_staleness,
                temperature=1.0, max_tokens=cfg.max_new_tokens, seed=cfg.seed,
                lease_ttl_s=120.0, batch_ack_timeout_s=600.0)
    return {**base, **cfg.scheduler_options}   # the options win (Reinforce-Ada's budget)


def _trainer_config(cfg: DemoConfig, work: Path, sft_dir: str):
    from sara_trainer.config import TrainerConfig

    fields: dict[str, Any] = dict(
        model=sft_dir, device="cpu", checkpoint_dir=str(work / "checkpoints"), seed=cfg.seed,
        threads=cfg.rl_threads, lr=cfg.lr, micro_batch_rollouts=512,
        advantage_estimator=cfg.advantage_estimator, max_steps=cfg.rl_steps, checkpoint_every=1,
        keep_checkpoints=3, batch_wait_s=5.0, lr_warmup_steps=cfg.lr_warmup_steps)
    fields.update(cfg.trainer_options)   # the options win over the demo's choices
    return TrainerConfig(**fields)


def worker_capacity(cfg: DemoConfig) -> int:
    """Rollouts the worker holds at once: every rollout of the batches the scheduler keeps in
    the making, and at least two batches' worth. Held at two batches' worth under four in the
    making, DS's engine calls stopped at that cap, and on 2 cores a call of 150 rows costs about
    the seconds of one of 220: fewer, fuller calls generate the same rollouts sooner
    (docs/benchmarks.md, "Why the testbed's protocol is what it is")."""
    return cfg.batch_groups * cfg.group_size * max(2, cfg.prefetch_batches)


def _make_worker(cfg: DemoConfig, client: Any, backend: Any):
    from sara_worker.loop import WorkerLoop
    from sara_worker.support import WorkerConfig

    return WorkerLoop(client, backend, WorkerConfig(
        worker_id=f"demo-{cfg.backend}", backend_name=cfg.backend,
        capacity=worker_capacity(cfg), lease_wait_s=2.0, report_batch=128,
        flush_interval_s=0.02, lease_ttl_s=120.0, on_stop="abort", drain_timeout_s=10.0,
        log_interval_s=3600.0))


async def _train_and_work(cfg: DemoConfig, tcfg: Any, client: Any, backend: Any,
                          steps: _StepLog, deadline: float,
                          batch_size: Callable[[list[dict]], int | None] | None
                          ) -> tuple[Any, Any, bool]:
    """The worker on this event loop and the trainer on a thread, until the trainer stops (its
    steps, the rollout budget or `deadline`); (trainer, worker counters, out of time)."""
    from sara_client.local import BlockingClient
    from sara_trainer.loop import Trainer

    loop = asyncio.get_running_loop()
    worker = _make_worker(cfg, client, backend)
    # the trainer loads its model before the worker starts: transformers' from_pretrained
    # patches globals (tie_weights, default dtype) and two loads at once corrupt each other
    sizer = None if batch_size is None else (lambda: batch_size(steps.history))
    trainer = await asyncio.to_thread(Trainer, BlockingClient(client, loop), tcfg,
                                      on_step=steps.on_step, batch_size=sizer)
    steps.trainer = trainer
    worker_task = asyncio.ensure_future(worker.run())
    timer = loop.call_later(max(0.0, deadline - time.perf_counter()), steps.stop.set)
    try:
        await asyncio.to_thread(trainer.run, stop=steps.stop, timeout_s=cfg.batch_timeout_s)
    finally:
        timer.cancel()
        out_of_time = steps.stop.is_set() and not steps.budget_spent.is_set()
        steps.close()
        worker.stop(abort=True)
        try:
            counters = await asyncio.wait_for(worker_task, 30.0)
        finally:
            await backend.close()
    return trainer, counters, out_of_time


def _check_end(cfg: DemoConfig, trainer: Any, out_of_time: bool, budget_spent: bool) -> None:
    """Say when the time budget cut RL short; raise when batches stopped coming."""
    if trainer.step < cfg.rl_steps and out_of_time:
        log.warning("time budget reached: RL stopped after %d of %d steps", trainer.step,
                    cfg.rl_steps)
        say(cfg, f"    time budget reached: RL stopped after {trainer.step} of {cfg.rl_steps} "
                  "steps")
    elif trainer.step < cfg.rl_steps and not budget_spent:
        raise RuntimeError(f"RL stopped at step {trainer.step} of {cfg.rl_steps}: no batch for "
                           f"{cfg.batch_timeout_s:.0f}s (the policy may solve none or all of "
                           "the prompts)")


class _StepLog:
    """What each trainer step leaves behind: the history entry, a held-out evaluation when one
    is due, the tracking backends, the progress bars, and the stop once the budget is spent."""

    def __init__(self, cfg: DemoConfig, tcfg: Any, eval_set, before: dict, label: str,
                 evaluator: Callable[[Any, Any], dict[str, Any]] | None = None) -> None:
        from sara_trainer.tracking import make_reporter

        self.cfg, self.eval_set, self.trainer = cfg, eval_set, None
        self.evaluator, self.engine = evaluator, None
        self.training_s = 0.0   # the trainer's step seconds (update, checkpoint, publish)
        self.history: list[dict[str, Any]] = []
        # an evaluator's figures before RL start the curve whole; the demo's keep to accuracy
        first = dict(before) if evaluator is not None else {"accuracy": before["accuracy"]}
        self.evals = [{**first, "step": 0, "rollouts_cum": 0,
                       "tokens_cum": 0, "seconds_cum": 0.0, "generation_s": 0.0,
                       "training_s": 0.0}]
        self.stop, self.budget_spent = threading.Event(), threading.Event()
        self.by_rollouts = bool(cfg.rollout_budget)
        self.bars = _Bars(cfg.progress, cfg.rollout_budget if self.by_rollouts else cfg.rl_steps,
                          label, "rollouts" if self.by_rollouts else "steps")
        # RL wall time without the held-out evaluations (they pause the trainer, not the worker)
        self.rollouts, self.tokens, self.eval_s = 0, 0, 0.0
        # evaluations running elsewhere: (their record, the future of their figures)
        self.pending: list[tuple[dict[str, Any], concurrent.futures.Future]] = []
        self.start = time.perf_counter()
        # each arm's own run, outside the work dir the next demo deletes: TensorBoard
        # (--logdir OUT/runs), W&B, ... chart SARA and DS side by side
        self.reporter = make_reporter(cfg.report_to, Path(cfg.out) / "runs" / cfg.policy,
                                      run_name=cfg.policy, config=tcfg.to_dict())
        self.reporter.log_eval(0, {"heldout_accuracy": before["accuracy"]})

    def on_step(self, report: Any) -> None:
        self.reporter.log_step(report)
        self.rollouts += report.batch_stats.get("rollouts_spent", 0)
        self.tokens += report.batch_stats.get("tokens_spent", 0)
        self.training_s += report.seconds
        entry = self._entry(report)
        if _eval_due(self.cfg, report.step, self.rollouts, self.evals):
            value = self._evaluate(report.step, entry["seconds_cum"])
            if value is not None:
                entry["heldout_accuracy"] = value
        if self.cfg.rollout_budget and self.rollouts >= self.cfg.rollout_budget:
            self.budget_spent.set()
            self.stop.set()
        self.history.append(entry)
        # the rollouts spent, as everywhere else: a last batch may take them past the budget
        done = self.rollouts if self.by_rollouts else report.step
        total = max(done, self.cfg.rollout_budget) if self.by_rollouts else self.cfg.rl_steps
        known = [e["accuracy"] for e in self.evals if "accuracy" in e]
        self.bars.update(completed=done, total=total, step=report.step,
                         acc=f"{100 * known[-1]:.1f}%")

    def _entry(self, report: Any) -> dict[str, Any]:
        st, m = report.batch_stats, report.metrics
        return {"step": report.step, "policy_version": report.policy_version,
                "mean_reward": report.mean_reward, "loss": report.loss,
                "groups": report.groups, "rollouts": report.rollouts,
                "groups_mixed": int(m.get("groups_mixed", report.groups)),
                "rollouts_mixed": int(m.get("rollouts_mixed", report.rollouts)),
                "rollouts_spent": st.get("rollouts_spent", 0),
                "groups_abandoned": st.get("groups_abandoned", 0),
                "rollouts_cum": self.rollouts, "tokens_cum": self.tokens,
                "seconds": report.seconds,
                "seconds_cum": time.perf_counter() - self.start - self.eval_s,
                "generation_s": self.generation_s(), "training_s": self.training_s,
                "ratio_mean": m.get("ratio_mean"), "clip_frac": m.get("clip_frac"),
                "staleness_mean": m.get("staleness_mean"),
                "staleness_max": m.get("staleness_max"),
                "prompt_ids": list(report.prompt_ids),
                "group_mean_rewards": list(report.group_mean_rewards)}

    def _evaluate(self, step: int, seconds_cum: float) -> float | None:
        """Held-out accuracy now (its time is not RL time); recorded and reported. None when
        the evaluator runs elsewhere: :meth:`resolve` fills its record in later."""
        started = time.perf_counter()
        if self.evaluator is not None:
            found = self.evaluator(self.trainer.model, self.trainer.tokenizer)
        else:
            found = {"accuracy": heldout_accuracy(self.trainer.model, self.trainer.tokenizer,
                                                  self.eval_set,
                                                  self.cfg.max_new_tokens)["accuracy"]}
        self.eval_s += time.perf_counter() - started
        record = {"step": step, "rollouts_cum": self.rollouts, "tokens_cum": self.tokens,
                  "seconds_cum": seconds_cum, "generation_s": self.generation_s(),
                  "training_s": self.training_s}
        self.evals.append(record)
        if isinstance(found, concurrent.futures.Future):
            self.pending.append((record, found))
            return None
        record.update(found)
        self.reporter.log_eval(step, {"heldout_accuracy": found["accuracy"],
                                      "rollouts_cum": self.rollouts})
        return found["accuracy"]

    def resolve(self) -> None:
        """Wait for the evaluations that ran elsewhere and fill in their records, in order."""
        for record, found in self.pending:
            record.update(found.result())
            self.reporter.log_eval(record["step"], {"heldout_accuracy": record["accuracy"],
                                                    "rollouts_cum": record["rollouts_cum"]})
        self.pending.clear()

    def generation_s(self) -> float:
        """The engine's generation seconds so far (the hf backend's busy time; 0 for a backend
        that does not measure it)."""
        return float(getattr(self.engine, "busy_s", 0.0))

    def close(self) -> None:
        self.stop.set()
        self.bars.close()
        self.reporter.close()


def _eval_due(cfg: DemoConfig, step: int, rollouts: int, evals: list[dict]) -> bool:
    """Whether the held-out evaluation runs after this step (never after the last one: the
    final evaluation follows RL anyway)."""
    if step >= cfg.rl_steps or (cfg.rollout_budget and rollouts >= cfg.rollout_budget):
        return False
    if cfg.eval_every_rollouts:
        return rollouts // cfg.eval_every_rollouts > evals[-1]["rollouts_cum"] // \
            cfg.eval_every_rollouts
    return bool(cfg.eval_every) and step % cfg.eval_every == 0

"""SFT warm start: teacher-forced training on generated (prompt, reversed answer) pairs.

The loss is the mean negative log-likelihood of the answer tokens (the reversed digits and the
final eos) only; prompt tokens are context. AdamW with linear warm-up, then cosine decay (to
``min_lr_ratio`` × lr) or a constant rate. Dropout is switched off (the data never repeats).

Stopping: after ``max_steps`` optimiser steps or ``max_seconds`` of wall time, whichever comes
first. Given ``max_steps`` the learning-rate schedule runs over steps and the run is deterministic
under ``seed`` (the same losses, bit for bit, on the same machine and thread count;
``max_seconds`` can only stop it earlier). Given only ``max_seconds`` the schedule runs over
elapsed time, so how far it gets depends on the machine.

Speed (tiny 128x3x4 GPT-2, batch 256, ~14 tokens a row, CPU): about 0.17 s a step on 2 idle
cores. On an oversubscribed machine 2 threads collapse (OpenMP threads wait on each other; 2-4 s a
step measured) while 1 thread keeps ~0.4-0.5 s a step: use ``--threads 1`` when the box is shared.

``python -m sara_demo.sft --seconds 240`` builds a fresh tiny policy, runs SFT and prints steps,
tokens/s, greedy held-out accuracy by bucket and the k=8 all-fail/mixed/all-success spread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sara_trainer.policy import completion_logprobs, disable_dropout, make_batch

from .evaluate import greedy_accuracy


@dataclass
class SFTResult:
    steps: int
    seconds: float
    answer_tokens: int                 # tokens the loss was computed on
    total_tokens: int                  # prompt + answer tokens processed
    losses: list[float] = field(default_factory=list)           # one per step
    evals: list[dict[str, Any]] = field(default_factory=list)   # {"step", "seconds", ...acc}

    @property
    def tokens_per_s(self) -> float:
        return self.total_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def final_loss(self) -> float:
        """Mean loss over the last 10% of steps (at least one)."""
        if not self.losses:
            return math.nan
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "seconds": self.seconds, "answer_tokens": self.answer_tokens,
                "total_tokens": self.total_tokens, "tokens_per_s": self.tokens_per_s,
                "final_loss": self.final_loss, "evals": self.evals}


def lr_factor(progress: float, step: int, warmup_steps: int, schedule: str,
              min_lr_ratio: float) -> float:
    """Multiplier on the base learning rate: linear warm-up over steps, then `schedule` over
    `progress` in [0, 1]."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        p = min(max(progress, 0.0), 1.0)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    raise ValueError(f"unknown schedule {schedule!r}; choose constant or cosine")


def sft(model, tokenizer, *, max_steps: int | None = None, max_seconds: float | None = None,
        batch_size: int = 256, lr: float = 3e-3, schedule: str = "cosine",
        warmup_steps: int = 20, min_lr_ratio: float = 0.05, weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.98), grad_clip: float | None = 1.0, seed: int = 0,
        task: str = "arith", buckets: Iterable[str] | None = None,
        bucket_weights: Sequence[float] | None = None,
        pairs: Iterable[tuple[str, str]] | None = None,
        eval_set: Sequence[dict] | None = None, eval_every: int | None = None,
        progress: bool = True, callback: Callable[[int, float], None] | None = None
        ) -> SFTResult:
    """Train `model` in place on (prompt, target completion) pairs; returns an :class:`SFTResult`.

    `pairs` (an iterable of (prompt text, completion text without eos)) overrides the task's
    generated stream (``arith.training_pairs(seed, buckets, bucket_weights)``: held-out problems
    excluded). `eval_set` with `eval_every` records greedy accuracy every that many steps (and at
    the end); that time is not counted in `seconds`. `callback(step, loss)` runs after each step.
    """
    if max_steps is None and max_seconds is None:
        raise ValueError("give max_steps, max_seconds or both")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"unknown schedule {schedule!r}; choose constant or cosine")
    stream = iter(pairs if pairs is not None else _task_pairs(task, seed, buckets,
                                                              bucket_weights))
    torch.manual_seed(seed)
    disable_dropout(model)
    model.train()
    optimizer = _optimizer(model, lr, betas, weight_decay)
    result = SFTResult(steps=0, seconds=0.0, answer_tokens=0, total_tokens=0)
    bar = _Progress(progress, max_steps, max_seconds)
    elapsed, step = 0.0, 0
    evaluate = eval_set is not None and bool(eval_every)
    try:
        while (max_steps is None or step < max_steps) and \
                (max_seconds is None or elapsed < max_seconds):
            started = time.perf_counter()
            done = step / max(1, max_steps) if max_steps is not None else elapsed / max_seconds
            rate = lr * lr_factor(done, step, warmup_steps, schedule, min_lr_ratio)
            value = _train_step(model, tokenizer, optimizer, [next(stream) for _ in
                                                               range(batch_size)],
                                rate, grad_clip, result)
            step += 1
            elapsed += time.perf_counter() - started
            bar.update(step, elapsed, value, rate)
            if callback is not None:
                callback(step, value)
            if evaluate and step % eval_every == 0:
                result.evals.append(_evaluate(model, tokenizer, eval_set, step, elapsed))
                model.train()
    finally:
        bar.close()
        model.eval()
    result.steps, result.seconds = step, elapsed
    if evaluate and (not result.evals or result.evals[-1]["step"] != step):
        result.evals.append(_evaluate(model, tokenizer, eval_set, step, elapsed))
    return result


def _task_pairs(task: str, seed: int, buckets: Iterable[str] | None,
                bucket_weights: Sequence[float] | None) -> Iterable[tuple[str, str]]:
    """The task's generated (prompt, completion) stream, held-out problems excluded."""
    if task != "arith":
        raise ValueError(f"no generated SFT data for task {task!r}; pass pairs")
    from .tasks.arith import training_pairs

    return training_pairs(seed, buckets, bucket_weights)


def _optimizer(model, lr: float, betas: tuple[float, float], weight_decay: float):
    """AdamW with weight decay on matrices only (not on biases, norms or embeddings)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 and "wte" not in name and "wpe" not in name
             else no_decay).append(param)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas)


def _train_step(model, tokenizer, optimizer, pairs: list[tuple[str, str]], rate: float,
                grad_clip: float | None, result: SFTResult) -> float:
    """One optimiser step at learning rate `rate` on the answer tokens' mean NLL; the loss."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    prompt_ids = tokenizer([p for p, _ in pairs])["input_ids"]
    answer_ids = tokenizer([a for _, a in pairs])["input_ids"]
    device = next(model.parameters()).device
    batch = make_batch(prompt_ids, [list(a) + [eos] for a in answer_ids], pad, device)
    for group in optimizer.param_groups:
        group["lr"] = rate
    logp, _ = completion_logprobs(model, batch)
    tokens = batch.completion_mask.sum()
    loss = -logp.sum() / tokens
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    value = float(loss.detach())
    result.losses.append(value)
    result.answer_tokens += int(tokens)
    result.total_tokens += int(batch.attention_mask.sum())
    return value


def _evaluate(model, tokenizer, eval_set, step: int, elapsed: float) -> dict[str, Any]:
    acc = greedy_accuracy(model, tokenizer, eval_set)
    return {"step": step, "seconds": elapsed, "accuracy": acc["accuracy"],
            "by_bucket": acc["by_bucket"]}


class _Progress:
    """A rich progress bar over steps (or seconds), or nothing."""

    def __init__(self, enabled: bool, max_steps: int | None, max_seconds: float | None) -> None:
        self._bar = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._by_steps = max_steps is not None
        total = max_steps if self._by_steps else max_seconds
        self._bar = Progress(TextColumn("[bold]SFT"), BarColumn(),
                             TextColumn("step {task.fields[step]}"),
                             TextColumn("loss {task.fields[loss]:.4f}"),
                             TextColumn("lr {task.fields[lr]:.2e}"),
                             TimeElapsedColumn(), TimeRemainingColumn(), transient=False)
        self._task = self._bar.add_task("sft", total=total, step=0, loss=float("nan"), lr=0.0)
        self._bar.start()

    def update(self, step: int, elapsed: float, loss: float, lr: float) -> None:
        if self._bar is None:
            return
        self._bar.update(self._task, completed=step if self._by_steps else elapsed, step=step,
                         loss=loss, lr=lr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def measure(seconds: float | None = 240.0, steps: int | None = None, seed: int = 0,
            eval_size: int = 1000, spread_size: int = 500, k: int = 8, temperature: float = 1.0,
            out_dir: str | None = None, progress: bool = True, **sft_kwargs: Any
            ) -> dict[str, Any]:
    """Build a fresh tiny policy, warm it up with SFT and report: steps, tokens/s, greedy held-out
    accuracy by bucket, and the all-fail / mixed / all-success spread of k samples per held-out
    prompt at `temperature`. Saves the model to `out_dir` (a checkpoint root) when given."""
    import tempfile

    from sara_trainer.policy import load_policy
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    from .evaluate import group_outcomes
    from .tasks.arith import make_eval_set

    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_policy(tmp, TinyConfig(seed=seed))
        model, tokenizer = load_policy(tmp)
    eval_set = make_eval_set(eval_size, seed=seed)
    result = sft(model, tokenizer, max_steps=steps, max_seconds=seconds, seed=seed,
                 progress=progress, **sft_kwargs)
    accuracy = greedy_accuracy(model, tokenizer, eval_set)
    generator = torch.Generator().manual_seed(seed)
    spread = group_outcomes(model, tokenizer, make_eval_set(spread_size, seed=seed + 1), k=k,
                            temperature=temperature, generator=generator)
    report = {"sft": result.to_dict(), "accuracy": accuracy, "spread": spread}
    if out_dir:
        from sara_trainer.checkpoint import save_checkpoint

        save_checkpoint(out_dir, model, tokenizer, step=0, policy_version=0,
                        extra={"sft": result.to_dict()})
    return report


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sara_demo.sft --seconds 240``: run :func:`measure` and print JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--schedule", default="cosine", choices=("cosine", "constant"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="save the SFT model as a checkpoint root")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.seconds is None and args.steps is None:
        args.seconds = 240.0
    torch.set_num_threads(args.threads)
    report = measure(seconds=args.seconds, steps=args.steps, seed=args.seed,
                     out_dir=args.out, progress=not args.no_progress, lr=args.lr,
                     batch_size=args.batch_size, schedule=args.schedule)
    report["sft"].pop("evals", None)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

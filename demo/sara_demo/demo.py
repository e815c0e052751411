"""``sara demo``: scheduler, worker and trainer end to end on this CPU, nothing downloaded, and
SARA measured against Dynamic Sampling in the same run.

1. **warm start**: the tiny character-level GPT-2 shipped in the package
   (:mod:`sara_demo.warmstart`, checked by SHA-256, so every machine starts from the same
   weights); it imitated arithmetic demonstrations of which a share forget the carry, so greedy
   decoding gets many carry problems wrong while sampling often gets them right. ``sft_steps`` /
   ``sft_seconds`` warm up here instead, ``start_from`` starts from a given checkpoint;
2. evaluate it greedily on held-out problems (**before**);
3. **SARA arm**: the scheduler in-process (``sara_client.alocal``: the real app and Lua scripts on
   an embedded Redis, policy ``sara``) with the arith training prompts in the task's own mix, a
   worker (``WorkerLoop``, ``hf`` backend, or ``vllm`` when asked) and the GRPO trainer, until the
   rollout budget is spent; each step checkpoints and publishes a policy version the worker
   reloads; held-out evaluations along the way;
4. **Dynamic Sampling arm** (unless ``compare`` is off): the same from the same warm start, seed
   and prompts, to the rollouts SARA spent;
5. print the side-by-side table, write ``summary.json`` and ``chart.png``.

The arms are run by :mod:`sara_demo.arms`, one RL phase by :mod:`sara_demo.rl`, the comparison
figures by :mod:`sara_demo.compare`, the held-out evaluation by :mod:`sara_demo.evaluate`, the
prompt pool by :mod:`sara_demo.pool`; :mod:`sara_demo.config` holds :class:`DemoConfig`.

``summary.json`` holds: ``seed``, ``backend``, ``quick``, ``wall_seconds``, ``warm_start``,
``accuracy`` (``before_rl``, ``after_rl`` of the SARA arm, ``n``, standard errors, by bucket),
``rl`` and ``scheduler`` (the SARA arm's trainer and scheduler counters), ``history`` and ``evals``
(the SARA arm's steps and held-out evaluations), ``arms`` (each arm's measured figures and
evaluation curve), and ``comparison`` (DS's final accuracy, the rollouts and tokens SARA needed
to reach it, rollouts per mixed group of each) or, without the DS arm, ``estimate`` (the
scheduler's own estimate of DS's rollouts per mixed group, named as one).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from .config import DemoConfig, make_config, say
from .evaluate import heldout_accuracy
from .pool import prompt_pool

log = logging.getLogger("sara.demo")


def auto_threads() -> int:
    """2 torch threads (this project's 2-core box), or 1 when the machine is already busy:
    OpenMP threads on an oversubscribed CPU wait on each other (10x slower steps measured)."""
    import os

    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0] > cores - 0.5
    except OSError:
        busy = False
    return 1 if busy or cores < 2 else 2


def _quiet() -> None:
    """No per-load tqdm bars from transformers between our own progress bars."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the whole demo; returns the summary (also written to ``out/summary.json``)."""
    import torch

    from .arms import build_summary, run_arms

    started = time.perf_counter()
    deadline = started + cfg.time_budget_s
    _quiet()
    threads = cfg.threads or auto_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    work = _fresh_dir(Path(cfg.out) / "sara-demo-work")
    buckets = list(cfg.buckets) if cfg.buckets else None
    model, tokenizer, start_dir, warm = warm_start(cfg, work, buckets)
    eval_set, before, eval_seconds = _before_rl(cfg, model, tokenizer, buckets)
    prompts, pool_weights = prompt_pool(model, tokenizer, cfg, buckets)
    say(cfg, "    RL prompt pool by bucket: " + ", ".join(
        f"{b} {100 * w:.0f}%" for b, w in pool_weights.items()))
    del model

    torch.set_num_threads(cfg.rl_threads)
    arms = run_arms(cfg, work, start_dir, prompts, eval_set, before, deadline, eval_seconds)
    torch.set_num_threads(threads)
    summary = build_summary(cfg, arms, before, warm, prompts, pool_weights)
    _write(cfg, summary, started)
    return summary


def _fresh_dir(path: Path) -> Path:
    """`path`, emptied (a previous demo's work is deleted)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _before_rl(cfg: DemoConfig, model, tokenizer, buckets: list[str] | None
               ) -> tuple[list[dict], dict[str, Any], float]:
    """The held-out set, the warm start's greedy accuracy on it, and that evaluation's time."""
    from .tasks.arith import make_eval_set

    eval_set = make_eval_set(cfg.eval_size, seed=cfg.seed, buckets=buckets)
    say(cfg, "[bold]2/4 held-out evaluation before RL[/]")
    started = time.perf_counter()
    before = heldout_accuracy(model, tokenizer, eval_set, cfg.max_new_tokens)
    seconds = time.perf_counter() - started
    say(cfg, f"    greedy accuracy {100 * before['accuracy']:.1f}% on {before['n']} problems")
    return eval_set, before, seconds


def _write(cfg: DemoConfig, summary: dict[str, Any], started: float) -> None:
    """chart.png and summary.json (with the wall time) in ``cfg.out``; the table if shown."""
    from .report import plot_chart, print_summary, write_json

    out = Path(cfg.out)
    summary["files"] = {"summary": str(out / "summary.json"), "chart": str(out / "chart.png")}
    plot_chart(summary, out / "chart.png")
    summary["wall_seconds"] = time.perf_counter() - started
    write_json(summary, out / "summary.json")
    if cfg.progress:
        print_summary(summary)
        say(cfg, f"wrote {out / 'summary.json'} and {out / 'chart.png'}")


def warm_start(cfg: DemoConfig, work: Path, buckets: list[str] | None):
    """(model, tokenizer, directory RL starts from, description) of the warm start: a given
    checkpoint (``start_from``), SFT here (``sft_steps`` or ``sft_seconds``), or by default the
    warm start shipped in the package (checked against its SHA-256: the same on every machine)."""
    from sara_trainer.checkpoint import save_checkpoint
    from sara_trainer.policy import load_policy
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    from .sft import sft
    from .warmstart import file_sha256, read_manifest, verified_warmstart

    if cfg.start_from:
        say(cfg, f"[bold]1/4 warm start[/] from {cfg.start_from}")
        model, tokenizer = load_policy(cfg.start_from)
        return model, tokenizer, str(cfg.start_from), {"source": "checkpoint",
                                                        "path": str(cfg.start_from)}
    if cfg.sft_steps is None and cfg.sft_seconds is None:
        directory = verified_warmstart()
        manifest = read_manifest(directory)
        say(cfg, f"[bold]1/4 warm start[/]: the shipped tiny GPT-2 ({manifest['sft']['steps']} "
                  "SFT steps on arith demonstrations, some of which forget the carry; "
                  f"SHA-256 {manifest['sha256']['model.safetensors'][:12]})")
        model, tokenizer = load_policy(directory)
        return model, tokenizer, str(directory), {
            "source": "shipped", "path": str(directory), "sha256": file_sha256(
                directory / "model.safetensors"), "recipe": manifest["recipe"],
            "sft": manifest["sft"]}
    build_tiny_policy(work / "init", TinyConfig(seed=cfg.seed))
    model, tokenizer = load_policy(work / "init")
    length = f"{cfg.sft_steps} steps" if cfg.sft_steps else f"{cfg.sft_seconds:.0f}s"
    say(cfg, f"[bold]1/4 SFT warm start[/] ({length}, tiny GPT-2 "
              f"{sum(p.numel() for p in model.parameters()):,} params)")
    result = sft(model, tokenizer, max_seconds=None if cfg.sft_steps else cfg.sft_seconds,
                 max_steps=cfg.sft_steps, seed=cfg.seed, buckets=buckets, progress=cfg.progress)
    sft_dir = save_checkpoint(work / "sft", model, tokenizer, step=0, policy_version=0,
                              extra={"sft": result.to_dict()})
    return model, tokenizer, str(sft_dir), {"source": "sft", "steps": result.steps,
                                            "seconds": result.seconds,
                                            "final_loss": result.final_loss}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m sara_demo.demo``: the same as ``sara demo``."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sft-seconds", type=float, default=None)
    p.add_argument("--sft-steps", type=int, default=None)
    p.add_argument("--rl-steps", type=int, default=None)
    p.add_argument("--rollouts", type=int, default=None, help="rollout budget of each arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="./sara-demo")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-compare", action="store_true", help="skip the Dynamic Sampling arm")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--start-from", default=None, help="SFT'd checkpoint: skip SFT")
    args = p.parse_args(argv)
    cfg = make_config(args.quick, sft_seconds=args.sft_seconds, sft_steps=args.sft_steps,
                      rl_steps=args.rl_steps, rollout_budget=args.rollouts, seed=args.seed,
                      out=args.out, backend=args.backend, progress=not args.no_progress,
                      compare=not args.no_compare, start_from=args.start_from)
    return run_demo(cfg)


if __name__ == "__main__":
    main()

"""`sara train`: pull effective batches, update the policy, checkpoint and publish."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sara_trainer.config import TrainerConfig

from .common import DEFAULT_URL, LogFormatOpt, LogLevelOpt, UrlOpt, fail, option_values, \
    setup_logging
from .generated import dataclass_flags, with_generated_flags

# the TrainerConfig fields `sara train` presents first, under their own flag names (contracts:
# --steps is max_steps, --estimator advantage_estimator); `extra` only through --set
NAMED = {"model", "checkpoint_dir", "max_steps", "advantage_estimator", "lr", "kl_coef", "seed",
         "checkpoint_every", "publish_every", "device", "dtype", "micro_batch_tokens",
         "gradient_checkpointing", "threads", "extra"}


@with_generated_flags(dataclass_flags(TrainerConfig, skip=NAMED))
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
    log_level: LogLevelOpt = "info",
    log_format: LogFormatOpt = None,
    settings: Annotated[Optional[list[str]], typer.Option(
        "--set", help="A TrainerConfig field as KEY=VALUE, repeatable, after the flags: e.g. "
                      "extra={\"note\": 1} (every other field has its own flag too). Group "
                      "size, batch size and sampling are the scheduler's settings "
                      "(SARA_GROUP_SIZE, ...).")
    ] = None,
    report_to: Annotated[str, typer.Option(
        help="Experiment tracking, comma-separated: tensorboard, wandb, mlflow, jsonl, all or "
             "none (each but jsonl needs its extra; WANDB_MODE=offline works offline).")
    ] = "none",
    logging_dir: Annotated[Path, typer.Option(
        help="Where --report-to backends write (TensorBoard events, metrics.jsonl, ...).")
    ] = Path("./sara-data/runs"),
    run_name: Annotated[Optional[str], typer.Option(
        help="The run's name in W&B / MLflow.")] = None,
    generated: dict[str, Any] | None = None,
) -> None:
    """Pull effective batches, update the policy, checkpoint and publish each new version."""
    setup_logging(log_level, log_format)
    fields = dict(model=model, checkpoint_dir=str(checkpoint_dir), max_steps=steps,
                  advantage_estimator=estimator, lr=lr, kl_coef=kl_coef, seed=seed,
                  checkpoint_every=checkpoint_every, publish_every=publish_every, device=device,
                  dtype=dtype, micro_batch_tokens=micro_batch_tokens,
                  gradient_checkpointing=gradient_checkpointing, threads=threads,
                  **(generated or {}))
    fields.update(option_values(settings or [], "--set"))
    config = _config(fields)
    reporter = _make_reporter(report_to, logging_dir, run_name, config)
    typer.echo(f"sara: trainer {model} -> {url}, checkpoints in {checkpoint_dir}")
    trainer = _run(config, url, token, reporter)
    typer.echo(f"sara: trained to step {trainer.step}, policy v{trainer.version} "
               f"({trainer.checkpoint})")


def _config(fields: dict[str, Any]):
    """The TrainerConfig, or exit 2 naming the bad field."""
    try:
        return TrainerConfig.from_dict(fields)
    except (ValueError, TypeError) as e:
        raise fail(f"sara train: {e}", 2) from None


def _make_reporter(report_to: str, logging_dir: Path, run_name: str | None, config: Any):
    """The --report-to backends, or exit 2 naming the unknown backend or the missing extra."""
    from sara_trainer.tracking import make_reporter

    try:
        return make_reporter(report_to, logging_dir, run_name, config.to_dict())
    except (ValueError, ImportError) as e:
        raise fail(f"sara train: {e}", 2) from None


def _run(config: Any, url: str, token: str | None, reporter: Any):
    """Train to the configured step; a failure is one line (an interrupt exits 130)."""
    from sara_trainer.loop import train as run_training

    try:
        return run_training(config, url, token, on_step=reporter.log_step)
    except KeyboardInterrupt:
        raise fail("sara train: interrupted; the next run resumes from the last checkpoint",
                   130) from None
    except Exception as e:  # connection refused, auth, unloadable model: one line
        raise fail(f"sara train failed: {e}", 1) from None
    finally:
        reporter.close()

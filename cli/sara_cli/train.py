"""`sara train`: pull effective batches, update the policy, checkpoint and publish."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sara_trainer.config import CONFIG_GROUPS, TrainerConfig

from .common import DEFAULT_URL, fail, log_options, option_values, setup_logging, url_option
from .generated import dataclass_flags, with_generated_flags

# contract names: --steps is max_steps, --estimator advantage_estimator; `extra` only via --set
RENAMED = {"max_steps": "--steps", "advantage_estimator": "--estimator"}
PANELS = list(CONFIG_GROUPS.items())
POLICY, RUN = PANELS[0][0], "Run"   # `--model` sits with the policy fields; the run's own
RunUrl = url_option(RUN)
RunLogLevel, RunLogFormat = log_options(RUN)


@with_generated_flags(dataclass_flags(TrainerConfig, skip={"model", "extra"}, groups=PANELS,
                                      options=RENAMED))
def train(
    model: Annotated[str, typer.Option(help="Hugging Face causal LM directory to start from.",
                                       rich_help_panel=POLICY)],
    url: RunUrl = DEFAULT_URL,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar=["SARA_TRAINER_TOKEN", "SARA_TOKEN"],
        help="Trainer bearer token.", rich_help_panel=RUN)] = None,
    log_level: RunLogLevel = "info",
    log_format: RunLogFormat = None,
    settings: Annotated[Optional[list[str]], typer.Option(
        "--set", help="A TrainerConfig field as KEY=VALUE, repeatable, after the flags: e.g. "
                      "extra={\"note\": 1}. Group size, batch size and sampling are the "
                      "scheduler's settings (docs/settings.md).", rich_help_panel=RUN)
    ] = None,
    report_to: Annotated[str, typer.Option(
        help="Experiment tracking, comma-separated: tensorboard, wandb, mlflow, jsonl, all or "
             "none (each but jsonl needs its extra; WANDB_MODE=offline works offline).",
        rich_help_panel=RUN)] = "none",
    logging_dir: Annotated[Path, typer.Option(
        help="Where --report-to backends write (TensorBoard events, metrics.jsonl, ...).",
        rich_help_panel=RUN)] = Path("./sara-data/runs"),
    run_name: Annotated[Optional[str], typer.Option(
        help="The run's name in W&B / MLflow.", rich_help_panel=RUN)] = None,
    generated: dict[str, Any] | None = None,
) -> None:
    """Pull effective batches, update the policy, checkpoint and publish each new version.
    Every TrainerConfig field is a flag; unset ones keep TrainerConfig's default (shown)."""
    setup_logging(log_level, log_format)
    fields = dict(model=model, **(generated or {}))
    fields.update(option_values(settings or [], "--set"))
    config = _config(fields)
    reporter = _make_reporter(report_to, logging_dir, run_name, config)
    typer.echo(f"sara: trainer {model} -> {url}, checkpoints in {config.checkpoint_dir}")
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

"""Experiment tracking: the trainer's step metrics and evaluations sent to TensorBoard, W&B,
MLflow or a JSON-lines file (``sara train --report-to tensorboard,wandb,mlflow,jsonl``, the
``report_to`` convention of transformers and TRL).

One interface, :class:`Reporter`, and one class per backend. Each backend's package is imported
only when that backend is asked for, so the trainer runs with none of them installed. Every
backend works offline: TensorBoard and jsonl write local files, W&B honours ``WANDB_MODE=offline``
(``wandb sync`` uploads later) and MLflow defaults to a file store under the logging directory.

Metric names are grouped by what they describe: ``train/`` (the update: loss, KL, clip fraction,
entropy, staleness, mixed groups ...), ``rollouts/`` (what the batch cost), ``scheduler/`` (the
batch's stats from SARA's scheduler) and ``eval/``. The Dynamic Sampling comparison is an estimate
from audit sampling, not a measurement, and is named so: ``scheduler/ds_estimate/...``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

BACKENDS = ("tensorboard", "wandb", "mlflow", "jsonl")

# which extra installs each backend's package (named in the error when it is missing)
_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}

# the DS comparison is an audit-sampling estimate: its name says so wherever it is charted
_DS_NAMES = {"ds_rollouts_per_effective_group": "ds_estimate/rollouts_per_effective_group",
             "ds_rollouts_per_effective_group_low": "ds_estimate/rollouts_per_effective_group_low",
             "ds_rollouts_per_effective_group_high":
                 "ds_estimate/rollouts_per_effective_group_high"}


def _number(value: Any) -> float | None:
    """A finite float for a loggable value; None for what is not a number (or NaN/inf, which
    some backends refuse and none can chart)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    return None


def step_metrics(report: Any) -> dict[str, float]:
    """The flat ``{name: value}`` of one :class:`~sara_trainer.loop.StepReport`: the update's
    metrics, what the batch cost, and the scheduler's batch stats."""
    out: dict[str, float] = {}
    for key, value in (report.metrics or {}).items():
        if (number := _number(value)) is not None:
            out[f"train/{key}"] = number
    out["train/mean_reward"] = float(report.mean_reward)
    out["train/policy_version"] = float(report.policy_version)
    out["train/step_seconds"] = float(report.seconds)
    out["rollouts/groups"] = float(report.groups)
    out["rollouts/rollouts"] = float(report.rollouts)
    out["rollouts/tokens"] = float(report.tokens)
    out["rollouts/batch_policy_lag"] = float(report.policy_version - report.batch_policy_version)
    for key, value in (report.batch_stats or {}).items():
        if (number := _number(value)) is not None:
            out[f"scheduler/{_DS_NAMES.get(key, key)}"] = number
    return {k: v for k, v in out.items() if math.isfinite(v)}


def _flat_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Hyper-parameters as scalars (what W&B, MLflow and TensorBoard's text accept)."""
    flat: dict[str, Any] = {}
    for key, value in (config or {}).items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{k}": v for k, v in _flat_config(value).items()})
        else:
            flat[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


class Reporter:
    """One tracking backend. Subclasses implement :meth:`log`; the rest has defaults."""

    name = "reporter"

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at training step ``step``."""
        raise NotImplementedError

    def log_step(self, report: Any) -> None:
        """Record one trainer step (a ``StepReport``): usable as ``Trainer(on_step=...)``."""
        self.log(report.step, step_metrics(report))

    def log_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record an evaluation at ``step``; names get the ``eval/`` prefix."""
        self.log(step, {(k if k.startswith("eval/") else f"eval/{k}"): v
                        for k, v in metrics.items() if _number(v) is not None})

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Record the run's hyper-parameters once, at the start (default: nothing)."""

    def close(self) -> None:
        """Flush and release the backend (default: nothing)."""


class JsonlReporter(Reporter):
    """One JSON object a line: ``{"step", "time", "kind", "metrics"}`` (no extra needed)."""

    name = "jsonl"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def _write(self, kind: str, step: int, payload: Mapping[str, Any]) -> None:
        line = {"step": step, "time": time.time(), "kind": kind, "metrics": dict(payload)}
        self._file.write(json.dumps(line, sort_keys=True) + "\n")
        # flushed every line: a crashed run keeps every step it finished
        self._file.flush()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._write("metrics", step, {k: float(v) for k, v in metrics.items()})

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._write("config", 0, _flat_config(config))

    def close(self) -> None:
        self._file.close()


class TensorBoardReporter(Reporter):
    """Scalars in TensorBoard event files under ``log_dir`` (``tensorboard --logdir``)."""

    name = "tensorboard"

    def __init__(self, log_dir: str | Path) -> None:
        writer_class = _import_tensorboard_writer()
        self.log_dir = Path(log_dir)
        self.writer = writer_class(log_dir=str(self.log_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, float(value), global_step=step)
        self.writer.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = "\n".join(f"    {k} = {v}" for k, v in sorted(_flat_config(config).items()))
        self.writer.add_text("config", text, global_step=0)

    def close(self) -> None:
        self.writer.close()


def _import_tensorboard_writer():
    """torch's SummaryWriter (the trainer has torch), which needs the tensorboard package."""
    try:
        import tensorboard  # noqa: F401  (torch.utils.tensorboard fails later without it)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise _missing("tensorboard", e) from None
    return SummaryWriter


class WandbReporter(Reporter):
    """A Weights & Biases run; ``WANDB_MODE=offline`` keeps it on disk (``wandb sync`` later)."""

    name = "wandb"

    def __init__(self, log_dir: str | Path, run_name: str | None = None,
                 project: str | None = None) -> None:
        try:
            import wandb
        except ImportError as e:
            raise _missing("wandb", e) from None
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT", "sara"),
                              name=run_name, dir=str(log_dir), reinit=True)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(_flat_config(config), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


class MlflowReporter(Reporter):
    """An MLflow run; without ``MLFLOW_TRACKING_URI`` a file store under ``log_dir/mlruns``."""

    name = "mlflow"

    def __init__(self, log_dir: str | Path, run_name: str | None = None,
                 experiment: str | None = None) -> None:
        try:
            import mlflow
        except ImportError as e:
            raise _missing("mlflow", e) from None
        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # a local file store needs no server or database (mlflow-skinny has no SQLAlchemy);
            # MLflow 3 refuses it unless told that is intended
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((Path(log_dir).resolve() / "mlruns").as_uri())
        mlflow.set_experiment(experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", "sara"))
        self.run = mlflow.start_run(run_name=run_name)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        # MLflow caps a parameter's value at a few hundred characters
        self.mlflow.log_params({k: str(v)[:250] for k, v in _flat_config(config).items()})

    def close(self) -> None:
        self.mlflow.end_run()


class MultiReporter(Reporter):
    """Several reporters as one: each call goes to every backend."""

    name = "multi"

    def __init__(self, reporters: Iterable[Reporter]) -> None:
        self.reporters = list(reporters)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for r in self.reporters:
            r.log(step, metrics)

    def log_config(self, config: Mapping[str, Any]) -> None:
        for r in self.reporters:
            r.log_config(config)

    def close(self) -> None:
        for r in self.reporters:
            r.close()


def _missing(backend: str, error: ImportError) -> ImportError:
    return ImportError(f"--report-to {backend} needs the {backend} package: "
                       f"pip install 'sara-rollout[{_EXTRAS[backend]}]' ({error})")


def parse_report_to(value: str | Iterable[str] | None) -> list[str]:
    """``"tensorboard,jsonl"`` (or a list) as backend names; ``none``/empty is no backend and
    ``all`` is every one. Unknown names are a ValueError."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    names = [n.strip().lower() for n in items if n.strip()]
    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return list(BACKENDS)
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise ValueError(f"unknown --report-to backend(s) {', '.join(unknown)}: "
                         f"choose from {', '.join(BACKENDS)}, all or none")
    return list(dict.fromkeys(names))


def make_reporter(report_to: str | Iterable[str] | None, log_dir: str | Path,
                  run_name: str | None = None,
                  config: Mapping[str, Any] | None = None) -> MultiReporter:
    """The reporters ``report_to`` names, writing under ``log_dir`` (TensorBoard events in
    ``log_dir/tensorboard``, ``log_dir/metrics.jsonl``, W&B's and MLflow's local stores), with
    ``config`` recorded as the run's hyper-parameters."""
    log_dir = Path(log_dir)
    made: list[Reporter] = []
    try:
        for name in parse_report_to(report_to):
            made.append(_build(name, log_dir, run_name))
    except BaseException:
        MultiReporter(made).close()     # don't leave a W&B run open behind a failed import
        raise
    reporter = MultiReporter(made)
    if config:
        reporter.log_config(config)
    return reporter


def _build(name: str, log_dir: Path, run_name: str | None) -> Reporter:
    if name == "tensorboard":
        return TensorBoardReporter(log_dir / "tensorboard")
    if name == "jsonl":
        return JsonlReporter(log_dir / "metrics.jsonl")
    if name == "wandb":
        return WandbReporter(log_dir, run_name)
    return MlflowReporter(log_dir, run_name)

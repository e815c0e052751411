"""Experiment tracking (`sara_trainer.tracking`, `sara train --report-to`): the real trainer logs
to TensorBoard and jsonl, and the event files read back (tensorboard's EventAccumulator) hold the
values the trainer reported. W&B (offline) and MLflow (a local file store) run when installed, else
skip with why; under CI, which installs both (.ci/run), a missing one fails (tests/_need.py)."""

from __future__ import annotations

import json
import math
import sys

import pytest

from sara_trainer.tracking import (
    JsonlReporter, Reporter, make_reporter, parse_report_to, step_metrics,
)
from tests._need import need


def _read_tensorboard(log_dir) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar in the event files under log_dir."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_parse_report_to_follows_the_transformers_convention():
    assert parse_report_to("tensorboard, jsonl") == ["tensorboard", "jsonl"]
    assert parse_report_to("none") == parse_report_to("") == parse_report_to(None) == []
    assert parse_report_to("all") == ["tensorboard", "wandb", "mlflow", "jsonl"]
    assert parse_report_to(["jsonl", "jsonl"]) == ["jsonl"]
    with pytest.raises(ValueError, match="unknown --report-to backend"):
        parse_report_to("tensorboard,comet")


def test_a_missing_backend_names_its_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)     # import wandb -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'sara-rollout\[wandb\]'"):
        make_reporter("jsonl,wandb", tmp_path)


def test_eval_metrics_get_their_prefix_and_jsonl_keeps_every_line(tmp_path):
    reporter = make_reporter("jsonl", tmp_path, config={"lr": 1e-3, "extra": {"a": 1}})
    reporter.log_eval(5, {"accuracy": 0.75, "note": "not a number"})
    reporter.close()
    config, evals = _read_jsonl(tmp_path / "metrics.jsonl")
    assert config["kind"] == "config" and config["metrics"] == {"lr": 1e-3, "extra.a": 1}
    assert (evals["step"], evals["metrics"]) == (5, {"eval/accuracy": 0.75})
    assert isinstance(Reporter(), Reporter) and JsonlReporter.name == "jsonl"


@pytest.fixture()
def trained(tiny_dir, tmp_path):
    """Two real trainer steps against the in-process scheduler, reported to TensorBoard and
    jsonl; returns (the StepReports, the logging dir)."""
    pytest.importorskip("tensorboard")
    from tests.trainer.test_loop import ScriptedWorker, _config, _local, _prompts

    from sara_trainer.loop import Trainer

    reporter = make_reporter("tensorboard,jsonl", tmp_path / "runs", config={"k": 4})
    reports = []

    def on_step(report):
        reports.append(report)
        reporter.log_step(report)

    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara).fill()
        Trainer(sara, _config(tiny_dir, tmp_path), on_step=on_step).run(timeout_s=5)
    reporter.log_eval(2, {"accuracy": 0.5})
    reporter.close()
    return reports, tmp_path / "runs"


def test_tensorboard_events_hold_what_the_trainer_logged(trained):
    reports, runs = trained
    assert [r.step for r in reports] == [1, 2]
    scalars = _read_tensorboard(runs / "tensorboard")
    for report in reports:
        expected = step_metrics(report)
        for tag in ("train/loss", "train/kl", "train/clip_frac", "train/entropy",
                    "train/staleness_mean", "train/groups_mixed", "train/mean_reward",
                    "rollouts/rollouts", "rollouts/tokens", "scheduler/rollouts_spent",
                    "scheduler/groups_committed"):
            assert scalars[tag][report.step] == pytest.approx(expected[tag], rel=1e-6), tag
        assert scalars["train/loss"][report.step] == pytest.approx(report.loss, rel=1e-6)
        assert scalars["rollouts/rollouts"][report.step] == report.rollouts
        ds = report.batch_stats.get("ds_rollouts_per_effective_group")
        if ds is not None:   # an estimate from audit sampling, named so
            tag = "scheduler/ds_estimate/rollouts_per_effective_group"
            assert scalars[tag][report.step] == pytest.approx(ds, rel=1e-6)
        # every finite number the trainer reported reached TensorBoard
        assert {t for t in expected} <= set(scalars)
    assert scalars["eval/accuracy"] == {2: 0.5}


def test_jsonl_holds_the_same_values(trained):
    reports, runs = trained
    lines = [x for x in _read_jsonl(runs / "metrics.jsonl") if x["kind"] == "metrics"]
    assert [x["step"] for x in lines] == [1, 2, 2]
    for report, line in zip(reports, lines):
        assert line["metrics"] == pytest.approx(step_metrics(report))
        assert math.isfinite(line["metrics"]["train/loss"])
    assert lines[-1]["metrics"] == {"eval/accuracy": 0.5}


def test_sara_train_report_to_writes_tensorboard_and_jsonl(tiny_dir, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from sara_cli import main as cli
    from tests.trainer.test_loop import ScriptedWorker, _local, _prompts, route_client_to
    from typer.testing import CliRunner

    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara).fill()

        route_client_to(monkeypatch, sara)
        result = CliRunner().invoke(cli.app, [
            "train", "--model", str(tiny_dir), "--url", "http://scheduler:9",
            "--checkpoint-dir", str(tmp_path / "ck"), "--steps", "2", "--threads", "1",
            "--set", "batch_wait_s=0",
            "--report-to", "tensorboard,jsonl", "--logging-dir", str(tmp_path / "runs")])
        assert result.exit_code == 0, result.output
    lines = _read_jsonl(tmp_path / "runs" / "metrics.jsonl")
    assert lines[0]["kind"] == "config" and lines[0]["metrics"]["max_steps"] == 2
    steps = [x for x in lines if x["kind"] == "metrics"]
    assert [x["step"] for x in steps] == [1, 2]
    scalars = _read_tensorboard(tmp_path / "runs" / "tensorboard")
    assert scalars["train/loss"] == {x["step"]: pytest.approx(x["metrics"]["train/loss"])
                                     for x in steps}


def test_sara_train_report_to_refuses_an_unknown_backend(tmp_path):
    from sara_cli import main as cli
    from typer.testing import CliRunner

    result = CliRunner().invoke(cli.app, ["train", "--model", str(tmp_path),
                                          "--report-to", "comet"])
    assert result.exit_code == 2 and "unknown --report-to backend(s) comet" in result.output


def test_wandb_offline_run(tmp_path, monkeypatch):
    need("wandb", "wandb is not installed (pip install 'sara-rollout[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    reporter = make_reporter("wandb", tmp_path, run_name="t", config={"lr": 0.1})
    reporter.log(1, {"train/loss": 0.5})
    reporter.log_eval(1, {"accuracy": 0.25})
    reporter.close()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


def test_mlflow_file_store_run(tmp_path, monkeypatch):
    need("mlflow", "mlflow is not installed (pip install 'sara-rollout[mlflow]')")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # the reporter opts in to MLflow 3's file store itself; set-then-delete restores it after
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    reporter = make_reporter("mlflow", tmp_path, run_name="t", config={"lr": 0.1})
    reporter.log(1, {"train/loss": 0.5})
    reporter.log(2, {"train/loss": 0.25})
    reporter.close()
    import mlflow

    client = mlflow.tracking.MlflowClient((tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("sara").experiment_id])
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
    assert run.data.params["lr"] == "0.1"

"""`sara worker --gpu-memory-utilization` reaches the vllm backend's engine options, and `sara
train`'s GPU flags reach the TrainerConfig (both without starting anything)."""

from __future__ import annotations

from typer.testing import CliRunner

import sara_worker.process
from sara_cli import main as cli
from tests._need import need

runner = CliRunner()


def _capture_worker(monkeypatch) -> dict:
    seen: dict = {}

    def fake_main(backend, options, config, url, token, *, fit_capacity=False):
        seen.update(backend=backend, options=options, config=config, fit=fit_capacity)
        raise KeyboardInterrupt   # stop before any network

    monkeypatch.setattr(sara_worker.process, "main", fake_main)
    return seen


def test_gpu_memory_utilization_flag_and_env(monkeypatch):
    seen = _capture_worker(monkeypatch)
    runner.invoke(cli.app, ["worker", "--backend", "vllm", "--model", "m",
                            "--gpu-memory-utilization", "0.3"])
    assert seen["options"]["gpu_memory_utilization"] == 0.3
    seen.clear()
    runner.invoke(cli.app, ["worker", "--backend", "vllm", "--model", "m"],
                  env={"SARA_VLLM_GPU_MEMORY_UTILIZATION": "0.45"})
    assert seen["options"]["gpu_memory_utilization"] == 0.45
    seen.clear()
    runner.invoke(cli.app, ["worker", "--backend", "sim"],
                  env={"SARA_VLLM_GPU_MEMORY_UTILIZATION": "0.45"})
    assert "gpu_memory_utilization" not in seen["options"]   # only vllm takes it


def test_capacity_is_fitted_to_the_engine_unless_given(monkeypatch):
    seen = _capture_worker(monkeypatch)
    runner.invoke(cli.app, ["worker", "--backend", "vllm", "--model", "m"])
    assert seen["fit"] is True and seen["config"].capacity == 64   # replaced once it starts
    seen.clear()
    runner.invoke(cli.app, ["worker", "--backend", "vllm", "--model", "m", "--capacity", "32"])
    assert seen["fit"] is False and seen["config"].capacity == 32
    assert seen["config"].lease_min == 8


def trained_config(monkeypatch, args: list[str]):
    """The TrainerConfig `sara train ARGS` builds, caught before training starts."""
    need("torch", "torch (the trainer extra; CI installs it)")
    import sara_trainer.loop as loop

    seen = {}

    def fake_train(config, url, token, on_step=None):
        seen["config"] = config
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", fake_train)
    runner.invoke(cli.app, ["train", *args])
    return seen["config"]


def test_train_gpu_flags_reach_the_config(monkeypatch):
    config = trained_config(monkeypatch, ["--model", "m", "--micro-batch-tokens", "4096",
                                          "--gradient-checkpointing", "--dtype", "bfloat16"])
    assert (config.device, config.dtype) == ("auto", "bfloat16")
    assert config.micro_batch_tokens == 4096 and config.gradient_checkpointing
    assert (config.checkpoint_every, config.publish_every) == (10, 1)

"""`docker compose up` does real work by default: Qwen2.5-0.5B-Instruct, GSM8K through
the one-shot loader, GRPO with k = 8 under SARA, the trainer on the GPU next to a vLLM worker that
leaves it room; the README's line works because scripts/init_env.py writes the tokens."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.deploy.test_compose import (ENV_EXAMPLE, ROOT, TOKEN_VARS,  # noqa: F401
                                       compose, cpu, gpu, project, project_dir, resolved,
                                       run_compose, tokens)

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _sets(command: list[str]) -> dict[str, str]:
    return dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--set")


def test_worker_and_trainer_default_to_qwen_on_one_gpu(gpu):
    worker, trainer = gpu["services"]["worker"], gpu["services"]["trainer"]
    assert _flag(worker["command"], "--model") == MODEL
    assert _flag(trainer["command"], "--model") == MODEL
    assert float(worker["environment"]["SARA_VLLM_GPU_MEMORY_UTILIZATION"]) <= 0.35
    cmd = trainer["command"]
    assert _flag(cmd, "--device") == "cuda" and _flag(cmd, "--estimator") == "grpo"
    assert "--gradient-checkpointing" in cmd and int(_flag(cmd, "--micro-batch-tokens")) > 0
    # group size, batch size and sampling are the scheduler's alone: the trainer sets none
    assert not {"k", "batch_groups", "max_new_tokens", "temperature"} & set(_sets(cmd))
    for service in (worker, trainer):
        mounts = {v["target"] for v in service["volumes"]}
        assert "/home/sara/.cache/huggingface" in mounts


def test_scheduler_runs_sara_with_groups_of_eight(gpu):
    env = gpu["services"]["scheduler"]["environment"]
    assert env.get("SARA_POLICY") == "sara" and env.get("SARA_GROUP_SIZE") == "8"


def test_loader_registers_gsm8k_once(gpu):
    loader = gpu["services"]["loader"]
    assert loader["command"] == ["load", "openai/gsm8k", "--split", "train", "--recipe", "gsm8k"]
    assert loader["restart"].startswith("on-failure")
    assert loader["build"]["dockerfile"] == "docker/Dockerfile.scheduler"


def test_cpu_profile_trainer_stays_on_the_cpu(cpu):
    assert _flag(cpu["services"]["trainer-cpu"]["command"], "--device") == "cpu"


def test_init_env_then_compose_config_works(compose, tmp_path):
    """The README line: init_env.py writes the tokens, then compose accepts the project."""
    directory = project_dir(tmp_path, None)
    (directory / ".env.example").write_text(ENV_EXAMPLE.read_text())
    script = ROOT / "scripts" / "init_env.py"
    for _ in range(2):   # a second run keeps the tokens
        out = subprocess.run([sys.executable, str(script), "--env-file", str(directory / ".env"),
                              "--example", str(directory / ".env.example")],
                             capture_output=True, text=True, timeout=60, check=True)
        assert ".env" in out.stdout
    text = (directory / ".env").read_text()
    values = [re.search(rf"^{v}=(\S+)$", text, re.M).group(1) for v in TOKEN_VARS]
    assert len(set(values)) == 4 and all(len(v) >= 32 for v in values)
    assert (directory / ".env").stat().st_mode & 0o077 == 0
    out = run_compose(compose, directory, "config", "-q")
    assert out.returncode == 0, out.stderr


def test_readme_compose_line_runs_init_env():
    readme = (ROOT / "README.md").read_text()
    assert "python3 scripts/init_env.py && docker compose up" in readme


@pytest.mark.parametrize("doc", ["docs/gpu.md"])
def test_gpu_doc_has_the_memory_split_table(doc):
    text = (ROOT / doc).read_text()
    for needle in ("24 GB", "40 GB", "80 GB", "1.5B", "3B", "gpu_memory_utilization"):
        assert needle in text, needle

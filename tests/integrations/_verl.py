"""What the verl tests share: verl's config composed from the recipe's YAML (examples/verl), a
tiny Llama policy with a character tokenizer (built here, nothing downloaded), GSM8K-style
prompts, a real `sara worker` process, and the stand-in for verl's rollout server.

The stand-in server is the one part that is not verl's: verl 0.9.1 starts its vLLM server only
on a GPU (its resource pools ask Ray for GPU bundles, and its workers open an NCCL process
group; docs/integration.md, section 6, has the measured errors). It answers verl's
``generate(prompt_ids, sampling_params, request_id, ...)`` with a ``TokenOutput`` and
``abort_request(request_id)`` as vLLMHttpServer does; verl's own load balancer and client call it.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ray
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "verl"
K = 4
# GSM8K's answer line needs '#', which the tiny tokenizer's default characters lack
CHARSET = "0123456789+-*/=()<>., ?:#abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
# GSM8K-style chat prompts: verl's GSM8K scorer grades them in colocated mode (``data_source``),
# a `sara worker` scores them with its sim verifier (task ``sim``, even odds) in separate mode
PROMPTS = [{"id": f"q{i}", "prompt": [{"role": "user", "content": f"{i}+{i}="}],
            "answer": str(2 * i), "task": "sim",
            "meta": {"p_success": 0.5, "data_source": "openai/gsm8k"}} for i in range(30)]


def tiny_llama(out: Path) -> Path:
    """A freshly initialised two-layer Llama and its character tokenizer, saved to ``out`` (a
    Llama, not a Qwen2: verl's Qwen prompt builder needs Qwen's own special tokens)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sara_trainer.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer(CHARSET)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def verl_config(recipe: str, url: str, model: Path, *overrides: str) -> Any:
    """verl's config as ``main_ppo --config-path examples/verl --config-name recipe`` composes
    it, pointed at this SARA and the tiny policy, resolved as verl's TaskRunner resolves it."""
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        cfg = compose(config_name=recipe, overrides=[
            f"trainer.v1.sampler.sampler_kwargs.url={url}",
            f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.rollout.n={K}",
            "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.response_length=16", "trainer.device=cpu", *overrides])
    OmegaConf.resolve(cfg)
    return cfg


class SaraWorker:
    """A real ``sara worker --backend hf`` on the tiny policy, as a subprocess (separate mode):
    it generates real token ids and logprobs; the prompts' task ``sim`` scores each with the
    worker's own sim verifier, reward 1 with ``meta.p_success`` = 0.5."""

    def __init__(self, url: str, model: Path, log_path: Path, worker_id: str = "fleet-0") -> None:
        self.cmd = [sys.executable, "-m", "sara_cli", "worker", "--backend", "hf", "--model",
                    str(model), "--url", url, "--worker-id", worker_id, "--capacity", "16",
                    "--lease-wait", "0.5", "--seed", "0", "--log-level", "warning"]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> SaraWorker:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
        env["PYTHONPATH"] = os.pathsep.join(sys.path)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@ray.remote
class StandInServer:
    """Stands in for verl's vLLMHttpServer (GPU only): GSM8K-style answers, right or wrong by
    coin flip; a prompt listed in ``hold`` generates until ``abort_request`` (then 'aborted', as
    vLLM reports it); one listed in ``fail`` raises, as an engine error does."""

    def __init__(self, model: str, seed: int = 0) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.rng = random.Random(seed)
        self.hold: set[str] = set()
        self.fail: set[str] = set()
        self.aborts: dict[str, asyncio.Event] = {}
        self.seen: list[str] = []
        self.held: list[str] = []
        self.failed: list[str] = []
        self.aborted: list[str] = []

    def configure(self, hold: list[str], fail: list[str]) -> None:
        self.hold, self.fail = set(hold), set(fail)

    def calls(self) -> dict[str, list[str]]:
        """Request ids: every one seen, those held until aborted, those failed, those aborted."""
        return {"seen": list(self.seen), "held": list(self.held), "failed": list(self.failed),
                "aborted": list(self.aborted)}

    async def generate(self, prompt_ids: list[int], sampling_params: dict, request_id: str,
                       **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.seen.append(request_id)
        question = re.search(r"(\d+)\+(\d+)=", self.tokenizer.decode(prompt_ids))
        if question.group(0) in self.fail:
            self.failed.append(request_id)
            raise RuntimeError("engine failure (stand-in)")
        if question.group(0) in self.hold:
            self.held.append(request_id)
            event = self.aborts.setdefault(request_id, asyncio.Event())
            await event.wait()
            return TokenOutput(token_ids=[], stop_reason="aborted",
                               extra_fields={"global_steps": 0})
        right = int(question.group(1)) + int(question.group(2))
        answer = right if self.rng.random() < 0.5 else right + 1
        ids = self.tokenizer.encode(f"#### {answer}") + [self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.25] * len(ids), stop_reason="completed",
                           extra_fields={"global_steps": 0})

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        self.aborted.append(request_id)
        event = self.aborts.get(request_id)
        if event is None:
            return {"aborted": False, "request_id": request_id}
        event.set()
        return {"aborted": True, "request_id": request_id}

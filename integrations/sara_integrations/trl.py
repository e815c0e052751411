"""SARA inside TRL's GRPOTrainer: SARA picks the prompts and how many samples each gets,
abandons saturated groups early, and TRL trains on the effective groups it delivers.

    from sara_client import local
    from sara_integrations.trl import SaraGRPOTrainer, reward_from

    with local(group_size=4, batch_size=2, tau_low=0.5) as sara:
        sara.add_prompts(prompts)                      # SARA owns the prompts
        trainer = SaraGRPOTrainer(sara, model=..., reward_funcs=[my_reward],
                                  args=GRPOConfig(num_generations=4, ...),
                                  train_dataset=SaraGRPOTrainer.step_dataset(100))
        trainer.train()

Supports TRL 1.16.x only (`SUPPORTED_TRL`): it overrides GRPOTrainer's private
`_generate_and_score_completions`, whose shape moves between releases, so importing it under any
other TRL raises ImportError saying so (pip install 'trl>=1.16,<1.17'). What it
does not do yet: vLLM generation (it samples with `model.generate`, one rollout at a time),
multi-process training, and behaviour log-probs (the update is on-policy: generation and the
step use the same weights, so TRL's own `per_token_logps.detach()` is exact).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import trl
from trl import GRPOTrainer

SUPPORTED_TRL = ("1.16",)  # major.minor releases the adapter was checked against
HOOK = "_generate_and_score_completions"  # the private GRPOTrainer method it overrides


def check_trl(version: str, trainer: type) -> None:
    """ImportError naming the supported releases unless TRL `version` is one of them and its
    GRPOTrainer still has the method this adapter overrides."""
    if ".".join(version.split(".")[:2]) not in SUPPORTED_TRL or not callable(
            getattr(trainer, HOOK, None)):
        raise ImportError(
            f"sara_integrations.trl supports TRL {', '.join(SUPPORTED_TRL)}.x only (it "
            f"overrides GRPOTrainer.{HOOK}, private in TRL); found TRL {version}: "
            "pip install 'trl>=1.16,<1.17'")


check_trl(trl.__version__, GRPOTrainer)

LEASE_SIZE = 16  # rollouts per lease: small, so cancels of abandoned groups land between leases


def reward_from(fn: Callable[..., list[float]]) -> Callable[[Any], float]:
    """A TRL reward function (prompts=, completions=, answer=) as a per-rollout scorer."""
    def score(rollout: Any, completion: str) -> float:
        out = fn(prompts=[rollout.prompt], completions=[completion], answer=[rollout.answer])
        return float(out[0] if out and out[0] is not None else 0.0)
    return score


class SaraGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generation batches come from a SARA client (`local()` or SaraClient).

    `num_generations` must equal SARA's group size; each generation batch is
    `generation_batch_size // num_generations` groups of one SARA batch.
    """

    def __init__(self, sara: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sara = sara
        self.sara_version = sara.get_policy().version
        self._scorers = [reward_from(f) for f in self.reward_funcs]

    @staticmethod
    def step_dataset(steps: int) -> Any:
        """A placeholder dataset: TRL's sampler needs one, but SARA chooses the prompts."""
        from datasets import Dataset
        return Dataset.from_dict({"prompt": [""] * max(1, steps)})

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        groups = max(1, len(inputs) // self.num_generations)
        self._publish()  # the weights about to generate are a new version
        batch = self._fill_until_batch(groups)
        rows = [(g.prompt, r) for g in batch.groups for r in g.rollouts]
        out = self._tensors(rows, [len(g.rollouts) for g in batch.groups])
        self.sara.ack(batch.batch_id)
        return out

    def _publish(self) -> None:
        self.sara_version += 1
        self.sara.publish_policy(self.sara_version, f"trl-step-{self.state.global_step}")

    def _fill_until_batch(self, groups: int) -> Any:
        """Lease, generate, score and report until SARA delivers a batch of `groups` groups."""
        worker = "trl-trainer"
        while (batch := self.sara.next_batch(size=groups)) is None:
            lease = self.sara.lease(worker, max_rollouts=LEASE_SIZE)
            if not lease.rollouts:
                raise RuntimeError("SARA leased nothing and has no batch: add prompts, or "
                                   "resume the run (sara run resume)")
            results = [self._rollout(r) for r in lease.rollouts]
            self.sara.report(worker, results)
        return batch

    @torch.no_grad()
    def _rollout(self, rollout: Any) -> dict[str, Any]:
        """One sampled completion and its reward, as a SARA result."""
        tok = self.processing_class
        ids = tok(rollout.prompt, return_tensors="pt").input_ids.to(self.accelerator.device)
        model = self.accelerator.unwrap_model(self.model)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=self.temperature, max_new_tokens=self.max_completion_length,
                             pad_token_id=tok.pad_token_id or tok.eos_token_id)
        completion_ids = gen[0, ids.shape[1]:].tolist()
        text = tok.decode(completion_ids, skip_special_tokens=True)
        reward = sum(score(rollout, text) for score in self._scorers)
        return {"rollout_id": rollout.rollout_id, "reward": reward, "completion": text,
                "token_ids": completion_ids, "completion_tokens": len(completion_ids),
                "policy_version": self.sara_version}

    def _tensors(self, rows: list[tuple[str, Any]], sizes: list[int]) -> dict[str, Any]:
        """TRL's generation-batch dict: left-padded prompts, right-padded completions, and
        group-normalised advantages over each SARA group."""
        tok, device = self.processing_class, self.accelerator.device
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        prompts = [tok(p).input_ids for p, _ in rows]
        comps = [list(r.token_ids or [pad]) for _, r in rows]
        plen, clen = max(map(len, prompts)), max(map(len, comps))
        prompt_ids = torch.tensor([[pad] * (plen - len(p)) + p for p in prompts], device=device)
        prompt_mask = torch.tensor([[0] * (plen - len(p)) + [1] * len(p) for p in prompts],
                                   device=device)
        completion_ids = torch.tensor([c + [pad] * (clen - len(c)) for c in comps], device=device)
        completion_mask = torch.tensor([[1] * len(c) + [0] * (clen - len(c)) for c in comps],
                                       device=device)
        rewards = torch.tensor([r.reward for _, r in rows], dtype=torch.float32, device=device)
        return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
                "completion_ids": completion_ids, "completion_mask": completion_mask,
                "advantages": _group_advantages(rewards, sizes),
                "num_items_in_batch": completion_mask.sum()}


def _group_advantages(rewards: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """(r - group mean) / (group std + 1e-4) per group, as GRPO computes them."""
    parts, start = [], 0
    for n in sizes:
        r = rewards[start:start + n]
        parts.append((r - r.mean()) / (r.std() + 1e-4))
        start += n
    return torch.cat(parts)

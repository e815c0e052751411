"""SARA inside TRL's GRPOTrainer, through TRL's public API: SARA picks the prompts and how many
samples each gets, abandons saturated groups early, and TRL trains on the effective groups it
delivers.

    from sara_client import local
    from sara_integrations.trl import SaraGRPOTrainer

    with local(group_size=4, batch_size=2, tau_low=0.5) as sara:
        sara.add_prompts(prompts)                      # SARA owns the prompts
        trainer = SaraGRPOTrainer(sara, model=..., reward_funcs=[my_reward],
                                  args=GRPOConfig(num_generations=4, ...),
                                  train_dataset=SaraGRPOTrainer.step_dataset(100))
        trainer.train()

How: GRPOTrainer's constructor takes a `rollout_func` (`SaraRollouts`), which TRL calls for
each generation batch with the prompts its sampler drew. Here those prompts are placeholders
(`step_dataset`: SARA owns the prompts): the function leases from SARA, generates with the
trainer's model, scores with `reward_funcs` and reports, until SARA delivers a batch of as many
groups as TRL asked for, and returns that batch's prompt and completion token ids, the
sampling log-probs and each rollout's reward (`sara_reward`). TRL's only reward function is then
`sara_reward`, which hands those rewards back, and TRL's own code computes the group-normalised
advantages over each block of `num_generations` rows, the loss and the logging. Nothing private
of TRL is touched; `SaraGRPOTrainer` is GRPOTrainer with those two arguments filled in.

Supports TRL 1.16.x (`SUPPORTED_TRL`), checked against 1.16.0: TRL marks `rollout_func`
experimental, so importing this module under another release, or a 1.16 whose GRPOTrainer takes
no `rollout_func`, raises ImportError saying so (pip install 'trl>=1.16,<1.17'). What it does
not do yet: vLLM generation (it samples with `model.generate`, one rollout at a time),
multi-process training, and SARA's `commit=partial` (TRL needs `num_generations` rows a group).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import trl
from trl import GRPOTrainer

SUPPORTED_TRL = ("1.16",)  # major.minor releases the adapter was checked against
HOOK = "rollout_func"      # the GRPOTrainer constructor argument it fills in
REWARD_FIELD = "sara_reward"  # the extra field TRL forwards to the reward function

LEASE_SIZE = 16  # rollouts per lease: small, so cancels of abandoned groups land between leases


def check_trl(version: str, trainer: type) -> None:
    """ImportError naming the supported releases unless TRL `version` is one of them and its
    GRPOTrainer takes the constructor argument this adapter fills in."""
    try:
        takes_hook = HOOK in inspect.signature(trainer.__init__).parameters
    except (TypeError, ValueError):
        takes_hook = False
    if ".".join(version.split(".")[:2]) not in SUPPORTED_TRL or not takes_hook:
        raise ImportError(
            f"sara_integrations.trl supports TRL {', '.join(SUPPORTED_TRL)}.x only (it passes "
            f"GRPOTrainer a {HOOK}, experimental in TRL); found TRL {version}: "
            "pip install 'trl>=1.16,<1.17'")


check_trl(trl.__version__, GRPOTrainer)


def reward_from(fn: Callable[..., list[float]]) -> Callable[[Any, str], float]:
    """A TRL reward function (prompts=, completions=, answer=) as a per-rollout scorer."""
    def score(rollout: Any, completion: str) -> float:
        out = fn(prompts=[rollout.prompt], completions=[completion], answer=[rollout.answer])
        return float(out[0] if out and out[0] is not None else 0.0)
    return score


def sara_reward(prompts: list, completions: list, sara_reward: list[float] | None = None,
                **_: Any) -> list[float]:
    """TRL's reward function under the adapter: the reward each rollout was reported to SARA
    with (`SaraRollouts` returns it as an extra field, which TRL forwards here)."""
    if sara_reward is None or len(sara_reward) != len(completions):
        raise ValueError("sara_reward needs the rewards SaraRollouts returns, one per completion")
    return [float(r) for r in sara_reward]


class SaraRollouts:
    """GRPOTrainer's `rollout_func`: one SARA batch per call (see the module docstring)."""

    def __init__(self, sara: Any, reward_funcs: list[Callable[..., list[float]]],
                 worker: str = "trl-trainer") -> None:
        if not reward_funcs:
            raise ValueError("SaraRollouts needs at least one reward function to score with")
        self.sara = sara
        self.worker = worker
        self.scorers = [reward_from(f) for f in reward_funcs]
        self.version = sara.get_policy().version

    def __call__(self, prompts: list, trainer: GRPOTrainer) -> dict[str, list]:
        k = trainer.num_generations
        if len(prompts) % k:
            raise ValueError(f"TRL passed {len(prompts)} prompts, not a multiple of "
                             f"num_generations={k}")
        self._publish(trainer)  # the weights about to generate are a new version
        batch = self._fill_until_batch(trainer, len(prompts) // k)
        rows = []
        for group in batch.groups:
            if len(group.rollouts) != k:
                raise ValueError(f"group {group.group_id} holds {len(group.rollouts)} rollouts, "
                                 f"not num_generations={k}: run SARA with group_size={k} and "
                                 "commit=complete")
            rows += [(group.prompt, r) for r in group.rollouts]
        tok = trainer.processing_class
        out = {"prompt_ids": [tok(p).input_ids for p, _ in rows],
               "completion_ids": [list(r.token_ids or []) for _, r in rows],
               "logprobs": [list(r.logprobs or []) for _, r in rows],
               REWARD_FIELD: [r.reward for _, r in rows]}
        self.sara.ack(batch.batch_id)
        return out

    def _publish(self, trainer: GRPOTrainer) -> None:
        self.version += 1
        self.sara.publish_policy(self.version, f"trl-step-{trainer.state.global_step}")

    def _fill_until_batch(self, trainer: GRPOTrainer, groups: int) -> Any:
        """Lease, generate, score and report until SARA delivers a batch of `groups` groups."""
        while (batch := self.sara.next_batch(size=groups)) is None:
            lease = self.sara.lease(self.worker, max_rollouts=LEASE_SIZE)
            if not lease.rollouts:
                raise RuntimeError("SARA leased nothing and has no batch: add prompts, or "
                                   "resume the run (sara run resume)")
            self.sara.report(self.worker, [self._rollout(trainer, r) for r in lease.rollouts])
        return batch

    @torch.no_grad()
    def _rollout(self, trainer: GRPOTrainer, rollout: Any) -> dict[str, Any]:
        """One sampled completion, its sampling log-probs and its reward, as a SARA result."""
        tok = trainer.processing_class
        ids = tok(rollout.prompt, return_tensors="pt").input_ids.to(trainer.accelerator.device)
        model = trainer.accelerator.unwrap_model(trainer.model)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=trainer.temperature,
                             max_new_tokens=trainer.max_completion_length,
                             pad_token_id=tok.pad_token_id or tok.eos_token_id,
                             output_scores=True, return_dict_in_generate=True)
        completion_ids = gen.sequences[0, ids.shape[1]:].tolist()
        # the log-probs of the sampled tokens under the distribution they were drawn from
        logprobs = model.compute_transition_scores(gen.sequences, gen.scores,
                                                   normalize_logits=True)[0].tolist()
        text = tok.decode(completion_ids, skip_special_tokens=True)
        reward = sum(score(rollout, text) for score in self.scorers)
        return {"rollout_id": rollout.rollout_id, "reward": reward, "completion": text,
                "token_ids": completion_ids, "logprobs": logprobs[:len(completion_ids)],
                "completion_tokens": len(completion_ids), "policy_version": self.version}


class SaraGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generation batches come from a SARA client (`local()` or SaraClient):
    its `reward_funcs` score the rollouts SARA leases, and TRL trains on what SARA delivers.

    `num_generations` must equal SARA's group size; each generation batch is
    `generation_batch_size // num_generations` groups of one SARA batch.
    """

    def __init__(self, sara: Any, *args: Any, reward_funcs: list[Callable[..., list[float]]],
                 **kwargs: Any) -> None:
        if "rollout_func" in kwargs:
            raise TypeError("SaraGRPOTrainer supplies the rollout_func itself (SaraRollouts)")
        funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        self.sara_rollouts = SaraRollouts(sara, funcs)
        super().__init__(*args, reward_funcs=[sara_reward],
                         rollout_func=self.sara_rollouts, **kwargs)

    @staticmethod
    def step_dataset(steps: int) -> Any:
        """A placeholder dataset: TRL's sampler needs one, but SARA chooses the prompts."""
        from datasets import Dataset
        return Dataset.from_dict({"prompt": [""] * max(1, steps)})

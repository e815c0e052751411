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

Groups of unequal size (`commit=partial`, Reinforce-Ada's kept rollouts, Pilot-Commit, var_k):
`num_generations` is the largest group SARA delivers, and a group of n rollouts is padded to it
with rows of reward None and one end-of-sequence token, masked out through `env_mask`, TRL's
public mask for tokens the model did not generate (`batch_rows`). TRL's group mean and std are
NaN-aware, so each group is normalised over its own n rollouts and a padding row gets advantage
0; under a token-normalised loss (TRL's default `dapo`, `bnpo`, `cispo`, `vespo`) the masked
padding rows leave the loss and its normaliser unchanged. Other loss types average over rows
and would count them, so they are refused when a batch needs padding.

Supports TRL 1.16.x (`SUPPORTED_TRL`), checked against 1.16.0: TRL marks `rollout_func`
experimental, so importing this module under another release, or a 1.16 whose GRPOTrainer takes
no `rollout_func`, raises ImportError saying so (pip install 'trl>=1.16,<1.17'). What it does
not do yet: vLLM generation (it samples with `model.generate`, one rollout at a time) and
multi-process training. Padding rows still cost a forward pass over their prompt tokens.
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

# loss types whose normaliser counts unmasked completion tokens only: masked padding rows
# change nothing
TOKEN_NORMALISED = ("dapo", "bnpo", "cispo", "vespo")
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


def sara_reward(prompts: list, completions: list,
                sara_reward: list[float | None] | None = None, **_: Any) -> list[float | None]:
    """TRL's reward function under the adapter: the reward each rollout was reported to SARA
    with (`SaraRollouts` returns it as an extra field, which TRL forwards here); None for a
    padding row, which TRL then leaves out of its group's mean and std."""
    if sara_reward is None or len(sara_reward) != len(completions):
        raise ValueError("sara_reward needs the rewards SaraRollouts returns, one per completion")
    return [None if r is None else float(r) for r in sara_reward]


def batch_rows(batch: Any, k: int) -> list[tuple[Any, Any]]:
    """(prompt, rollout) rows, k a group: a group of n < k rollouts is followed by k - n padding
    rows (prompt, None). TRL's group statistics reshape rewards into blocks of k rows and are
    NaN-aware, so a padding row (reward None, its one token masked out) is left out of its group's
    mean and std and gets advantage 0: each group is normalised over its own n rollouts."""
    rows: list[tuple[Any, Any]] = []
    for group in batch.groups:
        n = len(group.rollouts)
        if n > k:
            raise ValueError(f"group {group.group_id} holds {n} rollouts, more than "
                             f"num_generations={k}: set num_generations to the largest group "
                             "SARA delivers (group_size, or SARA_VK_MAX under var_k)")
        rows += [(group.prompt, r) for r in group.rollouts] + [(group.prompt, None)] * (k - n)
    return rows


def padding_completion(tok: Any) -> list[int]:
    """A padding row's completion: one end-of-sequence token (TRL reads each completion's last
    token for its logging; an empty completion fails there), masked out of the loss."""
    return [tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id]


def check_padding_is_exact(trainer: GRPOTrainer) -> None:
    """ValueError unless padding rows leave TRL's loss unchanged: their one token is masked
    out (`env_mask`), so a loss normalised by tokens (dapo, bnpo, cispo, vespo) ignores them,
    while one averaged over rows (grpo, dr_grpo, sapo, luspo) would count them."""
    if trainer.loss_type not in TOKEN_NORMALISED:
        raise ValueError(f"groups of unequal size need a loss normalised by tokens "
                         f"({', '.join(TOKEN_NORMALISED)}), not loss_type={trainer.loss_type!r}: "
                         "padding rows would count as rows")


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
        rows = batch_rows(batch, k)
        tok = trainer.processing_class
        out = {"prompt_ids": [tok(p).input_ids for p, _ in rows],
               "completion_ids": [padding_completion(tok) if r is None else list(r.token_ids or [])
                                  for _, r in rows],
               "logprobs": [[0.0] if r is None else list(r.logprobs or []) for _, r in rows],
               REWARD_FIELD: [None if r is None else r.reward for _, r in rows]}
        if any(r is None for _, r in rows):
            check_padding_is_exact(trainer)
            # TRL's public mask for tokens the model did not generate: the padding row's one
            # token is left out of the loss and of every token count
            out["env_mask"] = [[0] if r is None else [1] * len(ids)
                               for (_, r), ids in zip(rows, out["completion_ids"])]
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

    `num_generations` must be at least the largest group SARA delivers (its group size, or
    SARA_VK_MAX under var_k); each generation batch is `generation_batch_size //
    num_generations` groups of one SARA batch, smaller groups padded (see the module docstring).
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

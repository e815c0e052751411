"""SARA in OpenRLHF's PPO trainer, for the recipe in docs/integration.md (section 8).

OpenRLHF 0.11's ``PPOTrainer.fit`` (``openrlhf/trainer/ppo_trainer.py``) gets each step's
rollouts from ``self.samples_generator.generate_samples(**generate_kwargs)``, which returns
``(experiences, filter_pass_rate, prompts_consumed, exhausted)``: one single-row ``Experience``
per sample, the ``n_samples_per_prompt`` samples of a prompt contiguous. ``--algo.
dynamic_filtering_enable`` is applied inside that call (``SamplesGenerator._generate_vllm``
drops a prompt's samples unless their mean score lies strictly inside ``--algo.
dynamic_filtering_range`` and dispatches a replacement prompt). Then ``RemoteExperienceMaker.
compute_advantages_and_returns`` reshapes the rewards to ``(-1, n_samples_per_prompt)`` in
that order, so ``group_norm`` normalises within each block of n rows.

:class:`SaraSamplesGenerator` is a drop-in for that object: ``generate_samples`` leases from SARA,
has your ``generate`` function produce and score one completion per leased rollout, reports,
and returns SARA's next batch as Experiences, each group's k rows contiguous (so
``--rollout.n_samples_per_prompt`` must equal SARA's ``group_size``, and every delivered group
must hold that many: OpenRLHF's reshape would otherwise normalise across prompts, so a group of
another size is refused with a ValueError). With it,
``dynamic_filtering_enable`` stays off: every delivered group is mixed. The Experiences are
built as ``SamplesGenerator._process_response_into_experience`` builds them (the same fields,
the same shifted action mask), from the response dicts :func:`rollout_response` makes.

Groups of unequal size (``commit=partial``, Reinforce-Ada's kept rollouts, Pilot-Commit, var_k):
give ``group_estimator`` (``group_norm``, ``dr_grpo`` or ``rloo``: the estimators OpenRLHF
applies per group and does not whiten across the batch afterwards, as it does
``reinforce_baseline``) and the adapter computes each group's advantages over its own n
rollouts, with OpenRLHF's formulas
(:func:`group_advantages`), and hands them over as the rewards (``scores`` keep the raw
reward, for logging). Run OpenRLHF with ``--rollout.n_samples_per_prompt 1`` and
``--algo.advantage.estimator flash_reinforce``: its reshape is then one row a block, its only
baseline is the batch mean, which is zero because every group's advantages sum to zero, and it
whitens nothing, so the advantages reach the loss as computed here (plus the KL penalty
OpenRLHF adds per token, as under any estimator). Keep OpenRLHF's length penalties off (they
would be added to the advantages); put them in the reward instead.

Checked against OpenRLHF 0.11.2 (tests/integrations/test_openrlhf.py where it imports); nothing
here imports OpenRLHF at module level.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from sara_client.chat import is_chat, render_prompt

Encode = Callable[[Any], "list[int]"]
# (leased rollouts, generate_kwargs) -> one SARA result dict per rollout, in order
Generate = Callable[[Sequence[Any], dict[str, Any]], "list[dict[str, Any]]"]


def encoder(tokenizer: Any) -> Encode:
    """Prompt -> token ids as SARA's workers and trainer render it (chat template for chat)."""
    return lambda prompt: render_prompt(tokenizer, prompt)


def _prompt_text(prompt: Any) -> str:
    if is_chat(prompt):
        return "\n".join(f"{m['role'] if isinstance(m, dict) else m.role}: "
                         f"{m['content'] if isinstance(m, dict) else m.content}" for m in prompt)
    return str(prompt)


def rollout_response(group: Any, rollout: Any, prompt_ids: Sequence[int]) -> dict[str, Any]:
    """One delivered rollout in the shape OpenRLHF's rollout executors return a response
    (``observation_tokens``, ``action_ranges``, ``rollout_log_probs`` over the whole observation
    with 0.0 on prompt tokens, ``reward``, ``scores``, ``prompt``, ``label``, ``truncated``)."""
    if rollout.token_ids is None:
        raise ValueError(f"rollout {rollout.rollout_id} has no token_ids: report them "
                         "(OpenRLHF trains on token ids)")
    prompt_ids, tokens = list(prompt_ids), list(rollout.token_ids)
    logprobs = None
    if rollout.logprobs is not None:
        logprobs = [0.0] * len(prompt_ids) + [float(x) for x in rollout.logprobs][:len(tokens)]
        logprobs += [0.0] * (len(prompt_ids) + len(tokens) - len(logprobs))
    return {"observation_tokens": prompt_ids + tokens,
            "action_ranges": [(len(prompt_ids), len(prompt_ids) + len(tokens))],
            "rollout_log_probs": logprobs, "reward": float(rollout.reward),
            "scores": float(rollout.reward), "prompt": _prompt_text(group.prompt),
            "label": group.answer or "", "truncated": rollout.finish_reason == "length",
            "extra_logs": {}, "sara_group_id": group.group_id,
            "sara_rollout_id": rollout.rollout_id}


# OpenRLHF's estimators whose advantages are a function of the group alone (reinforce_baseline
# is also whitened across the batch afterwards), which the adapter can compute itself
GROUP_ESTIMATORS = ("group_norm", "dr_grpo", "rloo")


def check_estimator(estimator: str) -> None:
    """ValueError naming the choices unless `estimator` is one the adapter computes."""
    if estimator not in GROUP_ESTIMATORS:
        raise ValueError(f"group_estimator must be one of {', '.join(GROUP_ESTIMATORS)}, "
                         f"not {estimator!r}")


def group_advantages(rewards: Sequence[float], estimator: str) -> list[float]:
    """One group's advantages as OpenRLHF 0.11.2's ``compute_advantages_and_returns`` computes
    them for a block of n rows: group_norm ``(r - mean) / (std + 1e-9)`` (std with Bessel's
    correction, torch's default), dr_grpo ``r - mean``, rloo
    ``r - (sum - r) / (n - 1)``. Each sums to zero over the group."""
    check_estimator(estimator)
    values = torch.tensor([float(r) for r in rewards], dtype=torch.float64)
    if len(values) < 2:
        raise ValueError(f"a group of {len(values)} rollout has no baseline: {estimator} needs "
                         "at least 2")
    if estimator == "rloo":
        centred = values - (values.sum() - values) / (len(values) - 1)
    else:
        centred = values - values.mean()
    if estimator == "group_norm":
        centred = centred / (values.std() + 1e-9)
    return centred.tolist()


def batch_responses(batch: Any, encode: Encode,
                    group_estimator: str | None = None) -> list[dict[str, Any]]:
    """Response dicts for a SARA batch, one per rollout, each group's rows contiguous; with
    ``group_estimator``, each ``reward`` is the rollout's advantage within its own group."""
    out = []
    for group in batch.groups:
        ids = list(encode(group.prompt))
        responses = [rollout_response(group, r, ids) for r in group.rollouts]
        if group_estimator is not None:
            advantages = group_advantages([r["reward"] for r in responses], group_estimator)
            for response, advantage in zip(responses, advantages):
                response["reward"] = advantage
        out.extend(responses)
    return out


def _experience_class() -> Any:
    from openrlhf.trainer.ppo_utils.experience import Experience
    return Experience


def experience_from_response(response: dict[str, Any], experience_cls: Any = None,
                             max_len: int = 2048) -> Any:
    """A single-row ``Experience``, field for field as OpenRLHF 0.11.2's
    ``SamplesGenerator._process_response_into_experience`` builds one (``max_len`` is its
    ``generate_kwargs["max_len"]``)."""
    cls = experience_cls or _experience_class()
    sequences = torch.tensor(response["observation_tokens"], dtype=torch.long)
    attention_mask = torch.ones(len(sequences), dtype=torch.long)
    action_mask = torch.zeros_like(attention_mask)
    for start, end in response["action_ranges"]:
        action_mask[start:end] = 1
    sequences, attention_mask = sequences[:max_len], attention_mask[:max_len]
    action_mask = action_mask[1:max_len]
    rollout_log_probs = None
    if response["rollout_log_probs"] is not None:
        rollout_log_probs = torch.tensor(response["rollout_log_probs"][1:max_len])
    ones = torch.where(action_mask)[0]
    response_length = (ones[-1] - ones[0] + 1).item() if len(ones) else 0
    total_length = attention_mask.float().sum()
    reward, score = response["reward"], response["scores"]
    info = {"response_clip_ratio": torch.tensor([total_length >= max_len]),
            "reward": torch.tensor([reward]), "score": torch.tensor([score])}
    return cls(sequences=sequences.unsqueeze(0), attention_mask=attention_mask.unsqueeze(0),
               action_mask=action_mask.unsqueeze(0),
               rollout_log_probs=None if rollout_log_probs is None
               else rollout_log_probs.unsqueeze(0),
               prompts=[response["prompt"]], labels=[response["label"]], images=[None],
               mm_train_inputs=[None], rewards=torch.tensor([reward]),
               scores=torch.tensor([score]), response_length=torch.tensor([response_length]),
               truncated=torch.tensor([response["truncated"]]),
               total_length=torch.tensor([total_length]), info=info)


def batch_to_experiences(batch: Any, encode: Encode, experience_cls: Any = None,
                         max_len: int = 2048, group_estimator: str | None = None) -> list[Any]:
    """A SARA batch as OpenRLHF Experiences, one per rollout, each group's rows contiguous
    (rewards as advantages within each group where ``group_estimator`` is given)."""
    return [experience_from_response(r, experience_cls, max_len)
            for r in batch_responses(batch, encode, group_estimator)]


class SaraSamplesGenerator:
    """Drop-in for OpenRLHF's ``SamplesGenerator`` (``PPOTrainer.samples_generator``).

    ``generate(rollouts, generate_kwargs)`` produces one completion per leased rollout (send one
    request per rollout to your vLLM engines, ``n=1``, honouring ``rollout.sampling``), scores
    it and returns SARA result dicts (``rollout_id``, ``reward``, ``token_ids``, ``logprobs``,
    ``completion_tokens``, ``finish_reason``); ``policy_version`` is filled in here.
    ``groups_per_step`` is ``--rollout.batch_size`` (prompts per step); ``samples_per_prompt`` is
    ``--rollout.n_samples_per_prompt`` (else the ``n_samples_per_prompt`` generate kwarg, where
    OpenRLHF passes one): a batch with a group of any other size is refused, unless
    ``group_estimator`` is given (groups of unequal size; see the module docstring), which needs
    ``n_samples_per_prompt`` 1. Each call first
    acks the batch returned by the previous call and publishes the next policy version: by then
    ``PPOTrainer.train_step`` has updated the actor and broadcast the weights to vLLM.
    """

    def __init__(self, sara: Any, generate: Generate, encode: Encode, *, groups_per_step: int,
                 worker_id: str = "openrlhf", lease_size: int = 64, max_len: int = 2048,
                 experience_cls: Any = None, eval_generator: Any = None,
                 max_empty_leases: int = 100, samples_per_prompt: int | None = None,
                 group_estimator: str | None = None) -> None:
        if group_estimator is not None:
            check_estimator(group_estimator)
        self.sara, self.generate, self.encode = sara, generate, encode
        self.groups_per_step, self.worker_id, self.lease_size = groups_per_step, worker_id, \
            lease_size
        self.max_len, self.experience_cls = max_len, experience_cls
        self.eval_generator, self.max_empty_leases = eval_generator, max_empty_leases
        self.samples_per_prompt, self.group_estimator = samples_per_prompt, group_estimator
        self.version = sara.get_policy().version
        self.pending_batch_id: str | None = None
        self.batches_acked = 0

    def _after_update(self) -> None:
        if self.pending_batch_id is None:
            return
        self.sara.ack(self.pending_batch_id)
        self.batches_acked += 1
        self.pending_batch_id = None
        self.version = self.sara.publish_policy(self.version + 1).version

    def _fill(self, generate_kwargs: dict[str, Any]) -> Any:
        empty = 0
        while (batch := self.sara.next_batch(size=self.groups_per_step)) is None:
            lease = self.sara.lease(self.worker_id, max_rollouts=self.lease_size)
            if not lease.rollouts:
                empty += 1
                if empty >= self.max_empty_leases:
                    raise RuntimeError("SARA leased nothing and has no batch: add prompts, or "
                                       "resume the run (sara run resume)")
                continue
            results = self.generate(lease.rollouts, generate_kwargs)
            for res in results:
                res.setdefault("policy_version", self.version)
            self.sara.report(self.worker_id, results)
        return batch

    @torch.no_grad()
    def generate_samples(self, **generate_kwargs: Any) -> tuple[list[Any], None, int, bool]:
        """``(experiences, None, groups, False)``: SARA's next batch; never exhausted (stop by
        ``--train.num_episodes``/max steps); no filter pass rate (nothing is filtered)."""
        n = self.samples_per_prompt or generate_kwargs.get("n_samples_per_prompt")
        if self.group_estimator is not None and n not in (None, 1):
            raise ValueError(f"with group_estimator={self.group_estimator!r} the adapter computes "
                             "the advantages: run OpenRLHF with --rollout.n_samples_per_prompt 1 "
                             f"and --algo.advantage.estimator flash_reinforce (not {n} samples a "
                             "prompt)")
        self._after_update()
        batch = self._fill(generate_kwargs)
        self._check_group_sizes(batch, None if self.group_estimator else n)
        self.pending_batch_id = batch.batch_id
        max_len = int(generate_kwargs.get("max_len", self.max_len))
        return (batch_to_experiences(batch, self.encode, self.experience_cls, max_len,
                                     self.group_estimator), None, len(batch.groups), False)

    @staticmethod
    def _check_group_sizes(batch: Any, n: int | None) -> None:
        """Refuse a group that is not n rows: OpenRLHF normalises by blocks of n rows."""
        for group in batch.groups if n else ():
            if len(group.rollouts) != n:
                raise ValueError(
                    f"group {group.group_id} holds {len(group.rollouts)} rollouts, not "
                    f"n_samples_per_prompt={n}: OpenRLHF's advantages reshape rewards into rows "
                    f"of {n}; run SARA with group_size={n} and commit=complete, or give "
                    "group_estimator for groups of unequal size")

    def generate_eval_samples(self, **generate_kwargs: Any) -> list[Any]:
        """Evaluation stays OpenRLHF's: delegate to the original generator, if given."""
        if self.eval_generator is None:
            return []
        return self.eval_generator.generate_eval_samples(**generate_kwargs)

"""SARA batches in verl's data layout (docs/integration.md, section 6).

verl's PPO/GRPO trainer groups rollouts by a per-prompt ``uid`` and reads a ``DataProto`` whose
``batch`` holds left-padded ``prompts``, right-padded ``responses``, their concatenation
``input_ids`` with ``attention_mask`` and ``position_ids``, a ``response_mask`` and the reward
as ``token_level_scores`` (the score on the last response token, as verl's rule-based reward
managers write it). :func:`batch_tensors` turns a SARA batch into exactly that, one row per
delivered rollout, each group's k rows contiguous, ``uid`` = a name derived from SARA's
``group_id``, so verl's own GRPO advantage (``compute_advantage`` /
``compute_advantage_for_multi_trajectories``) groups what SARA grouped. :func:`to_dataproto`
wraps it in verl's ``DataProto`` (imported only there). :func:`v1_records` gives the batch as
verl 0.9's v1 trainer keeps trajectories in TransferQueue (keys ``{uid}_{session_id}_{index}``
from :func:`v1_keys`, unpadded fields, tags), for a custom replay-buffer sampler. The rollout side: :func:`lease_tensors` (generation input for leased rollouts, one row
each, ``rollout.n = 1``) and :func:`results_from_responses` (SARA results from the generated
tokens and their scores).

Checked against verl 0.9.1 (tests/integrations/test_verl.py); nothing here imports verl at
module level, so the layout is unit-tested without it.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import numpy as np
import torch

from sara_client.chat import render_prompt
from sara_client.limits import FLOOR_LOGPROB

Encode = Callable[[Any], "list[int]"]


def uid_for(group_id: str) -> str:
    """verl's uid for a SARA group: stable, and free of ``_`` (verl 0.9's v1 ReplayBuffer splits
    TransferQueue keys ``{uid}_{session}_{index}`` on ``_``, so a uid must not contain one)."""
    return "sara-" + hashlib.sha1(group_id.encode()).hexdigest()[:20]


def encoder(tokenizer: Any) -> Encode:
    """Prompt -> token ids the way SARA's workers and trainer render it (chat template for chat
    prompts), for the ``encode=`` argument below."""
    return lambda prompt: render_prompt(tokenizer, prompt)


def _left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max((len(r) for r in rows), default=1))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(list(r), dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids, mask


def _right_pad(rows: Sequence[Sequence[float]], pad: float, dtype: torch.dtype,
               width: int | None = None) -> torch.Tensor:
    width = width or max(1, max((len(r) for r in rows), default=1))
    out = torch.full((len(rows), width), pad, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(list(r)[:width], dtype=dtype)
    return out


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def batch_tensors(batch: Any, encode: Encode, pad_token_id: int, *,
                  max_response_length: int | None = None) -> tuple[dict[str, torch.Tensor],
                                                                   dict[str, np.ndarray]]:
    """(tensors, non_tensors) of a SARA batch in verl's training layout (see the module doc).

    Every rollout must carry ``token_ids`` (report them: SARA's workers do). ``rollout_log_probs``
    is included only when every rollout carries ``logprobs``. Non-tensors: ``uid``,
    ``sara_group_id``, ``sara_rollout_id`` (object arrays, verl's convention)."""
    prompts, responses, logprobs, rewards = [], [], [], []
    uids, gids, rids = [], [], []
    for group in batch.groups:
        ids = list(encode(group.prompt))
        for r in group.rollouts:
            if r.token_ids is None:
                raise ValueError(f"rollout {r.rollout_id} has no token_ids: report them "
                                 "(verl trains on token ids, not text)")
            toks = list(r.token_ids)[:max_response_length] if max_response_length else \
                list(r.token_ids)
            prompts.append(ids)
            responses.append(toks)
            logprobs.append(None if r.logprobs is None else list(r.logprobs)[:len(toks)])
            rewards.append(float(r.reward))
            uids.append(uid_for(group.group_id))
            gids.append(group.group_id)
            rids.append(r.rollout_id)
    prompt_ids, prompt_mask = _left_pad(prompts, pad_token_id)
    width = max_response_length or max(1, max(map(len, responses), default=1))
    response_ids = _right_pad(responses, pad_token_id, torch.long, width)
    response_mask = _right_pad([[1] * len(t) for t in responses], 0, torch.long, width)
    scores = torch.zeros((len(responses), width), dtype=torch.float32)
    for i, toks in enumerate(responses):
        scores[i, max(len(toks), 1) - 1] = rewards[i]   # the reward on the last response token
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    tensors = {"prompts": prompt_ids, "responses": response_ids,
               "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
               "attention_mask": attention_mask, "position_ids": _positions(attention_mask),
               "response_mask": response_mask, "token_level_scores": scores}
    if logprobs and all(lp is not None for lp in logprobs):
        tensors["rollout_log_probs"] = _right_pad(logprobs, 0.0, torch.float32, width)
    non_tensors = {"uid": np.array(uids, dtype=object),
                   "sara_group_id": np.array(gids, dtype=object),
                   "sara_rollout_id": np.array(rids, dtype=object)}
    return tensors, non_tensors


def to_dataproto(batch: Any, tokenizer: Any = None, *, encode: Encode | None = None,
                 pad_token_id: int | None = None, max_response_length: int | None = None) -> Any:
    """verl's ``DataProto`` for a SARA batch (needs verl), with ``meta_info`` carrying the batch
    id and policy version (ack the id after the update)."""
    from verl import DataProto

    if encode is None:
        if tokenizer is None:
            raise ValueError("pass tokenizer= or encode=")
        encode = encoder(tokenizer)
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "eos_token_id", 0) or 0
    tensors, non_tensors = batch_tensors(batch, encode, pad_token_id,
                                         max_response_length=max_response_length)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors,
                               meta_info={"sara_batch_id": batch.batch_id,
                                          "sara_policy_version": batch.policy_version})


def v1_keys(non_tensors: dict[str, np.ndarray]) -> list[str]:
    """TransferQueue keys ``{uid}_{session_id}_0`` for the rows of :func:`batch_tensors`, one
    session per rollout of a group, as verl 0.9's v1 trainer names single-turn trajectories."""
    seen: dict[str, int] = {}
    keys = []
    for uid in non_tensors["uid"]:
        session = seen.get(uid, 0)
        seen[uid] = session + 1
        keys.append(f"{uid}_{session}_0")
    return keys


def v1_records(batch: Any, encode: Encode, pad_token_id: int, *, global_steps: int = 0,
               max_response_length: int | None = None) -> tuple[
                   list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """(keys, fields, tags) of a SARA batch as verl 0.9's v1 trainer keeps trajectories in
    TransferQueue (``tq.kv_batch_put(keys=..., fields=list_of_dict_to_tensordict(fields),
    tags=...)``): one unpadded 1-D tensor per field and trajectory, as
    ``AgentLoopWorkerTQ._agent_loop_postprocess`` writes them, the score as ``rm_scores`` on the
    last response token, ``uid`` and ``num_turns`` as fields, and the tags the replay buffer,
    batch balancing and the step's metrics read (``min_global_steps`` / ``max_global_steps``: the
    policy versions a rollout was generated under, which are verl's weight versions when the
    sampler publishes them)."""
    tensors, non_tensors = batch_tensors(batch, encode, pad_token_id,
                                         max_response_length=max_response_length)
    keys, fields, tags = v1_keys(non_tensors), [], []
    versions = [(r.policy_version, r.policy_version if r.policy_version_end is None
                 else r.policy_version_end) for g in batch.groups for r in g.rollouts]
    width = tensors["prompts"].shape[1]
    for i, uid in enumerate(non_tensors["uid"]):
        pmask = tensors["attention_mask"][i, :width].bool()
        rmask = tensors["response_mask"][i].bool()
        prompt, response = tensors["prompts"][i][pmask], tensors["responses"][i][rmask]
        n = len(prompt) + len(response)
        field = {"uid": str(uid), "prompts": prompt, "responses": response,
                 "response_mask": torch.ones(len(response), dtype=torch.long),
                 "input_ids": torch.cat([prompt, response]),
                 "attention_mask": torch.ones(n, dtype=torch.long),
                 "position_ids": torch.arange(n, dtype=torch.long),
                 "rm_scores": tensors["token_level_scores"][i][rmask]}
        if "rollout_log_probs" in tensors:
            field["rollout_log_probs"] = tensors["rollout_log_probs"][i][rmask]
        field["num_turns"] = torch.tensor(2)   # one user turn, one assistant turn
        fields.append(field)
        first, last = versions[i]
        tags.append({"status": "success", "prompt_len": len(prompt),
                     "response_len": len(response), "seq_len": n, "global_steps": global_steps,
                     "min_global_steps": first, "max_global_steps": last,
                     "sara_rollout_id": str(non_tensors["sara_rollout_id"][i])})
    return keys, fields, tags


def lease_tensors(lease: Any, encode: Encode, pad_token_id: int) -> tuple[
        dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """Generation input for a lease: one left-padded row per leased rollout (``rollout.n = 1``),
    with ``sara_rollout_id`` and the rollout's own ``uid`` (its group's) as non-tensors."""
    rows = [list(encode(r.prompt)) for r in lease.rollouts]
    ids, mask = _left_pad(rows, pad_token_id) if rows else (
        torch.zeros((0, 1), dtype=torch.long), torch.zeros((0, 1), dtype=torch.long))
    return ({"input_ids": ids, "attention_mask": mask, "position_ids": _positions(mask)},
            {"uid": np.array([uid_for(r.group_id) for r in lease.rollouts], dtype=object),
             "sara_rollout_id": np.array([r.rollout_id for r in lease.rollouts], dtype=object)})


def results_from_responses(rollout_ids: Sequence[str], responses: torch.Tensor,
                           response_mask: torch.Tensor, scores: torch.Tensor, policy_version: int,
                           *, decode: Callable[[list[int]], str] | None = None,
                           eos_token_id: int | None = None,
                           log_probs: torch.Tensor | None = None) -> list[dict[str, Any]]:
    """SARA results for generated rows: ``responses``/``response_mask`` (B, R) as verl's rollout
    returns them, ``scores`` per row (B,) or per token (B, R: summed, as verl's reward managers
    place the score on one token). ``finish_reason`` is ``stop`` when the last kept token is
    ``eos_token_id``, else ``length`` when eos is known, else ``stop``."""
    out = []
    per_row = scores.sum(-1) if scores.dim() == 2 else scores
    for i, rid in enumerate(rollout_ids):
        n = int(response_mask[i].sum())
        toks = responses[i, :n].tolist()
        finish = "stop"
        if eos_token_id is not None:
            finish = "stop" if toks and toks[-1] == eos_token_id else "length"
        result = {"rollout_id": str(rid), "reward": float(per_row[i]),
                  "completion": decode(toks) if decode else "", "token_ids": toks,
                  "completion_tokens": n, "finish_reason": finish,
                  "policy_version": int(policy_version)}
        if log_probs is not None:
            result["logprobs"] = [max(float(x), FLOOR_LOGPROB) for x in log_probs[i, :n].tolist()]
        out.append(result)
    return out

"""The hot routes' answers (a lease, a batch) written straight to JSON bytes.

A lease carries up to hundreds of rollouts and a batch thousands of stored results. Building a
pydantic model per item, then serialising the tree, was about a sixth of a serve process's CPU
in `bench/service_throughput.py`; a batch of 2,048 results took ~9 ms to answer. Here the answer
is a tree of plain values that orjson writes, and a stored result goes into a batch as the JSON it
was stored as (`orjson.Fragment`), not parsed and written again.

The answer models in `sara_client.models` stay the schema and what clients parse into. Where the
fast path cannot vouch for its output, the answer goes through the model instead:
- a stored result holding a null, or without its policy version, is validated as
  `BatchRollout` first (the door refuses a null logprob, and the format migration repaired
  those stored before it did, so validation passes);
- a lease whose content orjson refuses (an integer past 64 bits in a prompt's meta) is written
  by the model.
Tests check both paths give the same answer.
"""

from __future__ import annotations

from typing import Any, Sequence

import orjson

from sara_client.models import BatchRollout, BatchStats, LeaseResponse, PolicyInfo, SamplingParams

from ..store.leases import LeasedRollout

# a group as a batch carries it: (group id, prompt id, stored prompt content, stored results,
# every reward drawn when the results are fewer, as Reinforce-Ada's kept rollouts are, else None)
BatchGroupRows = tuple[str, str, dict[str, Any], list[bytes], list[float] | None]


def _rollout(r: LeasedRollout, sampling: Any) -> dict[str, Any]:
    return {"rollout_id": r.rollout_id, "group_id": r.group_id, "prompt_id": r.prompt_id,
            "prompt": r.prompt["prompt"], "task": r.prompt.get("task", "exact"),
            "answer": r.prompt.get("answer"), "meta": r.prompt.get("meta") or {},
            "sampling": sampling, "priority": r.priority}


def lease_answer(lease_id: str | None, expires_at: float | None, policy: PolicyInfo,
                 leased: Sequence[LeasedRollout], cancel: list[str],
                 sampling: SamplingParams) -> bytes:
    """A LeaseResponse's JSON; lease_id and expires_at are None when nothing was leased."""
    def answer(policy: Any, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"lease_id": lease_id, "expires_at": expires_at, "policy": policy,
                "rollouts": rollouts, "cancel": cancel}
    try:
        fragment = orjson.Fragment(sampling.model_dump_json())
        return orjson.dumps(answer(orjson.Fragment(policy.model_dump_json()),
                                   [_rollout(r, fragment) for r in leased]))
    except orjson.JSONEncodeError:  # content only the model can write
        return LeaseResponse.model_validate(answer(
            policy, [_rollout(r, sampling) for r in leased])).model_dump_json().encode()


def stored_result(raw: bytes) -> orjson.Fragment:
    """A stored result as a batch carries it. One with no null anywhere and its policy version
    in it is spliced in as stored; any other is validated as BatchRollout and written from the
    model."""
    if b"null" not in raw and b'"policy_version":' in raw:
        return orjson.Fragment(raw)
    return orjson.Fragment(BatchRollout.model_validate_json(raw).model_dump_json())


def batch_answer(batch_id: str, policy_version: int, created_at: float, redelivered: bool,
                 groups: Sequence[BatchGroupRows], stats: BatchStats,
                 sampling: SamplingParams) -> bytes:
    """A Batch's JSON: each group's stored prompt and results, in slot order, and the rewards it
    drew where it delivers fewer. Every value in it
    is a number, a string, or JSON that was written by a model, so orjson writes all of it."""
    rows = [{"group_id": gid, "prompt_id": pid, "prompt": prompt.get("prompt", ""),
             "answer": prompt.get("answer"), "task": prompt.get("task", "exact"),
             "rollouts": [stored_result(raw) for raw in results], "drawn_rewards": drawn}
            for gid, pid, prompt, results, drawn in groups]
    return orjson.dumps({"batch_id": batch_id, "policy_version": policy_version,
                         "created_at": created_at, "redelivered": redelivered, "groups": rows,
                         "stats": orjson.Fragment(stats.model_dump_json()),
                         "sampling": orjson.Fragment(sampling.model_dump_json())})

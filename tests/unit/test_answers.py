"""answers: the lease and batch JSON written without a model per item is the models' answer."""

from __future__ import annotations

import json

import orjson

from sara_client.models import (Batch, BatchGroup, BatchRollout, BatchStats, LeaseResponse,
                                PolicyInfo, Rollout, RolloutResult, SamplingParams)
from sara_service.core.answers import batch_answer, lease_answer, stored_result
from sara_service.store.leases import LeasedRollout

SAMPLING = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=128, seed=3)
POLICY = PolicyInfo(version=4, checkpoint="ckpt/4")
PROMPTS = [
    {"prompt": "What is 2+2? Ünïcode ✓", "task": "math", "answer": "4",
     "meta": {"p_success": 0.25, "tags": ["a", {"b": None}], "n": 2**62}},
    {"prompt": [{"role": "system", "content": "terse"}, {"role": "user", "content": "hi"}]},
    {"prompt": "no answer", "answer": None, "meta": None},
]


def _leased(prompts):
    return [LeasedRollout(f"g{i}:{i % 3}", f"g{i}", f"p{i}", prompt)
            for i, prompt in enumerate(prompts)]


def _lease_model(lease_id, expires_at, leased, cancel):
    """The answer as the scheduler built it before: one Rollout model per rollout."""
    return LeaseResponse(
        lease_id=lease_id, expires_at=expires_at, policy=POLICY, cancel=cancel,
        rollouts=[Rollout(rollout_id=r.rollout_id, group_id=r.group_id, prompt_id=r.prompt_id,
                          prompt=r.prompt["prompt"], task=r.prompt.get("task", "exact"),
                          answer=r.prompt.get("answer"), meta=r.prompt.get("meta") or {},
                          sampling=SAMPLING) for r in leased])


def test_a_lease_answer_is_the_models_answer():
    leased = _leased(PROMPTS)
    raw = lease_answer("l1", 1234.5, POLICY, leased, ["g9:1", "g9:2"], SAMPLING)
    expected = _lease_model("l1", 1234.5, leased, ["g9:1", "g9:2"])
    assert json.loads(raw) == json.loads(expected.model_dump_json())
    assert LeaseResponse.model_validate_json(raw) == expected


def test_an_empty_lease_answer_names_no_lease():
    raw = lease_answer(None, None, POLICY, [], ["g1:0"], SAMPLING)
    assert json.loads(raw) == json.loads(_lease_model(None, None, [], ["g1:0"]).model_dump_json())


def test_a_meta_integer_past_64_bits_is_written_by_the_model():
    """orjson refuses such an integer; the stored meta is still served, whole."""
    leased = _leased([{"prompt": "big", "meta": {"n": 2**70}}])
    raw = lease_answer("l1", 1.0, POLICY, leased, [], SAMPLING)
    assert json.loads(raw)["rollouts"][0]["meta"] == {"n": 2**70}
    assert json.loads(raw) == json.loads(_lease_model("l1", 1.0, leased, []).model_dump_json())


def _blob(**fields) -> bytes:
    """A result as the store writes it (redis_format.result_blob: exclude_none, its version
    filled in)."""
    result = RolloutResult(rollout_id="g1:0", reward=1.0, completion="x", **fields)
    return result.model_dump_json(exclude_none=True).encode()


def test_a_result_this_release_stored_is_spliced_in_as_stored():
    raw = _blob(policy_version=2, token_ids=[5, 6], logprobs=[-0.5, -1e4])
    assert orjson.dumps([stored_result(raw)]) == b"[" + raw + b"]"


def test_a_result_holding_a_null_goes_through_the_model():
    # "null" anywhere (here inside the completion's text) is not spliced: the model writes it
    raw = b'{"rollout_id":"g1:0","reward":0.0,"completion":"null","completion_tokens":2,' \
          b'"finish_reason":"stop","policy_version":1,"logprobs":[-0.5,-1.0]}'
    out = json.loads(orjson.dumps(stored_result(raw)))
    assert out == BatchRollout.model_validate_json(raw).model_dump(mode="json")


def test_a_batch_answer_is_the_models_answer():
    blobs = [_blob(policy_version=3), _blob(policy_version=3, token_ids=[1], logprobs=[-0.1]),
             b'{"rollout_id":"g2:1","reward":1.0,"completion":"null","completion_tokens":1,'
             b'"finish_reason":"stop","policy_version":2,"logprobs":[-0.25]}']
    groups = [("g1", "p1", PROMPTS[0], blobs[:2], None),
              ("g2", "p2", PROMPTS[1], blobs[2:], [0.0, 1.0, 0.0]), ("g3", "p3", {}, [], None)]
    stats = BatchStats(rollouts_spent=24, ds_rollouts_per_effective_group=12.5)
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=64, seed=1)
    raw = batch_answer("b1", 3, 99.25, True, groups, stats, sampling)
    rollouts = [[BatchRollout.model_validate_json(b) for b in group[3]] for group in groups]
    expected = Batch(
        batch_id="b1", policy_version=3, created_at=99.25, redelivered=True, stats=stats,
        sampling=sampling, groups=[BatchGroup(group_id=gid, prompt_id=pid, prompt=prompt.get("prompt", ""),
                           answer=prompt.get("answer"), task=prompt.get("task", "exact"),
                           rollouts=rows, drawn_rewards=drawn)
                for (gid, pid, prompt, _, drawn), rows in zip(groups, rollouts)])
    assert Batch.model_validate_json(raw) == expected


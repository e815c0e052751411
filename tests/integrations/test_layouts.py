"""The verl and OpenRLHF glue without either framework: the layouts they expect, built from real
SARA batches (the real app in-process on the tests' real Redis), and the OpenRLHF drop-in
generator's ack/publish cycle. test_verl.py and test_openrlhf.py run the same against the
frameworks' own objects where they are installed."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numpy")
pytest.importorskip("sara_service")

from sara_integrations import openrlhf as orl  # noqa: E402
from sara_integrations.verl import layout as verl  # noqa: E402

from .conftest import K  # noqa: E402
from ._drive import encode, fake_generate, next_batch  # noqa: E402


def _rows(batch):
    return [(g, r) for g in batch.groups for r in g.rollouts]


def test_verl_tensors_match_the_batch_row_for_row(sara):
    batch = next_batch(sara, size=2)
    t, nt = verl.batch_tensors(batch, encode, pad_token_id=0)
    rows = _rows(batch)
    n = len(rows)
    assert n == 2 * K and t["prompts"].shape[0] == n
    assert t["input_ids"].shape == t["attention_mask"].shape == t["position_ids"].shape
    assert t["input_ids"].shape[1] == t["prompts"].shape[1] + t["responses"].shape[1]
    for i, (g, r) in enumerate(rows):
        p = encode(g.prompt)
        # prompts left-padded, responses right-padded, masks where the tokens are
        assert t["prompts"][i, -len(p):].tolist() == p
        assert t["responses"][i, :len(r.token_ids)].tolist() == r.token_ids
        assert int(t["response_mask"][i].sum()) == len(r.token_ids)
        assert int(t["attention_mask"][i].sum()) == len(p) + len(r.token_ids)
        # the reward sits on the last response token, as verl's reward managers put it
        assert t["token_level_scores"][i, len(r.token_ids) - 1] == r.reward
        assert float(t["token_level_scores"][i].sum()) == r.reward
        assert t["rollout_log_probs"][i, :len(r.token_ids)].tolist() == r.logprobs
        assert nt["sara_group_id"][i] == g.group_id and nt["sara_rollout_id"][i] == r.rollout_id
        assert nt["uid"][i] == verl.uid_for(g.group_id)
    # position ids count the real tokens only (0 under left padding)
    first = t["attention_mask"][0].tolist().index(1)
    assert t["position_ids"][0, first:first + 3].tolist() == [0, 1, 2]
    # each group's k rows are contiguous and mixed: nothing for a zero-std filter to drop
    for j in range(0, n, K):
        assert len(set(nt["uid"][j:j + K])) == 1
        assert torch.tensor([r.reward for _, r in rows[j:j + K]]).std() > 0


def test_verl_uids_and_v1_keys_fit_transfer_queue_key_parsing():
    uid = verl.uid_for("run_a:g_17")
    assert "_" not in uid and uid == verl.uid_for("run_a:g_17") != verl.uid_for("run_a:g_18")
    keys = verl.v1_keys({"uid": ["a", "a", "b", "a"]})
    assert keys == ["a_0_0", "a_1_0", "b_0_0", "a_2_0"]
    # verl 0.9.1's ReplayBuffer takes the uid as key.split("_")[0]; its v1 advantage as rsplit
    assert all(k.split("_")[0] == k.rsplit("_", 2)[0] for k in keys)


def test_verl_v1_records_are_unpadded_trajectories(sara):
    batch = next_batch(sara, size=2)
    keys, fields, tags = verl.v1_records(batch, encode, pad_token_id=0, global_steps=7)
    for key, f, t, (g, r) in zip(keys, fields, tags, _rows(batch)):
        assert key.split("_")[0] == f["uid"] == verl.uid_for(g.group_id)
        assert f["prompts"].tolist() == encode(g.prompt) and f["responses"].tolist() == r.token_ids
        assert f["input_ids"].tolist() == encode(g.prompt) + r.token_ids
        assert f["rm_scores"].tolist() == [0.0] * (len(r.token_ids) - 1) + [r.reward]
        assert f["rollout_log_probs"].tolist() == r.logprobs
        assert (t["status"], t["global_steps"], t["sara_rollout_id"]) == \
            ("success", 7, r.rollout_id)
        assert t["seq_len"] == len(f["position_ids"]) == t["prompt_len"] + t["response_len"]


def test_verl_lease_rows_and_results_round_trip(sara):
    lease = sara.lease("gen", max_rollouts=8)
    t, nt = verl.lease_tensors(lease, encode, pad_token_id=0)
    assert t["input_ids"].shape[0] == len(lease.rollouts) == len(nt["sara_rollout_id"])
    gen = fake_generate(lease.rollouts, random.Random(1), 0)
    responses = verl._right_pad([g["token_ids"] for g in gen], 0, torch.long)
    mask = verl._right_pad([[1] * len(g["token_ids"]) for g in gen], 0, torch.long)
    scores = torch.tensor([g["reward"] for g in gen])
    back = verl.results_from_responses(list(nt["sara_rollout_id"]), responses, mask, scores, 0,
                                       eos_token_id=2, log_probs=torch.full(mask.shape, -0.5))
    for b, g in zip(back, gen):
        assert (b["rollout_id"], b["token_ids"], b["reward"]) == \
            (g["rollout_id"], g["token_ids"], g["reward"])
        assert b["finish_reason"] == "stop" and b["logprobs"] == g["logprobs"]
    answer = sara.report("gen", back)
    assert answer.accepted == len(back)


def test_verl_refuses_rollouts_without_token_ids(sara):
    batch = next_batch(sara, size=1)
    batch.groups[0].rollouts[0].token_ids = None
    with pytest.raises(ValueError, match="token_ids"):
        verl.batch_tensors(batch, encode, 0)


@dataclasses.dataclass
class StandInExperience:
    """The fields OpenRLHF 0.11.2's Experience takes (test_openrlhf.py uses the real class)."""
    sequences: Any = None
    attention_mask: Any = None
    action_mask: Any = None
    rollout_log_probs: Any = None
    prompts: list = dataclasses.field(default_factory=list)
    labels: list = dataclasses.field(default_factory=list)
    images: list = dataclasses.field(default_factory=list)
    mm_train_inputs: list = dataclasses.field(default_factory=list)
    rewards: Any = None
    scores: Any = None
    response_length: Any = None
    truncated: Any = None
    total_length: Any = None
    info: dict = dataclasses.field(default_factory=dict)


def test_openrlhf_experiences_are_one_per_rollout_groups_contiguous(sara):
    batch = next_batch(sara, size=2)
    exps = orl.batch_to_experiences(batch, encode, StandInExperience)
    rows = _rows(batch)
    assert len(exps) == len(rows)
    for e, (g, r) in zip(exps, rows):
        p = encode(g.prompt)
        assert e.sequences[0].tolist() == p + r.token_ids
        # OpenRLHF's action mask is shifted by one: position t marks token t+1 as an action
        assert e.action_mask.shape[1] == len(p) + len(r.token_ids) - 1
        assert e.action_mask[0].nonzero().flatten().tolist() == \
            list(range(len(p) - 1, len(p) + len(r.token_ids) - 1))
        assert e.rollout_log_probs[0][e.action_mask[0].bool()].tolist() == r.logprobs
        assert float(e.rewards) == r.reward and int(e.response_length) == len(r.token_ids)
        assert e.labels == [g.answer]
    # group_norm reshapes rewards to (-1, n_samples_per_prompt): with n = k that is SARA's groups
    rewards = torch.cat([e.rewards for e in exps]).reshape(-1, K)
    assert (rewards.std(-1) > 0).all()


def test_openrlhf_generator_acks_and_publishes_after_each_step(sara):
    rng = random.Random(3)
    gen = orl.SaraSamplesGenerator(
        sara, lambda rollouts, kw: [{k: v for k, v in res.items() if k != "policy_version"}
                                    for res in fake_generate(rollouts, rng, 0)],
        encode, groups_per_step=2,
        experience_cls=StandInExperience, lease_size=16)
    v0 = sara.get_policy().version
    exps, rate, groups, exhausted = gen.generate_samples(max_len=64)
    assert (len(exps), rate, groups, exhausted) == (2 * K, None, 2, False)
    assert gen.batches_acked == 0 and sara.get_policy().version == v0
    gen.generate_samples(max_len=64)  # the trainer stepped and broadcast: ack, publish
    assert gen.batches_acked == 1 and sara.get_policy().version == v0 + 1
    assert gen.generate_eval_samples() == []

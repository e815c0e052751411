"""SARA batches through verl's own objects at the recipe's touch points (docs/integration.md,
section 6), checked against verl 0.9.1: a real SARA batch (the real app on the tests' real Redis)
becomes verl's ``DataProto``, verl's own GRPO advantage functions (the v0
``ray_trainer.compute_advantage`` and the v1 trainer's ``compute_advantage_for_multi_trajectories``
over TransferQueue-style keys) group it as SARA grouped it with no zero-std group left for
``algorithm.filter_groups`` to drop, and the rows come back as SARA results.

Skipped where verl does not import, and failed instead under CI, which installs verl's import
closure without its dependency pins (.ci/run; the full `pip install verl` pins transformers<5.11,
which this project's environment does not keep)."""

from __future__ import annotations

import pytest

from tests._need import need

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("sara_service")
need("verl.trainer.ppo.v1.utils", "verl 0.9 (CI installs verl 0.9.1)")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402

from sara_integrations import verl as glue  # noqa: E402

from .conftest import K  # noqa: E402
from ._drive import encode, next_batch  # noqa: E402


@pytest.fixture
def batch(sara):
    return next_batch(sara, size=3, seed=5)


def _dataproto(batch):
    tensors, non_tensors = glue.batch_tensors(batch, encode, pad_token_id=0)
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors,
                               meta_info={"sara_batch_id": batch.batch_id})
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    return data, non_tensors


def _expected(batch):
    """GRPO's (r - group mean) / (group std + eps), per SARA group, row order of the batch."""
    out = []
    for g in batch.groups:
        r = torch.tensor([x.reward for x in g.rollouts])
        out += ((r - r.mean()) / (r.std() + 1e-6)).tolist()
    return torch.tensor(out)


def test_to_dataproto_builds_verls_batch_object(batch, monkeypatch):
    data = glue.to_dataproto(batch, encode=encode, pad_token_id=0)
    assert isinstance(data, DataProto) and len(data) == K * len(batch.groups)
    assert data.meta_info["sara_batch_id"] == batch.batch_id
    assert set(data.batch.keys()) >= {"prompts", "responses", "input_ids", "attention_mask",
                                      "position_ids", "response_mask", "token_level_scores"}
    # verl's own batch operations keep the rows and their uids together
    halves = data.chunk(len(batch.groups))
    assert [len(set(h.non_tensor_batch["uid"])) for h in halves] == [1] * len(batch.groups)
    again = DataProto.concat(halves)
    assert torch.equal(again.batch["responses"], data.batch["responses"])


def test_verls_grpo_advantage_groups_by_sara_group(batch):
    data, non_tensors = _dataproto(batch)
    out = compute_advantage(data, adv_estimator=AdvantageEstimator.GRPO)
    mask = out.batch["response_mask"].bool()
    per_row = torch.stack([out.batch["advantages"][i][mask[i]][0] for i in range(len(out))])
    assert torch.allclose(per_row, _expected(batch), atol=1e-4)
    # every group has non-zero reward spread: what DAPO's filter_groups would have kept
    for j in range(0, len(out), K):
        assert per_row[j:j + K].abs().sum() > 0


def test_verls_v1_advantage_over_transfer_queue_keys(batch):
    data, non_tensors = _dataproto(batch)
    keys = glue.v1_keys(non_tensors)
    out = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=AdvantageEstimator.GRPO, num_repeat=1)
    mask = out.batch["response_mask"].bool()
    per_row = torch.stack([out.batch["advantages"][i][mask[i]][0] for i in range(len(out))])
    assert torch.allclose(per_row, _expected(batch), atol=1e-4)


def test_dataproto_rows_come_back_as_sara_results(batch):
    data, non_tensors = _dataproto(batch)
    back = glue.results_from_responses(
        list(data.non_tensor_batch["sara_rollout_id"]), data.batch["responses"],
        data.batch["response_mask"], data.batch["token_level_scores"], batch.policy_version,
        eos_token_id=2, log_probs=data.batch["rollout_log_probs"])
    rows = [r for g in batch.groups for r in g.rollouts]
    assert [(b["rollout_id"], b["token_ids"], b["reward"], b["logprobs"]) for b in back] == \
        [(r.rollout_id, r.token_ids, r.reward, r.logprobs) for r in rows]


def test_v1_records_take_verls_transfer_queue_path(batch):
    """The records a SARA sampler puts into TransferQueue, through verl's own TensorDict builder
    and the steps of v1 `PPOTrainer._compute_advantage` (its fetch from TransferQueue aside)."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields, tags = glue.v1_records(batch, encode, pad_token_id=0, global_steps=3)
    assert [t["seq_len"] for t in tags] == [len(f["input_ids"]) for f in fields]
    td = list_of_dict_to_tensordict(fields)              # what kv_batch_put stores
    data = td.select("uid", "response_mask", "rm_scores", "rollout_log_probs")
    data = DataProto(batch=data.to_padded_tensor())      # _compute_advantage, as verl does it
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    out = compute_advantage_for_multi_trajectories(
        data, batch_keys=keys, adv_estimator=AdvantageEstimator.GRPO, num_repeat=K)
    mask = out.batch["response_mask"].bool()
    per_row = torch.stack([out.batch["advantages"][i][mask[i]][0] for i in range(len(out))])
    assert torch.allclose(per_row, _expected(batch), atol=1e-4)

"""TrainerConfig: dict round trip, strict keys, validation."""

from __future__ import annotations

import json

import pytest
from sara_trainer.config import TrainerConfig


def test_round_trip_through_json():
    config = TrainerConfig(lr=2e-5, micro_batch_tokens=4096, advantage_estimator="dr_grpo",
                           clip_eps_low=0.1, clip_eps_high=0.3, kl_coef=0.01, seed=5,
                           checkpoint_dir="/tmp/x", extra={"note": [1, 2]})
    data = json.loads(json.dumps(config.to_dict()))
    assert TrainerConfig.from_dict(data) == config
    assert config.replace(lr=1.0).lr == 1.0


def test_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown TrainerConfig fields: nope"):
        TrainerConfig.from_dict({"nope": 1})
    assert TrainerConfig.from_dict({"nope": 1, "lr": 0.5}, strict=False).lr == 0.5
    # the scheduler's settings, named as such: the trainer takes them from each batch
    with pytest.raises(ValueError, match=r"batch_groups, temperature.*SARA_GROUP_SIZE"):
        TrainerConfig.from_dict({"batch_groups": 64, "temperature": 0.7})
    for bad in ({"advantage_estimator": "ppo"}, {"lr": 0}, {"threads": 0}, {"clip_eps_low": 1.0},
                {"kl_coef": -1}, {"batch_wait_s": -1}, {"loss_aggregation": "sum"}):
        with pytest.raises(ValueError, match="invalid TrainerConfig"):
            TrainerConfig(**bad)


def test_lr_warms_up_linearly():
    pytest.importorskip("torch")
    from sara_trainer.updating import learning_rate

    def lr(step, **fields):
        return learning_rate(TrainerConfig(lr=1.0, **fields), step)

    assert [lr(s, lr_warmup_steps=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr(0) == 1.0
    with pytest.raises(ValueError, match="lr_warmup_steps must be >= 0"):
        TrainerConfig(lr_warmup_steps=-1)

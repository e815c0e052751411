"""Checkpoints: identical logits after a round trip, trainer state, `latest`, crash safety."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sara_trainer import checkpoint as ckpt
from sara_trainer.config import TrainerConfig
from sara_trainer.policy import load_checkpoint, load_policy, make_batch


def _logits(model, tokenizer):
    prompts = tokenizer(["12+345=", "7*8=", "999-1="])["input_ids"]
    batch = make_batch(prompts, [[5, 6], [7], [8, 9, 2]], tokenizer.pad_token_id)
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     position_ids=batch.position_ids).logits


def _perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01)


def test_save_load_gives_identical_logits_and_state(tiny, tmp_path):
    model, tokenizer = tiny
    _perturb(model, 1)
    config = TrainerConfig(lr=3e-5, advantage_estimator="rloo", seed=11)
    path = ckpt.save_checkpoint(tmp_path, model, tokenizer, step=7, policy_version=3,
                                config=config, extra={"note": "x"})
    assert path == tmp_path / "step-000007"
    assert (path / "model.safetensors").is_file() and (path / "config.json").is_file()
    assert (tmp_path / "latest").read_text().strip() == "step-000007"
    loaded, loaded_tok, state = load_checkpoint(tmp_path)
    assert torch.equal(_logits(model, tokenizer), _logits(loaded, loaded_tok))
    assert loaded_tok.get_vocab() == tokenizer.get_vocab()
    assert state["step"] == 7 and state["policy_version"] == 3
    assert TrainerConfig.from_dict(state["config"]) == config
    assert state["extra"] == {"note": "x"}
    on_disk = json.loads((path / "trainer_state.json").read_text())
    assert on_disk["config"]["advantage_estimator"] == "rloo"
    # a worker loads the directory as it is
    plain, plain_tok = load_policy(path)
    assert torch.equal(_logits(plain, plain_tok), _logits(model, tokenizer))


def test_latest_resolves_to_the_newest_and_resume_finds_it(tiny, tmp_path):
    model, tokenizer = tiny
    assert ckpt.latest_checkpoint(tmp_path) is None
    for step in (1, 2, 10):
        _perturb(model, step)
        ckpt.save_checkpoint(tmp_path, model, tokenizer, step=step, config={"seed": step})
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step-000010"
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [1, 2, 10]
    assert ckpt.read_trainer_state(tmp_path)["step"] == 10
    assert ckpt.read_trainer_state(tmp_path)["policy_version"] == 10
    resumed, resumed_tok, state = load_checkpoint(tmp_path)
    assert state["path"].endswith("step-000010")
    assert torch.equal(_logits(resumed, resumed_tok), _logits(model, tokenizer))
    # a stale or missing pointer falls back to the highest complete step
    (tmp_path / "latest").write_text("step-000099\n")
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step-000010"
    (tmp_path / "latest").unlink()
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step-000010"
    # pruning keeps the newest
    ckpt.set_latest(tmp_path, tmp_path / "step-000010")
    ckpt.prune_checkpoints(tmp_path, keep=1)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [10]


def test_a_crashed_write_does_not_replace_the_previous_checkpoint(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    first = ckpt.save_checkpoint(tmp_path, model, tokenizer, step=1)
    before = _logits(model, tokenizer)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    _perturb(model, 5)
    monkeypatch.setattr(tokenizer, "save_pretrained", crash)  # weights written, then a crash
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, model, tokenizer, step=2)
    assert ckpt.latest_checkpoint(tmp_path) == first
    assert not (tmp_path / "step-000002").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    loaded, loaded_tok, state = load_checkpoint(tmp_path)
    assert state["step"] == 1 and torch.equal(_logits(loaded, loaded_tok), before)

    # A hard crash (process killed) leaves a temporary directory, or a step directory that
    # never got its trainer_state.json: neither is a checkpoint.
    (tmp_path / ".tmp-step-000003-dead").mkdir()
    (tmp_path / ".tmp-step-000003-dead" / "config.json").write_text("{}")
    half = tmp_path / "step-000004"
    half.mkdir()
    (half / "config.json").write_text("{}")
    (tmp_path / "latest").write_text("step-000004\n")
    assert ckpt.latest_checkpoint(tmp_path) == first
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [1]


def test_resaving_a_step_replaces_it_and_optimizer_state_round_trips(tiny, tmp_path):
    model, tokenizer = tiny
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    optimizer.step()
    ckpt.save_checkpoint(tmp_path, model, tokenizer, step=3, optimizer=optimizer)
    _perturb(model, 9)
    path = ckpt.save_checkpoint(tmp_path, model, tokenizer, step=3, optimizer=optimizer)
    loaded, loaded_tok, _ = load_checkpoint(path)
    assert torch.equal(_logits(loaded, loaded_tok), _logits(model, tokenizer))
    fresh = torch.optim.AdamW(loaded.parameters(), lr=1e-3)
    load_checkpoint(path, optimizer=fresh)
    assert fresh.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]

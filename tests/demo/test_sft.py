"""SFT warm start: a few seconds of seeded training lower the answer-token loss, deterministically."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from sara_demo.sft import lr_factor, sft
from sara_trainer.policy import load_policy


def test_a_short_seeded_run_lowers_the_loss(tiny_dir):
    model, tokenizer = load_policy(tiny_dir)
    result = sft(model, tokenizer, max_steps=30, batch_size=64, lr=3e-3, warmup_steps=5,
                 seed=0, progress=False)
    assert result.steps == 30 and len(result.losses) == 30
    first, last = sum(result.losses[:3]) / 3, sum(result.losses[-3:]) / 3
    assert last < first - 1.0, result.losses
    assert result.answer_tokens > 0 and result.total_tokens > result.answer_tokens
    assert result.tokens_per_s > 0
    assert not model.training  # handed back in eval mode, dropout off
    assert model.config.resid_pdrop == 0.0


def test_same_seed_same_losses_and_weights(tiny_dir):
    runs = []
    for _ in range(2):
        model, tokenizer = load_policy(tiny_dir)
        result = sft(model, tokenizer, max_steps=4, batch_size=32, seed=3, progress=False)
        runs.append((result.losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all((a == b).all() for a, b in zip(runs[0][1], runs[1][1]))
    model, tokenizer = load_policy(tiny_dir)
    other = sft(model, tokenizer, max_steps=4, batch_size=32, seed=4, progress=False)
    assert other.losses != runs[0][0]


def test_max_seconds_stops_and_progress_bar_runs(tiny_dir):
    model, tokenizer = load_policy(tiny_dir)
    result = sft(model, tokenizer, max_seconds=0.5, batch_size=16, seed=0, progress=True)
    assert result.steps >= 1 and result.seconds >= 0.5


def test_lr_schedule():
    assert lr_factor(0.0, 0, 10, "cosine", 0.1) == pytest.approx(0.1)      # warm-up
    assert lr_factor(0.0, 10, 10, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(0.5, 50, 10, "cosine", 0.1) == pytest.approx(0.55)
    assert lr_factor(1.0, 99, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(0.7, 99, 10, "constant", 0.1) == 1.0
    with pytest.raises(ValueError):
        sft(None, None)

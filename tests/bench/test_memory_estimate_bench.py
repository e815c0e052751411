"""bench/memory_estimate.py: the one- and two-layer probes extrapolate to the full depth as a
probe of the full-depth model measures it."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from sara_trainer.memory import probe_activations  # noqa: E402

from .test_allocation_bench import _load  # noqa: E402

bench = _load("bench_memory_estimate", "memory_estimate.py")

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=5, num_attention_heads=2,
             num_key_value_heads=1)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_depth_extrapolation_matches_the_full_model(monkeypatch, autocast):
    from transformers import Qwen2ForCausalLM

    monkeypatch.setattr(bench, "VOCAB", 97)    # a small head: the layers dominate the probe
    acts = bench.activations_of(SMALL, autocast, checkpointing=False, chunk_rows=64)
    torch.manual_seed(0)
    full = Qwen2ForCausalLM(bench.qwen2_config(SMALL, 5))
    per_token, squared, fixed = probe_activations(full, autocast)
    assert acts.per_token == pytest.approx(per_token, rel=0.05)
    assert acts.per_token_squared == pytest.approx(squared, rel=0.05, abs=1.0)
    assert acts.fixed == pytest.approx(fixed, rel=0.05, abs=4096)
    assert acts.layers == 5 and acts.hidden == 64


def test_estimate_counts_sixteen_bytes_a_parameter(monkeypatch):
    monkeypatch.setattr(bench, "VOCAB", 97)
    n, e = bench.estimate(SMALL, 2048, None, checkpointing=True, chunk_rows=64)
    assert e.params == 4 * n and e.grads == 4 * n and e.optimizer == 8 * n
    assert e.activations > 2048 * 5 * 64 * 4      # at least each layer's input for every token

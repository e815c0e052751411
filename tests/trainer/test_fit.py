"""Device/dtype resolution and token-budget micro-batches."""

from tests._need import need

need("torch", "torch (the trainer extra; CI installs it)")

import torch

from sara_trainer.fit import (autocast_dtype, resolve_device, resolve_dtype,
                              token_chunks)
from sara_trainer.policy import make_batch


def test_device_and_dtype_defaults():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    # fp32 master weights everywhere under auto; bf16 compute (autocast) on CUDA only
    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("auto", "cuda") is torch.float32
    assert autocast_dtype("auto", "cuda") is torch.bfloat16
    assert autocast_dtype("auto", "cuda:1") is torch.bfloat16
    assert autocast_dtype("auto", "cpu") is None
    assert resolve_dtype("bfloat16", "cuda") is torch.bfloat16
    assert autocast_dtype("bfloat16", "cuda") is None


def test_token_chunks_respect_budget_and_cover_every_row():
    prompts = [3, 5, 2, 4, 4, 1, 6]
    completions = [2, 7, 0, 3, 9, 1, 2]
    for budget in (0, 8, 12, 20, 40):
        chunks = token_chunks(prompts, completions, max_rows=3, max_tokens=budget)
        assert [i for c in chunks for i in c] == list(range(len(prompts)))
        for c in chunks:
            assert len(c) <= 3
            batch = make_batch([[1] * prompts[i] for i in c], [[1] * completions[i] for i in c], 0)
            assert budget == 0 or len(c) == 1 or batch.input_ids.numel() <= budget


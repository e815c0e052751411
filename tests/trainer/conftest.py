"""Trainer-test fixtures: a tiny GPT-2 policy built once per session (nothing downloaded).

Tests that need torch/transformers skip without them; the task and config tests do not need them.
Each test here runs torch on one thread (restored afterwards): on the 2-core CI box, when other
processes share it, two OpenMP threads wait on each other and a training step gets 5x slower,
while for these tiny tensors one thread costs little when the box is idle.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_torch_thread():
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny"), TinyConfig(seed=0))


@pytest.fixture()
def tiny(tiny_dir):
    """A fresh (model, tokenizer) from the session's tiny policy directory."""
    from sara_trainer.policy import load_policy

    return load_policy(tiny_dir)

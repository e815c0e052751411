"""sara_client.hf_compat: the KV cache goes in and comes out under the name the model's own
forward uses, on transformers releases before and after the rename to ``cache``."""

from __future__ import annotations

from types import SimpleNamespace

from sara_client.hf_compat import cache_argument, returned_cache


class Before:
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return SimpleNamespace(past_key_values=("old",))


class After:
    def forward(self, input_ids=None, cache=None, use_cache=None):
        return SimpleNamespace(cache=("new",), past_key_values=None)


def test_the_argument_is_the_one_the_forward_declares():
    assert cache_argument(Before()) == "past_key_values"
    assert cache_argument(After()) == "cache"


def test_the_returned_cache_is_read_under_either_name():
    assert returned_cache(Before().forward()) == ("old",)
    assert returned_cache(After().forward()) == ("new",)


def test_the_installed_transformers_takes_what_cache_argument_names(tmp_path):
    import pytest

    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from sara_trainer.policy import load_policy
    from sara_trainer.tiny import build_tiny_policy

    model, _ = load_policy(build_tiny_policy(tmp_path))
    ids = torch.tensor([[3, 4, 5]])
    first = model(input_ids=ids, use_cache=True)
    again = model(input_ids=ids[:, -1:], use_cache=True,
                  **{cache_argument(model): returned_cache(first)})
    assert returned_cache(again) is not None and again.logits.shape[1] == 1

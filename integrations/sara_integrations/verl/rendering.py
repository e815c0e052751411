"""Prompts to token ids for the verl classes, the way SARA's workers and trainer render them
(``sara_client.chat``), so the sampler trains on the very prompt tokens that were generated
from, whichever side generated them."""

from __future__ import annotations

from typing import Any, Callable

from sara_client.chat import RenderedPrompts


def pad_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id, else 0 (padding is masked out anyway)."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    return 0


def prompt_encoder(tokenizer: Any) -> tuple[Callable[[Any], list[int]], int]:
    """(encode, pad id) for a tokenizer, or for a tokenizer path / hub name (loaded with
    ``transformers.AutoTokenizer``)."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=True)
    return RenderedPrompts(tokenizer), pad_id(tokenizer)

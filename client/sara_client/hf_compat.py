"""Calling a Hugging Face causal LM with a KV cache the same way on every transformers release
the project admits, shared by the hf worker backend and the trainer (nothing here imports
transformers: it reads the model's own forward signature).

transformers 5.2x renamed the forward's ``past_key_values`` argument and output to ``cache`` and
warns on the old name until 5.40 removes it; the releases before only know the old name.
"""

from __future__ import annotations

import inspect
from typing import Any


def cache_argument(model: Any) -> str:
    """The name `model`'s forward takes its KV cache under: ``cache`` or ``past_key_values``."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned, under either name."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values

"""Fitting the trainer on a device: which device and dtype, micro-batches by token budget, and the
model prepared for training (activation checkpointing, after the memory probe of :mod:`.memory`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .memory import ActivationModel, activation_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    """``auto`` is ``cuda`` when torch sees a GPU, else ``cpu``; anything else as given."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """The dtype the weights are kept in: float32 under ``auto`` (on CUDA the compute is bf16
    through autocast, see :func:`autocast_dtype`: AdamW updates of ~lr = 1e-6 relative size vanish
    in bf16 weights, whose spacing is 2^-8, so pure-bf16 weights would barely train), else as
    named (``bfloat16``: half the weight, gradient and optimiser memory, with that caveat)."""
    if dtype == "auto":
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype is auto or one of {', '.join(DTYPES)}, not {dtype!r}")
    return DTYPES[dtype]


def autocast_dtype(dtype: str, device: str) -> torch.dtype | None:
    """bf16 autocast for the forward under ``auto`` on CUDA; None (no autocast) otherwise, and
    on CPU, where bf16 matmuls are slow and the tests compare fp32 numbers."""
    if dtype == "auto" and torch.device(device).type == "cuda":
        return torch.bfloat16
    return None


def token_chunks(prompt_lens: Sequence[int], completion_lens: Sequence[int], max_rows: int,
                 max_tokens: int) -> list[range]:
    """Consecutive row ranges of at most `max_rows` rows whose padded size, rows x (longest
    prompt + longest completion) as :func:`make_batch` lays them out, stays within `max_tokens`
    (0: no token budget). A row longer than the budget still gets a micro-batch of its own."""
    chunks: list[range] = []
    start, wide_p, wide_c = 0, 0, 0
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        grown_p, grown_c = max(wide_p, p), max(wide_c, max(c, 1))
        rows = i - start + 1
        over = rows > max_rows or (max_tokens > 0 and (grown_p + grown_c) * rows > max_tokens)
        if over and i > start:
            chunks.append(range(start, i))
            start, grown_p, grown_c = i, p, max(c, 1)
        wide_p, wide_c = grown_p, grown_c
    if start < len(prompt_lens):
        chunks.append(range(start, len(prompt_lens)))
    return chunks


def prepare_model(model, config, autocast: torch.dtype | None = None) -> ActivationModel:
    """Probe the model's activation memory, then turn on gradient checkpointing when configured;
    returns what the first step's memory estimate is built from (see :mod:`.memory`)."""
    activations = activation_model(model, config.gradient_checkpointing,
                                   config.logprob_chunk_rows, autocast)
    if config.gradient_checkpointing:
        # non-reentrant: works with inputs that need no grad, and with the chunked head;
        # transformers 5 renamed the switch (the old name warns), 4.x only has the old one
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
    return activations

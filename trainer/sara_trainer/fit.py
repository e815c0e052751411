"""Fitting the trainer on a device: which device and dtype, micro-batches by token budget, and a
memory estimate printed at start (so an OOM is predicted in the log, not discovered by a crash
loop that restarts into the same OOM)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GIB = 1024 ** 3


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


@dataclass
class MemoryEstimate:
    """Bytes the trainer needs on its device, by kind (a lower bound: no allocator slack)."""

    params: int
    grads: int
    optimizer: int
    activations: int
    reference: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.reference

    def line(self) -> str:
        """One log line, in GiB."""
        parts = [f"{name} {getattr(self, name) / GIB:.2f}" for name in
                 ("params", "grads", "optimizer", "activations", "reference")]
        return f"memory estimate (GiB): {', '.join(parts)}; total {self.total / GIB:.2f}"


def estimate_memory(model, micro_batch_tokens: int, gradient_checkpointing: bool,
                    with_reference: bool = False, chunk_rows: int = 1024) -> MemoryEstimate:
    """Rough bytes for training `model` as loaded, on micro-batches of `micro_batch_tokens`
    tokens: AdamW keeps two moments per parameter in the parameter dtype; activations are
    counted per layer per token (about 34 hidden-widths saved per layer without checkpointing,
    one with it) plus one fp32 logits chunk of the output head."""
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    width = params[0].element_size() if params else 4
    config = model.config
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 0)
    layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 0)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    per_layer = hidden * width * (1 if gradient_checkpointing else 34)
    activations = micro_batch_tokens * layers * per_layer + 2 * chunk_rows * vocab * 4
    return MemoryEstimate(params=n * width, grads=n * width, optimizer=2 * n * width,
                          activations=activations, reference=n * width if with_reference else 0)


def prepare_model(model, config) -> MemoryEstimate:
    """Turn on gradient checkpointing when configured and return the memory estimate for
    `config`'s micro-batches (the token budget, else rollouts x the longest possible row)."""
    if config.gradient_checkpointing:
        # non-reentrant: works with inputs that need no grad, and with the chunked head;
        # transformers 5 renamed the switch (the old name warns), 4.x only has the old one
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
    tokens = config.micro_batch_tokens or config.micro_batch_rollouts * (
        config.max_new_tokens + 512)
    return estimate_memory(model, tokens, config.gradient_checkpointing,
                           with_reference=config.kl_coef > 0,
                           chunk_rows=config.logprob_chunk_rows)

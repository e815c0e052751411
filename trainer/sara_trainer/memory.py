"""What the trainer's memory will be, and what it was: an estimate for the first batch's shapes,
said before the first step runs (so an OOM is predicted in the log, not discovered by a crash
loop that restarts into the same OOM), and the measured peak of that step beside it.

The activation part is measured, not assumed: three probe rows run through the model's body
with a hook on what autograd saves for backward, which gives the bytes kept per token (and per
squared token, for attention weights) for this model, attention implementation and dtype. A
formula per layer (Megatron's 34 bytes per token and hidden width at 16 bits) fits one
architecture; the probe fits any. The measurement is the growth of the peak resident set over
the first step on CPU (the kernel's high-water mark, reset just before), and the peak of
allocated memory on CUDA.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .logprobs import head_and_body
from .policy import context_size

GIB = 1024 ** 3
PROBE_TOKENS = 64           # the longest probe row (the others are a half and a quarter)


@dataclass
class MemoryEstimate:
    """Bytes the trainer needs on its device, by kind (no allocator slack), for micro-batches of
    the shape `shape` names."""

    params: int
    grads: int
    optimizer: int
    activations: int
    reference: int = 0
    shape: str = ""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.reference

    def line(self) -> str:
        """One log line, in GiB."""
        parts = [f"{name} {getattr(self, name) / GIB:.3f}" for name in
                 ("params", "grads", "optimizer", "activations", "reference")]
        where = f" for micro-batches of {self.shape}" if self.shape else ""
        return f"memory estimate (GiB): {', '.join(parts)}; total {self.total / GIB:.3f}{where}"


def saved_bytes(model, tokens: int, autocast: torch.dtype | None = None) -> int:
    """Bytes autograd keeps for backward on one row of `tokens` tokens through the model's body
    (the body's output included, the parameters excluded), without activation checkpointing.
    Tensors that share storage count once."""
    body, _ = head_and_body(model)
    forward = body if body is not None else model
    device = next(model.parameters()).device
    vocab = int(getattr(model.config, "vocab_size", 0) or 2)
    ids = torch.arange(tokens, device=device).remainder(vocab).unsqueeze(0)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.enable_grad(), torch.autocast(device.type, dtype=autocast or torch.float32,
                                             enabled=autocast is not None), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        result = out.last_hidden_state if body is not None else out.logits
        # saved tensors stay alive until `out` goes, so no address is reused while counting
        kept.setdefault(result.untyped_storage().data_ptr(), result.untyped_storage().nbytes())
        total = sum(kept.values())
    del out, result
    return total


def fit_row_bytes(lengths: Sequence[int], kept: Sequence[int]) -> tuple[float, float, int]:
    """(a, b, c) with kept = c + a*T + b*T^2 through three probes (T, kept): the per-token part,
    the part that grows with the square of the row (attention weights kept by eager attention),
    and what does not grow at all (autocast's cached low-precision weights). Negative parts,
    which only rounding can give, are set to 0."""
    (t1, t2, t3), (k1, k2, k3) = lengths, kept
    slope12, slope23 = (k2 - k1) / (t2 - t1), (k3 - k2) / (t3 - t2)
    square = max(0.0, (slope23 - slope12) / (t3 - t1))
    linear = max(0.0, slope23 - square * (t2 + t3))
    return linear, square, max(0, int(k3 - linear * t3 - square * t3 * t3))


def probe_activations(model, autocast: torch.dtype | None = None,
                      tokens: int = PROBE_TOKENS) -> tuple[float, float, int]:
    """:func:`fit_row_bytes` of three probe rows of `tokens`, half and a quarter as many tokens
    (at most the model's context)."""
    long = max(4, min(tokens, context_size(model)))
    lengths = (long // 4, long // 2, long)
    return fit_row_bytes(lengths, [saved_bytes(model, t, autocast) for t in lengths])


@dataclass
class ActivationModel:
    """How activation memory grows with a micro-batch, for one model: the probe's bytes per
    token, and what activation checkpointing keeps instead (each layer's input, plus one layer
    recomputed at a time in backward), plus the output head's chunk of fp32 logits and what the
    probe kept whatever the length."""

    per_token: float
    per_token_squared: float
    fixed: int
    layers: int
    hidden: int
    width: int
    vocab: int
    chunk_rows: int
    checkpointing: bool

    def row_bytes(self, row_tokens: int) -> float:
        """What one row of `row_tokens` tokens keeps for backward, without checkpointing."""
        return self.per_token * row_tokens + self.per_token_squared * row_tokens ** 2

    def bytes_for(self, rows: int, row_tokens: int, completion_positions: int) -> int:
        row = self.row_bytes(row_tokens)
        if self.checkpointing:
            row = row_tokens * self.layers * self.hidden * self.width + row / max(1, self.layers)
        # a head chunk holds its logits and, for the entropy, their softmax, in fp32
        head = 2 * min(self.chunk_rows, completion_positions) * self.vocab * 4
        return int(rows * row) + head + self.fixed


def activation_model(model, gradient_checkpointing: bool, chunk_rows: int,
                     autocast: torch.dtype | None = None) -> ActivationModel:
    """Probe `model` (before checkpointing is switched on) and describe its activation growth."""
    config = model.config
    params = list(model.parameters())
    per_token, per_token_squared, fixed = probe_activations(model, autocast)
    return ActivationModel(
        per_token=per_token, per_token_squared=per_token_squared, fixed=fixed,
        layers=int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 1),
        hidden=int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 0),
        width=params[0].element_size() if params else 4,
        vocab=int(getattr(config, "vocab_size", 0) or 0), chunk_rows=max(1, chunk_rows),
        checkpointing=gradient_checkpointing)


def estimate_memory(model, activations: ActivationModel, batches: Sequence[Any],
                    with_reference: bool = False, critic_parameters: int = 0) -> MemoryEstimate:
    """The estimate for training `model` on `batches` (TokenBatch micro-batches): AdamW's two
    moments and the gradients in the parameter dtype, and the largest micro-batch's activations
    (micro-batches run one after another, so the largest sets the peak). A PPO critic's
    parameters count with the policy's; its passes run after the policy's, so its activations
    are not added to them."""
    n = sum(p.numel() for p in model.parameters()) + critic_parameters
    width = activations.width
    largest = max(batches, key=lambda b: b.input_ids.numel(), default=None)
    rows, row_tokens = (tuple(largest.input_ids.shape) if largest is not None else (0, 0))
    completions = max((b.completion_ids.numel() for b in batches), default=0)
    return MemoryEstimate(
        params=n * width, grads=n * width, optimizer=2 * n * width,
        activations=activations.bytes_for(rows, row_tokens, completions),
        reference=(n - critic_parameters) * width if with_reference else 0,
        shape=f"up to {rows} rows of {row_tokens} tokens")


def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _return_free_heap() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim), so that a step that
    reuses memory an earlier phase freed (the demo's second arm, a long test process) still
    shows as growth of the resident set; a no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMeter:
    """The peak memory of a stretch of work: on CUDA the allocator's peak; on Linux CPU the
    growth of the resident set's high-water mark, which writing 5 to /proc/self/clear_refs resets
    to the current size (after the heap's free pages went back). Elsewhere it measures nothing
    (None)."""

    def __init__(self, device: str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.start_kib: int | None = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        _return_free_heap()
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.start_kib = None
            return
        self.start_kib = _proc_status_kib("VmRSS")

    def peak_bytes(self) -> int | None:
        """Bytes at the peak since start: absolute on CUDA, the growth on CPU."""
        if self.cuda:
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated())
        peak = _proc_status_kib("VmHWM")
        if self.start_kib is None or peak is None:
            return None
        return max(0, peak - self.start_kib) * 1024


class FirstStepMemory:
    """Says the estimate for the first batch before it trains, and what that step measured after
    it (once per process). On CPU the comparison leaves out what was resident before the step
    (weights, the reference, a resumed optimiser's moments); on CUDA it is the whole peak."""

    def __init__(self, model, activations: ActivationModel, device: str, with_reference: bool,
                 say: Callable[[str], None], critic_parameters: int = 0) -> None:
        self.model, self.activations, self.with_reference = model, activations, with_reference
        self.critic_parameters = critic_parameters
        self.meter, self.say = PeakMeter(device), say
        self.estimate: MemoryEstimate | None = None
        self.comparable = 0
        self.done = False

    def before(self, batches: Sequence[Any], optimizer_ready: bool) -> None:
        if self.done or self.estimate is not None:
            return
        self.estimate = estimate_memory(self.model, self.activations, batches, self.with_reference,
                                        self.critic_parameters)
        e = self.estimate
        self.comparable = e.total if self.meter.cuda else (
            e.grads + e.activations + (0 if optimizer_ready else e.optimizer))
        self.say(e.line())
        self.meter.start()

    def after(self) -> None:
        if self.done or self.estimate is None:
            return
        self.done = True
        measured = self.meter.peak_bytes()
        if measured is None:
            return
        what = "peak allocated" if self.meter.cuda else "growth of the peak resident set"
        ratio = f"{self.comparable / measured:.2f}x" if measured else "n/a"
        self.say(f"memory measured over the first step (GiB): {what} {measured / GIB:.3f}; "
                 f"the estimate of the same {self.comparable / GIB:.3f} ({ratio} the measured)")

"""The trainer's memory estimate for a model shape whose weights are not here (docs/gpu.md's
memory split): nothing is downloaded. The probe of sara_trainer.memory runs on random-weight
copies of the shape with one and with two layers, and the per-layer growth extrapolates to the
full depth (every decoder layer is the same shape); parameters are counted on the meta device.

    python bench/memory_estimate.py [--micro-batch-tokens 16384]
        [--checkpointing|--no-checkpointing] [--autocast bf16|none] [--models 0.5B,1.5B,3B]

Prints one line per model: parameters, and the estimate's parts in GiB. An estimate, not a
measurement: the first step of `sara train` prints what it measured beside it.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from sara_trainer.memory import GIB, ActivationModel, MemoryEstimate, probe_activations

# Qwen2.5's published shapes (config.json of each Qwen/Qwen2.5-*-Instruct)
QWEN25 = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2),
    "3B": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2),
}
VOCAB = 151_936


def qwen2_config(shape: dict, layers: int):
    from transformers import Qwen2Config

    return Qwen2Config(**{**shape, "num_hidden_layers": layers}, vocab_size=VOCAB,
                       tie_word_embeddings=True, max_position_embeddings=32_768)


def activations_of(shape: dict, autocast: torch.dtype | None, checkpointing: bool,
                   chunk_rows: int) -> ActivationModel:
    """The full depth's activation model, from probes of one- and two-layer copies."""
    from transformers import Qwen2ForCausalLM

    probes = []
    for layers in (1, 2):
        torch.manual_seed(0)
        probes.append(probe_activations(Qwen2ForCausalLM(qwen2_config(shape, layers)), autocast))
    one, two = probes
    depth = shape["num_hidden_layers"]
    linear, square, fixed = (a + (depth - 1) * (b - a) for a, b in zip(one, two))
    return ActivationModel(
        per_token=linear, per_token_squared=square, fixed=int(fixed), layers=depth,
        hidden=shape["hidden_size"], width=4, vocab=VOCAB, chunk_rows=chunk_rows,
        checkpointing=checkpointing)


def estimate(shape: dict, tokens: int, autocast: torch.dtype | None, checkpointing: bool,
             chunk_rows: int = 1024) -> tuple[int, MemoryEstimate]:
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in Qwen2ForCausalLM(qwen2_config(
            shape, shape["num_hidden_layers"])).parameters())
    acts = activations_of(shape, autocast, checkpointing, chunk_rows)
    rows = max(1, tokens // 1024)
    return n, MemoryEstimate(params=4 * n, grads=4 * n, optimizer=8 * n,
                             activations=acts.bytes_for(rows, tokens // rows, tokens // 2),
                             shape=f"{tokens:,} tokens")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro-batch-tokens", type=int, default=16_384)
    p.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--autocast", choices=["bf16", "none"], default="bf16")
    p.add_argument("--models", default=",".join(QWEN25))
    args = p.parse_args()
    autocast = torch.bfloat16 if args.autocast == "bf16" else None
    for name in args.models.split(","):
        n, e = estimate(QWEN25[name], args.micro_batch_tokens, autocast, args.checkpointing)
        parts = {k: round(v / GIB, 2) for k, v in dataclasses.asdict(e).items()
                 if isinstance(v, int)}
        print(f"Qwen2.5-{name}: {n / 1e9:.3f}B parameters; {parts}; total "
              f"{e.total / GIB:.1f} GiB ({e.total / 1e9:.1f} GB) for micro-batches of {e.shape}")


if __name__ == "__main__":
    main()

"""Test policies: a tiny random GPT-2, and "constant" ones whose every next token is one character.

A constant policy is the tiny model with its final layer norm's weight zeroed and its bias set to
a unit vector ``u``, and the embedding of the chosen character set to ``100 u``: the logits
(tied embeddings) are ``100`` for that character and below ``1`` for every other token, whatever
the input. Greedy or sampled, it writes the character until ``max_tokens`` (never an end token),
with logprobs ~ 0, which makes weight switches and aborts easy to see.
"""

from __future__ import annotations

from pathlib import Path


def write_constant_policy(source: Path, out: Path, char: str) -> Path:
    """Save ``source``'s model, turned into a policy that always writes ``char``, to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    (token,) = tokenizer(char)["input_ids"]
    with torch.no_grad():
        unit = torch.zeros(model.config.n_embd)
        unit[0] = 1.0
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(unit)
        model.transformer.wte.weight[token] = 100.0 * unit
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out

"""A tiny policy made here: a character tokenizer and a small GPT-2, saved as a Hugging Face model.

Nothing is downloaded. The directory `build_tiny_policy` writes loads with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`, and vLLM can serve it
(head dim 32 >= vLLM CPU's minimum; float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Characters the synthetic tasks use. Index 0..3 are special tokens.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARSET = "0123456789+-*/=()<>., ?:abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
# A chat template in the tokenizer's own characters, so chat prompts (the gsm8k and math recipes
# make them) run on the tiny policy through the same render path as on a real instruct model.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")


@dataclass(frozen=True)
class TinyConfig:
    """Shape of the tiny GPT-2. The defaults are the feasibility-checked ~600K-parameter model."""

    width: int = 128
    layers: int = 3
    heads: int = 4
    context: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.width % self.heads or self.width // self.heads < 32:
            raise ValueError("width / heads must be a whole number >= 32 (vLLM needs head dim "
                             f">= 32); got width={self.width}, heads={self.heads}")


def build_char_tokenizer(charset: str = CHARSET):
    """A fast tokenizer with one token per character of `charset`, loadable by AutoTokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in charset:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join back without spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>",
                                        eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_policy(out_dir: str | Path, config: TinyConfig = TinyConfig()) -> Path:
    """Write a freshly initialised tiny GPT-2 and its tokenizer to `out_dir`; returns the path."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    torch.manual_seed(config.seed)
    model_config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=config.context, n_embd=config.width,
        n_layer=config.layers, n_head=config.heads, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32")
    model = GPT2LMHeadModel(model_config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out

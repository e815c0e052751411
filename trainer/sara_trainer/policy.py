"""Policy helpers: load a Hugging Face causal LM (or a checkpoint), sample groups with per-token
logprobs, and line prompt + completion tokens up for training.

Layout used everywhere here (sampling and training alike): prompts are LEFT-padded to a common
width P, completions follow from column P on and are right-padded; position ids count only real
tokens, so a row's numbers do not depend on what it was batched with. Prompts are encoded with the
tokenizer's own ``__call__`` (the char tokenizer adds no special tokens), the same way the worker
backends and vLLM encode them, so trainer logprobs and worker logprobs refer to the same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sara_client.chat import chat_messages, is_chat, render_prompt
from sara_client.hf_compat import cache_argument, returned_cache
from sara_client.hf_kernels import fuse_gelu

from .checkpoint import OPTIMIZER_FILE, STATE_FILE, latest_checkpoint, resolve

PromptLike = str | Mapping[str, Any]


def load_policy(path: str | Path, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, train: bool = False,
                attn_implementation: str | None = None):
    """(model, tokenizer) from a directory that ``from_pretrained`` reads (or a checkpoint root
    with a ``latest`` pointer). The model is in eval mode unless `train`; dropout is left as saved.

    On CPU attention defaults to ``eager``: for these short sequences torch's SDPA path is several
    times slower on CPU (measured: 8x for a tiny GPT-2 training step with padding masks).
    A ``gelu_new`` activation runs as torch's fused kernel (:func:`sara_client.hf_kernels.fuse_gelu`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if (path / "latest").is_file() and not (path / "config.json").exists():
        resolved = latest_checkpoint(path)
        if resolved is None:
            raise FileNotFoundError(f"no complete checkpoint under {path}")
        path = resolved
    tokenizer = AutoTokenizer.from_pretrained(path)
    if attn_implementation is None and torch.device(device).type == "cpu":
        attn_implementation = "eager"
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs).to(device)
    fuse_gelu(model)
    model.train(train)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_checkpoint(path: str | Path, device: str = "cpu", dtype=None, optimizer=None):
    """(model, tokenizer, trainer_state) from a checkpoint directory or a root (→ its latest).

    With `optimizer`, also loads ``optimizer.pt`` into it when the checkpoint has one.
    """
    resolved = resolve(path)
    model, tokenizer = load_policy(resolved, device=device, dtype=dtype or torch.float32)
    state = json.loads((resolved / STATE_FILE).read_text())
    state["path"] = str(resolved)
    if optimizer is not None and (resolved / OPTIMIZER_FILE).is_file():
        optimizer.load_state_dict(torch.load(resolved / OPTIMIZER_FILE, map_location=device))
    return model, tokenizer, state


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Set every dropout probability to 0, in the modules and in the saved config (RL wants
    logp_new == logp_old at the first step, and synthetic data never repeats enough to overfit)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout",
                 "hidden_dropout", "attention_dropout", "dropout"):
        if config is not None and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
    return model


def context_size(model) -> int:
    config = model.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 30


def _content(prompt: PromptLike) -> Any:
    return prompt["prompt"] if isinstance(prompt, Mapping) else prompt


def prompt_text(prompt: PromptLike) -> str:
    """A prompt as one string (for reports and buckets); chat messages' contents joined."""
    content = _content(prompt)
    if is_chat(content):
        return "\n".join(m["content"] for m in chat_messages(content))
    return str(content)


def encode_prompts(tokenizer, prompts: Sequence[PromptLike]) -> list[list[int]]:
    """Token ids of each prompt as the workers render it (render_prompt: text as the tokenizer
    encodes it by default, chat messages through its chat template)."""
    return [render_prompt(tokenizer, _content(p)) for p in prompts]


# ---------------------------------------------------------------------------------------------
# training layout


@dataclass
class TokenBatch:
    """Prompt + completion rows: prompts left-padded to width P, completions from column P on.

    ``completion_mask[b, j]`` is 1 where ``completion_ids[b, j]`` is a real completion token.
    """

    input_ids: torch.Tensor        # [B, P + Tc]
    attention_mask: torch.Tensor   # [B, P + Tc]
    position_ids: torch.Tensor     # [B, P + Tc]
    completion_ids: torch.Tensor   # [B, Tc]
    completion_mask: torch.Tensor  # [B, Tc] float
    prompt_width: int              # P


def make_batch(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
               pad_id: int, device: str | torch.device = "cpu") -> TokenBatch:
    """Lay prompts and their completions out for one forward pass (see :class:`TokenBatch`)."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError("one completion per prompt row")
    if not prompt_ids:
        raise ValueError("empty batch")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    rows = len(prompt_ids)
    width = max(len(p) for p in prompt_ids)
    tc = max(1, max(len(c) for c in completion_ids))
    ids = torch.full((rows, width + tc), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width + tc), dtype=torch.long)
    cmask = torch.zeros((rows, tc), dtype=torch.float32)
    for b, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[b, width - len(p):width] = torch.as_tensor(list(p), dtype=torch.long)
        mask[b, width - len(p):width] = 1
        if len(c):
            ids[b, width:width + len(c)] = torch.as_tensor(list(c), dtype=torch.long)
            mask[b, width:width + len(c)] = 1
            cmask[b, :len(c)] = 1.0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return TokenBatch(ids.to(device), mask.to(device), positions.to(device),
                      ids[:, width:].to(device), cmask.to(device), width)


def completion_logprobs(model, batch: TokenBatch, temperature: float = 1.0,
                        with_entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log p(completion token | prefix) under logits / temperature, [B, Tc], with the
    gradient; 0 at padding. With `with_entropy`, also the exact per-token entropy (no gradient)."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, use_cache=False)
    p, tc = batch.prompt_width, batch.completion_ids.shape[1]
    logits = out.logits[:, p - 1:p - 1 + tc].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    logp = logp * batch.completion_mask
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.completion_mask
    return logp, entropy


# ---------------------------------------------------------------------------------------------
# sampling


@dataclass
class Samples:
    """k completions per prompt, prompt-major: rows ``i*k .. i*k+k-1`` belong to prompt i.

    ``token_ids[r]`` holds the generated ids including the final eos when there is one, and
    ``logprobs[r]`` their log-probabilities under the sampling distribution (logits/temperature;
    the raw distribution when greedy). ``finish_reasons[r]`` is ``"stop"`` (eos) or ``"length"``.
    """

    k: int
    prompts: list[str]
    prompt_ids: list[list[int]]
    completions: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.completions)

    def group(self, i: int) -> list[str]:
        """The k completions of prompt i."""
        return self.completions[i * self.k:(i + 1) * self.k]


@torch.no_grad()
def sample(model, tokenizer, prompts: Sequence[PromptLike], k: int = 1, max_new_tokens: int = 8,
           temperature: float = 1.0, generator: torch.Generator | None = None,
           batch_size: int = 1024) -> Samples:
    """Sample `k` completions for each prompt (temperature 0: greedy), with per-token logprobs.

    Generation stops at the tokenizer's eos or after `max_new_tokens` (cut further so prompt +
    completion fits the model's context). `generator` makes sampling reproducible.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    texts = [prompt_text(p) for p in prompts]
    encoded = encode_prompts(tokenizer, prompts)
    out = Samples(k=k, prompts=texts, prompt_ids=encoded)
    rows = [ids for ids in encoded for _ in range(k)]
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            limit = min(max_new_tokens, context_size(model) - max(len(r) for r in chunk))
            if limit < 1:
                raise ValueError("a prompt fills the model's whole context")
            ids, lps, reasons = _generate(model, chunk, limit, temperature, generator, eos, pad,
                                          device)
            for toks, lp, reason in zip(ids, lps, reasons):
                out.token_ids.append(toks)
                out.logprobs.append(lp)
                out.finish_reasons.append(reason)
                body = toks[:-1] if reason == "stop" else toks
                out.completions.append(tokenizer.decode(body, skip_special_tokens=True))
    finally:
        model.train(was_training)
    return out


def _generate(model, rows: list[list[int]], max_new: int, temperature: float,
              generator: torch.Generator | None, eos: int, pad: int, device
              ) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Decode up to `max_new` tokens after each left-padded row with the KV cache; per row the
    tokens (through eos), their logprobs and the finish reason (stop or length)."""
    ids, mask = _left_padded(rows, pad, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    result = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    past, logits = returned_cache(result), result.logits[:, -1]
    next_pos = positions[:, -1] + 1
    cache_name = cache_argument(model)
    n = len(rows)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    logps: list[torch.Tensor] = []
    for step in range(max_new):
        token, lp = _pick(logits.float(), temperature, generator)
        token = torch.where(done, torch.full_like(token, pad), token)
        tokens.append(token)
        logps.append(torch.where(done, torch.zeros_like(lp), lp))
        done = done | (token == eos)
        if bool(done.all()) or step == max_new - 1:
            break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=device)], dim=1)
        result = model(input_ids=token.unsqueeze(-1), attention_mask=mask,
                       position_ids=next_pos.unsqueeze(-1), use_cache=True, **{cache_name: past})
        past, logits = returned_cache(result), result.logits[:, -1]
        next_pos = next_pos + 1
    return _cut_at_eos(torch.stack(tokens, dim=1).cpu().tolist(),
                       torch.stack(logps, dim=1).cpu().tolist(), eos)


def _left_padded(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of `rows` left-padded to the longest."""
    n, width = len(rows), max(len(r) for r in rows)
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each row (greedy at temperature 0, else sampled) and its logprob."""
    if temperature == 0:
        logp_all = torch.log_softmax(logits, dim=-1)
        token = logp_all.argmax(-1)
    else:
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        probs = logp_all.exp()
        if generator is not None and generator.device != probs.device:
            token = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1)
            token = token.to(probs.device)
        else:
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return token, logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def _cut_at_eos(tok: list[list[int]], lpm: list[list[float]], eos: int
                ) -> tuple[list[list[int]], list[list[float]], list[str]]:
    out_ids, out_lps, reasons = [], [], []
    for row_t, row_l in zip(tok, lpm):
        if eos in row_t:
            end = row_t.index(eos) + 1
            out_ids.append(row_t[:end])
            out_lps.append(row_l[:end])
            reasons.append("stop")
        else:
            out_ids.append(row_t)
            out_lps.append(row_l)
            reasons.append("length")
    return out_ids, out_lps, reasons

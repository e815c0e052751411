"""One way to turn a prompt into token ids, shared by every worker backend and the trainer.

A prompt is plain text or a list of chat messages. The trainer scores the completion tokens a
worker generated *after the prompt tokens it generated from*; if the two sides rendered a chat
prompt differently (one with the template, one without, or with and without the generation
prompt), the trainer would score tokens the policy never saw. Both sides call `render_prompt`, so
they cannot drift. This module imports nothing heavy: the tokenizer is duck-typed (any Hugging
Face tokenizer), which keeps it importable from the SDK, the worker and the trainer alike.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


def is_chat(prompt: Any) -> bool:
    """Whether `prompt` is a list of chat messages (rather than plain text)."""
    return not isinstance(prompt, str) and isinstance(prompt, Sequence)


def chat_messages(prompt: Sequence[Any]) -> list[dict[str, str]]:
    """Chat messages as plain {role, content} dicts (from dicts or ChatMessage models)."""
    out = []
    for m in prompt:
        role = m["role"] if isinstance(m, dict) else m.role
        content = m["content"] if isinstance(m, dict) else m.content
        out.append({"role": str(role), "content": str(content)})
    return out


def render_text(tokenizer: Any, prompt: Any) -> str:
    """The prompt as the text the policy reads: plain text as is; chat messages through the
    tokenizer's chat template, with the assistant turn opened (add_generation_prompt)."""
    if not is_chat(prompt):
        return str(prompt)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("a chat prompt needs a tokenizer with a chat_template; this policy's "
                         "tokenizer has none (register plain-text prompts, or set one)")
    return tokenizer.apply_chat_template(chat_messages(prompt), tokenize=False,
                                         add_generation_prompt=True)


def render_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """Token ids of a prompt, identical on the worker and in the trainer.

    Plain text is tokenized as it always was (`tokenizer(text)`, special tokens included).
    A chat prompt's rendered text already holds the template's special tokens (BOS, role
    markers), so it is tokenized without adding any again."""
    if not is_chat(prompt):
        return list(tokenizer(str(prompt))["input_ids"])
    text = render_text(tokenizer, prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class RenderedPrompts:
    """`render_prompt` for one tokenizer, remembered for the `maxsize` prompts used last.

    A worker renders a group's prompt once for each of its k rollouts, and a revisited pool
    sends it again every epoch: on the learning testbed, tokenizing those repeats held the
    worker's event loop for about a tenth of its busy time. A tokenizer maps one text to one
    list of ids, so a remembered list is the list `render_prompt` would return. Not
    thread-safe: one instance per thread (the worker's event loop, the trainer's thread)."""

    def __init__(self, tokenizer: Any, maxsize: int = 8192) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self.tokenizer, self.maxsize = tokenizer, int(maxsize)
        self._ids: OrderedDict[Any, tuple[int, ...]] = OrderedDict()

    def __call__(self, prompt: Any) -> list[int]:
        """The prompt's token ids, as `render_prompt(self.tokenizer, prompt)` gives them."""
        key = prompt_key(prompt)
        ids = self._ids.get(key)
        if ids is None:
            ids = tuple(render_prompt(self.tokenizer, prompt))
            self._ids[key] = ids
            if len(self._ids) > self.maxsize:
                self._ids.popitem(last=False)
        else:
            self._ids.move_to_end(key)
        return list(ids)

    def __len__(self) -> int:
        return len(self._ids)


def prompt_key(prompt: Any) -> Any:
    """A hashable key equal for prompts that render alike: the text, or the chat messages as
    (role, content) pairs (a tuple, so never equal to a text)."""
    if not is_chat(prompt):
        return str(prompt)
    return tuple((m["role"], m["content"]) for m in chat_messages(prompt))

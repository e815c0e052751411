"""What a prompt may be: plain text or a list of chat messages, bounded like text at the door.

Kept apart from models.py (which re-exports these) so the wire models stay one readable file.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .limits import MAX_CHAT_MESSAGES, MAX_PROMPT_CHARS


class ChatMessage(BaseModel):
    """One chat message of a prompt; workers and the trainer render a message list with the
    policy tokenizer's chat template (sara_client.chat.render_prompt)."""

    model_config = ConfigDict(extra="forbid")  # a typo in a field name is a 422, as elsewhere

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


def _bounded_chat(messages: list[ChatMessage]) -> list[ChatMessage]:
    # Each message is bounded on its own; the whole prompt gets the plain-text prompt's bound so a
    # chat prompt stores no more than a string one may.
    total = sum(len(m.content) for m in messages)
    if total > MAX_PROMPT_CHARS:
        raise ValueError(f"messages hold {total} characters together, over {MAX_PROMPT_CHARS}")
    if not any(m.content for m in messages):
        raise ValueError("every message is empty")
    return messages


ChatPrompt = Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_CHAT_MESSAGES),
                       AfterValidator(_bounded_chat)]
TextPrompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
# A prompt as stored and served: plain text (fed to the tokenizer as is) or chat messages.
PromptContent = Union[TextPrompt, ChatPrompt]
# Answers carry what was stored without re-checking the door's bounds (a read never fails on them).
StoredPrompt = Union[str, list[ChatMessage]]


def prompt_json(prompt: str | list[ChatMessage] | list[dict]) -> str | list[dict]:
    """A prompt as plain JSON data (what the store keeps and ids are derived from); a string is
    returned unchanged, so ids of text prompts are what they always were."""
    if isinstance(prompt, str):
        return prompt
    return [m.model_dump() if isinstance(m, BaseModel) else dict(m) for m in prompt]

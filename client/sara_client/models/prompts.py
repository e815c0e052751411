"""Wire models of prompts: what a prompt may be (plain text or chat messages, bounded at the
door), registering prompts, reading one back with its posterior, and the listing and
enable/disable/delete of `GET /prompts` and `PATCH /prompts/{id}`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..limits import (MAX_CHAT_MESSAGES, MAX_META_BYTES, MAX_META_DEPTH, MAX_PROMPT_CHARS,
                      MAX_PROMPTS_PER_CALL, Identifier, Meta)
from .base import AnswerModel, RequestModel


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


class PromptIn(RequestModel):
    """One prompt to register. Without an id, the service derives one from the content."""

    id: Identifier | None = None
    prompt: PromptContent = Field(description="Plain text, or a list of chat messages "
                                              f"(at most {MAX_CHAT_MESSAGES}) that the policy's "
                                              "chat template renders.")
    answer: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    task: str = Field(default="exact", pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
                      description="Verifier name the worker scores this prompt with.")
    meta: Meta = Field(default_factory=dict,
                       description=f"Free-form metadata (at most {MAX_META_DEPTH} levels deep, "
                                   f"{MAX_META_BYTES} bytes); the sim backend reads p_success.")


class AddPromptsRequest(RequestModel):
    prompts: list[PromptIn] = Field(min_length=1, max_length=MAX_PROMPTS_PER_CALL)


class AddPromptsResponse(AnswerModel):
    ids: list[str]
    created: int = Field(description="How many of the ids were new; re-adding an id is a no-op.")
    content_differs: list[str] = Field(
        default_factory=list, description="Ids already registered with other content: the "
                                          "stored content was kept (register it under a new id).")


class Posterior(AnswerModel):
    alpha: float
    beta: float
    version: int = Field(description="Policy version the counts were last decayed to.")
    epoch: float | None = Field(None, description="Epochs of the pool (prompts consumed per "
                                "prompt) the counts were last decayed to; none before any result.")


class PromptHistory(AnswerModel):
    groups: int = 0
    committed: int = 0
    abandoned: int = 0
    rollouts: int = 0
    successes: int = 0
    last_group_id: str | None = None


class PromptOut(AnswerModel):
    id: str
    prompt: StoredPrompt
    answer: str | None = None
    task: str
    meta: dict[str, Any] = Field(default_factory=dict)
    posterior: Posterior
    history: PromptHistory


PromptState = Literal["enabled", "disabled", "deleted"]
MAX_PAGE = 1000


class PromptSummary(AnswerModel):
    id: str
    prompt: StoredPrompt   # text, or chat messages
    task: str
    state: PromptState
    posterior: Posterior
    history: PromptHistory


class PromptPage(AnswerModel):
    prompts: list[PromptSummary]
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page; none at "
                                    "the end. Prompts changed meanwhile may be missed or repeated.")


class PromptStateRequest(RequestModel):
    enabled: bool = Field(description="False: never open this prompt again (groups in flight "
                                      "finish); true: back into the pool.")


class PromptStateResponse(AnswerModel):
    id: str
    state: PromptState

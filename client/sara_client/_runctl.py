"""Run control in the SDK: the call builders, shared by both clients as ``_base``'s are, and the
sync and async methods on top of them. Every call is idempotent, so every one may be retried."""

from __future__ import annotations

from functools import partial
from typing import Any, AsyncIterator, Iterator

from ._base import Call, segment, parse_model
from .models import (PromptPage, PromptStateRequest, PromptStateResponse, PromptSummary, RunAction,
                     RunControlRequest, RunStatus)


class RunControlCalls:
    """Call builders of run control, for both clients."""

    def _list_prompts_call(self, cursor: int = 0, limit: int = 100) -> Call[Any]:
        return Call("GET", f"/prompts?cursor={int(cursor)}&limit={int(limit)}",
                    partial(parse_model, model=PromptPage))

    def _prompt_enabled_call(self, prompt_id: str, enabled: bool) -> Call[Any]:
        body = PromptStateRequest(enabled=enabled).model_dump(mode="json")
        return Call("PATCH", f"/prompts/{segment(prompt_id)}",
                    partial(parse_model, model=PromptStateResponse), json=body)

    def _delete_prompt_call(self, prompt_id: str) -> Call[Any]:
        return Call("DELETE", f"/prompts/{segment(prompt_id)}",
                    partial(parse_model, model=PromptStateResponse))

    def _run_status_call(self) -> Call[Any]:
        return Call("GET", "/run", partial(parse_model, model=RunStatus))

    def _control_run_call(self, action: RunAction) -> Call[Any]:
        body = RunControlRequest(action=action).model_dump(mode="json")
        return Call("POST", "/run", partial(parse_model, model=RunStatus), json=body)


class SyncRunControl(RunControlCalls):
    """Run control methods of SaraClient (operator token to list, admin to change)."""

    _send: Any

    def list_prompts(self, cursor: int = 0, limit: int = 100) -> PromptPage:
        """One page of prompts with state and posterior; pass ``next_cursor`` on."""
        return self._send(self._list_prompts_call(cursor, limit))  # type: ignore[attr-defined]

    def iter_prompts(self, page_size: int = 100) -> Iterator[PromptSummary]:
        """Every prompt, page by page."""
        cursor: int | None = 0
        while cursor is not None:
            page = self.list_prompts(cursor, page_size)
            yield from page.prompts
            cursor = page.next_cursor

    def set_prompt_enabled(self, prompt_id: str, enabled: bool) -> PromptStateResponse:
        """Disable (never opened again; groups in flight finish) or re-enable a prompt."""
        return self._send(self._prompt_enabled_call(prompt_id, enabled))  # type: ignore

    def delete_prompt(self, prompt_id: str) -> PromptStateResponse:
        """Delete a prompt and its posterior; its groups in flight are still delivered."""
        return self._send(self._delete_prompt_call(prompt_id))  # type: ignore[attr-defined]

    def run_status(self) -> RunStatus:
        """running | paused | draining | drained."""
        return self._send(self._run_status_call())  # type: ignore[attr-defined]

    def control_run(self, action: RunAction) -> RunStatus:
        """pause | resume | drain the run; returns its state after."""
        return self._send(self._control_run_call(action))  # type: ignore[attr-defined]


class AsyncRunControl(RunControlCalls):
    """Run control methods of AsyncSaraClient (operator token to list, admin to change)."""

    _send: Any

    async def list_prompts(self, cursor: int = 0, limit: int = 100) -> PromptPage:
        """One page of prompts with state and posterior; pass ``next_cursor`` on."""
        return await self._send(self._list_prompts_call(cursor, limit))  # type: ignore

    async def iter_prompts(self, page_size: int = 100) -> AsyncIterator[PromptSummary]:
        """Every prompt, page by page."""
        cursor: int | None = 0
        while cursor is not None:
            page = await self.list_prompts(cursor, page_size)
            for item in page.prompts:
                yield item
            cursor = page.next_cursor

    async def set_prompt_enabled(self, prompt_id: str, enabled: bool) -> PromptStateResponse:
        """Disable (never opened again; groups in flight finish) or re-enable a prompt."""
        return await self._send(self._prompt_enabled_call(prompt_id, enabled))  # type: ignore

    async def delete_prompt(self, prompt_id: str) -> PromptStateResponse:
        """Delete a prompt and its posterior; its groups in flight are still delivered."""
        return await self._send(self._delete_prompt_call(prompt_id))  # type: ignore

    async def run_status(self) -> RunStatus:
        """running | paused | draining | drained."""
        return await self._send(self._run_status_call())  # type: ignore[attr-defined]

    async def control_run(self, action: RunAction) -> RunStatus:
        """pause | resume | drain the run; returns its state after."""
        return await self._send(self._control_run_call(action))  # type: ignore[attr-defined]

"""The openai backend: any OpenAI-compatible ``/v1/completions`` server (``vllm serve``, SGLang).

One streamed request per rollout (``n=1``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``,
``logprobs=1``), read by a task of its own. ``abort`` cancels that task: the HTTP connection
closes, and the server aborts the request on disconnect (vLLM and SGLang both do); the rollout
returns what had been streamed so far (``finish_reason="abort"``). ``completion_tokens`` comes from
the server's ``usage`` (``stream_options.include_usage``), or, for an aborted rollout, from the
tokens streamed. Against vLLM (``owned_by: vllm`` in ``/v1/models``) the request also asks for the
sampled token ids (``return_token_ids``) and per-chunk usage; logprobs are the server's
(vLLM: raw log-softmax of the sampled tokens). ``stream=False`` sends plain requests instead (an
aborted one then reports 0 tokens).

Weights are the server's. ``load_policy`` reloads them only where the server lets a client do it:
a vLLM server started with ``VLLM_SERVER_DEV_MODE=1`` exposes ``/collective_rpc`` and friends,
and the backend then runs ``POST /pause?mode=wait``, ``POST /collective_rpc {"method":
"sara_reload_weights", "kwargs": {"weights_path": checkpoint}}``, ``POST /reset_prefix_cache``,
``POST /resume`` and ``POST /update_weight_version`` with ``"<version>@<checkpoint>"``; all of it
is skipped when ``GET /weight_info`` already shows that tag (another worker reloaded the shared
server). ``sara_reload_weights`` is SARA's vLLM worker extension (start the server with
``--worker-extension-cls sara_worker.backends.vllm_extension.SaraWorkerExtension``): vLLM's own
``reload_weights`` plus a repair of tied output heads (see :mod:`sara_worker.backends.vllm_extension`); a
server without it gets plain ``reload_weights``. The checkpoint path must be readable by the
server. Anywhere else (``weight_update="none"``, a server without those endpoints, a policy
without a checkpoint) the backend logs that the weights are managed by the server and only
records the version; rollouts are still tagged with the scheduler's version, so whoever runs the
server must switch its weights in step. With several workers on one server, let one of them
manage the weights (``weight_update="vllm"``: fail when the server cannot reload) and the others
use ``"none"``.

A request the server never received (connection refused: a server restarting) is retried with
backoff for up to ``connect_retry_s`` before the rollout fails.

Options: ``base_url`` (with or without ``/v1``), ``model`` (served name; default the first of
``/v1/models``), ``api_key``, ``logprobs`` (top-k, ``None`` for none), ``stream``,
``weight_update`` (``auto``, ``vllm``, ``none``), ``timeout_s``, ``startup_timeout_s`` (how long
the first request waits for a server still starting), ``connect_retry_s``, ``max_connections``,
``extra_body`` (merged into every request), ``seed`` (accepted for symmetry, unused: each
rollout carries its own).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from typing import Any

import httpx

from sara_client.chat import is_chat
from sara_client.models import Rollout

from .base import BaseBackend, Generation, ObservableProgress

log = logging.getLogger("sara.worker.openai")

WEIGHT_UPDATES = ("auto", "vllm", "none")
_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "eos": "stop"}


class ServerError(RuntimeError):
    """The completions server refused or failed a request."""


@dataclasses.dataclass
class _Stream:
    """What a rollout's request has produced so far."""

    text_parts: list[str] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    chunks: int = 0
    usage_tokens: int | None = None
    finish_reason: str | None = None
    accepted: bool = False  # the server answered the request (status line and headers)

    @property
    def tokens(self) -> int:
        if self.usage_tokens is not None:
            return self.usage_tokens
        return max(len(self.token_ids), len(self.logprobs)) or self.chunks

    def absorb(self, payload: dict[str, Any]) -> None:
        usage = payload.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        for choice in payload.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            text = choice.get("text") or ""
            if text:
                self.text_parts.append(text)
            ids = choice.get("token_ids")
            if ids:
                self.token_ids.extend(int(t) for t in ids)
            logprobs = choice.get("logprobs") or {}
            values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
            if values:
                self.logprobs.extend(math.nan if v is None else float(v) for v in values)
            if text or ids or values:
                self.chunks += 1
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])


class OpenAIBackend(ObservableProgress, BaseBackend):
    """An OpenAI-compatible completions server; see the module docstring for the options."""

    name = "openai"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", model: str | None = None, *,
                 api_key: str | None = None, logprobs: int | None = 1, stream: bool = True,
                 weight_update: str = "auto", timeout_s: float = 600.0,
                 startup_timeout_s: float = 600.0, connect_retry_s: float = 60.0,
                 max_connections: int = 1024,
                 extra_body: dict[str, Any] | None = None, seed: int | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__()
        if weight_update not in WEIGHT_UPDATES:
            raise ValueError(f"weight_update is one of {', '.join(WEIGHT_UPDATES)}, "
                             f"not {weight_update!r}")
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        self.base_url = root
        self.model = model
        self.logprobs = logprobs
        self.stream = bool(stream)
        self.weight_update = weight_update
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.connect_retry_s = float(connect_retry_s)
        self.extra_body = dict(extra_body or {})
        del seed  # every rollout has its own sampling.seed
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client_options: dict[str, Any] = {
            "base_url": root, "headers": headers, "transport": transport,
            "timeout": httpx.Timeout(self.timeout_s, connect=10.0),
            "limits": httpx.Limits(max_connections=max_connections,
                                   max_keepalive_connections=max_connections)}
        self._http: httpx.AsyncClient | None = None
        self._discovered = False
        self._discover_lock = asyncio.Lock()
        self.server_kind = "unknown"  # "vllm" once /v1/models says so
        self._streams: dict[str, _Stream] = {}
        self._changed = asyncio.Event()
        self._weights_note_logged = False
        self._reload_method: str | None = None
        self.reloads = 0

    # --- connection ------------------------------------------------------------------------------

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(**self._client_options)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _discover(self) -> None:
        """Learn the served model (when not given) and whether the server is vLLM."""
        if self._discovered:
            return
        async with self._discover_lock:
            if self._discovered:
                return
            deadline = time.monotonic() + self.startup_timeout_s
            delay = 0.5
            while True:
                try:
                    response = await self.http.get("/v1/models", timeout=10.0)
                    break
                except httpx.TransportError as exc:
                    if time.monotonic() + delay > deadline:
                        raise ServerError(f"no completions server at {self.base_url}: "
                                          f"{exc!r}") from exc
                    log.info("waiting for the completions server at %s (%r)", self.base_url, exc)
                    await asyncio.sleep(delay)  # back off while the server starts
                    delay = min(delay * 2, 10.0)
            models: list[dict[str, Any]] = []
            if response.status_code == 200:
                models = list(response.json().get("data") or [])
            chosen = next((m for m in models if m.get("id") == self.model), None)
            if chosen is None and self.model is None:
                if not models:
                    raise ServerError(f"{self.base_url}/v1/models lists no model; pass model=")
                chosen = models[0]
                self.model = str(chosen["id"])
            owner = str((chosen or (models[0] if models else {})).get("owned_by", ""))
            self.server_kind = "vllm" if owner.lower() == "vllm" else (owner.lower() or "unknown")
            self._discovered = True
            log.info("completions server %s: model %s, kind %s", self.base_url, self.model,
                     self.server_kind)

    # --- generation ------------------------------------------------------------------------------

    def request_body(self, rollout: Rollout) -> dict[str, Any]:
        """The ``/v1/completions`` body for one rollout."""
        if is_chat(rollout.prompt):
            # /v1/completions takes text; rendering a chat here would need the server's tokenizer,
            # and /v1/chat/completions renders with a template the trainer cannot see.
            raise ValueError("the openai backend serves plain-text prompts only; use the hf or "
                             "vllm backend for chat prompts")
        s = rollout.sampling
        body: dict[str, Any] = {"model": self.model, "prompt": rollout.prompt, "n": 1,
                                "max_tokens": s.max_tokens, "temperature": s.temperature,
                                "top_p": s.top_p, "stream": self.stream}
        if s.seed is not None:
            body["seed"] = s.seed
        if self.logprobs is not None:
            body["logprobs"] = int(self.logprobs)
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.server_kind == "vllm":
            body["return_token_ids"] = True
            if self.stream:
                body["stream_options"]["continuous_usage_stats"] = True
        body.update(self.extra_body)
        return body

    async def generate(self, rollout: Rollout, policy_version: int) -> Generation:
        await self._discover()
        rid = rollout.rollout_id
        body = self.request_body(rollout)
        stream = _Stream()
        with self.track(rid) as aborted:
            self._streams[rid] = stream
            reader = asyncio.ensure_future(self._complete(body, stream))
            waiter = asyncio.ensure_future(aborted.wait())
            try:
                await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                if not reader.done():
                    reader.cancel()  # closes the connection: the server aborts the request
                    await asyncio.gather(reader, return_exceptions=True)
                self._streams.pop(rid, None)
                self._notify()
        if reader.cancelled():
            reason = "abort"
        else:
            reader.result()  # raises what the request raised
            reason = _FINISH.get(stream.finish_reason or "stop", "stop")
        return Generation(completion="".join(stream.text_parts),
                          completion_tokens=stream.tokens, finish_reason=reason,
                          token_ids=list(stream.token_ids) or None,
                          logprobs=list(stream.logprobs) or None)

    async def _complete(self, body: dict[str, Any], stream: _Stream) -> None:
        deadline = time.monotonic() + self.connect_retry_s
        delay = 0.25
        while True:
            try:
                return await self._complete_once(body, stream)
            except httpx.ConnectError as exc:  # the request was not sent: safe to send again
                if time.monotonic() + delay > deadline:
                    raise ServerError(f"cannot reach {self.base_url}: {exc!r}") from exc
                log.warning("completions server %s unreachable (%r); retrying in %.2fs",
                            self.base_url, exc, delay)
                await asyncio.sleep(delay)  # backoff while the server is down
                delay = min(delay * 2, 5.0)

    async def _complete_once(self, body: dict[str, Any], stream: _Stream) -> None:
        if not body.get("stream"):
            response = await self.http.post("/v1/completions", json=body)
            await self._check(response)
            stream.absorb(response.json())
            return
        async with self.http.stream("POST", "/v1/completions", json=body) as response:
            await self._check(response)
            stream.accepted = True
            self._notify()
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                payload = json.loads(data)
                if "error" in payload and "choices" not in payload:
                    raise ServerError(f"completions stream failed: {payload['error']}")
                stream.absorb(payload)
                self._notify()

    @staticmethod
    async def _check(response: httpx.Response) -> None:
        if response.status_code >= 400:
            text = (await response.aread()).decode(errors="replace")
            raise ServerError(f"completions server answered {response.status_code}: "
                              f"{text[:500]}")

    # --- weights ---------------------------------------------------------------------------------

    async def load_policy(self, version: int, checkpoint: str | None) -> None:
        """Reload the server's weights where it allows it (see the module docstring)."""
        previous = self.policy_version
        self.policy_version, self.checkpoint = version, checkpoint
        if checkpoint is None or self.weight_update == "none":
            self._weights_managed_by_server(version, "no checkpoint" if checkpoint is None
                                            else "weight_update=none")
            return
        await self._discover()
        try:
            reloaded = await self._reload_vllm(version, checkpoint)
        except Exception:
            self.policy_version = previous
            raise
        if not reloaded:
            if self.weight_update == "vllm":
                self.policy_version = previous
                raise ServerError(f"{self.base_url} has no /collective_rpc: start vLLM with "
                                  "VLLM_SERVER_DEV_MODE=1 to let workers reload its weights")
            self._weights_managed_by_server(version, "the server has no weight-reload endpoint")

    def _weights_managed_by_server(self, version: int, why: str) -> None:
        level = logging.INFO if self._weights_note_logged else logging.WARNING
        self._weights_note_logged = True
        log.log(level, "policy v%d: weights are managed by the completions server (%s); its "
                "rollouts are tagged v%d", version, why, version)

    async def _reload_vllm(self, version: int, checkpoint: str) -> bool:
        """The vLLM dev-mode reload; False when the server does not offer it."""
        tag = f"{version}@{checkpoint}"  # version numbers alone repeat across runs
        info = await self.http.get("/weight_info", timeout=30.0)
        if info.status_code == 200 and str(info.json().get("weight_version")) == tag:
            log.info("the server already runs weights %s: not reloading", tag)
            return True
        paused = await self.http.post("/pause", params={"mode": "wait"}, timeout=None)
        if paused.status_code == 404:
            paused = None
        elif paused.status_code >= 400:
            await self._check(paused)
        try:
            reply = await self._collective_reload(checkpoint)
            if reply is None:
                return False
            await self._check(await self.http.post("/reset_prefix_cache", timeout=60.0))
        finally:
            if paused is not None:
                await self._check(await self.http.post("/resume", timeout=60.0))
        tagged = await self.http.post("/update_weight_version", json={"new_version": tag},
                                      timeout=60.0)
        if tagged.status_code != 404:
            await self._check(tagged)
        self.reloads += 1
        log.info("server %s reloaded weights: %s", self.base_url, tag)
        return True

    async def _collective_reload(self, checkpoint: str) -> httpx.Response | None:
        """POST /collective_rpc with the reload method; None when the endpoint is absent.

        SARA's worker extension method (``sara_reload_weights``, which also repairs tied output
        heads) is tried first; a server started without the extension answers that it has no
        such method, and vLLM's plain ``reload_weights`` is used from then on.
        """
        methods = [self._reload_method] if self._reload_method else [
            "sara_reload_weights", "reload_weights"]
        reply = None
        for method in methods:
            reply = await self.http.post(
                "/collective_rpc", timeout=None,
                json={"method": method, "kwargs": {"weights_path": checkpoint}})
            if reply.status_code == 404:
                return None
            if reply.status_code < 400:
                self._reload_method = method
                return reply
            if method != methods[-1]:
                log.info("%s failed on the server (%d: %s); trying the next reload method",
                         method, reply.status_code, reply.text[:200])
        assert reply is not None
        await self._check(reply)
        return reply

    # --- observation (tests) ---------------------------------------------------------------------

    def tokens_so_far(self, rollout_id: str) -> int | None:
        """Tokens streamed so far by an in-flight rollout; None when it is not in flight."""
        stream = self._streams.get(rollout_id)
        return None if stream is None else stream.tokens

    def server_accepted(self, rollout_id: str) -> bool:
        """Whether the server has answered an in-flight rollout's request (streaming)."""
        stream = self._streams.get(rollout_id)
        return stream is not None and stream.accepted

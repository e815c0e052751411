"""Request building, response parsing and retry decisions shared by both clients.

:class:`SaraClient` and :class:`AsyncSaraClient` differ only in how they send a :class:`Call` and
how they sleep; everything a call means (path, body, timeout, how its answer is parsed, whether and
when it is retried) is decided here, once.

Past 400 lines because this is the one place every call is defined (the two clients only send),
which keeps each endpoint's path, body, parsing and retry rule side by side.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, Field, ValidationError

from .errors import (
    ConflictError, NotFoundError, SaraConnectionError, SaraError, SaraTimeoutError,
    ServiceUnavailableError, StaleWeightsError, UnexpectedResponseError, error_class_for_status,
)
from .limits import MAX_WAIT_S
from .models import (AckResponse, AddPromptsRequest, AddPromptsResponse, Batch, ErrorEnvelope,
                     GroupOut, HealthResponse, HeartbeatRequest, HeartbeatResponse, LeaseRequest,
                     EngineLoad, LeaseResponse, NextBatchRequest, PolicyInfo, PromptIn, PromptOut,
                     PublishPolicyRequest, ResultsRequest, ResultsResponse, RolloutResult,
                     StatsResponse, WorkerGone)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 30.0
# Shortest pause between two polls of wait_for_batch, so a server that answers 204 at once is not
# hammered.
MIN_POLL_INTERVAL_S = 0.05
JSON_CONTENT = {"content-type": "application/json"}
_USER_AGENT = "sara-client/0.1"
# Transport failures that happen before a request leaves this process: safe to retry.
_RETRYABLE_TRANSPORT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


# --- client-side answer models -------------------------------------------------------------------


class ReportResponse(ResultsResponse):
    """The answer to ``report``: the service's :class:`ResultsResponse` plus the dropped ids."""

    unknown_rollout_ids: list[str] = Field(
        default_factory=list,
        description="Rollout ids whose results the client dropped: the service did not know them.")


class ReadyResponse(HealthResponse):
    """The answer to ``ready``; true when the service (Redis included) is ready."""

    @property
    def ok(self) -> bool:
        """Whether the service reported ``status == "ok"``."""
        return self.status == "ok"

    def __bool__(self) -> bool:
        return self.ok


# --- retry policy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for retryable errors.

    Retry number ``n`` (1 for the first retry) waits ``min(max_delay_s, base_delay_s *
    multiplier ** (n - 1))`` scaled down by a random fraction of at most ``jitter``. A 503 with a
    ``Retry-After`` header waits what the header says instead, capped at ``max_retry_after_s``.
    ``max_attempts`` counts the first try: 1 disables retries.
    """

    max_attempts: int = 5
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be within [0, 1]")
        if self.base_delay_s < 0 or self.max_delay_s < 0 or self.multiplier < 1:
            raise ValueError("delays must be >= 0 and multiplier >= 1")

    def delay(self, retry: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after_s)
        exponent = min(retry - 1, 64)  # large enough to reach any cap, small enough not to overflow
        cap = min(self.max_delay_s, self.base_delay_s * self.multiplier ** exponent)
        return cap * (1.0 - self.jitter * rng.random())


# --- calls and parsing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP exchange: what to send and how to turn the answer into a result (or an error)."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    content: bytes | None = None  # a body already encoded as JSON (see `encoded`)
    timeout: httpx.Timeout | None = None
    retry: bool = True

    def body(self) -> dict[str, Any]:
        """The httpx request arguments that carry this call's body."""
        if self.content is not None:
            return {"content": self.content, "headers": JSON_CONTENT}
        return {"json": self.json}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent/bad."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - datetime.now(timezone.utc)).total_seconds()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _error_fields(response: httpx.Response) -> tuple[str | None, str, Any]:
    """(code, message, detail) from the service's envelope, FastAPI's ``detail`` or the text."""
    fallback = response.reason_phrase or f"HTTP {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        return None, response.text.strip()[:2000] or fallback, None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        try:
            error = ErrorEnvelope.model_validate(body).error
            return error.code, error.message, error.detail
        except ValidationError:
            pass
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        return None, detail if isinstance(detail, str) else fallback, detail
    return None, fallback, body


def error_from_response(response: httpx.Response) -> SaraError:
    """The typed error for a non-success answer."""
    cls = error_class_for_status(response.status_code)
    code, message, detail = _error_fields(response)
    if cls is ConflictError and code == StaleWeightsError.default_code:
        cls = StaleWeightsError
    kwargs: dict[str, Any] = {"status_code": response.status_code, "code": code,
                              "detail": detail, "response": response}
    if issubclass(cls, ServiceUnavailableError):
        kwargs["retry_after"] = parse_retry_after(response.headers.get("Retry-After"))
    return cls(message, **kwargs)


def error_from_transport(error: httpx.TransportError) -> SaraConnectionError:
    """Wrap an httpx transport failure; retryable only if the request cannot have been sent."""
    cls = SaraTimeoutError if isinstance(error, httpx.TimeoutException) else SaraConnectionError
    return cls(error, retryable=isinstance(error, _RETRYABLE_TRANSPORT))


def _validate(response: httpx.Response, model: type[M]) -> M:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise UnexpectedResponseError(
            f"answer of {response.request.method} {response.request.url.path} is not a "
            f"{model.__name__}: {exc.error_count()} validation error(s)",
            status_code=response.status_code, detail=exc.errors(include_url=False),
            response=response) from exc


def parse_model(response: httpx.Response, model: type[M]) -> M:
    """A 2xx answer validated into ``model``; any other status raised as its typed error."""
    if not response.is_success:
        raise error_from_response(response)
    return _validate(response, model)


def parse_optional(response: httpx.Response, model: type[M]) -> M | None:
    """Like :func:`parse_model`, but 204 No Content gives None."""
    if response.status_code == 204:
        return None
    return parse_model(response, model)


def parse_text(response: httpx.Response) -> str:
    """A 2xx answer's text."""
    if not response.is_success:
        raise error_from_response(response)
    return response.text


def parse_ready(response: httpx.Response) -> ReadyResponse:
    """/readyz: a 503 carrying a health body is an answer (not ready), not an error."""
    if response.status_code == 503:
        try:
            return ReadyResponse.model_validate_json(response.content)
        except ValidationError:
            raise error_from_response(response) from None
    return parse_model(response, ReadyResponse)


def parse_report(response: httpx.Response, dropped: Sequence[str] = ()) -> ReportResponse:
    """/results: the service's answer with the ids the client dropped before sending it."""
    answer = parse_model(response, ReportResponse)
    if dropped:
        answer = answer.model_copy(update={"unknown_rollout_ids": list(dropped)})
    return answer


def encoded(request: BaseModel) -> bytes:
    """A request model as its JSON body: pydantic's own encoder, several times faster than
    dumping to a dict and then through ``json`` (results carry token ids and logprobs)."""
    return request.model_dump_json(exclude_none=True).encode()


def segment(value: str) -> str:
    """One path segment, escaped so an id can never change the route."""
    return quote(str(value), safe="")


# --- the shared base -----------------------------------------------------------------------------


class BaseSaraClient:
    """Configuration and call builders shared by the sync and async clients."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        max_attempts: int | None = None,
        max_delay_s: float | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        headers: dict[str, str] | None = None,
    ) -> None:
        policy = retry or RetryPolicy()
        if max_attempts is not None:
            policy = replace(policy, max_attempts=max_attempts)
        if max_delay_s is not None:
            policy = replace(policy, max_delay_s=max_delay_s)
        self.base_url = base_url.rstrip("/")
        self.retry = policy
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._rng = rng or random.Random()
        self._clock = clock
        self._headers = {"Accept": "application/json", "User-Agent": _USER_AGENT, **(headers or {})}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _httpx_options(self, transport: Any) -> dict[str, Any]:
        options: dict[str, Any] = {"base_url": self.base_url, "headers": self._headers,
                                   "timeout": self.timeout}
        if transport is not None:
            options["transport"] = transport
        return options

    def _retry_delay(self, call: Call[Any], error: SaraError, attempt: int) -> float | None:
        """Seconds to wait before trying ``call`` again after ``attempt`` failed; None: give up."""
        if not call.retry or not error.retryable or attempt >= self.retry.max_attempts:
            return None
        retry_after = getattr(error, "retry_after", None)
        return self.retry.delay(attempt, self._rng, retry_after)

    def _long_poll_timeout(self, wait_s: float) -> httpx.Timeout:
        """The client timeout with the read timeout stretched by the server-side wait."""
        t = self.timeout
        read = None if t.read is None else t.read + wait_s
        return httpx.Timeout(connect=t.connect, read=read, write=t.write, pool=t.pool)

    # --- prompts, policy, lookups ----------------------------------------------------------------

    def _add_prompts_call(
            self, prompts: Sequence[PromptIn | dict[str, Any]]) -> Call[AddPromptsResponse]:
        request = AddPromptsRequest(prompts=list(prompts))
        return Call("POST", "/prompts", partial(parse_model, model=AddPromptsResponse),
                    content=encoded(request))

    def _get_prompt_call(self, prompt_id: str) -> Call[PromptOut]:
        return Call("GET", f"/prompts/{segment(prompt_id)}", partial(parse_model, model=PromptOut))

    def _get_policy_call(self) -> Call[PolicyInfo]:
        return Call("GET", "/policy", partial(parse_model, model=PolicyInfo))

    def _publish_policy_call(self, version: int, checkpoint: str | None) -> Call[PolicyInfo]:
        request = PublishPolicyRequest(version=version, checkpoint=checkpoint)
        return Call("POST", "/policy", partial(parse_model, model=PolicyInfo), content=encoded(request))

    def _get_group_call(self, group_id: str) -> Call[GroupOut]:
        return Call("GET", f"/groups/{segment(group_id)}", partial(parse_model, model=GroupOut))

    def _stats_call(self) -> Call[StatsResponse]:
        return Call("GET", "/stats", partial(parse_model, model=StatsResponse))

    def _metrics_call(self) -> Call[str]:
        return Call("GET", "/metrics", parse_text)

    def _health_call(self) -> Call[HealthResponse]:
        return Call("GET", "/healthz", partial(parse_model, model=HealthResponse), retry=False)

    def _ready_call(self) -> Call[ReadyResponse]:
        return Call("GET", "/readyz", parse_ready, retry=False)

    # --- workers ---------------------------------------------------------------------------------

    def _lease_call(self, worker_id: str, max_rollouts: int, wait_s: float,
                    backend: str | None, policy_version: int | None = None,
                    engine: EngineLoad | None = None) -> Call[LeaseResponse]:
        request = LeaseRequest(worker_id=worker_id, max_rollouts=max_rollouts, wait_s=wait_s,
                               backend=backend, policy_version=policy_version, engine=engine)
        return Call("POST", "/leases", partial(parse_model, model=LeaseResponse),
                    content=encoded(request), timeout=self._long_poll_timeout(request.wait_s))

    def _heartbeat_call(self, lease_id: str, worker_id: str) -> Call[HeartbeatResponse]:
        request = HeartbeatRequest(worker_id=worker_id)
        return Call("POST", f"/leases/{segment(lease_id)}/heartbeat",
                    partial(parse_model, model=HeartbeatResponse), content=encoded(request))

    def _deregister_call(self, worker_id: str) -> Call[WorkerGone]:
        return Call("DELETE", f"/workers/{segment(worker_id)}",
                    partial(parse_model, model=WorkerGone))

    def _results_request(self, worker_id: str, results: Sequence[RolloutResult | dict[str, Any]],
                         report_id: str | None = None) -> ResultsRequest:
        # one report id per report, reused by every retry of it: a retry of a call that was
        # applied but whose answer was lost gets that answer (its cancels) back
        return ResultsRequest(worker_id=worker_id, results=list(results),
                              report_id=report_id or "r" + uuid.uuid4().hex)

    def _report_call(self, request: ResultsRequest,
                     dropped: Sequence[str] = ()) -> Call[ReportResponse]:
        return Call("POST", "/results", partial(parse_report, dropped=list(dropped)),
                    content=encoded(request))

    def _report_follow_up(self, request: ResultsRequest,
                          error: NotFoundError) -> Call[ReportResponse] | ReportResponse | None:
        """What to do after /results answered 404: None re-raises the error.

        For ``unknown_rollout`` with ``detail.unknown_rollout_ids``, the results for those ids are
        dropped; the rest are resent once (a Call), or, if none remain, an empty answer is returned.
        """
        detail = error.detail if isinstance(error.detail, dict) else {}
        ids = detail.get("unknown_rollout_ids")
        if error.code != "unknown_rollout" or not isinstance(ids, list):
            return None
        unknown = {str(i) for i in ids}
        dropped = [r.rollout_id for r in request.results if r.rollout_id in unknown]
        remaining = [r for r in request.results if r.rollout_id not in unknown]
        if not dropped:
            return None  # resending the same results would fail the same way
        if not remaining:
            return ReportResponse(accepted=0, unknown_rollout_ids=dropped)
        resend = self._results_request(request.worker_id, remaining)  # another report
        return self._report_call(resend, dropped)

    # --- trainer ---------------------------------------------------------------------------------

    def _next_batch_call(self, size: int | None, wait_s: float) -> Call[Batch | None]:
        request = NextBatchRequest(size=size, wait_s=wait_s)
        return Call("POST", "/batches/next", partial(parse_optional, model=Batch),
                    content=encoded(request), timeout=self._long_poll_timeout(request.wait_s))

    def _ack_call(self, batch_id: str) -> Call[AckResponse]:
        return Call("POST", f"/batches/{segment(batch_id)}/ack",
                    partial(parse_model, model=AckResponse))

    def _poll_deadline(self, timeout_s: float | None, poll_s: float) -> float | None:
        if poll_s < 0 or (timeout_s is not None and timeout_s < 0):
            raise ValueError("timeout_s and poll_s must be >= 0")
        return None if timeout_s is None else self._clock() + timeout_s

    def _poll_wait(self, deadline: float | None, poll_s: float) -> float:
        """Server-side wait for the next poll: poll_s, bounded by what is left and MAX_WAIT_S."""
        wait = min(poll_s, MAX_WAIT_S)
        if deadline is not None:
            wait = min(wait, max(deadline - self._clock(), 0.0))
        return wait

    def _poll_pause(self, deadline: float | None, wait: float, started: float) -> float | None:
        """Pause after an empty poll, if the server answered early; None once time is up."""
        now = self._clock()
        if deadline is not None and now >= deadline:
            return None
        pause = max(max(wait, MIN_POLL_INTERVAL_S) - (now - started), 0.0)
        return pause if deadline is None else min(pause, deadline - now)

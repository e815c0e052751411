"""Client SDK against httpx.MockTransport handlers: requests, parsing, errors, retries."""

from __future__ import annotations

import ast
import json
import random
import sys
from collections.abc import Callable
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest

from sara_client import (
    MAX_WAIT_S,
    AsyncSaraClient,
    AuthenticationError,
    BadRequestError,
    Batch,
    ConflictError,
    LeaseResponse,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PromptIn,
    ReportResponse,
    RetryPolicy,
    RolloutResult,
    SaraClient,
    SaraConnectionError,
    SaraError,
    SaraTimeoutError,
    ServerError,
    ServiceUnavailableError,
    StatsResponse,
    UnexpectedResponseError,
)

BASE = "http://sara.test"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- helpers -------------------------------------------------------------------------------------


class FakeTime:
    """Injected clock + sleep: sleeping records the delay and moves the clock, never blocks."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


class FixedRng:
    """rng whose random() is constant, so backoff delays are deterministic."""

    def __init__(self, value: float = 0.5) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


Reply = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class Server:
    """A scripted handler: answers the queued replies in order (the last one repeats)."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        return reply(request) if callable(reply) else reply

    def bodies(self) -> list[Any]:
        return [json.loads(r.content) if r.content else None for r in self.requests]


def ok(body: Any, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def err(status: int, code: str, message: str = "boom", detail: Any = None,
        **headers: str) -> httpx.Response:
    body = {"error": {"code": code, "message": message, "detail": detail}}
    return httpx.Response(status, json=body, headers=headers)


def make(server: Server, fake: FakeTime | None = None, **kwargs: Any) -> SaraClient:
    fake = fake or FakeTime()
    kwargs.setdefault("rng", FixedRng())
    return SaraClient(BASE, transport=httpx.MockTransport(server), sleep=fake.sleep,
                      clock=fake.clock, **kwargs)


def make_async(server: Server, fake: FakeTime | None = None, **kwargs: Any) -> AsyncSaraClient:
    fake = fake or FakeTime()
    kwargs.setdefault("rng", FixedRng())
    return AsyncSaraClient(BASE, transport=httpx.MockTransport(server),
                           sleep=fake.async_sleep, clock=fake.clock, **kwargs)


POLICY = {"version": 3, "checkpoint": "/ckpt/3"}
LEASE = {
    "lease_id": "L1", "expires_at": 1000.5, "policy": POLICY,
    "rollouts": [{"rollout_id": "r1", "group_id": "g1", "prompt_id": "p1", "prompt": "2+2?",
                  "task": "exact", "answer": "4", "sampling": {"temperature": 0.7, "seed": 5}}],
    "cancel": ["r0"],
}
BATCH = {
    "batch_id": "b1", "policy_version": 3, "created_at": 12.0,
    "groups": [{"group_id": "g1", "prompt_id": "p1", "prompt": "2+2?", "answer": "4",
                "rollouts": [{"rollout_id": "r1", "completion": "4", "reward": 1.0,
                              "completion_tokens": 1, "policy_version": 3},
                             {"rollout_id": "r2", "completion": "5", "reward": 0.0,
                              "completion_tokens": 1, "policy_version": 3}]}],
    "stats": {"rollouts_spent": 2, "groups_abandoned": 1},
}
RESULTS = {"accepted": 2, "decisions": [{"group_id": "g1", "decision": "commit"}], "cancel": []}
STATS = {
    "namespace": "default", "now": 5.0, "policy": POLICY, "config": {"policy": "sara"},
    "counters": {"rollouts_issued": 10},
    "derived": {"rollouts_in_flight": 2, "useful_fraction": 0.5,
                "rollouts_per_effective_group": 9.0,
                "ds_rollouts_per_effective_group": 16.0, "abandon_rate": 0.3,
                "expected_false_abandon_rate": 0.01},
    "queues": {"pending": 1, "leased": 2, "open_groups": 3, "expected_yield_open": 1.5,
               "ready_groups": 0, "unacked_batches": 0, "flow_target": 64},
}
GROUP = {
    "group_id": "g1", "prompt_id": "p1", "state": "open", "k": 8, "issued": 4, "done": 2,
    "successes": 0, "failures": 2, "cancelled": 0, "abandon_after_failures": 4,
    "abandon_after_successes": 4, "p_eff": 0.6, "created_at": 1.0,
    "rollouts": [{"rollout_id": "r1", "state": "done", "reward": 0.0}],
}
PROMPT_OUT = {
    "id": "p/1", "prompt": "2+2?", "answer": "4", "task": "exact", "meta": {"p_success": 0.3},
    "posterior": {"alpha": 1.0, "beta": 2.0, "version": 3}, "history": {"groups": 1},
}


def result(rollout_id: str, reward: float = 1.0) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "reward": reward, "completion": "x", "policy_version": 3}


# --- request building and parsing ----------------------------------------------------------------


def test_add_prompts_sends_bearer_token_and_validated_body():
    server = Server(ok({"ids": ["a", "h1"], "created": 1}))
    with make(server, token="s3cret") as client:
        answer = client.add_prompts([{"id": "a", "prompt": "1+1?", "answer": "2"},
                                     PromptIn(prompt="2+2?", meta={"p_success": 0.5})])
    assert answer.ids == ["a", "h1"] and answer.created == 1
    (request,) = server.requests
    assert request.method == "POST" and request.url == f"{BASE}/prompts"
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["Accept"] == "application/json"
    assert server.bodies()[0] == {"prompts": [
        {"id": "a", "prompt": "1+1?", "answer": "2", "task": "exact", "meta": {}},
        {"prompt": "2+2?", "task": "exact", "meta": {"p_success": 0.5}}]}


def test_no_token_sends_no_authorization_header():
    server = Server(ok(POLICY))
    with make(server) as client:
        assert client.get_policy().version == 3
    assert "Authorization" not in server.requests[0].headers


def test_get_prompt_escapes_the_id_in_the_path():
    server = Server(ok(PROMPT_OUT))
    with make(server) as client:
        prompt = client.get_prompt("p/1")
    assert server.requests[0].url.raw_path == b"/prompts/p%2F1"
    assert prompt.posterior.beta == 2.0 and prompt.history.groups == 1
    assert prompt.meta == {"p_success": 0.3}


def test_lease_body_parsing_and_long_poll_timeout():
    server = Server(ok(LEASE))
    with make(server, timeout=10.0) as client:
        lease = client.lease("w-1", max_rollouts=8, wait_s=5.0)
    request = server.requests[0]
    assert request.url.path == "/leases"
    assert server.bodies()[0] == {"worker_id": "w-1", "max_rollouts": 8, "wait_s": 5.0}
    assert request.extensions["timeout"]["read"] == pytest.approx(15.0)
    assert request.extensions["timeout"]["connect"] == pytest.approx(10.0)
    assert isinstance(lease, LeaseResponse) and lease.lease_id == "L1"
    assert lease.rollouts[0].sampling.temperature == 0.7 and lease.rollouts[0].sampling.seed == 5
    assert lease.cancel == ["r0"] and lease.policy.checkpoint == "/ckpt/3"


def test_empty_lease_has_no_lease_id_and_backend_is_sent():
    server = Server(ok({"lease_id": None, "policy": {"version": 0}}))
    with make(server) as client:
        lease = client.lease("w-1", backend="vllm")
    assert lease.lease_id is None and lease.rollouts == []
    assert server.bodies()[0] == {"worker_id": "w-1", "max_rollouts": 64, "wait_s": 0.0,
                                  "backend": "vllm"}


def test_invalid_arguments_fail_before_sending():
    server = Server(ok(LEASE))
    with make(server) as client:
        with pytest.raises(pydantic.ValidationError):
            client.lease("bad id!", max_rollouts=0)
        with pytest.raises(pydantic.ValidationError):
            client.report("w", [])
    assert server.requests == []


def test_heartbeat_path_and_body():
    server = Server(ok({"lease_id": "L1", "expires_at": 99.0, "cancel": ["r3"]}))
    with make(server) as client:
        beat = client.heartbeat("L1", "w-1")
    assert server.requests[0].url.path == "/leases/L1/heartbeat"
    assert server.bodies()[0] == {"worker_id": "w-1"}
    assert beat.cancel == ["r3"] and beat.expires_at == 99.0


def test_report_body_and_answer():
    server = Server(ok(RESULTS))
    with make(server) as client:
        answer = client.report("w-1", [result("r1"), RolloutResult(rollout_id="r2", reward=0.0)])
    body = server.bodies()[0]
    assert server.requests[0].url.path == "/results"
    assert body["worker_id"] == "w-1"
    assert [r["rollout_id"] for r in body["results"]] == ["r1", "r2"]
    assert "token_ids" not in body["results"][0]
    assert isinstance(answer, ReportResponse)
    assert answer.accepted == 2 and answer.decisions[0].decision == "commit"
    assert answer.unknown_rollout_ids == []


def test_next_batch_parses_a_batch_and_204_is_none():
    server = Server(ok(BATCH), httpx.Response(204))
    with make(server) as client:
        batch = client.next_batch(size=4, wait_s=2.0)
        assert client.next_batch() is None
    assert isinstance(batch, Batch) and batch.batch_id == "b1"
    assert [r.reward for r in batch.groups[0].rollouts] == [1.0, 0.0]
    assert batch.stats.groups_abandoned == 1
    assert server.bodies() == [{"size": 4, "wait_s": 2.0}, {"wait_s": 0.0}]
    assert all(r.url.path == "/batches/next" for r in server.requests)


def test_ack_posts_without_a_body():
    server = Server(ok({"batch_id": "b1", "acked": True}))
    with make(server) as client:
        ack = client.ack("b1")
    request = server.requests[0]
    assert (request.method, request.url.path, request.content) == ("POST", "/batches/b1/ack", b"")
    assert ack.acked and not ack.already_acked


def test_policy_group_stats_metrics_health():
    server = Server(lambda req: {
        ("GET", "/policy"): ok(POLICY),
        ("POST", "/policy"): ok({"version": 4, "checkpoint": "c4"}),
        ("GET", "/groups/g1"): ok(GROUP),
        ("GET", "/stats"): ok(STATS),
        ("GET", "/metrics"): httpx.Response(200, text="sara_rollouts_issued 10\n"),
        ("GET", "/healthz"): ok({"status": "ok"}),
    }[(req.method, req.url.path)])
    with make(server) as client:
        assert client.get_policy().checkpoint == "/ckpt/3"
        assert client.publish_policy(4, checkpoint="c4").version == 4
        assert client.get_group("g1").rollouts[0].state == "done"
        stats = client.stats()
        assert client.metrics() == "sara_rollouts_issued 10\n"
        assert client.health().status == "ok"
    assert isinstance(stats, StatsResponse) and stats.queues.flow_target == 64
    assert stats.counters.rollouts_issued == 10 and stats.derived.useful_fraction == 0.5
    assert server.bodies()[1] == {"version": 4, "checkpoint": "c4"}


def test_ready_is_truthy_when_ok_and_falsy_on_503_without_retry():
    fake = FakeTime()
    server = Server(ok({"status": "ok", "redis": True}),
                    ok({"status": "unavailable", "redis": False}, status=503))
    with make(server, fake) as client:
        assert client.ready()
        not_ready = client.ready()
    assert not not_ready and not_ready.redis is False and not_ready.status == "unavailable"
    assert len(server.requests) == 2 and fake.sleeps == []
    assert server.requests[0].url.path == "/readyz"


def test_ready_503_without_a_health_body_raises():
    server = Server(httpx.Response(503, text="upstream down"))
    with make(server) as client, pytest.raises(ServiceUnavailableError) as info:
        client.ready()
    assert info.value.message == "upstream down" and len(server.requests) == 1


def test_clients_close_on_exit():
    with make(Server(ok(POLICY))) as client:
        pass
    assert client._http.is_closed


# --- errors --------------------------------------------------------------------------------------

ERROR_CASES = [
    (400, BadRequestError), (422, BadRequestError), (401, AuthenticationError),
    (403, PermissionDeniedError), (404, NotFoundError), (409, ConflictError),
    (413, PayloadTooLargeError), (503, ServiceUnavailableError), (500, ServerError),
    (502, ServerError), (418, SaraError),
]


@pytest.mark.parametrize(("status", "cls"), ERROR_CASES)
def test_status_maps_to_typed_error_with_envelope(status, cls):
    server = Server(err(status, "some_code", "it broke", {"field": "x"}))
    with make(server, max_attempts=1) as client, pytest.raises(SaraError) as info:
        client.get_policy()
    error = info.value
    assert type(error) is cls
    assert (error.status_code, error.code, error.message, error.detail) == (
        status, "some_code", "it broke", {"field": "x"})
    assert "it broke" in str(error) and str(status) in str(error)


def test_error_falls_back_to_text_body_and_default_code():
    server = Server(httpx.Response(502, text="<html>Bad Gateway</html>"))
    with make(server) as client, pytest.raises(ServerError) as info:
        client.stats()
    assert info.value.code == "server_error" and info.value.message == "<html>Bad Gateway</html>"
    assert info.value.detail is None


def test_error_falls_back_to_fastapi_detail():
    detail = [{"loc": ["body", "wait_s"], "msg": "too big"}]
    server = Server(ok({"detail": detail}, status=422), ok({"detail": "Not Found"}, status=404))
    with make(server) as client:
        with pytest.raises(BadRequestError) as bad:
            client.get_policy()
        with pytest.raises(NotFoundError) as missing:
            client.get_group("nope")
    assert bad.value.detail == detail and bad.value.code == "bad_request"
    assert missing.value.message == "Not Found" and missing.value.code == "not_found"


def test_malformed_success_body_is_an_unexpected_response():
    server = Server(ok({"nonsense": True}))
    with make(server) as client, pytest.raises(UnexpectedResponseError) as info:
        client.get_group("g1")
    assert info.value.status_code == 200 and info.value.detail


# --- retries -------------------------------------------------------------------------------------


def test_retries_503_with_growing_bounded_backoff():
    fake = FakeTime()
    server = Server(*[err(503, "redis_down")] * 6, ok(POLICY))
    policy = RetryPolicy(max_attempts=10, base_delay_s=0.1, max_delay_s=1.0, jitter=0.5)
    with make(server, fake, retry=policy, rng=FixedRng(0.0)) as client:
        assert client.get_policy().version == 3
    assert len(server.requests) == 7
    assert fake.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_backoff_with_jitter_grows_and_never_exceeds_max():
    fake = FakeTime()
    server = Server(err(503, "busy"))
    with make(server, fake, max_attempts=8, max_delay_s=2.0, rng=FixedRng(0.5)) as client:
        with pytest.raises(ServiceUnavailableError):
            client.get_policy()
    assert len(fake.sleeps) == 7
    assert all(b >= a for a, b in zip(fake.sleeps, fake.sleeps[1:]))
    assert fake.sleeps[0] < fake.sleeps[-1] <= 2.0


def test_random_jitter_stays_within_its_band():
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=3.0, jitter=0.5)
    rng = random.Random(7)
    for retry in range(1, 200):
        cap = min(3.0, 0.1 * 2 ** (retry - 1))
        assert cap / 2 <= policy.delay(retry, rng) <= cap


def test_gives_up_after_max_attempts_with_the_typed_error():
    fake = FakeTime()
    server = Server(err(503, "redis_down", "redis is down"))
    with make(server, fake, max_attempts=3) as client, pytest.raises(ServiceUnavailableError) as e:
        client.lease("w-1")
    assert len(server.requests) == 3 and len(fake.sleeps) == 2
    assert e.value.code == "redis_down" and e.value.retryable


def test_retry_after_is_honoured():
    fake = FakeTime()
    server = Server(err(503, "busy", **{"Retry-After": "7"}), ok(POLICY))
    with make(server, fake, max_delay_s=1.0) as client:
        client.get_policy()
    assert fake.sleeps == [7.0]


def test_retry_after_http_date_and_cap():
    when = datetime.now(timezone.utc) + timedelta(seconds=30)
    fake = FakeTime()
    server = Server(err(503, "busy", **{"Retry-After": format_datetime(when, usegmt=True)}),
                    err(503, "busy", **{"Retry-After": "3600"}), ok(POLICY))
    with make(server, fake, retry=RetryPolicy(max_retry_after_s=120.0)) as client:
        client.get_policy()
    assert 25.0 <= fake.sleeps[0] <= 30.0 and fake.sleeps[1] == 120.0


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 429, 500])
def test_no_retry_on_non_503_errors(status):
    fake = FakeTime()
    server = Server(err(status, "nope"), ok(POLICY))
    with make(server, fake) as client, pytest.raises(SaraError):
        client.publish_policy(2)
    assert len(server.requests) == 1 and fake.sleeps == []


@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx.ConnectTimeout("slow")])
def test_retries_connection_errors(exc):
    fake = FakeTime()
    server = Server(exc, exc, ok(BATCH))
    with make(server, fake) as client:
        assert client.next_batch().batch_id == "b1"
    assert len(server.requests) == 3 and len(fake.sleeps) == 2


def test_connection_error_gives_up_wrapping_the_httpx_error():
    server = Server(httpx.ConnectError("refused"))
    with make(server, max_attempts=4) as client, pytest.raises(SaraConnectionError) as info:
        client.stats()
    assert len(server.requests) == 4
    assert isinstance(info.value.error, httpx.ConnectError)
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert info.value.status_code is None and info.value.code == "connection_error"


@pytest.mark.parametrize("exc", [httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("eof")])
def test_failures_after_sending_are_not_retried(exc):
    fake = FakeTime()
    server = Server(exc, ok(RESULTS))
    with make(server, fake) as client, pytest.raises(SaraConnectionError) as info:
        client.report("w-1", [result("r1")])
    assert len(server.requests) == 1 and fake.sleeps == [] and not info.value.retryable
    assert isinstance(info.value, SaraTimeoutError) == isinstance(exc, httpx.TimeoutException)


def test_retry_policy_validates():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2.0)


# --- unknown rollouts ----------------------------------------------------------------------------


def unknown(*ids: str) -> httpx.Response:
    return err(404, "unknown_rollout", "unknown rollout ids", {"unknown_rollout_ids": list(ids)})


def test_report_drops_unknown_rollouts_and_resends_the_rest_once():
    server = Server(unknown("r2"), ok({"accepted": 2, "duplicates": 0, "cancel": ["r9"]}))
    with make(server) as client:
        answer = client.report("w-1", [result("r1"), result("r2"), result("r3")])
    first, second = server.bodies()
    assert [r["rollout_id"] for r in first["results"]] == ["r1", "r2", "r3"]
    assert [r["rollout_id"] for r in second["results"]] == ["r1", "r3"]
    assert second["worker_id"] == "w-1"
    assert answer.accepted == 2 and answer.cancel == ["r9"]
    assert answer.unknown_rollout_ids == ["r2"]


def test_report_with_only_unknown_rollouts_sends_nothing_more():
    server = Server(unknown("r1", "r2"), ok(RESULTS))
    with make(server) as client:
        answer = client.report("w-1", [result("r1"), result("r2")])
    assert len(server.requests) == 1
    assert answer.accepted == 0 and answer.unknown_rollout_ids == ["r1", "r2"]


def test_report_resends_only_once():
    server = Server(unknown("r1"), unknown("r2"), ok(RESULTS))
    with make(server) as client, pytest.raises(NotFoundError) as info:
        client.report("w-1", [result("r1"), result("r2")])
    assert len(server.requests) == 2 and info.value.detail == {"unknown_rollout_ids": ["r2"]}


@pytest.mark.parametrize("reply", [
    err(404, "not_found", "no such worker"),
    unknown("zzz"),  # names none of ours: resending would fail the same way
    err(404, "unknown_rollout", "bad detail", "r1"),
])
def test_report_raises_other_404s(reply):
    server = Server(reply, ok(RESULTS))
    with make(server) as client, pytest.raises(NotFoundError):
        client.report("w-1", [result("r1")])
    assert len(server.requests) == 1


# --- wait_for_batch ------------------------------------------------------------------------------


def test_wait_for_batch_polls_until_the_timeout():
    fake = FakeTime()
    server = Server(httpx.Response(204))
    with make(server, fake) as client:
        assert client.wait_for_batch(size=2, timeout_s=10.0, poll_s=3.0) is None
    assert [b["wait_s"] for b in server.bodies()] == [3.0, 3.0, 3.0, 1.0, 0.0]
    assert all(b["size"] == 2 for b in server.bodies())
    assert fake.now == pytest.approx(10.0)


def test_wait_for_batch_returns_the_first_batch():
    fake = FakeTime()
    server = Server(httpx.Response(204), httpx.Response(204), ok(BATCH))
    with make(server, fake) as client:
        batch = client.wait_for_batch(poll_s=100.0)
    assert batch.batch_id == "b1"
    assert [b["wait_s"] for b in server.bodies()] == [MAX_WAIT_S] * 3


def test_wait_for_batch_does_not_pause_when_the_server_waited():
    fake = FakeTime()

    def long_poll(request: httpx.Request) -> httpx.Response:
        fake.now += json.loads(request.content)["wait_s"]
        return httpx.Response(204)

    server = Server(long_poll)
    with make(server, fake) as client:
        assert client.wait_for_batch(timeout_s=5.0, poll_s=2.0) is None
    assert fake.sleeps == []
    assert [b["wait_s"] for b in server.bodies()] == [2.0, 2.0, 1.0]


# --- async client --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_requests_and_parsing():
    server = Server(lambda req: {
        "/prompts": ok({"ids": ["a"], "created": 1}),
        "/leases": ok(LEASE),
        "/batches/next": httpx.Response(204),
        "/batches/b1/ack": ok({"batch_id": "b1", "acked": True}),
        "/readyz": ok({"status": "unavailable", "redis": False}, status=503),
    }[req.url.path])
    async with make_async(server, token="t0k") as client:
        assert (await client.add_prompts([{"id": "a", "prompt": "q"}])).created == 1
        lease = await client.lease("w-1", wait_s=1.5)
        assert await client.next_batch() is None
        assert (await client.ack("b1")).acked
        assert not await client.ready()
    assert lease.rollouts[0].rollout_id == "r1"
    assert all(r.headers["Authorization"] == "Bearer t0k" for r in server.requests)
    assert server.bodies()[1] == {"worker_id": "w-1", "max_rollouts": 64, "wait_s": 1.5}
    assert client._http.is_closed


@pytest.mark.anyio
async def test_async_errors_are_typed():
    server = Server(err(409, "stale_version", "version 2 <= 3", {"current": 3}))
    async with make_async(server) as client:
        with pytest.raises(ConflictError) as info:
            await client.publish_policy(2)
    assert info.value.code == "stale_version" and info.value.detail == {"current": 3}
    assert len(server.requests) == 1


@pytest.mark.anyio
async def test_async_retries_503_and_connection_errors_with_injected_sleep():
    fake = FakeTime()
    server = Server(err(503, "busy"), httpx.ConnectError("refused"),
                    err(503, "busy", **{"Retry-After": "4"}), ok(STATS))
    async with make_async(server, fake, max_delay_s=1.0, rng=FixedRng(0.0)) as client:
        stats = await client.stats()
    assert stats.namespace == "default"
    assert fake.sleeps == pytest.approx([0.1, 0.2, 4.0])


@pytest.mark.anyio
async def test_async_gives_up_and_does_not_retry_4xx():
    fake = FakeTime()
    server = Server(err(503, "busy"))
    async with make_async(server, fake, max_attempts=2) as client:
        with pytest.raises(ServiceUnavailableError):
            await client.get_policy()
        server.replies = [err(401, "unauthorized")]
        with pytest.raises(AuthenticationError):
            await client.get_policy()
    assert len(server.requests) == 3 and len(fake.sleeps) == 1


@pytest.mark.anyio
async def test_async_report_unknown_rollouts():
    server = Server(unknown("r1"), ok({"accepted": 1}))
    async with make_async(server) as client:
        answer = await client.report("w-1", [result("r1"), result("r2")])
    assert [r["rollout_id"] for r in server.bodies()[1]["results"]] == ["r2"]
    assert answer.accepted == 1 and answer.unknown_rollout_ids == ["r1"]


@pytest.mark.anyio
async def test_async_wait_for_batch_and_plain_sleep():
    fake = FakeTime()
    server = Server(httpx.Response(204), ok(BATCH))
    client = AsyncSaraClient(BASE, transport=httpx.MockTransport(server), sleep=fake.sleep,
                             clock=fake.clock)
    try:
        batch = await client.wait_for_batch(timeout_s=100.0, poll_s=5.0)
    finally:
        await client.aclose()
    assert batch.batch_id == "b1" and fake.sleeps == [5.0]


# --- packaging -----------------------------------------------------------------------------------


def test_client_package_imports_only_httpx_pydantic_and_stdlib():
    package = Path(__import__("sara_client").__file__).parent
    allowed = set(sys.stdlib_module_names) | {"httpx", "pydantic", "__future__"}
    for path in package.glob("*.py"):
        # module level only: local() imports the service lazily, inside the function
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_importing_the_client_loads_neither_the_service_nor_redis():
    import subprocess

    code = ("import sys, sara_client; bad = [m for m in ('sara_service', 'redis', 'fastapi') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr

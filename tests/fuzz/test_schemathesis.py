"""Schema-driven fuzzing of the HTTP API with schemathesis, in-process over ASGI.

For each role (all four tokens configured, requests sent with one role's token) every operation of
/openapi.json gets about 20 generated requests that fit the schema (positive) and 15 that do not
(negative: wrong types, missing fields, a broken or missing token ...), against a real Redis (the
session's redis-server) holding a few prompts. No answer may be a 5xx, a body that violates the
documented schema, or a content type other than the documented one; a secured operation must
refuse a request without a token or with a wrong one (schemathesis' `ignored_auth` probes).

Long-polls end at once: the scheduler's clock is a fake that moves 5 s forward on every read, so a
`wait_s` of up to 60 s (the request models' cap) passes after a few 1 ms poll intervals.

Answers whose status code is not documented are collected too. The gaps known today (401/403 on
secured operations, 404 on two reads, 400 for an undecodable body) are bugs pinned by the strict
xfails below; any other undocumented status fails the fuzz test itself.
"""

from __future__ import annotations

import asyncio
import collections
import json

import httpx
import pytest
import redis.asyncio as aioredis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (content_type_conformance, ignored_auth,
                                               negative_data_rejection,
                                               response_schema_conformance,
                                               status_code_conformance)

from sara_client.models import PromptIn
from sara_service.http.app import create_app
from sara_service.settings import Settings
from sara_service.store.store import Store

ROLES = ("worker", "trainer", "operator", "admin")
TOKENS = {role: f"fuzz-{role}-token-0123456789" for role in ROLES}
# examples per operation and role: ~35 calls each, the whole file well under 90 s
MAX_EXAMPLES = {GenerationMode.POSITIVE: 20, GenerationMode.NEGATIVE: 15}
BODY_CHECKS = (not_a_server_error, response_schema_conformance, content_type_conformance,
               ignored_auth)
NEGATIVE_CHECKS = (negative_data_rejection,)
# Operations that answer 404 for an unknown id without documenting it (see the xfail below).
UNDOCUMENTED_404 = {"GET /prompts/{prompt_id}", "GET /groups/{group_id}"}


class TickingClock:
    """A fake clock that moves `step` seconds forward each time it is read."""

    def __init__(self, start: float = 1_700_000_000.0, step: float = 5.0) -> None:
        self.now, self.step = start, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def secured_settings(redis_url: str, namespace: str) -> Settings:
    return Settings(redis_url=redis_url, namespace=namespace, policy="sara", group_size=4,
                    batch_size=2, prefetch_batches=2, poll_interval_s=0.001,
                    **{f"{role}_token": token for role, token in TOKENS.items()})


def seed_prompts(redis_url: str, namespace: str, count: int = 6) -> None:
    """A few prompts, so that leases open groups and hand out rollouts."""
    async def seed() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await Store(client, namespace).prompts.add_prompts(
                [(f"p{i}", PromptIn(prompt=f"fuzz question {i}", answer=str(i)))
                 for i in range(count)], 1.0, 1.0, 0)
        finally:
            await client.aclose()

    asyncio.run(seed())


@pytest.fixture
def stop_lifespans():
    """schemathesis keeps each ASGI app's lifespan (and so its Redis client) running; stop them."""
    yield
    from schemathesis.python import asgi

    asgi.shutdown_lifespans()


def run_operation(operation, mode: GenerationMode, headers: dict[str, str],
                  seen: collections.Counter) -> list[tuple]:
    """A few dozen requests for one operation; returns every failed check, not raising.
    `seen` counts the answers by status class (2, 4, 5)."""
    found: list[tuple] = []
    checks = BODY_CHECKS + (NEGATIVE_CHECKS if mode is GenerationMode.NEGATIVE else ())

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=MAX_EXAMPLES[mode], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def fuzz(case) -> None:
        # a negative case whose headers were made invalid (the token removed or mangled) keeps
        # them: it must be refused; every other case carries the role's token
        negated_headers = case.meta is not None and case.meta.is_negative_at(
            ParameterLocation.HEADER)
        response = case.call() if negated_headers else case.call(headers=headers)
        seen[response.status_code // 100] += 1
        for check in checks:
            try:
                case.validate_response(response, checks=[check])
            except (FailureGroup, AssertionError) as exc:  # the check failed
                if not known_check_gap(check.__name__, operation.label, response.status_code):
                    found.append(("check", check.__name__, operation.label, mode.value,
                                  response.status_code, str(exc)[:2000]))
        try:
            case.validate_response(response, checks=[status_code_conformance])
        except (FailureGroup, AssertionError):
            found.append(("status", operation.label, mode.value, response.status_code))

    try:
        fuzz()
    except Unsatisfiable:  # nothing to negate (no parameters, no body)
        pass
    return found


def known_check_gap(check: str, label: str, status: int) -> bool:
    """Failed checks to tolerate: none left (the gaps the fuzzing found are fixed)."""
    return False


def known_status_gap(label: str, mode: str, status: int) -> bool:
    """Undocumented statuses to tolerate: none left."""
    return False


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
def test_fuzz_every_operation(role, redis_url, stop_lifespans):
    namespace = f"fuzz-{role}"
    seed_prompts(redis_url, namespace)
    app = create_app(secured_settings(redis_url, namespace), clock=TickingClock())
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = {"Authorization": f"Bearer {TOKENS[role]}"}
    failures, statuses, operations, seen = [], collections.Counter(), 0, collections.Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in GenerationMode:
            for found in run_operation(operation, mode, headers, seen):
                if found[0] == "check":
                    failures.append(found[1:])
                elif not known_status_gap(*found[1:]):
                    statuses[found[1:]] += 1
    assert operations >= 14, "the schema lost operations"
    assert seen[2] >= 20 and seen[4] >= 100, f"too few accepted or refused calls: {dict(seen)}"
    summary = collections.Counter(f[:4] for f in failures)
    assert not failures, (f"failed checks (check, operation, mode, status): {dict(summary)}\n\n"
                          + "\n\n".join(" ".join(map(str, f)) for f in failures[:3]))
    assert not statuses, f"undocumented status codes (operation, mode, status): {dict(statuses)}"


# --- what the fuzzing found: the OpenAPI document's gaps, pinned --------------------------------


@pytest.fixture
async def secured_app(redis_url):
    app = create_app(secured_settings(redis_url, "fuzz-docs"))
    yield app
    await app.state.scheduler.store.redis.aclose()


@pytest.fixture
async def spec(secured_app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=secured_app),
                                 base_url="http://test") as http:
        r = await http.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def secured_operations(spec) -> list[str]:
    return sorted(f"{method.upper()} {path}" for path, ops in spec["paths"].items()
                  for method, op in ops.items() if op.get("security"))


@pytest.mark.anyio
async def test_secured_operations_document_401_and_403(spec):
    secured = secured_operations(spec)
    assert len(secured) >= 12
    missing = {status: [label for label in secured
                        if status not in spec["paths"][label.split(" ", 1)[1]][
                            label.split(" ", 1)[0].lower()]["responses"]]
               for status in ("401", "403")}
    assert missing == {"401": [], "403": []}


@pytest.mark.anyio
async def test_reads_by_id_document_404(spec):
    for label in sorted(UNDOCUMENTED_404):
        method, path = label.split(" ", 1)
        assert "404" in spec["paths"][path][method.lower()]["responses"], label


@pytest.mark.anyio
async def test_undecodable_body_is_422_like_invalid_json(secured_app):
    headers = {"Authorization": f"Bearer {TOKENS['worker']}",
               "Content-Type": "application/json"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=secured_app),
                                 base_url="http://test", headers=headers) as http:
        invalid_json = await http.post("/leases", content=b"{not json")
        undecodable = await http.post("/leases", content=b'{"worker_id": "\xff\xfe"}')
    assert invalid_json.status_code == 422
    assert undecodable.status_code == 422, undecodable.text
    assert json.loads(undecodable.text)["error"]["code"] == "invalid_request"


@pytest.mark.anyio
async def test_dashboard_documents_its_errors_as_json(spec):
    responses = spec["paths"]["/dashboard"]["get"]["responses"]
    for status in ("401", "403"):
        assert set(responses[status]["content"]) == {"application/json"}, status

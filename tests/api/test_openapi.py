"""/openapi.json documents every route (docs/architecture.md, "Routes") and every wire model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio

# docs/architecture.md, "Routes", less /dashboard, /run and the prompt listing and changes.
ROUTES = {
    ("post", "/prompts"), ("get", "/prompts/{prompt_id}"), ("post", "/leases"),
    ("post", "/results"), ("post", "/leases/{lease_id}/heartbeat"), ("post", "/batches/next"),
    ("post", "/batches/{batch_id}/ack"), ("get", "/policy"), ("post", "/policy"),
    ("get", "/groups/{group_id}"), ("get", "/stats"), ("get", "/metrics"), ("get", "/healthz"),
    ("get", "/readyz"),
}
MODELS = {
    ("post", "/prompts"): ("AddPromptsRequest", "AddPromptsResponse"),
    ("get", "/prompts/{prompt_id}"): (None, "PromptOut"),
    ("post", "/leases"): ("LeaseRequest", "LeaseResponse"),
    ("post", "/results"): ("ResultsRequest", "ResultsResponse"),
    ("post", "/leases/{lease_id}/heartbeat"): ("HeartbeatRequest", "HeartbeatResponse"),
    ("post", "/batches/next"): ("NextBatchRequest", "Batch"),
    ("post", "/batches/{batch_id}/ack"): (None, "AckResponse"),
    ("get", "/policy"): (None, "PolicyInfo"),
    ("post", "/policy"): ("PublishPolicyRequest", "PolicyInfo"),
    ("get", "/groups/{group_id}"): (None, "GroupOut"),
    ("get", "/stats"): (None, "StatsResponse"),
    ("get", "/healthz"): (None, "HealthResponse"),
    ("get", "/readyz"): (None, "HealthResponse"),
}
NESTED = {"PromptIn", "Posterior", "PromptHistory", "Rollout", "SamplingParams", "RolloutResult",
          "GroupDecision", "BatchGroup", "BatchRollout", "BatchStats", "GroupSlot", "Counters",
          "Derived", "Queues", "WorkerStats"}


@pytest.fixture
async def spec(api):
    r = await api.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def refs(node) -> set[str]:
    """Every schema name a node refers to, however deeply (anyOf, items ...)."""
    found = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            found.add(ref.rsplit("/", 1)[-1])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


async def test_every_design_route_is_documented(spec):
    documented = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert ROUTES <= documented
    assert "/dashboard" not in spec["paths"] or ("get", "/dashboard") in documented


async def test_request_and_response_models_have_schemas(spec):
    schemas = spec["components"]["schemas"]
    for (method, path), (request, response) in MODELS.items():
        op = spec["paths"][path][method]
        if request:
            assert request in schemas
            assert request in refs(op["requestBody"]), (method, path)
        assert response in schemas
        assert response in refs(op["responses"]["200"]), (method, path)
    assert NESTED <= set(schemas)


async def test_documented_alternative_statuses(spec):
    paths = spec["paths"]
    assert "204" in paths["/batches/next"]["post"]["responses"]
    assert {"404", "409"} <= set(paths["/leases/{lease_id}/heartbeat"]["post"]["responses"])
    assert "404" in paths["/results"]["post"]["responses"]
    assert "409" in paths["/policy"]["post"]["responses"]
    assert "503" in paths["/readyz"]["get"]["responses"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]


async def test_bearer_auth_is_declared(spec):
    schemes = spec["components"]["securitySchemes"]
    assert any(s.get("scheme", "").lower() == "bearer" for s in schemes.values())
    assert spec["paths"]["/leases"]["post"].get("security")
    assert not spec["paths"]["/healthz"]["get"].get("security")


async def test_error_answers_are_documented_as_the_envelope(spec):
    assert "ErrorEnvelope" in spec["components"]["schemas"]
    for path, method in (("/leases", "post"), ("/results", "post"), ("/prompts", "post")):
        assert refs(spec["paths"][path][method]["responses"]["422"]) == {"ErrorEnvelope"}

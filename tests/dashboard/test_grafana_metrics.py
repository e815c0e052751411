"""The shipped Grafana dashboard against a live scheduler: every metric its PromQL names is one the
service really exports, once a workload has run (a real uvicorn, a real Redis, SDK clients)."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sara_service.settings import Settings

from ..conftest import emptied
from ..deploy.test_monitoring import DASHBOARD, dashboard_expressions
from ._cdp import wait_until
from ._live import LiveServer, Workload

TOKENS = {"worker": "tok-worker-5e1b", "trainer": "tok-trainer-2a9c",
          "operator": "tok-operator-83f0", "admin": "tok-admin-b7d4"}
# PromQL functions, keywords and label names also match [a-z_]+: only metric-like names count
METRIC = re.compile(r"\b((?:sara|process|python)_[a-zA-Z0-9_]+)\b")


def scrape(url: str) -> tuple[set[str], dict]:
    """(every sample name, families by name) of one GET /metrics as the operator."""
    r = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKENS['operator']}"},
                  timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    return {s.name for f in families.values() for s in f.samples}, families


@pytest.fixture(scope="module")
def live(tmp_path_factory, redis_server_url):
    settings = Settings(redis_url=redis_server_url, namespace="grafana", policy="sara",
                        group_size=8, tau_low=0.5, audit_fraction=0.5,  # DS figures need audits
                        batch_size=8, prefetch_batches=2,
                        **{f"{role}_token": tok for role, tok in TOKENS.items()})
    server = LiveServer(settings).start()
    workload = Workload(server.url, admin=TOKENS["admin"], worker=TOKENS["worker"],
                        trainer=TOKENS["trainer"], prompts=300).start()
    try:
        # work until every DS figure (the estimate and its interval) has a sample
        wait_until(lambda: "sara_net_saving_vs_ds_high" in scrape(server.url)[0]
                   and workload.batches >= 2, 60, "the DS estimate and two batches")
    finally:
        workload.stop()
    httpx.get(f"{server.url}/groups/g-nope", timeout=10,
              headers={"Authorization": f"Bearer {TOKENS['operator']}"})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis_server_url(redis_server):
    """The session's real redis-server (tests/conftest.py), emptied for this module."""
    return emptied(redis_server)


def test_every_dashboard_metric_is_exported(live):
    names, _ = scrape(live.url)
    expressions = dashboard_expressions(json.loads(DASHBOARD.read_text()))
    wanted = {m for expr in expressions for m in METRIC.findall(expr)}
    assert wanted, "the dashboard names no metric"
    assert wanted - names == set(), f"named by the dashboard, not exported: {wanted - names}"


def test_request_metrics_are_labelled_by_route_template(live):
    _, families = scrape(live.url)
    requests = families["sara_http_requests"].samples
    routes = {s.labels["route"] for s in requests}
    assert {"/leases", "/results", "/batches/next", "/groups/{group_id}"} <= routes, routes
    assert not any("g-nope" in r for r in routes)
    missing = [s for s in requests if s.labels["route"] == "/groups/{group_id}"]
    assert {s.labels["status"] for s in missing} == {"404"}
    latency = families["sara_http_request_duration_seconds"]
    assert latency.type == "histogram"
    counts = [s for s in latency.samples if s.name.endswith("_count")
              and s.labels["route"] == "/leases"]
    assert counts and counts[0].value > 0
    assert families["process_cpu_seconds"].samples[0].value > 0

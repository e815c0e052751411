"""GET /dashboard and its assets over plain HTTP: roles, content types, headers, log redaction."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from sara_service.http.app import create_app
from sara_service.http.credentials import worker_token
from sara_service.http.routers.dashboard import RedactTokenFilter, redact
from sara_service.settings import Settings

pytestmark = pytest.mark.anyio

TOKENS = {"worker": "tok-worker", "trainer": "tok-trainer", "operator": "tok-operator",
          "admin": "tok-admin"}


@pytest.fixture
async def make_http(redis_url):
    apps, clients = [], []

    def build(**overrides) -> httpx.AsyncClient:
        app = create_app(Settings(redis_url=redis_url, **overrides))
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
        apps.append(app)
        clients.append(http)
        return http

    yield build
    for http in clients:
        await http.aclose()
    for app in apps:  # no lifespan under ASGITransport: close the Redis client here
        await app.state.scheduler.store.redis.aclose()


@pytest.fixture
async def secured(make_http):
    return make_http(**{f"{role}_token": tok for role, tok in TOKENS.items()})


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def assert_page(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert "<canvas" in r.text and 'data-testid="chart-efficiency"' in r.text
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "default-src 'self'" in r.headers["content-security-policy"]


@pytest.mark.parametrize("role", ["operator", "admin"])
async def test_page_for_operator_and_admin_by_bearer_or_query(secured, role):
    assert_page(await secured.get("/dashboard", headers=bearer(role)))
    assert_page(await secured.get("/dashboard", params={"token": TOKENS[role]}))


async def test_page_without_token_is_401_and_says_how(secured):
    for kw in ({}, {"params": {"token": ""}}, {"params": {"token": "nope"}},
               {"headers": {"Authorization": "Bearer nope"}}):
        r = await secured.get("/dashboard", **kw)
        assert r.status_code == 401, (kw, r.text)
        assert r.json()["error"]["code"] == "unauthorized"
    assert "?token=" in (await secured.get("/dashboard")).json()["error"]["message"]


@pytest.mark.parametrize("role", ["worker", "trainer"])
async def test_page_refuses_other_roles_with_403(secured, role):
    for kw in ({"headers": bearer(role)}, {"params": {"token": TOKENS[role]}}):
        r = await secured.get("/dashboard", **kw)
        assert r.status_code == 403, (kw, r.text)
        assert r.json()["error"]["code"] == "forbidden"


async def test_a_per_worker_token_is_known_to_the_page_and_refused_as_a_worker(make_http):
    # the page and the API decide a token's role by one check: a signed per-worker token is a
    # worker there too (403 that says so), not an unknown token (401)
    http = make_http(worker_secret="s" * 32,
                     **{f"{role}_token": tok for role, tok in TOKENS.items()})
    r = await http.get("/dashboard", params={"token": worker_token("s" * 32, "w-7")})
    assert r.status_code == 403, r.text
    assert "a worker token may not open the dashboard" in r.json()["error"]["message"]


async def test_a_bearer_header_wins_over_the_query(secured):
    r = await secured.get("/dashboard", headers=bearer("worker"),
                          params={"token": TOKENS["admin"]})
    assert r.status_code == 403


async def test_page_is_open_when_no_tokens_are_configured(make_http):
    assert_page(await make_http().get("/dashboard"))


async def test_assets_have_their_content_types_and_need_no_token(secured):
    page = (await secured.get("/dashboard", headers=bearer("operator"))).text
    for path, kind in (("dashboard/static/dashboard.js", "text/javascript"),
                       ("dashboard/static/dashboard.css", "text/css")):
        assert f'"{path}"' in page  # relative links, resolved against /dashboard
        r = await secured.get("/" + path)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith(kind), r.headers["content-type"]
        assert r.headers["x-content-type-options"] == "nosniff"
        assert len(r.content) > 1000
    assert "getContext(\"2d\")" in (await secured.get("/dashboard/static/dashboard.js")).text


async def test_unknown_asset_is_404_and_no_path_escape(secured):
    for path in ("/dashboard/static/nope.js", "/dashboard/static/dashboard.html",
                 "/dashboard/static/..%2Fapp.py", "/dashboard/static/%2e%2e%2fdeps.py"):
        r = await secured.get(path)
        assert r.status_code == 404, (path, r.status_code)


async def test_page_references_nothing_outside_the_origin(make_http):
    http = make_http()
    texts = [(await http.get(p)).text for p in ("/dashboard", "/dashboard/static/dashboard.js",
                                                "/dashboard/static/dashboard.css")]
    for text in texts:
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text)
        assert "@import" not in text and "cdn" not in text.lower()


async def test_dashboard_is_documented_but_its_assets_are_not(make_http):
    paths = (await make_http().get("/openapi.json")).json()["paths"]
    assert "get" in paths["/dashboard"]
    assert not any(p.startswith("/dashboard/static") for p in paths)


def test_token_in_access_log_lines_is_redacted():
    assert redact("GET /dashboard?token=s3cr3t HTTP/1.1") == "GET /dashboard?token=*** HTTP/1.1"
    assert redact("/dashboard?a=1&token=s3cr3t&b=2") == "/dashboard?a=1&token=***&b=2"
    assert redact("/stats") == "/stats"
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/dashboard?token=s3cr3t", "1.1", 200), None)
    assert RedactTokenFilter().filter(record)
    assert "s3cr3t" not in record.getMessage() and "token=***" in record.getMessage()
    access = logging.getLogger("uvicorn.access")
    assert any(isinstance(f, RedactTokenFilter) for f in access.filters)


@pytest.mark.parametrize("query", ["tok%65n=s3cr3t", "%74oken=s3cr3t", "TOKEN=s3cr3t",
                                   "a=1&tok%65n=s3cr3t&b=2", "%74%6F%6B%65%6E=s3cr3t",
                                   "token=s3%63r3t", "x=1;token=s3cr3t", "tok%2565n=s3cr3t"])
def test_token_is_redacted_however_the_query_encodes_it(query):
    """The server decodes parameter names, so the filter must too."""
    line = f"GET /dashboard?{query} HTTP/1.1"
    out = redact(line)
    assert "s3cr3t" not in out and "s3%63r3t" not in out, out
    assert out.startswith("GET /dashboard?") and out.endswith(" HTTP/1.1"), out
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", f"/dashboard?{query}", "1.1", 200), None)
    assert RedactTokenFilter().filter(record)
    assert "s3cr3t" not in record.getMessage()

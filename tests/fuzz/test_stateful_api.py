"""A stateful fuzz test of the HTTP API: no sequence of requests can make a later call a 5xx.

Hypothesis drives random sequences of calls against the app in-process (httpx over ASGI, on the
test session's real Redis), with hostile values wherever a client could put them: `meta` nested
up to 300 levels or holding huge numbers or lone surrogates, NaN and infinities sent as raw JSON
tokens, integers
past 2**53 (up to 10**400), ids made of dots or holding ':' (a lease id with ':rollouts' after
it), unknown finish reasons, results for rollouts another worker holds, the clock moved past
lease and ack timeouts. Whatever a call answers, it must not be a 5xx; and after every step the
readers the issue names (/leases, /results, /batches/next, /stats, /metrics, /groups/{id},
/prompts/{id}) must answer without a 5xx for every id seen so far.

It runs in CI: derandomized, 25 sequences of up to 25 steps, well under a minute. For a longer
hunt, `SARA_FUZZ_EXAMPLES=500` runs that many random (not derandomized) sequences.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from typing import Any
from unittest import mock

import httpx
import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from hypothesis.stateful import run_state_machine_as_test

from sara_service.core import scheduler as scheduler_module
from sara_service.http.app import create_app
from sara_service.settings import Settings
from tests.conftest import FakeClock

BASE = "http://fuzz"
HUGE_INTS = st.sampled_from([2 ** 53 - 1, 2 ** 53, 10 ** 17, int(1.7e18), 2 ** 63, 10 ** 400])
NUMBERS = st.one_of(st.integers(-5, 5), HUGE_INTS, st.floats(allow_nan=True, allow_infinity=True))
ODD_IDS = st.one_of(
    st.sampled_from([".", "..", "...", ":", "a:b", "x:0", "p:rollouts", "-", "_", "a" * 128,
                     "a" * 129, "", "ü", "a/b", "a b", "%2e%2e"]),
    st.from_regex(r"[A-Za-z0-9_.:\-]{1,12}", fullmatch=True))
ODD_TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["\ud800", "a\udc00", "\x00", "%00"]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, ODD_TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(ODD_TEXT, inner, max_size=3)), max_leaves=8)


def nested(depth: int, leaf: Any = 1) -> Any:
    out = leaf
    for _ in range(depth):
        out = {"a": out}
    return out


def encode(body: Any) -> bytes:
    """JSON with NaN and infinities as bare tokens, as a careless client sends them."""
    return json.dumps(body, allow_nan=True).encode()


class ApiMachine(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        client = sync_redis.Redis.from_url(self.redis_url)
        try:
            client.flushall()
        finally:
            client.close()
        ids = itertools.count()  # deterministic ids: hypothesis replays examples to shrink
        self.patch = mock.patch.object(scheduler_module, "_new_id",
                                       lambda prefix: f"{prefix}{next(ids):06d}")
        self.patch.start()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        cfg = Settings(redis_url=self.redis_url, policy="sara", group_size=4, tau_low=0.5,
                       prior="uniform", selection="epoch", batch_size=2, prefetch_batches=2,
                       poll_interval_s=0.001)
        self.app = create_app(cfg, redis=aioredis.Redis.from_url(self.redis_url),
                              clock=self.clock)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                      base_url=BASE)
        self.prompts: set[str] = {"p0"}
        self.leases: dict[str, str] = {}           # lease id -> worker
        self.rollouts: dict[str, str] = {}         # rollout id -> worker that leased it
        self.groups: set[str] = set()
        self.batches: set[str] = set()
        self.call("POST", "/prompts", {"prompts": [{"id": "p0", "prompt": "q0"}]})

    def teardown(self) -> None:
        try:
            self.probe_readers()
            self.loop.run_until_complete(self.http.aclose())
            self.loop.run_until_complete(self.app.state.scheduler.store.redis.aclose())
        finally:
            self.loop.close()
            self.patch.stop()

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """One request; a 5xx fails the test with the request that caused it."""
        kw: dict[str, Any] = {}
        if body is not None:
            kw = {"content": encode(body), "headers": {"content-type": "application/json"}}
        r = self.loop.run_until_complete(self.http.request(method, path, **kw))
        assert r.status_code < 500, (method, path, str(body)[:300], r.status_code, r.text[:300])
        return r

    # --- writes with hostile values ----------------------------------------------------------

    @rule(pid=ODD_IDS, meta=st.one_of(JSON, st.integers(0, 300).map(nested)),
          prompt=st.one_of(st.text(min_size=1, max_size=20), ODD_TEXT),
          answer=st.one_of(st.none(), SCALARS))
    def add_prompt(self, pid, meta, prompt, answer):
        body = {"prompts": [{"id": pid, "prompt": prompt, "answer": answer,
                             "meta": meta if isinstance(meta, dict) else {"m": meta}}]}
        r = self.call("POST", "/prompts", body)
        if r.status_code == 200:
            self.prompts.update(r.json()["ids"])

    @rule(worker=st.one_of(st.just("w1"), st.just("w2"), ODD_IDS), n=st.integers(1, 8),
          backend=st.one_of(st.none(), ODD_TEXT))
    def lease(self, worker, n, backend):
        r = self.call("POST", "/leases", {"worker_id": worker, "max_rollouts": n,
                                          "backend": backend})
        if r.status_code == 200 and r.json()["lease_id"]:
            self.leases[r.json()["lease_id"]] = worker
            for ro in r.json()["rollouts"]:
                self.rollouts[ro["rollout_id"]] = worker
                self.groups.add(ro["group_id"])

    @precondition(lambda self: self.rollouts)
    @rule(data=st.data(), reward=st.one_of(st.sampled_from([0.0, 1.0]), NUMBERS),
          version=st.one_of(st.none(), st.integers(0, 3), HUGE_INTS),
          logprobs=st.one_of(st.none(), st.lists(NUMBERS, max_size=3)),
          token_ids=st.one_of(st.none(), st.lists(st.one_of(st.integers(-2, 5), HUGE_INTS),
                                                  max_size=3)),
          finish=st.one_of(st.sampled_from(["stop", "length", "abort", "error"]), ODD_TEXT),
          completion=ODD_TEXT,
          as_other=st.booleans())
    def report(self, data, reward, version, logprobs, token_ids, finish, completion, as_other):
        rid = data.draw(st.sampled_from(sorted(self.rollouts)), label="rollout")
        result: dict[str, Any] = {"rollout_id": rid, "reward": reward, "finish_reason": finish,
                                  "completion": completion, "logprobs": logprobs,
                                  "token_ids": token_ids}
        if version is not None:
            result["policy_version"] = version
        worker = "intruder" if as_other else self.rollouts[rid]
        self.call("POST", "/results", {"worker_id": worker, "results": [result]})

    @rule(rid=ODD_IDS)
    def report_unknown(self, rid):
        self.call("POST", "/results", {"worker_id": "w1", "results": [
            {"rollout_id": rid, "reward": 1.0}]})

    @rule(data=st.data(), suffix=st.sampled_from(["", ":rollouts", ":x", "."]),
          worker=st.sampled_from(["owner", "w1", "other"]))
    def heartbeat(self, data, suffix, worker):
        lid = data.draw(st.sampled_from(sorted(self.leases) or ["l0"]), label="lease")
        wid = self.leases.get(lid, "w1") if worker == "owner" else worker
        self.call("POST", f"/leases/{lid}{suffix}/heartbeat", {"worker_id": wid})

    @rule(version=st.one_of(st.integers(-1, 5), HUGE_INTS, st.floats(allow_nan=True)),
          checkpoint=st.one_of(st.none(), ODD_TEXT))
    def publish(self, version, checkpoint):
        self.call("POST", "/policy", {"version": version, "checkpoint": checkpoint})

    @rule(size=st.one_of(st.none(), st.integers(1, 4)))
    def next_batch(self, size):
        r = self.call("POST", "/batches/next", {"size": size, "wait_s": 0})
        if r.status_code == 200:
            self.batches.add(r.json()["batch_id"])
            self.groups.update(g["group_id"] for g in r.json()["groups"])

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def ack(self, data):
        self.call("POST", f"/batches/{data.draw(st.sampled_from(sorted(self.batches)))}/ack")

    @rule(seconds=st.sampled_from([1.0, 61.0, 301.0, 4000.0]))
    def advance_clock(self, seconds):
        self.clock.advance(seconds)
        self.loop.run_until_complete(self.app.state.scheduler.maintain())

    # --- every reader answers, whatever came before ------------------------------------------

    @invariant()
    def readers_answer(self):
        self.probe_readers()

    def probe_readers(self) -> None:
        for path in ("/stats", "/metrics", "/policy", "/healthz"):
            self.call("GET", path)
        r = self.call("POST", "/leases", {"worker_id": "reader", "max_rollouts": 2})
        if r.status_code == 200 and r.json()["rollouts"]:
            self.call("POST", "/results", {"worker_id": "reader", "results": [
                {"rollout_id": ro["rollout_id"], "reward": 0.0} for ro in r.json()["rollouts"]]})
        self.call("POST", "/batches/next", {"wait_s": 0})
        for pid in sorted(self.prompts)[:8]:
            self.call("GET", f"/prompts/{pid}")
        for gid in sorted(self.groups)[:8]:
            self.call("GET", f"/groups/{gid}")


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
@pytest.mark.timeout(900)  # passing takes ~20 s; shrinking a failure takes minutes: let it report
def test_no_sequence_of_requests_leads_to_a_5xx(redis_url):
    machine = type("BoundApiMachine", (ApiMachine,), {"redis_url": redis_url})
    hunt = int(os.environ.get("SARA_FUZZ_EXAMPLES", "0"))
    run_state_machine_as_test(machine, settings=settings(
        max_examples=hunt or 25, stateful_step_count=25, deadline=None, derandomize=not hunt,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                               HealthCheck.data_too_large]))

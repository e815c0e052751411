"""The colocated rollout session on its own (no Ray, no verl): the real app in-process on the
tests' real Redis, and a scripted engine. A rollout SARA cancels is aborted on the engine, that
request alone; a pause aborts what is still generating and hands it back, and SARA re-issues it
at once with its group kept open; an engine error is reported as one. The engine is the session's own interface (`Engine`), scripted here: verl's is tested in
test_verl_manager.py."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

pytest.importorskip("sara_service")

from tests._need import need  # noqa: E402

need("torch", "torch (sara_integrations.verl's layouts are tensors; CI installs it)")

from sara_client import local  # noqa: E402

from sara_integrations.verl.session import Generated, RolloutSession  # noqa: E402
from sara_integrations.verl.settings import SaraVerlSettings  # noqa: E402


class ScriptedEngine:
    """Every request generates until aborted, except for prompts named in ``fail``, which
    raise."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.fail = fail
        self.waiting: dict[str, asyncio.Event] = {}
        self.aborted: list[str] = []
        self.first_request, self.first_failure = threading.Event(), threading.Event()
        self.requests: queue.Queue[str] = queue.Queue()
        self.aborted_requests: queue.Queue[str] = queue.Queue()

    async def generate(self, request_id: str, prompt_ids: list[int]) -> Generated:
        if any(prompt_ids == list(map(ord, name)) for name in self.fail):
            self.first_failure.set()
            raise RuntimeError("engine failure (scripted)")
        event = self.waiting.setdefault(request_id, asyncio.Event())
        self.first_request.set()
        self.requests.put(request_id)
        await event.wait()
        return Generated([7], None, "aborted")

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.aborted_requests.put(request_id)
        event = self.waiting.get(request_id)
        if event is not None:
            event.set()

    async def score(self, rollout, prompt_ids, response_ids) -> float:
        return 0.0

    def finish_reason(self, generated: Generated) -> str:
        return "stop"


def rollout_of(request_id: str) -> str:
    """The rollout of a session request (``sara-<group>:<slot>-<nonce>``)."""
    return request_id[len("sara-"):].rsplit("-", 1)[0]


def group_of(request_id: str) -> str:
    """The group of a session request."""
    return rollout_of(request_id).rpartition(":")[0]


def first(requests: queue.Queue, rollout_id: str) -> str:
    """The first request (from ``requests``, as they come) for ``rollout_id``."""
    while True:
        request_id = requests.get(timeout=30)
        if rollout_of(request_id) == rollout_id:
            return request_id


def session_on(sara, engine: ScriptedEngine) -> RolloutSession:
    settings = SaraVerlSettings(url="http://sara.local", max_in_flight=8, lease_wait_s=0.1,
                                heartbeat_s=0.2)
    return RolloutSession(sara, engine, settings, encode=lambda p: list(map(ord, str(p))))


@pytest.fixture
def sara(redis_url):
    with local(redis_url=redis_url, group_size=4, batch_size=1, tau_low=0.5) as client:
        client.add_prompts([{"id": "a", "prompt": "a", "task": "exact", "answer": "x"}])
        yield client


def test_pause_aborts_what_runs_and_sara_reissues_it_alone(sara):
    engine = ScriptedEngine()
    session = session_on(sara, engine)
    try:
        session.resume(0)
        assert engine.first_request.wait(timeout=30)
        session.pause()          # returns once every rollout it held is reported
        running = set(engine.waiting)
    finally:
        session.close()
    assert running and running <= set(engine.aborted)
    assert not session.held and session.counts["aborted"] == session.counts["leased"]
    counters = sara.stats().counters
    assert counters.rollouts_reissued == session.counts["leased"] and not counters.groups_abandoned
    for gid in {group_of(r) for r in running}:
        group = sara.get_group(gid)
        assert group.state == "open" and group.done == 0
        assert {s.state for s in group.rollouts} <= {"pending", "unissued"}


def test_an_engine_error_is_reported_as_one(sara):
    engine = ScriptedEngine(fail=("a",))
    session = session_on(sara, engine)
    try:
        session.resume(0)
        assert engine.first_failure.wait(timeout=30)
        session.pause()          # returns once every rollout it held is reported
    finally:
        session.close()
    assert sara.stats().counters.rollouts_errored >= 1 and session.counts["errors"] >= 1
    assert not session.held


def test_a_rollout_sara_cancels_is_aborted_on_the_engine(sara):
    """Worker A hands a rollout back (abort), the session gets the re-issued copy, then A's late
    result fills the slot: SARA cancels the session's copy, and the session aborts exactly that
    request on the engine (its heartbeat brings the cancel)."""
    lease = sara.lease("A", max_rollouts=1)
    (rollout,) = lease.rollouts
    sara.report("A", [{"rollout_id": rollout.rollout_id, "reward": 0.0, "finish_reason": "abort"}])
    engine = ScriptedEngine()
    session = session_on(sara, engine)
    try:
        session.resume(0)
        copy = first(engine.requests, rollout.rollout_id)
        sara.report("A", [{"rollout_id": rollout.rollout_id, "reward": 1.0}])
        assert first(engine.aborted_requests, rollout.rollout_id) == copy
        assert session.counts["cancelled"] == 1
        session.pause()
    finally:
        session.close()
    assert not session.held

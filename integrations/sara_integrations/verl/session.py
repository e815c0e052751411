"""The colocated rollout session: SARA's leased rollouts generated on verl's rollout servers.

verl's sync trainer runs generation and training on the same GPUs in turn: its rollout servers
are awake from the weight sync that ends one step until the sample that starts the next, asleep
while the actor trains. The session follows that rhythm. The sampler calls :meth:`resume` with
the policy version the servers hold; the session leases from SARA, generates each rollout as
one request on verl's servers (one session per rollout, ``rollout.n = 1``), scores it with verl's
reward function and reports it, until the sampler has its batch and calls :meth:`pause`: the
session stops leasing, aborts what is still generating and reports those rollouts as aborted,
which SARA re-issues at once, alone (their groups keep every result they have). A rollout the
engine fails on is reported as an error, re-issued the same way. Cancellations SARA sends (a
group decided while some of its rollouts still ran) abort exactly those requests.

The session runs on its own event loop in a thread; the engine it drives is duck-typed
(:class:`Engine`), so the manager supplies verl's and the tests may supply another. The SARA
client is the blocking SDK client, called from the loop's worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from sara_client.errors import NotFoundError, StaleWeightsError
from sara_client.limits import FLOOR_LOGPROB, MAX_ROLLOUTS_PER_LEASE
from sara_client.local import run_on_loop
from sara_client.models import Rollout

from .settings import SaraVerlSettings

log = logging.getLogger("sara.verl")
# how long pause() lets aborted requests come back before it stops waiting for them (their
# leases then expire and SARA re-issues them)
DRAIN_TIMEOUT_S = 120.0
ABORTED = ("aborted", "abort")


@dataclass
class Generated:
    """One request's answer from the engine: token ids, their logprobs, and whether the engine
    aborted it (``stop_reason`` ``aborted``) or ran out of room (``length``)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = None


class Engine(Protocol):
    """What the session needs from the rollout side."""

    async def generate(self, request_id: str, prompt_ids: list[int]) -> Generated: ...

    async def abort(self, request_id: str) -> None: ...

    async def score(self, rollout: Rollout, prompt_ids: list[int],
                    response_ids: list[int]) -> float: ...

    def finish_reason(self, generated: Generated) -> str: ...


@dataclass
class Held:
    """A leased rollout this session is working on."""

    rollout: Rollout
    lease_id: str
    request_id: str
    cancelled: bool = False
    task: asyncio.Task | None = field(default=None, repr=False)


_SESSIONS: list[RolloutSession] = []
_SESSIONS_LOCK = threading.Lock()


def colocated_session() -> RolloutSession | None:
    """The colocated session this process runs (the manager registers it), if any."""
    with _SESSIONS_LOCK:
        return _SESSIONS[-1] if _SESSIONS else None


class RolloutSession:
    """Lease, generate on ``engine``, score, report; between :meth:`resume` and :meth:`pause`."""

    def __init__(self, sara: Any, engine: Engine, settings: SaraVerlSettings,
                 encode: Callable[[Any], list[int]]) -> None:
        self.sara, self.engine, self.settings, self.encode = sara, engine, settings, encode
        self.version = 0
        self.held: dict[str, Held] = {}
        self.counts = {"leased": 0, "reported": 0, "aborted": 0, "errors": 0, "cancelled": 0}
        self._active = False
        self._leasing: asyncio.Task | None = None
        self._heartbeats: asyncio.Task | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sara-verl-session",
                                        daemon=True)
        self._thread.start()
        self._space = run_on_loop(self._make_event(), self._loop)

    # --- from the trainer's thread ----------------------------------------------------------

    def register(self) -> RolloutSession:
        """Make this the session the process's sampler drives (colocated mode)."""
        with _SESSIONS_LOCK:
            _SESSIONS.append(self)
        return self

    def resume(self, version: int) -> None:
        """Start leasing and generating; the servers hold policy ``version``."""
        run_on_loop(self._resume(version), self._loop)

    def pause(self) -> None:
        """Stop leasing, abort what is generating, report it, and return once nothing is held."""
        run_on_loop(self._pause(), self._loop)

    def close(self) -> None:
        """Pause, unregister, and stop the session's thread."""
        self.pause()
        with _SESSIONS_LOCK:
            if self in _SESSIONS:
                _SESSIONS.remove(self)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # --- on the session's loop ----------------------------------------------------------------

    @staticmethod
    async def _make_event() -> asyncio.Event:
        return asyncio.Event()

    async def _resume(self, version: int) -> None:
        self.version = version
        if self._active:
            return
        self._active = True
        self._leasing = asyncio.ensure_future(self._lease_loop())
        self._heartbeats = asyncio.ensure_future(self._heartbeat_loop())

    async def _pause(self) -> None:
        self._active = False
        self._space.set()
        if self._heartbeats is not None:  # no need to wait out its sleep
            self._heartbeats.cancel()
        runners = [t for t in (self._leasing, self._heartbeats) if t is not None]
        await asyncio.gather(*runners, return_exceptions=True)
        self._leasing = self._heartbeats = None
        running = [h for h in self.held.values() if h.task is not None]
        await asyncio.gather(*(self._abort(h) for h in running))
        tasks = [h.task for h in running]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
            if late:
                log.warning("%d aborted rollouts did not come back in %.0fs; their leases will "
                            "expire and SARA re-issues them", len(late), DRAIN_TIMEOUT_S)

    async def _abort(self, held: Held) -> None:
        try:
            await self.engine.abort(held.request_id)
        except Exception as exc:  # the server may have finished it, or be gone
            log.warning("abort of %s failed: %r", held.rollout.rollout_id, exc)

    async def _lease_loop(self) -> None:
        s = self.settings
        while self._active:
            free = s.max_in_flight - len(self.held)
            if free <= 0:
                self._space.clear()
                await self._space.wait()
                continue
            try:
                lease = await asyncio.to_thread(
                    self.sara.lease, s.worker_id, min(free, MAX_ROLLOUTS_PER_LEASE),
                    s.lease_wait_s, "verl", self.version)
            except StaleWeightsError as exc:
                log.error("SARA refuses v%d as too old (%s); waiting for the next weight sync",
                          self.version, exc)
                return
            except Exception as exc:  # SARA unreachable or failing: keep trying, never give up
                log.warning("lease failed (%r); retrying in 1s", exc)
                await asyncio.sleep(1.0)
                continue
            await self._apply_cancels(lease.cancel)
            if lease.rollouts:
                log.debug("leased %d rollouts at v%d", len(lease.rollouts), self.version)
            for rollout in lease.rollouts:
                self._start(rollout, lease.lease_id or "")

    def _start(self, rollout: Rollout, lease_id: str) -> None:
        self.counts["leased"] += 1
        held = Held(rollout, lease_id, f"sara-{rollout.rollout_id}-{uuid.uuid4().hex[:8]}")
        self.held[rollout.rollout_id] = held
        if not self._active:  # leased as the session paused: hand it straight back
            held.task = asyncio.ensure_future(self._report_one(held, aborted_result(held)))
            return
        held.task = asyncio.ensure_future(self._run(held))

    async def _run(self, held: Held) -> None:
        if held.cancelled or not self._active:  # cancelled or paused before it started
            await self._report_one(held, aborted_result(held))
            return
        try:
            prompt_ids = self.encode(held.rollout.prompt)
            out = await self.engine.generate(held.request_id, prompt_ids)
            if out.stop_reason in ABORTED:
                result = aborted_result(held, out)
            else:
                reward = await self.engine.score(held.rollout, prompt_ids, out.token_ids)
                result = finished_result(held, out, reward, self.version,
                                         self.engine.finish_reason(out))
        except Exception as exc:  # the engine or the scorer failed: SARA re-issues it
            log.warning("rollout %s failed: %r", held.rollout.rollout_id, exc)
            self.counts["errors"] += 1
            result = error_result(held, exc, self.version)
        await self._report_one(held, result)

    async def _report_one(self, held: Held, result: dict[str, Any]) -> None:
        if result["finish_reason"] == "abort":
            self.counts["aborted"] += 1
        try:
            answer = await asyncio.to_thread(self.sara.report, self.settings.worker_id, [result])
            log.debug("reported %s (%s)", held.rollout.rollout_id, result["finish_reason"])
            self.counts["reported"] += 1
            await self._apply_cancels(answer.cancel)
        except Exception as exc:  # unreported: its lease expires and SARA re-issues it
            log.warning("report of %s failed: %s", held.rollout.rollout_id, exc)
        finally:
            self.held.pop(held.rollout.rollout_id, None)
            self._space.set()

    async def _apply_cancels(self, rollout_ids: list[str]) -> None:
        for rid in rollout_ids:
            held = self.held.get(rid)
            if held is not None and not held.cancelled:
                held.cancelled = True
                self.counts["cancelled"] += 1
                await self._abort(held)

    async def _heartbeat_loop(self) -> None:
        while self._active:
            await asyncio.sleep(self.settings.heartbeat_s)
            for lease_id in {h.lease_id for h in self.held.values() if h.lease_id}:
                try:
                    beat = await asyncio.to_thread(self.sara.heartbeat, lease_id,
                                                   self.settings.worker_id)
                except NotFoundError:  # closed: its rollouts were reported or cancelled
                    continue
                except Exception as exc:
                    log.warning("heartbeat of lease %s failed: %s", lease_id, exc)
                    continue
                await self._apply_cancels(beat.cancel)


def aborted_result(held: Held, out: Generated | None = None) -> dict[str, Any]:
    """An aborted rollout: SARA re-issues it (or, cancelled, only counts its tokens)."""
    tokens = list(out.token_ids) if out is not None else []
    return {"rollout_id": held.rollout.rollout_id, "reward": 0.0, "finish_reason": "abort",
            "completion_tokens": len(tokens)}


def error_result(held: Held, exc: BaseException, version: int) -> dict[str, Any]:
    """A rollout the engine or the scorer failed on: SARA re-issues it (a third error on one
    slot counts as a failure)."""
    return {"rollout_id": held.rollout.rollout_id, "reward": 0.0, "finish_reason": "error",
            "completion": f"<error: {type(exc).__name__}: {exc}>"[:1000],
            "policy_version": version}


def finished_result(held: Held, out: Generated, reward: float, version: int,
                    finish_reason: str) -> dict[str, Any]:
    """A generated and scored rollout, with the token ids (and logprobs) verl trains on."""
    result = {"rollout_id": held.rollout.rollout_id, "reward": float(reward),
              "token_ids": list(out.token_ids), "completion_tokens": len(out.token_ids),
              "finish_reason": finish_reason, "policy_version": version}
    if out.log_probs:
        result["logprobs"] = [max(float(x), FLOOR_LOGPROB) for x in out.log_probs]
    return result

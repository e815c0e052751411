"""The worker loop, one for every backend: lease, generate, verify, report.

- **lease** up to ``capacity`` rollouts (long-polling ``lease_wait_s``), again whenever a lease's
  worth of slots (``lease_min_size``) is free, or at once when nothing is held;
- **generate** each rollout in its own task (``backend.generate``), concurrently;
- **verify** next to generation with the verifier named by ``rollout.task`` (slow ones in a
  thread), and **report** in small batches (:class:`~sara_worker.reporter.Reporter`);
- **cancel**: every lease, results and heartbeat answer carries a cancel list; a rollout on it is
  aborted (``backend.abort``) and reported with reward 0.0, ``finish_reason="abort"`` and the
  tokens it had (the scheduler counts it as late);
- **heartbeat** each lease with unreported rollouts every ``lease_ttl_s / 3``; a lease the
  scheduler no longer knows has no slot left for us: its rollouts are aborted, not reported;
- **policy**: each lease names the current policy; when it moves, new generations wait, running
  ones finish (tagged with the version that produced them), ``backend.load_policy`` runs, and
  generation resumes under the new version;
- **reconnect**: a scheduler that stays down longer than the SDK's own retries costs bounded
  exponential backoff, never the worker; results wait in the outbox;
- **stop** (SIGTERM): stop leasing, finish (or abort) what is held, report, return. Rollouts we
  abort ourselves are not reported (a partial completion is no result): their leases expire.

Time is injected (``clock``, ``sleep``); :meth:`WorkerLoop.run_until` and ``max_rollouts``
bound a run, and :meth:`WorkerLoop.wait_for` lets a test wait on the loop's state without
sleeping. The lease bookkeeping and the reporter live apart (leases.py, reporter.py).

It is past 400 lines because the duties above share one set of in-flight rollouts and must
be read together to see that each leased rollout ends once: reported, or aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from sara_client import (
    MAX_ROLLOUTS_PER_LEASE, MAX_WAIT_S, AsyncSaraClient, LeaseResponse, PolicyInfo, Rollout,
    RolloutResult, SaraError, StaleWeightsError,
)

from . import verifiers
from .backends.base import Backend, Generation
from .idle import IdleNotice
from .leases import Leases
from .occupancy import EngineOccupancy
from .reporter import Reporter, WorkerError
from .support import (Backoff, Pulse, Reachability, WorkerConfig, WorkerCounters,
                      checkpoint_refusal, is_fatal, make_result)

__all__ = ["WorkerLoop", "WorkerConfig", "WorkerCounters", "WorkerError"]

log = logging.getLogger("sara.worker")
Sleep = Callable[[float], Awaitable[Any]]
Predicate = Callable[[], bool]


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("rollout task crashed", exc_info=task.exception())


@dataclass
class _Held:  # a leased rollout whose generation has not finished
    rollout: Rollout
    cancelled: bool = False  # by the scheduler: report the abort
    lost: bool = False  # no longer ours: drop it, no report
    running: bool = False
    end_version: int | None = None  # the version loaded when its generation ended
    task: asyncio.Task = None  # type: ignore[assignment]  # set right after creation


class WorkerLoop:
    """One worker: an SDK client, a backend and a :class:`WorkerConfig`."""

    def __init__(self, client: AsyncSaraClient, backend: Backend,
                 config: WorkerConfig | None = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self.client, self.backend = client, backend
        self.config = config or WorkerConfig()
        self.counters = WorkerCounters()
        self._pulse = Pulse(clock, sleep)
        self.leases = Leases(client, self.config, self.counters, self._pulse, self._apply_cancels,
                             self._give_up)
        self._reporter = Reporter(client, self.config, self.counters, self._pulse,
                                  self._apply_cancels, self.leases.untrack)
        self._outbox = self._reporter.outbox
        self._held: dict[str, _Held] = {}
        self._running = 0
        self._leased_total = 0
        self._loaded_version = self.config.initial_policy_version
        self._target = self._loaded = PolicyInfo(version=self._loaded_version)
        self._refused: PolicyInfo | None = None   # outside checkpoint_root: never loaded
        url = str(getattr(client, "base_url", "the scheduler"))
        self._reach = Reachability(url, self.config.give_up_after_s, clock)
        self._occupancy = EngineOccupancy(self.config.engine_slots or self.config.capacity,
                                          clock)
        self._idle = IdleNotice(client, url, clock, self.config.idle_notice_s,
                                self.config.log_interval_s)
        self._policy_ready = asyncio.Event()
        self._policy_ready.set()
        self._stopping = self._abort_on_stop = self._leasing_done = False
        self._fatal: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()
        self._warned: set[str] = set()

    # --- public ----------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """The policy version loaded in the backend."""
        return self._loaded_version

    def held_ids(self) -> set[str]:
        """Rollouts leased and not yet generated (queued or running)."""
        return set(self._held)

    def outbox_ids(self) -> set[str]:
        """Rollouts generated and not yet reported."""
        return set(self._outbox)

    def stop(self, abort: bool | None = None) -> None:
        """Stop leasing; finish (default ``config.on_stop``) or abort what is held, then return.

        Safe to call more than once and from a signal handler on the event loop's thread.
        """
        abort = self.config.on_stop == "abort" if abort is None else abort
        if not self._stopping:
            log.info("stopping: %d rollouts held, %d results to report (%s)", len(self._held),
                     len(self._outbox), "abort" if abort else "finish")
        self._stopping = True
        self._pulse.stopped.set()
        if abort and not self._abort_on_stop:
            self._abort_on_stop = True
            self._spawn(self._abort_running())
        self._pulse.notify()

    async def wait_for(self, predicate: Predicate, timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` holds, re-checked at every change of the loop's state."""
        clock = self._pulse.clock
        deadline = None if timeout is None else clock() + timeout
        while not predicate():
            if deadline is not None and clock() >= deadline:
                return False
            await self._pulse.wait(None if deadline is None else deadline - clock())
        return True

    async def run_until(self, predicate: Predicate, abort: bool | None = None) -> WorkerCounters:
        """:meth:`run` until ``predicate()`` holds (checked at every state change), then stop."""

        async def watch() -> None:
            await self.wait_for(predicate)
            self.stop(abort)

        watcher = asyncio.ensure_future(watch())
        try:
            return await self.run()
        finally:
            watcher.cancel()

    async def run(self) -> WorkerCounters:
        """Work until stopped (or ``max_rollouts`` are done); returns the counters.

        Cancelling the task running this is a kill: nothing more is reported.
        """
        reporter = self._spawn(self._reporter.run(self._finished, lambda: not self._held))
        helpers = [self._spawn(self.leases.run()), self._spawn(self._log_loop())]
        try:
            await self._lease_loop()
            await self._drain(reporter)
            await self._deregister()
        finally:
            await self._close([reporter, *helpers, *self._tasks,
                               *(h.task for h in self._held.values())])
            log.info("worker %s done: %s", self.config.worker_id, self.counters.line())
        if self._fatal is not None:
            raise self._fatal
        return self.counters

    # --- plumbing --------------------------------------------------------------------------------

    async def _close(self, tasks: list[asyncio.Task]) -> None:
        self._pulse.closed = True
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a task whose cancellation was swallowed ends at its next check
            await asyncio.wait(tasks, timeout=5.0)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())

    def _fail(self, exc: BaseException) -> None:
        if self._fatal is None:
            log.error("worker failing: %s", exc, exc_info=exc)
            self._fatal = exc
        self._policy_ready.set()
        self.stop(abort=True)

    def _finished(self) -> bool:
        """Nothing more will be leased, generated or reported."""
        return self._leasing_done and not self._held and not self._outbox

    # --- leasing ---------------------------------------------------------------------------------

    def _free_slots(self) -> int:
        cfg = self.config
        if len(self._outbox) >= 2 * max(cfg.capacity, cfg.report_batch):
            return 0  # results are not getting through: do not take more work
        free = min(cfg.capacity - len(self._held), MAX_ROLLOUTS_PER_LEASE)
        left = None if cfg.max_rollouts is None else cfg.max_rollouts - self._leased_total
        if left is not None:
            free = min(free, left)
        # Each lease costs both processes a round trip whatever its size: while work is still
        # queued, wait until a lease's worth of slots is free (unless that is all that is left).
        if self._held and free < min(cfg.lease_min, cfg.capacity) and free != left:
            return 0
        return free

    async def _lease_loop(self) -> None:
        backoff = Backoff(self.config.backoff_initial_s, self.config.backoff_max_s)
        limit = self.config.max_rollouts
        while not self._stopping and (limit is None or self._leased_total < limit):
            want = self._free_slots()
            if want <= 0:
                await self._pulse.wait()
                continue
            try:
                lease = await self.client.lease(self.config.worker_id, want,
                                                min(self.config.lease_wait_s, MAX_WAIT_S),
                                                self.config.backend_name or self.backend.name,
                                                policy_version=self._loaded_version,
                                                engine=self._occupancy.take())
            except StaleWeightsError as exc:
                await self._reload_for(exc)
                continue
            except SaraError as exc:
                await self._transient("lease", exc, backoff)
                continue
            backoff.reset()
            self._reach.reached()
            await self._accept(lease)
            if not self._stopping:
                await self._idle.note(bool(lease.rollouts or self._held or self._outbox))
            if not lease.rollouts:
                await self._pulse.pause(self.config.idle_poll_s)

    async def _reload_for(self, exc: StaleWeightsError) -> None:
        """409 stale_weights: load the version it names, then (the caller) lease again."""
        self.counters.stale_refusals += 1
        log.warning("lease refused, weights too old: %s", exc.message)
        wanted = PolicyInfo(version=exc.current_version, checkpoint=exc.checkpoint)
        if wanted == self._refused:
            raise WorkerError(f"the scheduler needs policy v{wanted.version}, refused: "
                              f"{checkpoint_refusal(wanted.checkpoint, self.config.checkpoint_root)}")
        self._note_policy(wanted)
        await self.wait_for(lambda: self._policy_ready.is_set() or self._stopping)

    async def _transient(self, what: str, exc: SaraError, backoff: Backoff) -> None:
        """Back off after a failed call; raise WorkerError when retrying cannot help."""
        if is_fatal(exc):
            raise WorkerError(f"{what} rejected by the scheduler: {exc}") from exc
        left = self._reach.left_s(exc)
        if left == 0:
            raise WorkerError(self._reach.giving_up(exc)) from exc
        self.counters.transient_errors += 1
        delay = backoff.next() if left is None else min(backoff.next(), left)
        until = "" if left is None else f", giving up in {left:.0f}s"
        log.warning("%s failed (%s); retrying in %.2fs%s", what, exc, delay, until)
        self._pulse.notify()
        await self._pulse.pause(delay)

    async def _accept(self, lease: LeaseResponse) -> None:
        await self._apply_cancels(lease.cancel)
        self._note_policy(lease.policy)
        if lease.rollouts:
            self.counters.leases += 1
            self.counters.leased += len(lease.rollouts)
            self._leased_total += len(lease.rollouts)
        for rollout in lease.rollouts:
            self.leases.track(lease.lease_id or "", rollout.rollout_id)
            if rollout.rollout_id in self._held or rollout.rollout_id in self._outbox:
                continue  # issued again after our own lease expired: the work is under way
            held = _Held(rollout)
            self._held[rollout.rollout_id] = held
            held.task = asyncio.ensure_future(self._process(held))
            held.task.add_done_callback(_log_crash)
        self._pulse.notify()

    async def _apply_cancels(self, rollout_ids: list[str]) -> None:
        for rid in rollout_ids:
            held = self._held.get(rid)
            if held is None or held.cancelled:
                continue  # finished already: its result stands
            held.cancelled = True
            self.counters.cancelled += 1
            if held.running:
                await self._abort(rid)

    async def _give_up(self, rollout_ids: set[str]) -> None:
        """Rollouts whose lease is gone: stop generating them; they are not reported."""
        for rid in rollout_ids:
            held = self._held.get(rid)
            if held is not None and not held.cancelled and not held.lost:
                held.lost = True
                if held.running:
                    await self._abort(rid)
        self._pulse.notify()

    async def _abort(self, rollout_id: str) -> None:
        try:
            await self.backend.abort(rollout_id)
        except Exception:
            log.exception("backend.abort(%s) failed", rollout_id)

    async def _abort_running(self) -> None:
        for rid, held in list(self._held.items()):
            if held.running:
                await self._abort(rid)

    # --- policy ----------------------------------------------------------------------------------

    def _note_policy(self, policy: PolicyInfo) -> None:
        if policy == self._target or policy == self._refused:
            return
        self._target = policy
        if policy.version != self._loaded_version and self._policy_ready.is_set():
            log.info("policy moved to v%d (%s)", policy.version, policy.checkpoint)
            self._policy_ready.clear()
            self._spawn(self._switch_policy())

    async def _switch_policy(self) -> None:
        """Let running generations finish, then load the target policy; retry a few times."""
        failures = 0
        backoff = Backoff(self.config.backoff_initial_s, self.config.backoff_max_s)
        while self._target.version != self._loaded_version:
            while self._running:
                await self._pulse.wait()
            target = self._target
            refusal = checkpoint_refusal(target.checkpoint, self.config.checkpoint_root)
            if refusal:   # keep the weights loaded; the scheduler decides whether they still do
                log.error("refusing policy v%d: %s; generating with v%d", target.version,
                          refusal, self._loaded_version)
                self._refused, self._target = target, self._loaded
                break
            try:
                await self.backend.load_policy(target.version, target.checkpoint)
            except Exception as exc:
                failures += 1
                if failures >= self.config.policy_load_attempts:
                    raise WorkerError(f"cannot load policy v{target.version}: {exc}") from exc
                log.warning("load_policy(v%d) failed: %s; retrying", target.version, exc)
                await self._pulse.pause(backoff.next())
                continue
            self._loaded_version, self._loaded = target.version, target
            self.counters.policy_loads += 1
        self._policy_ready.set()
        self._pulse.notify()

    # --- one rollout -----------------------------------------------------------------------------

    async def _process(self, held: _Held) -> None:
        rid, result = held.rollout.rollout_id, None
        try:
            while not self._policy_ready.is_set():
                await self._policy_ready.wait()
            gen, version = await self._generate(held)
            result = await self._result(held, gen, version)
        finally:
            self._held.pop(rid, None)
            if result is not None:
                self._reporter.add(result)
            else:
                self.leases.untrack(rid)
            self._pulse.notify()

    async def _generate(self, held: _Held) -> tuple[Generation, int]:
        version = self._loaded_version
        if held.cancelled or held.lost or self._abort_on_stop:
            return Generation("", 0, "abort"), version
        held.running = True
        self._running += 1
        self._occupancy.generating(self._running)
        try:
            return await self.backend.generate(held.rollout, version), version
        except Exception as exc:
            self.counters.errors += 1
            log.warning("generate(%s) failed: %r", held.rollout.rollout_id, exc)
            return Generation(f"<error: {type(exc).__name__}: {exc}>"[:1000], 0, "error"), version
        finally:
            held.running = False
            held.end_version = self._loaded_version  # before a reload can start
            self._running -= 1
            self._occupancy.generating(self._running)
            self._pulse.notify()

    async def _result(self, held: _Held, gen: Generation, version: int) -> RolloutResult | None:
        """The result to report; None for a rollout we aborted ourselves (it is not a result)."""
        self.counters.tokens += max(int(gen.completion_tokens), 0)
        if gen.finish_reason == "abort":
            self.counters.aborted += 1
            if not held.cancelled:
                self.counters.released += 1
                return None
            return make_result(held.rollout.rollout_id, gen, 0.0, version, held.end_version)
        self.counters.generated += 1
        reward = await self._verify(held.rollout, gen)
        return make_result(held.rollout.rollout_id, gen, reward, version, held.end_version)

    async def _verify(self, rollout: Rollout, gen: Generation) -> float:
        try:
            verifiers.get(rollout.task)
        except Exception as exc:  # unknown name, or a plug-in that fails to load
            if rollout.task not in self._warned:
                self._warned.add(rollout.task)
                log.error("no verifier for task %r (%s): its rollouts score 0", rollout.task, exc)
            return 0.0
        args = (rollout.task, gen.completion, rollout.answer, rollout.meta)
        if verifiers.is_blocking(rollout.task):
            return await asyncio.to_thread(verifiers.score, *args)
        return verifiers.score(*args)

    # --- logs, shutdown --------------------------------------------------------------------------

    async def _log_loop(self) -> None:
        while not self._pulse.closed:
            await self._pulse.sleep(self.config.log_interval_s)
            log.info("worker %s v%d held=%d outbox=%d %s", self.config.worker_id,
                     self.policy_version, len(self._held), len(self._outbox), self.counters.line())

    async def _drain(self, reporter: asyncio.Task) -> None:
        """After leasing stops: let held rollouts finish, abort leftovers, report everything."""
        self._stopping = self._leasing_done = True
        budget = self.config.drain_timeout_s
        if not await self.wait_for(lambda: not self._held, budget):
            log.warning("drain timeout: aborting %d rollouts", len(self._held))
            self.stop(abort=True)
            await self.wait_for(lambda: not self._held, budget)
        self._pulse.notify()
        if not reporter.done():  # the results deserve a moment even when generation took long
            await self._pulse.race(asyncio.shield(reporter), max(budget, 10.0))
        if self._outbox:
            log.error("gave up reporting %d results (scheduler unreachable)", len(self._outbox))
            self.counters.dropped += len(self._outbox)

    async def _deregister(self) -> None:
        """A worker that stops on request leaves the run, so /stats shows it stopped at once
        instead of live (a failure only costs that: it shows as stale later)."""
        try:
            await self.client.deregister(self.config.worker_id)
        except SaraError as exc:
            log.warning("could not deregister from the scheduler: %s", exc)

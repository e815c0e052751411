"""Wake-ups for long polls: a waiting /leases or /batches/next sleeps until Redis says something
changed, instead of re-running its script on a timer.

The scripts that make work available append to the run's wake stream (`Keys.wake`) in the same
atomic step: 'lease' when rollouts become leasable or flow control gains room (results issued
probes or abandoned groups, leases expired, a batch took groups off the ready list, prompts were
added, the run resumed), 'batch' when groups became ready (or a drain began). One listener task
per process reads the stream with a blocking XREAD on a connection of its own, so it never holds
one the requests need, and wakes every local waiter of that kind: a script run by any replica
wakes the polls of all of them. Reading the stream is the store's (store/wake_stream.py); here
is what a process does with what it reads.

No notification is lost between a poll's check and its wait: the poll takes its `Ticket` before
it runs its script, and the ticket fires for every entry added after that point. Should the
listener miss entries anyway (Redis restarted, the connection dropped), each wait still ends
after `fallback_s` and the poll checks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from ..store.wake_stream import WakeStream

log = logging.getLogger("sara.service")
KINDS = ("lease", "batch")


@dataclass
class WakeStats:
    """How waits ended, per kind: by a notification, by the fallback timer, or by shutdown."""

    woken: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    fallback: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    stopped: int = 0


class Ticket:
    """One poll's claim on the next notification of its kind; a batch poll's only on one that
    says at least `need` groups are ready (or any size may go: a draining run, say)."""

    def __init__(self, kind: str, need: int) -> None:
        self.kind, self.need = kind, need
        self.event = asyncio.Event()


class Wakeups:
    """Local waiters of one namespace, woken by its wake stream."""

    def __init__(self, stream: WakeStream) -> None:
        self.stream = stream
        self.stats = WakeStats()
        self._tickets: dict[str, set[Ticket]] = {kind: set() for kind in KINDS}
        self._listener: asyncio.Task | None = None
        self._started: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting = 0
        self._waiting_changed = asyncio.Event()
        self.stopping = False

    async def ticket(self, kind: str, need: int = 1) -> Ticket:
        """Take before checking the store: the ticket fires for any notification after now
        (for 'batch', one with `need` groups ready or more). Waiting ends it."""
        await self._ensure_listening()
        ticket = Ticket(kind, need)
        self._tickets[kind].add(ticket)
        return ticket

    async def wait(self, ticket: Ticket, kind: str, timeout_s: float) -> str:
        """Until the ticket fires, `timeout_s` passes or shutdown begins: 'woken' | 'fallback' |
        'stopped'."""
        if self.stopping:
            self.stats.stopped += 1
            return "stopped"
        self._set_waiting(+1)
        try:
            await asyncio.wait_for(ticket.event.wait(), timeout_s)
            how = "stopped" if self.stopping else "woken"
        except asyncio.TimeoutError:
            how = "stopped" if self.stopping else "fallback"
        finally:
            self._set_waiting(-1)
            self._tickets[kind].discard(ticket)
        if how == "stopped":
            self.stats.stopped += 1
        else:
            getattr(self.stats, how)[kind] += 1
        return how

    def release(self, ticket: Ticket | None) -> None:
        """Give back a ticket that will not be waited on (the poll found what it wanted)."""
        if ticket is not None:
            self._tickets[ticket.kind].discard(ticket)

    @property
    def read_block_s(self) -> float:
        """How long one blocking read of the stream waits (shorter on a cluster client)."""
        return self.stream.block_s

    @property
    def tickets(self) -> int:
        """Tickets taken and not yet fired, waited on or given back."""
        return sum(len(held) for held in self._tickets.values())

    @property
    def waiting(self) -> int:
        """Polls waiting now (tests wait for this rather than for time to pass)."""
        return self._waiting

    async def until_waiting(self, n: int) -> None:
        """Return once at least `n` polls wait."""
        while self._waiting < n:
            self._waiting_changed.clear()
            await self._waiting_changed.wait()

    def _set_waiting(self, delta: int) -> None:
        self._waiting += delta
        self._waiting_changed.set()

    def fire(self, kind: str, ready: int = -1) -> None:
        """Wake the local waiters of `kind` (the listener calls this per notification); for
        'batch', those that need at most `ready` groups (-1: all of them)."""
        for ticket in list(self._tickets[kind]):
            if kind != "batch" or ready < 0 or ticket.need <= ready:
                ticket.event.set()
                self._tickets[kind].discard(ticket)

    def stop(self) -> None:
        """Wake every waiter now, for good: the process is stopping. Safe from a signal handler
        (it only schedules the work on the loop)."""
        self.stopping = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._stop_in_loop)

    def _stop_in_loop(self) -> None:
        for kind in KINDS:
            self.fire(kind)
        if self._listener is not None:
            self._listener.cancel()

    async def aclose(self) -> None:
        """Stop the listener and close its connection."""
        self.stopping = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener
        await self.stream.aclose()

    async def _ensure_listening(self) -> None:
        if self._started is None:
            self._loop = asyncio.get_running_loop()
            self._started = self._loop.create_future()
            self._listener = asyncio.create_task(self._listen(self._started))
        if not self._started.done():
            # the listener's starting point is set before any poll checks the store
            await asyncio.shield(self._started)

    async def _listen(self, started: asyncio.Future) -> None:
        last: str | None = None
        while not self.stopping:
            try:
                if last is None:
                    last = await self.stream.newest_id()
                    if not started.done():
                        started.set_result(None)
                    for kind in KINDS:  # entries may have been missed while it was away
                        self.fire(kind)
                found = await self.stream.read(last)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - polls fall back to their timer meanwhile
                log.debug("wake listener: %s; retrying", exc)
                if not started.done():
                    started.set_result(None)  # the polls check anyway, then wait on the timer
                last = None
                await asyncio.sleep(1.0)
                continue
            last = found.last_id
            if found.lease:
                self.fire("lease")
            if found.ready is not None:
                self.fire("batch", found.ready)

"""The run's wake stream (`Keys.wake`) as the long polls read it.

The scripts that make work available append to the stream in the same atomic step: an entry
`w=lease` when rollouts became leasable or flow control gained room, `w=batch` (with `n`, the
groups ready then) when groups became ready. One reader per process follows it with a blocking
XREAD; `core/wake.py` turns what it reads into wake-ups of the local polls.

The blocking read runs on a connection of its own, so it never holds one the requests need. A
Cluster client has no single pool to copy, so there it shares the client's connections, which
keep the service's socket timeout (5 s): its read must end well before that, or every idle round
would time out and leave the polls on their fallback timer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from .codec import text

MAXLEN = 64  # entries kept (approximately): the reader only ever needs the newest
CLUSTER_BLOCK_S = 2.0


@dataclass(frozen=True)
class Notices:
    """What one read found: the newest entry's id, whether leases may find work, and the most
    groups a batch notice said were ready (-1: any number; None: no batch notice)."""

    last_id: str
    lease: bool
    ready: int | None


def _dedicated_client(client: Any, block_s: float) -> Any:
    """A client on its own one-connection pool; the client itself where it has no plain pool (a
    cluster client routes the stream's key to its node)."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return client
    kwargs = dict(pool.connection_kwargs)
    timeout = kwargs.get("socket_timeout")
    if timeout is not None:  # the read blocks up to block_s: the socket must wait longer
        kwargs["socket_timeout"] = max(timeout, block_s + 5.0)
    own = type(pool)(connection_class=pool.connection_class, max_connections=1, **kwargs)
    return type(client)(connection_pool=own)


def _field(fields: dict, name: str, default: str) -> str:
    """A stream entry's field, whether the client decodes replies or not."""
    return text(fields.get(name.encode(), fields.get(name, default)))


def notices(entries: list[tuple[Any, dict]], last_id: str) -> Notices:
    """What a run of stream entries says, folded: any lease entry wakes leases; batch entries
    wake the polls needing at most the most groups any of them saw ready."""
    lease, ready = False, None
    for entry_id, fields in entries:
        last_id = text(entry_id)
        kind = _field(fields, "w", "")
        if kind == "lease":
            lease = True
        elif kind == "batch":  # 'n': groups ready then; absent or -1: any size
            n = int(_field(fields, "n", "-1"))
            ready = -1 if n < 0 or (ready is not None and ready < 0) else max(ready or 0, n)
    return Notices(last_id, lease, ready)


class WakeStream:
    """A blocking reader of one wake stream, on a connection of its own."""

    def __init__(self, client: Any, stream: str, block_s: float = 5.0) -> None:
        self.stream = stream
        self._client = client
        self._reader = _dedicated_client(client, block_s)
        shared = self._reader is client
        self.block_s = min(block_s, CLUSTER_BLOCK_S) if shared else block_s

    async def newest_id(self) -> str:
        """The id of the newest entry ('0-0' for an empty stream): where reading starts."""
        newest = await self._reader.xrevrange(self.stream, count=1)
        return text(newest[0][0]) if newest else "0-0"

    async def read(self, after: str) -> Notices:
        """Entries after `after`, waiting up to `block_s` for one (then nothing new: the same
        id, no notice)."""
        reply = await self._reader.xread({self.stream: after}, count=MAXLEN,
                                         block=int(self.block_s * 1000))
        entries = [entry for _, part in reply or [] for entry in part]
        return notices(entries, after)

    async def aclose(self) -> None:
        """Close the reader's own connection (not the shared client's)."""
        if self._reader is not self._client:
            with contextlib.suppress(Exception):
                await self._reader.aclose()

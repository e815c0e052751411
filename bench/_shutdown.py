"""A workaround the benchmarks share for a shutdown hang of the in-process service."""

from __future__ import annotations

import asyncio
from typing import Callable


async def unstick_shutdown(on_recancel: Callable[[], None] = lambda: None,
                           every_s: float = 2.0) -> None:
    """Work around a shutdown hang in the service (reported, not fixed here): the app's
    lifespan stops its maintenance task with one `cancel()` and then waits for it, but on
    Python 3.11 a cancel that lands inside a redis-py command can be swallowed
    (`asyncio.wait_for` inside redis-py returns the command's result instead of raising), and
    the loop then runs forever. While the app shuts down, cancel that task again now and then
    (`on_recancel` counts each time)."""
    while True:
        await asyncio.sleep(every_s)
        for task in asyncio.all_tasks():
            if task.get_coro().__name__ == "_maintenance_loop" and not task.done():
                task.cancel()
                on_recancel()

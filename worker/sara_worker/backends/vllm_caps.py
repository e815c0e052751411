"""Which weight-update path a vLLM engine supports, checked once at start and logged.

The in-place path needs, on the engine, ``collective_rpc`` (to run the reload on every vLLM
worker), and on the vLLM worker a ``reload_weights`` that takes ``weights_path`` (vLLM 0.11's took
none: it re-read the original model, so on that release every policy version would silently
rebuild the engine). ``pause_generation``/``resume_generation`` fence the reload from running
requests where the engine has them; ``sleep``/``wake_up`` are reported because a shared GPU can
use them (``enable_sleep_mode``) and they appear in the same releases.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("sara.worker.vllm")

ENGINE_CALLS = ("collective_rpc", "pause_generation", "resume_generation", "reset_prefix_cache",
                "sleep", "wake_up")


@dataclass(frozen=True)
class WeightUpdatePlan:
    """What the engine offers and which path ``load_policy`` takes."""

    path: str                    # "reload" (in place) or "rebuild" (restart the engine)
    reason: str
    engine_calls: tuple[str, ...]
    worker_reload: bool | None   # vLLM worker's reload_weights(weights_path=...); None: unknown

    @property
    def can_sleep(self) -> bool:
        """The engine has ``sleep`` and ``wake_up`` (they work only with enable_sleep_mode)."""
        return {"sleep", "wake_up"} <= set(self.engine_calls)

    def line(self) -> str:
        """One log line."""
        calls = ", ".join(self.engine_calls) or "none"
        return (f"weight updates: {self.path} ({self.reason}); engine has: {calls}; worker "
                f"reload_weights(weights_path): {_word(self.worker_reload)}")


def _word(value: bool | None) -> str:
    return "unknown" if value is None else "yes" if value else "no"


def worker_reload_supported() -> bool | None:
    """Whether vLLM's GPU worker class (the CPU one derives from it) has ``reload_weights`` with
    a ``weights_path`` parameter; None when the class cannot be imported."""
    try:
        from vllm.v1.worker.gpu_worker import Worker
    except Exception:  # a vLLM without that module, or one that fails to import here
        return None
    method = getattr(Worker, "reload_weights", None)
    if method is None:
        return False
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return None
    if "weights_path" in params:
        return True
    # vLLM 0.32's reload_weights(*args, **kwargs) forwards to the model runner: its signature
    # cannot say, so try in place (a failed reload still falls back to a rebuild under auto)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return False


def plan_weight_updates(engine: Any, requested: str, worker_reload: bool | None
                        ) -> WeightUpdatePlan:
    """The path for `requested` (auto, reload, rebuild) on `engine`. Under ``auto`` an engine
    that cannot reload in place rebuilds straight away instead of failing a reload first."""
    calls = tuple(name for name in ENGINE_CALLS if callable(getattr(engine, name, None)))
    if requested == "rebuild":
        return WeightUpdatePlan("rebuild", "weight_update=rebuild", calls, worker_reload)
    missing = [] if "collective_rpc" in calls else ["engine.collective_rpc"]
    if worker_reload is False:
        missing.append("worker reload_weights(weights_path=...)")
    if missing and requested == "auto":
        return WeightUpdatePlan("rebuild", "no " + " and no ".join(missing), calls,
                                worker_reload)
    fence = "paused" if "pause_generation" in calls else "unpaused: no pause_generation"
    reason = f"in place, {fence}"
    if missing:   # requested == "reload": try anyway, the caller asked for it
        reason += "; missing " + ", ".join(missing)
    return WeightUpdatePlan("reload", reason, calls, worker_reload)


async def reload_asleep(engine: Any, load: Callable[[], Awaitable[Any]]) -> None:
    """vLLM's documented weight-update sequence in sleep mode: ``sleep(level=2)`` drops the
    weights and the KV cache, ``wake_up(tags=["weights"])`` gives the weights their memory back
    (contents undefined), `load` fills them, ``wake_up(tags=["kv_cache"])`` restores the cache.
    The old weights are never offloaded to CPU memory, and the reload runs with the KV cache's
    memory free. Generation must already be paused (nothing in flight: level 2 would lose it)."""
    await engine.sleep(level=2)
    try:
        await engine.wake_up(tags=["weights"])
        await load()
    finally:
        await engine.wake_up(tags=["kv_cache"])

"""The rollout worker: lease rollouts from the scheduler, generate them with a backend, verify
and report them.

The public API is `__all__`, loaded on first use (``import sara_worker`` stays cheap):
``main``/``run`` run a worker process (:mod:`sara_worker.process`), ``WorkerLoop`` and
``WorkerConfig`` run one inside a program, ``create_backend`` builds a backend by name, and
``WorkerCounters`` is what a run returns."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"main": "process", "run": "process", "backend_options": "process", "WorkerLoop": "loop",
          "WorkerConfig": "support", "WorkerCounters": "support", "default_worker_id": "support",
          "create_backend": "backends"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'sara_worker' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)

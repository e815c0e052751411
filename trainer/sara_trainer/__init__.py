"""The trainer: pull effective batches from the scheduler, update the policy, checkpoint and
publish each new version to the workers.

The public API is `__all__`, loaded on first use (``import sara_trainer`` does not import
torch): ``train`` runs ``sara train``'s loop against a scheduler URL, ``Trainer`` does the same
on a client you hold, ``TrainerConfig`` is their configuration and ``StepReport`` what each step
returns."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"train": "loop", "Trainer": "loop", "StepReport": "loop", "TrainerConfig": "config"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'sara_trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)

"""Synthetic verifiable tasks the demo can generate, score and evaluate without a service.

A task module has ``TASK`` (its verifier name), ``reward(completion, prompt) -> float`` and
``make_split(n, seed, buckets=None, split="train") -> list[PromptIn-shaped dict]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

TASKS: dict[str, str] = {"arith": "sara_demo.tasks.arith"}


def get_task(name: str) -> ModuleType:
    """The task module called `name`; ValueError naming the choices when unknown."""
    try:
        return importlib.import_module(TASKS[name])
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(sorted(TASKS))}") \
            from None


def score(prompt: Mapping[str, Any], completion: str) -> float:
    """Reward of `completion` for a PromptIn-shaped `prompt` dict, by its ``task``: the worker's
    verifier of that name when the prompt carries its answer, else the task's own reward (which
    works the answer out from the prompt and asks the same verifier)."""
    from sara_worker.verifiers import score as verify

    task = str(prompt.get("task", "arith"))
    if prompt.get("answer") is None:
        return get_task(task).reward(completion, prompt)
    return verify(task, completion, prompt.get("answer"), prompt.get("meta"))


__all__ = ["TASKS", "get_task", "score"]

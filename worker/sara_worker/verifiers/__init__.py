"""Reward functions, looked up by a rollout's ``task`` name.

Every verifier is ``(completion: str, answer: str | None, meta: dict) -> float``. Built in:
``exact``, ``arith``, ``countdown``, ``countdown_close`` (partial credit for closeness), ``math``
(math-verify) and ``sim`` (:mod:`sara_worker.sim.verifier`); each module is imported the first time its name is asked for.
``format:<name>`` is verifier ``<name>`` with a bonus for a well-formed answer (`verifiers.format`). More come from ``@register("name")`` or from installed
packages through the ``sara.verifiers`` entry-point group (name -> verifier function), loaded
lazily as well.

:func:`score` is what a worker calls: it never raises, and a malformed completion, a verifier
error or a non-finite reward all score 0.0. Verifiers registered with ``blocking=True`` (math)
can be slow; the worker loop runs them in a thread.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points
from math import isfinite as _isfinite  # not `import math`: the `math` submodule shadows it
from typing import Any, Callable

Verifier = Callable[[str, "str | None", dict], float]

__all__ = ["Verifier", "UnknownVerifier", "register", "get", "available", "is_blocking", "score"]

ENTRY_POINT_GROUP = "sara.verifiers"
# name -> the module that registers it
BUILTIN = {"exact": f"{__name__}.exact", "arith": f"{__name__}.arith",
           "countdown": f"{__name__}.countdown", "countdown_close": f"{__name__}.countdown",
           "math": f"{__name__}.math", "sim": "sara_worker.sim.verifier"}
FORMAT_PREFIX = "format:"  # verifiers.format.PREFIX, known here without importing it
log = logging.getLogger("sara.worker.verifiers")

_registry: dict[str, Verifier] = {}
_blocking: set[str] = set()


class UnknownVerifier(KeyError):
    """No verifier of that name is registered, built in or installed."""

    def __str__(self) -> str:
        return f"unknown verifier {self.args[0]!r}; known: {', '.join(available())}"


def register(name: str, *, blocking: bool = False) -> Callable[[Verifier], Verifier]:
    """Decorator registering a verifier under ``name`` (replacing any earlier one)."""

    def decorate(fn: Verifier) -> Verifier:
        _registry[name] = fn
        (_blocking.add if blocking else _blocking.discard)(name)
        return fn

    return decorate


def _load(name: str) -> Verifier | None:
    if name.startswith(FORMAT_PREFIX) and len(name) > len(FORMAT_PREFIX):
        return _load_formatted(name, name[len(FORMAT_PREFIX):])
    if name in BUILTIN:
        importlib.import_module(BUILTIN[name])
        return _registry.get(name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            fn = ep.load()
            _registry[name] = fn
            return fn
    return None


def _load_formatted(name: str, inner_name: str) -> Verifier | None:
    """``format:<inner>``: the inner verifier wrapped once, slow when the inner one is."""
    from .format import wrap

    inner = _registry.get(inner_name) or _load(inner_name)
    if inner is None:
        return None
    fn = _registry[name] = wrap(inner)
    if inner_name in _blocking:
        _blocking.add(name)
    return fn


def get(name: str) -> Verifier:
    """The verifier called ``name``; :class:`UnknownVerifier` if there is none."""
    fn = _registry.get(name) or _load(name)
    if fn is None:
        raise UnknownVerifier(name)
    return fn


def available() -> list[str]:
    """Every name :func:`get` can resolve (registered, built in, installed)."""
    names = set(_registry) | set(BUILTIN)
    names |= {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def is_blocking(name: str) -> bool:
    """Whether the verifier may be slow enough to need a thread (after it has been loaded)."""
    return name in _blocking


def score(name: str, completion: str, answer: str | None, meta: dict[str, Any] | None) -> float:
    """The reward from verifier ``name``; 0.0 on any failure (unknown names included)."""
    try:
        reward = float(get(name)(completion if isinstance(completion, str) else "", answer,
                                 meta if isinstance(meta, dict) else {}))
    except Exception as exc:  # a broken completion or verifier must never stop a worker
        log.debug("verifier %s failed: %r", name, exc)
        return 0.0
    return reward if _isfinite(reward) else 0.0

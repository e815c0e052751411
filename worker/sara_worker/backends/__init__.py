"""Worker backends, looked up by name and imported only when asked for.

``create_backend("sim", seed=0)`` imports ``sara_worker.sim.backend`` and builds its backend, so
choosing ``sim`` never imports torch or vllm. Built in: ``sim``, ``hf`` (transformers),
``openai`` (an OpenAI-compatible completions server), ``vllm`` (in-process engine). Other
packages add backends through the ``sara.backends`` entry-point group (name -> class or factory).
The interface is :class:`sara_worker.backends.base.Backend`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Callable

from .base import Backend, BaseBackend, Generation

__all__ = ["Backend", "BaseBackend", "Generation", "BUILTIN", "available", "backend_factory",
           "create_backend"]

# name -> "module:attribute"; the attribute is a class (or factory) taking keyword options.
BUILTIN: dict[str, str] = {
    "sim": "sara_worker.sim.backend:SimBackend",
    "hf": "sara_worker.backends.hf:HFBackend",
    "openai": "sara_worker.backends.openai:OpenAIBackend",
    "vllm": "sara_worker.backends.vllm:VLLMBackend",
}
ENTRY_POINT_GROUP = "sara.backends"


def available() -> list[str]:
    """Built-in backend names and those installed as plug-ins."""
    return sorted(set(BUILTIN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def backend_factory(name: str) -> Callable[..., Backend]:
    """The class (or factory) of backend ``name``; ValueError naming the choices if unknown."""
    target = BUILTIN.get(name)
    if target is not None:
        module_name, _, attr = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                raise ValueError(f"backend {name!r} is not built yet") from exc
            raise ValueError(f"backend {name!r} needs the {exc.name!r} package, which is not "
                             "installed (see the vllm and trainer extras)") from exc
        return getattr(module, attr)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(available())}")


def create_backend(name: str, **options: Any) -> Backend:
    """Build backend ``name`` with keyword ``options`` (each backend documents its own)."""
    return backend_factory(name)(**options)

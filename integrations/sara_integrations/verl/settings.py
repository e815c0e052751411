"""SARA's settings inside a verl config: the keys of ``trainer.v1.sampler.sampler_kwargs``.

verl hands that mapping to the sampler (:class:`~sara_integrations.verl.SaraReplayBuffer`) as
it is, and the agent-loop manager reads the same mapping from the config it is built with, so
one place configures both. Pure: a mapping in, a frozen dataclass out, or a ``ValueError`` that
names the key to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

MODES = ("colocated", "separate")


@dataclass(frozen=True)
class SaraVerlSettings:
    """What the sampler and the manager need to reach SARA and to run its rollouts.

    - ``url``, ``token``: the scheduler (``sara serve``) and the sampler's token (trainer role);
      ``worker_token``: the colocated manager's (worker role; default: ``token``).
    - ``mode``: ``colocated`` (verl's own rollout servers generate SARA's leased rollouts, through
      :class:`~sara_integrations.verl.SaraAgentLoopManager`) or ``separate`` (``sara worker``
      fleets generate; verl only trains).
    - ``tokenizer``: the policy's tokenizer (path or hub name; the recipe sets it to
      ``${actor_rollout_ref.model.path}``): prompts become token ids the way SARA's workers
      render them, so the trained prompt is the generated one.
    - ``checkpoint_dir``: where verl saves checkpoints (``${trainer.default_local_dir}``); in
      separate mode each step's ``global_step_N/actor/huggingface`` is published for the workers.
    - ``worker_id``, ``max_in_flight``, ``lease_wait_s``, ``heartbeat_s``: the colocated
      manager's identity toward SARA, how many rollouts it keeps generating at once, how long a
      lease call waits for work, and how often it extends its leases.
    - ``data_source``: what verl's reward function is told a prompt is (``openai/gsm8k`` selects
      verl's GSM8K scorer) when the prompt's ``meta`` has no ``data_source`` of its own.
    - ``poll_s``: seconds per long poll while the sampler waits for a batch (it waits as long as
      it takes; ``/stats`` says what it waits for).
    """

    url: str
    token: str | None = None
    worker_token: str | None = None
    mode: str = "colocated"
    tokenizer: str | None = None
    checkpoint_dir: str | None = None
    worker_id: str = "verl"
    max_in_flight: int = 64
    lease_wait_s: float = 2.0
    heartbeat_s: float = 10.0
    data_source: str | None = None
    poll_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("trainer.v1.sampler.sampler_kwargs.url: set it to the SARA "
                             "scheduler's address, e.g. http://localhost:8000")
        if self.mode not in MODES:
            raise ValueError(f"trainer.v1.sampler.sampler_kwargs.mode={self.mode!r}: choose "
                             f"{' or '.join(MODES)}")
        for name in ("max_in_flight", "lease_wait_s", "heartbeat_s", "poll_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"trainer.v1.sampler.sampler_kwargs.{name} must be > 0")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any] | None) -> SaraVerlSettings:
        """The settings from ``sampler_kwargs`` (a dict or an OmegaConf mapping)."""
        given = dict(kwargs or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"trainer.v1.sampler.sampler_kwargs: unknown key(s) "
                             f"{', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "url" not in given:
            raise ValueError("trainer.v1.sampler.sampler_kwargs.url is required: the SARA "
                             "scheduler's address (add +trainer.v1.sampler.sampler_kwargs.url=...)")
        return cls(**given)

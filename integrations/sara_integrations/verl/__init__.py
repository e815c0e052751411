"""SARA in verl 0.9's v1 trainer, by configuration (docs/integration.md, section 6).

- :class:`SaraReplayBuffer` (``sampler.py``): the sampler verl loads through
  ``trainer.v1.sampler.custom_sampler.{path,name}``; each training step gets SARA's next batch of
  effective groups, in TransferQueue's layout.
- :class:`SaraAgentLoopManager` (``manager.py``): the agent-loop manager verl loads through
  ``actor_rollout_ref.rollout.agent.agent_loop_manager_class``; in colocated mode verl's own
  rollout servers generate SARA's leased rollouts (``session.py``).
- The layout glue (``layout.py``): a SARA batch as verl's ``DataProto`` and TransferQueue records,
  leased rollouts as generation input, generated rows as SARA results.

The two classes subclass verl's and load verl when first named; the layout glue imports only
torch and numpy, so ``import sara_integrations.verl`` works without verl.
"""

from __future__ import annotations

from typing import Any

from .layout import (batch_tensors, encoder, lease_tensors, results_from_responses,
                     to_dataproto, uid_for, v1_keys, v1_records)

__all__ = ["SaraReplayBuffer", "SaraAgentLoopManager", "batch_tensors", "encoder",
           "lease_tensors", "results_from_responses", "to_dataproto", "uid_for", "v1_keys",
           "v1_records"]


def __getattr__(name: str) -> Any:
    if name == "SaraReplayBuffer":
        from .sampler import SaraReplayBuffer

        return SaraReplayBuffer
    if name == "SaraAgentLoopManager":
        from .manager import SaraAgentLoopManager

        return SaraAgentLoopManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

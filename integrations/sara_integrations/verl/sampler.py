"""`SaraReplayBuffer`: SARA's effective groups as verl 0.9's v1 replay-buffer sample.

verl's v1 trainer asks its replay buffer for each step's batch (``sample(global_steps,
partition_id, batch_size)``, a ``KVBatchMeta`` of TransferQueue keys). Loaded through
``trainer.v1.sampler.custom_sampler.path=pkg://sara_integrations.verl`` and ``.name=
SaraReplayBuffer``, this one, for the training partition:

1. acknowledges the batch the previous step trained on (the step is over when the next begins);
2. publishes the policy version verl's weights now hold (``global_steps - 1``: verl syncs the
   step's weights to its rollout servers before the next step starts) with, in separate mode,
   the Hugging Face checkpoint verl saved for it, so ``sara worker`` fleets load it;
3. in colocated mode, lets :class:`~sara_integrations.verl.SaraAgentLoopManager` lease and
   generate on verl's servers until SARA has the batch, then has it stop (the servers go to
   sleep for the update);
4. waits for SARA's next batch of ``batch_size`` effective groups: however long good prompts take,
   it waits (never raises for want of them), logging what ``/stats`` shows;
5. writes the batch into TransferQueue in verl's trajectory layout (one key per rollout,
   ``{uid}_{j}_0`` with one ``uid`` per SARA group, so verl's GRPO advantage groups what SARA
   grouped) and returns its keys.

Validation (``partition_id="val"``) is verl's own: the base class samples what verl's agent loop
generated. verl's DAPO filter never runs (a custom sampler gets no ``filter_groups_metric``), and
nothing needs one: every group SARA delivers has non-zero reward spread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import transfer_queue as tq
from sara_client import SaraClient
from sara_client.models import Batch
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from .layout import v1_records
from .rendering import prompt_encoder
from .session import colocated_session
from .settings import SaraVerlSettings

log = logging.getLogger("sara.verl")
# per-token fields of a trajectory: TransferQueue keeps them as jagged tensors, as verl's agent
# loop writes them (a plain stack, which equal lengths would give, lacks the offsets verl reads)
TOKEN_FIELDS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask",
                "position_ids", "rm_scores", "rollout_log_probs")


def records_tensordict(fields: list[dict[str, Any]]) -> Any:
    """``fields`` (one dict per trajectory) as the TensorDict ``tq.kv_batch_put`` stores, with
    every per-token field jagged whatever its lengths."""
    td = list_of_dict_to_tensordict(fields)
    for name in TOKEN_FIELDS:
        if name in fields[0] and not td[name].is_nested:
            td[name] = torch.nested.as_nested_tensor([f[name] for f in fields],
                                                     layout=torch.jagged)
    return td


def hf_checkpoint(checkpoint_dir: str | None, version: int) -> str | None:
    """The Hugging Face weights verl saved for ``global_step_{version}`` (``save_contents``
    with ``hf_model``), or None when it saved none for that step."""
    if not checkpoint_dir:
        return None
    path = Path(checkpoint_dir) / f"global_step_{version}" / "actor" / "huggingface"
    return str(path.resolve()) if (path / "config.json").exists() else None


class SaraReplayBuffer(ReplayBuffer):
    """verl's v1 ``ReplayBuffer``, its training samples SARA's batches (see the module doc).

    Built by verl with the base class's arguments; SARA's own settings come from
    ``sampler_kwargs`` (:class:`~sara_integrations.verl.settings.SaraVerlSettings`). ``client``
    (tests) replaces the HTTP client the settings would build.
    """

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: Any,
                 max_off_policy_strategy: str, sampler_kwargs: Any, poll_interval: float = 2.0,
                 refill_fn: Any = None, client: Any = None, **_: Any) -> None:
        super().__init__(trainer_mode=trainer_mode, trainer_config=trainer_config,
                         max_off_policy_threshold=max_off_policy_threshold,
                         max_off_policy_strategy=max_off_policy_strategy,
                         sampler_kwargs=sampler_kwargs, poll_interval=poll_interval,
                         refill_fn=refill_fn)
        if trainer_mode != "sync":
            raise ValueError(f"SaraReplayBuffer runs under trainer.v1.trainer_mode=sync (got "
                             f"{trainer_mode!r}): SARA itself keeps generation ahead of training")
        self.settings = SaraVerlSettings.from_kwargs(sampler_kwargs)
        if not self.settings.tokenizer:
            raise ValueError("trainer.v1.sampler.sampler_kwargs.tokenizer is required: set it to "
                             "${actor_rollout_ref.model.path}")
        self.sara = client or SaraClient(self.settings.url, token=self.settings.token)
        self.encode, self.pad_token_id = prompt_encoder(self.settings.tokenizer)
        self.unacked: str | None = None

    def sample(self, global_steps: int, partition_id: str, batch_size: int
               ) -> tuple[KVBatchMeta, dict]:
        """The next batch of ``batch_size`` SARA groups in TransferQueue (training), or verl's
        own sample (validation)."""
        if partition_id != "train":
            return super().sample(global_steps, partition_id, batch_size)
        self.ack_previous()
        version = self.publish(global_steps - 1)
        batch = self.next_batch(batch_size, version)
        keys, fields, tags = v1_records(batch, self.encode, self.pad_token_id,
                                        global_steps=global_steps)
        tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=records_tensordict(fields),
                        tags=tags)
        self.unacked = batch.batch_id
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags), batch_metrics(batch)

    def ack_previous(self) -> None:
        """Acknowledge the batch the previous step trained on."""
        if self.unacked is not None:
            self.sara.ack(self.unacked)
            self.unacked = None

    def publish(self, version: int) -> int:
        """Publish ``version`` (verl's weights now) unless SARA already has it; the version in
        force is returned. In separate mode it goes with verl's Hugging Face checkpoint of that
        step, and is not published without one (the workers could not load it)."""
        current = self.sara.get_policy().version
        if version < current:
            log.warning("SARA's policy is at v%d, verl's weights at v%d: SARA refuses results "
                        "more than max_staleness behind; use a fresh SARA namespace for a new run",
                        current, version)
        if version <= current:
            return current
        checkpoint = None
        if self.settings.mode == "separate":
            checkpoint = hf_checkpoint(self.settings.checkpoint_dir, version)
            if checkpoint is None:
                log.warning("no Hugging Face checkpoint of step %d under %s: SARA's workers keep "
                            "v%d (save every step with hf_model in actor.checkpoint."
                            "save_contents)", version, self.settings.checkpoint_dir, current)
                return current
        self.sara.publish_policy(version, checkpoint)
        return version

    def next_batch(self, batch_size: int, version: int) -> Batch:
        """SARA's next batch, however long it takes; in colocated mode verl's servers generate
        meanwhile, and stop once it is there."""
        session = colocated_session() if self.settings.mode == "colocated" else None
        if session is not None:
            session.resume(version)
        try:
            while True:
                batch = self.sara.wait_for_batch(size=batch_size, timeout_s=self.settings.poll_s,
                                                 poll_s=self.settings.poll_s)
                if batch is not None:
                    return batch
                log_waiting(self.sara.stats())
        finally:
            if session is not None:
                session.pause()


def log_waiting(stats: Any) -> None:
    """One line on why no batch is ready yet, from ``/stats``: the run's state, its queues, how
    many decided groups were abandoned (pure), and its warnings."""
    q, abandoned = stats.queues, stats.derived.abandon_rate
    log.info("waiting for SARA's batch (run %s): %d ready groups, %d open, %d rollouts pending, "
             "%d leased; %s of decided groups abandoned so far%s", stats.run_state,
             q.ready_groups, q.open_groups, q.pending, q.leased,
             "none" if abandoned is None else f"{abandoned:.0%}",
             "".join(f"; {w}" for w in stats.warnings))


def batch_metrics(batch: Batch) -> dict[str, float]:
    """What SARA spent on this batch, for verl's step metrics (logged under ``sara/``)."""
    s = batch.stats
    out = {"sara/rollouts_spent": float(s.rollouts_spent),
           "sara/groups_committed": float(s.groups_committed),
           "sara/groups_abandoned": float(s.groups_abandoned),
           "sara/policy_version": float(batch.policy_version)}
    if s.ds_rollouts_per_effective_group is not None:
        out["sara/ds_rollouts_per_effective_group"] = s.ds_rollouts_per_effective_group
    return out

"""Every Redis key name, built in one place.

All keys of a namespace share the hash tag `{ns}`, so every script touches a single cluster slot
and one Redis Cluster can hold many runs. Lua scripts never build key names: they receive them in
KEYS. Data that a script must reach by an id it only discovers while running (a rollout slot, a
prompt's posterior) lives in namespace-wide hashes keyed by that id, not in per-id keys.

Keys built from a client's id are `<kind>:<id>` with a kind no other key starts with, and never
carry a suffix after the id: ids may contain ':', so no id can name another id's key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def rollout_id(group_id: str, slot: int) -> str:
    """A rollout is a slot of a group: `<group_id>:<slot>`."""
    return f"{group_id}:{slot}"


def split_rollout_id(rid: str) -> tuple[str, int] | None:
    """Inverse of `rollout_id`; None when `rid` is not of that shape."""
    group_id, sep, slot = rid.rpartition(":")
    if not sep or not group_id or not slot.isdigit():
        return None
    return group_id, int(slot)


@dataclass(frozen=True)
class Keys:
    """Key names of one namespace."""

    namespace: str

    @property
    def prefix(self) -> str:
        return f"sara:{{{self.namespace}}}:"

    def _k(self, name: str) -> str:
        return self.prefix + name

    # prompts: hash prompt_id -> JSON {prompt, answer, task, meta}
    @property
    def prompts(self) -> str:
        return self._k("prompts")

    # posteriors: hash prompt_id -> JSON {a, b, v, groups, committed, abandoned, rollouts, successes, last}
    @property
    def posteriors(self) -> str:
        return self._k("posteriors")

    # prompts_off: hash prompt_id -> "disabled" | "deleted"; open_groups.lua never opens them
    @property
    def prompts_off(self) -> str:
        return self._k("prompts:off")

    # retired: hash prompt_id -> content of a deleted prompt, kept so groups in flight still
    # lease and batch it (re-adding the id clears it)
    @property
    def prompts_retired(self) -> str:
        return self._k("prompts:retired")

    # run state: string "paused" | "draining"; absent = running
    @property
    def run_state(self) -> str:
        return self._k("run:state")

    # epoch queue: list of prompt ids still to visit this epoch; epoch: counter
    @property
    def epoch_queue(self) -> str:
        return self._k("epoch:queue")

    @property
    def epoch(self) -> str:
        return self._k("epoch:n")

    # slots: hash rollout_id -> "p" (pending) | "l|<lease>|<worker>" | "d" (done) | "c" (cancelled)
    @property
    def slots(self) -> str:
        return self._k("slots")

    # pending: list of rollout ids waiting for a worker (cancelled ones are skipped lazily)
    @property
    def pending(self) -> str:
        return self._k("pending")

    # inflight: zset rollout_id -> lease expiry time
    @property
    def inflight(self) -> str:
        return self._k("inflight")

    # open groups: zset group_id -> p_eff (1 once committed); their sum is the expected yield
    @property
    def open_groups(self) -> str:
        return self._k("groups:open")

    # open yield: string, the open-groups zset's scores summed in units of 1e-9 groups (each
    # score rounded alone), kept by the scripts that change the zset so flow control reads one
    # number instead of scanning every open group
    @property
    def open_yield(self) -> str:
        return self._k("groups:open:yield")

    # wake: stream the scripts append to when rollouts become leasable, room opens for new
    # groups ('lease') or groups become ready ('batch'); long polls of every replica wait on it
    @property
    def wake(self) -> str:
        return self._k("wake")

    # ready: list of "<group_id>|<oldest policy version>" complete and waiting for a batch
    @property
    def ready(self) -> str:
        return self._k("groups:ready")

    # gc: zset group_id -> time after which its data may be deleted
    @property
    def gc(self) -> str:
        return self._k("groups:gc")

    # group_states: hash group_id -> open|committed|ready|delivered|acked|abandoned|dropped
    @property
    def group_states(self) -> str:
        return self._k("groups:state")

    # group_prompt: hash group_id -> prompt_id, so a lease can attach the prompt to a rollout
    @property
    def group_prompt(self) -> str:
        return self._k("groups:prompt")

    def group(self, group_id: str) -> str:
        """Hash of one group's counters, thresholds, p_eff tables and results."""
        return self._k(f"group:{group_id}")

    # cancels: hash worker_id -> space-separated rollout ids to abort, drained on each call
    @property
    def cancels(self) -> str:
        return self._k("cancels")

    def lease(self, lease_id: str) -> str:
        """Hash: worker, expires_at; set of its rollouts lives in `lease_rollouts`."""
        return self._k(f"lease:{lease_id}")

    def lease_rollouts(self, lease_id: str) -> str:
        """Set of a lease's rollout ids. Its own prefix: ids may hold ':', so a suffix on the
        lease's key (`lease:<id>:rollouts`) was the key of the lease `<id>:rollouts`."""
        return self._k(f"lease-rollouts:{lease_id}")

    def report(self, worker_id: str, report_id: str) -> str:
        """String: the stored answer of one worker's result report, kept for a retry. Ids may
        hold ':', so the pair is hashed rather than joined."""
        digest = hashlib.sha256(f"{worker_id}\0{report_id}".encode()).hexdigest()[:32]
        return self._k(f"report:{digest}")

    def batch(self, batch_id: str) -> str:
        """Hash of one batch: groups (JSON list), policy_version, created_at, stats, state."""
        return self._k(f"batch:{batch_id}")

    # unacked: zset batch_id -> redelivery deadline
    @property
    def unacked(self) -> str:
        return self._k("batches:unacked")

    # recent batches: list of JSON summaries, newest first, trimmed
    @property
    def recent_batches(self) -> str:
        return self._k("batches:recent")

    # batch window: hash of counter values when the last batch was formed
    @property
    def batch_window(self) -> str:
        return self._k("batches:window")

    @property
    def stats(self) -> str:
        """Hash of monotone counters (see models.Counters)."""
        return self._k("stats")

    @property
    def abandon_hist(self) -> str:
        """Hash: rollouts done at abandonment -> groups."""
        return self._k("stats:abandon_hist")

    # workers: zset worker_id -> last seen; worker_info: hash worker_id -> JSON
    @property
    def workers(self) -> str:
        return self._k("workers")

    @property
    def worker_info(self) -> str:
        return self._k("workers:info")

    @property
    def policy(self) -> str:
        """Hash: version, checkpoint."""
        return self._k("policy")

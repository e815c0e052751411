"""Every Redis key name, built in one place.

All keys of a namespace share the hash tag `{ns}`, so every script touches a single cluster slot
and one Redis Cluster can hold many runs. Lua scripts never build key names: they receive them in
KEYS. Data that a script must reach by an id it only discovers while running (a rollout slot, a
prompt's posterior) lives in namespace-wide hashes keyed by that id, not in per-id keys.

Keys built from a client's id are `<kind>:<id>` with a kind no other key starts with, and never
carry a suffix after the id: ids may contain ':', so no id can name another id's key.

What each key holds is said beside it; the encodings of the values and the short field names are
defined, with their meaning, in `redis_format`.
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

    # posteriors: hash prompt_id -> JSON {a, b, v, t, groups, last, committed, abandoned,
    # saturated, rollouts, successes, obs} (redis_format.PosteriorField); removed on delete
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

    # run state: string "paused" | "draining"; absent = running (`drained` is derived, not stored)
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

    # slots: hash rollout_id -> "p" (pending) | "l|<lease>|<worker>" (leased) | "d" (done) |
    # "d|<worker>" (done while <worker> held a cancelled copy) | "c" (cancelled): redis_format
    @property
    def slots(self) -> str:
        return self._k("slots")

    # pending: list of rollout ids waiting for a worker, popped from the front (a slot cancelled or
    # answered meanwhile stays in the list and is skipped when popped)
    @property
    def pending(self) -> str:
        return self._k("pending")

    # inflight: zset leased rollout_id -> its lease's expiry time
    @property
    def inflight(self) -> str:
        return self._k("inflight")

    # open groups: zset group_id -> expected yield: p_eff, or 1 once committed or when the plan
    # delivers saturated groups; open_groups.lua adds their sum to the ready groups for flow control
    @property
    def open_groups(self) -> str:
        return self._k("groups:open")

    # format version: string, the stored format the namespace is written in
    # (redis_format.FORMAT_VERSION; store/migrate.py moves an older one forward)
    @property
    def format_version(self) -> str:
        return self._k("format")

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

    # ready: list of "<group_id>|<min_v>|<done>" (oldest policy version among its results, ''
    # when none said; results stored) of groups complete and waiting for a batch, oldest first
    @property
    def ready(self) -> str:
        return self._k("groups:ready")

    # gc: zset group_id -> time after which its data may be deleted
    @property
    def gc(self) -> str:
        return self._k("groups:gc")

    # group_states: hash group_id -> open|committed|ready|delivered|acked|abandoned|dropped
    # (redis_format.GROUP_STATES)
    @property
    def group_states(self) -> str:
        return self._k("groups:state")

    # group_prompt: hash group_id -> prompt_id, so a lease can attach the prompt to a rollout
    @property
    def group_prompt(self) -> str:
        return self._k("groups:prompt")

    def group(self, group_id: str) -> str:
        """Hash of one group's counters, thresholds, p_eff tables and results
        (redis_format.GroupField)."""
        return self._k(f"group:{group_id}")

    # cancels: hash worker_id -> space-separated rollout ids to abort, handed over and cleared by
    # the worker's next lease, heartbeat or result report
    @property
    def cancels(self) -> str:
        return self._k("cancels")

    def lease(self, lease_id: str) -> str:
        """Hash: worker, expires_at, policy_version (current when granted); the set of its
        rollouts lives in `lease_rollouts`. Expires key_ttl_s after the last grant or heartbeat."""
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
        """Hash of one batch: groups (comma-separated ids), policy_version, created_at, state
        (delivered | acked), stats (JSON), rollouts; estimate (JSON) once noted; acked_at."""
        return self._k(f"batch:{batch_id}")

    # unacked: zset batch_id -> redelivery deadline (removed on ack)
    @property
    def unacked(self) -> str:
        return self._k("batches:unacked")

    # recent batches: list of JSON summaries, newest first, trimmed to 100
    @property
    def recent_batches(self) -> str:
        return self._k("batches:recent")

    # batch window: hash of some stats counters' values when the last batch was formed
    @property
    def batch_window(self) -> str:
        return self._k("batches:window")

    @property
    def stats(self) -> str:
        """Hash of monotone counters (see models.Counters): integers, and the float
        expected_false_abandons / estimated_false_abandons."""
        return self._k("stats")

    @property
    def abandon_hist(self) -> str:
        """Hash: rollouts done at abandonment -> groups."""
        return self._k("stats:abandon_hist")

    @property
    def reward_levels(self) -> str:
        """Hash, under SARA_EFFECTIVE=reward: a reward level (its grid point, an integer as
        text) -> rollouts that reached it. Its length is the number of levels seen so far."""
        return self._k("stats:reward_levels")

    @property
    def greso(self) -> str:
        """Hash, under SARA_SELECTION=greso: the exploration rates and the counters they were
        last stepped from (redis_format)."""
        return self._k("selection:greso")

    @property
    def non_binary_reward(self) -> str:
        """String: the first reward other than 0 and 1 that arrived under the outcome view
        (set once per run: the warning is said once)."""
        return self._k("stats:non_binary_reward")

    @property
    def trainer_seen(self) -> str:
        """String: when a trainer last asked for a batch or acked one (the scheduler's clock),
        behind the 'waiting for a trainer' warning."""
        return self._k("trainer:seen")

    # workers: zset worker_id -> last seen; worker_info: hash "<worker_id>|<name>" -> value, for
    # name in completed, tokens, policy_version, leases, first_seen, backend, stopped_at
    @property
    def workers(self) -> str:
        return self._k("workers")

    @property
    def worker_info(self) -> str:
        return self._k("workers:info")

    @property
    def policy(self) -> str:
        """Hash: version, checkpoint ('' = none), published_at."""
        return self._k("policy")

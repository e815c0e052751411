"""Results in Redis: a worker's report applied in one atomic step (apply_results.lua), where each
group's decision (COMMIT, ABANDON, CONTINUE) is taken and its prompt's posterior learns.

The call takes a typed `Report` and answers a typed `AppliedResults`; the script's reply is read
by name (`redis_format.APPLIED_FIELDS`), never by position here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Sequence

from sara_client.models import RolloutResult

from . import redis_format as rf
from ..errors import UnknownRollouts
from .codec import stored_int, text
from .errors import unavailable_on_redis_error
from .leases import LeaseStore
from .redis_format import Reply
from .runner import ResourceStore, ScriptRunner


@dataclass(frozen=True)
class Learning:
    """How a prompt's posterior learns: its Beta(alpha0, beta0) prior, old evidence weighed by
    `decay` per policy version and halved every `half_life` epochs of the pool (inf: never)."""

    alpha0: float
    beta0: float
    decay: float = 1.0
    half_life: float = math.inf


@dataclass(frozen=True)
class Report:
    """One worker's results, as the scheduler hands them to the store.

    `successes` holds 1/0 per result, -1 for an aborted rollout (no outcome learned) or -2 for a
    worker error (no outcome, until the third on one slot: then a failure). Finished groups are
    kept `retention_s`. With a `report_id` the answer is kept `report_ttl_s`, and the same report
    sent again gets it back (`replayed`) and changes nothing. `holder_only` (an authenticated
    worker id) ignores results for rollouts another worker holds. `levels` (SARA_EFFECTIVE=reward):
    each result's reward level; groups are then decided on whether those differ, among
    `levels_in_use` (the Dirichlet's size)."""

    worker_id: str
    results: Sequence[RolloutResult]
    successes: Sequence[int]
    learning: Learning
    retention_s: float
    report_id: str | None = None
    report_ttl_s: int = 0
    holder_only: bool = False
    levels: Sequence[str] | None = None
    levels_in_use: int = 2


@dataclass
class AppliedResults:
    """What a report did: results accepted (each filled an open slot), duplicates, late ones
    (their slot was cancelled or answered by a re-issued copy), each touched group's decision
    in report order, the worker's cancel list, rollouts released for re-issue, and whether this
    is the stored answer of a report id applied before."""

    accepted: int
    duplicates: int
    late: int
    decisions: list[tuple[str, str]]
    cancel: list[str]
    released: int = 0
    replayed: bool = False


def applied_from_reply(out: list) -> AppliedResults:
    """apply_results.lua's answer (or the stored answer it replays) as AppliedResults;
    UnknownRollouts when it named rollouts it does not know."""
    status = text(out[0])
    if status == Reply.UNKNOWN:
        raise UnknownRollouts([text(x) for x in out[1]])
    replayed = status == Reply.REPLAY
    values = json.loads(text(out[1])) if replayed else out[1:]
    named = dict(zip(rf.APPLIED_FIELDS, values))
    flat = [text(x) for x in named["decisions"] or []]   # cjson stores an empty list as {}
    return AppliedResults(
        accepted=int(named["accepted"]), duplicates=int(named["duplicates"]),
        late=int(named["late"]), decisions=list(zip(flat[::2], flat[1::2])),
        cancel=rf.split_ids(text(named["cancel"] or "")), released=int(named["released"]),
        replayed=replayed)


class ResultsStore(ResourceStore):
    """Applying workers' reports."""

    def __init__(self, runner: ScriptRunner, leases: LeaseStore) -> None:
        super().__init__(runner)
        self.leases = leases

    @unavailable_on_redis_error
    async def apply(self, now: float, report: Report) -> AppliedResults:
        """Apply `report` atomically; UnknownRollouts (nothing applied) if any id is unknown."""
        versions = await self._lease_versions(report.worker_id, report.results)
        packed = rf.results_arg(report.results, report.successes, versions, report.levels)
        if packed.unknown:
            raise UnknownRollouts(packed.unknown)
        learning, levels = report.learning, report.levels
        out = await self.runner.run(
            "apply_results",
            # Lua cannot read "inf" portably: 0 stands for no half-life
            dict(now=now, worker_id=report.worker_id, decay=learning.decay,
                 alpha0=learning.alpha0, beta0=learning.beta0, retention_s=report.retention_s,
                 half_life=repr(learning.half_life) if math.isfinite(learning.half_life) else 0,
                 count=len(report.results),
                 report_ttl_s=report.report_ttl_s if report.report_id else 0,
                 holder_only=int(report.holder_only), results=packed.rows,
                 levels=0 if levels is None else max(2, report.levels_in_use)),
            # without a report id the script never touches KEYS[16]: any key of the run will do
            dict(report=self.keys.report(report.worker_id, report.report_id)
                 if report.report_id else self.keys.stats),
            more_keys=[self.keys.group(g) for g in packed.groups], more_args=packed.blobs)
        return applied_from_reply(out)

    async def _lease_versions(self, worker_id: str, results: Sequence[RolloutResult]
                              ) -> list[int]:
        """Each result's policy version: its own, else the version its lease was granted under
        (the current one when the worker no longer holds that rollout)."""
        missing = [r.rollout_id for r in results if r.policy_version is None]
        if not missing:
            return [r.policy_version for r in results]  # type: ignore[misc]
        states = await self.leases.slot_states(missing)
        leases = {rid: slot.lease_id for rid, slot in zip(missing, states)
                  if slot.kind == "leased" and slot.worker_id == worker_id}
        # one read per lease, not per rollout: a report's results mostly share one lease
        lease_ids = list(dict.fromkeys(leases.values()))
        pipe = self.redis.pipeline(transaction=False)
        for lid in lease_ids:
            pipe.hget(self.keys.lease(lid), "policy_version")
        pipe.hget(self.keys.policy, "version")
        *granted, current = await pipe.execute()
        by_lease = dict(zip(lease_ids, granted))
        return [r.policy_version if r.policy_version is not None else
                stored_int(by_lease.get(leases.get(r.rollout_id, "")) or current)
                for r in results]

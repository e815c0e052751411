"""Reinforce-Ada as an allocator (SARA_POLICY=reinforce_ada); its decisions in Redis are
store/lua/_policy_rounds.lua, its math math/reinforce_ada.py."""

from __future__ import annotations

import json

from ...math.allocation import GroupPlan
from ...math.reinforce_ada import keep_slots, plan_rounds, round_rule
from ...strategy_settings import ReinforceAdaSettings
from .base import Allocator


class ReinforceAda(Allocator):
    """Reinforce-Ada: rounds of SARA_ADA_ROUND until its rule's outcomes are in
    (`math.reinforce_ada`); delivered as it stands, down-sampled to SARA_ADA_KEEP."""

    settings_class = ReinforceAdaSettings

    def fixed_plan(self, levels: int | None) -> GroupPlan:
        s = self.settings
        return plan_rounds(s.group_size, s.prior_alpha, s.prior_beta,
                           round_rule(s.ada_round, s.ada_keep, s.ada_rule))

    @property
    def commit(self) -> str:
        return "partial"   # each group stops at the end of a round

    def delivered(self, results: list[bytes]) -> tuple[list[bytes], list[float] | None]:
        s = self.settings
        rewards = [float(json.loads(raw)["reward"]) for raw in results]
        kept = keep_slots([r >= s.success_threshold for r in rewards], s.ada_keep)
        return [results[i] for i in kept], (rewards if len(kept) < len(results) else None)

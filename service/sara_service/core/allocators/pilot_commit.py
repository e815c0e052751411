"""Pilot-Commit as an allocator (SARA_POLICY=pilot_commit); its decisions in Redis are
store/lua/_policy_pilot.lua, its math math/pilot_commit.py."""

from __future__ import annotations

from ...math.allocation import GroupPlan
from ...math.pilot_commit import excluded, pilot_band, plan_pilot
from ...math.selection import greso_streak
from ...settings import Settings
from ...store.codec import StoredPosterior
from ...strategy_settings import PilotCommitSettings
from .base import Allocator


class PilotCommit(Allocator):
    """Pilot-Commit: a pilot of SARA_PC_PILOT decides the group (`math.pilot_commit`); a
    committed one is filled to k, and a prompt whose last pilot was solved can be excluded."""

    settings_class = PilotCommitSettings

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.reads_history = settings.pc_exclude_solved

    def fixed_plan(self, levels: int | None) -> GroupPlan:
        s = self.settings
        return plan_pilot(s.group_size, s.prior_alpha, s.prior_beta,
                          pilot_band(s.pc_pilot, s.pc_band_low, s.pc_band_high), s.pc_tau_low)

    @property
    def commit(self) -> str:
        return "complete"   # its commit is the group's budget

    def excludes(self, post: StoredPosterior) -> bool:
        return self.settings.pc_exclude_solved and excluded(*greso_streak(post.observations))

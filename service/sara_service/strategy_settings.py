"""The peers' settings, each strategy's declared with the rule that checks it.

`Settings` (settings.py) is the union of these classes and the core's fields: every one is still
a flat `SARA_*` variable and a `sara serve` flag (`SARA_DPS_DECAY`, `--dps-decay`), grouped per
strategy by setting_groups. A class checks what its own strategy cannot run with; the checks
read the core's fields (policy, group size, prior, tau_low) through the Settings they are part of.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator


def _one_plan_on_outcomes(settings: Any, policy: str, plans: str, counts: str) -> None:
    """Refuse, for a peer policy that plans every group alike on successes and failures, a
    per-prompt prior, tau_low=auto and the reward view."""
    if settings.prior == "history" or settings.tau_low == "auto":
        raise ValueError(f"SARA_POLICY={policy} {plans}: leave SARA_PRIOR=uniform and a fixed "
                         "SARA_TAU_LOW")
    if settings.effective == "reward":
        raise ValueError(f"SARA_POLICY={policy} {counts} (SARA_EFFECTIVE=outcome); it does not "
                         "run under the reward view")


class DpsSettings(BaseModel):
    """SARA_SELECTION=dps: DPS's transition model over each prompt's group outcomes."""

    dps_decay: float = Field(0.5, ge=0.0, le=1.0, description="DPS count decay per version.")
    dps_prior: float = Field(1.0, gt=0.0, description="DPS Dirichlet prior on transitions.")
    dps_censored: bool = Field(True, description="DPS sees an abandoned group as the prefix it "
                               "saw (soft F/M or S/M), not as a full all-fail/all-success group.")


class MoppsSettings(BaseModel):
    """SARA_SELECTION=mopps: MoPPS's Thompson-sampled closeness to a target success rate."""

    mopps_target: float = Field(0.5, ge=0.0, le=1.0, description="MoPPS target success rate.")


class GresoSettings(BaseModel):
    """SARA_SELECTION=greso: GRESO's pre-rollout filter and its adapting rates."""

    greso_target: float = Field(
        0.25, ge=0.0, le=1.0, description="GRESO's target share of zero-variance groups (one "
                                          "third all-success, two thirds all-fail).")
    greso_p_start: float = Field(0.5, gt=0.0, le=1.0, description="GRESO's exploration rates "
                                 "at the start: a prompt after c zero-variance groups in a row "
                                 "is kept with chance max(p^c, 0.01).")
    greso_p_min: float = Field(0.05, gt=0.0, le=1.0, description="GRESO's rates' lower bound.")
    greso_p_max: float = Field(0.95, gt=0.0, le=1.0, description="GRESO's rates' upper bound.")
    greso_step: float = Field(0.01, ge=0.0, le=0.5,
                              description="GRESO's rate change per policy version.")

    @model_validator(mode="after")
    def _greso_rates_in_bounds(self) -> Any:
        if not self.greso_p_min <= self.greso_p_start <= self.greso_p_max:
            raise ValueError(
                f"SARA_GRESO_P_START={self.greso_p_start:g} must lie within SARA_GRESO_P_MIN="
                f"{self.greso_p_min:g} and SARA_GRESO_P_MAX={self.greso_p_max:g}")
        return self


class ReinforceAdaSettings(BaseModel):
    """SARA_POLICY=reinforce_ada: rounds until a group is balanced (math.reinforce_ada)."""

    ada_round: int = Field(8, ge=1, le=1024, description="Under reinforce_ada: rollouts a "
                                                         "round issues; k is the budget.")
    ada_keep: int = Field(4, ge=2, le=1024, description="Under reinforce_ada: rollouts a "
                                                        "delivered group keeps.")
    ada_rule: Literal["balanced", "positive"] = Field(
        "balanced", description="Under reinforce_ada: stop once keep/2 successes and failures "
                                "are in (balanced), or one success (positive).")

    def _rounds_can_run(self) -> Any:
        """Refuse a Reinforce-Ada configuration whose rounds do not fit its budget k."""
        if self.group_size % self.ada_round:
            raise ValueError(
                f"SARA_POLICY=reinforce_ada samples in rounds of SARA_ADA_ROUND={self.ada_round} "
                f"up to SARA_GROUP_SIZE={self.group_size}: make the group size a multiple of "
                f"the round (its reference: rounds of 8, k = 32)")
        if self.ada_keep > self.group_size:
            raise ValueError(f"SARA_ADA_KEEP={self.ada_keep} is more than the budget "
                             f"SARA_GROUP_SIZE={self.group_size}")
        _one_plan_on_outcomes(self, "reinforce_ada", "plans every group alike (rounds, no "
                              "abandoning)", "counts successes and failures")
        return self


class PilotCommitSettings(BaseModel):
    """SARA_POLICY=pilot_commit: a pilot per prompt, filled to k inside a band
    (math.pilot_commit)."""

    pc_pilot: int = Field(8, ge=2, le=1024, description="Under pilot_commit: rollouts in a "
                                                        "prompt's pilot; k is the budget.")
    pc_band_low: float = Field(0.125, ge=0.0, le=1.0, description="Under pilot_commit: the "
                               "lowest pilot pass rate committed (inclusive).")
    pc_band_high: float = Field(0.75, ge=0.0, le=1.0, description="Under pilot_commit: the "
                                "highest pilot pass rate committed (inclusive).")
    pc_tau_low: float | None = Field(
        None, gt=0.0, le=1.0, description="Under pilot_commit: SARA's stopping on the pilot: "
        "issue it up to SARA's threshold on failures for tau_low and abandon a prefix that "
        "failed throughout there (unset: the pilot runs whole, as in its paper).")
    pc_exclude_solved: bool = Field(True, description="Under pilot_commit: a prompt whose "
                                    "whole pilot succeeded is not sampled again in the run.")

    def _pilot_can_run(self) -> Any:
        """Refuse a Pilot-Commit configuration whose pilot or band cannot run (see
        math.pilot_commit.pilot_band for the band's rule)."""
        from .math.pilot_commit import pilot_band, plan_pilot

        if self.pc_pilot >= self.group_size:
            raise ValueError(
                f"SARA_POLICY=pilot_commit fills committed prompts to SARA_GROUP_SIZE="
                f"{self.group_size}: make it larger than the pilot SARA_PC_PILOT={self.pc_pilot} "
                "(its scripts: a pilot of a quarter of the group)")
        try:
            band = pilot_band(self.pc_pilot, self.pc_band_low, self.pc_band_high)
        except ValueError as error:
            raise ValueError(f"SARA_PC_BAND_LOW/SARA_PC_BAND_HIGH: {error}") from None
        try:
            plan_pilot(self.group_size, self.prior_alpha, self.prior_beta, band, self.pc_tau_low)
        except ValueError as error:
            raise ValueError(f"SARA_PC_TAU_LOW: {error}") from None
        _one_plan_on_outcomes(self, "pilot_commit", "decides every group on its pilot (no "
                              "abandoning rule)", "counts successes in the pilot")
        return self


class VarKSettings(BaseModel):
    """SARA_GROUP_SIZING=var_k: a draw's budget of k per prompt split by expected value
    (math.knapsack)."""

    group_sizing: Literal["fixed", "var_k"] = Field(
        "fixed", description="fixed (every group has k rollouts) or var_k (each draw of "
        "SARA_VK_BATCH prompts splits its budget of k per prompt by expected value, Knapsack "
        "RL's rule: sara_service.math.knapsack).")
    vk_min: int = Field(2, ge=2, le=1024, description="Under var_k: the fewest rollouts a "
                                                      "prompt with a mixed history gets.")
    vk_max: int = Field(64, ge=2, le=4096, description="Under var_k: the most rollouts a "
                                                       "prompt with a mixed history gets.")
    vk_confidence: float = Field(0.9, gt=0.0, lt=1.0, description="Under var_k: a prompt's "
                                 "need is the rollouts for a mixed group with this chance.")
    vk_batch: int = Field(32, ge=1, le=4096, description="Under var_k: prompts drawn together "
                                                         "and split one budget.")

    def _sizes_can_vary(self) -> None:
        """Refuse variable group sizes where a group's size is the policy's (Reinforce-Ada's
        rounds, Pilot-Commit's budget) or its bounds leave k outside them."""
        if self.policy in ("reinforce_ada", "pilot_commit"):
            raise ValueError(f"SARA_GROUP_SIZING=var_k sizes groups itself; SARA_POLICY="
                             f"{self.policy} sizes them by its own rule: choose uniform, "
                             "dynamic_sampling or sara")
        if not self.vk_min <= self.group_size <= self.vk_max:
            raise ValueError(f"SARA_GROUP_SIZING=var_k spends SARA_GROUP_SIZE={self.group_size} "
                             f"per prompt on average: it must lie within SARA_VK_MIN="
                             f"{self.vk_min} and SARA_VK_MAX={self.vk_max}")
        if self.tau_low == "auto" or self.effective == "reward":
            raise ValueError("SARA_GROUP_SIZING=var_k plans each group with a fixed "
                             "SARA_TAU_LOW on successes and failures: leave SARA_TAU_LOW "
                             "fixed and SARA_EFFECTIVE=outcome")

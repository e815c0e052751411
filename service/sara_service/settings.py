"""Scheduler settings: `SARA_*` environment variables, overridden by CLI flags.

Nothing here is built at import time; `Settings()` reads the environment when it is called.
These are the core's settings and the checks that span strategies; each peer's own settings and
checks are declared with their strategy (strategy_settings), and `Settings` is their union.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import (BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict)

from .retired_settings import say_retired
from .strategy_settings import (DpsSettings, GresoSettings, MoppsSettings, PilotCommitSettings,
                                ReinforceAdaSettings, VarKSettings)

AllocationPolicy = Literal["uniform", "dynamic_sampling", "sara", "reinforce_ada",
                           "pilot_commit"]
SelectionPolicy = Literal["epoch", "history", "dps", "mopps", "greso"]
SelectionRank = Literal["version", "opening"]
PriorMode = Literal["uniform", "history"]
CommitMode = Literal["complete", "partial"]
EffectiveView = Literal["outcome", "reward"]
AutoPrice = Literal["rollouts", "tokens"]
# what the reward view cannot run with yet, and why (refused at start: never silently wrong)
REWARD_VIEW_REFUSES = {
    "prior=history with tau_low=auto": "the cost-aware rule plans one threshold for every "
                                       "level, from the pool",
    "auto_price=tokens": "token lengths are learned per outcome, not per reward level",
}
# chosen from the sweep in docs/benchmarks.md ("Posterior memory")
DEFAULT_HALF_LIFE = 4.0
# Fields a benchmark sets in its own process (`Settings(work_floor=2.0)`, `sara_client.local`),
# never read from SARA_* nor offered as flags: they serve comparisons (the per-version memory
# rule, DPS's uncensored labels, a work floor measured to age groups), not runs. A run that sets
# one is told so (retired_settings).
INTERNAL_SETTINGS = frozenset({"posterior_decay", "dps_censored", "work_floor"})


class _WithoutInternal(PydanticBaseSettingsSource):
    """A settings source (the environment, a .env file) with the internal fields left out."""

    def __init__(self, settings_cls: type[BaseSettings], source: PydanticBaseSettingsSource
                 ) -> None:
        super().__init__(settings_cls)
        self.source = source

    def get_field_value(self, field, field_name):  # type: ignore[no-untyped-def]
        return None, field_name, False   # __call__ answers for the whole source

    def __call__(self) -> dict:
        return {k: v for k, v in self.source().items() if k not in INTERNAL_SETTINGS}


class Settings(BaseSettings, DpsSettings, MoppsSettings, GresoSettings, ReinforceAdaSettings,
               PilotCommitSettings, VarKSettings):
    """Everything one scheduler replica needs; every replica of a namespace must agree on it."""

    model_config = SettingsConfigDict(env_prefix="SARA_", extra="ignore")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,  # type: ignore[no-untyped-def,override]
                                   dotenv_settings, file_secret_settings):
        """Arguments first, then SARA_*, a .env file and secrets, none of them setting an
        internal field (INTERNAL_SETTINGS)."""
        return (init_settings, _WithoutInternal(settings_cls, env_settings),
                _WithoutInternal(settings_cls, dotenv_settings), file_secret_settings)

    redis_url: str | None = Field(None, description="Redis to use (redis+cluster://host:port: a "
                                                  "Redis Cluster); unset starts an embedded one.")
    # not a setting: only the process that started Redis knows it did (see on_embedded_redis)
    _redis_embedded: bool = PrivateAttr(False)
    data_dir: Path = Field(Path("./sara-data"), description="Embedded Redis data (AOF).")
    namespace: str = Field("default", pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
                           description="The run; several runs can share one Redis.")

    policy: AllocationPolicy = Field(
        "sara", description="uniform, dynamic_sampling, sara, reinforce_ada (rounds of "
                            "SARA_ADA_ROUND up to k, then kept at SARA_ADA_KEEP) or pilot_commit "
                            "(a pilot of SARA_PC_PILOT, filled to k when its pass rate lies in "
                            "the band).")
    selection: SelectionPolicy = Field(
        "epoch", description="epoch, history, dps, mopps or greso: which prompts groups open on.")
    prior: PriorMode = Field(
        "uniform", description="uniform, or history (the persisted, decayed posterior).")
    commit: CommitMode = Field(
        "complete", description="complete (fill a mixed group to k) or partial (train on the "
                                "mixed prefix).")
    group_size: int = Field(8, ge=2, le=1024, description="k, rollouts per group.")
    tau_low: Annotated[float, Field(ge=0.0, le=1.0)] | Literal["auto"] = Field(
        0.5, description='Abandon a pure prefix once p_eff < tau_low; "auto": the cost-aware '
                         "thresholds (sara_service.math.autotau), priced by the pool's yield.")
    tau_low_fail: float | None = Field(
        None, ge=0.0, le=1.0,
        description="SARA with a fixed tau_low: abandon an all-fail prefix only once p_eff < "
                    "this instead (unset: tau_low). Lower keeps more of a hard prompt's groups, "
                    "whose rare success is what the policy learns most from, at the price of "
                    "more probes on prompts that never succeed.")
    tau_floor: float | None = Field(
        None, ge=0.0, le=1.0, description="Under tau_low=auto, abandon (or skip) only where "
                                          "p_eff < tau_floor: the reliability bound.")
    auto_refit_groups: int = Field(
        128, ge=1, description="Under tau_low=auto, re-derive the pool model and the price "
                               "after this many decided groups.")
    auto_price: AutoPrice = Field(
        "rollouts", description="Under tau_low=auto, what a rollout costs: rollouts (each 1) or "
                                "tokens (the mean completion tokens of a success or a failure, "
                                "as the run has seen them; the price is then tokens per "
                                "effective group).")
    tau_skip: float = Field(0.1, ge=0.0, le=1.0,
                            description="history selection skips prompts below this chance.")
    prior_alpha: float = Field(1.0, gt=0.0, description="Beta prior: alpha.")
    prior_beta: float = Field(1.0, gt=0.0, description="Beta prior: beta.")
    # Memory runs on the pool's epochs, not on policy versions: a prompt is seen about once an
    # epoch, often ten or more versions apart, and 0.5 per version leaves 1e-4 of its history by
    # its next visit. See docs/benchmarks.md, "Posterior memory".
    posterior_decay: float = Field(1.0, ge=0.0, le=1.0,
                                   description="lambda per policy version (1: none).")
    posterior_half_life: float = Field(
        DEFAULT_HALF_LIFE, gt=0.0, allow_inf_nan=True,
        description="Epochs of the pool after which a posterior's evidence weighs half; inf: "
                    "never forget.")
    audit_fraction: float = Field(
        0.05, ge=0.0, le=1.0,
        description="Share of the groups SARA would abandon that run on to k instead, so the run "
                    "measures what Dynamic Sampling would have spent (0 turns auditing off).")
    success_threshold: float = Field(0.5, description="A reward >= this counts as a success.")
    effective: EffectiveView = Field(
        "outcome", description="What makes a group effective: outcome (successes and failures "
                               "mix, reward >= success_threshold) or reward (its rewards are not "
                               "all equal within reward_tolerance).")
    reward_tolerance: float = Field(
        1e-6, gt=0.0, allow_inf_nan=False,
        description="Under effective=reward, a reward's level is its nearest point on this "
                    "grid; rewards at one level are equal.")
    reward_levels: int = Field(
        2, ge=2, le=1024, description="Under effective=reward, the levels a plan assumes before "
                                      "the run has seen more (it then uses the number seen).")
    seed: int = Field(0, description="Scheduler randomness.")
    selection_lambda: int = Field(
        8, ge=1, le=256, validation_alias=AliasChoices(
            "selection_lambda", "SARA_SELECTION_LAMBDA", "SARA_SELECTION_POOL"),
        description="dps/mopps: candidates drawn from the epoch, without replacement, per group "
                    "to open; the best-scored 1 in lambda open and the rest are used up for "
                    "that pass of the pool (DPS's and MoPPS's references: 8 on Countdown, "
                    "16-32 on MATH). SARA_SELECTION_POOL is read too.")
    selection_rank: SelectionRank = Field(
        "version", description="dps/mopps: rank lambda x batch_size candidates once a policy "
                               "version and open the best batch_size of them, drawing another "
                               "round when they run out (version, as the references do each "
                               "step), or rank lambda x the groups each opening needs "
                               "(opening).")

    batch_size: int = Field(32, ge=1, le=4096, description="Groups per batch.")
    # 4 and 4: the engine stays full under SARA (a probing group holds only its probes, so two
    # batches in the making left it 69% full), and they are the settings the learning testbed
    # showed its results under (docs/benchmarks.md, "Engine time")
    prefetch_batches: int = Field(
        4, ge=1, le=64, description="Flow-control depth: batches of expected effective groups "
                                    "kept ready or in the making.")
    work_floor: float = Field(
        1.0, ge=1.0, le=16.0,
        description="While fewer than batch_size groups are ready, a lease that finds too little "
                    "work may open groups until work_floor x the flow target is expected, so the "
                    "engine does not idle while SARA's groups hold only their probes (1: off). "
                    "It fills the engine but ages groups: only for a trainer that accepts groups "
                    "several versions old (docs/benchmarks.md, engine time).")
    max_staleness: int = Field(
        4, ge=0, description="Policy versions a delivered group may lag (older ones are "
                             "dropped at delivery); the trainer's clipped importance ratio "
                             "corrects for the lag.")
    max_rollouts_per_batch: int | None = Field(
        None, ge=1, description="Rollout budget that ends a batch early; unset: none.")
    lease_ttl_s: float = Field(60.0, gt=0.0, description="Lease lifetime.")
    batch_ack_timeout_s: float = Field(300.0, gt=0.0,
                                       description="Redelivery of an unacked batch.")
    retention_s: float = Field(3600.0, gt=0.0,
                               description="How long finished groups and unseen workers are kept.")
    worker_stale_s: float | None = Field(
        None, gt=0.0, description="A worker unseen this long shows as stale; unset: "
                                  "lease_ttl_s, three of its heartbeat intervals.")
    trainer_wait_warn_s: float = Field(
        30.0, gt=0.0, description="Warn 'waiting for a trainer' once a batch is ready and no "
                                  "trainer has asked for one for this long.")
    report_ttl_s: float = Field(3600.0, gt=0.0, description="How long the answer to a result "
                                "report with a report_id is kept for a retry to fetch again.")

    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature sent to workers.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling sent to workers.")
    max_tokens: int = Field(256, ge=1, description="Completion tokens at most, sent to workers.")

    poll_interval_s: float = Field(
        1.0, gt=0.0, description="Longest a long poll waits between checks: it wakes when Redis "
                                 "signals work or a batch (any replica); this bounds a missed "
                                 "signal, and a batch redelivery falling due.")
    redis_down_limit_s: float = Field(
        60.0, gt=0.0, description="/healthz answers 503 (restart me) once Redis has been "
                                  "unreachable this long; /readyz answers 503 at once.")
    shutdown_grace_s: float = Field(
        5.0, gt=0.0, description="On SIGTERM, how long `sara serve` waits for requests in flight "
                                 "(long polls are answered at once) before it cancels them.")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024,
                                description="Request size cap (413 above).")

    worker_token: SecretStr | None = Field(
        None, description="Workers' token: leases, heartbeats, results.")
    trainer_token: SecretStr | None = Field(
        None, description="The trainer's token: batches, acks, publishing the policy.")
    operator_token: SecretStr | None = Field(
        None, description="Read-only token: stats, metrics, groups, prompts, the run's state.")
    admin_token: SecretStr | None = Field(
        None, description="Everything, adding prompts and draining the run included.")
    worker_secret: SecretStr | None = Field(
        None, description="Per-worker credentials: a worker's token is derived from this secret "
                          "and its id (`sara worker-token ID`) and acts as that worker only.")
    insecure: bool = Field(
        False, description="Let `sara serve` listen on an address other than loopback with no "
                           "token set, where anyone who reaches it can do everything.")

    @model_validator(mode="after")
    def _say_retired(self) -> Settings:
        say_retired(os.environ)
        return self

    @model_validator(mode="after")
    def _some_prompt_can_open(self) -> Settings:
        """Refuse a configuration whose plan for a prompt never seen before abandons it before
        its first rollout: every new prompt would be skipped and no group would ever open."""
        from .math.allocation import p_eff, plan_group

        if self.auto_price != "rollouts" and self.tau_low != "auto":
            raise ValueError(
                f"SARA_AUTO_PRICE={self.auto_price} prices the cost-aware thresholds, but "
                f"SARA_TAU_LOW={self.tau_low} is fixed: set SARA_TAU_LOW=auto, or leave "
                "SARA_AUTO_PRICE at rollouts")
        if self.tau_low_fail is not None and (self.tau_low == "auto" or self.effective == "reward"
                                              or self.group_sizing == "var_k"):
            raise ValueError(
                f"SARA_TAU_LOW_FAIL={self.tau_low_fail:g} lowers a fixed SARA_TAU_LOW on the "
                "failing side of a success/failure group: it needs a fixed SARA_TAU_LOW, "
                "SARA_EFFECTIVE=outcome and SARA_GROUP_SIZING=fixed (unset it otherwise)")
        if self.group_sizing == "var_k":
            self._sizes_can_vary()
        if self.policy == "reinforce_ada":
            return self._rounds_can_run()
        if self.policy == "pilot_commit":
            return self._pilot_can_run()
        if self.effective == "reward":
            return self._reward_view_can_run()
        if self.tau_low == "auto":
            return self  # auto never plans a skip for a fresh prompt (see allocation.plan_group)
        plan = plan_group(self.policy, self.group_size, self.prior_alpha, self.prior_beta,
                          self.tau_low, tau_fail=self.tau_low_fail)
        if plan.skip:
            start = p_eff(0, 0, self.group_size, self.prior_alpha, self.prior_beta)
            raise ValueError(
                f"every new prompt would be skipped: with k={self.group_size} and the prior "
                f"Beta({self.prior_alpha:g}, {self.prior_beta:g}) (prior={self.prior}) the chance "
                f"that a group of k comes out mixed is {start:.3f} before any rollout, below "
                f"tau_low={self.tau_low:g}; lower SARA_TAU_LOW, raise SARA_GROUP_SIZE or "
                "choose a broader prior")
        return self


    def _reward_view_can_run(self) -> Settings:
        """Refuse what the reward view does not support, and a plan that skips every prompt."""
        from .math.reward_levels import level_table, plan_levels

        chosen = {"prior=history with tau_low=auto": (self.prior == "history"
                                                      and self.tau_low == "auto"),
                  "auto_price=tokens": self.auto_price == "tokens"}
        refused = [name for name, on in chosen.items() if on]
        if refused:
            why = "; ".join(f"{name}: {REWARD_VIEW_REFUSES[name]}" for name in refused)
            raise ValueError(f"SARA_EFFECTIVE=reward does not support {', '.join(refused)} ({why})"
                             "; use SARA_PRIOR=uniform (or a fixed SARA_TAU_LOW) and "
                             "SARA_AUTO_PRICE=rollouts, or SARA_EFFECTIVE=outcome")
        if self.selection == "mopps" and self.mopps_target != 0.5:
            raise ValueError(
                f"SARA_MOPPS_TARGET={self.mopps_target:g} is a success rate, and the reward view "
                "has reward levels instead: its MoPPS prefers the prompts whose Thompson sample "
                "gives a group the best chance of differing rewards (the binary view's target "
                "0.5); leave SARA_MOPPS_TARGET at 0.5, or use SARA_EFFECTIVE=outcome")
        if self.prior_alpha != self.prior_beta:
            raise ValueError(
                "SARA_EFFECTIVE=reward uses a symmetric Dirichlet prior (SARA_PRIOR_ALPHA for "
                f"every level), but SARA_PRIOR_BETA={self.prior_beta:g} differs from "
                f"SARA_PRIOR_ALPHA={self.prior_alpha:g}: set them equal")
        if self.tau_low == "auto":
            return self       # the cost-aware plan never skips a fresh prompt
        plan = plan_levels(self.policy, self.group_size, self.reward_levels, self.prior_alpha,
                           float(self.tau_low))
        if plan.skip:
            start = level_table(self.group_size, self.reward_levels, self.prior_alpha)[0]
            raise ValueError(
                f"every new prompt would be skipped: with k={self.group_size} and "
                f"{self.reward_levels} reward levels the chance that a group's rewards differ is "
                f"{start:.3f} before any rollout, below tau_low={self.tau_low:g}; lower "
                "SARA_TAU_LOW or raise SARA_GROUP_SIZE or SARA_REWARD_LEVELS")
        return self

    @property
    def stale_after_s(self) -> float:
        """Seconds unseen after which a worker shows as stale: worker_stale_s, else lease_ttl_s
        (a live worker is seen at every lease, heartbeat and report, and heartbeats every
        third of the lease TTL)."""
        return self.worker_stale_s or self.lease_ttl_s

    @property
    def auth_enabled(self) -> bool:
        """True once any role token is configured; then every route needs one."""
        return any(t is not None for t in (self.worker_token, self.trainer_token,
                                           self.operator_token, self.admin_token,
                                           self.worker_secret))

    @property
    def redis_embedded(self) -> bool:
        """Whether this process started the Redis it uses (`sara serve` without a URL)."""
        return self._redis_embedded

    def on_embedded_redis(self, url: str) -> Settings:
        """These settings pointed at a Redis this process started at `url`."""
        out = self.model_copy(update={"redis_url": url})
        out._redis_embedded = True
        return out

    def public_config(self) -> dict:
        """The configuration in force, without secrets, as /stats shows it."""
        hidden = {"worker_token", "trainer_token", "operator_token", "admin_token", "redis_url",
                  "worker_secret"}
        out = self.model_dump(mode="json", exclude=hidden)
        if out["posterior_half_life"] == float("inf"):  # JSON has no infinity; /stats would fail
            out["posterior_half_life"] = "inf"
        out["auth_enabled"] = self.auth_enabled
        out["per_worker_credentials"] = self.worker_secret is not None
        out["redis"] = "embedded" if self.redis_embedded or not self.redis_url else "external"
        return out

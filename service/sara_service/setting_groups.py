"""The scheduler's settings by group, the one place that says which group a setting is in:
`sara serve --help` shows a panel per group and docs/settings.md a section per group
(`python -m sara_cli.settings_doc`), both in this order. Every field of `Settings` is in exactly
one group (tests/unit/test_settings_doc.py holds it): the user's groups, or INTERNAL (set by
benchmarks in their own process, never shown as a flag or a variable)."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import INTERNAL_SETTINGS


@dataclass(frozen=True)
class SettingGroup:
    """A group of settings: its key, its title (the help panel's and the section's), what it
    is about, and its fields in the order they are shown."""

    key: str
    title: str
    about: str
    fields: tuple[str, ...]


SETTING_GROUPS: tuple[SettingGroup, ...] = (
    SettingGroup("core", "Core", "The run: where its state lives, its allocation policy and "
                 "its shape.",
                 ("redis_url", "namespace", "policy", "group_size", "batch_size", "seed",
                  "data_dir")),
    SettingGroup("outcomes", "Outcomes", "What counts as a success, and what makes a group "
                 "effective.",
                 ("success_threshold", "effective", "reward_tolerance", "reward_levels")),
    SettingGroup("prior", "Prior and memory", "The Beta prior every plan starts from, and how "
                 "a prompt's posterior forgets.",
                 ("prior", "prior_alpha", "prior_beta", "posterior_half_life")),
    SettingGroup("sara", "Allocator: SARA", "SARA_POLICY=sara: abandon a group once it is "
                 "unlikely to come out mixed.",
                 ("tau_low", "tau_low_fail", "tau_floor", "auto_refit_groups", "auto_price",
                  "commit", "audit_fraction")),
    SettingGroup("reinforce_ada", "Allocator: Reinforce-Ada", "SARA_POLICY=reinforce_ada: "
                 "sample in rounds until a group is balanced.",
                 ("ada_round", "ada_keep", "ada_rule")),
    SettingGroup("pilot_commit", "Allocator: Pilot-Commit", "SARA_POLICY=pilot_commit: a "
                 "pilot per prompt, filled to k when its pass rate lies in a band.",
                 ("pc_pilot", "pc_band_low", "pc_band_high", "pc_tau_low", "pc_exclude_solved")),
    SettingGroup("var_k", "Allocator: variable group sizes", "SARA_GROUP_SIZING=var_k: each "
                 "draw of prompts splits a budget of k per prompt by expected value (with "
                 "uniform, dynamic_sampling or sara).",
                 ("group_sizing", "vk_min", "vk_max", "vk_confidence", "vk_batch")),
    SettingGroup("selection", "Selection", "Which prompts groups open on (SARA_SELECTION: "
                 "epoch, history, dps, mopps, greso): history's filter and the ranked "
                 "selections' draws.",
                 ("selection", "tau_skip", "selection_lambda", "selection_rank")),
    SettingGroup("dps", "Selection: DPS", "SARA_SELECTION=dps: rank candidates by their "
                 "predicted chance of a mixed group.", ("dps_decay", "dps_prior")),
    SettingGroup("mopps", "Selection: MoPPS", "SARA_SELECTION=mopps: rank candidates by a "
                 "Thompson sample's closeness to a target rate.", ("mopps_target",)),
    SettingGroup("greso", "Selection: GRESO", "SARA_SELECTION=greso: skip prompts whose "
                 "recent groups had zero variance, at adapting rates.",
                 ("greso_target", "greso_p_start", "greso_p_min", "greso_p_max", "greso_step")),
    SettingGroup("flow", "Flow control", "How many groups are kept ready or in the making, and "
                 "how old a delivered group may be.",
                 ("prefetch_batches", "max_staleness", "max_rollouts_per_batch")),
    SettingGroup("sampling", "Sampling", "Sent to the workers with every rollout.",
                 ("temperature", "top_p", "max_tokens")),
    SettingGroup("limits", "Limits and timeouts", "Lease, batch and retention times, long "
                 "polls, shutdown, request size.",
                 ("lease_ttl_s", "batch_ack_timeout_s", "retention_s", "report_ttl_s",
                  "poll_interval_s", "redis_down_limit_s", "shutdown_grace_s",
                  "max_body_bytes")),
    SettingGroup("observability", "Observability", "What /stats, `sara stats` and the "
                 "dashboard flag.",
                 ("worker_stale_s", "trainer_wait_warn_s")),
    SettingGroup("auth", "Auth", "Bearer tokens per role, from the environment only (a command "
                 "line is visible to every user of the machine), and the open-network guard.",
                 ("worker_token", "trainer_token", "operator_token", "admin_token",
                  "worker_secret", "insecure")),
)


# not shown to users: the fields benchmarks set in their own process
INTERNAL = SettingGroup("internal", "Internal", "Set by benchmarks in their own process only.",
                        tuple(sorted(INTERNAL_SETTINGS)))


def group_of(field: str) -> SettingGroup:
    """The group a Settings field is in; KeyError for a field in none."""
    for group in (*SETTING_GROUPS, INTERNAL):
        if field in group.fields:
            return group
    raise KeyError(f"setting {field!r} is in no group of sara_service.setting_groups")

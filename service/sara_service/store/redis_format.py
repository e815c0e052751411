"""The Redis format in one place: what the stored values and short field names mean, the status
words the Lua scripts answer, and each script's KEYS and ARGV order.

Key names are built in `keys.py`; what is stored under them is defined here. The Lua scripts in
`lua/` write the same format (Lua cannot import Python): `tests/unit/test_redis_format.py` parses
each script's header and its KEYS[i]/ARGV[i] uses (in the script and the library files put in
front of it) and checks them against `SCRIPTS`, so a script changed without this table fails CI. The store (`store*.py`) is the only reader and writer.

Slot states (the `slots` hash, rollout id -> state):

    p                    pending: queued in `pending`, waiting for a worker
    l|<lease>|<worker>   leased: held by <worker> under <lease>, expiry in `inflight`
    d                    done: its result is stored in the group (`r:<slot>`)
    d|<worker>           done while <worker> held a re-issued copy, now cancelled: that worker's
                         own answer counts as late, anyone else's as a duplicate
    c                    cancelled: its group was decided without it
    (absent)             unissued (or collected)

Group hash fields (`group:<id>`):

    prompt_id, k, issued, done, cancelled, created_at   as named
    s, f                 successes, failures among the done slots
    thr_f, thr_s         abandon after this many failures (successes) with no success (failure)
    pf, ps               JSON lists: entry n is p_eff (chance the group ends mixed) after n
                         failures (successes) only: the plan's tables
    p_eff                the current p_eff (1 once committed)
    min_v                oldest policy version among the stored results
    deliver_sat          1: a saturated (all-equal) group is delivered, not dropped (uniform)
    commit               'complete' (a committed group gets all k) or 'partial' (what is issued)
    audit, audited       1: run on to k at the abandonment point (chosen / started)
    lv, lvn, lvx         under SARA_EFFECTIVE=reward: the level of the group's first result,
                         the results at that level and the results at any other (lvx > 0: the
                         rewards differ). s and f still count rewards >= success_threshold.
    lp                   under the reward view with per-prompt plans (SARA_PRIOR=history): JSON
                         object, level -> [threshold, p_eff table up to it], for the levels
                         the prompt has produced; a run at any other level uses thr_f and pf
    ra                   a group sampled in rounds (Reinforce-Ada): "<round size>,<successes>,
                         <failures>", the round issued at a time and the outcomes that stop it
    pc                   a group decided on its pilot (Pilot-Commit): "<pilot>,<low>,<high>",
                         committed (filled to k) when the complete pilot's successes lie in
                         [low, high], abandoned otherwise
    r:<slot>             the slot's result JSON (RolloutResult)
    learned:<slot>       1 once the slot taught its prompt's posterior
    errors:<slot>        worker errors reported for the slot

Posterior JSON fields (`posteriors` hash, prompt id -> JSON):

    a, b                 Beta(alpha, beta) over the prompt's success rate
    v                    newest policy version it has seen (decay per version runs from it)
    t                    pool clock (epochs) it was last updated at (half-life runs from it)
    groups               groups opened for the prompt; last: the newest group's id
    committed, abandoned, saturated   groups that ended so
    rollouts, successes  outcomes it learned from
    lc                   under SARA_EFFECTIVE=reward: rollouts learned per reward level (level
                         -> count, decayed as a and b are), the prompt's Dirichlet counts
    obs                  last 16 [version, 'F'|'M'|'S', q?]: group outcomes (q: the chance an
                         abandoned group would have ended mixed), read by DPS selection

Other values: `ready` entries are `<group>|<min_v>|<done>` (min_v '' when no result carried a
version); `cancels` maps a worker to space-separated rollout ids; `workers:info` fields are
`<worker>|<name>` (completed, tokens, policy_version, leases, first_seen, backend); a batch hash
holds groups (comma-separated ids), policy_version, created_at, state, stats (JSON), rollouts,
estimate (JSON), acked_at; a lease hash holds worker, expires_at, policy_version.
The `stats` hash holds the counters (`models.Counters`) and, beside them, learned_success_rollouts,
learned_success_tokens, learned_failure_rollouts, learned_failure_tokens: each slot's first
outcome (the one its posterior learns) and its completion tokens, by outcome; tau_low=auto
prices rollouts with their means under SARA_AUTO_PRICE=tokens (`autoprice`).
The `greso` hash (SARA_SELECTION=greso) holds v, the policy version its rates were stepped at,
p_easy and p_hard (as %.17g text), and fail, success, total: the groups_ended_* counters then.
`groups:open:yield` is the open_groups zset's scores summed, an integer in units of 1e-9 groups
(flow control reads it instead of scanning the zset). The `wake` stream's entries carry
w ('lease' or 'batch') and, for a batch, n (groups ready then; -1: any size may go).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from ..math.allocation import GroupPlan
from .keys import split_rollout_id

# --- slot states ---------------------------------------------------------------------------------

PENDING, DONE, CANCELLED = "p", "d", "c"
LEASED_PREFIX, DONE_COPY_PREFIX = "l|", "d|"
SLOT_KINDS = ("unissued", "pending", "leased", "done", "cancelled")


@dataclass(frozen=True)
class Slot:
    """A decoded slot state: kind is one of SLOT_KINDS; `worker_id` is the holder of a leased
    slot, or of the cancelled copy of a `d|<worker>` one."""

    kind: str
    lease_id: str | None = None
    worker_id: str | None = None


def leased(lease_id: str, worker_id: str) -> str:
    return f"{LEASED_PREFIX}{lease_id}|{worker_id}"


def decode_slot(raw: str | None) -> Slot:
    if raw is None:
        return Slot("unissued")
    if raw.startswith(LEASED_PREFIX):
        # lease ids hold no '|' (ids are [A-Za-z0-9_.:-]); the worker id is the rest
        _, lease_id, worker_id = raw.split("|", 2)
        return Slot("leased", lease_id, worker_id)
    if raw.startswith(DONE_COPY_PREFIX):
        return Slot("done", worker_id=raw[len(DONE_COPY_PREFIX):])
    return Slot({PENDING: "pending", DONE: "done", CANCELLED: "cancelled"}[raw])


# --- hash fields ---------------------------------------------------------------------------------


class GroupField:
    """Field names of a group hash (see the module docstring)."""

    prompt_id, k, issued, done, cancelled = "prompt_id", "k", "issued", "done", "cancelled"
    successes, failures = "s", "f"
    abandon_after_failures, abandon_after_successes = "thr_f", "thr_s"
    p_eff, oldest_policy_version, created_at = "p_eff", "min_v", "created_at"
    p_eff_after_failures, p_eff_after_successes = "pf", "ps"  # JSON lists: entry n after n only
    deliver_saturated, commit, audit, audited = "deliver_sat", "commit", "audit", "audited"
    rounds = "ra"  # Reinforce-Ada's round rule
    pilot = "pc"  # Pilot-Commit's pilot and band
    first_level, at_first_level, at_other_levels = "lv", "lvn", "lvx"  # the reward view
    plans_by_level = "lp"  # the reward view under per-prompt plans

    @staticmethod
    def result(slot: int) -> str:
        return f"r:{slot}"


class PosteriorField:
    """Field names of a posterior JSON (see the module docstring)."""

    alpha, beta, version, clock = "a", "b", "v", "t"
    groups, last_group, committed, abandoned, saturated = (
        "groups", "last", "committed", "abandoned", "saturated")
    rollouts, successes, observations = "rollouts", "successes", "obs"
    level_counts = "lc"  # the reward view: rollouts per reward level


def group_spec(group_id: str, prompt_id: str, plan: GroupPlan, commit: str) -> dict[str, Any]:
    """One entry of open_groups.lua's `specs` list: the group and the plan it seeds the group
    hash with. The p_eff tables go as the JSON text the script stores verbatim in the `pf` and
    `ps` fields, and `p0` as the first entry's text: each number is its repr, so they read back
    as exactly the doubles Python computed."""
    return {"gid": group_id, "pid": prompt_id, **_plan_fields(plan, commit)}


@functools.lru_cache(maxsize=64)
def plan_spec_json(plan: GroupPlan, commit: str) -> bytes:
    """lease.lua's `plan`: a group spec without its group and prompt (JSON), for a lease that
    opens groups itself; one plan serves every group of a uniform-prior run."""
    return json.dumps(_plan_fields(plan, commit), separators=(",", ":")).encode()


def _plan_fields(plan: GroupPlan, commit: str) -> dict[str, Any]:
    fail, success = _p_eff_tables(plan)
    fields = {"k": plan.k, "thr_f": plan.after_failures, "thr_s": plan.after_successes,
              "issue": plan.initial_issue, "pf": fail, "ps": success,
              "p0": repr(plan.p_eff_fail[0]), "deliver_sat": int(plan.deliver_saturated),
              "commit": commit}
    if plan.rounds:
        fields["ra"] = ",".join(str(x) for x in plan.rounds)
    if plan.pilot:
        fields["pc"] = ",".join(str(x) for x in plan.pilot)
    if plan.by_level:
        fields["lp"] = _plans_by_level(plan)
    return fields


def _plans_by_level(plan: GroupPlan) -> str:
    """The `lp` field's JSON text, each number its repr (read back as the same doubles)."""
    entries = (f"{json.dumps(level)}:[{threshold},[{','.join(repr(x) for x in table)}]]"
               for level, threshold, table in plan.by_level)
    return "{" + ",".join(entries) + "}"


@functools.lru_cache(maxsize=1024)
def _p_eff_tables(plan: GroupPlan) -> tuple[str, str]:
    """A plan's p_eff tables as JSON lists of reprs: many groups share one plan, and formatting
    18 floats per group was a visible share of opening them."""
    return tuple("[" + ",".join(repr(x) for x in table) + "]"  # type: ignore[return-value]
                 for table in (plan.p_eff_fail, plan.p_eff_success))


def initial_posterior(alpha0: float, beta0: float, version: int) -> dict[str, Any]:
    return {PosteriorField.alpha: alpha0, PosteriorField.beta: beta0,
            PosteriorField.version: version}


PROMPT_FIELDS = ("prompt", "answer", "task", "meta")  # a stored prompt's JSON
WORKER_INFO_FIELDS = ("completed", "tokens", "policy_version", "leases", "first_seen", "backend",
                      "stopped_at", "occupancy", "slots")
# The stored format this release reads and writes (the namespace's `format_version` key); a
# namespace without one is moved forward by store/migrate.py before it is served.
FORMAT_VERSION = 1


def worker_info_field(worker_id: str, name: str) -> str:
    return f"{worker_id}|{name}"


def split_worker_info(fields: dict[str, str]) -> dict[str, dict[str, str]]:
    """`workers:info` as worker id -> {name: value}. Worker ids may hold '|': the name is what
    follows the last one."""
    out: dict[str, dict[str, str]] = {}
    for field, value in fields.items():
        wid, _, name = field.rpartition("|")
        out.setdefault(wid, {})[name] = value
    return out


def split_ids(encoded: str, sep: str = " ") -> list[str]:
    """A cancel list (space-separated) or a batch's groups (comma-separated)."""
    return [x for x in encoded.split(sep) if x]


# --- states and status words ---------------------------------------------------------------------

GROUP_STATES = ("open", "committed", "ready", "delivered", "acked", "abandoned", "dropped")
# a prompt whose newest group is in one of these has a group in flight: no other opens on it
# (lua/_open.lua's BUSY holds the same)
BUSY_GROUP_STATES = ("open", "committed", "ready")
DECISIONS = ("commit", "abandon", "continue")
RUN_STATES = ("paused", "draining")  # the run_state string; absent: running
OFF_STATES = ("disabled", "deleted")  # the prompts_off hash


# apply_results.lua's answer after its status word (and the stored answer a replay returns), in
# order: results accepted, duplicates, late, [group id, decision, ...], cancel ids (text),
# rollouts released
APPLIED_FIELDS = ("accepted", "duplicates", "late", "decisions", "cancel", "released")


class Reply:
    """Status words the scripts answer (each script's own set: ScriptSpec.replies)."""

    OK, UNKNOWN, ALREADY, REPLAY = "ok", "unknown", "already", "replay"
    NOT_YOURS, STALE = "not_yours", "stale"
    NEW, REDELIVER, NONE = "new", "redeliver", "none"


# --- scripts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptSpec:
    """One Lua script's calling convention.

    `keys` are KEYS[1..n] by name: a `Keys` property of the namespace, or (lease, lease_rollouts,
    report, batch) a per-id key the caller passes by that name. `more_keys` names what KEYS[n+1..]
    hold, one per item; `args` are ARGV[1..m] and `more_args` the ARGV repeated per item after
    them. `replies` are the words the script may answer (statuses; decisions, for apply_results).
    `library` names the shared Lua files (lua/_<name>.lua) put in front of the script, after the
    prelude that every script gets.
    """

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    more_keys: str | None = None
    more_args: tuple[str, ...] = ()
    replies: tuple[str, ...] = ()
    library: tuple[str, ...] = ()

    @property
    def first_more_key(self) -> int:
        """The KEYS index (from 1, as Lua counts) of the first per-item key."""
        return len(self.keys) + 1

    def key_list(self, keys: Any, more: Sequence[str] = (), **per_id: str) -> list[str]:
        """KEYS in order: each name from `per_id` when given, else the namespace's property."""
        unknown = set(per_id) - set(self.keys)
        if unknown:
            raise TypeError(f"{self.name}.lua takes no key {sorted(unknown)}")
        out = [per_id[name] if name in per_id else getattr(keys, name) for name in self.keys]
        if any(not isinstance(k, str) for k in out):
            raise TypeError(f"{self.name}.lua: a per-id key was not given")
        if more and self.more_keys is None:
            raise TypeError(f"{self.name}.lua takes no per-item keys")
        return out + list(more)

    def arg_list(self, more: Sequence[Any] = (), **values: Any) -> list[Any]:
        """ARGV in order from `values` by name, then the per-item ones."""
        if set(values) != set(self.args):
            raise TypeError(f"{self.name}.lua ARGV: missing {sorted(set(self.args) - set(values))}"
                            f", unknown {sorted(set(values) - set(self.args))}")
        return [values[name] for name in self.args] + list(more)


def _spec(name: str, keys: str, args: str, **more: Any) -> ScriptSpec:
    return ScriptSpec(name, tuple(keys.split()), tuple(args.split()), **more)


SCRIPTS: dict[str, ScriptSpec] = {s.name: s for s in (
    _spec("add_prompts", "prompts posteriors prompts_off prompts_retired wake",
          "initial_posterior", more_args=("prompt_id", "prompt_json")),
    _spec("prompt_state", "prompts posteriors prompts_off prompts_retired", "action prompt_id",
          replies=("unknown", "disabled", "enabled", "deleted")),
    _spec("refill_epoch", "epoch_queue epoch", "seen_epoch prompt_ids"),
    _spec("open_groups", "stats open_groups ready pending slots group_states group_prompt "
          "posteriors run_state prompts_off open_yield wake",
          "now flow_target specs skipped audit_fraction seed floor_target floor_ready "
          "skipped_busy",
          more_keys="group",
          library=("open",)),
    _spec("lease", "pending slots inflight stats cancels lease lease_rollouts workers "
          "group_prompt prompts worker_info policy run_state prompts_retired wake ready "
          "open_yield open_groups group_states posteriors prompts_off epoch_queue",
          "now worker_id lease_id max_rollouts expires_at key_ttl_s backend requeue_limit "
          "flow_target plan audit_fraction seed group_ids floor_target floor_ready "
          "engine_occupancy engine_slots",
          more_keys="group",
          library=("open",)),
    _spec("heartbeat", "lease lease_rollouts inflight slots cancels workers",
          "now worker_id lease_id expires_at key_ttl_s", replies=("unknown", "not_yours", "ok")),
    _spec("expire_leases", "inflight slots pending stats wake", "now limit"),
    _spec("apply_results", "slots inflight pending stats open_groups ready posteriors cancels "
          "abandon_hist workers worker_info policy gc group_states prompts report open_yield "
          "wake reward_levels",
          "now worker_id decay alpha0 beta0 retention_s half_life count report_ttl_s holder_only "
          "results levels",
          more_keys="group", more_args=("result_json",),
          replies=("replay", "unknown", "ok", *DECISIONS),
          library=("results_state", "results_learn", "policy_sara", "policy_rounds",
                   "policy_pilot", "results_write")),
    _spec("group_results", "", "k", more_keys="group"),
    _spec("migrate_format", "stats policy open_groups open_yield", "renamed max_int"),
    _spec("form_batch", "ready unacked stats policy batch batch_window recent_batches "
          "group_states gc run_state open_groups wake group_prompt",
          "now size ack_deadline max_staleness rollout_cap batch_id retention_s",
          replies=("redeliver", "none", "new")),
    _spec("ack_batch", "batch unacked stats group_states gc", "now batch_id retention_s",
          replies=("unknown", "already", "ok")),
    _spec("publish_policy", "policy", "version checkpoint now", replies=("stale", "ok")),
    _spec("prune_workers", "workers worker_info cancels", "seen_before limit"),
    _spec("stop_worker", "workers worker_info cancels", "now worker_id"),
    _spec("greso_step", "greso stats",
          "version adapt p_start p_min p_max step target_easy target_hard"),
)}


@dataclass
class ResultsArg:
    """apply_results.lua's arguments for a report: `rows`, the `results` argument (one JSON list
    of each result's id, group key index, success, tokens and version: packing five arguments per
    result cost the client more than the script's work; orjson, as the json module's encoder was a
    visible share of a report); `blobs`, each result's stored JSON, one argument each after the
    fixed ones (inside the list they were strings cjson had to unescape); `groups`, whose hashes
    follow the fixed KEYS, in that order; `unknown`, the ids that are no rollout id at all (the
    call must not be made then)."""

    rows: bytes
    blobs: list[str]
    groups: list[str]
    unknown: list[str]


def results_arg(results: Sequence[Any], successes: Sequence[int], versions: Sequence[int],
                levels: Sequence[str] | None = None) -> ResultsArg:
    """`ResultsArg` of RolloutResult models; `versions` is each result's policy version (its own,
    or its lease's); `levels` (the reward view) each result's reward level, a sixth entry."""
    first = SCRIPTS["apply_results"].first_more_key
    group_index: dict[str, int] = {}
    unknown: list[str] = []
    rows, blobs = [], []
    for i, (r, ok, version) in enumerate(zip(results, successes, versions)):
        parsed = split_rollout_id(r.rollout_id)
        if parsed is None:
            unknown.append(r.rollout_id)
            continue
        idx = group_index.setdefault(parsed[0], first + len(group_index))
        row = [r.rollout_id, idx, ok, r.completion_tokens, version]
        rows.append(row if levels is None else [*row, levels[i]])
        blobs.append(result_blob(r, version))
    return ResultsArg(orjson.dumps(rows), blobs, list(group_index), unknown)


def result_blob(r: Any, version: int) -> str:
    """A result as stored (`r:<slot>`): the RolloutResult's JSON without unset fields, with its
    policy version. One without a version of its own gets the filled-in one appended to its dump
    (the object always has rollout_id before it): a model_copy per result cost more than the rest
    of the call's packing."""
    blob = r.model_dump_json(exclude_none=True)
    if r.policy_version is not None:
        return blob
    return f'{blob[:-1]},"policy_version":{int(version)}}}'

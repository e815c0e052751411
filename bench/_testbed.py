"""The learning testbed's runs (``python bench/e2e.py --testbed``): one method, seed and learning
rate per run, through the product path, with the protocol's evaluations along the way.

A run is ``sara_demo.rl.run_rl``: the real scheduler on an embedded redis-server, an hf-backend
worker and the GRPO trainer pulling batches of B groups, from the testbed's shipped warm start
(``sara_demo.testbed``) on its revisited pool. What differs between methods is only the
scheduler's settings, and for ``uniform_matched`` the size of the batch the trainer asks for.

At each evaluation (and before RL) the run records greedy accuracy on the split it is judged on
(``test``, or ``validation`` while choosing learning rates) with its binomial standard error, and
a probe: k samples of each of ``probe_size`` fixed pool prompts under the current policy, each
group classed all-fail / mixed / all-success. The probe is what uniform at k would see, for every
method alike; from it come the saturation fractions and the prompts' moves between the states.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import math
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _testbed_trained import busiest_prompts_of, trained_summary
from sara_service.settings import Settings

# the service's own defaults for flow control and staleness, which the protocol runs under
SERVICE_DEFAULTS = {name: Settings.model_fields[name].default
                    for name in ("prefetch_batches", "max_staleness")}

METHODS: dict[str, dict[str, Any]] = {
    "uniform": {"policy": "uniform"},
    "uniform_matched": {"policy": "uniform", "matched": True},
    "ds": {"policy": "dynamic_sampling"},
    "sara": {"policy": "sara", "tau_low": 0.5},
    "sara_auto": {"policy": "sara", "tau_low": "auto"},
    "sara_history": {"policy": "sara", "tau_low": 0.5, "prior": "history"},
    "dps": {"policy": "dynamic_sampling", "selection": "dps"},
    "mopps": {"policy": "dynamic_sampling", "selection": "mopps"},
    "sara_dps": {"policy": "sara", "tau_low": 0.5, "selection": "dps"},
    "greso": {"policy": "dynamic_sampling", "selection": "greso"},
    "sara_greso": {"policy": "sara", "tau_low": 0.5, "selection": "greso"},
    # groups of k delivered from rounds of 2k up to 8k (its reference settings' proportions)
    "reinforce_ada": {"policy": "reinforce_ada", "ada_round": 2, "ada_rounds": 4},
    # a pilot of k, in-band prompts filled to 4k (its scripts' proportions); B such groups a
    # step, as every method's batch is B groups (the paper's batches are so many prompts, each
    # with its whole group)
    "pilot_commit": {"policy": "pilot_commit", "pc_groups": 4},
    # the same, its pilot stopped by SARA's rule (tau_low 0.5 on a group the pilot's size)
    "sara_pilot_commit": {"policy": "pilot_commit", "pc_groups": 4, "pc_tau_low": 0.5},
    # Knapsack RL's variable group sizes: each draw of B prompts splits B * k rollouts by value
    # (2 to 8k per prompt), on DS's filter, and under SARA's stopping
    "var_k": {"policy": "dynamic_sampling", "vk_max_groups": 8},
    "sara_var_k": {"policy": "sara", "tau_low": 0.5, "vk_max_groups": 8},
    # SARA with a lower threshold on the failing side (SARA_TAU_LOW_FAIL): at k = 8 it abandons
    # after 6 failures instead of 4, keeping more of the hard prompts' rare successes
    "sara_rare": {"policy": "sara", "tau_low": 0.5, "tau_low_fail": 0.3},
    "sara_dps_rare": {"policy": "sara", "tau_low": 0.5, "tau_low_fail": 0.3, "selection": "dps"},
    # DPS's candidates ranked per opening (SARA_SELECTION_RANK=opening) instead of once a version
    "sara_dps_opening": {"policy": "sara", "tau_low": 0.5, "selection": "dps",
                         "selection_rank": "opening"},
    # DPS and MoPPS as their papers run them: every selected group trained, no DS filter
    "dps_paper": {"policy": "uniform", "selection": "dps"},
    "mopps_paper": {"policy": "uniform", "selection": "mopps"},
    # Pilot-Commit against DS and GRPO at its own group size (4k), as its paper compares them
    "pilot_commit_k32": {"policy": "pilot_commit", "pc_groups": 4},
    "ds_k32": {"policy": "dynamic_sampling", "k_groups": 4},
    "uniform_k32": {"policy": "uniform", "k_groups": 4},
}
LABELS = {"uniform": "uniform (GRPO)", "uniform_matched": "uniform, matched signal",
          "ds": "Dynamic Sampling", "sara": "SARA (τ 0.5)", "sara_auto": "SARA auto",
          "sara_history": "SARA + history", "dps": "DPS", "mopps": "MoPPS",
          "sara_dps": "SARA + DPS", "greso": "GRESO (DS)", "sara_greso": "SARA + GRESO",
          "reinforce_ada": "Reinforce-Ada", "pilot_commit": "Pilot-Commit",
          "sara_pilot_commit": "SARA + Pilot-Commit", "var_k": "var_k (Knapsack, DS)",
          "sara_var_k": "SARA + var_k", "sara_rare": "SARA, τ_fail 0.3",
          "sara_dps_rare": "SARA + DPS, τ_fail 0.3", "sara_dps_opening": "SARA + DPS per opening",
          "dps_paper": "DPS (paper: no filter)",
          "mopps_paper": "MoPPS (paper: no filter)", "pilot_commit_k32": "Pilot-Commit (4k)",
          "ds_k32": "Dynamic Sampling (4k)", "uniform_k32": "uniform (4k)"}
# the configuration the docs recommend for new runs (docs/benchmarks.md, "The testbed's
# methods"): the report's `recommend` on the current protocol's recording (fewest rollouts to
# DS's final accuracy among the methods reaching it on 80% of seeds). `recommended` runs nothing
# of its own; its records are this key's, relabelled
RECOMMENDED = "sara_rare"
METHODS["recommended"] = METHODS[RECOMMENDED]
LABELS["recommended"] = f"recommended (= {LABELS[RECOMMENDED]})"
# where a run's evaluations ran: in a child process while training went on. The recordings
# before this (on the trainer's thread, which paused for each) have no such field; their seconds
# are not comparable, so a resumed recording does not reuse them
EVALUATION = "child process"
# the methods the protocol runs on --seeds (ten for a recording); the rest on --secondary-seeds
PRINCIPAL = ("ds", "sara", "sara_dps", "sara_history", "recommended")
STATES = ("all_fail", "mixed", "all_success")


@dataclass(frozen=True)
class Protocol:
    """The testbed's sizes: B groups a step of k, a rollout budget per run, the splits."""

    batch_groups: int = 16
    k: int = 8
    # 110,000 on a pool of 2,000 (docs/benchmarks.md, "Why the testbed's protocol is what it
    # is"): at 80,000 on 1,000 prompts DS plateaued within a test SE before step 100 on two
    # seeds of five, and at 110,000 on 1,000 one seed's slow buckets ran out of unsaturated
    # prompts by step 94; on 2,000 (1,619 drawn: three small buckets hold fewer) DS rises past
    # step 170 on every seed
    rollouts: int = 110_000
    evals: int = 16
    pool_size: int = 2000
    # 8,000 test problems (SE about 0.55 points) and 2,000 for validation: at half those, the
    # first recording's DS targets and learning-rate choices were decided by noise of a point,
    # and at 4,000 one DS seed's half-run gap (2 points) was 2.5 SE. Greedy evaluation decodes
    # shortest prompt first, so 8,000 cost the evaluating core about what 4,000 did
    test_size: int = 8000
    val_size: int = 2000
    probe_size: int = 200
    max_matched: int = 8          # uniform_matched asks for at most this many times B
    time_budget_s: float = 900.0  # a run that takes longer stops there (and says so)
    # flow control, the same for every method and the service's defaults: batches of expected
    # mixed groups the scheduler keeps in the making, and the policy versions a delivered group
    # may lag. At 80,000 rollouts with one batch in the making the selectors' generate calls held
    # 20-30 rollouts and their runs took 216-421 s; with two (groups two versions old accepted,
    # under the loss's clipped ratio) 138-180 s; with four, 110,000 rollouts fit the same three
    # minutes (90-170 s)
    prefetch_batches: int = SERVICE_DEFAULTS["prefetch_batches"]
    max_staleness: int = SERVICE_DEFAULTS["max_staleness"]
    # the scheduler's work floor (SARA_WORK_FLOOR), the same for every method: while fewer than
    # a batch is ready, a short lease may open groups up to this many times the flow target, so
    # the engine is not left with SARA's probes alone (1: off)
    work_floor: float = 1.0
    # every method but DS runs on to this many times `rollouts`, so a cost to DS's final
    # accuracy up to that multiple of DS's is measured, not cut off at DS's budget
    others_budget: float = 1.5

    @classmethod
    def quick(cls) -> Protocol:
        """CI's size: 6,000 rollouts in batches of 4 groups (some forty-five steps: at 16 groups
        a step the shipped warm start gets seven, too few to move). At 4,000 DS's rise on seed 7
        ranged 4.8-13.9 points over five runs (the async scheduler's order varies), too close to
        the CI test's 5-point floor; at 6,000 it ranged 9.8-15.0 over four, for 2 s more a run."""
        return cls(batch_groups=4, rollouts=6_000, evals=2, test_size=400, val_size=300,
                   probe_size=48, time_budget_s=300.0,
                   # the CI test's floors were measured at one batch in the making, on 1,000
                   # prompts
                   prefetch_batches=1, max_staleness=1, pool_size=1000)


def run_one(method: str, seed: int, lr: float, protocol: Protocol, work: Path,
            split: str = "test", start_from: str | None = None) -> dict[str, Any]:
    """One run; its record (method, seed, lr, split, pool_revisits, curve, transitions, ...)."""
    from sara_demo.rl import run_rl
    from sara_demo.testbed import test_set, training_pool, validation_set, verified_testbed

    started = time.perf_counter()   # the whole run: loading and evaluations included
    start = str(verified_testbed(Path(start_from) if start_from else None))
    # scratch: an interrupted run's Redis data there would carry its prompts and policy versions
    # into this one
    shutil.rmtree(work, ignore_errors=True)
    pool = training_pool(protocol.pool_size, seed)
    judged = test_set(protocol.test_size) if split == "test" else validation_set(
        protocol.val_size, pool)
    probe = pool[:protocol.probe_size]
    with _Evaluator(start, judged, probe, protocol.k, seed) as evaluator:
        model, tokenizer = _load(start)
        before = evaluator(model, tokenizer).result()
        del model
        cfg, sizer = _demo_config(method, seed, lr, protocol, work), None
        if METHODS[method].get("matched"):
            mixed = 1.0 - before["frac_all_fail"] - before["frac_all_success"]
            cap = matched_cap(protocol, mixed)
            cfg = dataclasses.replace(cfg, batch_groups=cap)   # the scheduler's flow target
            sizer = _matched_sizer(protocol, mixed, cap)
        buckets = BucketCounts(pool)
        trainer, stats, _, history, evals = asyncio.run(run_rl(
            cfg, work, start, pool, judged, before, started + protocol.time_budget_s,
            evaluator=evaluator, batch_size=sizer, on_end=buckets.read))
        _final_eval(evaluator, trainer, history, evals)
    seconds = time.perf_counter() - started
    record = _record(method, seed, lr, split, protocol, stats, history, evals, evaluator, seconds)
    return {**record, "start": warm_start_identity(start), "by_bucket": buckets.counts,
            "bucket_shares": bucket_shares_of(history, buckets.bucket_of),
            "busiest_prompts": busiest_prompts_of(history, buckets.bucket_of,
                                                  group_rollouts(method, protocol) or protocol.k),
            "bucket_gains": bucket_gains_of(evals), "evaluation": EVALUATION}


def bucket_shares_of(history: list[dict[str, Any]], bucket_of: dict[str, str]
                     ) -> dict[str, float]:
    """Each arith bucket's share of the groups the run trained on (the trainer's prompt ids)."""
    counts = Counter(bucket_of.get(pid, "other") for h in history
                     for pid in h.get("prompt_ids", []))
    total = sum(counts.values()) or 1
    return {bucket: counts[bucket] / total for bucket in sorted(counts)}


def bucket_gains_of(evals: list[dict[str, Any]]) -> dict[str, float]:
    """Each bucket's held-out accuracy gain from the evaluation before RL to the last one."""
    by = [e.get("accuracy_by_bucket") for e in evals if e.get("accuracy_by_bucket")]
    if len(by) < 2:
        return {}
    first, last = by[0], by[-1]
    return {bucket: last[bucket] - first[bucket] for bucket in sorted(last) if bucket in first}


def warm_start_identity(directory: str | Path) -> dict[str, Any]:
    """Which warm start a run began from: its directory, the SHA-256 of its weights and its
    habit set's name (from its manifest), so runs from different warm starts are never mixed."""
    from sara_demo.testbed import HABIT_SETS
    from sara_demo.warmstart import MANIFEST

    manifest = json.loads((Path(directory) / MANIFEST).read_text())
    habits = manifest.get("recipe", {}).get("habits")
    return {"dir": str(directory), "weights_sha256": manifest["sha256"]["model.safetensors"],
            "habits": next((n for n, h in HABIT_SETS.items() if h == habits), None)}


class BucketCounts:
    """The scheduler's per-prompt history at the end of a run, summed by arith bucket: groups
    opened, committed (mixed: what the trainer got), abandoned, rollouts and successes. It shows
    where a method's batches come from, which the accuracy curves alone do not."""

    FIELDS = ("groups", "committed", "abandoned", "rollouts", "successes")

    def __init__(self, pool: list[dict[str, Any]]) -> None:
        self.bucket_of = {p["id"]: p["meta"]["bucket"] for p in pool}
        self.counts: dict[str, dict[str, int]] = {}

    async def read(self, client: Any) -> None:
        """Sum every prompt's history into :attr:`counts` (run_rl's ``on_end``)."""
        async for item in client.iter_prompts(page_size=1000):
            bucket = self.bucket_of.get(item.id, "other")
            into = self.counts.setdefault(bucket, dict.fromkeys(self.FIELDS, 0))
            for name in self.FIELDS:
                into[name] += getattr(item.history, name)


def _demo_config(method: str, seed: int, lr: float, protocol: Protocol, work: Path):
    from sara_demo.config import DemoConfig

    spec = METHODS[method]
    scheduler = {key: spec[key] for key in ("tau_low", "prior", "pc_tau_low", "tau_low_fail",
                                            "selection_rank") if key in spec}
    # 1 is the scheduler's own default, so leaving it out keeps every other run's config as it was
    if protocol.work_floor != 1.0:
        scheduler["work_floor"] = protocol.work_floor
    if "ada_round" in spec:   # Reinforce-Ada: its budget per prompt, kept at k when delivered
        scheduler.update(group_size=spec["ada_round"] * spec["ada_rounds"] * protocol.k,
                         ada_round=spec["ada_round"] * protocol.k, ada_keep=protocol.k)
    if "pc_groups" in spec:   # Pilot-Commit: its pilot is k, its committed groups larger
        scheduler.update(group_size=spec["pc_groups"] * protocol.k, pc_pilot=protocol.k)
    if "vk_max_groups" in spec:   # var_k: sizes from 2 to vk_max_groups * k, one budget a batch
        scheduler.update(group_sizing="var_k", vk_min=2,
                         vk_max=spec["vk_max_groups"] * protocol.k,
                         vk_batch=protocol.batch_groups)
    return DemoConfig(
        seed=seed, out=str(work), progress=False, group_size=protocol.k * spec.get("k_groups", 1),
        batch_groups=protocol.batch_groups, lr=lr, rl_steps=1_000_000, compare=False,
        rollout_budget=run_budget(method, protocol), policy=spec["policy"],
        selection=spec.get("selection", "epoch"),
        eval_every_rollouts=max(1, protocol.rollouts // protocol.evals),
        time_budget_s=protocol.time_budget_s, batch_timeout_s=120.0,
        prefetch_batches=protocol.prefetch_batches, max_staleness=protocol.max_staleness,
        # a weights-only policy version every step, a full checkpoint only at the end: the
        # per-step overhead is then what a trainer publishing each step pays
        trainer_options={"checkpoint_every": 1_000_000, "publish_every": 1},
        scheduler_options=scheduler)


def run_budget(method: str, protocol: Protocol) -> int:
    """The rollouts a run of `method` may spend: DS's budget for DS, others_budget times it for
    the rest."""
    if method == "ds":
        return protocol.rollouts
    return int(round(protocol.rollouts * protocol.others_budget))


def group_rollouts(method: str, protocol: Protocol) -> int | None:
    """Rollouts in a delivered group of `method`: k, k_groups x k (DS and uniform at a larger
    size), Pilot-Commit's whole committed groups (pc_groups x k); var_k's vary (None)."""
    spec = METHODS[method]
    if "vk_max_groups" in spec:
        return None
    return spec.get("pc_groups", spec.get("k_groups", 1)) * protocol.k


def _load(directory: str):
    from sara_trainer.policy import load_policy
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # a bar per checkpoint load would bury the progress lines
    hf_logging.set_verbosity_error()
    return load_policy(directory)


class _Evaluator:
    """Greedy accuracy on the judged split with its standard error, and the k-sample probe of
    fixed pool prompts, each evaluation in a child process while training goes on
    (:class:`sara_demo.eval_process.PolicyEvaluator`); a call returns the future of its figures.
    Remembers each probe's states, in call order, for the transition counts."""

    def __init__(self, start: str, judged: list[dict], probe: list[dict], k: int,
                 seed: int) -> None:
        from sara_demo.eval_process import PolicyEvaluator

        self.seed, self.calls = seed, 0
        self.states: list[list[str]] = []
        self._process = PolicyEvaluator(start, judged, probe, k)

    def __call__(self, model, tokenizer) -> concurrent.futures.Future:
        # the probe's draws: seeded per run and per evaluation, as on the trainer's thread
        raw = self._process.submit(model, generator_seed=self.seed * 1000 + self.calls)
        self.calls += 1
        figures: concurrent.futures.Future = concurrent.futures.Future()
        raw.add_done_callback(lambda done: self._figures(done, figures))
        return figures

    def _figures(self, done: concurrent.futures.Future, figures: concurrent.futures.Future
                 ) -> None:
        """The child's answer as the curve's figures; its probe states kept (the child answers
        in submission order, so the states stay in call order)."""
        if done.cancelled() or done.exception() is not None:
            figures.set_exception(done.exception() or concurrent.futures.CancelledError())
            return
        found = done.result()
        kinds, p, n = found["kinds"], found["accuracy"], found["n"]
        self.states.append(kinds)
        count = Counter(kinds)
        figures.set_result({
            "accuracy": p, "accuracy_se": math.sqrt(max(p * (1 - p), 0.0) / max(n, 1)), "n": n,
            "accuracy_by_bucket": found["by_bucket"], "problems_by_bucket": found["counts"],
            "frac_all_fail": count["all_fail"] / len(kinds),
            "frac_all_success": count["all_success"] / len(kinds)})

    def transitions(self) -> dict[str, int]:
        """Moves between the states from one probe to the next, summed over the run."""
        moves: Counter[str] = Counter()
        for before, after in zip(self.states, self.states[1:]):
            moves.update(f"{a}->{b}" for a, b in zip(before, after) if a != b)
        return {f"{a}->{b}": moves[f"{a}->{b}"] for a in STATES for b in STATES if a != b}

    def close(self) -> None:
        self._process.close()

    def __enter__(self) -> _Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def matched_cap(protocol: Protocol, first_mixed: float) -> int:
    """uniform_matched's largest batch: 1.25 B over the probe's mixed fraction before RL (room
    for the fraction to fall), at most ``max_matched`` B. It is the scheduler's batch size, so
    that many groups are kept ready or in the making and every request can fill."""
    most = protocol.max_matched * protocol.batch_groups
    return min(most, math.ceil(1.25 * protocol.batch_groups / max(first_mixed, 1e-9)))


def _matched_sizer(protocol: Protocol, first_mixed: float, cap: int):
    """uniform_matched's batch size: B over the mixed fraction of the last few batches (the
    probe's before the first), so that a batch holds B mixed groups in expectation; between B
    and `cap`."""
    def size(history: list[dict]) -> int:
        recent = history[-5:]
        groups = sum(h["groups"] for h in recent)
        mixed = sum(h["groups_mixed"] for h in recent) / groups if groups else first_mixed
        wanted = protocol.batch_groups / max(mixed, 1e-9)
        return int(min(max(round(wanted), protocol.batch_groups), cap))
    return size


def _final_eval(evaluator: _Evaluator, trainer, history: list[dict], evals: list[dict]) -> None:
    """The evaluation after the last step (the run's end point of the curve)."""
    if not history or evals[-1]["step"] == trainer.step:
        return
    last = history[-1]
    evals.append({**evaluator(trainer.model, trainer.tokenizer).result(), "step": trainer.step,
                  "rollouts_cum": last["rollouts_cum"], "tokens_cum": last["tokens_cum"],
                  "seconds_cum": last["seconds_cum"], "generation_s": last["generation_s"],
                  "training_s": last["training_s"]})


def _record(method: str, seed: int, lr: float, split: str, protocol: Protocol, stats: Any,
            history: list[dict], evals: list[dict], evaluator: _Evaluator,
            seconds: float) -> dict[str, Any]:
    counters = stats.counters
    curve = [{"rollouts": e["rollouts_cum"], "tokens": e["tokens_cum"],
              "generation_s": round(e["generation_s"], 3), "training_s": round(e["training_s"], 3),
              "steps": e["step"], "accuracy": e["accuracy"], "accuracy_se": e["accuracy_se"],
              "frac_all_fail": e["frac_all_fail"], "frac_all_success": e["frac_all_success"]}
             for e in evals]
    return {"method": method, "label": LABELS[method], "seed": seed, "lr": lr, "split": split,
            "protocol": asdict(protocol), "pool_size": protocol.pool_size,
            "pool_revisits": counters.groups_opened / protocol.pool_size,
            "steps": history[-1]["step"] if history else 0,
            "rollouts": history[-1]["rollouts_cum"] if history else 0,
            "tokens": history[-1]["tokens_cum"] if history else 0,
            "groups_opened": counters.groups_opened,
            "groups_delivered": sum(h["groups"] for h in history),
            "groups_mixed": sum(h["groups_mixed"] for h in history),
            # rollouts in a delivered group (group_rollouts); rollouts_mixed counts them all
            "group_rollouts": group_rollouts(method, protocol),
            "budget": run_budget(method, protocol),
            "rollouts_mixed": sum(h.get("rollouts_mixed", 0) for h in history),
            "batch_sizes": sorted({h["groups"] for h in history}),
            "seconds": round(seconds, 1), "curve": curve,
            # held-out accuracy per arith bucket at each point of the curve, and the problems
            # each bucket holds: where a method's accuracy comes from
            "accuracy_by_bucket": [e.get("accuracy_by_bucket") for e in evals],
            "problems_by_bucket": evals[0].get("problems_by_bucket") if evals else None,
            "transitions": evaluator.transitions(),
            "trained": trained_summary(history, group_rollouts(method, protocol) or protocol.k)}

"""``python bench/e2e.py --testbed``: the fair protocol on the learning testbed.

    python bench/e2e.py --testbed --seeds 0,1,2,3,4 --methods ds,sara,sara_dps,uniform_matched \\
        --out bench/results/testbed
    python bench/e2e.py --testbed --quick --out /tmp/tb          # CI's size: every method, 1 seed

1. **Learning rates.** Each method's learning rate comes from ``--lr-grid`` (at least three values
   for a recorded run), chosen on the *validation* split by the final validation accuracy of
   ``--select-seeds`` runs (mean over those seeds); ``--lr METHOD=LR,...`` fixes some instead.
   With a one-value grid every method uses it and nothing is chosen.
2. **Runs.** Every method on every seed of ``--seeds`` (``--secondary-seeds``, when given, for the
   methods outside ``ds, sara, sara_dps, sara_history, recommended``), judged on the held-out
   test split, each method but DS to ``--others-budget`` times DS's rollouts,
   seed by seed so that a cut-short run still compares methods on the same seeds.
3. **Figures.** ``PREFIX.json`` (``{"runs": [...], "lr_selection": ..., "summary": ...,
   "criteria": ..., "targets": ...}``, each run with its ``curve``), ``PREFIX.txt`` (header and
   tables) and ``PREFIX.png``.

Every finished run is appended to ``PREFIX.runs.jsonl`` as it ends; a second invocation with the
same PREFIX skips the runs already there (method, seed, lr and split equal), so an interrupted
recording resumes where it stopped. ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
from sara_demo.testbed import verified_testbed

from _provenance import git_state
from _testbed import EVALUATION, LABELS, METHODS, PRINCIPAL, RECOMMENDED, Protocol, run_one, \
    warm_start_identity
from _testbed_report import K32_ARM, arm_summary, chart, criteria, final_accuracy, \
    format_report, method_summary, target_ratios

# 5e-4 tops it because on the 1,000 pool five of nine keys chose that grid's top value (3e-4)
DEFAULT_GRID = "1e-4,2e-4,3e-4,5e-4"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/e2e.py --testbed", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS), help="comma list of: "
                   + ", ".join(METHODS))
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma list of any integers")
    p.add_argument("--secondary-seeds", default=None,
                   help="seeds for the methods outside " + ", ".join(PRINCIPAL))
    p.add_argument("--lr-grid", default=None, help=f"learning rates to choose from (default "
                   f"{DEFAULT_GRID}; quick: 3e-4 only)")
    p.add_argument("--lr", default="", help="METHOD=LR,... fixed for those methods")
    p.add_argument("--select-seeds", default="0", help="seeds of the validation runs")
    p.add_argument("--rollouts", type=int, default=None,
                   help="rollout budget per run (default 110000; quick 6000)")
    p.add_argument("--test-size", type=int, default=None,
                   help="held-out test problems (default 8000; earlier recordings used 4000 "
                        "and 2000)")
    p.add_argument("--evals", type=int, default=None,
                   help="held-out evaluations a run, after the one before RL (default 16)")
    p.add_argument("--pool-size", type=int, default=None,
                   help="training prompts asked for, the buckets equally (default 2000; quick "
                        "1000)")
    p.add_argument("--val-size", type=int, default=None,
                   help="validation problems (default 2000; the first recording used 1000)")
    p.add_argument("--prefetch-batches", type=int, default=None,
                   help="batches of expected mixed groups kept in the making, every method "
                   "(default 4; quick 1)")
    p.add_argument("--max-staleness", type=int, default=None,
                   help="policy versions a delivered group may lag, every method (default 4; "
                   "quick 1)")
    p.add_argument("--work-floor", type=float, default=None,
                   help="the scheduler's work floor, every method (default 1: off)")
    p.add_argument("--k", type=int, default=None,
                   help="rollouts per group (default 8; the k = 16 arm: --k 16)")
    p.add_argument("--others-budget", type=float, default=None,
                   help="every method but DS runs to this many times --rollouts (default 1.5), "
                        "so ratios to DS up to it are measured, not censored")
    p.add_argument("--quick", action="store_true", help="CI size (see Protocol.quick)")
    p.add_argument("--out", default=None, help="output PREFIX (default bench/results/testbed, "
                   "or a temporary one with --quick)")
    p.add_argument("--start-from", default=None, help="a warm start made by python -m "
                   "sara_demo.testbed --out DIR (default: the shipped one)")
    p.add_argument("--work", default=None, help="scratch directory")
    p.add_argument("--fresh", action="store_true", help="ignore PREFIX.runs.jsonl")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: write the report from the runs PREFIX.runs.jsonl holds, "
                        "leaving out (and naming) the seeds not recorded yet")
    args = p.parse_args(argv)
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        p.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
        args.secondary_seeds = (None if args.secondary_seeds is None else
                                [int(s) for s in args.secondary_seeds.split(",")])
        args.select_seeds = [int(s) for s in args.select_seeds.split(",")]
        args.lr_grid = [float(x) for x in (args.lr_grid or ("3e-4" if args.quick
                                                            else DEFAULT_GRID)).split(",")]
        args.lr = {m: float(v) for m, v in (kv.split("=") for kv in args.lr.split(",") if kv)}
    except ValueError as exc:
        p.error(f"bad number in --seeds, --lr-grid or --lr: {exc}")
    for flag in ("prefetch_batches", "max_staleness", "evals", "pool_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.k is not None and args.k < 2:
        p.error("--k must be at least 2")
    if args.others_budget is not None and args.others_budget < 1.0:
        p.error("--others-budget must be at least 1 (DS's budget)")
    if args.work_floor is not None and not 1.0 <= args.work_floor <= 16.0:
        p.error("--work-floor must be between 1 and 16")
    if args.report_only and (args.fresh or len(args.lr_grid) > 1
                             and set(args.methods.split(",")) - set(args.lr)):
        p.error("--report-only reads recorded test runs: give one rate (--lr-grid with one "
                "value, or --lr for every method), and not --fresh")
    if set(args.lr) - set(METHODS):
        p.error(f"--lr names unknown methods {sorted(set(args.lr) - set(METHODS))}")
    args.methods = list(dict.fromkeys(["ds", *args.methods.split(",")]))  # targets need DS
    return args


# the code a run's figures depend on: its record and the report name this code's commit
CODE_PATHS = ("service", "client", "worker", "trainer", "demo")

# protocol fields added after runs were recorded, with the value those runs had
ADDED_FIELDS = {"prefetch_batches": 1, "max_staleness": 1, "work_floor": 1.0,
                "others_budget": 1.0}


# the split a run is judged on is the only one it reads: a validation run never evaluates the
# test set, nor a test run the validation set, so the other split's size does not change it
UNREAD_SIZE = {"validation": "test_size", "test": "val_size"}


def same_protocol(run: dict[str, Any], protocol: Protocol) -> bool:
    """Whether a recorded run ran under `protocol` (a run from before a field existed ran at
    that field's value in :data:`ADDED_FIELDS`; the size of the split it did not read is not
    compared)."""
    recorded = run.get("protocol")
    if recorded is None:
        return False
    unread = UNREAD_SIZE.get(run.get("split", "test"))
    ran, asked = {**ADDED_FIELDS, **recorded}, asdict(protocol)
    ran.pop(unread, None)
    asked.pop(unread, None)
    return ran == asked


class Recorder:
    """Runs done so far (PREFIX.runs.jsonl), appended as each one ends; only runs from the same
    warm start (its weights' SHA-256) count as done."""

    def __init__(self, path: Path, fresh: bool, start_from: str | None = None) -> None:
        self.path, self.start_from = path, start_from
        self.weights = warm_start_identity(verified_testbed(
            Path(start_from) if start_from else None))["weights_sha256"]
        if fresh and path.exists():
            path.unlink()
        self.runs = [json.loads(line) for line in path.read_text().splitlines()
                     if line.strip()] if path.exists() else []

    def find(self, method: str, seed: int, lr: float, split: str, protocol: Protocol
             ) -> dict[str, Any] | None:
        """A finished run of that method, seed, learning rate and split under `protocol`, from
        the same warm start, its evaluations run the way this code runs them; `recommended`'s
        are the recommended key's runs, relabelled."""
        source = RECOMMENDED if method == "recommended" else method
        found = next((r for r in self.runs if (r["method"], r["seed"], r["lr"], r["split"])
                      == (source, seed, lr, split) and same_protocol(r, protocol)
                      and r.get("start", {}).get("weights_sha256") == self.weights
                      and r.get("evaluation") == EVALUATION), None)
        if found is None or source == method:
            return found
        return {**found, "method": method, "label": LABELS[method]}

    def run(self, method: str, seed: int, lr: float, split: str, protocol: Protocol,
            work: Path, tag: str) -> dict[str, Any]:
        done = self.find(method, seed, lr, split, protocol)
        if done is not None:
            return done
        if method == "recommended":    # recorded under its own key, once for both
            self.run(RECOMMENDED, seed, lr, split, protocol, work, tag)
            return self.find(method, seed, lr, split, protocol)  # type: ignore[return-value]
        record = run_one(method, seed, lr, protocol, work / f"{method}-s{seed}-lr{lr:g}-{split}",
                         split=split, start_from=self.start_from)
        record["code"] = git_state(CODE_PATHS)
        self.runs.append(record)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        c = record["curve"]
        say(f"{tag} {LABELS[method]} seed {seed} lr {lr:g} ({split}): {record['steps']} steps, "
            f"{record['rollouts']:,} rollouts, accuracy {100 * c[0]['accuracy']:.1f}% -> "
            f"{100 * c[-1]['accuracy']:.1f}%, {record['seconds']:.0f} s")
        return record


def choose_lrs(args: argparse.Namespace, protocol: Protocol, rec: Recorder, work: Path
               ) -> dict[str, Any]:
    """Each method's learning rate: fixed, the grid's only value, or the best on validation."""
    chosen: dict[str, Any] = {}
    jobs = [(m, s, lr) for m in args.methods if m not in args.lr and len(args.lr_grid) > 1
            for s in args.select_seeds for lr in args.lr_grid]
    for i, (m, s, lr) in enumerate(jobs, 1):
        rec.run(m, s, lr, "validation", protocol, work, f"[lr {i}/{len(jobs)}]")
    for m in args.methods:
        if m in args.lr or len(args.lr_grid) == 1:
            chosen[m] = {"lr": args.lr.get(m, args.lr_grid[0]), "how": "given"}
            continue
        scores = {lr: statistics.fmean(final_accuracy(rec.find(m, s, lr, "validation", protocol))
                                       for s in args.select_seeds) for lr in args.lr_grid}
        best = max(scores, key=lambda lr: (scores[lr], -lr))
        chosen[m] = {"lr": best, "how": "validation", "validation_final_accuracy": scores}
    return chosen


def seeds_of(args: argparse.Namespace, method: str) -> list[int]:
    """The test seeds a method runs: the principal ones (``--seeds``) for the principal methods
    and for the key `recommended` relabels, whose runs it is; ``--secondary-seeds`` for the rest
    when given."""
    if method in PRINCIPAL or method == RECOMMENDED or args.secondary_seeds is None:
        return args.seeds
    return args.secondary_seeds


def protocol_of(args: argparse.Namespace) -> Protocol:
    """The protocol's sizes: the full or the quick one, with the sizes the command gives."""
    protocol = Protocol.quick() if args.quick else Protocol()
    given = {name: getattr(args, name) for name in ("rollouts", "pool_size", "test_size",
                                                    "val_size", "evals", "prefetch_batches",
                                                    "max_staleness", "work_floor", "k",
                                                    "others_budget")
             if getattr(args, name)}
    return Protocol(**{**asdict(protocol), **given})


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    protocol = protocol_of(args)
    prefix = Path(args.out) if args.out else (
        Path(tempfile.mkdtemp(prefix="sara-testbed-")) / "testbed" if args.quick
        else Path(__file__).resolve().parent / "results" / "testbed")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="sara-testbed-work-"))
    rec = Recorder(prefix.with_name(prefix.name + ".runs.jsonl"), args.fresh, args.start_from)
    started = time.perf_counter()
    chosen = choose_lrs(args, protocol, rec, work)
    jobs = [(m, s) for s in sorted({s for m in args.methods for s in seeds_of(args, m)})
            for m in args.methods if s in seeds_of(args, m)]
    if args.report_only:
        runs = recorded_runs(rec, jobs, chosen, protocol)
    else:
        runs = [rec.run(m, s, chosen[m]["lr"], "test", protocol, work, f"[{i}/{len(jobs)}]")
                for i, (m, s) in enumerate(jobs, 1)]
    write_outputs(prefix, args, argv, protocol, runs, chosen, time.perf_counter() - started)
    return 0


def recorded_runs(rec: Recorder, jobs: list[tuple[str, int]], chosen: dict[str, Any],
                  protocol: Protocol) -> list[dict[str, Any]]:
    """The test runs of `jobs` already recorded; the missing ones are named on stderr (SystemExit
    when DS has none: nothing could be compared)."""
    found = {(m, s): rec.find(m, s, chosen[m]["lr"], "test", protocol) for m, s in jobs}
    missing = [f"{m} seed {s}" for (m, s), run in found.items() if run is None]
    if missing:
        say(f"not recorded yet, left out of the report: {', '.join(missing)}")
    runs = [run for run in found.values() if run is not None]
    if not any(r["method"] == "ds" for r in runs):
        raise SystemExit("--report-only: no recorded DS run under this protocol and warm start")
    return runs


def write_outputs(prefix: Path, args: argparse.Namespace, argv: list[str], protocol: Protocol,
                  runs: list[dict[str, Any]], chosen: dict[str, Any], seconds: float) -> None:
    summary = [method_summary(runs, m, protocol.rollouts) for m in args.methods]
    crit, goals = criteria(runs), target_ratios(summary, runs)
    # a resumed recording's invocation is short; the runs' own times say what it cost
    recorded_s = sum(r["seconds"] for r in runs)
    text = header(argv, protocol, chosen, seconds, recorded_s, runs) + \
        format_report(summary, crit, runs) + \
        "\n\ntargets: " + json.dumps(goals, default=float)
    print("\n" + text)
    prefix.with_suffix(".txt").write_text(text + "\n")
    # orjson writes NaN (a ratio no seed reached, a criterion with nothing to measure) as null,
    # which strict JSON parsers read; the json module would write the bare token NaN
    prefix.with_suffix(".json").write_bytes(orjson.dumps(
        {"argv": argv, "code": git_state(CODE_PATHS),
         "protocol": asdict(protocol), "lr_selection": chosen, "summary": summary,
         "criteria": crit, "targets": goals, "k32_arm": arm_summary(runs, "ds_k32", K32_ARM),
         "runs": runs},
        option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n")
    drew = chart(runs, prefix.with_suffix(".png"))
    say(f"wrote {prefix.with_suffix('.json')}, {prefix.with_suffix('.txt')}"
        + (f", {prefix.with_suffix('.png')}" if drew else ""))


def header(argv: list[str], protocol: Protocol, chosen: dict[str, Any], seconds: float,
           recorded_s: float, runs: list[dict[str, Any]]) -> str:
    starts = {(r["start"]["habits"], r["start"]["weights_sha256"][:12]) for r in runs
              if "start" in r}
    start = "; ".join(f"warm start of habit set {h} (weights {sha}...)" for h, sha in starts)
    lrs = ", ".join(f"{m} {c['lr']:g}" for m, c in chosen.items())
    return "\n".join([
        "The learning testbed: rollouts to a target accuracy under the fair protocol "
        "(bench/e2e.py --testbed)",
        f"date:      {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"code:      {git_state(CODE_PATHS)}; test runs {runs_code(runs)}",
        f"command:   {shlex.join(['python', 'bench/e2e.py', '--testbed', *argv])}",
        f"machine:   {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; this invocation {seconds / 60:.1f} min, the test runs' own "
        f"times {recorded_s / 60:.1f} min; load average at the end "
        f"{os.getloadavg()[0]:.1f}",
        f"protocol:  B = {protocol.batch_groups} groups a step, k = {protocol.k}, "
        f"{protocol.rollouts:,} rollouts a run, pool {protocol.pool_size} prompts, test "
        f"{protocol.test_size}, validation {protocol.val_size}, probe {protocol.probe_size}, "
        f"prefetch {protocol.prefetch_batches} batches, max staleness {protocol.max_staleness}, "
        f"work floor {protocol.work_floor:g}, methods other than DS to "
        f"{protocol.others_budget:g}x its budget",
        f"lr:        {lrs}", f"start:     {start}", "", ""])


def runs_code(runs: list[dict[str, Any]]) -> str:
    """Which commits the runs ran at, with how many at each, most first (a resumed recording
    spans several); runs recorded before a run kept its commit are counted as such."""
    counts = Counter(r["code"].replace(" (clean)", "") if r.get("code") else "a commit not kept"
                     for r in runs)
    return "; ".join(f"{n} at {code}" for code, n in counts.most_common())


def say(message: str) -> None:
    print(message, flush=True)
